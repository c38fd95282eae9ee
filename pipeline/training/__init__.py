"""The pieces of the training recipe (``trainer``: the ``Trainer`` that the train and qat stages run): distributed
helpers, device and AMP choice, RNG and batch order, optimizer and step, metrics and evaluation,
checkpoints, the profiler. Imports only ``core``."""
