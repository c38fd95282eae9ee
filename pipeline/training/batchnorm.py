"""BatchNorm and the two modes of a model: precise statistics, the training momentum, and predictions in train and
eval mode (the evidence of the learning check, :mod:`pipeline.training.learning`).

Precise statistics are fvcore's ``update_bn_stats`` (Detectron2's PreciseBN hook; PyTorch ships the same idea as
``torch.optim.swa_utils.update_bn``): every BatchNorm's running mean and variance are reset and re-estimated as the
plain average over a number of training batches, with the weights fixed. A short schedule leaves the running
statistics an exponential average of batch statistics the weights have moved away from; with torchvision's
MobileNetV3 settings (momentum 0.01) they lag so far that the eval-mode model answers one class for every image.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch
from torch import nn


def layers(model: nn.Module) -> list[nn.modules.batchnorm._BatchNorm]:
    """Every BatchNorm layer that keeps running statistics (the ones eval mode reads)."""
    return [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats]


def has_dropout(model: nn.Module) -> bool:
    return any(isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0 for m in model.modules())


def set_momentum(model: nn.Module, momentum: float | None) -> int:
    """Give every BatchNorm layer ``momentum`` (``train.bn_momentum``; None keeps the layers' own); returns how many."""
    found = layers(model)
    if momentum is not None:
        for bn in found:
            bn.momentum = momentum
    return len(found)


@contextlib.contextmanager
def only_batchnorm_training(model: nn.Module) -> Iterator[list[nn.modules.batchnorm._BatchNorm]]:
    """The model in eval mode except its BatchNorm layers, which use (and track) batch statistics.

    Dropout stays off, so no random number is drawn: the global RNG, and with it the rest of training, is left
    exactly as it was. The modes are restored afterwards.
    """
    modes = {m: m.training for m in model.modules()}
    model.eval()
    found = layers(model)
    for bn in found:
        bn.train()
    try:
        yield found
    finally:
        for m, mode in modes.items():
            m.training = mode


@torch.no_grad()
def recompute_statistics(model: nn.Module, batches: Iterable[torch.Tensor], *, amp_dtype: torch.dtype | None,
                         device_type: str) -> int:
    """Re-estimate every BatchNorm's running mean and variance as the average over ``batches``; returns the batches.

    The statistics are reset and momentum set to None (PyTorch's cumulative average) for the pass, under the
    autocast training used; afterwards each layer gets its momentum and its count of training batches back, so
    only the running mean and variance change. The result depends on the weights and the batches alone, not on
    the statistics before, so an interrupted and resumed run gets the same ones.
    """
    with only_batchnorm_training(model) as found:
        saved = [(bn.momentum, bn.num_batches_tracked.clone()) for bn in found]
        try:
            for bn in found:
                bn.reset_running_stats()
                bn.momentum = None
            count = 0
            for x in batches:
                with torch.autocast(device_type, dtype=amp_dtype or torch.float32, enabled=amp_dtype is not None):
                    model(x)
                count += 1
        finally:
            for bn, (momentum, tracked) in zip(found, saved, strict=True):
                bn.momentum = momentum
                bn.num_batches_tracked.copy_(tracked)
    return count


def statistics(model: nn.Module) -> list[torch.Tensor]:
    """The running means and variances (what :func:`recompute_statistics` changes), in module order."""
    return [t for bn in layers(model) for t in (bn.running_mean, bn.running_var)]


@contextlib.contextmanager
def kept_buffers(model: nn.Module) -> Iterator[None]:
    """Run something that updates the buffers (a forward pass in train mode), then put them back."""
    saved = [b.detach().clone() for b in model.buffers()]
    try:
        yield
    finally:
        with torch.no_grad():
            for buffer, value in zip(model.buffers(), saved, strict=False):
                buffer.copy_(value)


@dataclass(frozen=True)
class ModePredictions:
    """Top-1 predictions of the same images in each mode."""

    eval: torch.Tensor  # eval mode: what is exported
    train: torch.Tensor  # train mode: batch statistics and dropout, as the weights were trained
    batchnorm_only: torch.Tensor | None  # eval mode but BatchNorm on batch statistics; None: no BatchNorm


@torch.no_grad()
def mode_predictions(model: nn.Module, images: torch.Tensor, *, batch_size: int, seed: int) -> ModePredictions:
    """Predict ``images`` (in batches of the training batch size, as BatchNorm saw them) in eval mode, in train
    mode, and in eval mode with only BatchNorm on batch statistics. The model's buffers, modes and the global RNG
    are left as they were (dropout's masks come from ``seed``)."""
    chunks = images.split(batch_size)
    was_training = model.training

    def top1() -> torch.Tensor:
        return torch.cat([model(x).argmax(1) for x in chunks])

    gpus = [images.device.index or 0] if images.device.type == "cuda" else []
    with kept_buffers(model), torch.random.fork_rng(devices=gpus):
        torch.manual_seed(seed)
        model.eval()
        in_eval = top1()
        model.train()
        in_train = top1()
        bn_only = None
        if layers(model):
            with only_batchnorm_training(model):
                bn_only = top1()
    model.train(was_training)
    return ModePredictions(eval=in_eval, train=in_train, batchnorm_only=bn_only)
