"""Planted models for ``python -m pipeline tune`` (tests/test_tune.py), used as user models."""

import torch
from torch import nn


class _Base(nn.Module):
    """tests/fault_models.py's small CNN (a user model file is imported alone, so it is not imported from there)."""

    def __init__(self, num_classes: int):
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(16)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(16, num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.bn(self.conv(x)))

    def head(self, h: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.pool(h), 1))


def _diagonal_mix(scale: torch.Tensor) -> nn.Conv2d:
    """A frozen 1x1 convolution that scales each channel back by ``1 / scale``."""
    mix = nn.Conv2d(len(scale), len(scale), 1, bias=False)
    with torch.no_grad():
        mix.weight.copy_(torch.diag(1.0 / scale).view(len(scale), len(scale), 1, 1))
    mix.weight.requires_grad_(False)
    return mix


class MildThenSevere(_Base):
    """Two outlier channels: an early one at 30x feeding ``early`` (its INT8 rounding is visible in its own tensor,
    so localisation names it first, but the average pool washes it out of the logits) and a late one at 1000x
    feeding ``late`` (every other channel rounds to zero: the logits are wrong). Greedy fallback raises ``early``
    and then ``late``; the sensitivity ranking puts ``late`` first, and raising it alone passes."""

    def __init__(self, num_classes: int):
        super().__init__(num_classes)
        mild, severe = torch.ones(16), torch.ones(16)
        mild[0], severe[0] = 30.0, 1000.0
        self.register_buffer("mild", mild.view(1, 16, 1, 1))
        self.register_buffer("severe", severe.view(1, 16, 1, 1))
        self.early = _diagonal_mix(mild)
        self.late = _diagonal_mix(severe)

    def forward(self, x):
        h = self.early(self.features(x) * self.mild)
        return self.head(self.late(torch.relu(h) * self.severe))


def mild_then_severe(num_classes: int = 10):
    return MildThenSevere(num_classes)
