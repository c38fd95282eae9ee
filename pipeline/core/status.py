"""Every status the pipeline writes: a verdict (verify, benchmark's verify column, the reports) or a stage's
state in the manifest. A :class:`~enum.StrEnum`, so a status is its own JSON string and the files read the same."""

from __future__ import annotations

from enum import StrEnum


class Status(StrEnum):
    # verdicts of a candidate, a check, a comparison
    PASSED = "passed"
    FAILED = "failed"
    INCONCLUSIVE = "inconclusive"  # the evidence shows neither (a confidence bound on each side)
    SKIPPED = "skipped"  # not run here, with a reason
    CRASHED = "crashed"  # its native runtime killed its child process
    NOT_VERIFIED = "not verified"  # benchmark: no verdict recorded for this artifact
    MISSING = "missing"  # compare: what the baseline judged has no current, passing verdict in this run
    ERROR = "error"
    # the calibration stability certificate (pipeline.precision.stability); FAILED when its deployed draw fails
    CERTIFIED = "certified"  # every calibration draw passes
    UNSTABLE = "unstable"  # some draws fail; the policy (verify.int8.min_pass_share) allows it
    LUCKY = "lucky"  # the deployed draw passes, but fewer draws than the policy asks for
    # a stage in the manifest
    RUNNING = "running"
    OK = "ok"
    INTERRUPTED = "interrupted"
