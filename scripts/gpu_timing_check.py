#!/usr/bin/env python3
"""The GPU questions the virtual CUDA device of the tests cannot answer, measured on a real GPU, with pass/fail rules.

    python scripts/gpu_timing_check.py RUN_DIR [--steps STEPS_FILE] [--out PREFIX]

Run by scripts/gpu_check.sh after its pipeline steps (RUN_DIR holds their run). It writes PREFIX.json and
PREFIX.md (default RUN_DIR/gpu_check), PREFIX.inspector.<precision>.json (the engine inspector's JSON of each
engine), and exits 0 when every check ran and passed, 1 when one failed, 3 when none failed but one did not run
(no GPU, no TensorRT, no engine, trtexec not on PATH or of another release) or was inconclusive (enqueue-bound).
The rules are pipeline.runtime.speed.gpu_check's:

* GPU compute of one inference as the benchmark measures it (its timer and timing loop, one inference queued
  ahead) against (b) CUDA events around K = 100 launches on the timer's stream, one more queued ahead, and (c)
  trtexec's computeMs, with and without CUDA graphs, for every engine the run built (FP16 and INT8), at batch 1
  (or the profile's smallest) and min(8, the profile's largest); and for a PyTorch ResNet-18 (224 px, batch 8,
  random weights) eager and graphed, against (b);
* a graph replay's outputs against Polygraphy's ``TrtRunner`` (eager PyTorch for the PyTorch model);
* every matrix layer's precision read from the engine inspector (``runtime_precisions``): none ``unknown``;
* every timing check judged with trtexec's enqueue-bound rule (``sampleReporting.cpp``: the host's enqueue time of
  one launch above 0.8 x the GPU compute time): where the host sets the pace, both timers measure the host and a
  pass is "inconclusive: enqueue-bound", with both numbers (pipeline.runtime.speed.gpu_check.host_paced);
* reported, not judged: the runner path's host latency and per-call overhead, the TF32-off build log, the
  libcudart copies mapped by a child process that loads what the benchmark's TensorRT child loads
  (``/proc/self/maps``), each section's seconds.

Without a CUDA GPU every GPU question is "not run: <reason>" and the summary is still written (the CPU-safe parts:
the child's maps, the build log, the report).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

if TYPE_CHECKING:  # annotations only
    from pipeline.core.engine_sidecar import ProfileShapes

REPLAYS = 100  # K: the launches between one pair of events of the reference timing (b)
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
    from pipeline.core import env
    loaded["exposed"] = env.expose_libcudart()  # what TensorrtRunner.activate does before Polygraphy's wrapper
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
    from pipeline.runtime.runners import TimingMethod

    return TimingMethod(**TINY_METHOD)


def p50(run_once) -> float:
    """The median of the benchmark's own timing loop (:func:`pipeline.runtime.runners.measure`) over ``run_once``."""
    from pipeline.runtime.runners import measure

    samples = sorted(measure(run_once, method())["samples"])
    return samples[len(samples) // 2]


def events_around(launch, stream) -> float:
    """(b): CUDA events on ``stream`` around :data:`REPLAYS` launches on that stream, one more queued ahead so the
    start event does not fire on an idle stream; ms per launch."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(stream):
        launch()
        start.record(stream)
        for _ in range(REPLAYS):
            launch()
        end.record(stream)
    end.synchronize()
    return start.elapsed_time(end) / REPLAYS


def enqueue_ms(launch, stream) -> float:
    """The host's time for one launch (median, no synchronize in between): what trtexec calls the enqueue time."""
    import torch

    from pipeline.runtime import runners

    times = []
    with torch.cuda.stream(stream):
        for _ in range(REPLAYS):
            t = runners.host_ms()
            launch()
            times.append(runners.host_ms() - t)
    stream.synchronize()
    return sorted(times)[len(times) // 2]


def max_abs_diff(a, b) -> float:
    import numpy as np

    return float(np.max(np.abs(np.asarray(a, np.float32) - np.asarray(b, np.float32))))


def max_abs(a) -> float:
    import numpy as np

    return float(np.max(np.abs(np.asarray(a, np.float32))))


def check_record(check) -> dict:
    return {"name": check.name, "status": str(check.status), "detail": check.detail}


def timing_checks(where: str, timings: dict) -> list:
    """(a) against (b) and (c): one Check each, judged with trtexec's enqueue-bound rule on ``timings["enqueue"]``
    (the host's time for one launch of the same work): where the host sets the pace a pass is inconclusive."""
    from pipeline.runtime.speed import gpu_check

    checks = [gpu_check.agreement(f"{where}: benchmark timer vs events around {REPLAYS} launches",
                                  timings["a_benchmark"], timings["b_events"], gpu_check.EVENTS_TOLERANCE),
              *([gpu_check.agreement(f"{where}: benchmark timer vs trtexec computeMs", timings["a_benchmark"],
                                     timings["c_trtexec"], gpu_check.TRTEXEC_TOLERANCE)] if "c_trtexec" in timings
                else [])]
    return [gpu_check.host_paced(c, timings["enqueue"], timings["a_benchmark"]) for c in checks]


# --------------------------------------------------------------------------- PyTorch


def torch_section(batch: int = 8, size: int = 224) -> dict:
    """PyTorch ResNet-18 (random weights) on CUDA, eager and graphed: the benchmark's timers against events."""
    import torch

    from pipeline import config
    from pipeline.core import modeling
    from pipeline.runtime import runners
    from pipeline.runtime.speed import gpu_check

    cfg = config.resolve(overrides=["model.name=resnet18", f"data.image_size={size}"])
    model, _ = modeling.build(cfg, 10, size)
    model = model.cuda().eval()
    x_host = torch.randn(batch, 3, size, size)

    def forward(x):
        with torch.inference_mode():
            return model(x)

    x_dev, stream = x_host.cuda(), torch.cuda.Stream()
    eager = {"a_benchmark": p50(_by_kind(runners.cuda_timers(forward, x_host, cuda_graphs=False))[GPU]),
             "b_events": events_around(lambda: forward(x_dev), stream),
             "enqueue": enqueue_ms(lambda: forward(x_dev), stream)}
    timers = _by_kind(runners.cuda_timers(forward, x_host, cuda_graphs=True))
    graphed = {"a_benchmark": p50(timers[GPU_GRAPHS])}
    host = p50(timers[HOST_GRAPHS])
    with torch.cuda.stream(stream):
        for _ in range(3):
            forward(x_dev)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream, capture_error_mode="thread_local"):
        static_out = forward(x_dev)
    graphed["b_events"] = events_around(graph.replay, stream)
    graphed["enqueue"] = enqueue_ms(graph.replay, stream)
    stream.synchronize()
    reference = forward(x_dev).float().cpu()
    torch.cuda.synchronize()
    difference = max_abs_diff(static_out.float().cpu(), reference)
    checks = [*timing_checks("PyTorch eager", eager), *timing_checks("PyTorch CUDA graph", graphed),
              gpu_check.same_outputs("PyTorch: graph replay equals eager", difference, max_abs(reference))]
    return {"model": f"resnet18 (random weights), batch {batch}, {size}x{size}, fp32",
            "gpu_compute_ms": {"eager": eager, "cuda_graphs": graphed}, "replay_vs_eager_max_abs": difference,
            "host_latency_ms": host, "per_call_overhead_ms": host - graphed["a_benchmark"],
            "checks": [check_record(c) for c in checks]}


# pipeline.core.timings.TimingKind's values (a StrEnum: each kind is its string)
GPU, GPU_GRAPHS = "gpu_compute", "gpu_compute_cuda_graphs"
HOST, HOST_GRAPHS = "host_latency", "host_latency_cuda_graphs"


def _by_kind(timers) -> dict:
    """A runner's timers by their kind's name (pipeline.core.timings.TimingKind; its labels are prose)."""
    return {timing.kind.value: run_once for timing, run_once in timers}


# --------------------------------------------------------------------------- TensorRT engines


def tensorrt_sections(run_dir: Path, out: Path) -> dict:
    """Every engine the run built (FP16, INT8): its timings per batch and what its inspector says."""
    from pipeline.core.run import RunDir
    from pipeline.runtime.builders import tensorrt_engine

    run = RunDir(run_dir, create=False)
    built = [t for t in tensorrt_engine.TARGETS if run.file(t.engine).is_file()]
    if not built:
        return {"note": f"not run: no engine in {run_dir}"}
    return {t.precision: guarded(engine_section, run, t, out) for t in built}


def engine_section(run, target, out: Path) -> dict:
    import onnx

    from pipeline.runtime import runners
    from pipeline.runtime.builders import tensorrt_engine

    engine_bytes, sidecar = tensorrt_engine.load_engine_bytes(run, engine=target.engine)
    model = onnx.load(str(run.file(sidecar.onnx or target.onnx)), load_external_data=False)
    profile, name, out_name = sidecar.profile, model.graph.input[0].name, model.graph.output[0].name
    dtype = onnx.helper.tensor_dtype_to_np_dtype(model.graph.input[0].type.tensor_type.elem_type)
    runner = runners.TensorrtRunner(engine_bytes, profile, note=sidecar.precision_label or "",
                                    name=f"tensorrt_{target.precision}", input_name=name,
                                    output_name=out_name)
    started = time.perf_counter()
    with runner:
        inspected = inspector_section(runner.engine, model, {name: profile.opt},
                                      Path(f"{out}.inspector.{target.precision}.json"), target.precision)
        batches = {b: batch_section(runner, run, target, name, out_name, [b, *profile.min[1:]], dtype,
                                    sidecar.platform.tensorrt)
                   for b in check_batches(profile)}
    checks = inspected.pop("checks") + [c for section in batches.values() for c in section.pop("checks")]
    return {"engine": target.engine, "tensorrt": sidecar.platform.tensorrt, "precision": sidecar.precision_label,
            "inspector": inspected, "batches": batches, "checks": checks,
            "seconds": round(time.perf_counter() - started, 1)}


def check_batches(profile: ProfileShapes) -> list[int]:
    """Batch 1 (or the profile's smallest) and min(8, the profile's largest)."""
    low, high = profile.min[0], profile.max[0]
    return sorted({max(1, low), max(low, min(8, high))})


def batch_section(runner, run, target, name: str, out_name: str, shape: list[int], dtype,
                  built_by: str | None) -> dict:
    """One batch of one engine: the default rows (no graphs: the runner's timers) and the graphed ones."""
    import numpy as np

    from pipeline.runtime import runners
    from pipeline.runtime.speed import gpu_check

    x = np.random.default_rng(0).standard_normal(shape).astype(dtype)
    plain = _by_kind(runner.timers({name: x}))
    gpu = plain[GPU]
    host = p50(plain[HOST])
    bound = runner.bound
    enqueue = enqueue_ms(bound.enqueue, bound.stream)
    nographs = {"a_benchmark": p50(gpu), "b_events": events_around(bound.enqueue, bound.stream), "enqueue": enqueue,
                "c_trtexec": trtexec_compute(run, target, name, shape, graphs=False, built_by=built_by)}
    reference = runners.to_numpy(runner.infer({name: x})[out_name])
    graphed_engine = runners.GraphedEngine(runner.engine, input_name=name, output_name=out_name, host=x)
    graphed = {"a_benchmark": p50(graphed_engine.gpu_compute),
               "b_events": events_around(graphed_engine.replay, graphed_engine.stream),
               "enqueue": enqueue_ms(graphed_engine.replay, graphed_engine.stream),
               "c_trtexec": trtexec_compute(run, target, name, shape, graphs=True, built_by=built_by)}
    graphed_engine.host_latency()  # the replay's outputs, copied after the stream's synchronize
    replayed = graphed_engine.host_output.float().numpy()
    graphed_engine.close()
    where = f"TensorRT {target.precision} b={shape[0]}"
    difference = max_abs_diff(replayed, reference)
    checks = [*timing_checks(f"{where} (no graphs, the default)", nographs),
              *timing_checks(f"{where} (CUDA graphs)", graphed),
              gpu_check.same_outputs(f"{where}: graph replay equals TrtRunner", difference, max_abs(reference))]
    return {"gpu_compute_ms": {"no_graphs": nographs, "cuda_graphs": graphed},
            "replay_vs_trtrunner_max_abs": difference, "host_latency_ms": host,
            "per_call_overhead_ms": host - nographs["a_benchmark"], "enqueue_ms": enqueue,
            "enqueue_bound": gpu_check.enqueue_bound(enqueue, nographs["a_benchmark"]),
            "checks": [check_record(c) for c in checks]}


def inspector_section(engine, model, shapes: dict, dump: Path, precision: str) -> dict:
    """The engine inspector's JSON (dumped to ``dump``) and what ``runtime_precisions`` reads from it."""
    from collections import Counter

    from pipeline.precision.int8 import MATRIX_OPS
    from pipeline.runtime.profiling import tensorrt_inspection
    from pipeline.runtime.speed import gpu_check

    dump.write_text(json.dumps(tensorrt_inspection.engine_information(engine, shapes), indent=1) + "\n")
    precisions = tensorrt_inspection.runtime_precisions(engine, model, shapes)
    unknown = [n for n, p in precisions.items() if p == "unknown"]
    total = sum(1 for n in model.graph.node if n.op_type in MATRIX_OPS)
    check = gpu_check.all_known(f"TensorRT {precision}: inspector reads every matrix layer", unknown, total)
    return {"json": str(dump), "matrix_layers": total, "unknown": len(unknown), "unknown_layers": unknown[:20],
            "precisions": dict(Counter(precisions.values())), "checks": [check_record(check)]}


def trtexec_compute(run, target, input_name: str, shape: list[int], graphs: bool, built_by: str | None) -> float | str:
    """(c): trtexec's computeMs p50, or why there is none: "not run: ..." (no trtexec; trtexec of another TensorRT
    release than the engine's, both named) or "error: ..." (it failed)."""
    from pipeline.runtime.speed import trtexec

    exe = trtexec.find()
    if exe is None:
        return "not run: trtexec is not on PATH"
    out = run.file(trtexec.DIR)
    out.mkdir(parents=True, exist_ok=True)
    from pipeline.core.timings import TimingKind

    kind = TimingKind.GPU_COMPUTE if graphs else trtexec.NO_GRAPHS
    result = trtexec.measure(exe, run.file(target.engine), f"{input_name}:" + "x".join(map(str, shape)), kind, out,
                             f"gpu_check.{target.precision}.b{shape[0]}", method(), shape[0], built_by)
    if result.not_run is not None:
        return f"not run: {result.not_run}"
    return result.p50 if result.p50 is not None else f"error: {result.error}"


# --------------------------------------------------------------------------- CPU-safe parts, the report


def build_log_section(run_dir: Path) -> dict:
    """The run's TensorRT build logs (a TF32-off build: build.tf32 defaults to false)."""
    from pipeline.core.artifacts import build_log

    found = {}
    for precision in ("fp16", "int8"):
        path = run_dir / build_log(precision)
        if path.is_file():
            lines = path.read_text(errors="replace").splitlines()
            found[precision] = {"log": str(path), "lines": len(lines),
                                "tf32_lines": [x for x in lines if "TF32" in x or "tf32" in x][:20],
                                "tail": lines[-20:]}
    return found or {"note": f"not run: no TensorRT build log in {run_dir} (no TensorRT build in this run)"}


def libcudart_section() -> dict:
    """The libcudart copies mapped by a child process that loads what the benchmark's TensorRT child loads."""
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=120, cwd=ROOT)
    try:
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return {"error": (done.stderr.strip().splitlines() or ["no output"])[-1]}


