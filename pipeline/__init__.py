"""pipeline: train an image model, export it to ONNX with lower-precision graphs
(FP16, BF16, INT8), build TensorRT engines and OpenVINO IR, verify every artifact against the FP32 PyTorch model,
benchmark them, and tune, compare and deploy them."""

from pipeline.core import telemetry as _telemetry

__version__ = "0.1.0"

# The libraries' telemetry off before any of them is imported (pipeline/core/telemetry.py); children inherit it.
_telemetry.opt_out()
