"""Small anchor-free detectors (CenterNet-style: objects as points) on the registry's backbones.

The network predicts, at stride 4, one heatmap per class (logits of "an object's centre is here"), the box size as
``log(width / stride)``, ``log(height / stride)`` and the centre's offset inside its cell: the raw head, exported as
the output ``head`` ([batch, classes + 4, H/4, W/4]) that the gate's tensor check measures. In eval mode the model
also returns ``detections`` ([batch, max_detections, 6]: x1, y1, x2, y2, score, class; pixels of the input image;
rows with score 0 are empty), made by :class:`PostProcess`: decode (sigmoid, 3x3 peak pick, top-k, ``exp`` of the
sizes) and class-aware non-maximum suppression, which exports as ONNX ``NonMaxSuppression``. Everything under the
``postprocess`` module runs in FP32 (it casts its input), and the precision plugs keep its nodes in FP32 by rule.
"""

from __future__ import annotations

import dataclasses
import warnings

import torch
from torch import nn
from torch.nn import functional as F

from models import Recipe, register_model
from models.mobilenet import SMALL_SETTINGS, MobileNetV3
from models.resnet import BasicBlock, ResNet

STRIDE = 4
PRE_NMS = 64  # peaks kept before NMS
MAX_DETECTIONS = 20  # fixed rows of the detections output
NMS_IOU = 0.6
MIN_SCORE = 0.01  # NMS drops boxes at or below this score


def box_iou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """IoU of every box of ``a`` [..., K, 4] with every box of ``b`` [..., M, 4] (x1, y1, x2, y2): [..., K, M]."""
    lt = torch.maximum(a[..., :, None, :2], b[..., None, :, :2])
    rb = torch.minimum(a[..., :, None, 2:], b[..., None, :, 2:])
    inter = (rb - lt).clamp(min=0).prod(-1)
    area_a = (a[..., 2:] - a[..., :2]).clamp(min=0).prod(-1)
    area_b = (b[..., 2:] - b[..., :2]).clamp(min=0).prod(-1)
    return inter / (area_a[..., :, None] + area_b[..., None, :] - inter).clamp(min=1e-9)


def nms_keep_eager(boxes: torch.Tensor, scores: torch.Tensor, classes: torch.Tensor, iou: float,
                   min_score: float) -> torch.Tensor:
    """Greedy class-aware NMS, as ONNX ``NonMaxSuppression`` selects: per image and class, in descending score
    order, a box over ``min_score`` is kept unless its IoU with a kept box exceeds ``iou``. [batch, K] of 0/1."""
    n, k = scores.shape
    order = scores.argsort(dim=1, descending=True, stable=True)
    b = boxes.gather(1, order[..., None].expand(n, k, 4))
    s, c = scores.gather(1, order), classes.gather(1, order)
    overlap = (box_iou(b, b) > iou) & (c[:, :, None] == c[:, None, :])
    keep = s > min_score
    for i in range(k):  # box i suppresses the later boxes it overlaps, if it is itself kept
        keep[:, i + 1:] &= ~(overlap[:, i, i + 1:] & keep[:, i:i + 1])
    out = torch.zeros_like(scores)
    out.scatter_(1, order, keep.to(scores.dtype))
    return out


