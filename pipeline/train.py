"""The train stage: mixed precision on CPU, one GPU, or many processes under torchrun. The stage lives here; the
:class:`~pipeline.training.trainer.Trainer` and its pieces (distributed, device and AMP, RNG, optimizer step, metrics,
checkpoints, profiler) are in :mod:`pipeline.training`.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch.distributed as dist

from pipeline.core import data as data_mod
from pipeline.core import modeling
from pipeline.core.artifacts import BEST_CHECKPOINT, CHECKPOINT, CURVE, METRICS, TRACE
from pipeline.core.errors import CheckFailed
from pipeline.core.registry import models
from pipeline.core.run import RunDir, StageRecord
from pipeline.training import learning
from pipeline.training.device import AMP_NAMES, resolve_amp, resolve_device
from pipeline.training.distributed import init_distributed
from pipeline.training.rng import seed_everything
from pipeline.training.trainer import Trainer

if TYPE_CHECKING:  # annotations only
    from pipeline.core.config_schema import Config

log = logging.getLogger("pipeline")

__all__ = ["BEST_CHECKPOINT", "CHECKPOINT", "CURVE", "METRICS", "TRACE", "Trainer", "run"]


# --------------------------------------------------------------------------- the stage

def run(cfg: Config, run_dir: RunDir, record: StageRecord, *, resume: bool = False, profile: bool = False) -> None:
    """Train ``cfg.model`` on ``cfg.data`` into ``run_dir`` (checkpoints, weights, metrics, curve)."""
    device = resolve_device(cfg)
    world = init_distributed(device.type)
    if not world.is_main:
        logging.getLogger("pipeline").setLevel(logging.WARNING)
    seed_everything(cfg.train.seed, cfg.train.deterministic)
    model, spec, splits, size, init_info = _model_and_data(cfg)
    if world.is_main:
        _warn_below_smallest_size(cfg.model.name, size)
    amp_dtype, amp_note = resolve_amp(cfg.train.amp, device)
    log.info("train: %s on %s (%s), %d classes at %dx%d, %s", cfg.model.name, device,
             f"{world.world_size} processes" if world.enabled else "1 process",
             splits.num_classes, size, size, amp_note)
    record.details.update({
        "device": str(device),
        "world_size": world.world_size,
        "amp_requested": cfg.train.amp,
        "amp": AMP_NAMES[amp_dtype],
        "amp_note": amp_note,
        "seed": cfg.train.seed,
        "deterministic": cfg.train.deterministic,
        "data": {"source": splits.source, "classes": splits.num_classes, "image_size": size, **splits.details},
        "init_weights": init_info,
    })
    trainer = Trainer(cfg, run_dir, model, spec, splits, device, world, amp_dtype)
    record.details.update(trainer.train(resume=resume, profile=profile).to_json())
    failure = None
    if world.is_main:
        for name in (CHECKPOINT, BEST_CHECKPOINT, modeling.WEIGHTS, modeling.MODEL_CARD, METRICS, CURVE):
            if run_dir.file(name).exists():
                record.artifact(name)
        if profile and run_dir.file(TRACE).exists():
            record.artifact(TRACE)
        failure = (_record_detection_learning(record, trainer.check_detection_learning()) if trainer.detection
                   else _record_learning(record, *trainer.check_learning()))
    if world.enabled:
        dist.barrier()
        dist.destroy_process_group()
    if failure:
        raise CheckFailed(failure)


def _record_learning(record: StageRecord, evidence: learning.LearningEvidence, verdict: learning.LearningVerdict,
                     policy: learning.LearningPolicy) -> str | None:
    """The learning check in the manifest (``details.learning``); returns the failure line, None when it passed."""
    record.details["learning"] = {
        **verdict.to_dict(), "classes": evidence.classes, "samples": evidence.samples,
        "mode_samples": evidence.mode_samples, "confidence": policy.confidence,
        "require_learning": policy.require_learning, "min_val_accuracy": policy.min_val_accuracy,
        "line": learning.summary(evidence, verdict, policy),
    }
    if not verdict.failed:
        return None
    if verdict.learned or not policy.require_learning:
        return learning.below_minimum_line(evidence, verdict, policy)
    return learning.not_learned_line(evidence, verdict, policy.confidence) + \
        "; nothing is exported (train longer, check the data, or set train.require_learning=false to go on)"


def _record_detection_learning(record: StageRecord, result) -> str | None:
    """A detector's learning check in the manifest (``details.learning``, with ``task: detection``)."""
    record.details["learning"] = {**result.to_dict(), "task": "detection"}
    if not result.failed:
        return None
    if result.learned:
        return result.line
    return result.line + ("; nothing is exported (train longer, check the data, or set train.require_learning=false "
                          "to go on)")


def _warn_below_smallest_size(name: str, size: int) -> None:
    """A registered model trains below its card's smallest sensible input size, but not well: say so."""
    if models.is_import_path(name):
        return
    smallest = models.get_recipe(name).min_image_size
    if size < smallest:
        log.warning("train: data.image_size=%d is below %s's smallest sensible input size (%d, from its card): its "
                    "last feature maps shrink to nothing and it may not learn", size, name, smallest)


def _model_and_data(cfg: Config):
    spec = modeling.resolve_spec(cfg)
    size = modeling.image_size(cfg, spec)
    mean, std = modeling.normalisation(cfg, spec)
    splits = data_mod.load(cfg.data, image_size=size, mean=mean, std=std, task=spec.task)
    model, spec = modeling.build(cfg, splits.num_classes, size)
    init_info = None
    if cfg.train.init_weights:
        init_info = modeling.load_init_weights(model, cfg.train.init_weights)
        log.info("train: initial weights from %s (missing %d, unexpected %d%s)", cfg.train.init_weights,
                 len(init_info["missing_keys"]), len(init_info["unexpected_keys"]),
                 f", head replaced: {'; '.join(init_info['replaced_head'])}" if init_info["replaced_head"] else "")
    return model, spec, splits, size, init_info
