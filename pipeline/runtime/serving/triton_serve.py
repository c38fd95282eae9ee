"""A real Triton server on this machine (the ``tritonserver`` binary of the ``nvidia-pytriton`` wheel, Python backend),
its clients (``tritonclient`` over HTTP and gRPC), and client-side timing with perf_analyzer's method.

:func:`served` starts Triton through PyTriton on free loopback ports, binds one model (a Python callable over the
verified artifact's runner, behind Triton's dynamic batcher), waits until the server and the model are ready, and
always stops it: on return, on an exception (a failed check) and on Ctrl-C (the KeyboardInterrupt the command line's
handler raises unwinds through it). Nothing here reaches past 127.0.0.1.

:func:`measure` is perf_analyzer's method (closed loop at a fixed concurrency): a warm-up, then measurement windows
until three in a row agree within the stability percentage (or the trials run out), and percentiles over those three.
The ``serve`` extra (``nvidia-pytriton``, ``tritonclient[http,grpc]``) is imported lazily.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import sysconfig
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pipeline.core.errors import BackendUnavailable, StageFailed, check_interrupt, first_line
from pipeline.runtime.serving.triton import Model, numpy_dtype

log = logging.getLogger("pipeline")

LOOPBACK = "127.0.0.1"
INSTALL = "install the project's 'serve' extra (pip install -e '.[serve]'): nvidia-pytriton ships the tritonserver " \
          "binary with its Python backend, tritonclient the HTTP and gRPC clients"
PROTOCOLS = ("http", "grpc")


@dataclass(frozen=True)
class Server:
    """A running server: where to reach it and what it serves."""

    http: str  # "127.0.0.1:PORT"
    grpc: str
    model: Model
    version: str  # Triton's own version (server metadata)
    start_s: float  # from starting the server until the model was ready
    pid: int | None  # the tritonserver process
    models: dict[str, Model] = field(default_factory=dict)  # every model served, by name

    def url(self, protocol: str) -> str:
        return self.http if protocol == "http" else self.grpc


def available() -> str:
    """Why the server cannot start here ("" when it can): the ``serve`` extra's modules."""
    try:
        import pytriton.triton  # noqa: F401
        import tritonclient.grpc
        import tritonclient.http  # noqa: F401
    except ImportError as exc:
        return f"{first_line(exc)}; {INSTALL}"
    return ""


def free_ports(count: int) -> list[int]:
    """``count`` distinct free TCP ports on the loopback interface (bound once, then released for the server)."""
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(count):
            s = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            s.bind((LOOPBACK, 0))
            ports.append(s.getsockname()[1])
        return ports


@contextlib.contextmanager
def _stub_finds_this_python() -> Iterator[None]:
    """The Python backend's stub links ``libpython3.X.so``: put this interpreter's own first on the loader's path
    while the server starts (the wheel's stub otherwise takes the system's, whose C runtime may be older than this
    interpreter's standard library: a pyenv 3.11.7 beside Debian's 3.11.2 fails in multiprocessing)."""
    libdir, library = sysconfig.get_config_var("LIBDIR"), sysconfig.get_config_var("LDLIBRARY")
    before = os.environ.get("LD_LIBRARY_PATH")
    if libdir and library and ".so" in library and Path(libdir, library).is_file():
        os.environ["LD_LIBRARY_PATH"] = libdir + (os.pathsep + before if before else "")
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("LD_LIBRARY_PATH", None)
        else:
            os.environ["LD_LIBRARY_PATH"] = before


