"""One runner contract for verify and benchmark: Polygraphy's, plus a timing hook.

A runner is a context manager with ``infer(feed_dict) -> OrderedDict[name, array]`` and a
``name`` (Polygraphy's ``BaseRunner``); every state it builds on activation is dropped again on
deactivation. Each runner here adds the timing hook benchmark uses (:class:`Timed`):
``timers(feed)`` returns zero-argument callables, each named by a :class:`~pipeline.core.timings.Timing`
(its kind, which decisions read, and its label, which people read), that each run one inference and
return its latency in milliseconds (wall clock around a synchronous call on the CPU; CUDA
events on the GPU, optionally over a CUDA graph), and ``batch_reason(batch)`` says why a batch
size cannot run ("" when it can). Call both only while the runner is active.

ONNX Runtime and TensorRT are Polygraphy's own runners with the hook added; PyTorch and the
strict FP16 emulation get small runners here, because Polygraphy's PyTorch runner is unusable
(it returns a tuple, never sets its timing and hard-codes ``.cuda()``). Which runner serves
which backend is :mod:`pipeline.runtime.backends`' table.

Engines are only ever deserialized through :func:`pipeline.runtime.builders.tensorrt_engine.load_engine_bytes`, which
checks the sidecar first.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import re
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Literal

import numpy as np
import onnx
from polygraphy.backend.base import BaseRunner
from polygraphy.backend.onnxrt import OnnxrtRunner
from polygraphy.backend.trt import TrtRunner  # imports TensorRT lazily, on activation
from polygraphy.common import TensorMetadata

# Polygraphy prints INFO lines for every session and comparison; the pipeline reports itself. ERROR stays:
# Polygraphy forwards TensorRT's own ERROR and INTERNAL_ERROR messages (and the ONNX parser's errors) there,
# and a failure without them says only "Invalid Engine" (pipeline.build also keeps the whole log).
from polygraphy.logger import G_LOGGER

from pipeline.core import env
from pipeline.core.errors import first_line
from pipeline.core.timings import Timing, TimingKind
from pipeline.runtime import folding
from pipeline.runtime.speed import stopping
from pipeline.runtime.speed.stopping import StopRule
from pipeline.runtime.tensorrt_calls import TensorrtCallFailed, checked  # noqa: F401

G_LOGGER.module_severity = G_LOGGER.ERROR

if TYPE_CHECKING:  # type-checked against tensorrt-stubs (tests/test_typecheck.py); never imported at run time
    import tensorrt as trt

    from pipeline.core.engine_sidecar import ProfileShapes

CPU_WALL_CLOCK = Timing(TimingKind.CPU_CALL, "wall-clock, synchronous CPU call")
QUEUED_AHEAD = "CUDA events, one inference queued ahead"  # how every "GPU compute" row is timed
Timers = list[tuple[Timing, Callable[[], float]]]


def host_ms() -> float:
    """The host's clock for "host latency" (ms). The tests' virtual CUDA device replaces it with its own."""
    return time.perf_counter() * 1000.0


def cpu_timer(fn, *args) -> Callable[[], float]:
    """One synchronous call of ``fn(*args)``, timed with the wall clock, in ms."""
    def run_once() -> float:
        t = time.perf_counter()
        fn(*args)
        return (time.perf_counter() - t) * 1000.0

    return run_once


class QueuedAheadTimer:
    """GPU compute of one inference (ms): CUDA events on ``stream`` around one ``launch()``, with one inference
    queued ahead of the start event.

    Every timed sample ends with a synchronize, so without the inference ahead the start event would fire on an
    idle stream, at once, and the kernels only once the host had launched them: the pair would bracket the launch
    too (``cudaGraphLaunch``; TensorRT's enqueue loop and the Python output-allocator callback Polygraphy sets on
    every ``infer``; eager PyTorch's dispatch). With an inference queued ahead, the start event fires when that
    one ends, by which time the host has launched the timed one, so the pair brackets kernels only, whenever a
    launch takes the host less time than the inference takes the GPU. trtexec does the same: its inference loop
    (TensorRT ``samples/common/sampleInference.cpp``, ``IterationBase``, depth ``1 + overlap``) enqueues the next
    inference before it waits for the previous one. When the launch takes longer than the GPU work no queue
    depth can hide it (trtexec then warns "Throughput may be bound by Enqueue Time"): the number then includes
    the GPU waiting for the host, as trtexec's does. ``launch`` must enqueue on the current stream.
    """

    def __init__(self, launch: Callable[[], object], stream):
        import torch

        self.launch, self.stream = launch, stream
        self.start, self.end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def __call__(self) -> float:
        import torch

        with torch.cuda.stream(self.stream):
            self.launch()  # queued ahead, not timed: the start event waits behind it
            self.start.record(self.stream)
            self.launch()
            self.end.record(self.stream)
        self.end.synchronize()
        return self.start.elapsed_time(self.end)


def cuda_timers(forward, x_host, cuda_graphs: bool) -> Timers:
    """GPU compute (CUDA events, input already on the device) and host latency (with both copies)."""
    import torch

    x_dev = x_host.to("cuda")
    stream = torch.cuda.Stream()
    compute = lambda: forward(x_dev)  # noqa: E731
    if cuda_graphs:
        with torch.cuda.stream(stream):
            for _ in range(3):
                forward(x_dev)  # warm up before capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream, capture_error_mode="thread_local"):
            static_out = forward(x_dev)

        def compute():
            graph.replay()
            return static_out
    gpu_compute = QueuedAheadTimer(compute, stream)
    pinned = x_host.pin_memory()

    def host_latency() -> float:
        t = host_ms()
        with torch.cuda.stream(stream):
            x_dev.copy_(pinned, non_blocking=True)
            compute().float().cpu()
        stream.synchronize()
        return host_ms() - t

    label = " with CUDA graphs" if cuda_graphs else ""
    gpu, host = (TimingKind.GPU_COMPUTE_CUDA_GRAPHS, TimingKind.HOST_LATENCY_CUDA_GRAPHS) if cuda_graphs else \
        (TimingKind.GPU_COMPUTE, TimingKind.HOST_LATENCY)
    return [(Timing(gpu, f"GPU compute ({QUEUED_AHEAD}, device-resident input){label}"), gpu_compute),
            (Timing(host, f"host latency (H2D + compute + D2H){label}"), host_latency)]


ONE_LINE_CHARS = 400


def one_line(exc: BaseException) -> str:
    """``Type: the message on one line``: how a failed measurement is reported. The whole reason, not its first
    line: OpenVINO's first line is only where it was raised (``Exception from src/inference/src/cpp/core.cpp:117:``),
    which is dropped; the cause follows."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    text = " ".join(line for line in lines if not re.fullmatch(r"Exception from \S+:\d+:", line)) or lines[0]
    return f"{type(exc).__name__}: {text[:ONE_LINE_CHARS]}{' ...' if len(text) > ONE_LINE_CHARS else ''}"


def measure_or_error(run_once: Callable[[], float], method: TimingMethod) -> dict:
    """:func:`measure`, or ``{"error": one line}`` when a run fails (CUDA out of memory, a failed launch)."""
    try:
        return measure(run_once, method)
    except Exception as exc:
        return {"error": one_line(exc)}


@dataclass
class TimingMethod:
    """How benchmark times one backend (its ``benchmark`` config values).

    ``kind="fixed"``: ``trials`` trials, each of at least ``min_iterations`` runs and ``min_duration_s`` seconds (tune
    and the speed checks time this way). ``kind="adaptive"``: runs until :mod:`pipeline.runtime.speed.stopping`'s rule
    stops them: at least ``min_runs``, then until the median's 95 % interval is within ``± target_halfwidth`` or
    ``max_row_s`` timed seconds have passed."""

    warmup_s: float
    min_iterations: int
    min_duration_s: float
    trials: int
    cv_warn: float
    kind: Literal["fixed", "adaptive"] = "fixed"
    min_runs: int = 20
    target_halfwidth: float = 0.05
    max_row_s: float = 1.0
    throughput: bool = True  # a runner's async-throughput timer too (OpenVINO's), beside its latency timer

    @property
    def rule(self) -> StopRule:
        return StopRule(min_runs=self.min_runs, target_halfwidth=self.target_halfwidth, max_s=self.max_row_s)


def measure(run_once: Callable[[], float], method: TimingMethod) -> dict:
    """Time ``run_once`` (which runs one inference and returns its latency in ms).

    One untimed first run (lazy initialisation), warm-up for ``warmup_s``, then the timed runs of the method's kind
    (:class:`TimingMethod`). ``stop`` says how many runs were timed, their median and its 95 % interval, and why timing
    stopped (``"trials done"`` for the fixed method)."""
    start = time.perf_counter()
    first_ms = run_once()
    init_s = time.perf_counter() - start
    end = time.perf_counter() + method.warmup_s
    warmup_runs = 0
    while time.perf_counter() < end:
        run_once()
        warmup_runs += 1
    samples, trials, stop = _adaptive(run_once, method) if method.kind == "adaptive" else _fixed(run_once, method)
    return {"samples": samples, "trials": trials, "first_run_ms": first_ms, "init_s": init_s,
            "warmup_runs": warmup_runs, "cv_warning": any(t["cv"] > method.cv_warn for t in trials), "stop": stop}


def _trial(runs: list[float]) -> dict:
    mean = float(np.mean(runs))
    cv = float(np.std(runs, ddof=1) / mean) if len(runs) > 1 and mean > 0 else 0.0
    return {"mean_ms": mean, "p50_ms": float(np.median(runs)), "cv": cv, "iterations": len(runs)}


def _fixed(run_once: Callable[[], float], method: TimingMethod) -> tuple[list[float], list[dict], dict]:
    samples, trials = [], []
    for _ in range(method.trials):
        trial: list[float] = []
        t0 = time.perf_counter()
        while len(trial) < method.min_iterations or time.perf_counter() - t0 < method.min_duration_s:
            trial.append(run_once())
        samples += trial
        trials.append(_trial(trial))
    interval = stopping.median_interval(samples)
    return samples, trials, stopping.record(stopping.Decision(True, "trials done", len(samples), interval))


def _adaptive(run_once: Callable[[], float], method: TimingMethod) -> tuple[list[float], list[dict], dict]:
    """Runs until the stop rule says enough: the time cap is looked at after every run, the interval at the
    checkpoints :func:`pipeline.runtime.speed.stopping.next_check` spaces 10 % apart."""
    rule, samples = method.rule, []
    check = rule.min_runs
    t0 = time.perf_counter()
    while True:
        samples.append(run_once())
        elapsed = time.perf_counter() - t0
        if len(samples) < check and not (elapsed >= rule.max_s and len(samples) >= rule.min_runs):
            continue
        decision = stopping.decide(samples, elapsed, rule)
        if decision.stop:
            return samples, [_trial(samples)], stopping.record(decision)
        check = stopping.next_check(len(samples))


class Timed:
    """The timing hook every runner here adds to Polygraphy's contract (use while active)."""

    # A workaround this runner applies to its runtime (recorded in the reports); "" for none.
    workaround = ""

    def batch_reason(self, batch: int) -> str:
        """Why ``batch`` images cannot run in one call ("" when they can)."""
        return ""

    def timers(self, feed: dict, throughput: bool = True) -> Timers:
        """Labelled callables, each running one inference on ``feed`` and returning its latency (ms); with
        ``throughput=False``, no async-throughput timer (a runner that has one: OpenVINO)."""
        return [(CPU_WALL_CLOCK, cpu_timer(self.infer, feed))]  # type: ignore[attr-defined]

    def measurements(self, feed: dict, method: TimingMethod) -> list[tuple[Timing, dict]]:
        """Every timing of ``feed``: ``(timing, measure(...))`` per timer. benchmark calls this, so a runner
        in a child process (:class:`pipeline.runtime.isolate.Isolated`) runs the timing loop there."""
        return [(timing, measure_or_error(run_once, method))
                for timing, run_once in self.timers(feed, throughput=method.throughput)]


def tf32_words(tf32: bool) -> str:
    """How a CUDA FP32 row says its TF32 state (the engines' ``build.tf32``, which the PyTorch FP32 rows follow)."""
    return f"TF32 {'on' if tf32 else 'off'} (build.tf32: {str(tf32).lower()}, as the TensorRT engines)"


@contextlib.contextmanager
def cuda_fp32_precision(tf32: bool):
    """cuDNN convolutions and CUDA matmuls in FP32 computed with TF32 (``tf32``) or in full FP32 (``"ieee"``), through
    PyTorch's per-backend ``fp32_precision`` (the legacy ``allow_tf32`` flags must not be mixed with it); restored
    afterwards. PyTorch's own defaults differ per backend: cuDNN convolutions TF32, matmuls full FP32."""
    import torch

    settings = (torch.backends.cudnn.conv, torch.backends.cuda.matmul)
    saved = [backend.fp32_precision for backend in settings]
    try:
        for backend in settings:
            backend.fp32_precision = "tf32" if tf32 else "ieee"
        yield
    finally:
        for backend, value in zip(settings, saved, strict=True):
            backend.fp32_precision = value


class TorchRunner(Timed, BaseRunner):
    """Runs an ``nn.Module`` (eval mode, no grad), optionally under autocast or compiled, on CPU or CUDA. On CUDA its
    FP32 arithmetic uses TF32 only when ``tf32`` says so (the engines' ``build.tf32``; PyTorch's default runs cuDNN
    convolutions in TF32), so the "PyTorch FP32" GPU row is like for like with the engines, and says which."""

    def __init__(self, model, *, name: str, input_name: str, output_name: str, input_shape: tuple,
                 device: str = "cpu", autocast_dtype=None, channels_last: bool = False, compile: bool = False,
                 cuda_graphs: bool = False, tf32: bool = False):
        super().__init__(name=name)
        self.tf32 = tf32
        if device == "cuda":
            self.note = tf32_words(tf32)
        self.model = model
        self.input_name = input_name
        self.output_name = output_name
        self.input_shape = input_shape
        self.device = device
        self.autocast_dtype = autocast_dtype
        self.channels_last = channels_last
        self.compile = compile
        self.cuda_graphs = cuda_graphs
        # A detector's outputs after the first (pipeline.core.tasks): the module names them (``output_names``).
        self.extra_outputs: tuple[str, ...] = tuple(getattr(model, "output_names", ())[1:])

    @property
    def precision(self) -> str:
        import torch

        return {None: "fp32", torch.bfloat16: "bf16 autocast", torch.float16: "fp16 autocast"}[self.autocast_dtype]

    def activate_impl(self):
        import torch

        if self.device == "cuda":
            self._precision = cuda_fp32_precision(self.tf32)
            self._precision.__enter__()
        module = self.model.to(self.device).eval()
        if self.channels_last:
            module = module.to(memory_format=torch.channels_last)
        self.module = torch.compile(module) if self.compile else module

    def get_input_metadata_impl(self):
        return TensorMetadata().add(self.input_name, dtype=np.float32, shape=(None, *self.input_shape))

    def _input(self, array):
        import torch

        x = torch.as_tensor(array)
        return x.contiguous(memory_format=torch.channels_last) if self.channels_last else x

    def _forward(self, x):
        import torch

        with torch.inference_mode(), torch.autocast(
            x.device.type, dtype=self.autocast_dtype or torch.float32, enabled=self.autocast_dtype is not None
        ):
            return self.module(x)

    def infer_impl(self, feed_dict):
        import torch

        x = self._input(torch.as_tensor(feed_dict[self.input_name]).to(self.device))
        start = time.perf_counter()
        out = self._forward(x)
        # A detector returns (head, detections): named as its graph's outputs (pipeline.core.tasks), head first.
        outs = [o.float() for o in out] if isinstance(out, tuple) else [out.float()]
        if outs[0].device.type == "cuda":
            torch.cuda.synchronize()
        self.inference_time = time.perf_counter() - start
        names = [self.output_name, *self.extra_outputs]
        return OrderedDict((name, o.cpu().numpy()) for name, o in zip(names, outs, strict=False))

    def timers(self, feed: dict, throughput: bool = True) -> Timers:
        x = self._input(feed[self.input_name])
        if self.device == "cpu":
            return [(CPU_WALL_CLOCK, cpu_timer(self._forward, x))]
        return cuda_timers(self._forward, x, self.cuda_graphs)

    def deactivate_impl(self):
        del self.module
        precision = self.__dict__.pop("_precision", None)
        if precision is not None:
            precision.__exit__(None, None, None)


class ReferenceRunner(Timed, BaseRunner):
    """``onnx.reference.ReferenceEvaluator`` over a model: NumPy semantics, FP16 computed in FP16."""

    def __init__(self, model, *, name: str):
        super().__init__(name=name)
        self.model = model

    def activate_impl(self):
        from onnx.reference import ReferenceEvaluator

        self.evaluator = ReferenceEvaluator(self.model)
        initializers = {t.name for t in self.model.graph.initializer}
        self.inputs = [i for i in self.model.graph.input if i.name not in initializers]
        self.output_names = [o.name for o in self.model.graph.output]

    def get_input_metadata_impl(self):
        meta = TensorMetadata()
        for value in self.inputs:
            dims = [d.dim_value if d.HasField("dim_value") else None for d in value.type.tensor_type.shape.dim]
            meta.add(value.name, dtype=np.float32, shape=dims)
        return meta

    def infer_impl(self, feed_dict):
        start = time.perf_counter()
        outputs = self.evaluator.run(None, dict(feed_dict))
        self.inference_time = time.perf_counter() - start
        return OrderedDict((n, np.asarray(o)) for n, o in zip(self.output_names, outputs, strict=True))

    def deactivate_impl(self):
        del self.evaluator, self.inputs, self.output_names


class OrtRunner(Timed, OnnxrtRunner):
    """Polygraphy's ``OnnxrtRunner`` that refuses a silent CPU fallback and can pin the thread count.

    ``threads=None`` keeps ONNX Runtime's defaults (Polygraphy's ``SessionFromOnnx``); a number
    sets the intra-op threads (one inter-op thread), as benchmark records them.
    ``disabled_optimizers`` names graph optimizers to leave out (ONNX Runtime's own argument);
    the runner then records them in ``workaround``.
    """

    def __init__(self, model: str | Path | bytes, *, name: str, providers: list[str] | None = None,
                 threads: int | None = None, disabled_optimizers: tuple[str, ...] = (), optimize: bool = True):
        from polygraphy.backend.onnxrt import SessionFromOnnx

        self.providers = providers or ["cpu"]
        source = str(model) if isinstance(model, Path) else model
        self._settings = (source, self.providers, threads, disabled_optimizers, optimize)  # for layers()
        session = SessionFromOnnx(source, providers=self.providers) \
            if threads is None and not disabled_optimizers and optimize \
            else (lambda: _ort_session(source, self.providers, threads, disabled_optimizers, optimize))
        super().__init__(session, name=name)
        if disabled_optimizers:
            self.workaround = (f"ONNX Runtime optimizer(s) {', '.join(disabled_optimizers)} disabled: "
                               + "; ".join(DISABLED_BECAUSE.get(o, "") for o in disabled_optimizers))

    def activate_impl(self):
        super().activate_impl()
        if "cuda" in self.providers and not ort_session_uses(self.sess, "CUDAExecutionProvider"):
            del self.sess
            raise RuntimeError("ONNX Runtime fell back to the CPU: the CUDA provider failed to load")

    def infer_impl(self, feed_dict):
        """Polygraphy's, minus its check for PyTorch tensors, which imports torch (a second of an isolated
        child's start-up) to learn that NumPy arrays are not tensors."""
        if not all(isinstance(v, np.ndarray) for v in feed_dict.values()):
            return super().infer_impl(feed_dict)
        start = time.perf_counter()
        outputs = self.sess.run(None, dict(feed_dict))
        self.inference_time = time.perf_counter() - start
        return OrderedDict((node.name, out) for node, out in zip(self.sess.get_outputs(), outputs, strict=True))

    def timers(self, feed: dict, throughput: bool = True) -> Timers:
        label = Timing(TimingKind.HOST_LATENCY, "host latency (H2D + compute + D2H), ONNX Runtime CUDA") \
            if "cuda" in self.providers else CPU_WALL_CLOCK
        return [(label, cpu_timer(self.sess.run, None, feed))]

    def layers(self, feed: dict) -> list[dict]:
        """ONNX Runtime's own account of the nodes it ran on ``feed`` (its profiler, on a second session with this
        one's options: :func:`pipeline.runtime.profiling.layer_account.ort_layers`)."""
        from pipeline.runtime.profiling import layer_account

        def make(options):
            return _ort_session(*self._settings, options=options)

        return [layer.to_json() for layer in layer_account.ort_layers(make, feed)]


# ONNX Runtime's NchwcTransformer dereferences a null pointer on a dynamic-shape Transpose -> Cast(fp16->fp32)
# -> MatMul chain on x86-64 with AVX-512 (microsoft/onnxruntime#28392, closed without a fix; present in 1.24
# and 1.32): an FP16 transformer encoder segfaults while the CPU session is created at ORT_ENABLE_ALL.
FP16_CPU_DISABLED_OPTIMIZERS = ("NchwcTransformer",)
# ONNX Runtime's WeightBiasQuantization turns a Q/DQ Conv's float bias into an int32 bias with scale
# x_scale * w_scale. On ModelOpt's INT8 graph the bias and both scales are FP16 (scale products near 5e-5,
# below FP16's normal range), and the result no longer computes the graph's arithmetic: on a trained ResNet-18
# (32 px) the logits moved up to 14.7 from the exact Q/DQ execution (top-1 agreement 93 %); without it, 0.19.
INT8_CPU_DISABLED_OPTIMIZERS = ("WeightBiasQuantization", "NchwcTransformer")
# Per lower-precision graph on the CPU provider: the optimizers its CPU deployment turns off.
CPU_DISABLED_OPTIMIZERS = {"fp16": FP16_CPU_DISABLED_OPTIMIZERS, "int8": INT8_CPU_DISABLED_OPTIMIZERS}
DISABLED_BECAUSE = {"NchwcTransformer": "it crashes ONNX Runtime's CPU provider on FP16 graphs "
                                        "(microsoft/onnxruntime#28392); the other optimizations stay on",
                    "WeightBiasQuantization": "on an INT8 graph with FP16 biases and scales it changes the result "
                                              "(up to 14.7 logits on ResNet-18); int8 Q/DQ fusion stays on"}


def _ort_session(source, providers: list[str], threads: int | None, disabled_optimizers: tuple[str, ...] = (),
                 optimize: bool = True, options=None):
    import onnxruntime as ort

    options = options or ort.SessionOptions()
    if not optimize:  # every node computed as the graph writes it (the INT8 Q/DQ graph's exact execution)
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    if threads is not None:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    options.log_severity_level = 3
    names = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}
    extra = {"disabled_optimizers": list(disabled_optimizers)} if disabled_optimizers else {}
    return ort.InferenceSession(source, options, providers=[names.get(p, p) for p in providers], **extra)


