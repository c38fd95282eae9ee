"""The gate's criteria (pipeline/precision/gate.py) against oracles written another way, and their properties.

Fast (NumPy only, no model): the mutation command (scripts/mutation.sh) runs these for every mutant of gate.py.
Each property names the defect class it stands for: a dropped ``abs``, a scale taken from the wrong side, lost and
gained swapped, ``any`` turned into ``all``, a boundary moved by one, a verdict fold that lets a weaker status win.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from pipeline.core.check_results import TensorCheck
from pipeline.precision import gate as criteria

FAST = settings(max_examples=60, deadline=None)


def scaled_gate(**over) -> dict:
    gate = {"criterion": "scaled", "max_scaled_error": 0.1, "error_quantile": 1.0, "atol": 1e-3, "rtol": 1e-3,
            "check_error_stat": "elemwise", "min_top1_agreement": 0.9, "max_accuracy_drop": 0.05}
    return {**gate, **over}


def logits(min_rows: int = 2, max_rows: int = 12, classes: int = 5):
    return arrays(np.float64, st.tuples(st.integers(min_rows, max_rows), st.just(classes)),
                  elements=st.floats(-8, 8, allow_nan=False, width=32))


# --------------------------------------------------------------------------- oracles written another way


def oracle_scale(ref: np.ndarray) -> float:
    """RMS over the finite images of each image's population standard deviation, one image at a time."""
    variances = []
    for row in np.asarray(ref, np.float64).reshape(len(ref), -1):
        if np.all(np.isfinite(row)) and row.size:
            mean = sum(row) / row.size
            variances.append(sum((v - mean) ** 2 for v in row) / row.size)
    return max(math.sqrt(sum(variances) / len(variances)), criteria.TINY) if variances else criteria.TINY


def oracle_errors(ref: np.ndarray, cand: np.ndarray, scale: float) -> list[float]:
    out = []
    for r, c in zip(ref.reshape(len(ref), -1), cand.reshape(len(cand), -1), strict=True):
        diffs = [abs(float(a) - float(b)) for a, b in zip(c, r, strict=True)]
        out.append(math.inf if any(not math.isfinite(d) for d in diffs) else max(diffs, default=0.0) / scale)
    return out


def oracle_quantile(errors: list[float], q: float) -> float:
    """The smallest error e such that at least a share q of the images are at or below it."""
    if not errors:
        return 0.0
    for e in sorted(errors):
        if sum(1 for x in errors if x <= e) >= q * len(errors) - 1e-12:
            return e
    return max(errors)


def oracle_wilson(k: int, n: int, z: float) -> tuple[float, float]:
    """Wilson's interval as the roots of (p - k/n)^2 = z^2 p (1 - p) / n."""
    if n == 0:
        return 0.0, 1.0
    phat = k / n
    a = 1 + z * z / n
    b = -(2 * phat + z * z / n)
    c = phat * phat
    disc = max(b * b - 4 * a * c, 0.0)
    return max(0.0, (-b - math.sqrt(disc)) / (2 * a)), min(1.0, (-b + math.sqrt(disc)) / (2 * a))


# --------------------------------------------------------------------------- the tensor check


@FAST
@given(logits())
def test_scale_matches_the_oracle(ref):
    assert criteria.logit_scale(ref) == pytest.approx(oracle_scale(ref), rel=1e-9, abs=1e-12)


def test_scale_skips_images_that_are_not_finite_and_is_tiny_without_any():
    ref = np.array([[0.0, 2.0], [np.nan, 1.0], [1.0, 1.0]])
    assert criteria.logit_scale(ref) == pytest.approx(math.sqrt((1.0 + 0.0) / 2))
    assert criteria.logit_scale(np.full((3, 2), np.nan)) == criteria.TINY
    assert criteria.logit_scale(np.zeros((3, 0))) == criteria.TINY
    assert criteria.logit_scale(np.ones((3, 4))) == criteria.TINY  # no spread: any error is infinite