def guarded(section, *args) -> dict:
    from pipeline.core.status import Status

    try:
        return section(*args)
    except Exception as exc:  # one question failing must not hide the others
        name = getattr(section, "__name__", "section")
        error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        return {"error": error, "checks": [{"name": f"{name} ran", "status": str(Status.FAILED), "detail": error}]}


def not_run(name: str, reason: str) -> dict:
    from pipeline.core.status import Status

    return {"note": reason, "checks": [{"name": name, "status": str(Status.SKIPPED), "detail": reason}]}


def gather(run_dir: Path, steps: list[str], out: Path) -> dict:
    import torch

    cuda = torch.cuda.is_available()
    reason = "" if cuda else "not run: no CUDA GPU (torch.cuda.is_available() is False)"
    try:
        import tensorrt  # noqa: F401
        trt_reason = reason
    except ImportError:
        trt_reason = "not run: TensorRT is not installed"
    started = time.perf_counter()
    torch_part = guarded(torch_section) if cuda else not_run("PyTorch timings", reason)
    torch_part["seconds"] = round(time.perf_counter() - started, 1)
    engines = {"note": trt_reason} if trt_reason else tensorrt_sections(run_dir, out)
    checks = [*torch_part.get("checks", []),
              *(not_run("TensorRT timings", trt_reason)["checks"] if trt_reason else []),
              *[c for e in engines.values() if isinstance(e, dict) for c in e.get("checks", [])],
              *(not_run("TensorRT timings", engines["note"])["checks"] if "note" in engines and not trt_reason
                else [])]
    return {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "run_dir": str(run_dir),
            "gpu": torch.cuda.get_device_name() if cuda else None, "torch": torch.__version__, "steps": steps,
            "events_launches": REPLAYS, "checks": checks, "torch_graphs": torch_part, "tensorrt": engines,
            "tensorrt_build_log": guarded(build_log_section, run_dir), "libcudart": guarded(libcudart_section),
            "seconds": round(time.perf_counter() - started, 1)}


