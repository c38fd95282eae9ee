"""The task plug: what a model does decides four things, everything else (AMP training, export, the precision plugs,
build, conformance, benchmark, deploy) works the same for every task.

=================  ===========================================  ==============================================
                   classification                               detection
=================  ===========================================  ==============================================
data format        class index per image                        boxes per image (pipeline.core.detection_data)
model outputs      ``logits`` [batch, classes]                  ``head`` (raw, gated by the tensor check) and
                                                                ``detections`` [batch, max_detections, 6]
training loss      cross-entropy; learning check: accuracy      CenterNet loss; learning check: mAP against an
                   against chance                               untrained model's (pipeline.training.detection)
gate task check    top-1 agreement, accuracy drop               matched boxes, mAP drop
                                                                (pipeline.precision.detection_gate)
=================  ===========================================  ==============================================

The model card's spec names the task (a classifier's card has no ``task`` key: it is the default).
"""

from __future__ import annotations

from dataclasses import dataclass

CLASSIFICATION, DETECTION = "classification", "detection"
DETECTIONS = "detections"  # a detector's second output: rows (x1, y1, x2, y2, score, class)


@dataclass(frozen=True)
class Task:
    name: str
    extra_outputs: tuple[str, ...]  # graph outputs besides the gated one (spec.output_name)
    quality: str  # what train's "val acc" is for this task
    unit: str  # what the task check counts

    def outputs(self, spec: dict) -> list[str]:
        return [spec["output_name"], *self.extra_outputs]


TASKS = {CLASSIFICATION: Task(CLASSIFICATION, (), "accuracy", "top-1"),
         DETECTION: Task(DETECTION, (DETECTIONS,), "mAP@0.5:0.95", "boxes")}


def of(spec) -> Task:
    """The task of a model card's spec (a dict) or a ``ModelSpec``; an unknown name is the card's problem."""
    name = spec.get("task", CLASSIFICATION) if isinstance(spec, dict) else getattr(spec, "task", CLASSIFICATION)
    return TASKS[name]


def output_problem(task: Task, out, batch: int, num_classes: int) -> str | None:
    """What is wrong with a model's eval-mode output for a batch of ``batch`` images, or None."""
    if task.name == CLASSIFICATION:
        if isinstance(out, tuple) or not hasattr(out, "shape") or tuple(out.shape) != (batch, num_classes):
            return "shape"
        return None
    if not (isinstance(out, tuple) and len(out) == 2 and all(hasattr(o, "shape") for o in out)):
        return f"a detector returns (head, detections) in eval mode, not {type(out).__name__}"
    head, dets = out
    if head.shape[0] != batch or head.ndim != 4 or head.shape[1] != num_classes + 4:
        return f"its head is {tuple(head.shape)}, not [{batch}, {num_classes} + 4, height, width]"
    if dets.ndim != 3 or dets.shape[0] != batch or dets.shape[2] != 6:
        return f"its detections are {tuple(dets.shape)}, not [{batch}, max_detections, 6]"
    return None
