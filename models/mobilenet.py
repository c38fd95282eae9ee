"""MobileNetV3-Small written from scratch with torchvision's parameter names.

A torchvision ``mobilenet_v3_small().state_dict()`` loads into :func:`mobilenet_v3_small`
unchanged (``tests/test_models.py`` checks every key and shape against a written-out list).
"""

from __future__ import annotations

from functools import partial

import torch
from torch import nn

from models import Recipe, register_model

# torchvision trains MobileNetV3 with these BatchNorm settings; loading its weights needs them too.
BatchNorm = partial(nn.BatchNorm2d, eps=0.001, momentum=0.01)


def make_divisible(value: float, divisor: int = 8) -> int:
    """Round ``value`` to a multiple of ``divisor``, never going more than 10% below it."""
    rounded = max(divisor, int(value + divisor / 2) // divisor * divisor)
    return rounded + divisor if rounded < 0.9 * value else rounded


class ConvBNAct(nn.Sequential):
    """Convolution, BatchNorm and an optional activation: torchvision's ``Conv2dNormActivation``."""

    def __init__(self, in_ch: int, out_ch: int, kernel: int = 3, stride: int = 1, groups: int = 1, act=nn.ReLU):
        layers = [
            nn.Conv2d(in_ch, out_ch, kernel, stride, padding=(kernel - 1) // 2, groups=groups, bias=False),
            BatchNorm(out_ch),
        ]
        if act is not None:
            layers.append(act(inplace=True))
        super().__init__(*layers)


class SqueezeExcitation(nn.Module):
    def __init__(self, channels: int, squeeze: int):
        super().__init__()
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Conv2d(channels, squeeze, 1)
        self.fc2 = nn.Conv2d(squeeze, channels, 1)
        self.activation = nn.ReLU()
        self.scale_activation = nn.Hardsigmoid()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = self.fc2(self.activation(self.fc1(self.avgpool(x))))
        return self.scale_activation(scale) * x


class InvertedResidual(nn.Module):
    def __init__(self, in_ch: int, kernel: int, expanded: int, out_ch: int, use_se: bool, act, stride: int):
        super().__init__()
        layers: list[nn.Module] = []
        # Without an expansion conv the depthwise conv becomes block.0, shifting every later index.
        if expanded != in_ch:
            layers.append(ConvBNAct(in_ch, expanded, 1, act=act))
        layers.append(ConvBNAct(expanded, expanded, kernel, stride, groups=expanded, act=act))
        if use_se:
            layers.append(SqueezeExcitation(expanded, make_divisible(expanded // 4)))
        layers.append(ConvBNAct(expanded, out_ch, 1, act=None))
        self.block = nn.Sequential(*layers)
        self.use_res_connect = stride == 1 and in_ch == out_ch

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.block(x)
        return out + x if self.use_res_connect else out


RE, HS = nn.ReLU, nn.Hardswish

# input channels, kernel, expanded channels, output channels, squeeze-excitation, activation, stride
SMALL_SETTINGS = [
    (16, 3, 16, 16, True, RE, 2),
    (16, 3, 72, 24, False, RE, 2),
    (24, 3, 88, 24, False, RE, 1),
    (24, 5, 96, 40, True, HS, 2),
    (40, 5, 240, 40, True, HS, 1),
    (40, 5, 240, 40, True, HS, 1),
    (40, 5, 120, 48, True, HS, 1),
    (48, 5, 144, 48, True, HS, 1),
    (48, 5, 288, 96, True, HS, 2),
    (96, 5, 576, 96, True, HS, 1),
    (96, 5, 576, 96, True, HS, 1),
]


class MobileNetV3(nn.Module):
    def __init__(self, settings: list[tuple], last_channel: int, num_classes: int = 1000, dropout: float = 0.2):
        super().__init__()
        first, last = settings[0][0], settings[-1][3]
        self.features = nn.Sequential(
            ConvBNAct(3, first, 3, stride=2, act=nn.Hardswish),
            *(InvertedResidual(*cfg) for cfg in settings),
            ConvBNAct(last, 6 * last, 1, act=nn.Hardswish),
        )
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(
            nn.Linear(6 * last, last_channel),
            nn.Hardswish(inplace=True),
            nn.Dropout(p=dropout, inplace=True),
            nn.Linear(last_channel, num_classes),
        )

        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out")
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0, 0.01)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


# Measured on the embedded data set at 32x32 (docs/models-and-data.md): lr 0.1 reaches 89-95 % (seeds 0-2) where 0.05
# reaches 82-88 % and 0.2 84 %. BatchNorm keeps torchvision's momentum 0.01: precise statistics (train.precise_bn)
# make up for its lag, and at 32x32 the last feature maps are 1x1, the smallest that makes sense.
@register_model(recipe=Recipe(
    optimizer="sgd", lr=0.1, momentum=0.9, weight_decay=5e-4, warmup_epochs=0.5, epochs=4, bn_momentum=None,
    min_image_size=32))
def mobilenet_v3_small(num_classes: int = 1000, image_size: int = 224) -> MobileNetV3:
    """MobileNetV3-Small (2.5M parameters at 1000 classes), torchvision-compatible names."""
    return MobileNetV3(SMALL_SETTINGS, last_channel=1024, num_classes=num_classes)
