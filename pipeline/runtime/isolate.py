"""Native runtimes in a child process, in the spirit of Polygraphy's ``--use-subprocess``.

ONNX Runtime, TensorRT and the FP16 emulation are C++ libraries: a segfault in one of them
would kill the whole stage and leave no report. :class:`Isolated` is a runner (the contract of
:mod:`pipeline.runtime.runners`) whose real runner lives in a child process, ``python -m pipeline.runtime.isolate
<folder>``. The parent keeps the PyTorch model, the reference and the verdict; the child makes
the backend's runner from :data:`pipeline.runtime.backends.TABLE` (it never imports torch unless that
runner needs it) and answers requests. The child is forked from a fork server that has imported the runtimes once
(:mod:`pipeline.runtime.zygote`; milliseconds to start, not a new interpreter's 0.3-0.4 s), or started as a new
interpreter where the server cannot serve (``isolate.fork_server: false``). The requests:

* ``infer``: one feed in, its outputs back (verify);
* ``time``: the timing loop of :func:`pipeline.runtime.runners.measure` over one feed, the statistics
  back (benchmark), so inter-process traffic never enters a timing;
* ``layers``: the runtime's own account of the layers it ran on one feed (verify's precision manifest);
* ``batch_reason`` and ``stop``.

Arrays travel as ``.npz`` files in a temporary folder inside the run directory (removed when the
child ends); requests and replies are JSON lines on the child's stdin and on a copy of its
stdout. Before each step the child reports its phase ("creating the ONNX Runtime session"), so
when it dies the parent raises :class:`Crashed`: ``SIGSEGV while creating the ONNX Runtime
session``, with the last lines of its log. The child's stderr (and whatever its libraries print)
goes to ``logs/<stage>.<backend>.log`` in the run directory.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import OrderedDict
from pathlib import Path
from types import SimpleNamespace

import numpy as np
from polygraphy.backend.base import BaseRunner

from pipeline.core import artifacts, errors
from pipeline.core.errors import first_line
from pipeline.core.timings import Timing, TimingKind
from pipeline.runtime import zygote
from pipeline.runtime.isolate_messages import (
    BATCH_REASON,
    INFER,
    INFER_EACH,
    LAYERS,
    STOP,
    TIME,
    Answer,
    BackendRef,
    Job,
    Message,
    RemoteError,
    Request,
)
from pipeline.runtime.runners import Timed, TimingMethod, measure_or_error, to_numpy

JOB = "job.json"
TAIL_LINES = 15
DEFAULT_TIMEOUT_S = 300.0  # isolate.timeout_s: a TensorRT engine or an OpenVINO model may take minutes to load
STARTUP_S = 60.0  # importing a runtime and loading a model, on a busy machine, on top of the floor
SECONDS_PER_IMAGE = 0.25  # generous: a ResNet-50 at 224x224 on 2 CPU cores takes a tenth of a second


class Crashed(RuntimeError):
    """The child process died: by a signal (``SIGSEGV``) or an exit without a reply."""

    def __init__(self, how: str, phase: str, log: str, tail: list[str]):
        super().__init__(f"{how} while {phase}")
        self.how, self.phase, self.log, self.tail = how, phase, log, tail


class ChildError(RuntimeError):
    """A Python exception the child raised; the subclass carries its type's name (see :func:`_remote_error`)."""


def _remote_error(error: RemoteError) -> Exception:
    """The child's exception, as the same pipeline error, or a :class:`ChildError` named like the original."""
    if error.errno in errors.DISK_FULL_ERRNOS:  # the child's disk is full: the same OSError here
        return OSError(error.errno, error.message)
    cls = getattr(errors, error.type, None)
    if isinstance(cls, type) and issubclass(cls, errors.PipelineError) and cls is not errors.ConfigError:
        return cls(error.message)
    # A class of the same name keeps messages such as "RuntimeError: ..." (verify's error rows) unchanged.
    return type(error.type, (ChildError,), {})(error.message)


