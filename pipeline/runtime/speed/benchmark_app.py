"""OpenVINO's own ``benchmark_app`` beside the pipeline's OpenVINO rows: the anchor users trust.

For the OpenVINO rows the summary names (``benchmark.benchmark_app_rows: summary``, the default; ``all``: every
OpenVINO backend benchmark timed, at every batch size), ``benchmark_app`` runs on the same
IR file (checked again through :func:`pipeline.runtime.builders.openvino_ir.load` first) with the same shape,
inference precision hint and thread count: once with ``-hint latency`` (one synchronous request,
beside our wall-clock row) and once with ``-hint throughput`` (OpenVINO's number of async requests,
beside our throughput row). Its JSON report (``-json_stats``) gives the median latency and the
throughput. A ratio outside ``[1/FLAG_RATIO, FLAG_RATIO]`` is flagged: one of the two measured
something else (a busy machine, another configuration).

``benchmark_app`` ships with the ``openvino`` wheel as a console script; where it is missing, the
comparison is skipped with that reason. ``benchmark.benchmark_app_s: 0`` turns it off.
"""

from __future__ import annotations

import functools
import json
import logging
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from pipeline.core.artifacts import xml_name
from pipeline.core.benchmark_rows import BenchmarkRow, CrossCheck
from pipeline.core.run import RunDir
from pipeline.core.timings import TimingKind

if TYPE_CHECKING:  # annotations only
    from pipeline.core.config_schema import Config

log = logging.getLogger("pipeline")

FLAG_RATIO = 1.5
ROUNDS = 3  # interleaved rounds of ours and benchmark_app's per checked row (each benchmark_app run: ~1.5 s + -t)
MODES = {TimingKind.CPU_CALL: "latency", TimingKind.ASYNC_THROUGHPUT: "throughput"}  # our row's kind -> its -hint


def find() -> str | None:
    """The ``benchmark_app`` console script: on PATH, else beside this Python (a virtual environment's bin)."""
    found = shutil.which("benchmark_app")
    if found:
        return found
    beside = Path(sys.executable).with_name("benchmark_app")
    return str(beside) if beside.is_file() else None


def command(exe: str, xml: Path, shape: list[int], mode: str, seconds: float, config: Path, folder: Path) -> list[str]:
    return [exe, "-m", str(xml), "-d", "CPU", "-shape", "[" + ",".join(map(str, shape)) + "]", "-hint", mode,
            "-t", str(max(1, round(seconds))), "-load_config", str(config), "-report_type", "no_counters",
            "-json_stats", "-report_folder", str(folder)]


@dataclass(frozen=True)
class AppRun:
    """One benchmark_app run's numbers, parsed once from its ``benchmark_report.json`` (:func:`parse`), and the
    command that ran it; written into benchmark.json (a cross-check row's ``benchmark_app``) by :meth:`to_json`."""

    p50_ms: float  # median latency
    mean_ms: float
    throughput_per_s: float  # images/s
    iterations: int
    requests: int  # parallel infer requests
    api: str | None
    command: str = ""

    def measure(self, mode: str) -> float:
        """What the mode compares: the p50 (ms) for ``latency``, images/s for ``throughput``."""
        return self.p50_ms if mode == "latency" else self.throughput_per_s

    def to_json(self) -> dict:
        return {"p50_ms": self.p50_ms, "mean_ms": self.mean_ms, "throughput_per_s": self.throughput_per_s,
                "iterations": self.iterations, "requests": self.requests, "api": self.api, "command": self.command}


@dataclass(frozen=True)
class AppFailed:
    """A benchmark_app run that gave no report: why, in one line."""

    error: str


def parse(report: dict) -> AppRun:
    """The numbers of a ``benchmark_report.json``: median latency (ms), mean, throughput (images/s), requests."""
    results, setup = report["execution_results"], report.get("configuration_setup", {})
    api = setup.get("API")
    return AppRun(p50_ms=float(results["latency (ms)"]), mean_ms=float(results["avg latency"]),
                  throughput_per_s=float(results["throughput"]),
                  iterations=int(results["total number of iterations"]),
                  requests=int(setup.get("number of parallel infer requests", 0) or 0),
                  api=api if isinstance(api, str) else None)


