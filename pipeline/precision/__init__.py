"""Lower precision and its gate: the criteria (``gate``), the FP16 and INT8 graphs (``fp16``, ``int8``,
``convert``), finding the first tensor over tolerance (``localize``) and the one fallback loop for every
precision (``fallback``). Imports ``core`` and ``runtime``."""