def how_it_ended(returncode: int) -> str:
    if returncode < 0:
        try:
            return signal.Signals(-returncode).name
        except ValueError:
            return f"signal {-returncode}"
    return f"exit code {returncode}"


def log_tail(path: Path, lines: int = TAIL_LINES) -> list[str]:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - 16384))
            text = f.read().decode("utf-8", errors="replace")
    except OSError:
        return []
    return [line.rstrip() for line in text.splitlines() if line.strip()][-lines:]


# --------------------------------------------------------------------------- parent side

class Isolated(Timed, BaseRunner):
    """``backend``'s runner, made and run in a child process; a crash there raises :class:`Crashed`.

    Attributes the reports read (``note``, ``precision``, ``workaround``) are the child runner's.
    ``startup_s`` is the time from starting the child to its runner being active.
    """

    def __init__(self, backend, ctx):
        super().__init__(name=backend.name)
        self.backend, self.ctx = backend, ctx
        self.log = artifacts.child_log(ctx.stage, backend.name)
        self.note, self.precision, self.workaround = "", None, ""
        self.proc = None

    # ------------------------------------------------------------------ lifetime

    def activate_impl(self):
        run_dir = self.ctx.run_dir
        self.folder = Path(tempfile.mkdtemp(prefix=artifacts.ISOLATE_PREFIX, dir=run_dir.path))
        self.calls, self.phase, self.torch_imported = 0, "starting the child process", None
        try:
            self._write_job()
            log_path = run_dir.file(self.log)
            log_path.parent.mkdir(exist_ok=True)
            fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o644)
            start = time.perf_counter()
            with os.fdopen(fd, "wb") as log_file:
                self.proc = self._start(log_file)
            info = self._reply()
            self.startup_s = time.perf_counter() - start
        except BaseException:
            self._end(kill=True)
            raise
        self.note, self.precision, self.workaround = info.note, info.precision, info.workaround

    def _start(self, log_file):
        """The child: forked from this process's fork server (:mod:`pipeline.runtime.zygote`), or a new interpreter
        where the server cannot serve or ``isolate.fork_server`` is off."""
        env = _child_env()
        if getattr(getattr(self.ctx.cfg, "isolate", None), "fork_server", True):
            forked = zygote.fork("pipeline.runtime.isolate", [str(self.folder)], env, log_file.fileno())
            if forked is not None:
                return forked
        return subprocess.Popen([sys.executable, "-m", "pipeline.runtime.isolate", str(self.folder)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log_file, env=env)

    def deactivate_impl(self):
        self._end(kill=False)

    def _end(self, kill: bool) -> None:
        """Stop the child (politely when it is idle, else kill it) and remove the temporary folder."""
        proc, self.proc = self.proc, None
        try:
            if proc is not None and proc.poll() is None:
                if not kill:
                    try:
                        self._send(proc, Request(STOP))
                        answer = self._read(proc).ok
                        self.torch_imported = answer.torch_imported if answer is not None else None
                    except (OSError, ValueError, Crashed):
                        kill = True
                if kill:
                    proc.kill()
                proc.wait(timeout=30)
            if proc is not None:
                proc.stdin.close()
                proc.stdout.close()
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)

    def _write_job(self) -> None:
        ctx, make = self.ctx, self.backend.make
        module = sys.modules.get(make.__module__)
        under_test = {}  # the graph under test it runs (verify's fallback rounds), as a file
        graph = self.backend.graph
        if graph in ctx.under_test:
            under_test[graph] = f"{graph}.onnx"
            (self.folder / under_test[graph]).write_bytes(ctx.under_test[graph].SerializeToString())
        job = Job(BackendRef(self.backend.name, make.__module__, getattr(module, "__file__", None)),
                  str(Path(ctx.run_dir.path).resolve()), ctx.stage, ctx.spec.to_json(), ctx.threads, ctx.gpu,
                  ctx.cfg.to_dict(), under_test)
        (self.folder / JOB).write_text(json.dumps(job.to_json()), encoding="utf-8")

    # ------------------------------------------------------------------ requests

    def _send(self, proc, request: Request) -> None:
        proc.stdin.write((json.dumps(request.to_json()) + "\n").encode())
        proc.stdin.flush()

    def _read(self, proc, deadline_s: float | None = None) -> Message:
        """The next reply; phases on the way are remembered; the end of the stream means the child died.

        A child that gives no reply within ``deadline_s`` (stopped, or a runtime that deadlocked) is killed,
        so verify and benchmark always end: its row says ``crashed: no answer in N s``.
        """
        deadline_s = self.deadline(None) if deadline_s is None else deadline_s
        fired = threading.Event()
        timer = threading.Timer(deadline_s, _kill_silent, (proc, fired))
        timer.daemon = True
        timer.start()
        try:
            for line in proc.stdout:
                message = Message.of(json.loads(line))
                if message.phase is not None:
                    self.phase = message.phase
                    continue
                return message
        finally:
            timer.cancel()
        code = proc.wait()
        if code == -signal.SIGINT:  # Ctrl-C reached the child first: the parent is being interrupted too
            raise KeyboardInterrupt
        how = f"no answer in {deadline_s:.0f} s" if fired.is_set() else how_it_ended(code)
        raise Crashed(how, self.phase, self.log, log_tail(self.ctx.run_dir.file(self.log)))

    def deadline(self, request: Request | None, batch: int = 0) -> float:
        """Seconds the child gets to answer ``request`` (None: starting its runner): ``isolate.timeout_s``, the
        floor, plus the work it was given: a minute to start; a quarter second per image; a timing's own length."""
        isolate = getattr(self.ctx.cfg, "isolate", None)
        floor = float(getattr(isolate, "timeout_s", DEFAULT_TIMEOUT_S))
        if request is None:
            return floor + STARTUP_S
        if request.op != TIME:
            return floor + batch * SECONDS_PER_IMAGE
        m = request.method
        if m.kind == "adaptive":  # the floor of runs, then at most the time cap
            timed = m.max_row_s + m.min_runs * batch * SECONDS_PER_IMAGE
        else:
            timed = m.trials * (m.min_duration_s + m.min_iterations * batch * SECONDS_PER_IMAGE)
        return floor + 4 * (m.warmup_s + timed)

    def _reply(self, deadline_s: float | None = None) -> Answer:
        proc = self.proc
        try:
            message = self._read(proc, deadline_s)
        except BaseException:
            self._end(kill=True)  # a dead or interrupted child: nothing more to ask it
            raise
        if message.error is not None:
            raise _remote_error(message.error)
        return message.ok

    def _call(self, request: Request, arrays: dict | None = None, images: int | None = None) -> Answer:
        if self.proc is None:
            raise RuntimeError(f"{self.name}: the child process has ended")
        if arrays is not None:
            _save(self.folder / "in.npz", arrays)
        if images is None:
            images = len(next(iter(arrays.values()))) if arrays else 0
        try:
            self._send(self.proc, request)
        except OSError:
            pass  # it died: _reply says how
        return self._reply(self.deadline(request, images))

    def infer_impl(self, feed_dict):
        self.calls += 1
        info = self._call(Request(INFER, call=self.calls), feed_dict)
        self.inference_time = info.inference_time
        return _load(self.folder / "out.npz")

    def infer_each(self, feeds: list[dict]) -> list[OrderedDict]:
        """Each feed its own inference in the child, all in one request (:func:`runners.infer_all`)."""
        first, self.calls = self.calls + 1, self.calls + len(feeds)
        arrays = {f"{i}/{name}": np.asarray(value) for i, feed in enumerate(feeds) for name, value in feed.items()}
        images = sum(len(next(iter(feed.values()))) for feed in feeds)
        self._call(Request(INFER_EACH, call=first, feeds=len(feeds)), arrays, images)
        return _split(_load(self.folder / "out.npz"), len(feeds))

    def infer(self, feed_dict, check_inputs=True):
        # The child's runner checks the inputs against its own metadata.
        return super().infer(feed_dict, check_inputs=False)

    def batch_reason(self, batch: int) -> str:
        return self._call(Request(BATCH_REASON, batch=batch)).reason

    def layers(self, feed: dict) -> list[dict]:
        """The child runner's account of the layers it ran on ``feed`` (``[]`` when its runtime gives none)."""
        return self._call(Request(LAYERS), feed).layers

    def measurements(self, feed: dict, method: TimingMethod) -> list[tuple[Timing, dict]]:
        info = self._call(Request(TIME, method=method), feed)
        return [(Timing(TimingKind(kind), label), m) for kind, label, m in info.timings]

    def timers(self, feed: dict, throughput: bool = True):
        raise NotImplementedError("an isolated runner times in its child: use measurements(feed, method)")


