"""The adaptive benchmark against the fixed (long) method on one run directory, on one machine at one time.

Usage: python scripts/benchmark_agreement.py RUN_DIR [--repeats N] [--out DIR] [key=value ...]

Runs ``python -m pipeline benchmark`` on RUN_DIR (a trained, exported, verified run; use a copy: benchmark.json and
config.yaml are rewritten) ``2 x N`` times, alternating ``benchmark.method=adaptive`` and ``=fixed`` (the order
swapped every repeat, so a drift in the machine's load falls on both alike), keeps each benchmark.json under DIR and
prints, per row (backend, batch, timing): the median of each method's medians, their ratio, how often the two
methods' 95 % intervals of one repeat overlap, how often the adaptive interval holds the fixed method's median, and
how far the fixed method's own repeats lie apart (the largest over the smallest median: the yardstick, since the
long method disagrees with itself too on a loaded machine); then the runs and seconds each method spent. Extra
``key=value`` overrides go to every run (both methods). ``--from DIR`` reads the benchmark.json files a previous run
kept in DIR instead of running anything. docs/benchmark.md publishes its output.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

METHODS = ("adaptive", "fixed")


@dataclass(frozen=True)
class Row:
    """One row of one benchmark.json: its median, its 95 % interval and the runs it took."""

    median: float
    low: float
    high: float
    runs: int
    reason: str


@dataclass(frozen=True)
class Agreement:
    key: str
    adaptive_ms: float  # the median over repeats of the adaptive medians
    fixed_ms: float
    ratio: float  # adaptive / fixed
    overlap: float  # share of repeats whose two intervals overlap
    covers: float  # share of repeats whose adaptive interval holds the fixed median
    adaptive_runs: float  # median runs per repeat
    fixed_runs: float
    reasons: str  # the adaptive rows' stop reasons, counted
    fixed_spread: float  # the fixed method against itself: its largest median over its smallest, over repeats
    adaptive_spread: float


def answer(payload: dict) -> str:
    """The answer a benchmark gives (its summary's rows): per device, the fastest that passed at the smallest batch
    by p50, and the most images/s at the largest."""
    from pipeline.benchmark import headline_rows

    named = headline_rows(payload["results"])
    return "; ".join(f"{device}: {pair[0]['backend']} / {pair[1]['backend']}" if pair else f"{device}: none"
                     for device, pair in named.items())


def rows_of(payload: dict) -> dict[str, Row]:
    rows = {}
    for r in payload["results"]:
        stop = r["stop"]
        low, high = stop["interval_ms"] or (float("nan"), float("nan"))
        key = f"{r['backend']} b={r['batch_size']} {'throughput' if r['timing'].startswith('throughput') else ''}"
        rows[key.strip()] = Row(r["latency_ms"]["p50"], low, high, stop["runs"], stop["reason"])
    return rows


def agreement(adaptive: list[dict[str, Row]], fixed: list[dict[str, Row]]) -> list[Agreement]:
    """Per row present in every repeat of both methods; repeat i of one method is paired with repeat i of the other."""
    keys = [k for k in adaptive[0] if all(k in run for run in adaptive + fixed)]
    found = []
    for key in keys:
        a, f = [run[key] for run in adaptive], [run[key] for run in fixed]
        a_ms, f_ms = statistics.median(r.median for r in a), statistics.median(r.median for r in f)
        overlap = sum(x.low <= y.high and y.low <= x.high for x, y in zip(a, f, strict=True)) / len(a)
        covers = sum(x.low <= y.median <= x.high for x, y in zip(a, f, strict=True)) / len(a)
        reasons = ", ".join(f"{n} {r}" for r, n in sorted(Counter(x.reason for x in a).items()))
        found.append(Agreement(key, a_ms, f_ms, a_ms / f_ms, overlap, covers, statistics.median(x.runs for x in a),
                               statistics.median(y.runs for y in f), reasons, _spread(f), _spread(a)))
    return found


def _spread(rows: list[Row]) -> float:
    medians = [r.median for r in rows]
    return max(medians) / min(medians)


def run_once(run_dir: Path, method: str, overrides: list[str], out: Path, repeat: int) -> tuple[dict, float]:
    """One benchmark of ``run_dir`` with ``method``: its benchmark.json (kept in ``out``) and its wall seconds."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "pipeline", "-q", "benchmark", "--run-dir", str(run_dir),
                    f"benchmark.method={method}", "benchmark.benchmark_app_s=0", *overrides], check=True,
                   env={**os.environ, "PYTHONUNBUFFERED": "1"})
    seconds = time.perf_counter() - start
    payload = json.loads((run_dir / "benchmark.json").read_text())
    (out / f"{method}.{repeat}.json").write_text(json.dumps(payload, indent=1))
    return payload, seconds


