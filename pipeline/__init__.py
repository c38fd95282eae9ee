"""pipeline: train an image model, export it to ONNX and FP16, build a TensorRT engine, verify, benchmark."""

from pipeline.core import telemetry as _telemetry

__version__ = "0.1.0"

# The libraries' telemetry off before any of them is imported (pipeline/core/telemetry.py); children inherit it.
_telemetry.opt_out()
