"""The artifacts build makes and the only way they are read back: the OpenVINO IR and the TensorRT engine."""
