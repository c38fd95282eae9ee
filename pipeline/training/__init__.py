"""The pieces of the training recipe (``pipeline.train`` keeps the stage and the ``Trainer``): distributed
helpers, device and AMP choice, RNG and batch order, optimizer and step, metrics and evaluation,
checkpoints, the profiler. Imports only ``core``."""
