"""Boxes, NumPy only: IoU, COCO's mean average precision (with image weights, for the bootstrap), and matching one
model's detections with another's. Nothing here runs a model.

Detections are rows (x1, y1, x2, y2, score, class) per image, as a detector's ``detections`` output holds them
(rows with score <= 0 are empty); ground truth is rows (class, x1, y1, x2, y2), class -1 for padding.

:func:`coco_map` follows ``pycocotools.cocoeval.COCOeval`` for bounding boxes with the area range "all", no crowd
boxes and at most 100 detections per image: per class and IoU threshold (0.50:0.05:0.95), detections in descending
score order, each matched to the unmatched ground-truth box of the largest IoU at or over the threshold; precision
made monotone and read at 101 recall points; the mean over the classes that have ground truth and the thresholds.
A detection whose width times height is negative (x2 < x1 or y2 < y1, not both) is outside COCO's area range "all"
and ignored, as COCOeval ignores it; one of zero area is a false positive.
``tests/test_detection.py`` holds it equal to pycocotools on random sets. What it adds: the matching is computed
once per image, so :func:`bootstrap_map_drop` resamples images by weights without matching again.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

IOU_THRESHOLDS = np.linspace(0.5, 0.95, 10)
RECALL_POINTS = np.linspace(0.0, 1.0, 101)
MAX_DETS = 100


def iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of every box of ``a`` [K, 4] with every box of ``b`` [M, 4]: [K, M]; boxes as x1, y1, x2, y2."""
    a, b = np.asarray(a, np.float64).reshape(-1, 4), np.asarray(b, np.float64).reshape(-1, 4)
    lt = np.maximum(a[:, None, :2], b[None, :, :2])
    rb = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.clip(rb - lt, 0, None).prod(-1)
    area_a = np.clip(a[:, 2:] - a[:, :2], 0, None).prod(-1)
    area_b = np.clip(b[:, 2:] - b[:, :2], 0, None).prod(-1)
    union = area_a[:, None] + area_b[None, :] - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1), 0.0)


def valid_detections(dets: np.ndarray, min_score: float = 0.0) -> np.ndarray:
    """The rows of one image's detections that hold a box: finite, score over ``min_score`` (0: every non-empty
    row), the 100 best by score (COCO's maxDets), in descending score order (stable)."""
    d = np.asarray(dets, np.float64).reshape(-1, 6)
    d = d[np.isfinite(d).all(1) & (d[:, 4] > min_score)]
    return d[np.argsort(-d[:, 4], kind="mergesort")][:MAX_DETS]


def valid_truth(truth: np.ndarray) -> np.ndarray:
    t = np.asarray(truth, np.float64).reshape(-1, 5)
    return t[t[:, 0] >= 0]


@dataclass(frozen=True)
class Matching:
    """Every detection of a set of images, matched with the ground truth once: what AP needs, per image."""

    image: np.ndarray  # [D] the image of each detection
    label: np.ndarray  # [D] its class
    score: np.ndarray  # [D]
    tp: np.ndarray  # [T, D] bool: matched at IoU threshold t
    positives: np.ndarray  # [images, classes] ground-truth boxes
    classes: int


def match_truth(detections: list[np.ndarray], truths: list[np.ndarray], classes: int) -> Matching:
    """COCO's greedy matching of each image's detections with its ground truth, at every IoU threshold."""
    images, labels, scores, tps = [], [], [], []
    positives = np.zeros((len(truths), classes), np.int64)
    for i, (dets, truth) in enumerate(zip(detections, truths, strict=True)):
        d, t = valid_detections(dets), valid_truth(truth)
        d = d[(d[:, 2] - d[:, 0]) * (d[:, 3] - d[:, 1]) >= 0]  # COCO ignores a box whose w*h is negative
        for c in range(classes):
            positives[i, c] = int((t[:, 0] == c).sum())
        for c in np.unique(d[:, 5]).astype(int) if len(d) else []:
            dc, tc = d[d[:, 5] == c], t[t[:, 0] == c]
            overlaps = iou(dc[:, :4], tc[:, 1:5])
            tp = np.zeros((len(IOU_THRESHOLDS), len(dc)), bool)
            for ti, threshold in enumerate(IOU_THRESHOLDS):
                taken = np.zeros(len(tc), bool)
                for di in range(len(dc)):
                    best, best_iou = -1, min(threshold, 1 - 1e-10)
                    for gi in range(len(tc)):
                        if taken[gi] or overlaps[di, gi] < best_iou:
                            continue
                        best, best_iou = gi, overlaps[di, gi]
                    if best >= 0:
                        taken[best] = True
                        tp[ti, di] = True
            images.append(np.full(len(dc), i))
            labels.append(np.full(len(dc), c))
            scores.append(dc[:, 4])
            tps.append(tp)
    tp_all = np.concatenate(tps, axis=1) if tps else np.zeros((len(IOU_THRESHOLDS), 0), bool)
    return Matching(_cat(images, np.int64), _cat(labels, np.int64), _cat(scores, np.float64), tp_all, positives,
                    classes)


def _cat(parts: list[np.ndarray], dtype) -> np.ndarray:
    return np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype)


