"""Shared helpers: tiny configurations, the command line in-process and as a subprocess, a trained tiny run."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from filelock import FileLock
from hypothesis import settings

# The mutation command (scripts/mutation.sh) runs the property tests once per mutant: the same examples every time,
# so a mutant is killed or survives for a reason, not by the luck of one draw.
settings.register_profile("mutation", derandomize=True, database=None, deadline=None)

# With more than one xdist worker, each computes with one thread (torch's and OpenMP's pools; a stage that sets its own,
# such as benchmark.threads, still does): 2 workers with 2 threads each oversubscribed a 2-core machine, and the
# slowest modules ran 17-20 % faster without it. Set before anything imports torch; a value the user set stays.
if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
settings.load_profile(os.environ.get("PIPELINE_HYPOTHESIS_PROFILE", "default"))

ROOT = Path(__file__).resolve().parents[1]
FAULTS = ROOT / "tests" / "fault_models.py"

# Small enough that every stage runs in seconds on 2 CPU cores. One epoch on 100 images may or may not learn: these
# runs test the stages, so train's learning check only warns (it has its own tests: tests/test_recipes.py).
TINY = [
    "train.require_learning=false",
    "data.samples_per_class=12",
    "data.image_size=16",
    "data.batch_size=32",
    "train.epochs=1",
    "train.log_every=1",
    "export.fp16.calibration_samples=16",
    # INT8 has its own tests (tests/test_int8.py, on a model trained past near-tied logits); here it stays off,
    # which also checks that a run without INT8 says "disabled" and nothing else.
    "export.int8.enabled=false",
    # BF16 too (one graph fewer to export, verify and benchmark: about 15% of a tiny run); the tests about BF16 turn
    # it on themselves (BF16_ON, clone_bf16_run).
    "export.bf16.enabled=false",
    "verify.samples=48",
    "verify.batch_size=16",
    "benchmark.batch_sizes=[1,4]",
    "benchmark.min_duration_s=0.02",
    "benchmark.min_iterations=3",
    "benchmark.trials=2",
    "benchmark.warmup_s=0",
    "benchmark.max_row_s=0.25",
    "benchmark.backends=[torch_fp32,onnxrt_fp32,onnxrt_fp16_cpu]",
]
BF16_ON = "export.bf16.enabled=true"


def cli(*args: str) -> int:
    """Run the command line in this process; returns the exit code."""
    from pipeline.cli import main

    return main([str(a) for a in args])


def run_cli(*args: str, cwd: Path | None = None, env: dict | None = None, timeout: int = 600,
            **kwargs) -> subprocess.CompletedProcess:
    """Run ``python -m pipeline`` in a subprocess, as a user would."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.run([sys.executable, "-m", "pipeline", *map(str, args)], cwd=cwd or ROOT, env=full_env,
                          capture_output=True, text=True, timeout=timeout, **kwargs)


def benchmark_row(backend: str, batch: int = 1, p50: float = 1.0, images: float | None = None, **fields):
    """A :class:`~pipeline.core.benchmark_rows.BenchmarkRow` as benchmark makes one, with the fields a test does not
    care about filled in: ``p50`` (ms) every latency statistic, ``images`` the throughput (default: from ``p50``)."""
    from pipeline.core.benchmark_rows import BenchmarkRow
    from pipeline.core.timings import TimingKind

    kind = TimingKind(fields.pop("timing_kind", TimingKind.CPU_CALL))
    row = {"backend": backend, "precision": "fp32", "device": "cpu", "batch_size": batch,
           "timing": fields.pop("timing", str(kind)), "timing_kind": kind,
           "latency_ms": {**dict.fromkeys(("mean", "min", "max", "p50", "p90", "p95", "p99"), p50), "std": 0.0,
                          "cv": 0.0},
           "throughput_per_s": images if images is not None else batch * 1000.0 / p50, "iterations": 1, "trials": [],
           "stop": {"runs": 1, "reason": "trials done"}, "first_run_ms": p50, "cv_warning": False,
           "cuda_graphs": kind.cuda_graphs, "verify": "passed", "note": "", "workaround": None, "samples_ms": []}
    row.update(fields)
    row.setdefault("deployable", row["verify"] in ("passed", "reference"))
    return BenchmarkRow.model_validate(row, strict=False)


