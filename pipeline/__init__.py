"""pipeline: train an image model, export it to ONNX and FP16, build a TensorRT engine, verify, benchmark."""

__version__ = "0.1.0"
