#!/usr/bin/env python3
"""The GPU questions the virtual CUDA device of the tests cannot answer, measured on a real GPU.

    python scripts/gpu_timing_check.py RUN_DIR [--steps STEPS_FILE] [--out PREFIX]

Run by scripts/gpu_check.sh after its pipeline steps (RUN_DIR holds their run). It writes PREFIX.json and
PREFIX.md (default RUN_DIR/gpu_check) with:

* graph-replay GPU compute, side by side: (a) as the benchmark measures it (its timer, its warm-up and trials),
  (b) CUDA events around 100 replays inside ``with torch.cuda.stream(s)`` on the stream the events are recorded
  on, and (c) trtexec's ``computeMs`` where trtexec is on PATH; for PyTorch (always, where CUDA is) and for the
  TensorRT engine (where TensorRT and the run's engine are);
* whether graph-replay outputs equal the runner's (eager PyTorch; Polygraphy's ``TrtRunner``) outputs;
* the per-call overhead of the runner path: host latency of one call minus its GPU compute;
* the TensorRT build log of the run's TF32-off build (``build.tf32`` is false by default);
* which libcudart copies a child process that loads what the benchmark's TensorRT child loads (torch CUDA,
  Polygraphy's CUDA wrapper, TensorRT) has mapped (``/proc/self/maps``).

Without a CUDA GPU every GPU question is "not run: <reason>" and the summary is still written (the CPU-safe
parts: the child's maps, the build log, the report). Exit 0 when the report was written.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

REPLAYS = 100
TINY_METHOD = dict(warmup_s=0.2, min_iterations=50, min_duration_s=0.5, trials=2, cv_warn=0.025)
CHILD = """
import json, sys
loaded = {}
try:
    import torch
    if torch.cuda.is_available():
        torch.zeros(1, device="cuda")
        loaded["torch_cuda"] = True
except Exception as exc:
    loaded["torch_error"] = str(exc)
try:
    from polygraphy import cuda
    cuda.wrapper()
except Exception as exc:
    loaded["polygraphy_error"] = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
try:
    import tensorrt
    loaded["tensorrt"] = tensorrt.__version__
except Exception as exc:
    loaded["tensorrt_error"] = type(exc).__name__
paths = sorted({line.split()[-1] for line in open("/proc/self/maps") if "libcudart" in line and "/" in line})
print(json.dumps({**loaded, "libcudart": paths}))
"""


def method():
    from pipeline.runtime.runners import Method

    return Method(**TINY_METHOD)


def p50(run_once) -> float:
    """The median of the benchmark's own timing loop (:func:`pipeline.runtime.runners.measure`) over ``run_once``."""
    from pipeline.runtime.runners import measure

    samples = sorted(measure(run_once, method())["samples"])
    return samples[len(samples) // 2]


def events_around_replays(replay, stream, replays: int = REPLAYS) -> float:
    """(b): CUDA events on ``stream`` around ``replays`` replays launched on that same stream, ms per replay."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(stream):
        replay()  # one untimed
        start.record(stream)
        for _ in range(replays):
            replay()
        end.record(stream)
    end.synchronize()
    return start.elapsed_time(end) / replays


def max_abs_diff(a, b) -> float:
    import numpy as np

    return float(np.max(np.abs(np.asarray(a, np.float32) - np.asarray(b, np.float32))))


def torch_section(batch: int = 8, size: int = 224) -> dict:
    """PyTorch ResNet-18 (random weights) on CUDA: the benchmark's CUDA-graph timer against events around replays."""
    import torch

    from pipeline import config
    from pipeline.core import modeling
    from pipeline.runtime import runners

    cfg = config.resolve(overrides=["model.name=resnet18", f"data.image_size={size}"])
    model, _ = modeling.build(cfg, 10, size)
    model = model.cuda().eval()
    x_host = torch.randn(batch, 3, size, size)

    def forward(x):
        with torch.inference_mode():
            return model(x)

    timers = dict(runners.cuda_timers(forward, x_host, cuda_graphs=True))
    bench_gpu = p50(next(v for k, v in timers.items() if k.startswith("GPU compute")))
    host = p50(next(v for k, v in timers.items() if k.startswith("host latency")))
    x_dev, stream = x_host.cuda(), torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for _ in range(3):
            forward(x_dev)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream, capture_error_mode="thread_local"):
        static_out = forward(x_dev)
    events = events_around_replays(graph.replay, stream)
    stream.synchronize()
    eager = forward(x_dev)
    torch.cuda.synchronize()
    return {"model": f"resnet18 (random weights), batch {batch}, {size}x{size}, fp32",
            "gpu_compute_ms": {"a_benchmark": bench_gpu, f"b_events_{REPLAYS}_replays": events, "c_trtexec": None},
            "replay_equals_eager_max_abs": max_abs_diff(static_out.float().cpu(), eager.float().cpu()),
            "host_latency_ms": host, "per_call_overhead_ms": host - bench_gpu}