def onnxrt_runner(model: str | Path | bytes, *, name: str, providers: list[str] | None = None,
                  threads: int | None = None, disabled_optimizers: tuple[str, ...] = (),
                  optimize: bool = True) -> OrtRunner:
    """ONNX Runtime over a path or serialized model (see :class:`OrtRunner`); ``optimize=False``: ORT_DISABLE_ALL."""
    return OrtRunner(model, name=name, providers=providers, threads=threads, disabled_optimizers=disabled_optimizers,
                     optimize=optimize)


def ort_session_uses(session_or_runner, provider: str) -> bool:
    sess = getattr(session_or_runner, "sess", session_or_runner)
    return provider in sess.get_providers()


class CudaMemory:
    """Where :class:`TensorrtRunner` keeps its tensors: torch CUDA tensors, pinned host buffers.

    The one seam the contract tests replace (``tests/fake_tensorrt.py``), with CPU tensors whose lifetimes
    a recording fake of TensorRT checks; nothing else in the pipeline swaps it.
    """

    device = "cuda"

    def tensor(self, host: np.ndarray):
        import torch

        return torch.from_numpy(np.ascontiguousarray(host)).to(self.device)

    def empty(self, shape: tuple, dtype):
        import torch

        return torch.empty(shape, dtype=dtype, device=self.device)

    def pinned(self, host: np.ndarray):
        import torch

        return torch.from_numpy(np.ascontiguousarray(host)).pin_memory()

    def pinned_empty(self, shape: tuple, dtype):
        import torch

        return torch.empty(shape, dtype=dtype, pin_memory=True)


