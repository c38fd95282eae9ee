"""The statistics of compare: prediction drift against a baseline and latency ratios with bootstrap intervals.

Predictions (per artifact, the same images): top-1 agreement with the baseline artifact, judged as verify judges
agreement (failed only when Wilson's upper bound is below ``compare.min_top1_agreement``); the accuracy change,
paired per image as verify's drop (failed only when its lower bound exceeds ``compare.max_accuracy_drop``);
per-class accuracy deltas (reported); and the logit drift: per image the largest change of its top-5 logit values
(sorted, so a swap of two classes with equal logits is no drift), in units of the baseline reference's logit
scale, as percentiles; failed when the ``compare.drift_quantile`` percentile exceeds ``compare.max_logit_drift``.

Latency (per benchmark row present in both): the ratio of the run's median to the baseline's, with a percentile
bootstrap confidence interval from the raw samples (both series resampled with replacement, NumPy's generator
seeded by ``compare.seed``, so the interval is reproducible). A row is a regression only when the whole interval
lies above ``compare.max_latency_ratio``: a noisy machine widens the interval instead of failing CI.
"""

from __future__ import annotations

import numpy as np

from pipeline.core.status import Status
from pipeline.precision import gate as criteria


def agreement(base_top1: np.ndarray, run_top1: np.ndarray, minimum: float, confidence: float) -> dict:
    agree = int(np.sum(base_top1 == run_top1))
    return criteria.agreement_check(agree, len(base_top1), minimum, criteria.z_value(confidence))


def accuracy_change(base_top1: np.ndarray, run_top1: np.ndarray, labels: np.ndarray, maximum: float,
                    confidence: float) -> dict:
    base_right, run_right = base_top1 == labels, run_top1 == labels
    lost, gained = int(np.sum(base_right & ~run_right)), int(np.sum(~base_right & run_right))
    result = criteria.accuracy_drop_check(lost, gained, len(labels), maximum, criteria.z_value(confidence))
    return {**result, "baseline_accuracy": float(base_right.mean()), "accuracy": float(run_right.mean()),
            "lost": lost, "gained": gained}


def logit_drift(base_logits: np.ndarray, run_logits: np.ndarray, scale: float) -> np.ndarray:
    """Per image, the largest change of its sorted top-k logit values, in units of ``scale``."""
    k = min(base_logits.shape[1], run_logits.shape[1])
    diff = np.abs(np.asarray(run_logits[:, :k], np.float64) - np.asarray(base_logits[:, :k], np.float64))
    diff = np.where(np.isfinite(diff), diff, np.inf)  # a NaN logit is the largest drift there is
    return diff.max(axis=1) / scale


def percentiles(values: np.ndarray) -> dict:
    if len(values) == 0:
        return {"p50": None, "p90": None, "p99": None, "max": None}
    p50, p90, p99 = np.percentile(values, [50, 90, 99])
    return {"p50": float(p50), "p90": float(p90), "p99": float(p99), "max": float(np.max(values))}


def drift_check(drift: np.ndarray, quantile: float, maximum: float) -> dict:
    value = float(np.quantile(drift, quantile)) if len(drift) else 0.0
    return {"status": Status.PASSED if value <= maximum else Status.FAILED, "value": value, "quantile": quantile,
            "threshold": maximum, **percentiles(drift)}


def bootstrap_median_ratio(base: np.ndarray, run: np.ndarray, *, resamples: int, confidence: float,
                           seed: int) -> tuple[float, float, float]:
    """median(run) / median(base), and its two-sided ``confidence`` percentile bootstrap interval."""
    base, run = np.asarray(base, np.float64), np.asarray(run, np.float64)
    rng = np.random.default_rng(seed)
    ratios = np.concatenate([_medians(rng, run, n) / np.maximum(_medians(rng, base, n), 1e-12)
                             for n in _chunks(resamples, max(len(base), len(run)))])
    tail = (1 - confidence) / 2
    low, high = np.quantile(ratios, [tail, 1 - tail])
    return float(np.median(run) / max(np.median(base), 1e-12)), float(low), float(high)


def _chunks(resamples: int, length: int, budget: int = 1 << 22) -> list[int]:
    """Resamples per step, so no step holds more than ``budget`` samples (32 MiB of float64)."""
    step = max(1, budget // max(length, 1))
    return [min(step, resamples - i) for i in range(0, resamples, step)]


def _medians(rng, values: np.ndarray, resamples: int) -> np.ndarray:
    return np.median(rng.choice(values, size=(resamples, len(values)), replace=True), axis=1)


def latency_check(base: list[float], run: list[float], *, max_ratio: float, resamples: int, confidence: float,
                  seed: int) -> dict:
    """One row: its ratio of medians and interval; failed only when the interval's lower end exceeds ``max_ratio``
    (a speed-up is never a failure)."""
    ratio, low, high = bootstrap_median_ratio(np.asarray(base), np.asarray(run), resamples=resamples,
                                              confidence=confidence, seed=seed)
    return {"status": Status.FAILED if low > max_ratio else Status.PASSED, "ratio": ratio, "ci_low": low, "ci_high": high,
            "threshold": max_ratio, "baseline_p50_ms": float(np.median(base)), "run_p50_ms": float(np.median(run)),
            "baseline_samples": len(base), "run_samples": len(run)}