def run_one(exe: str, xml: Path, shape: list[int], mode: str, hint: str, threads: int,
            seconds: float) -> AppRun | AppFailed:
    """One benchmark_app run; its numbers, or why it gave none (one line)."""
    with tempfile.TemporaryDirectory(prefix="pipeline-benchmark-app-") as tmp:
        folder = Path(tmp)
        config = folder / "config.json"
        config.write_text(json.dumps({"CPU": {"INFERENCE_PRECISION_HINT": hint,
                                              "INFERENCE_NUM_THREADS": str(threads)}}))
        cmd = command(exe, xml, shape, mode, seconds, config, folder)
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=120 + 4 * seconds)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return AppFailed(f"benchmark_app did not finish: {type(exc).__name__}: {exc}")
        try:
            return replace(parse(json.loads((folder / "benchmark_report.json").read_text())), command=" ".join(cmd))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            tail = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()][-1:]
            return AppFailed(f"benchmark_app (exit {done.returncode}) gave no report ({type(exc).__name__})"
                             + (f": {tail[0][:200]}" if tail else ""))


def side_by_side(cfg: Config, run_dir: RunDir, results: list[BenchmarkRow], input_size: list[int], threads: int,
                 named: list[BenchmarkRow] = (),
                 ours_now: Callable[[BenchmarkRow, float], float] | None = None) -> CrossCheck:
    """benchmark_app's numbers beside ours for the OpenVINO rows among ``named`` (the rows the summary names:
    two benchmark_app runs instead of two per OpenVINO row, 18 for resnet18), or for every OpenVINO row with
    ``benchmark.benchmark_app_rows: all``; ``skipped`` says why when it cannot run."""
    skipped = _skipped(cfg, results, named)
    if skipped:
        return CrossCheck(skipped=skipped)
    return CrossCheck.model_validate(_checked(cfg, run_dir, results, input_size, threads, named, ours_now),
                                     strict=False)


def _skipped(cfg: Config, results: list[BenchmarkRow], named: list[BenchmarkRow]) -> str:
    """Why benchmark_app cannot run beside these rows; "" when it can."""
    from pipeline.runtime import backends

    ours = [r for r in results if backends.by_name(r.backend).runtime == backends.OV]
    if not ours:
        return "no OpenVINO row was measured"
    summary_only = getattr(cfg.benchmark, "benchmark_app_rows", "all") == "summary"
    if summary_only and not any(r is n for r in ours for n in named):
        return "the summary names no OpenVINO row (benchmark.benchmark_app_rows: all checks every OpenVINO row)"
    if not cfg.benchmark.benchmark_app_s:
        return "benchmark.benchmark_app_s is 0"
    if find() is None:
        return "benchmark_app is not installed (it ships with the openvino wheel)"
    return ""


def _checked(cfg: Config, run_dir: RunDir, results: list[BenchmarkRow], input_size: list[int], threads: int,
             named: list[BenchmarkRow], ours_now) -> dict:
    """benchmark.json's ``benchmark_app`` section: each OpenVINO row checked (see :func:`side_by_side`)."""
    from pipeline.runtime import backends
    from pipeline.runtime.builders import openvino_ir

    seconds, exe = cfg.benchmark.benchmark_app_s, find()
    ours = [r for r in results if backends.by_name(r.backend).runtime == backends.OV]
    if getattr(cfg.benchmark, "benchmark_app_rows", "all") == "summary":
        ours = [r for r in ours if any(r is n for n in named)]
    rows = []
    for name in dict.fromkeys(r.backend for r in ours):
        precision = backends.by_name(name).precision
        _, _, sidecar = openvino_ir.load(run_dir, precision)  # the same checked file, refused if it changed since
        xml = run_dir.file(xml_name(precision))
        for row in (r for r in ours if r.backend == name):
            mode = MODES[row.timing_kind]
            shape = [row.batch_size, *input_size]
            if ours_now is None:  # our row as the stage timed it, beside one benchmark_app run
                rows.append(compare(row, mode, run_one(exe, xml, shape, mode, sidecar["hint"], threads, seconds)))
            else:
                theirs = functools.partial(run_one, exe, xml, shape, mode, sidecar["hint"], threads, seconds)
                rows.append(interleaved(row, mode, theirs, functools.partial(ours_now, row, seconds)))
            log.info("benchmark: benchmark_app %-13s b=%-3d %-10s %s", name, row.batch_size, mode,
                     rows[-1].get("error") or rows[-1]["summary"])
    return {"tool": exe, "seconds": seconds, "flag_ratio": FLAG_RATIO, "rows": rows}