DEVICE_MEMORY = CudaMemory()


def trt_module():
    import tensorrt

    return tensorrt


def _numpy_dtype(trt_dtype):
    from polygraphy.datatype import DataType

    return DataType.to_dtype(DataType.from_dtype(trt_dtype, source_module="tensorrt"), "numpy")


def check_dtypes(engine: trt.ICudaEngine, arrays: dict) -> None:
    """Every input's dtype is the engine's (``get_tensor_dtype``): TensorRT reads raw bytes, so FP32 bytes bound to
    an FP16 input would be read as garbage without an error. Raises :class:`TensorrtCallFailed` naming both."""
    for name, dtype in arrays.items():
        expected = np.dtype(_numpy_dtype(engine.get_tensor_dtype(name)))
        if np.dtype(dtype) != expected:
            raise TensorrtCallFailed(f"input {name!r} is {np.dtype(dtype).name} but the engine expects "
                                     f"{expected.name} (engine.get_tensor_dtype)")


def _torch_dtype(trt_dtype):
    from polygraphy.datatype import DataType

    return DataType.to_dtype(DataType.from_dtype(trt_dtype, source_module="tensorrt"), "torch")


class BoundEngine:
    """An execution context of its own, every I/O buffer bound with ``set_tensor_address``: what the timing launches.

    Polygraphy's ``TrtRunner.infer`` calls ``set_output_allocator`` on every call and TensorRT calls that Python
    allocator back from inside ``execute_async_v3`` (polygraphy 0.53.6, ``backend/trt/runner.py``): fine for
    verify, host work in the way of a timing. Here both buffers are bound once and ``enqueue`` is
    ``execute_async_v3`` alone. Every buffer bound to the context is an attribute of this object, so it lives
    exactly as long as the context; every bool the bindings return is checked; three warm-up enqueues on its own
    (non-blocking) stream, because TensorRT sets itself up on the first enqueues of a context.
    """

    def __init__(self, engine: trt.ICudaEngine, *, input_name: str, output_name: str, host: np.ndarray):
        import torch

        self.context: trt.IExecutionContext = engine.create_execution_context()
        if not self.context:
            raise TensorrtCallFailed("TensorRT could not create an execution context (its log above says why)")
        check_dtypes(engine, {input_name: host.dtype})
        self.input = DEVICE_MEMORY.tensor(host)
        checked(self.context.set_input_shape(input_name, tuple(self.input.shape)),
                f"set_input_shape({input_name!r}, {tuple(self.input.shape)})")
        dims = self.context.get_tensor_shape(output_name)
        self.shape = tuple(int(dims[i]) for i in range(len(dims)))
        self.output = DEVICE_MEMORY.empty(self.shape, _torch_dtype(engine.get_tensor_dtype(output_name)))
        for name, tensor in ((input_name, self.input), (output_name, self.output)):
            checked(self.context.set_tensor_address(name, tensor.data_ptr()), f"set_tensor_address({name!r})")
        self.stream = torch.cuda.Stream()
        with torch.cuda.stream(self.stream):
            for _ in range(3):
                self.enqueue()
        self.stream.synchronize()
        self.gpu_compute = QueuedAheadTimer(self.enqueue, self.stream)

    def enqueue(self) -> None:
        import torch

        checked(self.context.execute_async_v3(torch.cuda.current_stream().cuda_stream), "execute_async_v3")

    def close(self) -> None:
        """The context first, then the buffers bound to it."""
        for name in ("gpu_compute", "context", "input", "output"):
            self.__dict__.pop(name, None)


