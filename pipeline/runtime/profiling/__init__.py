"""What each runtime says it ran, layer by layer: layer accounts, profiles, roofline, the TensorRT inspector, and
localisation of a lower-precision failure."""
