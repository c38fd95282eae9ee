"""The project's exceptions. The CLI maps each class to its exit code, in one place.

=====  ==========================================================================
code   meaning
=====  ==========================================================================
0      every stage that ran succeeded; every required verify candidate passed
1      a check failed: verify's gate, or train's learning check (not above chance,
       below ``train.min_val_accuracy``)
2      usage, configuration or input error (bad key, unknown model, missing or
       corrupt stage input, bad data, unusable run directory)
3      a backend the user required (``require: [tensorrt]``) is unavailable
4      any other runtime failure; the message names the stage and the cause
5      the gate could not decide: a gating candidate's task check is inconclusive on the
       images it had (only with ``verify.inconclusive: fail``; the message says how many
       more images would decide it); or tune's timings could not decide (a sanity pair
       timed apart, or the speed gate's interval holds ``tune.min_speedup``)
130    interrupted (Ctrl-C / SIGTERM); the stage is marked ``interrupted``
=====  ==========================================================================
"""

from __future__ import annotations

import errno
import threading

EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_USAGE = 2
EXIT_BACKEND_UNAVAILABLE = 3
EXIT_RUNTIME = 4
EXIT_INCONCLUSIVE = 5
EXIT_INTERRUPTED = 130


# Set by the command line's SIGINT/SIGTERM handler, which also raises KeyboardInterrupt. A signal that
# lands while Python runs a finalizer (__del__, a weakref callback) raises there, where Python prints
# "Exception ignored" and carries on: long loops call check_interrupt() so Ctrl-C always stops them.
interrupt_requested = threading.Event()


def check_interrupt() -> None:
    if interrupt_requested.is_set():
        raise KeyboardInterrupt


def exit_code(exc: BaseException) -> int:
    """The exit code a command ends with, for the exception that ended it (the one mapping; the CLI words it):
    the user's interrupt first, whatever carries it (130); then the project's own error, by its class; anything else
    is a runtime failure (4), a full disk included."""
    if is_interrupt(exc):
        return EXIT_INTERRUPTED
    if isinstance(exc, PipelineError):
        return exc.exit_code
    return EXIT_RUNTIME


def is_interrupt(exc: BaseException) -> bool:
    """Whether ``exc`` is the user's Ctrl-C or SIGTERM, whatever it looks like by now: a KeyboardInterrupt in its
    cause/context chain, or any exception raised after the signal handler set :data:`interrupt_requested`. Native
    libraries (OpenVINO, ONNX Runtime, torch) turn a KeyboardInterrupt raised inside their Python callbacks into their
    own exception, and keep only its name in the message (OpenVINO's ``RuntimeError: ... KeyboardInterrupt``)."""
    if interrupt_requested.is_set():
        return True
    seen, visited = exc, set()
    while seen is not None and id(seen) not in visited:
        visited.add(id(seen))
        if isinstance(seen, KeyboardInterrupt):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


class PipelineError(Exception):
    """Base class. ``str(err)`` is the one line shown to the user."""

    exit_code = EXIT_RUNTIME


class UsageError(PipelineError):
    """The user asked for something that cannot work as asked."""

    exit_code = EXIT_USAGE


class ConfigError(UsageError):
    """One or more configuration problems, all collected before any work starts."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        super().__init__("; ".join(self.problems))


class InputError(UsageError):
    """A stage input is missing, corrupt or does not fit (the fix is on the user's side)."""


class DataError(InputError):
    """The data set cannot be read: message names the file or folder."""


class CheckFailed(PipelineError):
    """A check failed: the precision gate, or train's learning check."""

    exit_code = EXIT_CHECK_FAILED


class Inconclusive(PipelineError):
    """The precision gate could not decide on the images it had (``verify.inconclusive: fail``), or tune's timings
    could not decide (undecided: docs/verify.md)."""

    exit_code = EXIT_INCONCLUSIVE


class BackendUnavailable(PipelineError):
    """A backend the user required (``require``) cannot run on this machine."""

    exit_code = EXIT_BACKEND_UNAVAILABLE


class StageFailed(PipelineError):
    """A stage failed at run time for a reason that is not the user's input."""

    exit_code = EXIT_RUNTIME


_DISK_FULL = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded"}
DISK_FULL_ERRNOS = tuple(_DISK_FULL)


def disk_full(exc: BaseException) -> StageFailed | None:
    """A full disk or exhausted quota anywhere in ``exc``'s chain, as one line; else None.

    Artifacts are written through ``run.atomic_path``, which says so itself; this catches the
    writes around them (metrics.jsonl, TensorBoard events, temporary files of the libraries).
    """
    seen = disk_full_cause(exc)
    if seen is None:
        return None
    what = _DISK_FULL.get(getattr(seen, "errno", None), _DISK_FULL[errno.ENOSPC])
    where = f" while writing {seen.filename}" if isinstance(seen, OSError) and seen.filename else ""
    return StageFailed(f"{what}{where}; free space and re-run")


def disk_full_cause(exc: BaseException) -> BaseException | None:
    """The exception in ``exc``'s chain that is a full disk or exhausted quota: an ``OSError`` with that errno, or
    a library's own error that only says so in words (torch.save raises a bare RuntimeError "... os error 28")."""
    seen, visited = exc, set()
    while seen is not None and id(seen) not in visited:
        visited.add(id(seen))
        if isinstance(seen, OSError) and seen.errno in _DISK_FULL:
            return seen
        if "No space left on device" in str(seen) or "os error 28" in str(seen):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def first_line(exc: BaseException) -> str:
    """The first non-empty line of an exception's message ("" when it has none): one line for one error."""
    return next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