def average_precision(tp: np.ndarray, weights: np.ndarray, positives: float) -> float:
    """COCO's AP of detections already in descending score order: ``tp`` [D] bool, ``weights`` [D] (how many times
    each detection's image is in the sample); 101-point interpolated precision."""
    if positives <= 0:
        return float("nan")
    tp_sum = np.cumsum(weights * tp)
    fp_sum = np.cumsum(weights * ~tp)
    recall = tp_sum / positives
    precision = tp_sum / np.maximum(tp_sum + fp_sum, np.finfo(np.float64).eps)
    precision = np.maximum.accumulate(precision[::-1])[::-1] if len(precision) else precision
    index = np.searchsorted(recall, RECALL_POINTS, side="left")
    q = np.where(index < len(precision), precision[np.minimum(index, max(len(precision) - 1, 0))], 0.0) \
        if len(precision) else np.zeros(len(RECALL_POINTS))
    return float(q.mean())


def map_of(m: Matching, image_weights: np.ndarray | None = None) -> dict:
    """mAP@0.5:0.95 and mAP@0.5 of a matching, each image counted ``image_weights[i]`` times (None: once)."""
    w_img = np.ones(len(m.positives)) if image_weights is None else np.asarray(image_weights, np.float64)
    table = np.full((len(IOU_THRESHOLDS), m.classes), np.nan)
    order = np.lexsort((np.arange(len(m.score)), -m.score))  # descending score, stable (COCO's mergesort)
    label, weights, tp = m.label[order], w_img[m.image[order]], m.tp[:, order]
    positives = (m.positives * w_img[:, None]).sum(0)
    for c in range(m.classes):
        if positives[c] <= 0:
            continue
        mine = label == c
        for t in range(len(IOU_THRESHOLDS)):
            table[t, c] = average_precision(tp[t, mine], weights[mine], positives[c])
    valid = ~np.isnan(table)
    return {"map": float(table[valid].mean()) if valid.any() else 0.0,
            "map50": float(np.nanmean(table[0])) if valid[0].any() else 0.0}


def coco_map(detections: list[np.ndarray], truths: list[np.ndarray], classes: int) -> dict:
    return map_of(match_truth(detections, truths, classes))


# --------------------------------------------------------------------------- one model's boxes against another's


@dataclass(frozen=True)
class BoxAgreement:
    """Boxes of two models on the same images: matched pairs (same class, IoU at or over the threshold) and the
    boxes in all (matched pairs once, each unmatched box of either side once)."""

    matched: int
    boxes: int
    reference_boxes: int
    candidate_boxes: int

    @property
    def share(self) -> float:
        return self.matched / self.boxes if self.boxes else 1.0


def match_boxes(reference: np.ndarray, candidate: np.ndarray, match_iou: float, min_score: float) -> tuple[int, int,
                                                                                                            int]:
    """One image: (matched pairs, reference boxes, candidate boxes) among the boxes scored at least ``min_score``
    that have an area (a box without one matches nothing, not even itself: it is not counted);
    reference boxes in descending score order each take the unmatched candidate box of the same class with the
    largest IoU, at least ``match_iou``."""
    r = valid_detections(reference)
    c = valid_detections(candidate)
    r, c = r[(r[:, 4] >= min_score) & _has_area(r)], c[(c[:, 4] >= min_score) & _has_area(c)]
    overlaps = iou(r[:, :4], c[:, :4]) if len(r) and len(c) else np.zeros((len(r), len(c)))
    overlaps = np.where(r[:, 5:6] == c[None, :, 5], overlaps, -1.0) if len(r) and len(c) else overlaps
    taken = np.zeros(len(c), bool)
    matched = 0
    for i in range(len(r)):
        row = np.where(taken, -1.0, overlaps[i]) if len(c) else overlaps[i]
        j = int(np.argmax(row)) if len(row) else -1
        if j >= 0 and row[j] >= match_iou:
            taken[j] = True
            matched += 1
    return matched, len(r), len(c)


def _has_area(d: np.ndarray) -> np.ndarray:
    return (d[:, 2] > d[:, 0]) & (d[:, 3] > d[:, 1])


def agreement(reference: list[np.ndarray], candidate: list[np.ndarray], match_iou: float,
              min_score: float) -> BoxAgreement:
    counts = np.array([match_boxes(r, c, match_iou, min_score) for r, c in zip(reference, candidate, strict=True)]
                      or np.zeros((0, 3), np.int64)).reshape(-1, 3)
    matched, nr, nc = (int(v) for v in counts.sum(0))
    return BoxAgreement(matched, nr + nc - matched, nr, nc)


def bootstrap_map_drop(reference: Matching, candidate: Matching, resamples: int, seed: int) -> np.ndarray:
    """The mAP drop (reference minus candidate) on ``resamples`` bootstrap samples of the images, paired (the same
    images for both): the distribution :func:`pipeline.precision.detection_gate.map_drop_check` bounds."""
    n = len(reference.positives)
    rng = np.random.default_rng(seed)
    drops = np.empty(resamples)
    for b in range(resamples):
        weights = np.bincount(rng.integers(0, n, n), minlength=n).astype(np.float64)
        drops[b] = map_of(reference, weights)["map"] - map_of(candidate, weights)["map"]
    return drops
