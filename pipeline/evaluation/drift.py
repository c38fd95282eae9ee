"""compare's decisions, as pure functions of plain data (arrays, numbers, strings): no I/O, no model runs.

* **which images**: :func:`incompatibility` refuses a baseline of another model, class list or input size, or made
  on other images: another count, other names, other pixels under the same names (each image's sha256), or other
  labels. Such a pair is not drift; compare stops with exit 2.
* **which artifacts**: :func:`missing_reason` says why an artifact of the baseline cannot be compared here: no
  verdict in this run, a verdict for another file (the artifact changed or was removed since verify), a verdict
  that does not count as passed (:func:`pipeline.core.verdicts.counts_as_passed`, under the policy verify ran
  with), or no predictions. Such an artifact is ``missing``, and a missing artifact fails.
* **predictions** (:func:`compare_artifact`): top-1 agreement with the baseline artifact (Wilson's upper bound,
  as verify's gate), the paired accuracy change (its lower bound), and the logit drift: per image the largest
  absolute change of its sorted top-k logit values, in units of the baseline reference's logit scale, held at a
  quantile image. Failed beats inconclusive beats passed.
* **latency** (:func:`latency_row`): per benchmark row of the baseline (keyed by backend, batch size and timing kind;
  the label is display only), the ratio of medians (this run over the
  baseline) with a percentile bootstrap interval (both sample series resampled with replacement
  ``resamples`` times, the ratio of medians each time, NumPy's generator seeded, so the interval is reproducible).
  A row is a regression only when the whole interval lies above ``max_latency_ratio``: a noisy machine widens
  the interval instead of failing CI. A row timed in the baseline and not here is missing; a row with fewer
  than ``min_samples`` timed runs on either side is reported, not judged.
* **the gate** (:func:`gate_passed`): passed unless an artifact or a row failed or is missing.

Each decision returns its record of :mod:`pipeline.core.compare_result` (compare.json's parts).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from pipeline.core import verdicts
from pipeline.core.compare_result import (
    AccuracyChange,
    Agreement,
    ArtifactDrift,
    ClassChange,
    DriftCheck,
    Flip,
    LatencyCheck,
    LatencyComparison,
    Thresholds,
)
from pipeline.core.schema import printable
from pipeline.core.status import Status
from pipeline.core.timings import TimingKind
from pipeline.precision import gate as criteria

FAILING = frozenset({Status.FAILED, Status.MISSING})


@dataclass(frozen=True)
class ImageSet:
    """What a comparison is about: the model, its classes and input size, and per image its name, the sha256 of
    its pixels and its label."""

    model: str
    classes: tuple[str, ...]
    input_size: tuple[int, ...]
    names: np.ndarray
    digests: np.ndarray
    labels: np.ndarray


@dataclass(frozen=True)
class LatencySeries:
    """One benchmark row: its key (backend, batch size, timing kind), its label (display only) and its raw timed
    runs in milliseconds (each > 0)."""

    backend: str
    batch_size: int
    kind: TimingKind
    label: str | None
    samples_ms: np.ndarray

    @property
    def key(self) -> tuple:
        return self.backend, self.batch_size, self.kind


# --------------------------------------------------------------------------- which images


def _quoted(value) -> str:
    return printable(repr(value), 80)


def _short(items: Sequence) -> str:
    shown = [printable(i, 40) for i in items]
    return str(shown) if len(shown) <= 6 else f"[{', '.join(shown[:5])}, ... ({len(shown)} classes)]"


def incompatibility(baseline: ImageSet, run: ImageSet) -> str | None:
    """Why ``run`` cannot be compared with ``baseline`` (None: it can): another model, class list, input size, or
    other validation images (count, names, pixels or labels)."""
    if baseline.model != run.model:
        return f"the baseline is of model {_quoted(baseline.model)}, this run of {_quoted(run.model)}"
    if baseline.classes != run.classes:
        return f"the baseline's classes {_short(baseline.classes)} differ from this run's {_short(run.classes)}"
    if baseline.input_size != run.input_size:
        return (f"the baseline's input size {'x'.join(map(str, baseline.input_size))} differs from this run's "
                f"{'x'.join(map(str, run.input_size))}")
    return _other_images(baseline, run)


def _other_images(baseline: ImageSet, run: ImageSet) -> str | None:
    same = "compare needs the same validation data and verify.samples"
    if len(baseline.names) != len(run.names):
        return (f"the baseline was made on other validation images ({len(baseline.names)} images, this run verified "
                f"{len(run.names)}): {same}")
    named = np.flatnonzero(baseline.names != run.names)
    if named.size:
        return (f"the baseline was made on other validation images ({named.size} of {len(run.names)} names differ; "
                f"image {named[0]}: {_quoted(str(baseline.names[named[0]]))} there, "
                f"{_quoted(str(run.names[named[0]]))} here): {same}")
    pixels = np.flatnonzero(baseline.digests != run.digests)
    if pixels.size:
        return (f"the baseline was made on other validation images: {pixels.size} of {len(run.names)} images hold "
                f"other pixels under the same name (first: {_quoted(str(run.names[pixels[0]]))}; another data.seed, "
                f"other files or other preprocessing): {same}")
    labelled = np.flatnonzero(baseline.labels != run.labels)
    if labelled.size:
        i = labelled[0]
        return (f"the baseline labels {labelled.size} of {len(run.names)} images differently (first: "
                f"{_quoted(str(run.names[i]))}: {_class(baseline, i)} there, {_class(run, i)} here): not the "
                f"same validation set")
    return None


def _class(images: ImageSet, i: int) -> str:
    return _quoted(images.classes[int(images.labels[i])])


# --------------------------------------------------------------------------- which artifacts


def missing_reason(verdict: str | None, policy: verdicts.InconclusivePolicy, has_predictions: bool) -> str | None:
    """Why an artifact of the baseline has nothing to compare in this run; None when it has: a verdict of this
    run's verify for the file there now that counts as passed under ``policy``, and its predictions."""
    if verdict is None:
        return "this run's verify has no verdict for it (not a candidate here, or not run)"
    if verdict == Status.NOT_VERIFIED:
        return ("this run's verdict is about another file: the artifact (or the trained weights) changed or was "
                "removed since verify ran; re-run verify")
    if not verdicts.counts_as_passed(verdict, policy):
        return f"{verdict} in this run's verify (verify.inconclusive: {policy}): it does not pass the gate here"
    if not has_predictions:
        return "no predictions in this run's verify.predictions.npz"
    return None


