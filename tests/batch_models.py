"""A model whose output depends on the batch it is in (``--model tests/batch_models.py:batch_mean``)."""

import torch
from torch import nn


class BatchMean(nn.Module):
    """Subtracts half the batch's mean feature vector before the classifier: a batch-level statistic, as BatchNorm
    left in train mode computes. At one batch size (verify.batch_size) every runtime agrees with PyTorch; at another
    the same image gets other logits."""

    def __init__(self, num_classes: int):
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 3, padding=1)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(16, num_classes)

    def forward(self, x):
        f = torch.flatten(self.pool(torch.relu(self.conv(x))), 1)
        return self.fc(f - 0.5 * f.mean(0, keepdim=True))


def batch_mean(num_classes: int = 10):
    return BatchMean(num_classes)
