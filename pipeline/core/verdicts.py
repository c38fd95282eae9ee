"""Verdicts as plain data: how statuses fold, and what an inconclusive verdict counts as.

Every consumer of a verdict (verify's exit code, the summary, benchmark's "fastest that passed", baseline, compare,
tune and the reports) asks this module, so "inconclusive" means one thing everywhere: under
``verify.inconclusive: pass`` (the default) an inconclusive gating candidate is deployable, and every consumer
says it passed only because the bound could not decide; under ``fail`` it is not deployable.

Pure functions of plain values: no I/O, no model runs (tested with properties and the mutation command).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Generic, Literal, Protocol, TypeVar

from pipeline.core.errors import (
    EXIT_BACKEND_UNAVAILABLE,
    EXIT_CHECK_FAILED,
    EXIT_INCONCLUSIVE,
    EXIT_OK,
    EXIT_RUNTIME,
)
from pipeline.core.status import Status

InconclusivePolicy = Literal["pass", "fail"]

JUDGED = frozenset({Status.PASSED, Status.FAILED, Status.INCONCLUSIVE})  # a comparison reached a verdict
# How bad each verdict is when several are folded into one: failed beats inconclusive beats passed.
SEVERITY = {Status.PASSED: 0, Status.INCONCLUSIVE: 1, Status.FAILED: 2}


def fold(statuses: Iterable[str]) -> Status:
    """The verdict of several judged checks: failed if any failed, else inconclusive if any was, else passed
    (nothing judged: passed). A status that is not a verdict (skipped, error) is not counted here."""
    worst = Status.PASSED
    for status in statuses:
        if status in SEVERITY and SEVERITY[Status(status)] > SEVERITY[worst]:
            worst = Status(status)
    return worst


def counts_as_passed(status: str, inconclusive: InconclusivePolicy) -> bool:
    """Whether a verdict lets its artifact be deployed: passed, or inconclusive under ``verify.inconclusive:
    pass``."""
    return status == Status.PASSED or (status == Status.INCONCLUSIVE and inconclusive == "pass")


def passed_undecided(status: str, inconclusive: InconclusivePolicy) -> bool:
    """Deployable only because the task check's bound could not decide (a summary says so)."""
    return status == Status.INCONCLUSIVE and counts_as_passed(status, inconclusive)


def report_standing(stage_status: str | None, exit_code: int | None, recorded_sha256: str | None,
                    file_sha256: str) -> str | None:
    """Why verify's report (``verify.json``) does not stand for the run, as a phrase; None when it does. It stands
    only as the file a verify that finished wrote: the stage ended ok or failed its gate (exit 1: every verdict was
    reached), and the file still has the sha256 that stage recorded. The one check of compare, baseline, deploy and
    the report."""
    if stage_status is None:
        return "the manifest records no verify"
    if not (stage_status == Status.OK or (stage_status == Status.FAILED and exit_code == EXIT_CHECK_FAILED)):
        return f"the last verify did not finish (it is {stage_status})"
    if recorded_sha256 is None:
        return "the manifest does not record it as written by verify"
    if recorded_sha256 != file_sha256:
        return "its sha256 differs from the one verify recorded (edited or replaced since)"
    return None


# --------------------------------------------------------------------------- the gate's verdict over candidates


class Judged(Protocol):
    """What the verdict reads of one candidate (verify's ``Check``; a plain row in tests)."""

    @property
    def name(self) -> str: ...

    @property
    def status(self) -> str: ...

    @property
    def gates(self) -> bool: ...  # its verdict decides the exit code (verify.gate); else reported only

    @property
    def required(self) -> bool: ...  # the user required its backend (--require): it must run

    @property
    def after_fallback(self) -> bool: ...  # skipped because a fallback replaced its artifact (judged again later)


C = TypeVar("C", bound=Judged)


@dataclass(frozen=True)
class Verdict(Generic[C]):
    """The gate's verdict over the candidates of one verify run."""

    passed: bool
    ran: int = 0  # gating candidates that were compared
    failed: list[C] = field(default_factory=list)
    errors: list[C] = field(default_factory=list)  # gating candidates that errored or crashed: no verdict on them
    missing_required: list[C] = field(default_factory=list)  # required, and could not run here
    inconclusive: list[C] = field(default_factory=list)  # gating candidates the task check could not decide
    deployable: list[str] = field(default_factory=list)  # gating candidates whose verdict counts as passed
    undecided: list[str] = field(default_factory=list)  # deployable only because the bound could not decide
    reported_only: list[str] = field(default_factory=list)


def verdict(checks: Sequence[C], inconclusive: InconclusivePolicy = "pass") -> Verdict[C]:
    """The gate's verdict over the gating candidates; the others are reported only. A required candidate that could
    not run fails the gate whether it gates or not; a gating candidate that errored or crashed fails it too (nothing
    was compared, so nothing was shown to be sound)."""
    gating = [c for c in checks if c.gates]
    failed = [c for c in gating if c.status == Status.FAILED]
    errors = [c for c in gating if c.status in (Status.ERROR, Status.CRASHED)]
    undecided = [c for c in gating if c.status == Status.INCONCLUSIVE]
    missing = [c for c in checks if c.required and c.status == Status.SKIPPED and not c.after_fallback]
    passed = not failed and not errors and not missing and all(counts_as_passed(c.status, inconclusive)
                                                              for c in undecided)
    return Verdict(passed, sum(1 for c in gating if c.status in JUDGED), failed, errors, missing, undecided,
                   deployable=[c.name for c in gating if counts_as_passed(c.status, inconclusive)],
                   undecided=[c.name for c in gating if passed_undecided(c.status, inconclusive)],
                   reported_only=[c.name for c in checks if not c.gates])


class Outcome(Enum):
    """What a verify run ends in, most serious first; each has its exit code (pipeline.core.errors)."""

    MISSING_REQUIRED = EXIT_BACKEND_UNAVAILABLE  # a backend the user required could not run: 3
    FAILED = EXIT_CHECK_FAILED  # a gating candidate failed: 1
    ERRORS = EXIT_RUNTIME  # a gating candidate errored or crashed, none failed: 4
    INCONCLUSIVE = EXIT_INCONCLUSIVE  # undecided under verify.inconclusive: fail: 5
    PASSED = EXIT_OK


def outcome(v: Verdict) -> Outcome:
    """The one outcome of a verdict: a missing required backend before a failure (the user asked for it), a failure
    before an error (a shown fault is the stronger finding), an error before an undecided check."""
    if v.missing_required:
        return Outcome.MISSING_REQUIRED
    if v.failed:
        return Outcome.FAILED
    if v.errors:
        return Outcome.ERRORS
    if v.inconclusive and not v.passed:
        return Outcome.INCONCLUSIVE
    return Outcome.PASSED


def round_passed(statuses: Sequence[str], inconclusive: InconclusivePolicy) -> bool:
    """A fallback round's re-check: every gating candidate that runs the remade graph passed or was skipped
    (inconclusive as the policy says), and at least one of them reached a verdict."""
    return all(s == Status.SKIPPED or counts_as_passed(s, inconclusive) for s in statuses) and \
        any(s in JUDGED for s in statuses)
