"""Verdicts as plain data: how statuses fold, and what an inconclusive verdict counts as.

Every consumer of a verdict (verify's exit code, the summary, benchmark's "fastest that passed", baseline, compare,
tune and the reports) asks this module, so "inconclusive" means one thing everywhere: under
``verify.inconclusive: pass`` (the default) an inconclusive gating candidate is deployable, and every consumer
says it passed only because the bound could not decide; under ``fail`` it is not deployable.

Pure functions of plain values: no I/O, no model runs (tested with properties and the mutation command).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

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
