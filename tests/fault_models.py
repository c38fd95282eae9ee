"""Models with planted faults, used as user models (``--model tests/fault_models.py:<factory>``).

Each is a small CNN that trains normally in FP32; the fault only shows after export or in FP16.
"""

import torch
from torch import nn


class _Base(nn.Module):
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


class Cancellation(_Base):
    """Adds and subtracts a large constant: every value stays far inside FP16's range (|x| < 400),
    so no range rule can see it, but FP16 rounding at 384 (steps of 0.25) wipes out the small part."""

    def forward(self, x):
        f = torch.flatten(self.pool(self.features(x)), 1)
        f = (f + 384.0) - 384.0
        return self.fc(f)


class MildCancellation(_Base):
    """The cancellation fault at a smaller shift: FP16 steps of 1/32 at 48, so the features lose a few percent."""

    def forward(self, x):
        f = torch.flatten(self.pool(self.features(x)), 1)
        f = (f + 48.0) - 48.0
        return self.fc(f)


class Overflow(_Base):
    """Activations of 80k-400k in the middle (above FP16's 65504), scaled back down afterwards."""

    def forward(self, x):
        h = self.features(x) + 2.0
        h = h * 40000.0
        h = h / 40000.0
        return self.head(h - 2.0)


class BatchBranch(_Base):
    """A Python branch on the input that the tracer freezes: the export example (2 images) takes
    the 'fast path', every other batch size the real one, so the exported graph is wrong."""

    def forward(self, x):
        logits = self.head(self.features(x))
        if x.shape[0] == 2:
            return logits * 0.0
        return logits


class OutlierChannel(_Base):
    """INT8 fault: one activation channel 1000x larger than the other 15 (a fixed per-channel scale), fed to a
    1x1 convolution that scales it back (a frozen diagonal mix; weights are quantized per output channel, so
    they stay exact). Per-tensor max calibration of that convolution's input sets the INT8 step to ~8x the
    largest ordinary activation, so every other channel rounds to zero. FP32 and FP16 are unaffected."""

    def __init__(self, num_classes: int):
        super().__init__(num_classes)
        scale = torch.ones(16)
        scale[0] = 1000.0
        self.register_buffer("outlier", scale.view(1, 16, 1, 1))
        self.mix = nn.Conv2d(16, 16, 1, bias=False)
        with torch.no_grad():
            self.mix.weight.copy_(torch.diag(1.0 / scale).view(16, 16, 1, 1))
        self.mix.weight.requires_grad_(False)

    def forward(self, x):
        return self.head(self.mix(self.features(x) * self.outlier))


class MildOutlierChannel(OutlierChannel):
    """The outlier-channel fault at 100x: the other channels keep a few INT8 steps instead of none."""

    def __init__(self, num_classes: int):
        super().__init__(num_classes)
        scale = torch.ones(16)
        scale[0] = 100.0
        self.outlier.copy_(scale.view(1, 16, 1, 1))
        with torch.no_grad():
            self.mix.weight.copy_(torch.diag(1.0 / scale).view(16, 16, 1, 1))


class ShiftedClassifier(_Base):
    """The classifier's input shifted by 384 and the shift's contribution subtracted after it: exact in FP32,
    but a BF16 matrix unit rounds its inputs to 8 significant bits (steps of 2 at 384), which wipes out the
    features. (OpenVINO folds the cancellation model's ``(f + 384) - 384`` away, or fuses it into one f32
    kernel, so that model plants no fault in OpenVINO's BF16; this one survives both.)"""

    def forward(self, x):
        f = torch.flatten(self.pool(self.features(x)), 1)
        return self.fc(f + 384.0) - 384.0 * self.fc.weight.sum(1)


def shifted_classifier(num_classes: int = 10):
    return ShiftedClassifier(num_classes)


def cancellation(num_classes: int = 10):
    return Cancellation(num_classes)


def mild_cancellation(num_classes: int = 10):
    return MildCancellation(num_classes)


def mild_outlier_channel(num_classes: int = 10):
    return MildOutlierChannel(num_classes)


def overflow(num_classes: int = 10):
    return Overflow(num_classes)


def batch_branch(num_classes: int = 10):
    return BatchBranch(num_classes)


def outlier_channel(num_classes: int = 10):
    return OutlierChannel(num_classes)


class TransformerEncoderNet(nn.Module):
    """A standard ``nn.TransformerEncoder`` classifier: 4x4 stride-4 patch conv, dim 64, 2 layers, 4 heads,
    ``norm_first``, GELU, ``batch_first``. Converted to FP16, it makes ONNX Runtime's CPU provider segfault while
    it creates the session on an AVX-512 CPU (microsoft/onnxruntime#28392: NchwcTransformer)."""

    def __init__(self, num_classes: int = 10, dim: int = 64):
        super().__init__()
        self.patch = nn.Conv2d(3, dim, kernel_size=4, stride=4)
        layer = nn.TransformerEncoderLayer(dim, nhead=4, dim_feedforward=2 * dim, dropout=0.0, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, num_classes)

    def forward(self, x):
        tokens = self.patch(x).flatten(2).transpose(1, 2)  # (batch, patches, dim)
        return self.fc(self.norm(self.encoder(tokens)).mean(1))


def transformer_encoder(num_classes: int = 10):
    return TransformerEncoderNet(num_classes)


