"""Issue 45's load test: default ``tune`` three times on the planted decoy model while a bursty, multi-threaded
background load runs, and whether the choice holds.

    .venv/bin/python scripts/tune_under_load.py [--runs 3] [--workdir DIR] [--load-procs 2] [--max-s 1800]

The decoy (tests/decoy_model.py: four INT8-quantizable convolutions, one INT8-hostile) is trained and exported
once, on whatever the machine is doing. Then, per run, the load starts (``--load-procs`` processes, each two
threads of 256x256 float32 matrix products in random 50-500 ms bursts with random 50-500 ms pauses: what a second
job on a CI runner does to the runtime's own threads), ``python -m pipeline tune`` runs with its defaults on a fresh
copy of the exported run, and the load stops (it is bounded in time too: ``--max-s``, and it dies with this script).

Passes (exit 0) when every run chose the same layers in INT8 and that mix keeps at least 2 of the 4 convolutions in
INT8, or the runs that did not choose said "undecided" (exit 5) with the reason; exit 1 otherwise. Prints one line
per run and the CPU. Not part of the test suite (minutes on a 2-core machine).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL = f"{ROOT / 'tests' / 'decoy_model.py'}:decoy"
TRAIN = ["data.samples_per_class=30", "data.image_size=32", "data.batch_size=32", "train.epochs=4",
         "export.int8.calibration_samples=32", "export.fp16.calibration_samples=16", "verify.samples=100",
         "verify.batch_size=25"]
CONVS = 4


def _burst_worker(seed: int, stop_at: float) -> None:
    """Two threads of matrix products in random bursts and pauses, until ``stop_at`` (a wall-clock bound)."""
    import numpy as np

    def work(rng: random.Random) -> None:
        a = np.random.default_rng(rng.randrange(2**31)).random((256, 256), dtype=np.float32)
        while time.time() < stop_at:
            end = time.perf_counter() + rng.uniform(0.05, 0.5)
            while time.perf_counter() < end:
                a @ a
            time.sleep(rng.uniform(0.05, 0.5))

    threads = [threading.Thread(target=work, args=(random.Random(seed * 7 + i),), daemon=True) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


class BurstyLoad:
    """``procs`` load processes while in the ``with`` block (each bounded by ``max_s`` seconds whatever happens)."""

    def __init__(self, procs: int, max_s: float, seed: int):
        self.procs, self.max_s, self.seed, self.children = procs, max_s, seed, []

    def __enter__(self):
        os.environ.setdefault("OMP_NUM_THREADS", "1")  # each load thread is one thread (NumPy's BLAS would add more)
        ctx = mp.get_context("spawn")
        stop_at = time.time() + self.max_s
        self.children = [ctx.Process(target=_burst_worker, args=(self.seed * 100 + i, stop_at), daemon=True)
                         for i in range(self.procs)]
        for p in self.children:
            p.start()
        return self

    def __exit__(self, *exc):
        for p in self.children:
            p.terminate()
        for p in self.children:
            p.join(10)


def _cli(*args: str, cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeline", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--load-procs", type=int, default=2)
    parser.add_argument("--max-s", type=float, default=1800.0, help="bound on each run's load and tune (seconds)")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--quiet-load", action="store_true", help="no background load (the control)")
    parser.add_argument("--code", type=Path, default=ROOT, help="the source tree tune runs from (e.g. an older "
                        "commit's `git archive`, to compare; train and export always run from this one)")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from pipeline.core import env

    work = args.workdir or Path(tempfile.mkdtemp(prefix="tune-under-load-"))
    base = work / "exported"
    if not (base / "model.int8.onnx").is_file():
        shutil.rmtree(base, ignore_errors=True)
        for step in (("train", "--model", MODEL, "--run-dir", str(base), *TRAIN), ("export", "--run-dir", str(base))):
            done = _cli(*step, cwd=ROOT, timeout=args.max_s)
            if done.returncode:
                print(f"{step[0]} failed (exit {done.returncode}): {done.stderr.strip().splitlines()[-1:]}")
                return 1
    print(f"CPU: {env.cpu_model()}, {os.cpu_count()} logical CPUs; load: "
          f"{'none' if args.quiet_load else f'{args.load_procs} processes x 2 threads, bursts'}")
    outcomes = []
    for i in range(args.runs):
        run = work / f"tune-{i + 1}"
        shutil.rmtree(run, ignore_errors=True)
        shutil.copytree(base, run)
        start = time.perf_counter()
        load = BurstyLoad(0 if args.quiet_load else args.load_procs, args.max_s, seed=i + 1)
        with load:
            done = _cli("tune", "--run-dir", str(run), cwd=args.code, timeout=args.max_s)
        seconds = time.perf_counter() - start
        report = json.loads((run / "tune.json").read_text()) if (run / "tune.json").is_file() else {}
        chosen = report.get("chosen") or {}
        low = None if not chosen else CONVS - len(chosen["high"])
        outcome = {"run": i + 1, "exit": done.returncode, "seconds": round(seconds, 1),
                   "raised": sorted(chosen.get("high", [])) if chosen else None, "int8_layers": low,
                   "undecided": report.get("undecided", ""), "summary": report.get("summary", ""),
                   "sanity": [c["text"] for c in (report.get("sanity") or {}).get("checks", [])],
                   "exit_line": (done.stderr.strip().splitlines() or [""])[-1][:400] if done.returncode else ""}
        outcomes.append(outcome)
        print(json.dumps(outcome))
    chosen = [o for o in outcomes if o["raised"] is not None]
    same = len({tuple(o["raised"]) for o in chosen}) <= 1
    enough = all(o["int8_layers"] >= 2 for o in chosen)
    # A run that chose nothing must say why (undecided, exit 5); one that chose and then ended 5 chose a mix but its
    # speed gate could not decide (the line says so): the choice still counts.
    explained = all(o["raised"] is not None or (o["exit"] == 5 and o["undecided"]) for o in outcomes)
    ok = same and enough and explained
    print(f"{'PASS' if ok else 'FAIL'}: {len(chosen)} of {len(outcomes)} runs chose "
          f"{sorted({tuple(o['raised']) for o in chosen})} (INT8 layers: {[o['int8_layers'] for o in chosen]}); "
          f"undecided: {sum(1 for o in outcomes if o['raised'] is None)}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
