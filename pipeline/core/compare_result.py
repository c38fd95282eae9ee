"""compare.json as types: :class:`CompareResult`, with its parts: per artifact of the bundle an
:class:`ArtifactComparison` (missing, with why; or its :class:`Agreement`, :class:`AccuracyChange` and
:class:`DriftCheck`, the images whose top-1 :class:`Flip`-ped and each :class:`ClassChange`), per benchmark row of
the bundle a :class:`LatencyComparison` (keyed by backend, batch size and timing kind, as
:class:`pipeline.core.benchmark_rows.BenchmarkRow.key`), and every :class:`EnvChange`.

compare's decisions (:mod:`pipeline.evaluation.drift`) make them, :mod:`pipeline.compare` gathers them into one
:class:`CompareResult`, and :meth:`CompareResult.to_json` is the one serialiser of compare.json: the keys, values and
order of earlier releases (an artifact's checks only where it was compared, a row's interval facts only where it was
judged, a ``reason`` only where there is one). The report reads the file back through :func:`from_json` (a payload
already read) or :func:`read` (the file): typed and bounded here, once; compare.md, compare.junit.xml and the
report's section lay out the attributes (:mod:`pipeline.reports.compare_report`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import ConfigDict, Field, StringConstraints

from pipeline.core import schema
from pipeline.core.benchmark_rows import BatchSize, Kind
from pipeline.core.bundle_schema import MAX_ARTIFACTS, MAX_CLASSES, MAX_IMAGES, MAX_ROWS, BatchRow, Name
from pipeline.core.status import Status
from pipeline.core.verdicts import InconclusivePolicy

SCHEMA = "pipeline.compare/1"
Text = Annotated[str, StringConstraints(max_length=4096)]
Reason = Annotated[str, StringConstraints(max_length=1 << 16)]
Verdict = Annotated[Status, Field(strict=False)]  # its JSON string
Real = Annotated[float, Field(strict=False)]  # a drift may be infinite: the file holds it as "inf"
Count = Annotated[int, Field(ge=0)]


class Record(schema.Strict):
    """A part of compare.json: strict types, no other key, immutable."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True, populate_by_name=True)

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True)


class Thresholds(Record):
    """``compare.*`` (without the bundle's path), as compare judged with them."""

    min_top1_agreement: float
    max_accuracy_drop: float
    max_logit_drift: float
    drift_quantile: float
    max_latency_ratio: float
    min_samples: int
    confidence: float
    bootstrap_resamples: int
    seed: int


# --------------------------------------------------------------------------- an artifact's checks


class Agreement(Record):
    """Top-1 agreement with the baseline artifact (:func:`pipeline.precision.gate.agreement_check`)."""

    status: Verdict
    value: Real
    upper_bound: Real
    threshold: Real
    more_images: Count


class AccuracyChange(Record):
    """The paired accuracy drop (:func:`pipeline.precision.gate.accuracy_drop_check`), with both accuracies and the
    images lost and gained."""

    status: Verdict
    value: Real
    lower_bound: Real
    threshold: Real
    more_images: Count
    baseline_accuracy: Real
    accuracy: Real
    lost: Count
    gained: Count


class DriftCheck(Record):
    """The logit drift at the ``quantile`` image, and its percentiles."""

    status: Verdict
    value: Real
    quantile: Real
    threshold: Real
    p50: Real
    p90: Real
    p99: Real
    max: Real


class Flip(Record):
    """An image whose top-1 changed: its name, label and both top-1 classes."""

    image: Text
    label: Text
    baseline: Text
    run: Text


class ClassChange(Record):
    """One class's accuracy in the baseline and here."""

    class_: Text = Field(alias="class")
    baseline: Real
    run: Real
    delta: Real


CHECKS = ("agreement", "accuracy", "drift")  # an artifact's checks: written only where it was compared


class ArtifactDrift(Record):
    """One artifact of the bundle against the same candidate here (:func:`pipeline.evaluation.drift.compare_artifact`):
    its three checks folded, every flipped image, the per-class accuracy."""

    status: Verdict
    agreement: Agreement
    accuracy: AccuracyChange
    drift: DriftCheck
    flipped: Annotated[list[Flip], Field(max_length=MAX_IMAGES)]
    per_class: Annotated[list[ClassChange], Field(max_length=MAX_CLASSES)]