def interleaved(row: BenchmarkRow, mode: str, theirs: Callable[[], AppRun | AppFailed], ours: Callable[[], float],
                rounds: int = ROUNDS) -> dict:
    """Our timing of ``row`` and benchmark_app's, alternated in ``rounds`` rounds (which goes first shuffled each
    round): a load that comes and goes slows both sides of a round alike. The ratio (ours over benchmark_app's, in
    the mode's unit: p50 ms or images/s) is the geometric mean of the per-round ratios with its 95 % interval
    (:func:`pipeline.core.speed_claims.ratio`); :func:`agreement` reads it."""
    from pipeline.core import speed_claims

    base = {"backend": row.backend, "batch_size": row.batch_size, "mode": mode}
    mine: list[float] = []
    their_runs: list[AppRun] = []
    for order in speed_claims.round_orders(2, rounds, seed=row.batch_size):
        for side in order:
            if side == 0:
                ms = ours()
                mine.append(ms if mode == "latency" else row.batch_size * 1000.0 / ms)
            else:
                run = theirs()
                if isinstance(run, AppFailed):
                    return {**base, "error": run.error}
                their_runs.append(run)
    their_measures = [t.measure(mode) for t in their_runs]
    ratio = speed_claims.ratio(mine, their_measures)
    said = agreement(ratio)
    ours_mid, theirs_mid = float(np.median(mine)), float(np.median(their_measures))
    what = (f"p50 {ours_mid:.3f} ms (ours) vs {theirs_mid:.3f} ms (benchmark_app)" if mode == "latency" else
            f"{ours_mid:.1f} vs {theirs_mid:.1f} images/s (benchmark_app, {their_runs[-1].requests} requests)")
    return {**base, "ours": ours_mid, "benchmark_app": their_runs[-1].to_json(), "rounds": rounds,
            "ratio": ratio.estimate, "interval": ratio.to_json(), "agreement": said, "flagged": said != "agree",
            "ours_per_round": mine, "benchmark_app_per_round": their_measures,
            "summary": f"{what}, medians of {rounds} interleaved rounds; ratio {ratio.text()}"
                       + {"agree": "", "far apart": "  FLAGGED: far apart",
                          "undecided": "  IN DOUBT: the rounds disagree too much to tell"}[said]}


def agreement(ratio) -> str:
    """``agree``: the ratio's interval lies within ``[1/FLAG_RATIO, FLAG_RATIO]``; ``far apart``: wholly outside
    it; ``undecided``: it reaches across the band's edge (the machine's noise is wider than the band)."""
    low, high = 1 / FLAG_RATIO, FLAG_RATIO
    if low <= ratio.low and ratio.high <= high:
        return "agree"
    if ratio.high < low or ratio.low > high:
        return "far apart"
    return "undecided"


def compare(row: BenchmarkRow, mode: str, theirs: AppRun | AppFailed) -> dict:
    """Our row and benchmark_app's run, with the ratio that matters for the mode and a flag when far apart."""
    base = {"backend": row.backend, "batch_size": row.batch_size, "mode": mode}
    if isinstance(theirs, AppFailed):
        return {**base, "error": theirs.error}
    their = theirs.measure(mode)
    if mode == "latency":
        ours = row.latency_ms.p50
        what = f"p50 {ours:.3f} ms (ours) vs {their:.3f} ms (benchmark_app)"
    else:
        ours = row.throughput_per_s
        what = f"{ours:.1f} vs {their:.1f} images/s (benchmark_app, {theirs.requests} requests)"
    ratio = ours / their if their else None
    flagged = ratio is None or not (1 / FLAG_RATIO <= ratio <= FLAG_RATIO)
    return {**base, "ours": ours, "benchmark_app": theirs.to_json(), "ratio": ratio, "flagged": flagged,
            "summary": what + (f"; ratio {ratio:.2f}" if ratio else "") + ("  FLAGGED: far apart" if flagged else "")}
