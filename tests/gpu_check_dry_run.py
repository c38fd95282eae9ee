"""A dry run of scripts/gpu_check.sh's GPU-timed parts on the fakes, to size them for one GPU.

    python tests/gpu_check_dry_run.py [WORK_DIR]

On the CPU (no fakes): train and export ResNet-18 with gpu_check.sh's TINY settings (32 px, one epoch, FP16 and INT8
ONNX). Then with the fake TensorRT on the virtual CUDA device (tests/fake_tensorrt.py) and the stand-in trtexec
(tests/fake_trtexec.py): build both engines, benchmark their rows with CUDA graphs as gpu_check.sh's benchmark step
does, and run scripts/gpu_timing_check.py's TensorRT sections. It counts what sets their time on a GPU: every call of
the timing loop (``runners.measure``) with the method it was given, and every trtexec run.

Why count rather than time: here every fake kernel runs the engine's ONNX graph with ONNX Runtime on the CPU, tens
of milliseconds where a GPU takes a fraction of one, so the wall time of this run says nothing of a GPU's. On a GPU
one sample of these engines takes well under ``min_duration_s / min_iterations``, so each timing loop lasts its
method's wall-clock floor, ``first run + warmup_s + trials x min_duration_s``, whatever the GPU; the loops here run
with a fast method and are sized with the real one. What is assumed, not counted: :data:`TRTEXEC_S` per trtexec run
(process, CUDA context, engine load, its warm-up and duration), :data:`FIRST_S` per loop's first run.

``VIRTUAL_CUDA_LAUNCH_NS=200000 python tests/gpu_check_dry_run.py`` makes every launch dearer than the kernels it
launches: the host sets the pace, and the timing checks come out "inconclusive: enqueue-bound", each with its reason.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
sys.path[:0] = [str(TESTS), str(ROOT / "scripts")]

# gpu_check.sh's TINY settings
TINY = ["train.epochs=1", "data.samples_per_class=40", "data.image_size=32", "data.batch_size=32", "verify.samples=64",
        "benchmark.batch_sizes=[1,8]", "benchmark.min_duration_s=0.2", "benchmark.trials=2", "benchmark.warmup_s=0.2"]
FAST = {"warmup_s": 0, "min_iterations": 2, "min_duration_s": 0, "trials": 1, "cv_warn": 1.0}
TRTEXEC_S = 5.0  # one trtexec run on a GPU: start, CUDA context, engine load, --warmUp, --duration=1 (assumed)
FIRST_S = 0.1  # a timing loop's first run (lazy initialisation; assumed)


def floor_s(method) -> float:
    """A timing loop's wall-clock floor: what it lasts on a GPU whose sample is shorter than
    ``min_duration_s / min_iterations``."""
    return FIRST_S + method.warmup_s + method.trials * method.min_duration_s


def main(work: Path) -> dict:
    from conftest import cli
    from pipeline.runtime import runners
    from pipeline.runtime.speed import trtexec

    run, seconds = work / "run", {}

    def timed(name: str, *args):
        start = time.perf_counter()
        assert cli(*args) == 0, name
        seconds[name] = round(time.perf_counter() - start, 1)
        print(f"== {name}: {seconds[name]} s (here)", flush=True)

    timed("train (CPU)", "train", "--model", "resnet18", "--run-dir", run, "train.device=cpu", *TINY)
    timed("export (CPU)", "export", "--run-dir", run)
    loops: dict[str, list] = {"benchmark": [], "gpu_timing_check": []}
    trtexec_runs: list[str] = []
    with pytest.MonkeyPatch.context() as patch:
        import gpu_timing_check

        import fake_tensorrt
        from pipeline.runtime import backends

        fake_tensorrt.install(patch)
        patch.setattr(backends.Backend, "isolated", False)  # the fakes live in this process
        bin_dir = work / "bin"
        bin_dir.mkdir(exist_ok=True)
        (bin_dir / "trtexec").write_text(f'#!/bin/sh\nexec "{sys.executable}" "{TESTS / "fake_trtexec.py"}" "$@"\n')
        (bin_dir / "trtexec").chmod(0o755)
        patch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
        patch.setenv("FAKE_TRTEXEC_COMPUTE_MS", "virtual")
        measure, run_once = runners.measure, trtexec.run_once
        stage = ["benchmark"]
        patch.setattr(runners, "measure", lambda fn, method: loops[stage[0]].append(method) or measure(
            fn, runners.TimingMethod(**FAST)))
        patch.setattr(trtexec, "run_once", lambda cmd, log: trtexec_runs.append(stage[0]) or run_once(cmd, log))
        timed("build (fake TensorRT)", "build", "--run-dir", run, "--require", "tensorrt")
        timed("benchmark, TensorRT rows, CUDA graphs", "benchmark", "--run-dir", run,
              "benchmark.backends=[tensorrt_fp16,tensorrt_int8]", "benchmark.cuda_graphs=true")
        stage[0] = "gpu_timing_check"
        start = time.perf_counter()
        report = gpu_timing_check.tensorrt_sections(run, work / "gpu_check")
        seconds["gpu_timing_check.py TensorRT sections"] = round(time.perf_counter() - start, 1)
    failed = [f"{c['status']}: {c['name']}: {c['detail']}" for e in report.values() if isinstance(e, dict)
              for c in e.get("checks", []) if c["status"] != "passed"]
    sized = {name: {"timing loops": len(methods), "trtexec runs": trtexec_runs.count(name),
                    "seconds on a GPU (loops' floor + trtexec)": round(sum(floor_s(m) for m in methods)
                                                                       + TRTEXEC_S * trtexec_runs.count(name), 1)}
             for name, methods in loops.items()}
    print("checks not passed:", "\n  ".join(["", *failed]) if failed else "none")
    return {"seconds here": seconds, "on a GPU": sized}


if __name__ == "__main__":
    work_dir = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="gpu-check-dry-run."))
    work_dir.mkdir(parents=True, exist_ok=True)
    print(main(work_dir))