class ArtifactComparison(Record):
    """compare.json's entry for one artifact of the bundle: this run's verdict and batch rows, and either why it is
    missing or its checks (``reason``: why it failed, where it did)."""

    name: Name
    verdict: Verdict | None
    batch_sizes: Annotated[list[BatchRow], Field(max_length=64)] | None
    status: Verdict
    agreement: Agreement | None = None
    accuracy: AccuracyChange | None = None
    drift: DriftCheck | None = None
    flipped: Annotated[list[Flip], Field(max_length=MAX_IMAGES)] | None = None
    per_class: Annotated[list[ClassChange], Field(max_length=MAX_CLASSES)] | None = None
    reason: Reason | None = None

    @classmethod
    def missing(cls, name: str, verdict: str | None, batch_sizes: list[BatchRow] | None,
                reason: str) -> ArtifactComparison:
        return cls(name=name, verdict=verdict, batch_sizes=batch_sizes, status=Status.MISSING, reason=reason)

    @classmethod
    def compared(cls, name: str, verdict: str | None, batch_sizes: list[BatchRow] | None, result: ArtifactDrift,
                 reason: str | None) -> ArtifactComparison:
        return cls(name=name, verdict=verdict, batch_sizes=batch_sizes, status=result.status,
                   agreement=result.agreement, accuracy=result.accuracy, drift=result.drift, flipped=result.flipped,
                   per_class=result.per_class, reason=reason)

    def to_json(self) -> dict[str, Any]:
        """The entry as compare.json holds it: the checks only where it was compared, a reason only where given."""
        return self.model_dump(by_alias=True, exclude={k for k in (*CHECKS, "flipped", "per_class", "reason")
                                                       if getattr(self, k) is None})


# --------------------------------------------------------------------------- a latency row


class LatencyCheck(Record):
    """One row judged (:func:`pipeline.evaluation.drift.latency_check`): its ratio of medians and interval."""

    status: Verdict
    ratio: Real
    ci_low: Real
    ci_high: Real
    threshold: Real
    baseline_p50_ms: Real
    run_p50_ms: Real
    baseline_samples: Count
    run_samples: Count


JUDGED_ONLY = ("threshold", "baseline_samples", "run_samples")


class LatencyComparison(Record):
    """compare.json's entry for one benchmark row of the bundle, keyed by backend, batch size and timing kind (the
    label is display only): missing, skipped (too few runs) or judged; ``reason`` where it is not passed."""

    backend: Name
    batch_size: BatchSize
    timing: Text | None
    timing_kind: Kind
    baseline_p50_ms: Real
    ratio: Real | None
    ci_low: Real | None
    ci_high: Real | None
    status: Verdict
    threshold: Real | None = None
    run_p50_ms: Real | None
    baseline_samples: Count | None = None
    run_samples: Count | None = None
    reason: Reason | None = None

    def with_reason(self, reason: str) -> LatencyComparison:
        return self.model_copy(update={"reason": reason})

    def to_json(self) -> dict[str, Any]:
        """The row as compare.json holds it: the interval facts only where judged, a reason only where given."""
        return self.model_dump(exclude={k for k in (*JUDGED_ONLY, "reason") if getattr(self, k) is None})


# --------------------------------------------------------------------------- the whole comparison


class EnvChange(Record):
    """One environment fact that changed: its name, and its value in the baseline and here."""

    what: Text
    baseline: Text | None
    run: Text | None


class BaselineRef(Record):
    """The bundle compared with."""

    path: Text
    created: Text | None
    run_dir: Text | None
    schema_: Text = Field(alias="schema")


class CompareResult(Record):
    """compare.json: the bundle, the thresholds and policy judged with, every artifact and row, the environment's
    changes and the gate's verdict."""

    schema_: Text = Field(alias="schema")
    created: Text
    model: Text
    baseline: BaselineRef
    thresholds: Thresholds
    inconclusive_policy: InconclusivePolicy  # verify.inconclusive, as verify ran with it
    images: Count
    environment: Annotated[list[EnvChange], Field(max_length=64)]
    environment_summary: Reason
    artifacts: Annotated[list[ArtifactComparison], Field(max_length=MAX_ARTIFACTS)]
    latency: Annotated[list[LatencyComparison], Field(max_length=MAX_ROWS)]
    passed: bool

    def to_json(self) -> dict[str, Any]:
        """compare.json's payload: the one serialiser of the file (NaN and infinities are written as strings by
        :func:`pipeline.reports.verify_report.write_reports`)."""
        return {**self.model_dump(by_alias=True),  # the entries in their places, by their own serialisers
                "artifacts": [a.to_json() for a in self.artifacts], "latency": [r.to_json() for r in self.latency]}


def from_json(payload: Any, where: str | Path = "compare.json") -> CompareResult:
    """The typed comparison of a compare payload already read (the report's, through the bounded reader)."""
    return schema.validate(payload, CompareResult, where, "compare report")


def read(path: str | Path) -> CompareResult:
    """compare.json at ``path``, typed and bounded (one :class:`~pipeline.core.errors.InputError` when damaged)."""
    return schema.read_json(path, CompareResult, "compare report")