# --------------------------------------------------------------------------- predictions


def agreement(base_top1: np.ndarray, run_top1: np.ndarray, minimum: float, confidence: float) -> Agreement:
    """Top-1 agreement with the baseline artifact on the same images: failed only when Wilson's upper bound is
    below ``minimum``."""
    agree = int(np.sum(base_top1 == run_top1))
    return Agreement(**criteria.agreement_check(agree, len(base_top1), minimum, criteria.z_value(confidence)).to_json())


def accuracy_change(base_top1: np.ndarray, run_top1: np.ndarray, labels: np.ndarray, maximum: float,
                    confidence: float) -> AccuracyChange:
    """The paired accuracy drop (lost: the baseline right and the run wrong; gained: the reverse)."""
    base_right, run_right = base_top1 == labels, run_top1 == labels
    lost, gained = int(np.sum(base_right & ~run_right)), int(np.sum(~base_right & run_right))
    result = criteria.accuracy_drop_check(lost, gained, len(labels), maximum, criteria.z_value(confidence)).to_json()
    return AccuracyChange(**result, baseline_accuracy=float(base_right.mean()), accuracy=float(run_right.mean()),
                          lost=lost, gained=gained)


def logit_drift(base_logits: np.ndarray, run_logits: np.ndarray, scale: float) -> np.ndarray:
    """Per image, the largest absolute change of its sorted top-k logit values, in units of ``scale`` (> 0); a
    NaN or infinite change is the largest drift there is."""
    if base_logits.shape != run_logits.shape:
        raise ValueError(f"top-k logits of shape {base_logits.shape} and {run_logits.shape}: not the same images")
    if not scale > 0:
        raise ValueError(f"logit scale {scale}: must be positive")
    diff = np.abs(np.asarray(run_logits, np.float64) - np.asarray(base_logits, np.float64))
    diff = np.where(np.isfinite(diff), diff, np.inf)
    return diff.max(axis=1) / scale


