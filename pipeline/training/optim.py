"""The optimizer, its learning-rate schedule, and one optimizer step under AMP (a non-finite step is skipped)."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from pipeline.training.distributed import Dist, all_reduce_sum

if TYPE_CHECKING:  # annotations only
    from pipeline.core.config_schema import Config

log = logging.getLogger("pipeline")


def lr_lambda(total_steps: int, warmup_steps: int):
    def factor(step: int) -> float:
        if warmup_steps and step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return factor


def make_optimizer(cfg: Config, model: nn.Module) -> torch.optim.Optimizer:
    # No weight decay on norm scales and biases (1-D parameters), as is usual for CNNs and ViTs.
    decay = [p for p in model.parameters() if p.requires_grad and p.ndim > 1]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.ndim <= 1]
    groups = [{"params": decay, "weight_decay": cfg.train.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    if cfg.train.optimizer == "adamw":
        return torch.optim.AdamW(groups, lr=cfg.train.lr)
    return torch.optim.SGD(groups, lr=cfg.train.lr, momentum=cfg.train.momentum)


@dataclass
class StepResult:
    skipped: bool  # the weights, buffers and schedule were left as they were
    nonfinite: bool  # ... because the loss or the gradients were NaN/Inf
    grad_norm: float | None = None


def snapshot_buffers(model: nn.Module) -> list[torch.Tensor]:
    """Copies of the buffers (BatchNorm running statistics), taken before a step's first forward pass."""
    return [b.detach().clone() for b in model.buffers()]


def restore_buffers(model: nn.Module, saved: list[torch.Tensor]) -> None:
    with torch.no_grad():
        for buffer, value in zip(model.buffers(), saved, strict=False):
            buffer.copy_(value)


def grads_finite(model: nn.Module) -> bool:
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    return not grads or bool(torch.stack([torch.isfinite(g).all() for g in grads]).all())


def optimizer_step(*, model: nn.Module, optimizer, scaler, scheduler, clip_grad_norm: float | None,
                   world: Dist, device, loss_finite: bool) -> StepResult:
    """One optimizer step, skipped when its loss or gradients are not finite.

    With float16 the GradScaler finds inf/NaN gradients and skips the step. In bf16 and FP32
    nothing else would, so the same check is made here: a bf16 kernel can return NaN gradients
    from a finite loss (see docs/training.md), and one such step poisons the weights for good.
    The decision is reduced over the ranks, so the replicas stay identical. The caller restores
    the buffers of a skipped step.
    """
    if not scaler.is_enabled():
        ok = loss_finite and grads_finite(model)
        if all_reduce_sum([0.0 if ok else 1.0], world, device)[0] != 0.0:
            optimizer.zero_grad(set_to_none=True)
            return StepResult(skipped=True, nonfinite=True)
    grad_norm = None
    if clip_grad_norm:
        scaler.unscale_(optimizer)
        grad_norm = float(nn.utils.clip_grad_norm_(model.parameters(), clip_grad_norm))
    scale_before = scaler.get_scale() if scaler.is_enabled() else None
    # Gradients are all-reduced before this point, so every rank's scaler sees the same inf/NaN
    # and makes the same skip decision.
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    skipped = scaler.is_enabled() and scaler.get_scale() < scale_before
    if not skipped:
        scheduler.step()
    return StepResult(skipped=skipped, nonfinite=skipped and not loss_finite, grad_norm=grad_norm)