def exit_code(report: dict) -> int:
    from pipeline.core.status import Status
    from pipeline.runtime.speed import gpu_check

    return gpu_check.exit_code([gpu_check.Check(c["name"], Status(c["status"]), c["detail"])
                                for c in report["checks"]])


def markdown(report: dict) -> str:
    out = [f"# GPU check, {report['date']}", "", (f"GPU: {report['gpu'] or 'none'}; torch {report['torch']}; "
                                                    f"run directory `{report['run_dir']}`; "
                                                    f"{report.get('seconds', '?')} s"), "", "## Steps", ""]
    out += [f"- {step}" for step in report["steps"]] or ["- (none recorded)"]
    out += ["", "## Checks", "", "| check | status | detail |", "|---|---|---|"]
    out += [f"| {c['name']} | {c['status']} | {c['detail']} |" for c in report["checks"]] or ["| (none) | | |"]
    out += ["", "## PyTorch ResNet-18", "", _details(report["torch_graphs"])]
    engines = report["tensorrt"]
    out += ["", "## TensorRT engines", ""]
    if "note" in engines:
        out.append(engines["note"])
    for precision, section in ((k, v) for k, v in engines.items() if isinstance(v, dict)):
        out += [f"### {precision}", "", _details(section), ""]
    logs = report["tensorrt_build_log"]
    out += ["", "## TensorRT build logs (TF32 off)", ""]
    out += [f"- {p}: `{v['log']}`, {v['lines']} lines" for p, v in logs.items() if isinstance(v, dict)] or \
        [logs.get("note", logs.get("error", ""))]
    out += ["", "## libcudart in the benchmark's TensorRT child", "", "```", json.dumps(report["libcudart"], indent=1),
            "```", ""]
    return "\n".join(out)


def _details(section: dict) -> str:
    shown = {k: v for k, v in section.items() if k != "checks"}
    return "```\n" + json.dumps(shown, indent=1, default=str) + "\n```"


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
    prefix.parent.mkdir(parents=True, exist_ok=True)
    previous = Path(f"{prefix}.json")
    if args.steps_only and previous.is_file():
        report = {**json.loads(previous.read_text()), "steps": steps}
    else:
        report = gather(args.run_dir, steps, prefix)
    Path(f"{prefix}.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    Path(f"{prefix}.md").write_text(markdown(report))
    print(markdown(report))
    print(f"written: {prefix}.json, {prefix}.md")
    return exit_code(report)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