def _kill_silent(proc, fired: threading.Event) -> None:
    """The deadline's end: SIGKILL (it also ends a child stopped with SIGSTOP)."""
    fired.set()
    try:
        proc.kill()
    except OSError:
        pass  # it ended meanwhile


def _child_env() -> dict:
    """The parent's environment, with this package importable wherever the parent found it."""
    root = str(Path(__file__).resolve().parents[2])
    path = os.environ.get("PYTHONPATH", "")
    return {**os.environ, "PYTHONPATH": root + (os.pathsep + path if path else ""), "PYTHONUNBUFFERED": "1"}


def _save(path: Path, arrays: dict) -> None:
    """Names travel beside the arrays: ONNX names may hold characters a zip member name should not."""
    names = list(arrays)
    arrays = {f"a{i}": np.asarray(arrays[n]) for i, n in enumerate(names)}
    np.savez(path, __names__=np.array(json.dumps(names)), **arrays)


def _split(arrays: OrderedDict, count: int) -> list[OrderedDict]:
    """``{"<i>/<name>": array}`` as one ``{name: array}`` per feed ``i`` (ONNX names may hold ``/``; ``i`` cannot)."""
    feeds = [OrderedDict() for _ in range(count)]
    for key, value in arrays.items():
        i, name = key.split("/", 1)
        feeds[int(i)][name] = value
    return feeds


