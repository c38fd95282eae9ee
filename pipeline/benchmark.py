"""The benchmark stage: latency and throughput of every available backend, measured seriously.

Method (see docs in the README and ``../shared/docs/BENCHMARKING.md``): a first run for lazy
initialisation, warm-up by time, then repeated trials of at least ``min_iterations`` runs and
``min_duration_s`` seconds each; percentiles (p50/p90/p95/p99), mean, standard deviation and
coefficient of variation over every timed run, with a warning when a trial is noisy. Every
backend gets the same real validation images, the same warm-up and the same timing method.

* CPU: wall clock around a synchronous call; intra-op threads set and recorded.
* GPU: CUDA events around work on device-resident inputs ("GPU compute"), and separately the
  host latency including host-to-device and device-to-host copies; optional CUDA graphs.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from pipeline import build, env, export, modeling, onnx_io
from pipeline.errors import BackendUnavailable, InputError
from pipeline.run import RunDir, StageRecord, atomic_path, atomic_write, now, read_json, write_json

log = logging.getLogger("pipeline")

JSON, MARKDOWN = "benchmark.json", "benchmark.md"
LATENCY_PLOT, THROUGHPUT_PLOT = "benchmark_latency.png", "benchmark_throughput.png"
TRACE = "benchmark.trace.json"
SCHEMA = "pipeline.benchmark/1"

# Which verify candidate vouches for each backend ("reference" for the FP32 model itself).
VERIFIED_BY = {
    "torch_fp32": "reference",
    "torch_autocast": None,
    "torch_compile": None,
    "onnxrt_fp32": "onnxrt_fp32",
    "onnxrt_fp16": "onnxrt_fp16_cpu",
    "onnxrt_cuda_fp32": None,
    "onnxrt_cuda_fp16": "onnxrt_cuda_fp16",
    "tensorrt_fp16": "tensorrt_fp16",
}


# --------------------------------------------------------------------------- statistics


def summarize(latencies_ms: list[float] | np.ndarray, batch_size: int) -> dict:
    """Statistics of a latency series (ms). Percentiles use linear interpolation (NumPy's default)."""
    x = np.asarray(latencies_ms, dtype=np.float64)
    if x.size == 0:
        raise ValueError("no latencies to summarise")
    mean = float(x.mean())
    std = float(x.std(ddof=1)) if x.size > 1 else 0.0
    p50, p90, p95, p99 = (float(v) for v in np.percentile(x, [50, 90, 95, 99]))
    return {
        "mean": mean,
        "std": std,
        "cv": std / mean if mean > 0 else 0.0,
        "min": float(x.min()),
        "max": float(x.max()),
        "p50": p50,
        "p90": p90,
        "p95": p95,
        "p99": p99,
        "iterations": int(x.size),
        "throughput": batch_size * 1000.0 / mean if mean > 0 else 0.0,
    }


@dataclass
class Method:
    warmup_s: float
    min_iterations: int
    min_duration_s: float
    trials: int
    cv_warn: float


def measure(run_once: Callable[[], float], method: Method) -> dict:
    """Time ``run_once`` (which runs one inference and returns its latency in ms).

    One untimed first run (lazy initialisation), warm-up for ``warmup_s``, then ``trials``
    trials, each of at least ``min_iterations`` runs and ``min_duration_s`` seconds.
    """
    start = time.perf_counter()
    first_ms = run_once()
    init_s = time.perf_counter() - start
    end = time.perf_counter() + method.warmup_s
    warmup_runs = 0
    while time.perf_counter() < end:
        run_once()
        warmup_runs += 1
    samples, trials = [], []
    for _ in range(method.trials):
        trial = []
        t0 = time.perf_counter()
        while len(trial) < method.min_iterations or time.perf_counter() - t0 < method.min_duration_s:
            trial.append(run_once())
        samples += trial
        mean = float(np.mean(trial))
        cv = float(np.std(trial, ddof=1) / mean) if len(trial) > 1 and mean > 0 else 0.0
        trials.append({"mean_ms": mean, "p50_ms": float(np.median(trial)), "cv": cv, "iterations": len(trial)})
    return {"samples": samples, "trials": trials, "first_run_ms": first_ms, "init_s": init_s,
            "warmup_runs": warmup_runs, "cv_warning": any(t["cv"] > method.cv_warn for t in trials)}


# --------------------------------------------------------------------------- backends


@dataclass
class Backend:
    name: str
    precision: str
    device: str
    note: str = ""
    reason: str = ""  # why it cannot run here
    make: Callable | None = None  # make(batch) -> list of (timing label, run_once) pairs


def _inputs(images: np.ndarray, batch: int) -> np.ndarray:
    reps = math.ceil(batch / len(images))
    return np.ascontiguousarray(np.concatenate([images] * reps)[:batch])


def _cpu_timer(fn, *args) -> Callable[[], float]:
    def run_once() -> float:
        t = time.perf_counter()
        fn(*args)
        return (time.perf_counter() - t) * 1000.0

    return run_once


def torch_backend(name: str, model, images, *, device: str, autocast, compile_: bool, cuda_graphs: bool,
                  channels_last: bool, note: str) -> Backend:
    import torch

    precision = {None: "fp32", torch.bfloat16: "bf16 autocast", torch.float16: "fp16 autocast"}[autocast]
    module = model.to(device).eval()
    if channels_last:
        module = module.to(memory_format=torch.channels_last)
    if compile_:
        module = torch.compile(module)

    def forward(x):
        with torch.inference_mode(), torch.autocast(device, dtype=autocast or torch.float32,
                                                    enabled=autocast is not None):
            return module(x)

    def make(batch: int):
        x = torch.from_numpy(_inputs(images, batch))
        if channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        if device == "cpu":
            return [("wall-clock, synchronous CPU call", _cpu_timer(forward, x))]
        return _cuda_timers(forward, x, cuda_graphs)

    return Backend(name, precision, device, note=note, make=make)


def _cuda_timers(forward, x_host, cuda_graphs: bool):
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
        with torch.cuda.graph(graph, stream=stream):
            static_out = forward(x_dev)

        def compute():
            graph.replay()
            return static_out
    start_evt, end_evt = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    pinned = x_host.pin_memory()

    def gpu_compute() -> float:
        with torch.cuda.stream(stream):
            start_evt.record(stream)
            compute()
            end_evt.record(stream)
        end_evt.synchronize()
        return start_evt.elapsed_time(end_evt)

    def host_latency() -> float:
        t = time.perf_counter()
        with torch.cuda.stream(stream):
            x_dev.copy_(pinned, non_blocking=True)
            compute().float().cpu()
        stream.synchronize()
        return (time.perf_counter() - t) * 1000.0

    label = " with CUDA graphs" if cuda_graphs else ""
    return [(f"GPU compute (CUDA events, device-resident input){label}", gpu_compute),
            (f"host latency (H2D + compute + D2H){label}", host_latency)]


def onnxrt_backend(name: str, model_source, images, *, input_name: str, threads: int, providers: list[str],
                   precision: str, device: str, note: str) -> Backend:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    if not isinstance(model_source, bytes):
        onnx_io.load(model_source)  # external-data check and a clear error for a corrupt file
    source = str(model_source) if not isinstance(model_source, bytes) else model_source
    session = ort.InferenceSession(source, options, providers=providers)
    if providers[0] == "CUDAExecutionProvider" and "CUDAExecutionProvider" not in session.get_providers():
        return Backend(name, precision, device, reason="ONNX Runtime's CUDA provider failed to load")

    def make(batch: int):
        x = _inputs(images, batch)
        if device == "cpu":
            return [("wall-clock, synchronous CPU call", _cpu_timer(session.run, None, {input_name: x}))]
        return [("host latency (H2D + compute + D2H), ONNX Runtime CUDA", _cpu_timer(session.run, None,
                                                                                     {input_name: x}))]

    return Backend(name, precision, device, note=note, make=make)


def tensorrt_backend(run_dir: RunDir, images, *, input_name: str, output_name: str, cuda_graphs: bool) -> Backend:
    """TensorRT through its execution context on a torch CUDA stream, timed with CUDA events."""
    import torch
    from polygraphy.backend.trt import EngineFromBytes

    engine_bytes, sidecar = build.load_engine_bytes(run_dir)
    engine = EngineFromBytes(engine_bytes)()
    profile_max = sidecar["profile"]["max"][0]
    profile_min = sidecar["profile"]["min"][0]
    context = engine.create_execution_context()

    def make(batch: int):
        if not profile_min <= batch <= profile_max:
            return [("skipped", None, f"batch {batch} outside the engine's profile [{profile_min}, {profile_max}]")]
        x_host = torch.from_numpy(_inputs(images, batch))
        x_dev = x_host.to("cuda")
        context.set_input_shape(input_name, tuple(x_dev.shape))
        out = torch.empty(tuple(context.get_tensor_shape(output_name)), dtype=torch.float32, device="cuda")
        context.set_tensor_address(input_name, x_dev.data_ptr())
        context.set_tensor_address(output_name, out.data_ptr())

        def forward(_):
            context.execute_async_v3(torch.cuda.current_stream().cuda_stream)
            return out

        return _cuda_timers(forward, x_host, cuda_graphs)

    return Backend("tensorrt_fp16", "fp16 (strongly typed engine)", "cuda", note=sidecar.get("precision", ""),
                   make=make)


def plan_backends(cfg, run_dir: RunDir, model, card, images, threads: int) -> list[Backend]:
    import torch

    spec = card["spec"]
    cuda_ok, cuda_reason = env.cuda_status()
    device = "cuda" if cuda_ok else "cpu"
    fp16_path = run_dir.file(export.FP16_ONNX)
    backends = []
    for name in cfg.benchmark.backends:
        try:
            if name in ("torch_fp32", "torch_autocast", "torch_compile"):
                autocast = None
                note = ""
                if name == "torch_autocast":
                    autocast = torch.float16 if device == "cuda" else torch.bfloat16
                    if device == "cpu" and not env.cpu_has_native_bf16():
                        note = "this CPU has no bf16 matrix units: bf16 is emulated and slow"
                backends.append(torch_backend(name, model, images, device=device, autocast=autocast,
                                              compile_=name == "torch_compile", cuda_graphs=cfg.benchmark.cuda_graphs,
                                              channels_last=cfg.train.channels_last, note=note))
            elif name == "onnxrt_fp32":
                backends.append(onnxrt_backend(name, run_dir.require(export.FP32_ONNX, "export", "benchmark"), images,
                                               input_name=spec["input_name"], threads=threads,
                                               providers=["CPUExecutionProvider"], precision="fp32", device="cpu",
                                               note="ONNX Runtime CPU"))
            elif name == "onnxrt_fp16":
                if not fp16_path.exists():
                    backends.append(Backend(name, "fp16", "cpu", reason="no model.fp16.onnx"))
                    continue
                backends.append(onnxrt_backend(name, fp16_path, images, input_name=spec["input_name"], threads=threads,
                                               providers=["CPUExecutionProvider"], precision="fp16 graph", device="cpu",
                                               note="ONNX Runtime CPU runs most FP16 nodes through FP32 kernels"))
            elif name in ("onnxrt_cuda_fp32", "onnxrt_cuda_fp16"):
                import onnxruntime as ort

                fp16_graph = name == "onnxrt_cuda_fp16"
                precision = "fp16 graph" if fp16_graph else "fp32"
                if not cuda_ok:
                    backends.append(Backend(name, precision, "cuda", reason=cuda_reason))
                elif "CUDAExecutionProvider" not in ort.get_available_providers():
                    backends.append(Backend(name, precision, "cuda", reason="ONNX Runtime has no CUDA provider"))
                elif fp16_graph and not fp16_path.exists():
                    backends.append(Backend(name, precision, "cuda", reason="no model.fp16.onnx"))
                else:
                    source = fp16_path if fp16_graph else run_dir.require(export.FP32_ONNX, "export", "benchmark")
                    backends.append(onnxrt_backend(name, source, images, input_name=spec["input_name"],
                                                   threads=threads, providers=["CUDAExecutionProvider"],
                                                   precision=precision, device="cuda", note="ONNX Runtime CUDA"))
            elif name == "tensorrt_fp16":
                ok, reason = build.availability()
                if not ok:
                    if "tensorrt" in cfg.require:
                        raise BackendUnavailable(f"TensorRT benchmark required but {reason}")
                    backends.append(Backend(name, "fp16", "cuda", reason=reason))
                elif not run_dir.file(build.ENGINE).exists():
                    backends.append(Backend(name, "fp16", "cuda", reason="no engine (build was skipped or not run)"))
                else:
                    backends.append(tensorrt_backend(run_dir, images, input_name=spec["input_name"],
                                                     output_name=spec["output_name"],
                                                     cuda_graphs=cfg.benchmark.cuda_graphs))
        except (BackendUnavailable, InputError):
            raise
        except Exception as exc:  # one backend that cannot start does not stop the others
            backends.append(Backend(name, "?", device, reason=f"could not start: {type(exc).__name__}: {exc}"))
    return backends


# --------------------------------------------------------------------------- the stage


def run(cfg, run_dir: RunDir, record: StageRecord, *, profile: bool = False) -> None:
    import torch

    bc = cfg.benchmark
    threads = bc.threads or env.usable_cores()
    torch.set_num_threads(threads)
    model, card = modeling.load_trained(cfg, run_dir, "benchmark")
    spec = card["spec"]
    images, _ = export.validation_batch(cfg, card, max(bc.batch_sizes))
    verdicts = _verify_verdicts(run_dir)
    method = Method(bc.warmup_s, bc.min_iterations, bc.min_duration_s, bc.trials, bc.cv_warn)
    log.info("benchmark: batch sizes %s, %d threads, %d trial(s) of >= %d runs and >= %.2g s after %.2g s warm-up",
             bc.batch_sizes, threads, bc.trials, bc.min_iterations, bc.min_duration_s, bc.warmup_s)
    backends = plan_backends(cfg, run_dir, model, card, images, threads)
    results, skipped = [], []
    for backend in backends:
        if backend.make is None:
            skipped.append({"backend": backend.name, "reason": backend.reason})
            log.info("benchmark: %-17s skipped: %s", backend.name, backend.reason)
            continue
        for batch in bc.batch_sizes:
            for item in backend.make(batch):
                label, run_once = item[0], item[1]
                if run_once is None:
                    skipped.append({"backend": backend.name, "batch_size": batch, "reason": item[2]})
                    continue
                m = measure(run_once, method)
                stats = summarize(m["samples"], batch)
                verified_by = VERIFIED_BY.get(backend.name)
                results.append({
                    "backend": backend.name,
                    "precision": backend.precision,
                    "device": backend.device,
                    "batch_size": batch,
                    "timing": label,
                    "latency_ms": {k: stats[k] for k in ("mean", "std", "cv", "min", "max", "p50", "p90", "p95",
                                                         "p99")},
                    "throughput_per_s": stats["throughput"],
                    "iterations": stats["iterations"],
                    "trials": m["trials"],
                    "first_run_ms": m["first_run_ms"],
                    "cv_warning": m["cv_warning"],
                    "cuda_graphs": "CUDA graphs" in label,
                    "verify": "reference" if verified_by == "reference" else verdicts.get(verified_by, "not verified"),
                    "note": backend.note,
                    "samples_ms": [round(s, 5) for s in m["samples"]] if batch == min(bc.batch_sizes) else None,
                })
                r = results[-1]
                log.info("benchmark: %-17s b=%-3d p50 %8.3f ms  p99 %8.3f ms  %9.1f img/s  cv %4.1f%%%s", backend.name,
                         batch, r["latency_ms"]["p50"], r["latency_ms"]["p99"], r["throughput_per_s"],
                         100 * r["latency_ms"]["cv"], "  (noisy)" if r["cv_warning"] else "")
    noisy = [f"{r['backend']}@{r['batch_size']}" for r in results if r["cv_warning"]]
    if noisy:
        log.warning("benchmark: warning: %d of %d measurements had a trial with a coefficient of variation above "
                    "%.1f%% (%s): the machine was busy or the runs are too short; close other programs or raise "
                    "benchmark.min_duration_s", len(noisy), len(results), 100 * bc.cv_warn, ", ".join(noisy))
    environment = env.collect()
    environment["threads"] = threads
    payload = {
        "schema": SCHEMA,
        "created": now(),
        "model": cfg.model.name,
        "input": {"shape": ["batch", *spec["input_size"]], "dtype": "float32", "data": "real validation images",
                  "dynamic_batch": cfg.export.dynamic_batch},
        "method": {"warmup_s": bc.warmup_s, "min_iterations": bc.min_iterations,
                   "min_duration_s": bc.min_duration_s, "trials": bc.trials, "cv_warn": bc.cv_warn,
                   "percentiles": "linear interpolation over every timed run of every trial"},
        "environment": environment,
        "results": results,
        "skipped": skipped,
    }
    write_json(run_dir.file(JSON), payload)
    atomic_write(run_dir.file(MARKDOWN), markdown(payload))
    plots = write_plots(run_dir, payload)
    for name in (JSON, MARKDOWN, *plots):
        record.artifact(name)
    if profile:
        profile_torch(cfg, run_dir, model, images, record)
    best = _headline(results)
    record.details.update({"results": len(results), "skipped": skipped, "threads": threads, "headline": best})


def _headline(results: list[dict]) -> str:
    b1 = [r for r in results if r["batch_size"] == min(r["batch_size"] for r in results)] if results else []
    if not b1:
        return "no backend measured"
    fastest = min(b1, key=lambda r: r["latency_ms"]["p50"])
    return (f"fastest at batch {fastest['batch_size']}: {fastest['backend']} p50 {fastest['latency_ms']['p50']:.3f} ms "
            f"(verify: {fastest['verify']})")


def _verify_verdicts(run_dir: RunDir) -> dict:
    path = run_dir.file("verify.json")
    if not path.exists():
        return {}
    try:
        return {c["name"]: c["status"] for c in read_json(path, "verify report").get("candidates", [])}
    except Exception:
        return {}


def markdown(payload: dict) -> str:
    """benchmark.md: the report's benchmark rows (``tables.benchmark_section``), as Markdown."""
    from pipeline import tables

    return tables.markdown([tables.benchmark_section(payload)], top=3)


def write_plots(run_dir: RunDir, payload: dict) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = payload["results"]
    if not results:
        return []
    written = []
    small = min(r["batch_size"] for r in results)
    series = [r for r in results if r["batch_size"] == small and r.get("samples_ms")]
    if series:
        fig, ax = plt.subplots(figsize=(max(6, 1.4 * len(series)), 4))
        labels = [f"{r['backend']}\n{'GPU' if 'GPU compute' in r['timing'] else r['device']}"
                  + ("\nhost" if r["timing"].startswith("host") else "") for r in series]
        ax.boxplot([r["samples_ms"] for r in series], showfliers=True, whis=(1, 99))
        ax.set_xticks(range(1, len(series) + 1), labels, fontsize=8)
        ax.set_ylabel("latency (ms), whiskers p1-p99")
        ax.set_title(f"{payload['model']}: latency distribution at batch {small}")
        ax.grid(axis="y", alpha=0.3)
        fig.tight_layout()
        with atomic_path(run_dir.file(LATENCY_PLOT)) as tmp:
            fig.savefig(tmp, format="png", dpi=110)
        plt.close(fig)
        written.append(LATENCY_PLOT)
    fig, ax = plt.subplots(figsize=(7, 4))
    keys = sorted({(r["backend"], r["timing"]) for r in results})
    for backend, timing in keys:
        pts = sorted((r["batch_size"], r["throughput_per_s"]) for r in results
                     if r["backend"] == backend and r["timing"] == timing)
        label = backend + (" (host)" if timing.startswith("host") else "")
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size")
    ax.set_ylabel("throughput (images/s)")
    ax.set_title(f"{payload['model']}: throughput versus batch size")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    with atomic_path(run_dir.file(THROUGHPUT_PLOT)) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)
    written.append(THROUGHPUT_PLOT)
    return written


def profile_torch(cfg, run_dir: RunDir, model, images, record: StageRecord) -> None:
    """A torch.profiler trace of a few batch-1 iterations (Chrome-trace JSON, open in Perfetto)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    device = "cuda" if torch.cuda.is_available() else "cpu"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    module = model.to(device).eval()
    x = torch.from_numpy(_inputs(images, 1)).to(device)
    with torch.inference_mode():
        module(x)
        with profile(activities=activities) as prof:
            for _ in range(cfg.benchmark.profile_iterations):
                module(x)
            if device == "cuda":
                torch.cuda.synchronize()
    with atomic_path(run_dir.file(TRACE)) as tmp:
        prof.export_chrome_trace(str(tmp))
    record.artifact(TRACE)
    log.info("benchmark: torch.profiler trace of %d iterations: %s (open in https://ui.perfetto.dev)\n%s",
             cfg.benchmark.profile_iterations, TRACE,
             prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=10))
