"""ResNet-18/34/50 written from scratch with torchvision's parameter names.

A torchvision ``resnet18().state_dict()`` loads into :func:`resnet18` unchanged
(``tests/test_models.py`` checks every key and shape against a written-out list).
"""

from __future__ import annotations

import torch
from torch import nn

from models import Recipe, register_model


def conv3x3(in_ch: int, out_ch: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_ch, out_ch, kernel_size=3, stride=stride, padding=1, bias=False)


def conv1x1(in_ch: int, out_ch: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_ch, out_ch, kernel_size=1, stride=stride, bias=False)


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, in_ch: int, width: int, stride: int = 1, downsample: nn.Module | None = None):
        super().__init__()
        self.conv1 = conv3x3(in_ch, width, stride)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = conv3x3(width, width)
        self.bn2 = nn.BatchNorm2d(width)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class Bottleneck(nn.Module):
    # The stride sits on the 3x3 convolution ("ResNet v1.5"), as in torchvision.
    expansion = 4

    def __init__(self, in_ch: int, width: int, stride: int = 1, downsample: nn.Module | None = None):
        super().__init__()
        self.conv1 = conv1x1(in_ch, width)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = conv3x3(width, width, stride)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = conv1x1(width, width * self.expansion)
        self.bn3 = nn.BatchNorm2d(width * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


class ResNet(nn.Module):
    def __init__(self, block: type[BasicBlock | Bottleneck], layers: list[int], num_classes: int = 1000):
        super().__init__()
        self.in_ch = 64
        self.conv1 = nn.Conv2d(3, 64, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(block, 64, layers[0])
        self.layer2 = self._make_layer(block, 128, layers[1], stride=2)
        self.layer3 = self._make_layer(block, 256, layers[2], stride=2)
        self.layer4 = self._make_layer(block, 512, layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512 * block.expansion, num_classes)

        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        # Start each residual branch at zero so early training sees identity blocks
        # (torchvision's zero_init_residual): it makes short CPU runs converge much faster.
        for m in self.modules():
            if isinstance(m, Bottleneck):
                nn.init.zeros_(m.bn3.weight)
            elif isinstance(m, BasicBlock):
                nn.init.zeros_(m.bn2.weight)

    def _make_layer(self, block, width: int, blocks: int, stride: int = 1) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.in_ch != width * block.expansion:
            downsample = nn.Sequential(
                conv1x1(self.in_ch, width * block.expansion, stride), nn.BatchNorm2d(width * block.expansion)
            )
        layers = [block(self.in_ch, width, stride, downsample)]
        self.in_ch = width * block.expansion
        layers += [block(self.in_ch, width) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


# Measured on the embedded data set at 32x32 (docs/models-and-data.md). Below 32x32 layer4 sees 1x1 maps (where
# bf16 weight gradients can be NaN on some CPUs: docs/training.md).
RECIPE = Recipe(optimizer="sgd", lr=0.05, momentum=0.9, weight_decay=5e-4, warmup_epochs=0.5, epochs=4,
                bn_momentum=None, min_image_size=32)


@register_model(recipe=RECIPE)
def resnet18(num_classes: int = 1000, image_size: int = 224) -> ResNet:
    """ResNet-18 (11.7M parameters at 1000 classes), torchvision-compatible names."""
    return ResNet(BasicBlock, [2, 2, 2, 2], num_classes)


@register_model(recipe=RECIPE)
def resnet34(num_classes: int = 1000, image_size: int = 224) -> ResNet:
    """ResNet-34 (21.8M parameters at 1000 classes), torchvision-compatible names."""
    return ResNet(BasicBlock, [3, 4, 6, 3], num_classes)


@register_model(recipe=RECIPE)
def resnet50(num_classes: int = 1000, image_size: int = 224) -> ResNet:
    """ResNet-50 v1.5 (25.6M parameters at 1000 classes), torchvision-compatible names."""
    return ResNet(Bottleneck, [3, 4, 6, 3], num_classes)
