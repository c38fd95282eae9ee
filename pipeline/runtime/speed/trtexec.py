"""trtexec side by side: NVIDIA's own benchmark tool on the same engine and shapes as ours.

When ``trtexec`` is on PATH (it is in NGC images), benchmark runs it for every TensorRT row it measured,
per batch size, twice:

* GPU compute: ``--loadEngine=<engine> --shapes=<input>:<b>x<c>x<h>x<w>``, CUDA graphs and no data transfers,
  with ``--exportTimes`` and ``--exportProfile`` (per-layer times, from a separate profiling run so they do not
  perturb the timed one); compared with our "GPU compute" row through each record's ``computeMs``;
* host latency: the same with data transfers; compared with our "host latency" row through each record's
  ``latencyMs``, which trtexec defines as H2D + compute + D2H (a sum of CUDA-event intervals, not a wall clock
  around the three: ours includes the host's wait, so it is expected to be a little higher).

The flags depend on trtexec's version (its ``[TensorRT vMMmmpp]`` banner, read once from ``trtexec --help``):
TensorRT 10 needs ``--useCudaGraph``, ``--noDataTransfers`` and ``--separateProfileRun``; from TensorRT 11.0 CUDA
graphs and separate profiling are the default, data transfers are OFF unless ``--includeDataTransfers`` is given
(a flag TensorRT 10 does not know), and the three old flags are no-ops with a warning
(``samples/common/sampleOptions.cpp``). A trtexec whose version cannot be read is a note on its rows. An engine
deserializes only in the TensorRT release that built it, and pip's TensorRT wheels ship no trtexec: a trtexec of
another release than the engine's sidecar records is not run, its rows say ``{"not_run": "trtexec is TensorRT X,
the engine was built by TensorRT Y"}`` (no error: nothing failed).

``--exportTimes`` writes a JSON list of one record per timed inference (warm-up excluded):
``startEnqMs, endEnqMs, startH2dMs, endH2dMs, startComputeMs, endComputeMs, startD2hMs, endD2hMs, h2dMs,
computeMs, d2hMs, latencyMs`` (TensorRT's ``samples/common/sampleReporting.cpp``; TensorRT 7's older form
named the transfers ``inMs``/``outMs``). Only ``computeMs`` and ``latencyMs`` are read, so both forms work.
Their percentiles are recomputed with :func:`pipeline.runtime.speed.timing.summarize`, the method of our own rows
(trtexec's console summary uses another percentile rule).

A difference of the p50s larger than :data:`FLAG_RELATIVE` is flagged in the row, the report and the log.
A trtexec that fails, times out or writes no usable JSON is a note on that row (``{"error": ...}``), never the
end of the stage.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import re
import shutil
import subprocess
from pathlib import Path

from pipeline.core.artifacts import TRTEXEC_DIR as DIR
from pipeline.core.benchmark_rows import BenchmarkRow, TrtexecCheck
from pipeline.core.run import make_folder
from pipeline.core.timings import TimingKind
from pipeline.runtime.speed import timing

log = logging.getLogger("pipeline")

EXECUTABLE = "trtexec"
TIMEOUT_S = 600  # one trtexec run: engine load + warm-up + timed runs
FLAG_RELATIVE = 0.25  # |ours - trtexec| / trtexec of the p50s above this is flagged
RUNTIME = "TensorRT"  # the Backend.runtime of the rows compared
KINDS = {  # our row's timing kind, CUDA graphs or not (TimingKind.clock): (name, exportTimes field)
    TimingKind.GPU_COMPUTE: ("compute", "computeMs"),
    TimingKind.HOST_LATENCY: ("transfers", "latencyMs"),
}
NO_GRAPHS = "GPU compute without CUDA graphs"  # scripts/gpu_timing_check.py's reference for rows without graphs
FLAGS = {  # trtexec's TensorRT major -> kind name -> its flags; the profile's flags
    10: {"compute": ["--useCudaGraph", "--noDataTransfers"], "transfers": ["--useCudaGraph"],
         "compute-nographs": ["--noDataTransfers"], "profile": ["--separateProfileRun"]},
    # 11 captures graphs by default; --noCudaGraph turns that off (samples/common/sampleOptions.cpp)
    11: {"compute": [], "transfers": ["--includeDataTransfers"], "compute-nographs": ["--noCudaGraph"], "profile": []},
}


def flags_for(major: int) -> dict:
    """The flags of trtexec from TensorRT ``major`` (10 and 11 known; later ones as 11, earlier ones as 10)."""
    return FLAGS[11] if major >= 11 else FLAGS[10]


@functools.lru_cache(maxsize=None)
def version(exe: str) -> str | None:
    """trtexec's TensorRT release, ``major.minor.patch``, from the banner every run prints (``[TensorRT v110100]``
    is 11.1.0: ``samples/common/sampleUtils`` prints NV_TENSORRT_VERSION, major x 10000 + minor x 100 + patch), or
    None."""
    try:
        done = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r"\[TensorRT v(\d{5,})\]", done.stdout + done.stderr)
    if not match:
        return None
    number = int(match.group(1))
    return f"{number // 10000}.{number // 100 % 100}.{number % 100}"


def release(version_text: str | None) -> tuple[int, int, int] | None:
    """``(major, minor, patch)`` of a TensorRT version ("10.13.0.35", "11.1.0"), or None when it is not one."""
    match = re.fullmatch(r"\s*(\d+)\.(\d+)\.(\d+)(\.\d+)*\s*", version_text or "")
    return (int(match.group(1)), int(match.group(2)), int(match.group(3))) if match else None


def release_mismatch(trtexec_version: str | None, engine_version: str | None) -> str:
    """Why trtexec cannot load an engine built by TensorRT ``engine_version`` ("" when it can): a serialized engine
    deserializes only in the TensorRT release that built it (TensorRT's engine-compatibility notes), and pip's
    TensorRT wheels ship no trtexec, so the one on PATH may come from another install. Both named, or the one that
    is unknown."""
    ours, theirs = release(engine_version), release(trtexec_version)
    if ours is None:
        return f"trtexec is TensorRT {trtexec_version or '?'}, the engine's TensorRT version is not recorded"
    if theirs is None:
        return f"trtexec's TensorRT release is unknown (no [TensorRT vNNNNNN] banner), the engine was built by " \
               f"TensorRT {engine_version}"
    if ours != theirs:
        return f"trtexec is TensorRT {trtexec_version}, the engine was built by TensorRT {engine_version}"
    return ""


def find() -> str | None:
    """trtexec's path, or None when it is not on PATH."""
    return shutil.which(EXECUTABLE)


def command(exe: str, engine: Path, shape: str, kind: str, times: Path, profile: Path | None, method,
            major: int) -> list[str]:
    """The trtexec command line for trtexec from TensorRT ``major``: the kind's flags (see :data:`FLAGS`), our
    warm-up, at least our runs and duration, the JSON exports."""
    flags = flags_for(major)
    duration = max(1, math.ceil(method.min_duration_s * method.trials))
    return [exe, f"--loadEngine={engine}", f"--shapes={shape}", *flags[kind],
            f"--warmUp={round(method.warmup_s * 1000)}", f"--iterations={method.min_iterations * method.trials}",
            f"--duration={duration}", f"--exportTimes={times}",
            *([f"--exportProfile={profile}", *flags["profile"]] if profile else [])]


def read_times(path: Path, field: str) -> list[float]:
    """The ``field`` (ms) of every record of an ``--exportTimes`` file; ValueError when there is none."""
    try:
        records = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"no usable --exportTimes JSON ({type(exc).__name__}: {exc})") from None
    if not isinstance(records, list):
        raise ValueError(f"--exportTimes JSON is a {type(records).__name__}, not a list of records")
    values = [r[field] for r in records if isinstance(r, dict) and isinstance(r.get(field), (int, float))]
    if not values:
        raise ValueError(f"--exportTimes JSON has no record with {field!r} ({len(records)} records)")
    return [float(v) for v in values]


