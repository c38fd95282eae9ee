"""A backend whose child process kills itself with SIGSEGV, for tests/test_isolate.py.

``TABLE`` holds the ``onnxrt_fp16_cpu`` entry (verify's ``onnxrt_fp16_cpu``) with a runner that crashes
where ``CRASH_AT`` says: ``start`` (while the session is created), ``infer`` (the first inference) or
``time`` (the first timed run); ``stop`` stops itself with SIGSTOP at the first
inference (a hang); ``raise`` raises a Python exception instead (an error, not a
crash). The child process finds it here by its ``make``'s module and file.
"""

import dataclasses
import os
import signal

from pipeline.runtime import backends
from pipeline.runtime.runners import CPU_WALL_CLOCK

REAL = backends.by_name("onnxrt_fp16_cpu")


def _segfault(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGSEGV)


def _stop(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGSTOP)  # a runtime that hangs: no answer, ever


def crashing_make(ctx):
    if os.environ.get("CRASH_AT") == "start":
        _segfault()
    if os.environ.get("CRASH_AT") == "raise":
        raise RuntimeError("provider exploded")
    runner = REAL.make(ctx)
    if os.environ.get("CRASH_AT") == "infer":
        runner.infer_impl = _segfault
    if os.environ.get("CRASH_AT") == "stop":
        runner.infer_impl = _stop
    if os.environ.get("CRASH_AT") == "time":
        runner.timers = lambda feed, throughput=True: [(CPU_WALL_CLOCK, _segfault)]
    return runner


TABLE = [dataclasses.replace(REAL, make=crashing_make)]
