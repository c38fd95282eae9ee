"""A tiny CNN registered like the real models, so tests exercise every stage in seconds."""

from __future__ import annotations

import torch
from torch import nn

from models import Recipe, register_model


class TinyCNN(nn.Module):
    def __init__(self, num_classes: int = 10, width: int = 16):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, width, 3, padding=1, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 3, padding=1, bias=False),
            nn.BatchNorm2d(2 * width),
            nn.ReLU(inplace=True),
            nn.AdaptiveAvgPool2d(1),
        )
        self.fc = nn.Linear(2 * width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.features(x), 1))


# The config's defaults: what the tests were written against (74 % on the embedded data set at 32x32).
@register_model(input_size=(3, 32, 32), num_classes=10, recipe=Recipe(
    optimizer="sgd", lr=0.05, momentum=0.9, weight_decay=5e-4, warmup_epochs=0.5, epochs=4, bn_momentum=None,
    min_image_size=16))
def tiny_cnn(num_classes: int = 10, image_size: int = 32) -> TinyCNN:
    """Two-convolution CNN (about 6k parameters) for fast tests."""
    return TinyCNN(num_classes)
