"""The pass/fail rules of ``scripts/gpu_timing_check.py``: plain numbers in, a :class:`Check` out, so each rule is
tested in milliseconds (``tests/test_gpu_check_rules.py``). The measurements themselves need a GPU and live in the
script; docs/gpu-validation.md lists the questions."""

from __future__ import annotations

import math
from dataclasses import dataclass

from pipeline.core.status import Status


@dataclass(frozen=True)
class Tolerance:
    """Two timings agree when they differ by at most ``relative`` of the reference or ``absolute_ms``, the larger."""

    relative: float
    absolute_ms: float

    def allows(self, ours_ms: float, reference_ms: float) -> bool:
        return abs(ours_ms - reference_ms) <= max(self.relative * reference_ms, self.absolute_ms)


# The benchmark's timer (one sample per inference, one inference queued ahead) against CUDA events around K launches
# of the same work on the same stream: the same kernels, so only the per-sample event records (about a microsecond)
# and the median against a mean may separate them. The launch inside the pair, the defect this check is for, costs
# a graph launch (microseconds) to TensorRT's enqueue (tens of microseconds) per sample.
EVENTS_TOLERANCE = Tolerance(relative=0.05, absolute_ms=0.003)
# Against trtexec's computeMs (p50): another process and timing loop; the benchmark's own flag (trtexec.FLAG_RELATIVE).
TRTEXEC_TOLERANCE = Tolerance(relative=0.25, absolute_ms=0.02)
# Two runs of one engine (or one model) on one input: the same kernels, so the same numbers up to reduction order.
OUTPUT_RELATIVE = 1e-3
# trtexec warns "Throughput may be bound by Enqueue Time rather than GPU Compute" when the median enqueue time exceeds
# 0.8 x the median GPU compute time (TensorRT samples/common/sampleReporting.cpp, kENQUEUE_BOUND_REPORTING_THRESHOLD):
# then no queue depth hides the launch, and a GPU compute time includes the GPU waiting for the host.
ENQUEUE_BOUND = 0.8


@dataclass(frozen=True)
class Check:
    """One question of the GPU check: PASSED, FAILED, or SKIPPED (not run; ``detail`` says why)."""

    name: str
    status: Status
    detail: str


NOT_RUN = "not run"  # how a reference that could not be measured here begins ("not run: trtexec is not on PATH")


def agreement(name: str, ours_ms: float, reference: float | str, tolerance: Tolerance) -> Check:
    """Whether ``ours_ms`` agrees with ``reference`` (ms). A reference given as text is the reason it is missing:
    SKIPPED when it was not run here (:data:`NOT_RUN`), FAILED when it failed ("error: trtexec exited 1 ...").
    A timing that is not a positive finite number fails."""
    if isinstance(reference, str):
        return Check(name, Status.SKIPPED if reference.startswith(NOT_RUN) else Status.FAILED, reference)
    if not all(math.isfinite(v) and v > 0 for v in (ours_ms, reference)):
        return Check(name, Status.FAILED, f"not a positive timing: ours {ours_ms} ms, reference {reference} ms")
    detail = (f"ours {ours_ms:.4f} ms, reference {reference:.4f} ms ({(ours_ms - reference) / reference:+.1%}; "
              f"allowed {tolerance.relative:.0%} or {tolerance.absolute_ms} ms)")
    return Check(name, Status.PASSED if tolerance.allows(ours_ms, reference) else Status.FAILED, detail)


def same_outputs(name: str, max_abs_difference: float, reference_max_abs: float) -> Check:
    """Two runs of the same work agree to :data:`OUTPUT_RELATIVE` of the reference's largest magnitude."""
    allowed = OUTPUT_RELATIVE * max(reference_max_abs, 1.0)
    passed = math.isfinite(max_abs_difference) and max_abs_difference <= allowed
    return Check(name, Status.PASSED if passed else Status.FAILED,
                 f"max |difference| {max_abs_difference:.3g} (allowed {allowed:.3g})")


def all_known(name: str, unknown: list[str], total: int) -> Check:
    """The engine inspector told the precision of every matrix layer; the unknown ones are named."""
    if total == 0:
        return Check(name, Status.FAILED, "no matrix layer in the graph to read")
    detail = f"{total - len(unknown)} of {total} matrix layers read" + (f"; unknown: {', '.join(unknown[:10])}"
                                                                         if unknown else "")
    return Check(name, Status.FAILED if unknown else Status.PASSED, detail)


def enqueue_bound(enqueue_ms: float, compute_ms: float) -> bool:
    """trtexec's rule: the host's enqueue takes more than :data:`ENQUEUE_BOUND` of the GPU compute time."""
    return enqueue_ms > ENQUEUE_BOUND * compute_ms


ENQUEUE_BOUND_REASON = "inconclusive: enqueue-bound"  # how the detail of a timing check the host paced begins


def host_paced(check: Check, enqueue_ms: float, compute_ms: float) -> Check:
    """A timing check judged with trtexec's enqueue-bound rule (:func:`enqueue_bound`). When the host's enqueue of one
    inference takes more than :data:`ENQUEUE_BOUND` of its GPU compute time, no queue depth hides the launch: the
    GPU waits for the host, so the benchmark's timer and the events around K launches both measure the host's pace
    and agree whatever the GPU does. A check that PASSED then proves nothing: INCONCLUSIVE, both numbers named. An
    enqueue or compute time that is not a positive finite number is no evidence either way: INCONCLUSIVE too. A
    check that FAILED or was SKIPPED keeps its status."""
    if check.status != Status.PASSED:
        return check
    if not all(math.isfinite(v) and v > 0 for v in (enqueue_ms, compute_ms)):
        return Check(check.name, Status.INCONCLUSIVE, f"inconclusive: the enqueue time ({enqueue_ms} ms) or the GPU "
                                                      f"compute time ({compute_ms} ms) is unknown; {check.detail}")
    if not enqueue_bound(enqueue_ms, compute_ms):
        return check
    return Check(check.name, Status.INCONCLUSIVE,
                 f"{ENQUEUE_BOUND_REASON} (the host's enqueue {enqueue_ms:.4f} ms > {ENQUEUE_BOUND} x GPU compute "
                 f"{compute_ms:.4f} ms: the host sets the pace, so the timers agree whatever the GPU does); "
                 f"{check.detail}")


def exit_code(checks: list[Check]) -> int:
    """1 when a check failed; 3 when none failed but one did not run or was inconclusive (or there was none); 0 when
    all ran and passed."""
    if any(c.status == Status.FAILED for c in checks):
        return 1
    return 0 if checks and all(c.status == Status.PASSED for c in checks) else 3
