"""What training hands on, typed (issue 47): an epoch's results (:class:`EpochRecord`), what ``train.precise_bn``
did (:class:`PreciseBnDetails`), the facts :meth:`pipeline.training.trainer.Trainer.train` returns for the
manifest (:class:`TrainResult`; QAT's: :class:`QatTrainResult`) and the lines of metrics.jsonl (:class:`RunLine`,
:class:`StepLine`, :class:`EpochLine`).

Each is made where it is measured and read by attribute; ``to_json`` writes the shape the manifest's details and
metrics.jsonl have always had (same keys, same order), and :func:`read_lines` is the one reader of metrics.jsonl:
bounded, typed, a torn last line (a killed process) skipped, anything else that is not a line this tool writes one
:class:`~pipeline.core.errors.InputError`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pipeline.core import schema
from pipeline.core.errors import InputError

METRICS_LIMIT = 1 << 30  # bytes of metrics.jsonl read back (a line is ~250 bytes: millions of steps)


# --------------------------------------------------------------------------- the manifest's details


@dataclass(frozen=True)
class EpochRecord:
    """One epoch's validation results (a row of the manifest's ``history``)."""

    epoch: int  # 1-based
    val_loss: float
    val_acc: float
    val_acc_before_precise_bn: float | None = None  # None: precise BN did not run (the key is then absent)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"epoch": self.epoch, "val_loss": self.val_loss, "val_acc": self.val_acc}
        if self.val_acc_before_precise_bn is not None:
            out["val_acc_before_precise_bn"] = self.val_acc_before_precise_bn
        return out


@dataclass(frozen=True)
class PreciseBnDetails:
    """What ``train.precise_bn`` did, and its effect on the exported (best) epoch's validation accuracy."""

    enabled: bool
    batchnorm_layers: int
    batches: int  # per epoch; 0 when it did not run
    best_epoch_val_acc_before: float | None
    best_epoch_val_acc_after: float | None

    def to_json(self) -> dict[str, Any]:
        return {"enabled": self.enabled, "batchnorm_layers": self.batchnorm_layers, "batches": self.batches,
                "best_epoch_val_acc_before": self.best_epoch_val_acc_before,
                "best_epoch_val_acc_after": self.best_epoch_val_acc_after}


@dataclass(frozen=True)
class TrainResult:
    """The facts train records in its manifest entry's details."""

    epochs: int
    steps: int
    skipped_steps: int
    final_val_acc: float
    final_val_loss: float
    best_val_acc: float
    best_epoch: int | None
    train_seconds: float
    images_per_s: float
    history: tuple[EpochRecord, ...]
    final_weights_sha256: str  # the final (not the best) weights
    replica_sha256: tuple[str, ...] | None  # per rank, under torchrun; None: one process (the keys are absent)
    precise_bn: PreciseBnDetails

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "epochs": self.epochs, "steps": self.steps, "skipped_steps": self.skipped_steps,
            "final_val_acc": self.final_val_acc, "final_val_loss": self.final_val_loss,
            "best_val_acc": self.best_val_acc, "best_epoch": self.best_epoch, "train_seconds": self.train_seconds,
            "images_per_s": self.images_per_s, "history": [h.to_json() for h in self.history],
            "final_weights_sha256": self.final_weights_sha256,
        }
        if self.replica_sha256 is not None:
            out["replica_sha256"] = list(self.replica_sha256)
            out["replicas_identical"] = len(set(self.replica_sha256)) == 1
        out["precise_bn"] = self.precise_bn.to_json()
        return out


@dataclass(frozen=True)
class QatTrainResult:
    """The facts QAT's fine-tuning records (in the int8 graph's details, beside QAT's own)."""

    epochs: int
    steps: int
    skipped_steps: int
    best_val_acc: float
    best_epoch: int
    history: tuple[EpochRecord, ...]
    train_seconds: float
    seconds_per_epoch: float
    images_per_s: float

    def to_json(self) -> dict[str, Any]:
        return {"epochs": self.epochs, "steps": self.steps, "skipped_steps": self.skipped_steps,
                "best_val_acc": self.best_val_acc, "best_epoch": self.best_epoch,
                "history": [h.to_json() for h in self.history], "train_seconds": self.train_seconds,
                "seconds_per_epoch": self.seconds_per_epoch, "images_per_s": self.images_per_s}


# --------------------------------------------------------------------------- metrics.jsonl


class RunLine(schema.Open):
    """A run (``start``) or a resumed run (``resume``) began."""

    event: Literal["start", "resume"]
    epoch: int
    step: int
    time: float | None = None

    def to_json(self) -> dict[str, Any]:
        return self.model_dump()


class StepLine(schema.Open):
    """One logged optimizer step (every ``train.log_every``)."""

    event: Literal["step"] = "step"
    epoch: int | None = None  # 0-based
    step: int
    loss: float | None = None
    lr: float | None = None
    loss_scale: float | None = None  # None: no GradScaler (not float16)
    skipped_steps: int | None = None
    grad_norm: float | None = None
    images_per_s: float | None = None
    data_time_share: float | None = None

    def to_json(self) -> dict[str, Any]:
        return self.model_dump()


class EpochLine(schema.Open):
    """One epoch's end: its validation results."""

    event: Literal["epoch"] = "epoch"
    epoch: int  # 0-based
    step: int
    val_loss: float | None = None
    val_acc: float | None = None
    val_acc_before_precise_bn: float | None = None
    amp: str | None = None
    skipped_steps: int | None = None

    def to_json(self) -> dict[str, Any]:
        return self.model_dump()


MetricsLine = RunLine | StepLine | EpochLine
LINES: dict[str, type[RunLine] | type[StepLine] | type[EpochLine]] = {
    "start": RunLine, "resume": RunLine, "step": StepLine, "epoch": EpochLine}


def read_lines(path: Path) -> list[MetricsLine]:
    """metrics.jsonl's lines, typed; none when it does not exist. A line that is not JSON (the torn last line of a
    killed process) is skipped; a line of an unknown event or of the wrong types is one :class:`InputError`."""
    if not path.exists():
        return []
    lines: list[MetricsLine] = []
    raw = schema.read_bytes(path, "metrics log", METRICS_LIMIT)
    for number, text in enumerate(raw.decode("utf-8", errors="replace").splitlines(), start=1):
        try:
            data = json.loads(text)
        except ValueError:
            continue
        event = data.get("event") if isinstance(data, dict) else None
        kind = LINES.get(event) if isinstance(event, str) else None
        if kind is None:
            raise InputError(f"{path} is damaged: line {number} is not a metrics line this tool writes; delete it "
                             "or re-run train")
        lines.append(schema.validate(data, kind, path, f"a metrics line (line {number})"))
    return lines