@contextlib.contextmanager
def served(models: Sequence[tuple[Model, Callable[[np.ndarray], np.ndarray]]], *, workspace: Path, log_file: Path,
           timeout_s: float = 120.0) -> Iterator[Server]:
    """Triton serving every ``(model, infer)`` on free loopback ports: ``infer`` maps a batch of the model's first
    input to its first output (with ``max_batch_size`` > 0, what Triton's dynamic batcher gathered; with 0, one
    request as sent). The server's own log goes to ``log_file``. Stopped whatever happens inside the ``with``."""
    reason = available()
    if reason:
        raise BackendUnavailable(f"cannot start Triton: {reason}")
    from pytriton.triton import Triton, TritonConfig

    http, grpc, metrics = free_ports(3)
    config = TritonConfig(http_address=LOOPBACK, http_port=http, grpc_address=LOOPBACK, grpc_port=grpc,
                          metrics_port=metrics, allow_metrics=False, allow_gpu_metrics=False, allow_cpu_metrics=False,
                          exit_timeout_secs=5, log_verbose=0, log_file=log_file.absolute())
    started = time.perf_counter()
    triton = Triton(config=config, workspace=workspace)
    model = models[0][0]
    try:
        for each, infer in models:
            _bind(triton, each, infer)
        with _stub_finds_this_python():
            triton.run()
        version = ""
        for each, _ in models:
            version = _wait_ready(f"{LOOPBACK}:{http}", each.name, timeout_s)
        server = Server(f"{LOOPBACK}:{http}", f"{LOOPBACK}:{grpc}", model, version, time.perf_counter() - started,
                        _server_pid(triton), {each.name: each for each, _ in models})
        log.info("deploy: Triton %s serving %s on http://%s and grpc %s (pid %s), ready in %.1f s", version,
                 ", ".join(each.name for each, _ in models), server.http, server.grpc, server.pid, server.start_s)
        yield server
    finally:
        triton.stop()
        log.info("deploy: Triton stopped")


def _bind(triton, model: Model, infer: Callable[[np.ndarray], np.ndarray]) -> None:
    """One model bound as the repository declares it: batched by Triton's dynamic batcher up to ``max_batch_size``,
    or (``max_batch_size`` 0) each request passed on as sent, its batch inside ``dims``."""
    from pytriton.decorators import batch
    from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor

    first_in, first_out = model.signature.inputs[0], model.signature.outputs[0]
    cut = 1 if model.max_batch_size > 0 else 0
    tensors = {"inputs": [Tensor(name=first_in.name, dtype=np.dtype(numpy_dtype(first_in)), shape=first_in.dims[cut:])],
               "outputs": [Tensor(name=first_out.name, dtype=np.dtype(numpy_dtype(first_out)),
                                  shape=first_out.dims[cut:])]}
    if model.max_batch_size > 0:
        @batch
        def batched(**inputs):
            return {first_out.name: np.ascontiguousarray(infer(inputs[first_in.name]))}

        triton.bind(model_name=model.name, infer_func=batched, **tensors, strict=True,
                    config=ModelConfig(max_batch_size=model.max_batch_size, batcher=DynamicBatcher(
                        preferred_batch_size=list(model.preferred_batch_sizes),
                        max_queue_delay_microseconds=model.max_queue_delay_us)))
        return

    def each_request(requests):
        return [{first_out.name: np.ascontiguousarray(infer(r[first_in.name]))} for r in requests]

    triton.bind(model_name=model.name, infer_func=each_request, **tensors, strict=True,
                config=ModelConfig(batching=False))


def _server_pid(triton) -> int | None:
    """The tritonserver process id, for the log (PyTriton keeps it on its private server handle)."""
    handle = getattr(getattr(triton, "_triton_server", None), "_tritonserver_running_cmd", None)
    return getattr(handle, "pid", None)


def _wait_ready(url: str, model: str, timeout_s: float) -> str:
    """Poll until the server is live and the model ready; the server's version. A server that does not come up in
    ``timeout_s`` is a :class:`StageFailed`."""
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(url)
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            check_interrupt()
            with contextlib.suppress(Exception):
                if client.is_server_ready() and client.is_model_ready(model):
                    return str(client.get_server_metadata().get("version", "?"))
            if time.monotonic() > deadline:
                raise StageFailed(f"Triton did not report {model} ready within {timeout_s:.0f} s")
            time.sleep(0.1)
    finally:
        client.close()


# --------------------------------------------------------------------------- clients


class Client:
    """One connection of one protocol: ``infer(batch) -> output``, the request shaped as the model declares it."""

    def __init__(self, server: Server, protocol: str, model: Model | None = None):
        import tritonclient.grpc as grpcclient
        import tritonclient.http as httpclient

        self.module = httpclient if protocol == "http" else grpcclient
        self.client = self.module.InferenceServerClient(server.url(protocol))
        self.model = model or server.model
        self.input, self.output = self.model.signature.inputs[0], self.model.signature.outputs[0]

    def infer(self, batch: np.ndarray) -> np.ndarray:
        request = self.module.InferInput(self.input.name, list(batch.shape), self.input.dtype.removeprefix("TYPE_"))
        request.set_data_from_numpy(np.ascontiguousarray(batch))
        wanted = self.module.InferRequestedOutput(self.output.name)
        return self.client.infer(self.model.name, [request], outputs=[wanted]).as_numpy(self.output.name)

    def close(self) -> None:
        self.client.close()