def drift_check(drift: np.ndarray, quantile: float, maximum: float) -> DriftCheck:
    """Failed when the ``quantile`` image's drift exceeds ``maximum`` (a NaN drift fails); with the drift's p50, p90,
    p99 and largest value."""
    value = float(np.quantile(drift, quantile))
    p50, p90, p99 = np.percentile(drift, [50, 90, 99])
    return DriftCheck(status=Status.PASSED if value <= maximum else Status.FAILED, value=value, quantile=quantile,
                      threshold=maximum, p50=float(p50), p90=float(p90), p99=float(p99), max=float(np.max(drift)))


def per_class_accuracy(top1: np.ndarray, labels: np.ndarray, classes: Sequence[str]) -> dict[str, float | None]:
    """Accuracy per class over the images of that class (None for a class without validation images)."""
    return {name: (float(np.mean(top1[labels == i] == i)) if np.any(labels == i) else None)
            for i, name in enumerate(classes)}


def per_class_changes(base_top1: np.ndarray, run_top1: np.ndarray, labels: np.ndarray,
                      classes: Sequence[str]) -> list[ClassChange]:
    """Per class with images, its accuracy in the baseline and here (the same labels: the same classes have
    images on both sides)."""
    before = per_class_accuracy(base_top1, labels, classes)
    after = per_class_accuracy(run_top1, labels, classes)
    return [ClassChange(class_=c, baseline=before[c], run=after[c], delta=after[c] - before[c])
            for c in classes if before[c] is not None]


def flips(base_top1: np.ndarray, run_top1: np.ndarray, labels: np.ndarray, names: np.ndarray,
          classes: Sequence[str]) -> list[Flip]:
    """Every image whose top-1 changed: its name, label, and both top-1 classes."""
    return [Flip(image=str(names[i]), label=classes[int(labels[i])], baseline=classes[int(base_top1[i])],
                 run=classes[int(run_top1[i])]) for i in np.flatnonzero(base_top1 != run_top1)]


def compare_artifact(base, run, labels: np.ndarray, names: np.ndarray, classes: Sequence[str], scale: float,
                     t: Thresholds) -> ArtifactDrift:
    """One artifact of the baseline against the same candidate of this run, on the same images: ``base`` and
    ``run`` are its top-5 (:class:`pipeline.evaluation.predictions.Top5`) on each side."""
    agreed = agreement(base.top1, run.top1, t.min_top1_agreement, t.confidence)
    accuracy = accuracy_change(base.top1, run.top1, labels, t.max_accuracy_drop, t.confidence)
    drifted = drift_check(logit_drift(base.logits, run.logits, scale), t.drift_quantile, t.max_logit_drift)
    return ArtifactDrift(status=verdicts.fold(c.status for c in (agreed, accuracy, drifted)), agreement=agreed,
                         accuracy=accuracy, drift=drifted, flipped=flips(base.top1, run.top1, labels, names, classes),
                         per_class=per_class_changes(base.top1, run.top1, labels, classes))


def failed_checks(result: ArtifactDrift) -> list[str]:
    """The checks of :func:`compare_artifact` that failed, in order (named as compare.json names them)."""
    checks = (("agreement", result.agreement), ("accuracy", result.accuracy), ("drift", result.drift))
    return [name for name, check in checks if check.status == Status.FAILED]


# --------------------------------------------------------------------------- latency


