"""The GPU check's pass/fail rules (pipeline.runtime.speed.gpu_check): decisions on plain numbers, in milliseconds."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.core.status import Status
from pipeline.runtime.speed import gpu_check
from pipeline.runtime.speed.gpu_check import EVENTS_TOLERANCE, TRTEXEC_TOLERANCE, Check


@pytest.mark.parametrize("ours, reference, status", [
    (0.100, 0.100, Status.PASSED),
    (0.1049, 0.100, Status.PASSED),
    (0.0951, 0.100, Status.PASSED),
    (0.1051, 0.100, Status.FAILED),
    (0.0029 + 0.02, 0.02, Status.PASSED),  # small: the absolute bound is the larger
    (0.0031 + 0.02, 0.02, Status.FAILED),
    (0.217, 0.200, Status.FAILED),  # TensorRT's enqueue inside the pair (+17 us on the virtual device)
    (0.0, 0.1, Status.FAILED), (math.nan, 0.1, Status.FAILED), (0.1, math.inf, Status.FAILED),
])
def test_the_timer_agrees_with_events_around_k_launches(ours, reference, status):
    assert gpu_check.agreement("t", ours, reference, EVENTS_TOLERANCE).status == status


def test_trtexec_s_tolerance_is_the_benchmark_s_flag():
    from pipeline.runtime.speed import trtexec

    assert TRTEXEC_TOLERANCE.relative == trtexec.FLAG_RELATIVE
    assert gpu_check.agreement("t", 1.25, 1.0, TRTEXEC_TOLERANCE).status == Status.PASSED
    assert gpu_check.agreement("t", 1.26, 1.0, TRTEXEC_TOLERANCE).status == Status.FAILED
    assert gpu_check.agreement("t", 0.74, 1.0, TRTEXEC_TOLERANCE).status == Status.FAILED


def test_a_reference_not_run_is_skipped_and_one_that_failed_fails():
    check = gpu_check.agreement("t", 1.0, "not run: trtexec is not on PATH", TRTEXEC_TOLERANCE)
    assert check == Check("t", Status.SKIPPED, "not run: trtexec is not on PATH")
    failed = gpu_check.agreement("t", 1.0, "error: trtexec exited 1: [E] out of memory", TRTEXEC_TOLERANCE)
    assert failed.status == Status.FAILED and "out of memory" in failed.detail


def test_same_outputs_and_all_known():
    assert gpu_check.same_outputs("o", 0.0, 5.0).status == Status.PASSED
    assert gpu_check.same_outputs("o", 0.005, 5.0).status == Status.PASSED
    assert gpu_check.same_outputs("o", 0.0051, 5.0).status == Status.FAILED
    assert gpu_check.same_outputs("o", math.nan, 5.0).status == Status.FAILED
    assert gpu_check.all_known("i", [], 20).status == Status.PASSED
    failed = gpu_check.all_known("i", ["/a/MatMul"], 20)
    assert failed.status == Status.FAILED and "19 of 20" in failed.detail and "/a/MatMul" in failed.detail
    assert gpu_check.all_known("i", [], 0).status == Status.FAILED


def test_enqueue_bound_is_trtexec_s_rule():
    assert not gpu_check.enqueue_bound(0.08, 0.1)
    assert gpu_check.enqueue_bound(0.0801, 0.1)


TIMES = st.floats(min_value=1e-6, max_value=1e3, allow_nan=False)


@given(TIMES, TIMES, st.sampled_from(list(Status)))
def test_host_paced_never_passes_an_enqueue_bound_timing_and_never_upgrades(enqueue, compute, status):
    """trtexec's rule on a timing check: a PASSED check becomes INCONCLUSIVE exactly when the enqueue exceeds 0.8 x
    the GPU compute time (the reason and both numbers in its detail); any other status is kept."""
    judged = gpu_check.host_paced(Check("t", status, "agreement"), enqueue, compute)
    if status == Status.PASSED and enqueue > 0.8 * compute:
        assert judged.status == Status.INCONCLUSIVE
        assert judged.detail.startswith(gpu_check.ENQUEUE_BOUND_REASON) and judged.detail.endswith("agreement")
        assert f"{enqueue:.4f}" in judged.detail and f"{compute:.4f}" in judged.detail
    else:
        assert judged == Check("t", status, "agreement")


@pytest.mark.parametrize("enqueue, compute", [(math.nan, 1.0), (0.1, math.inf), (0.0, 1.0), (0.1, -1.0)])
def test_host_paced_without_a_usable_enqueue_or_compute_time_is_inconclusive(enqueue, compute):
    assert gpu_check.host_paced(Check("t", Status.PASSED, ""), enqueue, compute).status == Status.INCONCLUSIVE


def test_an_inconclusive_check_is_exit_3():
    assert gpu_check.exit_code([Check("a", Status.PASSED, ""), Check("b", Status.INCONCLUSIVE, "")]) == 3


@pytest.mark.parametrize("statuses, code", [
    ([Status.PASSED, Status.PASSED], 0), ([Status.PASSED, Status.SKIPPED], 3), ([Status.SKIPPED, Status.FAILED], 1),
    ([Status.PASSED, Status.FAILED], 1), ([], 3)])
def test_exit_code(statuses, code):
    assert gpu_check.exit_code([Check(str(i), s, "") for i, s in enumerate(statuses)]) == code