# --------------------------------------------------------------------------- for tune (tests/test_tune.py)


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


class MildThenSevereFp16(ShiftedClassifier):
    """FP16's twin of :class:`MildThenSevere`: an early shift by 48 on the feature map (FP16 steps of 1/32 there:
    visible in its own tensor, so localisation names it first, but the average pool washes it out of the logits),
    then the shifted classifier (the logits are wrong). Greedy fallback keeps the early shift in FP32 first;
    the sensitivity ranking puts the classifier's shift first, and keeping it alone in FP32 passes."""

    def forward(self, x):
        h = (self.features(x) + 48.0) - 48.0
        f = torch.flatten(self.pool(h), 1)
        return self.fc(f + 384.0) - 384.0 * self.fc.weight.sum(1)


def mild_then_severe_fp16(num_classes: int = 10):
    return MildThenSevereFp16(num_classes)


class WeightSpike(_Base):
    """INT8 fault meant for QAT: every output channel of the first convolution holds one large weight (100x the
    largest other) on an input channel that is always zero (a zero plane concatenated to the image). It never
    contributes, but per-channel max calibration sets each channel's weight step to ~4/5 of the largest ordinary
    weight (about three levels), so PTQ rounds the real filters coarsely. Fine-tuning with the rounding in the loop
    moves the real weights to where their rounded values work; raising the layer out of INT8 fixes it too."""

    def __init__(self, num_classes: int, spike: float = 100.0):
        super().__init__(num_classes)
        self.conv = nn.Conv2d(4, 16, 3, padding=1, bias=False)
        with torch.no_grad():
            self.conv.weight[:, 3, 1, 1] = spike * self.conv.weight[:, :3].abs().max()

    def forward(self, x):
        x = torch.cat([x, torch.zeros_like(x[:, :1])], 1)
        return self.head(self.features(x))


def weight_spike(num_classes: int = 10):
    return WeightSpike(num_classes)


def strong_weight_spike(num_classes: int = 10):
    """The weight spike at 150x: a step of ~1.2 of the largest ordinary weight, most of them round to zero."""
    return WeightSpike(num_classes, spike=150.0)


# --------------------------------------------------------------------------- detectors (tests/test_detection.py)


class _TinyDetector(nn.Module):
    """A small CenterNet-style detector (stride 4) with the registry's decode and NMS (models/detector.py): trains
    in seconds on the embedded detection set; each fault below plants one defect in its head."""

    task = "detection"
    output_names = ("head", "detections")
    output_name = "head"

    def __init__(self, num_classes: int):
        from models.detector import PostProcess

        super().__init__()
        self.num_classes = num_classes
        self.body = nn.Sequential(nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                                  nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
                                  nn.Conv2d(32, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU())
        self.heat = nn.Conv2d(32, num_classes, 1)
        self.reg = nn.Conv2d(32, 4, 1)
        with torch.no_grad():
            self.heat.bias.fill_(-2.19)
        self.postprocess = PostProcess(num_classes)

    def scores(self, f):
        return self.heat(f)

    def boxes(self, f):
        return self.reg(f)

    def forward(self, x):
        f = self.body(x)
        head = torch.cat([self.scores(f), self.boxes(f)], 1)
        if self.training:
            return head
        return head, self.postprocess(head)


class DecodeOverflow(_TinyDetector):
    """FP16 decode overflow: the head decodes its box sizes to pixels of a 65536-pixel canvas (exp, then x65536)
    and takes the log again, inside the network rather than in the FP32 post-processing: exact in FP32, but every
    size is over FP16's 65504, so FP16 makes it inf (AutoCast's range rule keeps it in FP32 when it is on)."""

    def boxes(self, f):
        r = self.reg(f)
        size = torch.exp(r[:, :2]) * 65536.0
        return torch.cat([torch.log(size) - 11.0903548889591, r[:, 2:]], 1)  # log(65536)


class OutlierRegression(_TinyDetector):
    """INT8-hostile regression head: its input has one channel 1000x the others (a fixed scale, undone by a frozen
    diagonal 1x1 convolution). Per-tensor INT8 of that input rounds every other channel to zero: every box moves,
    which no score shows. The heatmap does not read it."""

    def __init__(self, num_classes: int):
        super().__init__(num_classes)
        scale = torch.ones(32)
        scale[0] = 1000.0
        self.register_buffer("outlier", scale.view(1, 32, 1, 1))
        self.mix = _diagonal_mix(scale)

    def boxes(self, f):
        return self.reg(self.mix(f * self.outlier))


class ScoreCancellation(_TinyDetector):
    """A score head whose FP16 change flips NMS: its logits pass through ``(s + 384) - 384``, exact in FP32 and far
    inside FP16's range, but FP16 rounds them to steps of 0.25 there: scores tie or swap, and peaks, NMS winners and
    the boxes over the score threshold change."""

    def scores(self, f):
        return (self.heat(f) + 384.0) - 384.0


def det_decode_overflow(num_classes: int = 6):
    return DecodeOverflow(num_classes)


def det_outlier_regression(num_classes: int = 6):
    return OutlierRegression(num_classes)


def det_score_cancellation(num_classes: int = 6):
    return ScoreCancellation(num_classes)


def det_tiny(num_classes: int = 6):
    """The tiny detector without a fault."""
    return _TinyDetector(num_classes)