def _load(path: Path) -> OrderedDict:
    with np.load(path, allow_pickle=False) as f:
        names = json.loads(str(f["__names__"]))
        return OrderedDict((n, f[f"a{i}"]) for i, n in enumerate(names))


# --------------------------------------------------------------------------- child side


class _Child:
    """The child's end: make the runner, then answer requests until ``stop`` or the end of stdin."""

    def __init__(self, folder: Path, channel):
        self.folder, self.channel = folder, channel

    def send(self, message: Message) -> None:
        self.channel.write(json.dumps(message.to_json()) + "\n")
        self.channel.flush()

    def phase(self, text: str) -> None:
        print(f"[pipeline.runtime.isolate] {text}", file=sys.stderr, flush=True)  # the log's tail, if it crashes next
        self.send(Message(phase=text))

    def error(self, exc: BaseException) -> None:
        import traceback

        traceback.print_exc(file=sys.stderr)
        self.send(Message(error=RemoteError(type(exc).__name__, first_line(exc), getattr(exc, "errno", None))))

    def serve(self, requests) -> int:
        job = Job.of(json.loads((self.folder / JOB).read_text(encoding="utf-8")))
        self.phase("loading the backend table")
        try:
            backend = find_backend(job.backend)
            ctx = _context(job, self.folder)
            self.phase(f"creating the {backend.runtime} session")
            runner = backend.make(ctx)
            runner.activate()
        except Exception as exc:
            self.error(exc)
            return 1
        self.send(Message(ok=Answer(note=getattr(runner, "note", "") or "",
                                    precision=getattr(runner, "precision", None),
                                    workaround=getattr(runner, "workaround", "") or "")))
        try:
            for line in requests:
                request = Request.of(json.loads(line))
                if request.op == STOP:
                    break
                try:
                    self.send(Message(ok=getattr(self, "do_" + request.op)(runner, request)))
                except Exception as exc:
                    self.error(exc)
        finally:
            self.phase("releasing the runner")
            runner.deactivate()
        self.send(Message(ok=Answer(torch_imported="torch" in sys.modules)))
        return 0

    def do_infer(self, runner, request: Request) -> Answer:
        feed = _load(self.folder / "in.npz")
        self.phase(f"running inference on batch {request.call}")
        outputs = runner.infer(feed)
        self.phase(f"writing the outputs of batch {request.call}")
        _save(self.folder / "out.npz", {k: to_numpy(v) for k, v in outputs.items()})
        return Answer(inference_time=runner.inference_time)

    def do_infer_each(self, runner, request: Request) -> Answer:
        feeds = _split(_load(self.folder / "in.npz"), request.feeds)
        outputs = {}
        for i, feed in enumerate(feeds):
            self.phase(f"running inference on batch {request.call + i}")
            outputs.update((f"{i}/{k}", np.array(to_numpy(v))) for k, v in runner.infer(feed).items())  # a copy
        self.phase(f"writing the outputs of batches {request.call}-{request.call + len(feeds) - 1}")
        _save(self.folder / "out.npz", outputs)
        return Answer()

    def do_layers(self, runner, request: Request) -> Answer:
        feed = _load(self.folder / "in.npz")
        self.phase("reading the runtime's account of its layers")
        return Answer(layers=runner.layers(feed) if hasattr(runner, "layers") else [])

    def do_batch_reason(self, runner, request: Request) -> Answer:
        return Answer(reason=runner.batch_reason(request.batch))

    def do_time(self, runner, request: Request) -> Answer:
        feed = _load(self.folder / "in.npz")
        batch = len(next(iter(feed.values())))
        method = request.method
        self.phase(f"preparing to time batch {batch}")
        timings = []
        for timing, run_once in runner.timers(feed, throughput=method.throughput):
            self.phase(f"timing batch {batch} ({timing.label})")
            # one failed timing is its own row
            timings.append((timing.kind, timing.label, measure_or_error(run_once, method)))
        return Answer(timings=timings)


