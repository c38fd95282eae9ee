"""metrics.jsonl (written line by line), its reader, the training-curve plot, and evaluation."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
from torch import nn

from pipeline.core import data as data_mod
from pipeline.core.run import atomic_path
from pipeline.training.distributed import Dist, all_reduce_sum
from pipeline.training.records import EpochLine, MetricsLine, StepLine, read_lines

log = logging.getLogger("pipeline")


class MetricsLog:
    """Append-only JSONL (one object per line, flushed), rank 0 only; TensorBoard when installed."""

    def __init__(self, path: Path, enabled: bool, tensorboard_dir: Path | None):
        from pipeline.core.run import make_folder, open_append

        self.enabled = enabled
        self.f = open_append(path) if enabled else None  # never through a symbolic link
        self.tb = None
        if enabled and tensorboard_dir is not None:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(str(make_folder(tensorboard_dir)))
            except ImportError:
                self.tb = None

    def write(self, line: MetricsLine) -> None:
        if not self.enabled:
            return
        self.f.write(json.dumps(line.to_json()) + "\n")
        self.f.flush()
        if self.tb is not None:
            for key, value in line.to_json().items():
                if isinstance(value, (int, float)) and not isinstance(value, bool) and key not in ("step", "epoch"):
                    self.tb.add_scalar(f"{line.event}/{key}", value, line.step)

    def close(self) -> None:
        if self.f:
            self.f.close()
            self.f = None
        if self.tb is not None:
            self.tb.close()
            self.tb = None

    def __enter__(self) -> MetricsLog:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_metrics(path: Path) -> list[MetricsLine]:
    """metrics.jsonl's lines, typed (:func:`pipeline.training.records.read_lines`: a torn last line left by a
    killed process is skipped)."""
    return read_lines(path)


def plot_curves(metrics_path: Path, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_metrics(metrics_path)
    # After a resume the log holds the replayed steps again: keep the last record of each step.
    steps = {r.step: r for r in records if isinstance(r, StepLine) and r.loss is not None}
    epochs = {r.epoch: r for r in records if isinstance(r, EpochLine) and r.val_loss is not None
              and r.val_acc is not None}
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.6))
    if steps:
        xs = sorted(steps)
        ax1.plot(xs, [steps[s].loss for s in xs], lw=1, label="train loss")
    if epochs:
        es = sorted(epochs)
        ax1.plot([epochs[e].step for e in es], [epochs[e].val_loss for e in es], "o-", label="val loss")
        ax2.plot([e + 1 for e in es], [100 * epochs[e].val_acc for e in es], "o-", color="tab:green")
    ax1.set_xlabel("optimizer step")
    ax1.set_ylabel("loss")
    ax1.legend()
    ax1.grid(alpha=0.3)
    ax2.set_xlabel("epoch")
    ax2.set_ylabel("validation accuracy (%)")
    ax2.grid(alpha=0.3)
    fig.tight_layout()
    with atomic_path(out) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)


@torch.no_grad()
def evaluate(model: nn.Module, dataset, device, world: Dist, amp_dtype, channels_last: bool,
             batch_size: int = 256) -> tuple[float, float]:
    """Validation loss and accuracy; each rank takes every world_size-th image, sums are reduced."""
    model.eval()
    indices = list(range(world.rank, len(dataset), world.world_size))
    loss_sum, correct = 0.0, 0.0
    for i in range(0, len(indices), batch_size):
        x, y = data_mod.collate(data_mod.fetch_items(dataset, indices[i : i + batch_size]))
        x, y = x.to(device), y.to(device)
        if channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        with torch.autocast(device.type, dtype=amp_dtype or torch.float32, enabled=amp_dtype is not None):
            logits = model(x)
        loss_sum += nn.functional.cross_entropy(logits.float(), y, reduction="sum").item()
        correct += (logits.argmax(1) == y).sum().item()
    loss_sum, correct, count = all_reduce_sum([loss_sum, correct, float(len(indices))], world, device)
    return loss_sum / max(count, 1), correct / max(count, 1)


@torch.no_grad()
def predict(model: nn.Module, dataset, device, channels_last: bool,
            batch_size: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-1 predictions (eval mode, FP32) and labels of every image of ``dataset``, on CPU, in this process."""
    model.eval()
    predicted, labels = [], []
    for i in range(0, len(dataset), batch_size):
        x, y = data_mod.collate(data_mod.fetch_items(dataset, list(range(i, min(i + batch_size, len(dataset))))))
        x = x.to(device)
        if channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        predicted.append(model(x).argmax(1).cpu())
        labels.append(y)
    if not predicted:
        return torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long)
    return torch.cat(predicted), torch.cat(labels)
