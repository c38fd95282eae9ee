"""The lower precisions and INT8 calibrations, by name: plain data at the bottom layer, so the config schema
(:mod:`pipeline.core.config_schema`) can name them without loading a plug. :mod:`pipeline.precision` re-exports
them."""

# The lower precisions, by name (each a plug in precision/plugs.py, which checks this list): what build.precisions,
# tune.precision and the config sections export.<name> and verify.<name> may name, without loading a plug.
PRECISIONS = ("fp16", "bf16", "int8")

# ModelOpt 0.47's INT8 calibrations (it offers no percentile): what export.int8.calibration_method and
# tune.calibration_methods may name, and what int8_fallback.json's calibration_method may hold.
CALIBRATION_METHODS = ("max", "entropy")