def runner_for(backend, ctx):
    """The runner verify and benchmark use: ``backend.make(ctx)`` in this process, or in a child process
    when the backend runs a native runtime (:attr:`Backend.isolated`) and the context isolates."""
    if backend.isolated and ctx.isolate:
        return Isolated(backend, ctx)
    return backend.make(ctx)


def find_backend(where: BackendRef):
    """The table entry named ``where.name`` in the module that defines its ``make`` (``pipeline.runtime.backends``,
    or a module loaded from its file: a backend a test or a user adds to the table)."""
    import importlib
    import importlib.util

    from pipeline.runtime import backends

    name, module_name = where.name, where.module
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        if not where.file:
            raise
        spec = importlib.util.spec_from_file_location(module_name, where.file)
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
    for entry in [*getattr(module, "TABLE", []), *backends.TABLE]:
        if isinstance(entry, backends.Backend) and entry.name == name:
            return entry
    raise KeyError(f"no backend {name!r} in {module_name}.TABLE")


def _context(job: Job, folder: Path):
    from pipeline.core import onnx_io
    from pipeline.core.run import RunDir
    from pipeline.runtime.backends import Context

    under_test = {precision: onnx_io.load(folder / name, f"{precision.upper()} ONNX model")
                  for precision, name in job.under_test.items()}
    # The parent validated the config; read-only attribute access is all a runner needs, and skipping
    # pydantic (import and validation) saves a tenth of a second of every child's start.
    cfg = json.loads(json.dumps(job.config), object_hook=lambda d: SimpleNamespace(**d))
    spec = SimpleNamespace(**job.spec)  # the parent's CardSpec, its fields as attributes, the same way
    return Context(cfg, RunDir(job.run_dir, create=False), job.stage, spec,
                   threads=job.threads, gpu=job.gpu, under_test=under_test, isolate=False)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # Replies go to a copy of stdout; fd 1 itself goes to the log, so whatever a library prints cannot
    # corrupt them. Ctrl-C is the parent's to handle: it stops this child.
    channel = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    return _Child(Path(argv[0]), channel).serve(sys.stdin)


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # the parent has every reply: skip the interpreter's teardown (a tenth of a second)
