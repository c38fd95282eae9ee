"""Detection's training pieces: the CenterNet loss (focal loss on Gaussian centre heatmaps, L1 on log sizes and
centre offsets at the centres), validation (loss and COCO mAP of the ``detections`` output), and the learning check
(the trained model's mAP against an untrained model's, with a bootstrap bound over the validation images).

The raw head is [N, classes + 4, H/s, W/s]: class heatmap logits, then log(width / s), log(height / s) and the
centre's offset in its cell (x, y). Labels are [N, M, 5] rows (class, x1, y1, x2, y2), class -1 for padding.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import torch
from torch import nn

from pipeline.core import boxes

SIZE_WEIGHT, OFFSET_WEIGHT = 1.0, 1.0


def targets(labels: torch.Tensor, classes: int, h: int, w: int, stride: int):
    """Heatmap targets [N, C, h, w] and, per object, (image, cell index, log-size and offset targets)."""
    n = labels.shape[0]
    rows = labels.reshape(-1, 5).float()
    image = torch.arange(n, device=labels.device).repeat_interleave(labels.shape[1])
    valid = (rows[:, 0] >= 0) & (rows[:, 3] > rows[:, 1]) & (rows[:, 4] > rows[:, 2])
    rows, image = rows[valid], image[valid]
    cls = rows[:, 0].long().clamp(0, classes - 1)
    cx, cy = (rows[:, 1] + rows[:, 3]) / (2 * stride), (rows[:, 2] + rows[:, 4]) / (2 * stride)
    bw, bh = (rows[:, 3] - rows[:, 1]) / stride, (rows[:, 4] - rows[:, 2]) / stride
    ix, iy = cx.floor().clamp(0, w - 1), cy.floor().clamp(0, h - 1)
    sx, sy = (bw / 6).clamp(min=0.5), (bh / 6).clamp(min=0.5)
    gx = torch.arange(w, device=labels.device, dtype=torch.float32)
    gy = torch.arange(h, device=labels.device, dtype=torch.float32)
    gauss = torch.exp(-((gx[None, None, :] - ix[:, None, None]) ** 2) / (2 * sx[:, None, None] ** 2)
                      - ((gy[None, :, None] - iy[:, None, None]) ** 2) / (2 * sy[:, None, None] ** 2))
    heat = torch.zeros(n * classes, h * w, device=labels.device)
    if len(rows):
        index = (image * classes + cls)[:, None].expand(len(rows), h * w)
        heat.scatter_reduce_(0, index, gauss.reshape(len(rows), h * w), "amax")
    cell = (iy * w + ix).long()
    reg = torch.stack([bw.clamp(min=1e-3).log(), bh.clamp(min=1e-3).log(), cx - ix, cy - iy], dim=1)
    return heat.view(n, classes, h, w), image, cell, reg


def loss(head: torch.Tensor, labels: torch.Tensor, classes: int, stride: int) -> torch.Tensor:
    """CenterNet's loss of one batch (FP32), normalised by the number of objects."""
    head = head.float()
    n, _, h, w = head.shape
    heat, image, cell, reg = targets(labels.to(head.device), classes, h, w, stride)
    logits = head[:, :classes]
    p = torch.sigmoid(logits)
    log_p, log_1p = nn.functional.logsigmoid(logits), nn.functional.logsigmoid(-logits)
    pos = heat >= 1.0 - 1e-6
    focal = torch.where(pos, -((1 - p) ** 2) * log_p, -((1 - heat) ** 4) * p ** 2 * log_1p).sum()
    objects = max(int(pos.sum()), 1)
    if len(cell):
        predicted = head[:, classes:classes + 4].reshape(n, 4, h * w)[image, :, cell]
        size = nn.functional.l1_loss(predicted[:, :2], reg[:, :2], reduction="sum")
        offset = nn.functional.l1_loss(predicted[:, 2:], reg[:, 2:], reduction="sum")
    else:
        size = offset = head.sum() * 0.0
    return (focal + SIZE_WEIGHT * size + OFFSET_WEIGHT * offset) / objects


