"""Lower precision and its gate: the criteria (``gate``), the precision plugs (``plugs``: FP16, BF16, INT8), the
graphs they make and read (``fp16`` for the low float types, ``int8``, ``convert``), the one fallback loop for every
precision (``fallback``) and tune's sensitivity and search (``sensitivity``). Imports ``core`` only."""

# The lower precisions, by name (each a plug in plugs.py, which checks this list): what build.precisions,
# tune.precision and the config sections export.<name> and verify.<name> may name, without loading a plug.
PRECISIONS = ("fp16", "bf16", "int8")

# ModelOpt 0.47's INT8 calibrations (it offers no percentile): what export.int8.calibration_method and
# tune.calibration_methods may name, and what int8_fallback.json's calibration_method may hold.
CALIBRATION_METHODS = ("max", "entropy")