@FAST
@given(logits(), st.floats(0.01, 3), st.integers(0, 2**31 - 1))
def test_errors_match_the_oracle_and_ignore_the_sign_of_the_difference(ref, size, seed):
    delta = np.random.default_rng(seed).normal(size=ref.shape) * size
    scale = criteria.logit_scale(ref)
    up, down = criteria.scaled_errors(ref, ref + delta), criteria.scaled_errors(ref, ref - delta)
    np.testing.assert_allclose(up, oracle_errors(ref, ref + delta, scale), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(up, down, rtol=1e-9, atol=1e-12)  # abs(): a candidate below is as wrong as above
    assert np.all(up >= 0)


@FAST
@given(logits(), st.floats(0.01, 1), st.floats(0.1, 100), st.integers(0, 2**31 - 1))
def test_the_tensor_check_is_scale_free(ref, size, k, seed):
    assume(criteria.logit_scale(ref) > 1e-3)
    cand = ref + np.random.default_rng(seed).normal(size=ref.shape) * size
    gate = scaled_gate(max_scaled_error=0.3)
    a, b = criteria.scaled_check(ref, cand, gate), criteria.scaled_check(k * ref, k * cand, gate)
    assert a.passed == b.passed
    assert a.scaled_error_quantile == pytest.approx(b.scaled_error_quantile, rel=1e-6)
    assert a.images_over == b.images_over


@FAST
@given(logits(min_rows=3), st.floats(0.0, 1.0), st.integers(0, 2**31 - 1), st.floats(0.05, 1))
def test_more_error_never_passes_where_less_failed(ref, q, seed, limit):
    delta = np.random.default_rng(seed).normal(size=ref.shape)
    gate = scaled_gate(max_scaled_error=limit, error_quantile=max(q, 0.01))
    small, large = criteria.scaled_check(ref, ref + 0.1 * delta, gate), criteria.scaled_check(ref, ref + delta, gate)
    assert small.scaled_error_quantile <= large.scaled_error_quantile + 1e-12
    assert not (large.passed and not small.passed)
    assert large.images_over >= small.images_over


@FAST
@given(st.lists(st.floats(0, 10), min_size=1, max_size=30), st.floats(0.01, 1.0))
def test_image_quantile_is_the_smallest_real_error_covering_the_share(errors, q):
    assert criteria.image_quantile(np.array(errors), q) == oracle_quantile(errors, q)


def test_image_quantile_ends():
    errors = np.array([3.0, 1.0, 2.0, 4.0])
    assert criteria.image_quantile(errors, 1.0) == 4.0
    assert criteria.image_quantile(errors, 0.75) == 3.0
    assert criteria.image_quantile(errors, 0.5) == 2.0
    assert criteria.image_quantile(errors, 0.0) == 1.0
    assert criteria.image_quantile(np.zeros(0), 0.9) == 0.0


def test_scaled_check_boundary_counts_and_worst_image():
    ref = np.array([[0.0, 2.0], [0.0, 2.0], [0.0, 2.0], [0.0, 2.0]])  # scale 1
    cand = ref.copy()
    cand[2, 1] += 0.5
    cand[1, 0] -= 0.25
    at = criteria.scaled_check(ref, cand, scaled_gate(max_scaled_error=0.5))
    assert at.passed and at.images_over == 0 and at.mismatch_fraction == 0.0 and at.worst_image == 2
    assert at.scaled_error == pytest.approx(0.5) and at.scale == pytest.approx(1.0)
    assert at.threshold == 0.5 and at.nonfinite == 0 and at.criterion == "scaled"
    over = criteria.scaled_check(ref, cand, scaled_gate(max_scaled_error=0.3))
    assert not over.passed and over.images_over == 1 and over.mismatch_fraction == 0.25
    q = criteria.scaled_check(ref, cand, scaled_gate(max_scaled_error=0.3, error_quantile=0.5))
    assert q.passed and q.scaled_error_quantile == pytest.approx(0.0) and q.error_quantile == 0.5
    assert q.images_over == 1  # the quantile passes it; the image is still counted over


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_a_non_finite_candidate_value_fails_and_is_counted(value):
    ref = np.array([[0.0, 2.0], [1.0, 0.0]])
    cand = ref.copy()
    cand[1, 1] = value
    result = criteria.scaled_check(ref, cand, scaled_gate(max_scaled_error=1e9, error_quantile=0.5))
    assert not result.passed and result.nonfinite == 1 and result.worst_image == 1


def test_probability_errors_match_softmax_by_hand():
    ref = np.array([[1.0, 0.0, -1.0], [0.5, 0.5, 0.0]])
    cand = np.array([[0.0, 1.0, -1.0], [0.5, 0.5, 0.0]])
    softmax = lambda x: np.exp(x) / np.exp(x).sum(1, keepdims=True)  # noqa: E731
    pr, pc = softmax(ref), softmax(cand)
    got = criteria.probability_errors(ref, cand)
    assert got["max_prob_error"] == pytest.approx(np.abs(pc - pr).max())
    assert got["mean_kl"] == pytest.approx(np.mean([np.sum(pr[i] * np.log(pr[i] / pc[i])) for i in range(2)]))
    assert criteria.probability_errors(ref, cand * np.nan) == {"max_prob_error": None, "mean_kl": None}
    assert criteria.probability_errors(ref[0], cand[0]) == {"max_prob_error": None, "mean_kl": None}


def test_error_statistics_by_hand():
    ref = np.array([1.0, -2.0, 0.0, 4.0])
    cand = np.array([1.5, -2.0, 0.25, 3.0])
    stats = criteria.error_statistics(ref, cand, 0.5)
    absdiff = np.array([0.5, 0.0, 0.25, 1.0])
    assert stats["max_abs_error"] == 1.0 and stats["mean_abs_error"] == pytest.approx(absdiff.mean())
    assert stats["median_abs_error"] == pytest.approx(np.median(absdiff))
    assert stats["quantile_abs_error"] == pytest.approx(np.quantile(absdiff, 0.5))
    rel = absdiff / np.where(ref == 0, np.finfo(np.float64).eps, np.abs(ref))
    assert stats["max_rel_error"] == pytest.approx(rel.max())
    assert stats["mean_rel_error"] == pytest.approx(rel.mean())
    assert stats["median_rel_error"] == pytest.approx(np.median(rel))
    bad = criteria.error_statistics(ref, np.array([np.nan, 0, 0, 0]), 0.5)
    assert bad["max_abs_error"] == math.inf and math.isfinite(bad["mean_abs_error"])
    assert math.isnan(criteria.error_statistics(ref * np.nan, cand, 0.5)["mean_abs_error"])


def test_tolerances_per_output_and_for_intermediate_tensors():
    assert criteria.output_tolerance({"logits": 0.1, "": 0.2}, "logits", 9) == 0.1
    assert criteria.output_tolerance({"other": 0.1, "": 0.2}, "logits", 9) == 0.2
    assert criteria.output_tolerance({"other": 0.1}, "logits", 9) == 9
    assert criteria.output_tolerance(0.3, "logits", 9) == 0.3
    assert criteria.output_tolerance(None, "logits", 9) == 9
    assert criteria.scalar_tolerance({"a": 0.5, "b": 0.1}, 9) == 0.1
    assert criteria.scalar_tolerance({"a": 0.5, "": 0.7}, 9) == 0.7
    assert criteria.scalar_tolerance({}, 9) == 9
    assert criteria.scalar_tolerance(0.4, 9) == 0.4
    assert criteria.scalar_tolerance(None, 9) == 9


@FAST
@given(arrays(np.float64, 8, elements=st.floats(-4, 4)), arrays(np.float64, 8, elements=st.floats(-4, 4)),
       st.floats(0, 1), st.floats(0, 1))
def test_elementwise_mismatch_is_abs_and_rel_over_both(ref, cand, atol, rtol):
    got = criteria.elementwise_mismatch(ref, cand, atol, rtol)
    for r, c, g in zip(ref, cand, got, strict=True):
        with np.errstate(all="ignore"):
            rel = abs(c - r) / (abs(r) if r != 0 else criteria.EPS)
        assert g == (abs(c - r) > atol and rel > rtol)


def test_elementwise_mismatch_nan_fails():
    assert criteria.elementwise_mismatch(np.array([1.0]), np.array([np.nan]), 10, 10).all()


# --------------------------------------------------------------------------- one tensor (localisation's rule)


@FAST
@given(logits(min_rows=2), st.integers(0, 2**31 - 1), st.floats(0.05, 2))
def test_a_tensor_exceeds_when_any_image_is_over(ref, seed, limit):
    assume(criteria.logit_scale(ref) > 1e-3)
    cand = ref.copy()
    rng = np.random.default_rng(seed)
    cand[rng.integers(len(ref))] += rng.normal(size=ref.shape[1]) * 3  # one image moved, the rest exact
    rule = criteria.TensorRule("scaled", limit, 0.0, 0.0)
    oracle = any(e > limit for e in oracle_errors(ref, cand, criteria.logit_scale(ref)))
    assert rule.errors(ref, cand)["exceeds"] == oracle


def test_tensor_rule_details():
    ref = np.array([[0.0, 2.0], [0.0, 2.0]])
    cand = np.array([[0.0, 2.0], [0.0, 3.0]])
    rule = criteria.TensorRule.of(scaled_gate(max_scaled_error=0.5))
    stats = rule.errors(ref, cand)
    assert stats["exceeds"] and stats["scaled_error"] == pytest.approx(1.0) and stats["mismatch_fraction"] == 0.5
    assert stats["fp32_min"] == 0.0 and stats["fp32_max"] == 2.0 and stats["nonfinite"] == 0
    assert not criteria.TensorRule.of(scaled_gate(max_scaled_error=1.0)).errors(ref, cand)["exceeds"]
    nan = cand.copy()
    nan[0, 0] = np.nan
    assert criteria.TensorRule.of(scaled_gate(max_scaled_error=1e9)).errors(ref, nan)["exceeds"]
    absolute = criteria.TensorRule.of({**scaled_gate(), "criterion": "absolute", "atol": 0.5, "rtol": 0.1})
    assert absolute == criteria.TensorRule("absolute", 0.1, 0.5, 0.1)
    assert absolute.errors(ref, cand)["exceeds"] and absolute.errors(ref, cand)["mismatch_fraction"] == 0.25
    assert not criteria.TensorRule("absolute", 0, 1.0, 0.1).errors(ref, cand)["exceeds"]
    assert absolute.describe()["atol"] == 0.5 and "max_scaled_error" in rule.describe()
    assert criteria.TensorRule.of({}).criterion == "scaled"
    assert criteria.TensorRule("scaled", 1.0, 0, 0).errors(np.zeros(0), np.zeros(0))["exceeds"] is False


def test_localization_limit_is_the_smaller_of_the_gate_and_half_the_observed_error():
    assert criteria.localization_limit(0.5, 0.4) == pytest.approx(0.2)
    assert criteria.localization_limit(0.5, 2.0) == 0.5
    assert criteria.localization_limit(0.5, 1.0) == 0.5
    for unmeasured in (None, math.nan, math.inf, 0.0, -1.0):
        assert criteria.localization_limit(0.5, unmeasured) == 0.5


def test_the_worst_batch_holds_the_worst_image_or_the_first_failing_batch():
    def tensor(criterion, **numbers):
        return TensorCheck(passed=False, criterion=criterion, statistic="-", **numbers)

    assert criteria.worst_batch_index(tensor("scaled", worst_image=37), 16) == 2
    assert criteria.worst_batch_index(tensor("scaled", worst_image=15), 16) == 0
    assert criteria.worst_batch_index(tensor("scaled", worst_image=16), 16) == 1
    assert criteria.worst_batch_index(tensor("absolute", failed_batches=[3, 1]), 16) == 3
    assert criteria.worst_batch_index(tensor("absolute", failed_batches=[]), 16) == 0
    assert criteria.worst_batch_index(None, 16) == 0


# --------------------------------------------------------------------------- bounds and the task check


@FAST
@given(st.integers(0, 400), st.integers(1, 400), st.floats(0.5, 0.999))
def test_wilson_matches_the_quadratic_and_brackets_the_observed_rate(k, n, confidence):
    k = min(k, n)
    z = criteria.z_value(confidence)
    low, high = criteria.wilson(k, n, z)
    o_low, o_high = oracle_wilson(k, n, z)
    assert low == pytest.approx(o_low, abs=1e-7) and high == pytest.approx(o_high, abs=1e-7)
    assert 0.0 <= low <= k / n <= high <= 1.0


@FAST
@given(st.integers(1, 199), st.integers(2, 200), st.floats(0.8, 0.99))
def test_wilson_lies_inside_clopper_pearson(k, n, confidence):
    """Inside the exact (Clopper-Pearson) interval with (1 - confidence) / 2 in each tail, away from the edges: at
    k = 0 or n Wilson's far bound can be a hair wider (measured: by at most 3e-5 at 0.99, n < 150), so those are
    checked apart (the near bound is the observed rate itself)."""
    beta = pytest.importorskip("scipy.stats").beta
    k = min(k, n - 1)
    z = criteria.z_value(confidence)
    low, high = criteria.wilson(k, n, z)
    tail = (1 - confidence) / 2
    assert beta.ppf(tail, k, n - k + 1) - 1e-9 <= low and high <= beta.ppf(1 - tail, k + 1, n - k) + 1e-9


def test_wilson_at_the_edges_starts_at_the_observed_rate():
    z = criteria.z_value(0.95)
    assert criteria.wilson(0, 20, z)[0] == 0.0 and criteria.wilson(20, 20, z)[1] == 1.0
    assert criteria.wilson(0, 20, z)[1] == pytest.approx(z * z / (20 + z * z))


def test_z_value_and_empty_interval():
    assert criteria.z_value(0.95) == pytest.approx(1.6449, abs=1e-4)
    assert criteria.wilson(0, 0, 1.645) == (0.0, 1.0)


def oracle_agreement(agree: int, n: int, minimum: float, z: float) -> str:
    rate = agree / n if n else 1.0
    if rate >= minimum:
        return "passed"
    return "failed" if oracle_wilson(agree, n, z)[1] < minimum else "inconclusive"


@FAST
@given(st.integers(0, 300), st.integers(0, 300), st.floats(0.5, 1.0))
def test_agreement_status_matches_the_oracle_and_is_monotone(agree, n, minimum):
    agree = min(agree, n)
    z = criteria.z_value(0.95)
    result = criteria.agreement_check(agree, n, minimum, z)
    assert result.status == oracle_agreement(agree, n, minimum, z)
    assert result.value == (agree / n if n else 1.0) and result.threshold == minimum
    if agree < n:  # one more agreeing image never makes it worse
        better = criteria.agreement_check(agree + 1, n, minimum, z).status
        assert SEVERITY[better] <= SEVERITY[result.status]


SEVERITY = {"passed": 0, "inconclusive": 1, "failed": 2}


@FAST
@given(st.integers(0, 60), st.integers(0, 60), st.integers(0, 200), st.floats(0.0, 0.3))
def test_accuracy_drop_is_lost_minus_gained_and_bounded_below(lost, gained, extra, maximum):
    n = lost + gained + extra
    assume(n > 0)
    z = criteria.z_value(0.95)
    result = criteria.accuracy_drop_check(lost, gained, n, maximum, z)
    assert result.value == pytest.approx((lost - gained) / n)
    assert result.lower_bound <= result.value + 1e-12
    swapped = criteria.accuracy_drop_check(gained, lost, n, maximum, z)
    assert swapped.value == pytest.approx(-result.value)
    if result.value <= maximum:
        assert result.status == "passed"
    elif result.lower_bound > maximum:
        assert result.status == "failed"
    else:
        assert result.status == "inconclusive"
    if gained:  # one gained image turned lost never makes it better
        worse = criteria.accuracy_drop_check(lost + 1, gained - 1, n, maximum, z).status
        assert SEVERITY[worse] >= SEVERITY[result.status]


def test_accuracy_drop_bound_by_hand_and_without_discordant_pairs():
    z = criteria.z_value(0.95)
    result = criteria.accuracy_drop_check(30, 2, 100, 0.05, z)
    low = criteria.wilson(30, 32, z)[0]
    assert result.lower_bound == pytest.approx(32 / 100 * (2 * low - 1))
    assert result.status == "failed" and result.more_images == 0
    none = criteria.accuracy_drop_check(0, 0, 100, 0.0, z)
    assert none.status == "passed" and none.lower_bound == 0.0 and none.value == 0.0
    assert criteria.accuracy_drop_check(0, 0, 0, 0.0, z).value == 0.0


@FAST
@given(st.integers(1, 200), st.integers(1, 200), st.floats(0.6, 0.99))
def test_more_images_named_would_decide_the_agreement(agree, n, minimum):
    agree = min(agree, n)
    z = criteria.z_value(0.95)
    result = criteria.agreement_check(agree, n, minimum, z)
    if result.status != "inconclusive":
        assert result.more_images == 0
    elif result.more_images is not None:
        m = n + result.more_images
        assert result.more_images > 0
        assert criteria.wilson(round(agree / n * m), m, z)[1] < minimum


def test_more_images_is_the_fewest_that_decide():
    z = criteria.z_value(0.95)
    result = criteria.agreement_check(249, 256, 0.98, z)
    m = 256 + result.more_images
    assert criteria.wilson(round(249 / 256 * m), m, z)[1] < 0.98
    assert criteria.wilson(round(249 / 256 * (m - 1)), m - 1, z)[1] >= 0.98
    assert criteria.agreement_check(98, 100, 0.98, z).more_images == 0


def test_top1_and_margins():
    x = np.array([[1.0, np.nan, 0.5], [np.nan, np.nan, -1.0], [2.0, 3.0, 3.5]])
    assert list(criteria.top1(x)) == [0, 2, 2]
    np.testing.assert_allclose(criteria.top1_margins(np.array([[1.0, 3.0, 2.5], [0.0, 0.0, 0.0]])), [0.5, 0.0])
    assert criteria.top1_margins(np.array([[1.0], [2.0]])).tolist() == [math.inf, math.inf]


def test_task_check_counts_agreement_on_decided_images_and_the_drop_on_all():
    ref = np.array([[3.0, 0.0], [3.0, 0.0], [0.0, 3.0], [1.0, 0.9]])
    cand = np.array([[0.0, 3.0], [3.0, 0.0], [0.0, 3.0], [0.9, 1.0]])  # image 0 flips (decided), 3 flips (tie)
    labels = np.array([0, 0, 1, 1])
    gate = scaled_gate(min_top1_agreement=0.5, max_accuracy_drop=0.5)
    result = criteria.task_check(ref, cand, labels, gate, 0.95, tie_margin=0.5)
    assert result.near_ties == 1 and result.agreement.value == pytest.approx(2 / 3)
    assert result.top1_agreement == 0.5 and result.disagreements == 2
    assert result.reference_accuracy == 0.75 and result.accuracy == 0.75 and result.accuracy_drop == 0.0
    assert result.drop.value == 0.0 and result.samples == 4 and result.confidence == 0.95
    assert result.status == "passed" and result.passed and result.tie_margin == 0.5
    assert result.more_images == 0
    strict = criteria.task_check(ref, cand, labels, scaled_gate(min_top1_agreement=0.9), 0.95, tie_margin=0.5)
    assert strict.status == "inconclusive" and not strict.passed
    empty = criteria.task_check(np.zeros((0, 2)), np.zeros((0, 2)), np.zeros(0, int), gate, 0.95)
    assert empty.top1_agreement == 1.0 and empty.accuracy == 0.0 and empty.reference_accuracy == 0.0


@FAST
@given(logits(min_rows=4, max_rows=30, classes=4), st.floats(0.1, 50), st.integers(0, 2**31 - 1))
def test_the_verdict_is_scale_free_near_ties_included(ref, k, seed):
    assume(criteria.logit_scale(ref) > 0.05)
    rng = np.random.default_rng(seed)
    cand = ref + rng.normal(size=ref.shape) * 0.05 * criteria.logit_scale(ref)
    labels = rng.integers(0, ref.shape[1], len(ref))
    gate = scaled_gate(max_scaled_error=0.2, min_top1_agreement=0.8, max_accuracy_drop=0.2)
    a = criteria.judge([{"y": ref}], [{"y": ref}], labels, gate, "y", 0.95)  # the reference against itself
    assert a.status == "passed"
    one = criteria.judge([{"y": cand}], [{"y": ref}], labels, gate, "y", 0.95)
    other = criteria.judge([{"y": k * cand}], [{"y": k * ref}], labels, gate, "y", 0.95)
    assert one.status == other.status
    assert one.task_check.near_ties == other.task_check.near_ties
    assert one.task_check.tie_margin == pytest.approx(other.task_check.tie_margin / k)


def test_judge_folds_tensor_and_task_failed_beats_inconclusive_beats_passed():
    ref = np.tile(np.array([[2.0, 1.0]]), (256, 1))
    undecided = ref.copy()
    undecided[:7] = [[1.0, 2.0]]  # 249 of 256 agree: 97.3 % against 98 %, not shown to be below
    gate = {**scaled_gate(min_top1_agreement=0.98, max_accuracy_drop=1.0), "criterion": "absolute", "atol": 10.0,
            "rtol": 10.0}
    labels = np.zeros(256, int)
    result = criteria.judge([{"y": undecided}], [{"y": ref}], labels, gate, "y", 0.95)
    assert result.task_check.status == "inconclusive" and result.tensor_check.passed
    assert result.status == "inconclusive" and result.passed is False
    tensor_fails = criteria.judge([{"y": undecided}], [{"y": ref}], labels, {**gate, "atol": 0.1, "rtol": 0.1}, "y",
                                  0.95)
    assert tensor_fails.status == "failed" and not tensor_fails.passed
    task_fails = criteria.judge([{"y": undecided}], [{"y": ref}], labels, {**gate, "min_top1_agreement": 1.0,
                                                                          "max_accuracy_drop": 0.0}, "y", 0.95)
    assert task_fails.tensor_check.passed and task_fails.status == "failed"
    clean = criteria.judge([{"y": ref}], [{"y": ref}], labels, scaled_gate(), "y", 0.95)
    assert clean.status == "passed" and clean.passed is True
    assert clean.tensor_check.batches == 1 and clean.tensor_check.failed_batches == []


def test_judge_uses_the_tolerated_error_in_logit_units_as_the_tie_margin():
    ref = np.array([[4.0, 0.0, 0.0], [0.0, 4.0, 0.0], [0.0, 0.0, 4.0], [1.0, 0.98, 0.0]])
    gate = scaled_gate(max_scaled_error=0.05)
    result = criteria.judge([{"y": ref}], [{"y": ref}], np.array([0, 1, 2, 0]), gate, "y", 0.95)
    scale = criteria.logit_scale(ref)
    assert result.task_check.tie_margin == pytest.approx(2 * 0.05 * scale)
    assert result.task_check.near_ties == 1
    absolute = criteria.judge([{"y": ref}], [{"y": ref}], np.array([0, 1, 2, 0]), {**gate, "criterion": "absolute"},
                              "y", 0.95)
    assert absolute.task_check.tie_margin == 0.0 and absolute.tensor_check.criterion == "absolute"


def test_absolute_check_batches_and_nonfinite():
    ref = [{"y": np.array([[1.0, 2.0]])}, {"y": np.array([[1.0, 2.0]])}]
    cand = [{"y": np.array([[1.0, 2.0]])}, {"y": np.array([[1.5, 2.0]])}]
    gate = {**scaled_gate(), "criterion": "absolute", "atol": 0.1, "rtol": 0.1}
    result = criteria.absolute_check(cand, ref, gate, "y")
    assert not result.passed and result.failed_batches == [1] and result.batches == 2
    assert result.mismatch_fraction == 0.25
    loose = criteria.absolute_check(cand, ref, {**gate, "atol": 1.0}, "y")
    assert loose.passed and loose.failed_batches == [] and loose.nonfinite == 0
    bad = [{"y": np.array([[1.0, np.inf]])}, {"y": np.array([[1.0, 2.0]])}]
    assert not criteria.absolute_check(bad, ref, {**gate, "atol": 1e9}, "y").passed


# --------------------------------------------------------------------------- the contract with the reports


def test_every_check_returns_exactly_the_fields_the_reports_read():
    ref = np.array([[0.0, 2.0], [1.0, 0.0]])
    scaled = criteria.scaled_check(ref, ref, scaled_gate())
    assert set(scaled.to_json()) == {"passed", "criterion", "statistic", "mismatch_fraction", "scale", "scaled_error",
                           "scaled_error_quantile", "error_quantile", "threshold", "images_over", "worst_image",
                           "nonfinite", "max_prob_error", "mean_kl"}
    assert scaled.statistic == "q1 of per-image scaled error"
    absolute = criteria.absolute_check([{"y": ref}], [{"y": ref}], {**scaled_gate(), "criterion": "absolute"}, "y")
    assert set(absolute.to_json()) == {"passed", "criterion", "statistic", "batches", "failed_batches", "nonfinite",
                             "mismatch_fraction"}
    assert absolute.statistic == "elemwise" and absolute.criterion == "absolute"
    z = criteria.z_value(0.95)
    assert set(criteria.agreement_check(9, 10, 0.95, z).to_json()) == {"status", "value", "upper_bound", "threshold",
                                                              "more_images"}
    drop = criteria.accuracy_drop_check(3, 1, 10, 0.05, z)
    assert set(drop.to_json()) == {"status", "value", "lower_bound", "threshold", "more_images"}
    assert drop.threshold == 0.05
    task = criteria.task_check(ref, ref, np.array([1, 0]), scaled_gate(), 0.95)
    assert set(task.to_json()) == {"status", "passed", "samples", "confidence", "top1_agreement", "reference_accuracy",
                         "accuracy", "accuracy_drop", "disagreements", "near_ties", "tie_margin", "agreement", "drop",
                         "more_images"}
    stats = criteria.error_statistics(ref, ref, 0.5)
    assert set(stats) == {f"{s}_{k}_error" for s in ("max", "mean", "median", "quantile") for k in ("abs", "rel")}
    judged = criteria.judge([{"y": ref}], [{"y": ref}], np.array([1, 0]), scaled_gate(), "y", 0.95)
    assert {f.name for f in dataclasses.fields(judged)} == {"tensor_check", "task_check", "status"} and judged.passed
    tensor = judged.tensor_check.to_json()
    assert set(stats) <= set(tensor) and {"batches", "failed_batches"} <= set(tensor)


def test_describe_says_each_rule():
    assert criteria.TensorRule("absolute", 0.0, 0.5, 0.1).describe() == {
        "atol": 0.5, "rtol": 0.1, "rule": "elementwise: abs > atol and rel > rtol"}
    assert criteria.TensorRule("scaled", 0.3, 0.0, 0.0).describe() == {
        "max_scaled_error": 0.3,
        "rule": "scaled: an image's largest error / the tensor's scale (RMS of each image's std) > max"}
    assert criteria.TensorRule.of({}) == criteria.TensorRule("scaled", 0.0, 0.0, 0.0)


# --------------------------------------------------------------------------- precision, emptiness, warnings


PRECISE = [lambda r, c: criteria.logit_scale(r), criteria.scaled_errors, lambda r, c: criteria.top1_margins(r),
           lambda r, c: criteria.error_statistics(r, c, 0.5), criteria.probability_errors,
           lambda r, c: criteria.scaled_check(r, c, scaled_gate()),
           lambda r, c: criteria.TensorRule("scaled", 0.1, 0, 0).errors(r, c)]


@pytest.mark.parametrize("fn", PRECISE)
def test_every_statistic_is_computed_in_float64_whatever_the_input_type(fn):
    """An FP16 or FP32 candidate's logits are judged in float64: the same numbers give the same statistic to the last
    bit, whatever dtype they arrive in."""
    rng = np.random.default_rng(3)
    ref = (rng.normal(size=(16, 7)) * 100).astype(np.float32)
    cand = (ref * 1.001 + 0.01).astype(np.float32)
    assert str(fn(ref.astype(np.float64), cand.astype(np.float64))) == str(fn(ref, cand))


@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_empty_and_non_finite_inputs_give_defined_values_without_a_warning():
    empty = np.zeros((0, 3))
    check = criteria.scaled_check(empty, empty, scaled_gate())
    assert check.mismatch_fraction == 0.0 and check.worst_image == 0 and check.scaled_error == 0.0
    assert check.passed and check.images_over == 0
    for rule in (criteria.TensorRule("scaled", 0.1, 0, 0), criteria.TensorRule("absolute", 0, 0.1, 0.1)):
        stats = rule.errors(empty, empty)
        assert stats["mismatch_fraction"] == 0.0 and stats["exceeds"] is False and stats["scaled_error"] == 0.0
    assert criteria.TensorRule("scaled", 0.1, 0, 0).errors(np.float64(1.0), np.float64(2.0))["scaled_error"] == 0.0
    nan = np.array([[np.nan, 1.0], [np.inf, 0.0]])
    assert criteria.scaled_check(nan, nan, scaled_gate()).nonfinite == 2
    assert criteria.TensorRule("absolute", 0, 0.1, 0.1).errors(nan, nan)["exceeds"]
    assert criteria.elementwise_mismatch(np.zeros(2), np.array([0.0, np.nan]), 0.1, 0.1).tolist() == [False, True]
    assert criteria.absolute_check([{"y": nan}], [{"y": nan}], {**scaled_gate(), "criterion": "absolute"},
                                   "y").passed is False
    assert math.isnan(criteria.error_statistics(empty, empty, 0.5)["mean_abs_error"])
    assert criteria.error_statistics(empty, empty, 0.5)["max_abs_error"] == math.inf
    stats = criteria.error_statistics(np.array([0.0, 1.0]), np.array([0.5, 1.0]), 0.5)
    assert stats["max_rel_error"] == pytest.approx(0.5 / np.finfo(np.float64).eps)


def test_absolute_check_of_no_image_has_no_mismatch():
    empty = np.zeros((0, 3))  # Polygraphy warns on the empty statistics itself; the gate's own numbers are defined
    absolute = criteria.absolute_check([{"y": empty}], [{"y": empty}], {**scaled_gate(), "criterion": "absolute"}, "y")
    assert absolute.mismatch_fraction == 0.0 and absolute.passed


def test_the_scaled_check_reports_the_softmax_and_the_scale():
    ref = np.array([[0.0, 2.0], [2.0, 0.0]])
    cand = ref + np.array([[0.1, -0.1], [0.0, 0.0]])
    check = criteria.scaled_check(ref, cand, scaled_gate())
    assert check.mean_kl == pytest.approx(criteria.probability_errors(ref, cand)["mean_kl"]) and check.mean_kl > 0
    assert check.max_prob_error > 0
    judged = criteria.judge([{"y": cand}], [{"y": ref}], np.array([1, 0]), scaled_gate(), "y", 0.95)
    assert judged.tensor_check.max_abs_error == pytest.approx(0.1)
    assert judged.tensor_check.mean_abs_error == pytest.approx(0.05)


def test_tensor_rule_statistics_use_both_sides():
    ref, cand = np.array([[0.0, 2.0], [2.0, 0.0]]), np.array([[0.0, 2.5], [2.0, 0.0]])
    stats = criteria.TensorRule("scaled", 1.0, 0, 0).errors(ref, cand)
    assert stats["max_abs_error"] == 0.5 and stats["scaled_error"] == pytest.approx(0.5)
    assert stats["quantile_abs_error"] == pytest.approx(np.quantile([0, 0.5, 0, 0], 0.99))


# --------------------------------------------------------------------------- boundaries


def test_top1_margins_treat_nan_as_minus_infinity():
    margins = criteria.top1_margins(np.array([[1.0, 0.5, np.nan], [1.0, np.nan, np.nan]]))
    assert margins.tolist() == [0.5, math.inf]


def test_a_margin_equal_to_the_tie_margin_is_a_near_tie():
    ref = np.array([[1.0, 0.5], [3.0, 0.0], [0.0, 3.0], [0.0, 3.0]])
    cand = np.array([[0.5, 1.0], [0.0, 3.0], [3.0, 0.0], [0.0, 3.0]])
    result = criteria.task_check(ref, cand, np.array([0, 0, 1, 1]), scaled_gate(), 0.95, tie_margin=0.5)
    assert result.near_ties == 1 and result.disagreements == 3 and result.agreement.value == 1 / 3


def test_bounds_exactly_at_the_threshold_do_not_decide():
    z = criteria.z_value(0.95)
    upper = criteria.wilson(90, 100, z)[1]
    assert criteria.agreement_check(90, 100, upper, z).status == "inconclusive"  # not below it: not shown
    assert criteria.agreement_check(90, 100, upper + 1e-9, z).status == "failed"
    low = criteria.accuracy_drop_check(30, 2, 100, 0.0, z).lower_bound
    assert criteria.accuracy_drop_check(30, 2, 100, low, z).status == "inconclusive"  # not above it
    assert criteria.accuracy_drop_check(30, 2, 100, low - 1e-9, z).status == "failed"


def test_a_passed_drop_needs_no_more_images_and_an_undecided_one_names_enough():
    z = criteria.z_value(0.95)
    assert criteria.accuracy_drop_check(3, 1, 100, 0.05, z).more_images == 0
    undecided = criteria.accuracy_drop_check(6, 1, 100, 0.03, z)
    assert undecided.status == "inconclusive" and undecided.more_images > 0
    m = 100 + undecided.more_images
    wl = criteria.wilson(round(6 * m / 100), round(7 * m / 100), z)[0]
    assert round(7 * m / 100) / m * (2 * wl - 1) > 0.03
    m -= 1
    wl = criteria.wilson(round(6 * m / 100), round(7 * m / 100), z)[0]
    assert not round(7 * m / 100) / m * (2 * wl - 1) > 0.03  # the fewest: one image fewer does not decide


def test_more_images_is_the_smallest_count_and_gives_up_at_the_limit():
    assert criteria._more_images(10, lambda m: m >= 1000) == 990
    assert criteria._more_images(10, lambda m: m >= 1001) == 991
    assert criteria._more_images(1, lambda m: m > 1 << 24) is None  # no practical number
    assert criteria._more_images(1, lambda m: m >= 1 << 24) == (1 << 24) - 1


def test_absolute_check_applies_the_statistic_and_the_per_output_tolerances():
    ref = np.array([[1.0, 100.0]])
    cand = np.array([[1.5, 100.2]])  # element 0: abs 0.5, rel 0.5; element 1: abs 0.2, rel 0.002
    gate = {**scaled_gate(), "criterion": "absolute", "atol": 0.3, "rtol": 0.01}
    assert not criteria.absolute_check([{"y": cand}], [{"y": ref}], gate, "y").passed  # element 0 fails both
    loose = {**gate, "atol": 0.3, "rtol": 1.0}
    assert criteria.absolute_check([{"y": cand}], [{"y": ref}], loose, "y").passed
    by_max = {**gate, "atol": 0.4, "rtol": 0.1, "check_error_stat": "max"}  # max abs 0.5 > 0.4 and max rel 0.5 > 0.1
    assert not criteria.absolute_check([{"y": cand}], [{"y": ref}], by_max, "y").passed
    assert criteria.absolute_check([{"y": cand}], [{"y": ref}],
                                   {**by_max, "check_error_stat": "elemwise", "atol": 0.45}, "y").passed is False
    median = {**gate, "atol": 0.3, "rtol": 0.1, "check_error_stat": "quantile", "error_quantile": 0.0}
    assert criteria.absolute_check([{"y": cand}], [{"y": ref}], median, "y").passed  # the smallest error
    assert not criteria.absolute_check([{"y": cand}], [{"y": ref}], {**median, "error_quantile": 1.0}, "y").passed
    per_output = {**gate, "atol": {"y": 0.1, "": 10.0}, "rtol": {"y": 0.001, "": 10.0}}
    assert criteria.absolute_check([{"y": cand}], [{"y": ref}], per_output, "y").mismatch_fraction == 1.0
    own_atol = {**gate, "atol": {"y": 0.3, "": 10.0}, "rtol": 0.001}  # element 1 (abs 0.2) is within y's own atol
    assert criteria.absolute_check([{"y": cand}], [{"y": ref}], own_atol, "y").mismatch_fraction == 0.5
    own_rtol = {**gate, "atol": 0.1, "rtol": {"y": 0.01, "": 10.0}}  # element 1 (rel 0.002) within y's own rtol
    assert criteria.absolute_check([{"y": cand}], [{"y": ref}], own_rtol, "y").mismatch_fraction == 0.5
    defaults = {**gate, "atol": {"other": 10.0}, "rtol": {"other": 10.0}}  # neither names y: Polygraphy's 1e-5
    assert criteria.absolute_check([{"y": cand}], [{"y": ref}], defaults, "y").mismatch_fraction == 1.0


def test_elementwise_relative_error_divides_by_the_reference_and_eps_only_at_zero():
    assert not criteria.elementwise_mismatch(np.array([1.0]), np.array([1.5]), 0.1, 1.0).any()  # rel 0.5 < 1
    assert not criteria.elementwise_mismatch(np.array([0.0]), np.array([0.5]), 0.1, 1e20).any()  # rel 0.5 / eps


def test_worst_batch_index_defaults():
    scaled = TensorCheck(passed=True, criterion="scaled", statistic="-")
    assert criteria.worst_batch_index(scaled, 1) == 0
    assert criteria.worst_batch_index(scaled.model_copy(update={"worst_image": 3}), 1) == 3