@torch.no_grad()
def predict(model: nn.Module, dataset, device, batch_size: int = 128, amp_dtype=None, channels_last: bool = False):
    """The detections and labels of every image of ``dataset`` (eval mode), and the summed loss."""
    from pipeline.core import data as data_mod

    model.eval()
    dets, labels, loss_sum = [], [], 0.0
    classes = model.postprocess.num_classes
    for i in range(0, len(dataset), batch_size):
        x, y = data_mod.collate(data_mod.fetch_items(dataset, list(range(i, min(i + batch_size, len(dataset))))))
        x = x.to(device)
        if channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        with torch.autocast(device.type, dtype=amp_dtype or torch.float32, enabled=amp_dtype is not None):
            head, det = model(x)
        loss_sum += float(loss(head, y, classes, model.postprocess.stride)) * len(x)
        dets.append(det.float().cpu().numpy())
        labels.append(y.numpy())
    if not dets:
        return np.zeros((0, 1, 6)), np.zeros((0, 1, 5)), 0.0
    return np.concatenate(dets), np.concatenate(labels), loss_sum


def evaluate(model: nn.Module, dataset, device, amp_dtype=None, channels_last: bool = False) -> tuple[float, float]:
    """Validation loss and mAP@0.5:0.95 (the trainer's "val acc" for a detector)."""
    dets, labels, loss_sum = predict(model, dataset, device, amp_dtype=amp_dtype, channels_last=channels_last)
    quality = boxes.coco_map(list(dets), list(labels), model.postprocess.num_classes)
    return loss_sum / max(len(labels), 1), quality["map"]


# --------------------------------------------------------------------------- the learning check


@dataclass(frozen=True)
class DetectionLearning:
    """The learning check of a detector: mAP of the trained and of an untrained model on the validation images."""

    samples: int
    map: float
    map50: float
    untrained_map: float
    improvement_lower: float  # the bound at ``confidence`` of (trained - untrained) mAP over bootstrap samples
    confidence: float
    min_map: float | None
    learned: bool
    failed: bool
    line: str

    def to_dict(self) -> dict:
        return asdict(self)


def judge_learning(samples: int, trained: dict, untrained: dict, drops: np.ndarray, confidence: float,
                   min_map: float | None, require: bool) -> DetectionLearning:
    """Learned when the bootstrap bound of the improvement over the untrained model is above zero; failed when
    it did not learn and ``require``, or when mAP is below ``min_map``."""
    improvement = -np.asarray(drops)  # the drops are (untrained - trained) mAP per bootstrap sample
    lower = float(np.quantile(improvement, 1 - confidence)) if len(improvement) else 0.0
    learned = bool(trained["map"] > untrained["map"] and lower > 0)
    below = min_map is not None and trained["map"] < min_map
    line = (f"mAP@0.5:0.95 {pct(trained['map'])} (mAP@0.5 {pct(trained['map50'])}) on {samples} validation images "
            f"against {pct(untrained['map'])} untrained: {'learned' if learned else 'did not learn'} "
            f"(the improvement's {100 * confidence:.0f}% lower bound {pct(lower)})")
    if below:
        line += f"; below train.min_val_accuracy {pct(min_map)} (as mAP)"
    return DetectionLearning(samples, trained["map"], trained["map50"], untrained["map"], lower, confidence,
                             min_map, learned, bool((not learned and require) or below), line)


def pct(share: float) -> str:
    return f"{100 * share:.1f}%"


def learning_check(model: nn.Module, untrained: nn.Module, dataset, device, confidence: float,
                   min_map: float | None, require: bool, seed: int, resamples: int = 200) -> DetectionLearning:
    dets, labels, _ = predict(model, dataset, device)
    dets0, _, _ = predict(untrained, dataset, device)
    classes = model.postprocess.num_classes
    m1 = boxes.match_truth(list(dets), list(labels), classes)
    m0 = boxes.match_truth(list(dets0), list(labels), classes)
    # improvement = trained - untrained: bootstrap_map_drop(reference=untrained, candidate=trained) is its negative
    drops = boxes.bootstrap_map_drop(m0, m1, resamples, seed)
    return judge_learning(len(labels), boxes.map_of(m1), boxes.map_of(m0), drops, confidence, min_map, require)
