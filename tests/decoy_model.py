"""The planted decoy of issue 45 (``--model tests/decoy_model.py:decoy``): four INT8-quantizable convolutions and
no other matrix layer, one of them INT8-hostile.

``conv1`` and ``conv2`` are ordinary 3x3 convolutions wide enough (32 channels) that INT8 pays on a CPU with an
INT8 dot product. Their output has one channel scaled up 1000x, which ``hostile`` (a frozen diagonal 1x1
convolution) scales back: per-tensor calibration of ``hostile``'s input sets its INT8 step to ~8x the largest
ordinary activation, so every other channel rounds to zero and the logits are wrong unless ``hostile`` stays out of
INT8. The classifier ``head`` is a 1x1 convolution over the pooled features. A sound tune keeps three of the four
in INT8 and raises ``hostile``.
"""

import torch
from torch import nn


class Decoy(nn.Module):
    def __init__(self, num_classes: int = 10, width: int = 32):
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        scale = torch.ones(width)
        scale[0] = 1000.0
        self.register_buffer("outlier", scale.view(1, width, 1, 1))
        self.hostile = nn.Conv2d(width, width, 1, bias=False)
        with torch.no_grad():
            self.hostile.weight.copy_(torch.diag(1.0 / scale).view(width, width, 1, 1))
        self.hostile.weight.requires_grad_(False)
        self.head = nn.Conv2d(width, num_classes, 1)

    def forward(self, x):
        h = torch.relu(self.bn1(self.conv1(x)))
        h = torch.relu(self.bn2(self.conv2(h)))
        h = torch.relu(self.hostile(h * self.outlier))
        return torch.flatten(self.head(nn.functional.adaptive_avg_pool2d(h, 1)), 1)


def decoy(num_classes: int = 10):
    return Decoy(num_classes)