def tensorrt_section(run_dir: Path) -> dict:
    """The run's FP16 engine: TrtRunner's and the CUDA-graph timers, events around replays, trtexec, outputs."""
    import numpy as np

    from pipeline.core import artifacts
    from pipeline.core.run import RunDir
    from pipeline.runtime import runners, tensorrt_engine

    import onnx

    run = RunDir(run_dir, create=False)
    engine_bytes, sidecar = tensorrt_engine.load_engine_bytes(run)
    name = sidecar["profile"]["input"]
    out_name = onnx.load(str(run.file(sidecar["onnx"])), load_external_data=False).graph.output[0].name
    shape = [min(8, sidecar["profile"]["max"][0]), *sidecar["profile"]["min"][1:]]
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    runner = runners.TensorrtRunner(engine_bytes, sidecar, name="tensorrt_fp16", input_name=name,
                                    output_name=out_name)
    with runner:
        plain = dict(runner.timers({name: x}))
        gpu = p50(next(v for k, v in plain.items() if k.startswith("GPU compute")))
        host = p50(next(v for k, v in plain.items() if k.startswith("host latency")))
        reference = runner.infer({name: x})[out_name]
        graphed = runners.GraphedEngine(runner.engine, input_name=name, output_name=out_name, host=x)
        bench_gpu = p50(graphed.gpu_compute)
        events = events_around_replays(graphed.graph.replay, graphed.stream)
        graphed.host_latency()  # the replay's outputs, copied after the stream's synchronize
        replay_out = graphed.host_output.float().numpy()
        graphed.close()
    return {"engine": f"{artifacts.ENGINE}, batch {shape[0]}", "tensorrt": sidecar.get("tensorrt"),
            "gpu_compute_ms": {"a_benchmark": bench_gpu, f"b_events_{REPLAYS}_replays": events,
                               "c_trtexec": trtexec_compute(run, name, shape), "trtrunner_enqueue_events": gpu},
            "replay_equals_trtrunner_max_abs": max_abs_diff(replay_out, _numpy(reference)),
            "host_latency_ms": host, "per_call_overhead_ms": host - gpu}


def _numpy(value):
    return value.detach().cpu().numpy() if hasattr(value, "detach") else value


def trtexec_compute(run, input_name: str, shape: list[int]) -> float | str:
    from pipeline.core import artifacts
    from pipeline.runtime import trtexec

    exe = trtexec.find()
    if exe is None:
        return "not run: trtexec is not on PATH"
    out = run.file(trtexec.DIR)
    out.mkdir(parents=True, exist_ok=True)
    result = trtexec.measure(exe, run.file(artifacts.ENGINE), f"{input_name}:" + "x".join(map(str, shape)),
                             "GPU compute", out, "gpu_check", method(), shape[0])
    return result.get("p50", f"error: {result.get('error')}")


def build_log_section(run_dir: Path) -> dict:
    """The run's TensorRT build log (a TF32-off build: build.tf32 defaults to false)."""
    from pipeline.core.artifacts import build_log

    path = run_dir / build_log("fp16")
    if not path.is_file():
        return {"log": None, "note": f"not run: {path} does not exist (no TensorRT build in this run)"}
    lines = path.read_text(errors="replace").splitlines()
    return {"log": str(path), "lines": len(lines), "tf32_lines": [x for x in lines if "TF32" in x or "tf32" in x][:20],
            "tail": lines[-20:]}


