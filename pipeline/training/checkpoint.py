"""Checkpoint files: written atomically, read back only when they are this tool's format.

A checkpoint is a :class:`Checkpoint` (issue 47): made by the trainer, written by :meth:`Checkpoint.to_state` (the
dict ``torch.save`` has always written, same keys in the same order) and read back by :func:`load_checkpoint`
(``torch.load(weights_only=True)``: tensors and plain containers only) and :meth:`Checkpoint.from_state`, which
checks every key's type, so a checkpoint of another format, or one with a key missing or of the wrong type, is one
:class:`~pipeline.core.errors.InputError`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from pipeline.core import modeling
from pipeline.core.errors import InputError
from pipeline.core.run import atomic_path
from pipeline.training.rng import RngState

log = logging.getLogger("pipeline")


CHECKPOINT_FORMAT = "pipeline.checkpoint/1"


@dataclass(frozen=True)
class Checkpoint:
    """Everything a resumed run needs: weights, optimizer, schedule, loss scale, progress, RNG states, and what the
    run was (config, the model card's spec, class names). QAT's add its quantizer state and its source weights."""

    model: dict[str, torch.Tensor]  # the bare model's state_dict
    optimizer: dict[str, Any]
    scheduler: dict[str, Any]
    scaler: dict[str, Any]
    epoch: int  # the epoch running (or next to run)
    batch: int  # the next batch of that epoch
    step: int  # optimizer steps taken
    best_acc: float
    skipped_steps: int
    rng: RngState
    config: dict[str, Any]  # Config.to_dict()
    spec: dict[str, Any]
    classes: list[str]
    modelopt_state: dict[str, Any] | None = None  # QAT's: ModelOpt's quantizer state
    source_weights_sha256: str | None = None  # QAT's: the trained weights it was fine-tuned from
    extra: dict[str, Any] = field(default_factory=dict)  # keys this version does not know, kept as read

    @property
    def made_for_epochs(self) -> Any:
        """The ``train.epochs`` the checkpoint's run was configured for (None when its config does not say)."""
        train = self.config.get("train")
        return train.get("epochs") if isinstance(train, dict) else None

    def to_state(self) -> dict[str, Any]:
        state = {"format": CHECKPOINT_FORMAT, "model": self.model, "optimizer": self.optimizer,
                 "scheduler": self.scheduler, "scaler": self.scaler, "epoch": self.epoch, "batch": self.batch,
                 "step": self.step, "best_acc": self.best_acc, "skipped_steps": self.skipped_steps,
                 "rng": self.rng.to_state(),
                 "config": self.config, "spec": self.spec, "classes": self.classes}
        if self.modelopt_state is not None:
            state["modelopt_state"] = self.modelopt_state
        if self.source_weights_sha256 is not None:
            state["source_weights_sha256"] = self.source_weights_sha256
        return {**state, **self.extra}

    @classmethod
    def from_state(cls, state: Any, path: Path) -> Checkpoint:
        """What ``torch.load`` returned, checked key by key; anything else is one :class:`InputError`."""
        if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
            raise InputError(f"{path} is not a pipeline checkpoint; re-run train without --resume")
        known = {"format", *(f for f in cls.__dataclass_fields__ if f != "extra")}
        for key, kinds in _KINDS.items():
            if not isinstance(state.get(key), kinds) or isinstance(state.get(key), bool) and bool not in kinds:
                raise InputError(f"{path} is damaged: its {key!r} is missing or of the wrong type "
                                 f"({type(state.get(key)).__name__}); re-run train without --resume")
        if not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state["model"].items()):
            raise InputError(f"{path} is damaged: its 'model' holds something other than named tensors; re-run "
                             "train without --resume")
        return cls(model=state["model"], optimizer=state["optimizer"], scheduler=state["scheduler"],
                   scaler=state["scaler"], epoch=state["epoch"], batch=state["batch"], step=state["step"],
                   best_acc=float(state["best_acc"]), skipped_steps=state["skipped_steps"],
                   rng=RngState.from_state(state["rng"], path),
                   config=state["config"], spec=state["spec"], classes=state["classes"],
                   modelopt_state=state.get("modelopt_state"),
                   source_weights_sha256=state.get("source_weights_sha256"),
                   extra={k: v for k, v in state.items() if k not in known})


_KINDS: dict[str, tuple[type, ...]] = {
    "model": (dict,), "optimizer": (dict,), "scheduler": (dict,), "scaler": (dict,), "epoch": (int,),
    "batch": (int,), "step": (int,), "best_acc": (int, float), "skipped_steps": (int,), "rng": (dict,),
    "config": (dict,), "spec": (dict,), "classes": (list,), "modelopt_state": (dict, type(None)),
    "source_weights_sha256": (str, type(None)),
}


def save_checkpoint(path: Path, checkpoint: Checkpoint) -> None:
    with atomic_path(path) as tmp:
        torch.save(checkpoint.to_state(), tmp)


def load_checkpoint(path: Path) -> Checkpoint:
    return Checkpoint.from_state(modeling.safe_torch_load(path, what="checkpoint"), path)
