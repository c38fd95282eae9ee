"""A candidate's own numbers as types: the gate's :class:`TensorCheck` and :class:`TaskCheck` (its two criteria, each
task criterion a :class:`Bound`) and :class:`Judgement` (both, and the status they fold to); the candidate at each
batch size it serves (:class:`BatchSizeRow`, :mod:`pipeline.evaluation.batching`) and its :class:`Conformance` (row
independence, :class:`RowsCheck`; the precision its matrix layers ran in, :class:`ClaimCheck`:
:mod:`pipeline.evaluation.conformance`).

The gate makes them where it measures (:func:`pipeline.precision.gate.judge`,
:func:`pipeline.precision.detection_gate.judge`); verify carries them on each candidate's result and writes them into
verify.json's row through :meth:`TensorCheck.to_json` / :meth:`TaskCheck.to_json`, the one serialiser of each: the
keys of earlier releases, in their order (a scaled and an absolute tensor check, a classifier's and a detector's task
check each keep their own). verify.json is read back through :mod:`pipeline.core.verify_rows`, whose rows hold these
same types, typed and bounded once; the reports lay them out by attribute.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import Field

from pipeline.core import schema
from pipeline.core.status import Status

NonFinite = Literal["inf", "-inf", "nan"]  # a non-finite number as verify.json writes it (verify_rows.clean)
Number = int | float | NonFinite


def _moved(out: dict[str, Any], keys: tuple[str, ...], after: str) -> dict[str, Any]:
    """``out`` with ``keys`` (those it has) moved to follow ``after``, in that order; the rest as they were."""
    moved = {k: out[k] for k in keys if k in out}
    rest = [(k, v) for k, v in out.items() if k not in moved]
    cut = next((i + 1 for i, (k, _) in enumerate(rest) if k == after), len(rest))
    return {**dict(rest[:cut]), **moved, **dict(rest[cut:])}


class Measured(schema.Open):
    """A check's record: written with the keys it was made with (an absent key is one it never had)."""

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(exclude_unset=True)


class Bound(Measured):
    """One task criterion decided by a one-sided confidence bound (:func:`pipeline.precision.gate.agreement_check`:
    an ``upper_bound``; the drops: a ``lower_bound``, a detector's with its bootstrap's ``resamples``)."""

    status: str = Field(max_length=40)
    value: Number
    upper_bound: Number | None = None
    lower_bound: Number | None = None
    threshold: Number
    resamples: int | None = None
    more_images: int | None = None  # images still needed to decide (None: no practical number)


class TensorCheck(Measured):
    """The tensor check of one output over every image (:func:`pipeline.precision.gate.scaled_check`, or
    :func:`~pipeline.precision.gate.absolute_check`: Polygraphy's atol AND rtol per batch), with the error statistics
    of every element. Only the keys it was made with are written."""

    passed: bool
    criterion: str = Field(max_length=40)
    statistic: str = Field(max_length=200)
    mismatch_fraction: Number | None = None
    scale: Number | None = None  # scaled: the reference's logit scale
    scaled_error: Number | None = None  # the worst image's
    scaled_error_quantile: Number | None = None  # the statistic held to the threshold
    error_quantile: Number | None = None
    threshold: Number | None = None
    images_over: int | None = None
    worst_image: int | None = None
    nonfinite: int | None = None
    max_prob_error: Number | None = None
    mean_kl: Number | None = None
    batches: int | None = None
    failed_batches: list[int] | None = None  # absolute: the batches over tolerance
    max_abs_error: Number | None = None
    mean_abs_error: Number | None = None
    median_abs_error: Number | None = None
    quantile_abs_error: Number | None = None
    max_rel_error: Number | None = None
    mean_rel_error: Number | None = None
    median_rel_error: Number | None = None
    quantile_rel_error: Number | None = None

    def to_json(self) -> dict[str, Any]:
        """The check as verify.json holds it; an absolute check with its batches before its mismatch share."""
        out = self.model_dump(exclude_unset=True)
        if self.criterion == "absolute":
            return _moved(out, ("batches", "failed_batches", "nonfinite"), after="statistic")
        return out