class _NMSKeep(torch.autograd.Function):
    """The keep mask of :func:`nms_keep_eager`; exported as ONNX ``NonMaxSuppression`` + ``ScatterND``."""

    @staticmethod
    def forward(ctx, boxes, class_scores, iou, min_score, k):  # class_scores: [batch, classes, K], 0 off its class
        scores, classes = class_scores.max(1)
        return nms_keep_eager(boxes, scores, classes, float(iou), float(min_score))

    @staticmethod
    def symbolic(g, boxes, class_scores, iou, min_score, k):
        max_out = g.op("Constant", value_t=torch.tensor([k], dtype=torch.int64))
        iou_t = g.op("Constant", value_t=torch.tensor([float(iou)], dtype=torch.float32))
        score_t = g.op("Constant", value_t=torch.tensor([float(min_score)], dtype=torch.float32))
        selected = g.op("NonMaxSuppression", boxes, class_scores, max_out, iou_t, score_t, center_point_box_i=0)
        index = g.op("Gather", selected, g.op("Constant", value_t=torch.tensor([0, 2], dtype=torch.int64)), axis_i=1)
        zeros = g.op("ReduceMax", g.op("Mul", class_scores, g.op("Constant", value_t=torch.tensor(0.0))),
                     g.op("Constant", value_t=torch.tensor([1], dtype=torch.int64)), keepdims_i=0)
        ones = g.op("Expand", g.op("Constant", value_t=torch.tensor([1.0])),
                    g.op("Slice", g.op("Shape", selected), g.op("Constant", value_t=torch.tensor([0])),
                         g.op("Constant", value_t=torch.tensor([1]))))
        return g.op("ScatterND", zeros, index, ones)


class PostProcess(nn.Module):
    """Decode the raw head into boxes and suppress duplicates: [batch, max_detections, 6], in FP32."""

    def __init__(self, num_classes: int, stride: int = STRIDE, pre_nms: int = PRE_NMS,
                 max_detections: int = MAX_DETECTIONS):
        super().__init__()
        self.num_classes, self.stride = num_classes, stride
        self.pre_nms, self.max_detections = pre_nms, max_detections

    def forward(self, head: torch.Tensor) -> torch.Tensor:
        # The tracer warns that the height and width become constants of the graph: by design (only the batch is a
        # dynamic axis; the input size is the model card's), so those warnings are not the export's to report.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            return self._detect(head.float())

    def _detect(self, head: torch.Tensor) -> torch.Tensor:
        n, _, h, w = head.shape
        c = self.num_classes
        heat = torch.sigmoid(head[:, :c])
        peaks = heat * (F.max_pool2d(heat, 3, stride=1, padding=1) == heat).to(heat.dtype)
        k = min(self.pre_nms, c * h * w)
        scores, index = peaks.reshape(n, c * h * w).topk(k, dim=1)
        classes = torch.div(index, h * w, rounding_mode="floor")
        cell = index - classes * (h * w)
        reg = head[:, c:c + 4].reshape(n, 4, h * w).gather(2, cell[:, None, :].expand(n, 4, k))
        cx = (torch.remainder(cell, w).to(head.dtype) + reg[:, 2]) * self.stride
        cy = (torch.div(cell, w, rounding_mode="floor").to(head.dtype) + reg[:, 3]) * self.stride
        half_w = torch.exp(reg[:, 0]) * (self.stride / 2)
        half_h = torch.exp(reg[:, 1]) * (self.stride / 2)
        boxes = torch.stack([cx - half_w, cy - half_h, cx + half_w, cy + half_h], dim=2)
        boxes = torch.minimum(boxes.clamp(min=0), torch.tensor([w, h, w, h], dtype=head.dtype) * self.stride)
        one_hot = F.one_hot(classes, c).to(head.dtype).transpose(1, 2)  # [n, c, k]
        keep = _NMSKeep.apply(boxes, one_hot * scores[:, None, :], NMS_IOU, MIN_SCORE, k)
        kept = scores * keep
        top, order = kept.topk(min(self.max_detections, k), dim=1)
        picked = boxes.gather(1, order[..., None].expand(n, order.shape[1], 4))
        label = classes.gather(1, order).to(head.dtype)
        return torch.cat([picked, top[..., None], label[..., None]], dim=2)


class Neck(nn.Module):
    """Three feature maps (strides 4, 8, 16) added at stride 4 after a 1x1 projection each."""

    def __init__(self, channels: tuple[int, int, int], width: int = 64):
        super().__init__()
        self.lateral = nn.ModuleList(nn.Conv2d(ch, width, 1) for ch in channels)

    def forward(self, feats: list[torch.Tensor]) -> torch.Tensor:
        out = self.lateral[0](feats[0])
        for conv, f in zip(self.lateral[1:], feats[1:], strict=True):
            out = out + F.interpolate(conv(f), size=out.shape[-2:], mode="nearest")
        return out


