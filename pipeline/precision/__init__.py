"""Lower precision and its gate: the criteria (``gate``), the FP16 and INT8 graphs (``fp16``, ``int8``,
``convert``), finding the first tensor over tolerance (``localize``) and the one fallback loop for every
precision (``fallback``). Imports ``core`` and ``runtime``."""

# ModelOpt 0.47's INT8 calibrations (it offers no percentile): what export.int8.calibration_method and
# tune.calibration_methods may name, and what int8_fallback.json's calibration_method may hold.
CALIBRATION_METHODS = ("max", "entropy")
