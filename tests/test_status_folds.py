"""Every status fold and every signed statistic of the decision code, whatever the order of the inputs (issue 46).

A fold of check statuses into one verdict is FAILED over INCONCLUSIVE over PASSED. A slip that tests INCONCLUSIVE
first, or reads the statuses in another order, reads a failed check as inconclusive, which the default policy passes:
a planted one survived the whole suite in ``gate.py``. Each fold is checked here at the place it is made (the sub-checks
replaced by stand-ins that return every pair of statuses, in both orders), and the shared fold by a property.

A signed statistic is checked against its definition, said another way: the accuracy drop is the reference's accuracy
minus the candidate's (lost and gained swapped flips its sign and survived the gate's own tests).

Fast (NumPy only, no model): the mutation command (scripts/mutation.sh) runs this file.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from pipeline.core import verdicts
from pipeline.core.check_results import Bound, TaskCheck, TensorCheck
from pipeline.core.status import Status
from pipeline.evaluation import drift
from pipeline.precision import gate as criteria

FAST = settings(max_examples=80, deadline=None)
VERDICTS = (Status.PASSED, Status.INCONCLUSIVE, Status.FAILED)
RANK = {Status.PASSED: 0, Status.INCONCLUSIVE: 1, Status.FAILED: 2}


def oracle(statuses) -> Status:
    """The worst verdict, said as a maximum over a rank (the code says it as a loop)."""
    judged = [Status(s) for s in statuses if s in RANK]
    return max(judged, key=RANK.__getitem__, default=Status.PASSED)


@st.composite
def shuffled_statuses(draw):
    statuses = draw(st.lists(st.sampled_from([*VERDICTS, Status.SKIPPED, Status.ERROR]), max_size=8))
    return statuses, draw(st.permutations(statuses))


@FAST
@given(shuffled_statuses())
def test_the_shared_fold_is_the_worst_verdict_in_any_order(pair):
    statuses, reordered = pair
    assert verdicts.fold(statuses) == verdicts.fold(reordered) == oracle(statuses)


PAIRS = list(itertools.product(VERDICTS, repeat=2))  # every pair, so both orders of each


def _sub_check(status: Status) -> Bound:
    return Bound(status=status, value=0.0, threshold=0.0, more_images=0 if status != Status.INCONCLUSIVE else 10)


@pytest.mark.parametrize(("agreement", "drop"), PAIRS)
def test_the_task_check_folds_agreement_and_drop_in_any_order(monkeypatch, agreement, drop):
    monkeypatch.setattr(criteria, "agreement_check", lambda *a: _sub_check(agreement))
    monkeypatch.setattr(criteria, "accuracy_drop_check", lambda *a: _sub_check(drop))
    ref = np.array([[2.0, 0.0], [0.0, 2.0]])
    result = criteria.task_check(ref, ref, np.array([0, 1]), {"min_top1_agreement": 0.9, "max_accuracy_drop": 0.1},
                                 0.95)
    assert result.status == oracle([agreement, drop])
    assert result.passed is (result.status == Status.PASSED)


@pytest.mark.parametrize(("tensor", "task"), PAIRS)
def test_a_candidates_verdict_folds_tensor_and_task_checks_in_any_order(monkeypatch, tensor, task):
    """The tensor check is pass/fail; an inconclusive one (none today) must not pass either."""
    monkeypatch.setattr(criteria, "scaled_check", lambda *a, **k: TensorCheck(
        criterion="scaled", statistic="-", scale=1.0, passed=tensor == Status.PASSED))
    monkeypatch.setattr(criteria, "task_check", lambda *a, **k: TaskCheck(
        status=task, passed=task == Status.PASSED, samples=2, confidence=0.95, agreement=_sub_check(task),
        drop=_sub_check(task)))
    gate = {"criterion": "scaled", "error_quantile": 1.0, "max_scaled_error": 0.1}
    y = np.zeros((2, 3))
    result = criteria.judge([{"y": y}], [{"y": y}], np.array([0, 1]), gate, "y", 0.95)
    expected = oracle([Status.PASSED if tensor == Status.PASSED else Status.FAILED, task])
    assert result.status == expected and result.passed is (expected == Status.PASSED)


@pytest.mark.parametrize(("first", "second", "third"), list(itertools.product(VERDICTS, repeat=3)))
def test_a_baseline_comparison_folds_its_three_checks_in_any_order(monkeypatch, first, second, third):
    """compare's per-artifact verdict: agreement, accuracy and logit drift."""
    real = _compare_artifact()  # each check's record, its status replaced
    monkeypatch.setattr(drift, "agreement", lambda *a: real.agreement.model_copy(update={"status": first}))
    monkeypatch.setattr(drift, "accuracy_change", lambda *a: real.accuracy.model_copy(update={"status": second}))
    monkeypatch.setattr(drift, "drift_check", lambda *a: real.drift.model_copy(update={"status": third}))
    result = _compare_artifact()
    assert result.status == oracle([first, second, third])