class GraphedEngine(BoundEngine):
    """``execute_async_v3`` captured in a CUDA graph: the one thing Polygraphy's ``TrtRunner`` cannot do.

    A :class:`BoundEngine` (own context, bound buffers, warmed up) whose enqueue is captured in thread-local mode
    on its stream; a capture that fails raises. The "host latency" copies go into ``self.input``, the very buffer
    bound with ``set_tensor_address``.
    """

    def __init__(self, engine: trt.ICudaEngine, *, input_name: str, output_name: str, host: np.ndarray):
        import torch

        super().__init__(engine, input_name=input_name, output_name=output_name, host=host)
        self.host_input = DEVICE_MEMORY.pinned(host)
        self.host_output = DEVICE_MEMORY.pinned_empty(self.shape, self.output.dtype)
        self.graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(self.graph, stream=self.stream, capture_error_mode="thread_local"):
                self.enqueue()
        except Exception as exc:
            raise TensorrtCallFailed(f"CUDA graph capture of the TensorRT engine failed: {type(exc).__name__}: "
                                     f"{first_line(exc)}") from None
        # replay() launches on the CURRENT stream (cudaGraphLaunch(graph, getCurrentCUDAStream()), PyTorch
        # aten/src/ATen/cuda/CUDAGraph.cpp): the timer replays inside `with torch.cuda.stream(self.stream)`, where
        # its events are recorded. On the legacy default stream it would not even order with them.
        self.gpu_compute = QueuedAheadTimer(self.replay, self.stream)

    def replay(self) -> None:
        self.graph.replay()

    def host_latency(self) -> float:
        import torch

        t = host_ms()
        with torch.cuda.stream(self.stream):
            self.input.copy_(self.host_input, non_blocking=True)  # into the bound buffer
            self.graph.replay()
            self.host_output.copy_(self.output, non_blocking=True)
        self.stream.synchronize()  # before the host may read host_output
        return host_ms() - t

    def close(self) -> None:
        """The graph first, then the context, then the buffers bound to it."""
        self.__dict__.pop("graph", None)
        super().close()


