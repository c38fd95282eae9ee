"""The foundation every other package stands on: file names, errors, the run directory, the manifest, the
environment, data, models and ONNX I/O. Nothing here imports from ``runtime``, ``precision``, ``reports``,
``training`` or a stage."""
