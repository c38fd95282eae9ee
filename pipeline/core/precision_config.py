"""A lower precision's config sections, picked by its name: ``export.<precision>`` and ``verify.<precision>``. The
one place that turns a precision's name into a section (every stage, plug and backend asks here), so no module
writes ``getattr(cfg.export, precision)`` itself. ``cfg`` is the validated config, or the isolated child's namespace
of it (:mod:`pipeline.runtime.isolate`): attribute reads only."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only
    from pipeline.core.config_schema import Config


def export_section(cfg: Config, precision: str):
    """``export.<precision>``: a lower precision's export settings (``enabled``, and its own keys)."""
    return getattr(cfg.export, precision)


def gate_section(cfg: Config, precision: str):
    """``verify.<precision>``: the gate of a backend computing in ``precision``; ``verify.fp32`` for FP32 and for
    what has no section of its own (PyTorch's mixed autocast)."""
    return getattr(cfg.verify, precision, cfg.verify.fp32)


def calibration_method(cfg: Config, precision: str) -> str | None:
    """``export.<precision>.calibration_method`` where the precision is calibrated that way (INT8); else None."""
    return getattr(export_section(cfg, precision), "calibration_method", None)