class TensorrtRunner(Timed, TrtRunner):
    """Polygraphy's ``TrtRunner`` over engine bytes that
    :func:`pipeline.runtime.builders.tensorrt_engine.load_engine_bytes` checked.

    Inference (verify) goes through ``TrtRunner.infer`` with device-resident inputs (torch CUDA tensors).
    "GPU compute" times a :class:`BoundEngine` (its own context, both buffers bound with ``set_tensor_address``,
    no output allocator) with :class:`QueuedAheadTimer`: one inference queued ahead, then CUDA events around one
    ``execute_async_v3``, so the pair brackets the engine's kernels, not the enqueue's host work. "host latency"
    is the host clock around one ``TrtRunner.infer`` from page-locked (pinned) host memory with the outputs
    copied back into page-locked buffers too (Polygraphy's own output buffers are pageable; the runner hands it
    pinned ones of the right size), then Polygraphy's synchronize: what a user of the runner waits for. With
    ``benchmark.cuda_graphs`` the engine runs from a :class:`GraphedEngine` instead (trtexec's default).

    While the runner is active, TensorRT's runtime WARNINGs (for example "Using default stream in
    enqueueV3()") pass Polygraphy's logger, which prints them to the process's stdout: the child process's log,
    ``logs/<stage>.<backend>.log``.
    """

    context: Any  # Polygraphy's execution context

    def __init__(self, engine_bytes: bytes, profile: ProfileShapes, *, note: str = "", name: str, input_name: str,
                 output_name: str, cuda_graphs: bool = False, onnx_path: Path | None = None):
        from polygraphy.backend.trt import EngineFromBytes

        super().__init__(EngineFromBytes(engine_bytes), name=name)
        self.profile = profile  # the engine's one optimization profile (its sidecar's, or a tune candidate's)
        self.note = note
        self.input_name, self.output_name, self.cuda_graphs = input_name, output_name, cuda_graphs
        self.onnx_path = onnx_path  # the graph it was built from: the inspector's layers are matched to its nodes

    def layers(self, feed: dict) -> list[dict]:
        """The engine inspector's account of the precision each matrix node of the source graph ran in, with the
        inputs at ``feed``'s shape (:func:`pipeline.runtime.profiling.tensorrt_inspection.runtime_precisions`)."""
        from pipeline.core import onnx_io
        from pipeline.runtime.profiling import layer_account, tensorrt_inspection

        if self.onnx_path is None or not Path(self.onnx_path).is_file():
            return []
        shapes = {name: list(np.shape(array)) for name, array in feed.items()}
        precisions = tensorrt_inspection.runtime_precisions(self.engine, onnx_io.load(self.onnx_path), shapes)
        return [layer.to_json() for layer in layer_account.tensorrt_layers(precisions)]

    def activate(self):
        # Polygraphy's CUDA wrapper is made on the first activation in a process and searches libcudart only in
        # LD_LIBRARY_PATH, /usr/local/cuda/lib64, /usr/lib, /lib and nvidia/cuda_runtime/lib, not where the CUDA 13
        # wheel puts it (nvidia/cu13/lib): expose the one the pipeline found, whoever made this runner.
        env.expose_libcudart()
        self._severity = G_LOGGER.module_severity
        G_LOGGER.module_severity = min(self._severity.get(), G_LOGGER.WARNING)  # TensorRT's runtime warnings too
        try:
            super().activate()
        except BaseException:
            G_LOGGER.module_severity = self._severity
            raise

    def batch_reason(self, batch: int) -> str:
        low, high = self.profile.min[0], self.profile.max[0]
        return "" if low <= batch <= high else f"batch {batch} outside the engine's profile [{low}, {high}]"

    def infer(self, feed_dict, check_inputs=True, *args, **kwargs):
        """NumPy inputs are copied to the device first, so TensorRT reads device-resident tensors."""
        feed = OrderedDict((k, DEVICE_MEMORY.tensor(v) if isinstance(v, np.ndarray) else v)
                           for k, v in feed_dict.items())
        # The context stays bound to these buffers after the call: kept alive until the next one (or deactivate),
        # so it never holds a freed address (Polygraphy rebinds only when the address changes).
        self._bound_feed = feed
        return super().infer(feed, check_inputs, *args, **kwargs)

    def timers(self, feed: dict, throughput: bool = True) -> Timers:
        host = np.ascontiguousarray(feed[self.input_name])
        self._drop_bench_state()
        check_dtypes(self.engine, {self.input_name: host.dtype})
        if self.cuda_graphs:
            self.graphed = GraphedEngine(self.engine, input_name=self.input_name, output_name=self.output_name,
                                         host=host)
            return [(Timing(TimingKind.GPU_COMPUTE_CUDA_GRAPHS,
                            "GPU compute (CUDA events, device-resident input) with CUDA graphs"),
                     self.graphed.gpu_compute),
                    (Timing(TimingKind.HOST_LATENCY_CUDA_GRAPHS,
                            "host latency (H2D + compute + D2H, pinned host memory) with CUDA graphs"),
                     self.graphed.host_latency)]
        return self._runner_timers(host)

    def _runner_timers(self, host: np.ndarray) -> Timers:
        self.bound = BoundEngine(self.engine, input_name=self.input_name, output_name=self.output_name, host=host)
        self.bench_host_feed = {self.input_name: DEVICE_MEMORY.pinned(host)}
        self._pin_output_buffers(len(host))

        def host_latency() -> float:
            t = host_ms()
            self.infer(self.bench_host_feed, check_inputs=False, copy_outputs_to_host=True)
            return host_ms() - t

        return [(Timing(TimingKind.GPU_COMPUTE,
                        f"GPU compute ({QUEUED_AHEAD}, device-resident input, buffers bound with set_tensor_address)"),
                 self.bound.gpu_compute),
                (Timing(TimingKind.HOST_LATENCY,
                        "host latency (H2D + compute + D2H, pinned host memory, TrtRunner.infer)"), host_latency)]

    def _pin_output_buffers(self, batch: int) -> None:
        """Polygraphy copies outputs into ``host_output_buffers[name]``, a flat byte buffer it allocates pageable
        (``torch.empty``) unless one of the right size is there: hand it page-locked ones, so the D2H copy is a
        real asynchronous copy. An output whose size the batch alone does not fix keeps Polygraphy's buffer."""
        import torch

        for index in range(self.engine.num_io_tensors):
            name = self.engine.get_tensor_name(index)
            if self.engine.get_tensor_mode(name) != trt_module().TensorIOMode.OUTPUT:
                continue
            dims = [int(d) for d in self.engine.get_tensor_shape(name)]
            if -1 in dims[1:]:
                continue
            itemsize = np.dtype(_numpy_dtype(self.engine.get_tensor_dtype(name))).itemsize
            nbytes = int(np.prod([batch, *dims[1:]])) * itemsize
            self.host_output_buffers[name] = DEVICE_MEMORY.pinned_empty((nbytes,), torch.uint8)

    def _drop_bench_state(self) -> None:
        for name in ("graphed", "bound"):
            engine = self.__dict__.pop(name, None)
            if engine is not None:
                engine.close()
        self.__dict__.pop("bench_host_feed", None)

    def deactivate(self):
        self._drop_bench_state()
        try:
            super().deactivate()
        finally:
            self.__dict__.pop("_bound_feed", None)  # after the context that was bound to it
            G_LOGGER.module_severity = getattr(self, "_severity", G_LOGGER.module_severity)