# A detector's task check writes its own numbers first, then (after its bounds) the classifier's names of them.
SHARED_NAMES = ("top1_agreement", "accuracy", "reference_accuracy", "accuracy_drop")


class TaskCheck(Measured):
    """The task check: top-1 agreement with the reference and the accuracy drop against the labels, each a
    :class:`Bound` (:func:`pipeline.precision.gate.task_check`); a detector's (``task: detection``,
    :func:`pipeline.precision.detection_gate.task_check`) matched boxes and mAP drop, with the classifier's names
    of the same numbers for the tables every task shares."""

    status: str = Field(max_length=40)
    passed: bool
    task: str | None = Field(default=None, max_length=40)  # None: a classifier
    samples: int
    confidence: Number
    top1_agreement: Number | None = None  # a detector's: its matched share
    reference_accuracy: Number | None = None  # a detector's: the reference's mAP@0.5:0.95
    accuracy: Number | None = None  # a detector's: its mAP@0.5:0.95
    accuracy_drop: Number | None = None
    disagreements: int | None = None
    near_ties: int | None = None
    tie_margin: Number | None = None
    matched_share: Number | None = None
    matched_boxes: int | None = None
    boxes: int | None = None
    reference_boxes: int | None = None
    candidate_boxes: int | None = None
    reference_map: Number | None = None
    map: Number | None = None
    reference_map50: Number | None = None
    map50: Number | None = None
    map_drop: Number | None = None
    match_iou: Number | None = None
    min_score: Number | None = None
    agreement: Bound
    drop: Bound
    more_images: int | None = None

    @property
    def detection(self) -> bool:
        return self.task == "detection"

    @property
    def decided(self) -> int:
        """The images agreement was counted over: those that are not near-ties."""
        return self.samples - (self.near_ties or 0)

    def to_json(self) -> dict[str, Any]:
        """The check as verify.json holds it (a detector's in its own order)."""
        out = {**self.model_dump(exclude_unset=True), "agreement": self.agreement.to_json(),
               "drop": self.drop.to_json()}
        return _moved(out, SHARED_NAMES, after="drop") if self.detection else out


@dataclass(frozen=True)
class Judgement:
    """Both checks of one candidate (:func:`pipeline.precision.gate.judge`): failed when either fails, inconclusive
    when the tensor check passes and the task check cannot decide, else passed."""

    tensor_check: TensorCheck
    task_check: TaskCheck
    status: str

    @property
    def passed(self) -> bool:
        return self.status == Status.PASSED


class BatchSizeRow(Measured):
    """The candidate at one batch size it serves (:func:`pipeline.evaluation.batching.candidate_rows`): judged there
    (``images``, its numbers), the main check's row, or why it did not run there; a candidate's only row without a
    ``batch_size`` says why none was checked (after a fallback, a runner that died)."""

    batch_size: int | None = None
    profile: list[str] | None = None  # the build keys that name it (build.min_batch, ...)
    status: str = Field(max_length=40)
    reason: str | None = None
    images: int | None = None
    batches: int | None = None
    max_abs_error: Number | None = None
    scaled_error: Number | None = None
    top1_agreement: Number | None = None  # None: a detector's (its head's tensor check only)
    tensor_passed: bool | None = None
    task_status: str | None = Field(default=None, max_length=40)

    @property
    def judged(self) -> bool:
        """Judged at this batch size (else it did not run there, or it is the main check's row)."""
        return self.images is not None


class Arrangement(Measured):
    """The worst row of one arrangement (:class:`pipeline.evaluation.conformance.RowFinding`)."""

    arrangement: str = Field(max_length=40)
    batch_size: int
    slot: int
    image: int
    deviation: Number  # max |row - base| over the base row's largest |logit|; inf for a non-finite row


class RowsCheck(Measured):
    """Row independence (:func:`pipeline.evaluation.conformance.row_result`): each arrangement's worst row against the
    base, or why it could not run (``status`` error and ``reason``)."""

    status: str = Field(max_length=40)
    base: str | None = None
    tolerance: Number | None = None
    arrangements: list[Arrangement] | None = None
    skipped: dict[str, str] | None = None  # why an arrangement did not run
    reason: str | None = None

    @property
    def worst(self) -> Arrangement | None:
        """The arrangement with the largest deviation (a non-finite one counts as the largest)."""
        return max(self.arrangements or [], key=lambda a: float(a.deviation), default=None)


