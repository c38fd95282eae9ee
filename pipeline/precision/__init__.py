"""Lower precision and its gate: the criteria (``gate``), the precision plugs (``plugs``: FP16, BF16, INT8), the
graphs they make and read (``fp16`` for the low float types, ``int8``, ``convert``), the one fallback loop for every
precision (``fallback``) and tune's sensitivity and search (``sensitivity``). Imports ``core`` only."""

# The names live in the bottom layer, where the config schema reads them too (each precision a plug in plugs.py,
# which checks the list).
from pipeline.core.precisions import CALIBRATION_METHODS, PRECISIONS

__all__ = ["CALIBRATION_METHODS", "PRECISIONS"]