def built_once(tmp_path_factory, name: str, build) -> Path:
    """The run folder ``build(folder)`` makes, made once per session: by the first xdist worker that asks for it, and
    read by the others (each made its own before: 13-20 s of a 2-core CI twice). Read it, never change it."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # every worker's basetemp is a folder of this session's
    done, run_dir = root / f"{name}.done", root / name / "run"
    with FileLock(str(root / f"{name}.lock")):
        if not done.exists():
            shutil.rmtree(run_dir.parent, ignore_errors=True)
            run_dir.parent.mkdir()
            build(run_dir)
            done.touch()
    return run_dir


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory) -> Path:
    """A complete ``all`` run of tiny_cnn; copy it (``clone_run``) before changing anything in it."""
    def build(run_dir):
        assert cli("all", "--model", "tiny_cnn", "--run-dir", run_dir, *TINY) == 0

    return built_once(tmp_path_factory, "tiny", build)


@pytest.fixture(scope="session")
def tiny_bf16_run(tiny_run, tmp_path_factory) -> Path:
    """``tiny_run`` exported again with BF16 on (model.bf16.onnx beside the others); for the tests that build from
    it: its build, verify and benchmark are still tiny_run's. Copy it (``clone_bf16_run``) like tiny_run."""
    def build(run_dir):
        shutil.copytree(tiny_run, run_dir)
        (run_dir / ".lock").unlink(missing_ok=True)
        assert cli("export", "--run-dir", run_dir, BF16_ON) == 0

    return built_once(tmp_path_factory, "tiny_bf16", build)


def cloner(source: Path, tmp_path: Path):
    def clone() -> Path:
        target = tmp_path / "run"
        shutil.copytree(source, target)
        (target / ".lock").unlink(missing_ok=True)
        return target

    return clone


@pytest.fixture
def clone_run(tiny_run, tmp_path):
    return cloner(tiny_run, tmp_path)


@pytest.fixture
def clone_bf16_run(tiny_bf16_run, tmp_path):
    return cloner(tiny_bf16_run, tmp_path)


def trained_and_exported(tmp_path_factory, overrides: list[str]):
    """A module fixture's factory: ``get(model)`` trains and exports ``model`` once with ``overrides``."""
    runs = {}

    def get(model: str) -> Path:
        if model not in runs:
            run = tmp_path_factory.mktemp(model.split(":")[-1]) / "run"
            assert cli("train", "--model", model, "--run-dir", run, *overrides) == 0
            assert cli("export", "--run-dir", run) == 0
            runs[model] = run
        return runs[model]

    return get


def listed(run: Path, *names: str) -> None:
    """List ``names`` in the run's ledger (manifest ``files``), as if a stage had written them there once: a test that
    plants a file of its own where the tool writes one. Any other file makes every command refuse the run directory
    (tests/test_claim.py)."""
    import json

    manifest = json.loads((run / "manifest.json").read_text())
    manifest["files"] = sorted({*manifest.get("files", []), *names})
    (run / "manifest.json").write_text(json.dumps(manifest))


def copy_run(run: Path, tmp_path: Path) -> Path:
    target = tmp_path / "run"
    shutil.copytree(run, target)
    return target


@pytest.fixture(autouse=True)
def signal_handlers_kept():
    """Every test leaves SIGINT's, SIGTERM's and SIGCHLD's handlers as it found them (issue 46). A handler one test
    leaves behind (the CLI's, which only takes note; DataLoader's SIGCHLD handler, which a train with worker processes
    left and a later test in that worker died of) changes what happens in whichever test that worker runs next, so
    the defect would show, by chance, in another test. The handlers are put back here and the test that changed them
    fails."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD)}
    yield
    changed = [signal.Signals(sig).name for sig, handler in before.items() if signal.getsignal(sig) is not handler]
    for sig, handler in before.items():
        signal.signal(sig, handler)
    assert not changed, f"the test left its own handler for {', '.join(changed)}"


def slow_first(items) -> None:
    """The end-to-end runs of real models (``slow``: 10-50 s each) first, in their order, then the rest in theirs:
    xdist hands work out in collection order, and a 33 s test handed out last left the other worker idle for 16 s
    at the end of the suite (measured, 2026-12-03)."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def group_module_fixture_users(items) -> None:
    """The tests that share a module-scoped fixture (a model trained once for the file's tests) form one xdist group:
    with ``--dist loadgroup`` (pyproject's addopts) they run on one worker, which makes the fixture once; spread over
    every worker, each would train the same model again. Every other test is scheduled one by one."""
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        if info and any(defs[-1].scope == "module" for defs in info.name2fixturedefs.values() if defs):
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the groups
def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu`` skip, with the reason, where no CUDA GPU is visible; module fixture users are grouped."""
    group_module_fixture_users(items)
    slow_first(items)
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items:
        return
    from pipeline.core import env

    ok, reason = env.cuda_status()
    if not ok:
        for item in gpu_items:
            item.add_marker(pytest.mark.skip(reason=f"needs a CUDA GPU: {reason}"))