def libcudart_section() -> dict:
    """The libcudart copies mapped by a child process that loads what the benchmark's TensorRT child loads."""
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=120, cwd=ROOT)
    try:
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return {"error": (done.stderr.strip().splitlines() or ["no output"])[-1]}


def guarded(section, *args) -> dict:
    try:
        return section(*args)
    except Exception as exc:  # one question failing must not hide the others
        return {"error": f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"}


def gather(run_dir: Path, steps: list[str]) -> dict:
    import torch

    cuda = torch.cuda.is_available()
    reason = "" if cuda else "not run: no CUDA GPU (torch.cuda.is_available() is False)"
    try:
        import tensorrt  # noqa: F401
        trt_reason = "" if cuda else reason
    except ImportError:
        trt_reason = "not run: TensorRT is not installed"
    if not trt_reason and not (run_dir / "model.fp16.engine").is_file():
        trt_reason = f"not run: {run_dir / 'model.fp16.engine'} does not exist"
    return {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "run_dir": str(run_dir),
            "gpu": torch.cuda.get_device_name() if cuda else None, "torch": torch.__version__, "steps": steps,
            "torch_graphs": guarded(torch_section) if cuda else {"note": reason},
            "tensorrt_graphs": guarded(tensorrt_section, run_dir) if not trt_reason else {"note": trt_reason},
            "tensorrt_build_log": guarded(build_log_section, run_dir), "libcudart": guarded(libcudart_section)}


def markdown(report: dict) -> str:
    out = [f"# GPU check, {report['date']}", "", f"GPU: {report['gpu'] or 'none'}; torch {report['torch']}; "
           f"run directory `{report['run_dir']}`", "", "## Steps", ""]
    out += [f"- {step}" for step in report["steps"]] or ["- (none recorded)"]
    for key, title in (("torch_graphs", "PyTorch CUDA graph"), ("tensorrt_graphs", "TensorRT engine")):
        section = report[key]
        out += ["", f"## {title}: GPU compute of one replay", ""]
        if "gpu_compute_ms" not in section:
            out.append(section.get("note") or section.get("error", ""))
            continue
        out += ["| measurement | ms |", "|---|---|"]
        out += [f"| {k} | {v:.4f} |" if isinstance(v, float) else f"| {k} | {v} |"
                for k, v in section["gpu_compute_ms"].items()]
        out += [""] + [f"- {k}: {v}" for k, v in section.items() if k != "gpu_compute_ms"]
    log = report["tensorrt_build_log"]
    out += ["", "## TensorRT build log (TF32 off)", "", log.get("log") and f"`{log['log']}`, {log['lines']} lines"
            or log.get("note", log.get("error", ""))]
    out += ["", "## libcudart in the benchmark's TensorRT child", "", "```", json.dumps(report["libcudart"], indent=1),
            "```", ""]
    return "\n".join(out)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--steps", type=Path, help="the step lines gpu_check.sh recorded")
    parser.add_argument("--out", type=Path, help="PREFIX of PREFIX.json and PREFIX.md (default RUN_DIR/gpu_check)")
    parser.add_argument("--steps-only", action="store_true",
                        help="measure nothing: rewrite PREFIX.json/.md with the steps file's lines")
    args = parser.parse_args(argv)
    steps = args.steps.read_text().splitlines() if args.steps and args.steps.is_file() else []
    prefix = args.out or args.run_dir / "gpu_check"
    previous = Path(f"{prefix}.json")
    if args.steps_only and previous.is_file():
        report = {**json.loads(previous.read_text()), "steps": steps}
    else:
        report = gather(args.run_dir, steps)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{prefix}.json").write_text(json.dumps(report, indent=2) + "\n")
    Path(f"{prefix}.md").write_text(markdown(report))
    print(markdown(report))
    print(f"written: {prefix}.json, {prefix}.md")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
