"""Triton: a model's signature and config, the stock backends reproduced, and a real local server."""
