"""When one benchmark row has been timed enough: the stop rule of the adaptive method (docs/benchmark.md).

A row (one backend, batch size and timing) is timed run after run until its median is known to
``±target_halfwidth`` with 95 % confidence, or until its time cap; never on fewer than a floor of runs.
Everything here is a pure function of plain numbers: the timing loop (:func:`pipeline.runtime.runners.measure`)
asks :func:`decide` at the checkpoints :func:`next_check` gives.

**The interval of the median** is the distribution-free order-statistic interval: for ``n`` runs sorted,
``[x_(l), x_(n+1-l)]`` covers the true median with probability ``1 - 2 P(B <= l - 1)``, B ~ Binomial(n, 1/2),
whatever the distribution, as long as the runs are independent draws from one distribution. It is chosen over a
bootstrap because latency series are skewed and heavy-tailed (a preempted run costs ten times a normal one), where
no normal or percentile approximation is trustworthy at small ``n``; because its coverage is a binomial sum, not an
approximation, so the rule's boundaries can be pinned by tests; because it needs no random numbers (the same runs
always give the same decision); and because it costs one sort, not thousands of resamples at every checkpoint.
Its price: an interval only exists from 6 runs on at 95 % (``2 * 0.5**6 <= 0.05``), and its coverage is at least,
not exactly, 95 %.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Sequence

import numpy as np

CONFIDENCE = 0.95

# Why timing stopped or goes on; "trials done": the fixed method's trials (it has no stop rule).
Reason = Literal["converged", "time cap", "below the floor of runs", "too few runs for an interval",
                 "interval too wide", "trials done"]


@dataclass(frozen=True)
class StopRule:
    """The adaptive method's settings for one row (``benchmark.min_runs``, ``target_halfwidth``, ``max_row_s``)."""

    min_runs: int  # the floor: no row stops on fewer timed runs, whatever its interval or its time
    target_halfwidth: float  # converged when the interval lies within median x (1 ± this)
    max_s: float  # the time cap: timed seconds after which a row stops unconverged (once past the floor)
    confidence: float = CONFIDENCE


@dataclass(frozen=True)
class MedianInterval:
    """The median of a series and its order-statistic interval (``coverage``: the exact binomial coverage)."""

    median: float
    low: float
    high: float
    coverage: float

    @property
    def relative_halfwidth(self) -> float:
        """The larger side of the interval over the median: "within ±5 %" means at most 0.05. A zero median is
        converged only with an interval of zero width."""
        spread = max(self.median - self.low, self.high - self.median)
        if self.median > 0:
            return spread / self.median
        return 0.0 if spread == 0 else math.inf


@dataclass(frozen=True)
class Decision:
    stop: bool
    reason: Reason
    runs: int
    interval: MedianInterval | None  # None below the floor, or with too few runs for an interval at this confidence


def median_ranks(n: int, confidence: float = CONFIDENCE) -> tuple[int, int, float] | None:
    """``(i, n - 1 - i, coverage)``: 0-based indices into ``n`` sorted runs of the narrowest symmetric
    order-statistic interval whose coverage ``1 - 2 P(B <= i)`` is at least ``confidence``, and that coverage; None
    when even the whole range covers less (too few runs).

    The binomial tail is summed in floating point from log-probabilities (exact integers cost seconds at 5,000
    runs); tests/test_stop_rules.py checks it against exact integer arithmetic."""
    k = np.arange(n // 2 + 1)  # P(B <= k) for k up to the middle: past it the tail exceeds one half
    log_choose = np.concatenate(([0.0], np.cumsum(np.log(n - k[:-1]) - np.log(k[:-1] + 1))))
    tails = np.cumsum(np.exp(log_choose - n * math.log(2)))
    allowed = int(np.searchsorted(tails, (1 - confidence) / 2, side="right"))  # tails[k] <= alpha/2 for k < allowed
    if allowed == 0:
        return None
    return allowed - 1, n - allowed, float(1 - 2 * tails[allowed - 1])


def median_interval(samples: Sequence[float], confidence: float = CONFIDENCE) -> MedianInterval | None:
    """The median and its interval at ``confidence``; None with too few runs for one."""
    ranks = median_ranks(len(samples), confidence)
    if ranks is None:
        return None
    ordered = sorted(samples)
    n, mid = len(ordered), len(ordered) // 2
    median = ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2
    low, high, covered = ranks
    return MedianInterval(median, ordered[low], ordered[high], covered)


def decide(samples: Sequence[float], elapsed_s: float, rule: StopRule) -> Decision:
    """Whether to stop timing a row after ``samples`` (ms) in ``elapsed_s`` timed seconds, and why.

    Below the floor of runs: go on, whatever the time. Then stop when the interval is within the target
    (converged; exactly at the target counts) or when the time cap is reached (exactly at it counts); else go on."""
    runs = len(samples)
    if runs < rule.min_runs:
        return Decision(False, "below the floor of runs", runs, None)
    interval = median_interval(samples, rule.confidence)
    if interval is not None and interval.relative_halfwidth <= rule.target_halfwidth:
        return Decision(True, "converged", runs, interval)
    if elapsed_s >= rule.max_s:
        return Decision(True, "time cap", runs, interval)
    return Decision(False, "interval too wide" if interval is not None else "too few runs for an interval", runs,
                    interval)


def next_check(runs: int) -> int:
    """The run count at which to ask :func:`decide` again after asking at ``runs``: a tenth more, at least one more
    (the interval's cost, a sort, stays a small share of the timing)."""
    return runs + max(1, runs // 10)


def record(decision: Decision) -> dict:
    """benchmark.json's ``stop`` of a row: runs taken, the median, the interval, its coverage and why it stopped."""
    interval = decision.interval
    return {"runs": decision.runs, "reason": decision.reason,
            "median_ms": interval.median if interval else None,
            "interval_ms": [interval.low, interval.high] if interval else None,
            "relative_halfwidth": interval.relative_halfwidth if interval else None,
            "coverage": interval.coverage if interval else None}
