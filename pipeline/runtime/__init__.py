"""Running artifacts: the backend table and its runners (ONNX Runtime, TensorRT, OpenVINO, PyTorch), the
TensorRT engine recipe, the OpenVINO IR, process isolation, timing, and the vendors' own timing tools
(trtexec, benchmark_app). Imports only ``core``."""
