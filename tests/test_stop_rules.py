"""The adaptive benchmark's stop rule (pipeline/runtime/speed/stopping.py), a function of plain numbers: the
order-statistic
interval of the median against exact integer arithmetic, and each boundary of the decision (the floor of runs, the
target half-width, the time cap) pinned exactly. Milliseconds: the mutation command runs these for every mutant.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.runtime.speed import stopping
from pipeline.runtime.speed.stopping import Decision, MedianInterval, StopRule

FAST = settings(max_examples=100, deadline=None)

latencies = st.lists(st.floats(0.01, 100.0, allow_nan=False, allow_infinity=False), min_size=0, max_size=80)
confidences = st.sampled_from([0.5, 0.8, 0.9, 0.95, 0.99])


def exact_ranks(n: int, confidence: float) -> tuple[int, int, Fraction] | None:
    """The oracle: the largest l with P(B <= l - 1) <= (1 - confidence) / 2, B ~ Binomial(n, 1/2), in integers."""
    bound = Fraction((1 - confidence) / 2)  # the same float threshold the module compares with, read exactly
    limit = bound.numerator * 2**n  # P(B <= k) <= bound  <=>  tail * denominator <= limit
    best, tail = None, 0
    for k in range(n):
        tail += math.comb(n, k)
        if tail * bound.denominator > limit or k > n - 1 - k:
            break
        best = (k, n - 1 - k, 1 - 2 * Fraction(tail, 2**n))
    return best


def rule(min_runs: int = 6, target: float = 0.05, cap: float = 1.0) -> StopRule:
    return StopRule(min_runs=min_runs, target_halfwidth=target, max_s=cap)


# --------------------------------------------------------------------------- the interval of the median


@pytest.mark.parametrize("confidence", [0.5, 0.8, 0.9, 0.95, 0.99])
def test_ranks_match_exact_integer_arithmetic(confidence):
    for n in range(0, 161):
        exact = exact_ranks(n, confidence)
        got = stopping.median_ranks(n, confidence)
        if exact is None:
            assert got is None, n
            continue
        assert got[:2] == exact[:2], n
        assert got[2] == pytest.approx(float(exact[2]), abs=1e-12)
        assert got[2] >= confidence


def test_an_interval_exists_from_six_runs_at_95_percent():
    assert stopping.median_ranks(5) is None and stopping.median_ranks(0) is None and stopping.median_ranks(1) is None
    assert stopping.median_ranks(6) == (0, 5, 0.96875)  # 1 - 2 / 64
    assert stopping.median_ranks(10) == (1, 8, pytest.approx(1 - 2 * 11 / 1024))
    assert stopping.median_ranks(20) == (5, 14, pytest.approx(0.9586105346679688))
    assert stopping.median_ranks(100)[:2] == (39, 60)
    assert stopping.median_ranks(20000)[:2] == (9860, 10139)  # large n: no overflow, the known ranks


@FAST
@given(st.integers(6, 400), confidences)
def test_the_interval_is_the_narrowest_that_covers(n, confidence):
    got = stopping.median_ranks(n, confidence)
    if got is None:
        return
    low, high, covered = got
    assert low + high == n - 1 and low <= high
    assert covered >= confidence
    narrower = 1 - 2 * sum(math.comb(n, i) for i in range(low + 2)) / 2**n
    assert low + 1 > high - 1 or narrower < confidence


@FAST
@given(latencies, confidences)
def test_median_interval_brackets_the_median_with_two_of_the_runs(samples, confidence):
    interval = stopping.median_interval(samples, confidence)
    ranks = stopping.median_ranks(len(samples), confidence)
    if ranks is None:
        assert interval is None
        return
    ordered = sorted(samples)
    assert interval.median == pytest.approx(float(np.median(samples)), rel=1e-12)
    assert (interval.low, interval.high) == (ordered[ranks[0]], ordered[ranks[1]])
    assert interval.low <= interval.median <= interval.high and interval.coverage == ranks[2]
    assert stopping.median_interval(list(reversed(samples)), confidence) == interval


def test_median_of_an_even_and_an_odd_series():
    assert stopping.median_interval([4.0, 1.0, 3.0, 2.0, 6.0, 5.0]).median == 3.5
    odd = stopping.median_interval([7.0, 1.0, 3.0, 2.0, 6.0, 5.0, 4.0])
    assert (odd.median, odd.low, odd.high, odd.coverage) == (4.0, 1.0, 7.0, 1 - 2 / 128)


def test_relative_halfwidth_is_the_wider_side_over_the_median():
    assert MedianInterval(2.0, 1.5, 3.0, 0.95).relative_halfwidth == 0.5  # the upper side, 1.0, over 2
    assert MedianInterval(2.0, 1.0, 2.5, 0.95).relative_halfwidth == 0.5  # the lower side
    assert MedianInterval(0.0, 0.0, 0.0, 0.95).relative_halfwidth == 0.0
    assert MedianInterval(0.0, 0.0, 1.0, 0.95).relative_halfwidth == math.inf


# --------------------------------------------------------------------------- the decision


def oracle(samples: list[float], elapsed: float, r: StopRule) -> bool:
    if len(samples) < r.min_runs:
        return False
    exact = exact_ranks(len(samples), r.confidence)
    if exact is not None:
        ordered = sorted(samples)
        median = float(np.median(samples))
        spread = max(median - ordered[exact[0]], ordered[exact[1]] - median)
        if spread <= r.target_halfwidth * median:
            return True
    return elapsed >= r.max_s


@FAST
@given(latencies, st.floats(0, 3), st.integers(1, 30), st.sampled_from([0.01, 0.05, 0.1, 0.5]))
def test_decide_stops_exactly_when_converged_or_capped_past_the_floor(samples, elapsed, floor, target):
    r = rule(floor, target, 1.0)
    decision = stopping.decide(samples, elapsed, r)
    assert decision.runs == len(samples)
    relative = decision.interval.relative_halfwidth if decision.interval else None
    near_target = relative is not None and math.isclose(relative, target, rel_tol=1e-9)
    assert decision.stop == oracle(samples, elapsed, r) or near_target
    expected = ("below the floor of runs" if len(samples) < floor else
                "converged" if relative is not None and relative <= target else
                "time cap" if elapsed >= 1.0 else
                "interval too wide" if relative is not None else "too few runs for an interval")
    assert decision.reason == expected
    assert decision.stop == (expected in ("converged", "time cap"))


@FAST
@given(latencies, st.floats(0, 3), st.integers(1, 30), st.floats(0.001, 0.5), st.floats(0, 0.5))
def test_a_wider_target_or_a_later_time_never_undoes_a_stop(samples, elapsed, floor, target, more):
    before = stopping.decide(samples, elapsed, rule(floor, target))
    assert not before.stop or stopping.decide(samples, elapsed, rule(floor, target + more)).stop
    assert not before.stop or stopping.decide(samples, elapsed + more, rule(floor, target)).stop


@FAST
@given(latencies, st.floats(0, 3), st.integers(-4, 4))
def test_the_decision_does_not_depend_on_the_unit(samples, elapsed, power):
    scaled = [x * 2.0**power for x in samples]  # exact in binary floating point
    a, b = stopping.decide(samples, elapsed, rule()), stopping.decide(scaled, elapsed, rule())
    assert (a.stop, a.reason, a.runs) == (b.stop, b.reason, b.runs)


def test_the_floor_holds_whatever_the_time():
    decision = stopping.decide([1.0] * 19, 1e9, rule(min_runs=20))
    assert decision == Decision(False, "below the floor of runs", 19, None)
    at_floor = stopping.decide([1.0] * 20, 0.0, rule(min_runs=20))
    assert at_floor == Decision(True, "converged", 20, MedianInterval(1.0, 1.0, 1.0, at_floor.interval.coverage))


def test_exactly_the_target_converges():
    samples = [0.75, 1.0, 1.0, 1.0, 1.0, 1.25]  # median 1, interval [0.75, 1.25]: +-25 % exactly
    assert stopping.decide(samples, 0.0, rule(target=0.25)).reason == "converged"
    assert stopping.decide(samples, 0.0, rule(target=0.2499)).reason == "interval too wide"
    assert stopping.decide(samples, 0.0, rule(target=0.2499)).stop is False


def test_exactly_the_cap_stops():
    samples = [1.0, 3.0] * 5
    assert stopping.decide(samples, 2.0, rule(cap=2.0)) == Decision(True, "time cap", 10,
                                                                     stopping.median_interval(samples))
    assert stopping.decide(samples, 1.999, rule(cap=2.0)).reason == "interval too wide"


def test_too_few_runs_for_an_interval_go_on_until_the_cap():
    assert stopping.decide([1.0] * 5, 0.5, rule(min_runs=1, cap=1.0)) == Decision(
        False, "too few runs for an interval", 5, None)
    assert stopping.decide([1.0] * 5, 1.0, rule(min_runs=1, cap=1.0)) == Decision(True, "time cap", 5, None)


def test_the_rule_uses_its_confidence():
    samples = [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 2.0]  # at 95 % the interval reaches 2.0; at 50 % it does not
    wide = StopRule(min_runs=1, target_halfwidth=0.1, max_s=10.0)
    narrow = StopRule(min_runs=1, target_halfwidth=0.1, max_s=10.0, confidence=0.5)
    assert stopping.decide(samples, 0.0, wide).reason == "interval too wide"
    assert stopping.decide(samples, 0.0, narrow).reason == "converged"


@pytest.mark.parametrize("runs, after", [(0, 1), (1, 2), (9, 10), (10, 11), (19, 20), (20, 22), (100, 110)])
def test_checkpoints_come_a_tenth_apart(runs, after):
    assert stopping.next_check(runs) == after


def test_the_record_of_a_row():
    interval = MedianInterval(2.0, 1.5, 3.0, 0.96)
    assert stopping.record(Decision(True, "converged", 40, interval)) == {
        "runs": 40, "reason": "converged", "median_ms": 2.0, "interval_ms": [1.5, 3.0], "relative_halfwidth": 0.5,
        "coverage": 0.96}
    assert stopping.record(Decision(True, "time cap", 5, None)) == {
        "runs": 5, "reason": "time cap", "median_ms": None, "interval_ms": None, "relative_halfwidth": None,
        "coverage": None}