def _run_threads(work: Callable[[], None], count: int) -> None:
    threads = [threading.Thread(target=work, daemon=True) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        while thread.is_alive():
            thread.join(0.1)
            check_interrupt()


# --------------------------------------------------------------------------- perf_analyzer's method


@dataclass(frozen=True)
class PerfWindows:
    """perf_analyzer's measurement settings: ``warmup_s`` before measuring, windows of ``window_s``, stable when three
    consecutive windows' throughput and average latency are within ``stability`` (a fraction) of their mean, at most
    ``max_trials`` windows."""

    warmup_s: float = 0.5
    window_s: float = 1.0
    stability: float = 0.10
    max_trials: int = 10


@dataclass(frozen=True)
class Measurement:
    where: str  # "in-process", "http", "grpc"
    concurrency: int
    requests: int  # timed requests in the windows reported
    p50_ms: float
    p90_ms: float
    p95_ms: float
    p99_ms: float
    mean_ms: float
    throughput_per_s: float  # images/s (one image per request)
    windows: int  # measurement windows run
    stable: bool


def stable(windows: Sequence[tuple[float, float]], stability: float) -> bool:
    """perf_analyzer's rule on the last three windows (throughput, mean latency): each within ``stability`` of their
    mean."""
    if len(windows) < 3:
        return False
    last = windows[-3:]
    for column in (0, 1):
        values = [w[column] for w in last]
        mean = sum(values) / 3
        if mean <= 0 or any(abs(v - mean) > stability * mean for v in values):
            return False
    return True


def measure(make_send: Callable[[], tuple[Callable[[], None], Callable[[], None]]], *, where: str, concurrency: int,
            method: PerfWindows) -> Measurement:
    """Closed-loop timing: ``concurrency`` workers, each with its own ``(send, close) = make_send()``, sending back to
    back; latencies are taken by the client around each request."""
    done: list[tuple[float, float]] = []  # (end time, latency s) of every completed request
    stop = threading.Event()
    errors: list[BaseException] = []

    def work() -> None:
        send, close = make_send()
        try:
            while not stop.is_set():
                start = time.perf_counter()
                send()
                end = time.perf_counter()
                done.append((end, end - start))
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
            stop.set()
        finally:
            close()

    threads = [threading.Thread(target=work, daemon=True) for _ in range(concurrency)]
    for thread in threads:
        thread.start()
    try:
        _sleep(method.warmup_s, errors)
        bounds, windows = [], []
        for _ in range(method.max_trials):
            begin = time.perf_counter()
            _sleep(method.window_s, errors)
            end = time.perf_counter()
            latencies = [lat for t, lat in list(done) if begin <= t < end]
            bounds.append((begin, end))
            windows.append((len(latencies) / (end - begin), float(np.mean(latencies)) if latencies else 0.0))
            if stable(windows, method.stability):
                break
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
    if errors:
        raise StageFailed(f"{where} requests failed while timing: {first_line(errors[0])}")
    begin, end = bounds[-min(3, len(bounds))][0], bounds[-1][1]
    latencies = np.array([lat for t, lat in done if begin <= t < end]) * 1e3
    if not len(latencies):
        raise StageFailed(f"{where}: no request completed in {end - begin:.1f} s of timing")
    p50, p90, p95, p99 = np.percentile(latencies, [50, 90, 95, 99])
    return Measurement(where, concurrency, len(latencies), float(p50), float(p90), float(p95), float(p99),
                       float(latencies.mean()), len(latencies) / (end - begin), len(windows),
                       stable(windows, method.stability))


def _sleep(seconds: float, errors: list) -> None:
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline and not errors:
        check_interrupt()
        time.sleep(min(0.05, max(0.0, deadline - time.perf_counter())))


def client_sender(server: Server, protocol: str, image: np.ndarray, model: Model | None = None) -> Callable[[], tuple]:
    """``make_send`` for :func:`measure`: one client per worker, sending ``image`` (batch 1) to ``model`` (default:
    the first served)."""
    def make() -> tuple[Callable[[], None], Callable[[], None]]:
        client = Client(server, protocol, model)
        return (lambda: client.infer(image)), client.close

    return make