def _compare_artifact() -> drift.ArtifactDrift:
    top1 = np.array([0, 1, 1])
    side = type("Top5", (), {"top1": top1, "logits": np.array([[2.0, 0.0], [0.0, 2.0], [0.0, 2.0]])})()
    t = type("Thresholds", (), {"min_top1_agreement": 0.9, "max_accuracy_drop": 0.1, "max_logit_drift": 1.0,
                                "drift_quantile": 0.99, "confidence": 0.95})()
    return drift.compare_artifact(side, side, top1, np.array(["a", "b", "c"]), ["x", "y"], 1.0, t)


# --------------------------------------------------------------------------- signed statistics


@st.composite
def paired_predictions(draw):
    n = draw(st.integers(1, 40))
    classes = draw(st.integers(2, 4))
    logits = arrays(np.float64, (n, classes), elements=st.floats(-4, 4, allow_nan=False))
    return draw(logits), draw(logits), np.array(draw(st.lists(st.integers(0, classes - 1), min_size=n, max_size=n)))


@FAST
@given(paired_predictions())
def test_the_accuracy_drop_is_the_references_accuracy_minus_the_candidates(case):
    ref, cand, labels = case
    gate = {"min_top1_agreement": 0.9, "max_accuracy_drop": 0.05}
    result = criteria.task_check(ref, cand, labels, gate, 0.95)
    ref_acc = np.mean(ref.argmax(1) == labels)  # ties: argmax and top1 pick the first, NaN is not drawn
    cand_acc = np.mean(cand.argmax(1) == labels)
    assert result.reference_accuracy == pytest.approx(ref_acc)
    assert result.accuracy == pytest.approx(cand_acc)
    assert result.accuracy_drop == pytest.approx(ref_acc - cand_acc, abs=1e-12)
    assert result.drop.value == pytest.approx(ref_acc - cand_acc, abs=1e-12)
    # Worse than the threshold: never passed. Counted in images, not in float accuracies (0.35 - 0.3 is not 0.05).
    lost_minus_gained = int((ref.argmax(1) == labels).sum()) - int((cand.argmax(1) == labels).sum())
    if lost_minus_gained > 0.05 * len(labels):
        assert result.drop.status != Status.PASSED


@FAST
@given(st.integers(0, 50), st.integers(0, 50), st.integers(0, 50))
def test_the_drop_check_is_signed_lost_minus_gained(lost, gained, same):
    n = lost + gained + same
    result = criteria.accuracy_drop_check(lost, gained, n, 0.05, criteria.z_value(0.95))
    assert result.value == pytest.approx((lost - gained) / n if n else 0.0)
    if gained >= lost:  # the candidate is at least as accurate: it never fails on accuracy
        assert result.status == Status.PASSED


@FAST
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 2), st.integers(0, 2)), min_size=1, max_size=40))
def test_comparisons_accuracy_change_is_the_baselines_accuracy_minus_the_runs(rows):
    base, run, labels = (np.array(column) for column in zip(*rows, strict=True))
    result = drift.accuracy_change(base, run, labels, 0.05, 0.95)
    base_acc, run_acc = np.mean(base == labels), np.mean(run == labels)
    assert result.baseline_accuracy == pytest.approx(base_acc) and result.accuracy == pytest.approx(run_acc)
    assert result.value == pytest.approx(base_acc - run_acc, abs=1e-12)
    assert result.lost == int(np.sum((base == labels) & (run != labels)))
    assert result.gained == int(np.sum((base != labels) & (run == labels)))


@FAST
@given(st.lists(st.floats(1.0, 1.1), min_size=5, max_size=30), st.floats(1.5, 4))  # spread below the factor
def test_a_latency_ratio_is_the_runs_over_the_baselines(samples, factor):
    """Slower now: a ratio above 1 (a swapped ratio would call a regression a speed-up)."""
    base = np.array(samples)
    result = drift.latency_check(base, base * factor, max_ratio=1.2, resamples=200, confidence=0.95, seed=0)
    assert result.ratio == pytest.approx(factor, rel=1e-9)
    assert result.status == Status.FAILED
    faster = drift.latency_check(base * factor, base, max_ratio=1.2, resamples=200, confidence=0.95, seed=0)
    assert faster.ratio == pytest.approx(1 / factor, rel=1e-9) and faster.status == Status.PASSED
