"""The qat stage: quantization-aware fine-tuning of the trained model for INT8, written as ``model.int8.onnx``.

The recipe is :mod:`pipeline.training.qat_recipe` (tune's third rung runs the same one). The stage records what it
did in the manifest (method, epochs, data, the source weights' sha256, what was simulated, the graph's INT8 layers)
and in ``int8_fallback.json`` (``method: qat`` with its checkpoint), so a later ``export`` or ``all`` rebuilds exactly
this graph from ``qat.checkpoint.best.pt`` instead of PTQ's (docs/verify.md, "Quantization-aware fine-tuning").
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline.core import artifacts as a
from pipeline.core.run import RunDir, StageRecord
from pipeline.training import qat_recipe

if TYPE_CHECKING:  # annotations only
    from pipeline.core.config_schema import Config


def run(cfg: Config, run_dir: RunDir, record: StageRecord, *, resume: bool = False) -> None:
    """Fine-tune ``run_dir``'s trained model for INT8 (``resume``: from ``qat.checkpoint.pt``)."""
    details = qat_recipe.fine_tune(cfg, run_dir, resume=resume)
    qat_recipe.write_fallback(run_dir, details["source"], "written by python -m pipeline qat")
    record.details.update(details)
    for name in (a.INT8_ONNX, a.INT8_FALLBACK, a.QAT_CHECKPOINT, a.QAT_BEST_CHECKPOINT, a.QAT_METRICS, a.QAT_CURVE):
        if run_dir.file(name).exists():
            record.artifact(name)