def bootstrap_median_ratio(base: np.ndarray, run: np.ndarray, *, resamples: int, confidence: float,
                           seed: int) -> tuple[float, float, float]:
    """median(run) / median(base), and its two-sided ``confidence`` percentile bootstrap interval."""
    base, run = np.asarray(base, np.float64), np.asarray(run, np.float64)
    if not (base.size and run.size and np.all(base > 0) and np.all(run > 0)):
        raise ValueError("latency samples must be positive, on both sides")
    rng = np.random.default_rng(seed)
    ratios = np.concatenate([_medians(rng, run, n) / _medians(rng, base, n)
                             for n in _chunks(resamples, max(len(base), len(run)))])
    tail = (1 - confidence) / 2
    low, high = np.quantile(ratios, [tail, 1 - tail])
    return float(np.median(run) / np.median(base)), float(low), float(high)


def _chunks(resamples: int, length: int, budget: int = 1 << 22) -> list[int]:
    """Resamples per step, so no step holds more than ``budget`` samples (32 MiB of float64)."""
    step = max(1, budget // length)
    return [min(step, resamples - i) for i in range(0, resamples, step)]


def _medians(rng, values: np.ndarray, resamples: int) -> np.ndarray:
    return np.median(rng.choice(values, size=(resamples, len(values)), replace=True), axis=1)


def latency_status(ci_low: float, max_ratio: float) -> Status:
    """A regression only when the whole interval lies above ``max_ratio``: its lower end is above it. A speed-up
    (an interval below 1) never fails."""
    return Status.FAILED if ci_low > max_ratio else Status.PASSED


def latency_check(base: np.ndarray, run: np.ndarray, *, max_ratio: float, resamples: int, confidence: float,
                  seed: int) -> LatencyCheck:
    """One row judged: its ratio of medians, its interval and :func:`latency_status`."""
    ratio, low, high = bootstrap_median_ratio(base, run, resamples=resamples, confidence=confidence, seed=seed)
    return LatencyCheck(status=latency_status(low, max_ratio), ratio=ratio, ci_low=low, ci_high=high,
                        threshold=max_ratio, baseline_p50_ms=float(np.median(base)), run_p50_ms=float(np.median(run)),
                        baseline_samples=len(base), run_samples=len(run))


def latency_row(base: LatencySeries, run: LatencySeries | None, t: Thresholds, seed: int) -> LatencyComparison:
    """One benchmark row of the baseline against the same row here: missing (not timed here), skipped (too few
    timed runs on a side to judge), or judged (:func:`latency_check`)."""
    def row(**facts) -> LatencyComparison:
        return LatencyComparison(backend=base.backend, batch_size=base.batch_size, timing=base.label,
                                 timing_kind=base.kind, **facts)

    unjudged = {"baseline_p50_ms": float(np.median(base.samples_ms)), "ratio": None, "ci_low": None, "ci_high": None}
    if run is None:
        return row(**unjudged, status=Status.MISSING, run_p50_ms=None,
                   reason="timed in the baseline, not in this run's benchmark.json (benchmark.backends or "
                          "batch_sizes changed, or the backend is not available here)")
    fewest = min(len(base.samples_ms), len(run.samples_ms))
    if fewest < t.min_samples:  # a median of a handful of runs says nothing about a regression
        return row(**unjudged, status=Status.SKIPPED, run_p50_ms=float(np.median(run.samples_ms)),
                   reason=f"{fewest} timed runs, fewer than compare.min_samples ({t.min_samples})")
    judged = latency_check(base.samples_ms, run.samples_ms, max_ratio=t.max_latency_ratio,
                           resamples=t.bootstrap_resamples, confidence=t.confidence, seed=seed)
    return row(**judged.model_dump())


def compare_latency(baseline: Sequence[LatencySeries], run: Sequence[LatencySeries],
                    t: Thresholds) -> list[LatencyComparison]:
    """Every row of the baseline, in its order, against the row of the same key here (row ``i`` is bootstrapped
    with seed ``t.seed + i``)."""
    here = {r.key: r for r in run}
    return [latency_row(b, here.get(b.key), t, t.seed + i) for i, b in enumerate(baseline)]


# --------------------------------------------------------------------------- the gate


def gate_passed(statuses: Iterable[str]) -> bool:
    """compare's verdict over every artifact and latency row: passed unless one failed or is missing (an
    inconclusive check and a row too short to judge do not fail it)."""
    return not any(status in FAILING for status in statuses)