def table(found: list[Agreement]) -> str:
    lines = ["| row | adaptive p50 ms | fixed p50 ms | ratio | intervals overlap | adaptive holds fixed median "
             "| fixed / adaptive spread over repeats | runs adaptive / fixed | adaptive stopped |",
             "|---|---|---|---|---|---|---|---|---|"]
    for g in found:
        lines.append(f"| {g.key} | {g.adaptive_ms:.3f} | {g.fixed_ms:.3f} | {g.ratio:.2f} | {g.overlap:.0%} | "
                     f"{g.covers:.0%} | {g.fixed_spread:.2f} / {g.adaptive_spread:.2f} | "
                     f"{g.adaptive_runs:g} / {g.fixed_runs:g} | {g.reasons} |")
    return "\n".join(lines)


def collect(args) -> tuple[dict[str, list[dict[str, Row]]], dict[str, list[float]]]:
    """Each method's rows per repeat and its wall seconds: run now, or read from ``--from``."""
    runs: dict[str, list[dict[str, Row]]] = {m: [] for m in METHODS}
    seconds: dict[str, list[float]] = {m: [] for m in METHODS}
    if args.source:
        for method in METHODS:
            for path in sorted(args.source.glob(f"{method}.*.json")):
                payload = json.loads(path.read_text())
                runs[method].append(rows_of(payload))
                print(f"{path.stem}: the answer (batch-1 latency / largest-batch images/s): {answer(payload)}")
        seconds = json.loads((args.source / "agreement.json").read_text())["seconds"]
        return runs, seconds
    args.out.mkdir(parents=True, exist_ok=True)
    for repeat in range(args.repeats):
        for method in METHODS if repeat % 2 == 0 else reversed(METHODS):
            payload, wall = run_once(args.run_dir, method, args.overrides, args.out, repeat)
            runs[method].append(rows_of(payload))
            seconds[method].append(wall)
            print(f"repeat {repeat} {method}: {wall:.1f} s, load {os.getloadavg()[0]:.1f}; the answer: "
                  f"{answer(payload)}", flush=True)
    return runs, seconds


def summary(found: list[Agreement], runs: dict, seconds: dict) -> str:
    ratios = [g.ratio for g in found]
    lines = [f"ratio adaptive/fixed: median {statistics.median(ratios):.2f}, range {min(ratios):.2f}-{max(ratios):.2f};"
             f" intervals overlap in {statistics.mean(g.overlap for g in found):.0%} of row-repeats; the fixed method "
             f"against itself: median spread {statistics.median(g.fixed_spread for g in found):.2f}, largest "
             f"{max(g.fixed_spread for g in found):.2f}"]
    for method in METHODS:
        total = [sum(r.runs for r in run.values()) for run in runs[method]]
        lines.append(f"{method}: {statistics.median(seconds[method]):.1f} s per benchmark (median of "
                     f"{len(seconds[method])}), {statistics.median(total):g} timed runs over "
                     f"{len(runs[method][0])} rows")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path, nargs="?")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("agreement"))
    parser.add_argument("--from", dest="source", type=Path, help="read the runs kept in this folder; run nothing")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_intermixed_args(argv)
    if args.run_dir is None and args.source is None:
        parser.error("give RUN_DIR, or --from DIR")
    runs, seconds = collect(args)
    found = agreement(runs["adaptive"], runs["fixed"])
    print(table(found))
    print()
    print(summary(found, runs, seconds))
    if not args.source:
        (args.out / "agreement.json").write_text(json.dumps({"rows": [g.__dict__ for g in found],
                                                            "seconds": seconds}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
