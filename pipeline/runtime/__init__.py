"""Running artifacts. Here: the backend table and its runners (ONNX Runtime, TensorRT, OpenVINO, PyTorch), process
isolation and its fork server. By concern beside them: ``builders`` (the TensorRT engine recipe, the OpenVINO IR),
``serving`` (Triton), ``profiling`` (each runtime's own account of its layers, localisation) and ``speed`` (timing
statistics, the stop rule, interleaved rounds, the vendors' own timers). Imports only the layers below it."""