class OpenVINORunner(Timed, BaseRunner):
    """OpenVINO's CPU plugin over IR bytes that :func:`pipeline.runtime.builders.openvino_ir.load` checked.

    One compiled model per batch size (the IR reshaped to a static batch: what a deployment compiles), with
    ``PERFORMANCE_HINT=LATENCY`` and one infer request; ``hint`` is ``INFERENCE_PRECISION_HINT``. A bf16 hint
    must reach the kernels: activation fails when no layer of the compiled model runs in bf16.

    Timing: the latency timer (one synchronous request) and a throughput timer: the model compiled with
    ``PERFORMANCE_HINT=THROUGHPUT``, OpenVINO's ``OPTIMAL_NUMBER_OF_INFER_REQUESTS`` requests in an
    ``AsyncInferQueue``, each run starting one batch on every request and waiting for all; it returns the
    time per batch (elapsed / requests), so the row's images/s is the async throughput.
    """

    def __init__(self, xml: bytes, weights: bytes, sidecar: dict, *, name: str, input_name: str, output_name: str,
                 threads: int | None = None):
        super().__init__(name=name)
        self.xml, self.weights, self.sidecar = xml, weights, sidecar
        self.hint = sidecar["hint"]
        self.input_name, self.output_name, self.threads = input_name, output_name, threads
        self.precision = sidecar["precision"]
        self.note = (f"OpenVINO {sidecar['openvino']} CPU, {sidecar['xml']} (INFERENCE_PRECISION_HINT={self.hint}): "
                     "the deployment runtime on this CPU, not an emulation")

    def activate_impl(self):
        import openvino as ov

        self.core = ov.Core()
        self.model = self.core.read_model(self.xml.decode("utf-8"), ov.Tensor(np.frombuffer(self.weights, np.uint8)))
        self.compiled, self.requests = {}, {}

    def _config(self, mode: str) -> dict:
        config = {"INFERENCE_PRECISION_HINT": self.hint, "PERFORMANCE_HINT": mode}
        if self.threads is not None:
            config["INFERENCE_NUM_THREADS"] = self.threads
        return config

    def _compile(self, batch: int, mode: str = "LATENCY"):
        key = (batch, mode)
        if key not in self.compiled:
            model = self.model.clone()
            shape = list(model.input(0).get_partial_shape())
            shape[0] = batch
            model.reshape({model.input(0).get_any_name(): shape})
            compiled = self.core.compile_model(model, "CPU", self._config(mode))
            if self.hint != "f32":  # a lower precision asked for: it must reach a kernel
                check_runs_in(compiled, self.hint)
            self.compiled[key] = compiled
        return self.compiled[key]

    def layers(self, feed: dict) -> list[dict]:
        """The CPU plugin's own account of the layers it ran on ``feed``: the runtime model of the IR compiled for
        this batch with ``PERF_COUNT`` (each executed layer's type, runtime precision, kernel and time, the fastest
        of :data:`~pipeline.runtime.profiling.layer_account.PROFILED_RUNS` inferences)."""
        from pipeline.runtime.profiling import layer_account

        x = np.ascontiguousarray(feed[self.input_name], dtype=np.float32)
        model = self.model.clone()
        shape = list(model.input(0).get_partial_shape())
        shape[0] = len(x)
        model.reshape({model.input(0).get_any_name(): shape})
        compiled = self.core.compile_model(model, "CPU", {**self._config("LATENCY"), "PERF_COUNT": True})
        request = compiled.create_infer_request()
        runs = []
        for _ in range(layer_account.PROFILED_RUNS):  # each layer's fastest run is kept
            request.infer({0: x})
            runs.append(list(request.profiling_info))
        return [layer.to_json() for layer in layer_account.openvino_layers(compiled, runs)]

    def _request(self, batch: int):
        if batch not in self.requests:
            self.requests[batch] = self._compile(batch).create_infer_request()
        return self.requests[batch]

    def batch_reason(self, batch: int) -> str:
        try:
            self._compile(batch)
        except Exception as exc:
            return f"OpenVINO cannot compile the IR at batch {batch}: {first_line(exc)[:200]}"
        return ""

    def get_input_metadata_impl(self):
        shape = [d.get_length() if d.is_static else None for d in self.model.input(0).get_partial_shape()]
        return TensorMetadata().add(self.input_name, dtype=np.float32, shape=shape)

    def infer_impl(self, feed_dict):
        x = np.ascontiguousarray(feed_dict[self.input_name], dtype=np.float32)
        request = self._request(len(x))
        start = time.perf_counter()
        request.infer({0: x})
        self.inference_time = time.perf_counter() - start
        outputs = OrderedDict([(self.output_name, np.array(request.get_output_tensor(0).data))])
        for i, port in enumerate(self.model.outputs[1:], start=1):  # a detector's detections
            outputs[port.get_any_name()] = np.array(request.get_output_tensor(i).data)
        return outputs

    def timers(self, feed: dict, throughput: bool = True) -> Timers:
        import openvino as ov

        # The input is set once, shared with NumPy, as benchmark_app fills it once: the timings hold inference only.
        x = np.ascontiguousarray(feed[self.input_name], dtype=np.float32)
        request = self._request(len(x))
        request.set_input_tensor(ov.Tensor(x, shared_memory=True))
        latency = (CPU_WALL_CLOCK, cpu_timer(request.infer))
        if not throughput:
            return [latency]
        try:
            throughput_timer = self._throughput_timer(x)
        except Exception as exc:  # e.g. out of memory compiling for THROUGHPUT: that row's error, not the batch's
            def failed(error: Exception = exc) -> float:
                raise error

            throughput_timer = (Timing(TimingKind.ASYNC_THROUGHPUT,
                                       f"{THROUGHPUT_LABEL}: async infer requests (PERFORMANCE_HINT=THROUGHPUT)"),
                                failed)
        return [latency, throughput_timer]

    def _throughput_timer(self, x: np.ndarray) -> tuple[Timing, Callable[[], float]]:
        import openvino as ov

        compiled = self._compile(len(x), "THROUGHPUT")
        n = int(compiled.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS"))
        queue = ov.AsyncInferQueue(compiled, n)
        for i in range(n):
            queue[i].set_input_tensor(ov.Tensor(x, shared_memory=True))

        def run_once() -> float:
            t = time.perf_counter()
            for _ in range(n):
                queue.start_async()
            queue.wait_all()
            return (time.perf_counter() - t) * 1000.0 / n

        label = f"{THROUGHPUT_LABEL}: {n} async infer requests (PERFORMANCE_HINT=THROUGHPUT), ms per batch"
        return Timing(TimingKind.ASYNC_THROUGHPUT, label), run_once

    def deactivate_impl(self):
        del self.core, self.model, self.compiled, self.requests


# How the label of an async-throughput timing (TimingKind.ASYNC_THROUGHPUT) begins: display only, decisions read
# the kind. Its images/s is async throughput and its "latency" the time per batch, amortised over the requests in
# flight: never the latency of one request (benchmark's headline keeps the two apart).
THROUGHPUT_LABEL = "throughput"


def check_runs_in(compiled, hint: str) -> None:
    """A precision hint that reached no kernel would be FP32 under a lower label: refuse it (verify's precision
    manifest holds every artifact to its claim; this refuses before anything is timed). A model without a single
    matrix layer (convolution, matrix product) has nothing the hint could reach: not refused."""
    from pipeline.runtime.profiling.layer_account import OPENVINO_MATRIX

    infos = [op.get_rt_info() for op in compiled.get_runtime_model().get_ops()]
    ran = {info["runtimePrecision"].astype(str) for info in infos if "runtimePrecision" in info}
    matrix = any("layerType" in info and info["layerType"].astype(str) in OPENVINO_MATRIX for info in infos)
    if matrix and hint not in ran:
        raise RuntimeError(f"OpenVINO compiled the model with INFERENCE_PRECISION_HINT={hint} but no layer runs in "
                           f"{hint} (runtime precisions: {', '.join(sorted(ran))})")


class Answered:
    """An active runner that answers a feed it has already answered, in one candidate's check, with a copy of that
    first answer. verify asks some batches twice: each of the first images alone (the batch-size check at batch 1,
    and the conformance check's "alone"), and the first full batch (the main check, and the conformance check's
    "batch"); the same bytes through the same active runtime a second time add time, not evidence. Every other
    attribute is the runner's own."""

    def __init__(self, runner):
        self.runner, self.answers = runner, {}

    def __getattr__(self, name: str):
        return getattr(self.runner, name)

    def infer(self, feed: dict) -> OrderedDict:
        return self.infer_each([feed])[0]

    def infer_each(self, feeds: list[dict]) -> list[OrderedDict]:
        """Each feed's outputs; the feeds not answered yet go to the runner together (:func:`infer_all`)."""
        keys = [_feed_key(feed) for feed in feeds]
        new: dict[tuple, dict] = {}
        for key, feed in zip(keys, feeds, strict=True):
            if key not in self.answers:
                new.setdefault(key, feed)
        self.answers.update(zip(new, infer_all(self.runner, list(new.values())), strict=True))
        return [OrderedDict((k, v.copy()) for k, v in self.answers[key].items()) for key in keys]


def _feed_key(feed: dict) -> tuple:
    return tuple((name, *_fingerprint(np.asarray(value))) for name, value in sorted(feed.items()))


def _fingerprint(array: np.ndarray) -> tuple:
    return array.shape, array.dtype.str, hashlib.blake2b(np.ascontiguousarray(array).data, digest_size=16).digest()


def collect(runner, feeds: list[dict]) -> list[OrderedDict]:
    """Run ``runner`` over every feed; outputs are copied (runners may reuse their buffers)."""
    with runner:
        return infer_all(runner, feeds)


def infer_all(runner, feeds: list[dict]) -> list[OrderedDict]:
    """Every feed through an active runner, each its own inference; outputs are copied (runners may reuse their
    buffers). A runner that takes several feeds in one request (``infer_each``: an isolated child, one round trip
    between processes instead of one per feed) gets them in groups of at most :data:`GROUP_BYTES` of inputs."""
    each = getattr(runner, "infer_each", None)
    if each is not None:
        return [out for group in _groups(feeds, GROUP_BYTES) for out in each(group)]
    outputs = []
    for feed in feeds:
        out = runner.infer(feed)
        outputs.append(OrderedDict((k, np.array(copy.deepcopy(to_numpy(v)))) for k, v in out.items()))
    return outputs


GROUP_BYTES = 64 << 20  # one request's inputs, at most (600 images at 224x224 are 361 MB): the child's memory


def _groups(feeds: list[dict], limit: int) -> list[list[dict]]:
    """``feeds`` in order, cut into runs whose inputs add up to at most ``limit`` bytes (a larger feed alone)."""
    groups: list[list[dict]] = []
    size = 0
    for feed in feeds:
        nbytes = sum(np.asarray(v).nbytes for v in feed.values())
        if not groups or size + nbytes > limit:
            groups.append([])
            size = 0
        groups[-1].append(feed)
        size += nbytes
    return groups


def to_numpy(value) -> np.ndarray:
    """A runner's output as a NumPy array (a torch tensor is detached and copied to the host; bfloat16, which NumPy
    has no type for, is widened to float32 exactly)."""
    if not hasattr(value, "detach"):
        return np.asarray(value)
    value = value.detach().cpu()
    import torch

    return (value.float() if value.dtype == torch.bfloat16 else value).numpy()


# --------------------------------------------------------------------------- faithful CPU executions


def faithful_runner(plug, model: onnx.ModelProto, mode: str = "fast", threads: int | None = None):
    """The faithful execution of ``model``, a graph of ``plug``'s precision: ONNX Runtime on the plug's faithful
    graph (the emulation that rounds every low tensor; the Q/DQ graph executed exactly, optimisations off), or with
    ``mode="strict"`` for a float graph, ONNX's reference evaluator in the low type itself."""
    if mode == "strict" and plug.strict_reference:
        return ReferenceRunner(model, name=plug.faithful)
    faithful = plug.faithful_model(model)
    if not plug.faithful_optimized:  # its constants computed once, as ONNX Runtime computes them at every inference
        faithful = folding.fold(faithful)
    return onnxrt_runner(faithful.SerializeToString(), name=plug.faithful, threads=threads,
                         optimize=plug.faithful_optimized)