class CenterNet(nn.Module):
    """CenterNet-style detector: backbone features at strides 4/8/16, a neck to stride 4, a head per cell."""

    task = "detection"
    output_names = ("head", "detections")
    output_name = "head"

    def __init__(self, body: nn.Module, channels: tuple[int, int, int], num_classes: int, width: int = 64):
        super().__init__()
        self.body = body
        self.neck = Neck(channels, width)
        self.head = nn.Sequential(nn.Conv2d(width, width, 3, padding=1), nn.ReLU(inplace=True),
                                  nn.Conv2d(width, num_classes + 4, 1))
        with torch.no_grad():  # a heatmap prior of 0.1 (CenterNet's -2.19), sizes of one cell
            self.head[-1].bias.zero_()
            self.head[-1].bias[:num_classes] = -2.19
        self.postprocess = PostProcess(num_classes)

    def raw(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.neck(self.body(x)))

    def forward(self, x: torch.Tensor):
        head = self.raw(x)
        if self.training:
            return head
        return head, self.postprocess(head)


class ResNetBody(nn.Module):
    """ResNet-18's stem and layers 1-3 (torchvision names under ``body.``): strides 4, 8, 16."""

    def __init__(self):
        super().__init__()
        net = ResNet(BasicBlock, [2, 2, 2, 2])
        self.conv1, self.bn1, self.relu, self.maxpool = net.conv1, net.bn1, net.relu, net.maxpool
        self.layer1, self.layer2, self.layer3 = net.layer1, net.layer2, net.layer3

    def forward(self, x):
        c2 = self.layer1(self.maxpool(self.relu(self.bn1(self.conv1(x)))))
        c3 = self.layer2(c2)
        return [c2, c3, self.layer3(c3)]


class MobileNetBody(nn.Module):
    """MobileNetV3-Small's feature blocks (torchvision names under ``body.features``): strides 4, 8, 16."""

    def __init__(self):
        super().__init__()
        self.features = MobileNetV3(SMALL_SETTINGS, last_channel=1024).features[:9]

    def forward(self, x):
        out = []
        for i, block in enumerate(self.features):
            x = block(x)
            if i in (1, 3, 8):
                out.append(x)
        return out


# Measured on the embedded detection set at 64x64 (docs/detection.md).
RECIPE = Recipe(optimizer="adamw", lr=2e-3, momentum=0.9, weight_decay=1e-4, warmup_epochs=0.5, epochs=6,
                bn_momentum=None, min_image_size=48, image_size=64, batch_size=16)


@register_model(recipe=RECIPE, input_size=(3, 64, 64), num_classes=6, task="detection")
def centernet_resnet18(num_classes: int = 6, image_size: int = 64) -> CenterNet:
    """CenterNet-style detector on ResNet-18 (layers 1-3, a stride-4 neck), decode and NMS in the graph."""
    return CenterNet(ResNetBody(), (64, 128, 256), num_classes)


# MobileNetV3-Small learns slowly at ResNet-18's rate: after 6 epochs mAP@0.5:0.95 4.6 % at 2e-3, 14.2 % at 6e-3.
MOBILENET_RECIPE = dataclasses.replace(RECIPE, lr=6e-3)


@register_model(recipe=MOBILENET_RECIPE, input_size=(3, 64, 64), num_classes=6, task="detection")
def centernet_mobilenet_v3_small(num_classes: int = 6, image_size: int = 64) -> CenterNet:
    """CenterNet-style detector on MobileNetV3-Small (blocks to stride 16), decode and NMS in the graph."""
    return CenterNet(MobileNetBody(), (16, 24, 48), num_classes)
