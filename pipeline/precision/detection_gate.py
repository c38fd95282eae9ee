"""The gate's task check for a detector (docs/detection.md): pure decisions over boxes the caller has.

* **Tensor check**: the same as a classifier's (:func:`pipeline.precision.gate.scaled_check`), on the raw head
  (heatmap logits, log sizes, offsets) before decode and NMS, which make the final outputs discontinuous.
* **Matched boxes** (the analogue of top-1 agreement): per image, the candidate's boxes scored at least
  ``verify.detection.min_score`` matched with the reference's (same class, IoU >= ``match_iou``); the share of
  matched pairs among all boxes of either side, Wilson's bound at ``verify.confidence`` (:func:`gate.agreement_check`):
  *failed* only when the upper bound is below ``min_matched_share``.
* **mAP@0.5:0.95 drop** against the ground truth (COCO's mAP, :mod:`pipeline.core.boxes`, equal to pycocotools'):
  the reference's minus the candidate's, with a paired bootstrap over the images: *failed* only when the bound at
  ``verify.confidence`` (the lower quantile of the resampled drops) exceeds ``max_map_drop``.

A check that is over its threshold but cannot show it is *inconclusive*, as for a classifier.
"""

from __future__ import annotations

import numpy as np

from pipeline.core import boxes
from pipeline.core.check_results import Bound, Judgement, TaskCheck
from pipeline.core.status import Status
from pipeline.precision import gate

PASSED, FAILED, INCONCLUSIVE = Status.PASSED, Status.FAILED, Status.INCONCLUSIVE


def map_drop_check(drop: float, resampled: np.ndarray, maximum: float, confidence: float) -> Bound:
    """The mAP drop ``drop`` against ``maximum``: passed when within it, failed when the bootstrap's lower bound
    (the ``1 - confidence`` quantile of ``resampled``) exceeds it, else inconclusive."""
    finite = np.asarray(resampled, np.float64)
    finite = finite[np.isfinite(finite)]
    lower = float(np.quantile(finite, 1 - confidence)) if finite.size else -np.inf
    if not np.isfinite(drop):
        status = FAILED
    elif drop <= maximum:
        status = PASSED
    elif lower > maximum:
        status = FAILED
    else:
        status = INCONCLUSIVE
    return Bound(status=status, value=float(drop), lower_bound=lower, threshold=maximum, resamples=int(finite.size),
                 more_images=0 if status != INCONCLUSIVE else None)


def matched_check(agreement: boxes.BoxAgreement, minimum: float, confidence: float) -> Bound:
    """The share of matched boxes, Wilson-bounded: the top-1 agreement rule over boxes."""
    return gate.agreement_check(agreement.matched, agreement.boxes, minimum, gate.z_value(confidence))


def task_check(ref_dets: list[np.ndarray], cand_dets: list[np.ndarray], truths: list[np.ndarray], classes: int,
               rules: dict, confidence: float, seed: int = 0) -> TaskCheck:
    """Matched boxes and mAP drop of one candidate; failed when either fails, inconclusive when one cannot
    decide, else passed. ``rules``: verify.detection (match_iou, min_score, min_matched_share, max_map_drop,
    bootstrap)."""
    agree = boxes.agreement(ref_dets, cand_dets, rules["match_iou"], rules["min_score"])
    matched = matched_check(agree, rules["min_matched_share"], confidence)
    ref_m = boxes.match_truth(ref_dets, truths, classes)
    cand_m = boxes.match_truth(cand_dets, truths, classes)
    ref_map, cand_map = boxes.map_of(ref_m), boxes.map_of(cand_m)
    drops = boxes.bootstrap_map_drop(ref_m, cand_m, rules["bootstrap"], seed)
    drop = map_drop_check(ref_map["map"] - cand_map["map"], drops, rules["max_map_drop"], confidence)
    statuses = {matched.status, drop.status}
    status = FAILED if FAILED in statuses else INCONCLUSIVE if INCONCLUSIVE in statuses else PASSED
    return TaskCheck(status=status, passed=status == PASSED, task="detection", samples=len(truths),
                     confidence=confidence, matched_share=agree.share, matched_boxes=agree.matched, boxes=agree.boxes,
                     reference_boxes=agree.reference_boxes, candidate_boxes=agree.candidate_boxes,
                     reference_map=ref_map["map"], map=cand_map["map"], reference_map50=ref_map["map50"],
                     map50=cand_map["map50"], map_drop=drop.value, match_iou=rules["match_iou"],
                     min_score=rules["min_score"], agreement=matched, drop=drop,
                     # the classifier's names, for the tables every task shares (their headers say boxes and mAP)
                     top1_agreement=agree.share, accuracy=cand_map["map"], reference_accuracy=ref_map["map"],
                     accuracy_drop=drop.value, more_images=0 if status != INCONCLUSIVE else None)


def judge(outputs: list[dict], reference: list[dict], labels: np.ndarray, gate_rules: dict, output_name: str,
          detections_name: str, classes: int, rules: dict, confidence: float) -> Judgement:
    """Both checks of one detector candidate: the tensor check on ``output_name`` (the raw head), the task check on
    ``detections_name``; the status rule of :func:`pipeline.precision.gate.judge`."""
    cand = np.concatenate([o[output_name] for o in outputs]).astype(np.float64)
    ref = np.concatenate([r[output_name] for r in reference]).astype(np.float64)
    tensor = gate.tensor_check(outputs, reference, ref, cand, gate_rules, output_name)
    ref_dets = list(np.concatenate([r[detections_name] for r in reference]))
    cand_dets = list(np.concatenate([o[detections_name] for o in outputs]))
    task = task_check(ref_dets, cand_dets, list(labels), classes, rules, confidence)
    return Judgement(tensor, task, FAILED if not tensor.passed or task.status == FAILED else task.status)