def run_once(cmd: list[str], log_path: Path) -> str:
    """Run trtexec, its output into ``log_path``; "" or the one-line reason it failed."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with log_path.open("w") as out:
            done = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, timeout=TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return f"trtexec timed out after {TIMEOUT_S} s (log: {log_path.name})"
    except OSError as exc:
        return f"trtexec could not start: {exc}"
    if done.returncode != 0:
        lines = [x.strip() for x in log_path.read_text(errors="replace").splitlines() if x.strip()]
        errors = [x for x in lines if "[E]" in x] or lines
        return f"trtexec exited {done.returncode}: {errors[-1] if errors else '(no output)'} (log: {log_path.name})"
    return ""


def measure(exe: str, engine: Path, shape: str, kind: TimingKind | str, out_dir: Path, stem: str, method,
            batch: int, built_by: str | None) -> TrtexecCheck:
    """One trtexec run of one kind (a key of :data:`KINDS`, or :data:`NO_GRAPHS`) on an engine built by TensorRT
    ``built_by`` (its sidecar's ``tensorrt``), parsed once into a :class:`TrtexecCheck`: its statistics, an ``error``
    when it failed, or why it was ``not_run`` when trtexec is another TensorRT release (:func:`release_mismatch`): no
    error of the row."""
    return TrtexecCheck.model_validate(_measured(exe, engine, shape, kind, out_dir, stem, method, batch, built_by),
                                       strict=False)


def _measured(exe: str, engine: Path, shape: str, kind: TimingKind | str, out_dir: Path, stem: str, method,
              batch: int, built_by: str | None) -> dict:
    name, field = {**KINDS, NO_GRAPHS: ("compute-nographs", "computeMs")}[kind]
    found = version(exe)
    if found is None:
        return {"metric": field, "error": f"trtexec's TensorRT version is unknown (no [TensorRT vNNNNNN] banner in "
                                          f"`{exe} --help`): its flags depend on it"}
    mismatch = release_mismatch(found, built_by)
    if mismatch:
        return {"metric": field, "tensorrt": found, "not_run": mismatch}
    major = int(found.split(".")[0])
    times, profile = out_dir / f"{stem}.{name}.times.json", out_dir / f"{stem}.{name}.profile.json"
    cmd = command(exe, engine, shape, name, times, profile if name == "compute" else None, method, major)
    times.unlink(missing_ok=True)
    error = run_once(cmd, out_dir / f"{stem}.{name}.log")
    if not error:
        try:
            stats = timing.summarize(read_times(times, field), batch)
        except ValueError as exc:
            error = f"trtexec {exc}"
    result = {"command": " ".join(cmd[1:]), "metric": field, "tensorrt_major": major, "tensorrt": found}
    if error:
        return {**result, "error": error}
    return {**result, **{k: stats[k] for k in ("p50", "p90", "p99", "mean", "iterations")},
            "times_json": f"{DIR}/{times.name}", **({"profile_json": f"{DIR}/{profile.name}"}
                                                    if profile.is_file() else {})}


def compare(row: BenchmarkRow, theirs: TrtexecCheck) -> TrtexecCheck:
    """``theirs`` with the relative difference of the p50s and the flag; logs a flagged or failed one."""
    where = f"{row.backend} b={row.batch_size} {row.timing.split(' (')[0]}"
    if theirs.error is not None:
        log.warning("benchmark: trtexec beside %s failed: %s", where, theirs.error)
        return theirs
    if theirs.not_run is not None:
        log.info("benchmark: trtexec beside %s not run: %s", where, theirs.not_run)
        return theirs
    ours, p50 = row.latency_ms.p50, theirs.p50 or 0.0
    diff = (ours - p50) / p50 if p50 > 0 else math.inf
    flagged = abs(diff) > FLAG_RELATIVE
    (log.warning if flagged else log.info)(
        "benchmark: %s: ours p50 %.3f ms, trtexec %s p50 %.3f ms (%+.0f%%)%s", where, ours, theirs.metric,
        p50, 100 * diff, f": large difference (> {FLAG_RELATIVE:.0%}), see docs/benchmark.md"
        if flagged else "")
    return theirs.model_copy(update={"difference": diff, "flag": flagged})


def side_by_side(run_dir, results: list[BenchmarkRow], backend_of, input_name: str, input_size: list[int],
                 method) -> list[BenchmarkRow]:
    """``results``, each TensorRT row with its ``trtexec`` cross-check when trtexec is on PATH."""
    exe = find()
    checked = [r for r in results if backend_of(r.backend).runtime == RUNTIME and _kind(r)]
    if exe is None or not checked:
        if checked:
            log.info("benchmark: trtexec is not on PATH: no side-by-side check of the TensorRT rows")
        return results
    out_dir = make_folder(run_dir.file(DIR))
    done: dict[tuple, TrtexecCheck] = {}

    def beside(row: BenchmarkRow) -> BenchmarkRow:
        if not any(row is r for r in checked):
            return row
        backend, batch, kind = backend_of(row.backend), row.batch_size, _kind(row)
        key = (backend.name, batch, kind)
        if key not in done:
            shape = f"{input_name}:" + "x".join(str(d) for d in (batch, *input_size))
            done[key] = measure(exe, run_dir.file(backend.artifact), shape, kind, out_dir,
                                f"{backend.name}.b{batch}", method, batch, engine_built_by(run_dir, backend.artifact))
        return row.model_copy(update={"trtexec": compare(row, done[key])})

    return [beside(row) for row in results]


def engine_built_by(run_dir, engine: str) -> str | None:
    """The TensorRT version the engine's sidecar records (None when it cannot be read: then trtexec is not run)."""
    from pipeline.core import engine_sidecar
    from pipeline.core.errors import InputError
    from pipeline.runtime.builders import tensorrt_engine

    try:
        sidecar = engine_sidecar.read(run_dir.file(tensorrt_engine.target_of(engine).sidecar), engine,
                                      rebuild="rebuild it")
    except (InputError, ValueError):
        return None
    return sidecar.platform.tensorrt


def _kind(row: BenchmarkRow) -> TimingKind | None:
    kind = row.timing_kind.clock
    return kind if kind in KINDS else None