class ClaimCheck(Measured):
    """The precision manifest (:func:`pipeline.evaluation.conformance.precision_result`): the runtime's account of the
    precision each matrix layer ran in, as shares, and the verdict on the candidate's claim."""

    status: str = Field(max_length=40)
    claimed: str | None = None
    source: str | None = None  # "runtime", or "graph, emulated"
    matrix_layers: int | None = None
    shares: dict[str, Number] | None = None
    graph_share: Number | None = None
    required: Number | None = None
    layers: list[dict[str, Any]] | None = None  # pipeline.runtime.profiling.layer_account.Layer records
    reason: str | None = None


class Conformance(Measured):
    """A candidate's conformance section: its :class:`RowsCheck` and :class:`ClaimCheck`, or (``status`` skipped)
    why it was not checked."""

    status: str | None = Field(default=None, max_length=40)
    reason: str | None = None
    rows: RowsCheck | None = None
    precision: ClaimCheck | None = None

    @property
    def failing(self) -> list[str]:
        """The reasons of the parts that failed."""
        return [part.reason or "" for part in (self.rows, self.precision)
                if part is not None and part.status == Status.FAILED]


class CandidateResult(schema.Open):
    """What verify found of one candidate (:func:`pipeline.evaluation.candidates.check`): its status and why, the
    gate's checks and thresholds, how it ran (a child's log, a runtime workaround), and the checks after it (batch
    sizes, conformance). A later finding replaces it with a copy (``model_copy(update=...)``); verify.json's row is
    made from it (:meth:`pipeline.core.verify_rows.CandidateRow.of`)."""

    status: str = Field(default="", max_length=40)  # "": not run yet
    passed: bool | None = None
    reason: str | None = None
    hint: str | None = None  # what to do about a failure no fallback can fix
    tolerance: dict[str, Any] | None = None  # the thresholds it was judged by (candidates.gate_for)
    tensor_check: TensorCheck | None = None
    task_check: TaskCheck | None = None
    after_fallback: bool = False  # the replacement graph's result (or an artifact of the replaced one: skipped)
    log: str | None = None  # its child process's log
    log_tail: list[str] | None = None  # a crashed child's last lines
    workaround: str | None = None  # a runtime workaround applied
    batch_sizes: list[BatchSizeRow] | None = None
    conformance: Conformance | None = None


class NodeError(Measured):
    """One node's first float output, FP32 against the candidate
    (:func:`pipeline.runtime.profiling.localize.compare_layers`):
    the tensor's error statistics (:meth:`pipeline.precision.gate.TensorRule.errors`) and whether it is over the
    localisation's rule (``exceeds``)."""

    name: str = Field(max_length=1000)
    op_type: str | None = Field(default=None, max_length=200)
    tensor: str | None = Field(default=None, max_length=1000)
    max_abs_error: Number | None = None
    mean_abs_error: Number | None = None
    median_abs_error: Number | None = None
    quantile_abs_error: Number | None = None
    max_rel_error: Number | None = None
    mean_rel_error: Number | None = None
    median_rel_error: Number | None = None
    quantile_rel_error: Number | None = None
    scaled_error: Number | None = None
    nonfinite: int | None = None
    fp32_min: Number | None = None
    fp32_max: Number | None = None
    mismatch_fraction: Number | None = None
    exceeds: bool = False


class Localization(Measured):
    """Where a failing candidate's error starts (:mod:`pipeline.runtime.profiling.localize`): the first node over the
    rule (None:
    none alone is; the error builds up across layers), the worst nodes, how many were compared, the rule and how the
    candidate ran. verify.json holds it per precision (``localization``, ``<precision>_localization``)."""

    first_divergent: NodeError | None = None
    worst: Annotated[list[NodeError], Field(max_length=100_000)] = []
    compared_nodes: int | None = None
    tolerance: dict[str, Any] | None = None
    method: str | None = Field(default=None, max_length=1000)
    candidate: str | None = Field(default=None, max_length=200)  # the failing candidate it localises

    def with_method(self, method: str) -> Localization:
        return self.model_copy(update={"method": method})
