"""The benchmark stage: latency and throughput of the backends that can change the answer, measured seriously.

Method (docs/benchmark.md): a first run for lazy initialisation, warm-up by time, then timed runs until the stop
rule (:mod:`pipeline.runtime.speed.stopping`) says the row's median is known within ``benchmark.target_halfwidth`` at
95 % confidence, or its time cap; at least ``benchmark.min_runs``. ``benchmark.method: fixed`` keeps the old method:
repeated trials of at least ``min_iterations`` runs and ``min_duration_s`` seconds each. Percentiles
(p50/p90/p95/p99), mean, standard deviation and coefficient of variation over every timed run, with a warning when
a trial is noisy. Every backend gets the same real validation images, the same warm-up and the same timing method.

The backends are :data:`pipeline.runtime.backends.TABLE`'s entries named in ``benchmark.backends``, or when that is
null its defaults: only the decisive ones (:func:`choose_rows`) unless ``benchmark.rows: all``. Each is timed through
its runner's timing hook (``timers(feed)``, see :mod:`pipeline.runtime.runners`):

* CPU: wall clock around a synchronous call; intra-op threads set and recorded.
* GPU: CUDA events around work on device-resident inputs ("GPU compute"), and separately the
  host latency including host-to-device and device-to-host copies; optional CUDA graphs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from pipeline.core import artifacts, data, env, modeling
from pipeline.core.benchmark_rows import (
    BenchmarkEnvironment,
    BenchmarkMethod,
    BenchmarkRow,
    CrossCheck,
    SkippedRow,
    Stop,
    rows_of,
    to_json,
)
from pipeline.core.errors import BackendUnavailable, InputError, UsageError
from pipeline.core.run import RunDir, StageRecord, atomic_path, atomic_write, now, write_json
from pipeline.core.speed_claims import Ratio
from pipeline.core.status import Status
from pipeline.core.timings import Timing, TimingKind
from pipeline.core.verdicts import InconclusivePolicy, counts_as_passed
from pipeline.evaluation import candidates
from pipeline.reports import profile_report, verify_report
from pipeline.runtime import backends, isolate
from pipeline.runtime.backends import Backend, Context
from pipeline.runtime.isolate import Crashed
from pipeline.runtime.profiling import layer_profile
from pipeline.runtime.runners import TimingMethod, measure, one_line  # noqa: F401  (measure: the timing loop)
from pipeline.runtime.speed import benchmark_app, stopping, trtexec
from pipeline.runtime.speed.timing import summarize

if TYPE_CHECKING:  # annotations only
    from pipeline.core.config_schema import Config

log = logging.getLogger("pipeline")

JSON, MARKDOWN = artifacts.BENCHMARK_JSON, artifacts.BENCHMARK_MD
LATENCY_PLOT, THROUGHPUT_PLOT = artifacts.LATENCY_PLOT, artifacts.THROUGHPUT_PLOT
TRACE = artifacts.BENCHMARK_TRACE
SCHEMA = "pipeline.benchmark/1"


# --------------------------------------------------------------------------- backends


def _inputs(images: np.ndarray, batch: int) -> np.ndarray:
    reps = math.ceil(batch / len(images))
    return np.ascontiguousarray(np.concatenate([images] * reps)[:batch])


def _start(backend: Backend, ctx: Context):
    """The backend's active runner, or the reason it cannot run here (one that fails does not stop the others)."""
    reason = backend.unavailable(ctx) if backend.benchmark else "verify-only (not a deployment to time)"
    if reason and backend.required(ctx.cfg):
        raise BackendUnavailable(f"{backend.name} required (require: {backend.requires}) but {reason}")
    if reason:
        return None, reason
    try:
        runner = isolate.runner_for(backend, ctx)  # native runtimes: in a child process (pipeline.runtime.isolate)
        runner.activate()
    except (BackendUnavailable, InputError):
        raise
    except Crashed as exc:
        return None, crashed(backend, exc)
    except Exception as exc:
        return None, f"could not start: {type(exc).__name__}: {exc}"
    return runner, ""


def crashed(backend: Backend, exc: Crashed) -> str:
    """The skipped row's reason for a backend whose child process died, with the log to read."""
    log.warning("benchmark: %s crashed: %s; last lines of %s:\n  %s", backend.name, exc, exc.log,
                "\n  ".join(exc.tail) or "(empty)")
    return f"crashed: {exc} (log: {exc.log})"


def time_backend(backend: Backend, ctx: Context, images, method: TimingMethod, verdict: str,
                 accuracy: float | None = None, policy: InconclusivePolicy = "pass",
                 throughput_batches: list[int] | None = None) -> tuple[list[BenchmarkRow], list[SkippedRow]]:
    """Every timing of one backend over the batch sizes: (result rows, skipped rows); an async-throughput timing
    only at ``throughput_batches`` (None: at every batch size).

    Each (batch, timing) is measured on its own: one that fails (CUDA out of memory at a large batch, a CUDA
    graph capture, a TensorRT call returning False) becomes a skipped row "error: <one line>" and the other
    batches and timings go on. A child process that dies ends this backend (a "crashed" row).
    """
    runner, reason = _start(backend, ctx)
    if runner is None:
        log.info("benchmark: %-17s skipped: %s", backend.name, reason)
        return [], [SkippedRow(backend=backend.name, reason=reason)]
    results: list[BenchmarkRow] = []
    skipped: list[SkippedRow] = []
    try:
        for batch in ctx.cfg.benchmark.batch_sizes:
            timing = method if throughput_batches is None else \
                dataclasses.replace(method, throughput=batch in throughput_batches)
            rows, skips = _time_batch(backend, ctx, runner, batch, images, timing, verdict)
            results += [row.model_copy(update={"accuracy": accuracy,
                                               "deployable": backend.deploys and deployable(verdict, policy)})
                        for row in rows]
            skipped += skips
    except Crashed as exc:  # the rows measured so far stand; the rest of this backend is a "crashed" row
        skipped.append(SkippedRow(backend=backend.name, batch_size=batch, reason=crashed(backend, exc),
                                  log=str(exc.log), log_tail=list(exc.tail)))
    finally:
        runner.deactivate()
    return results, skipped


def _time_batch(backend: Backend, ctx: Context, runner, batch: int, images, method: TimingMethod,
                verdict: str) -> tuple[list[BenchmarkRow], list[SkippedRow]]:
    """One batch size of one backend: its rows, or a skipped row saying why (Crashed propagates)."""
    try:
        why = runner.batch_reason(batch)
        if why:
            return [], [SkippedRow(backend=backend.name, batch_size=batch, reason=why)]
        timings = runner.measurements({ctx.spec.input_name: _inputs(images, batch)}, method)
    except (Crashed, BackendUnavailable, InputError):
        raise
    except Exception as exc:
        return [], [_error_row(backend, batch, None, one_line(exc))]
    rows: list[BenchmarkRow] = []
    skips: list[SkippedRow] = []
    for timing, m in timings:
        if "error" in m:
            skips.append(_error_row(backend, batch, timing, m["error"]))
            continue
        try:
            rows.append(_row(backend, ctx, runner, batch, timing, m, verdict))
        except ValueError as exc:  # a run no clock measures (0 ms): benchmark.json cannot hold it, compare could not
            skips.append(_error_row(backend, batch, timing, f"not a recordable measurement: {one_line(exc)}"))
            continue
        _log_row(rows[-1])
    return rows, skips


def _error_row(backend: Backend, batch: int, timing: Timing | None, error: str) -> SkippedRow:
    log.warning("benchmark: %s at batch %d%s failed: %s", backend.name, batch, f" ({timing.label})" if timing else "",
                error)
    return SkippedRow(backend=backend.name, batch_size=batch, timing=timing.label if timing else None,
                      timing_kind=timing.kind if timing else None, reason=f"error: {error}")


def _row(backend: Backend, ctx: Context, runner, batch: int, timing: Timing, m: dict, verdict: str) -> BenchmarkRow:
    """The measured row (``m``: :func:`pipeline.runtime.runners.measure`'s dict, from this process or a child's);
    validated leniently: the values are this process's own, numbers as the timer gave them."""
    stats = summarize(m["samples"], batch)
    return BenchmarkRow.model_validate({
        "backend": backend.name,
        "precision": getattr(runner, "precision", None) or backend.shown_precision or backend.precision,
        "device": backend.on(ctx),
        "batch_size": batch,
        "timing": timing.label,  # for people; decisions read timing_kind
        "timing_kind": timing.kind,
        "latency_ms": {k: stats[k] for k in ("mean", "std", "cv", "min", "max", "p50", "p90", "p95", "p99")},
        "throughput_per_s": stats["throughput"],
        "iterations": stats["iterations"],
        "trials": m["trials"],
        "stop": m["stop"],  # runs taken, the median, its 95% interval, why timing stopped
        "first_run_ms": m["first_run_ms"],
        "cv_warning": m["cv_warning"],
        "cuda_graphs": timing.kind.cuda_graphs,
        "verify": verdict,
        "note": getattr(runner, "note", "") or backend.note,
        "workaround": getattr(runner, "workaround", "") or None,
        "samples_ms": [round(s, 5) for s in m["samples"]],  # every timed run: compare bootstraps its medians
    }, strict=False)


def _log_row(r: BenchmarkRow) -> None:
    log.info("benchmark: %-17s b=%-3d p50 %8.3f ms  p99 %8.3f ms  %9.1f img/s  cv %4.1f%%  %s%s%s", r.backend,
             r.batch_size, r.latency_ms.p50, r.latency_ms.p99, r.throughput_per_s,
             100 * r.latency_ms.cv, stop_text(r.stop),
             "  (async throughput; ms per batch)" if r.is_throughput else "", "  (noisy)" if r.cv_warning else "")


def stop_text(stop: Stop) -> str:
    """``n=35, median +-3.1% (95%), converged``: a row's runs, its interval and why timing stopped."""
    width = stop.relative_halfwidth
    interval = f"+-{100 * width:.1f}%" if width is not None and math.isfinite(width) else "no interval"
    return f"n={stop.runs}, median {interval} (95%), {stop.reason}"


def deployable(verdict: str, policy: InconclusivePolicy) -> bool:
    """Whether a row may be named "fastest that passed": the reference, or a verdict that counts as passed
    (``counts_as_passed``, under the policy verify ran with)."""
    return verdict == "reference" or counts_as_passed(verdict, policy)


def verify_column(backend: Backend, verdicts: dict) -> str:
    """What verify said about a backend: "reference", a candidate's status, or "not verified"."""
    vouched = backends.verified_by(backend)
    return "reference" if vouched == "reference" else verdicts.get(vouched, Status.NOT_VERIFIED)


# --------------------------------------------------------------------------- the stage


def run(cfg: Config, run_dir: RunDir, record: StageRecord, *, profile: bool = False) -> None:
    threads = cfg.benchmark.threads or env.usable_cores()
    with torch_threads(threads):
        _run(cfg, run_dir, record, threads, profile)


@contextlib.contextmanager
def torch_threads(threads: int):
    """PyTorch's intra-op threads for the stage, and the caller's back after it: a process that goes on (``run_all``
    from Python, a test worker) kept the benchmark's count for everything after, training included."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def _run(cfg: Config, run_dir: RunDir, record: StageRecord, threads: int, profile: bool) -> None:
    bc = cfg.benchmark
    model, card = modeling.load_trained(cfg, run_dir, "benchmark")
    spec = card.spec
    check_batch_sizes(bc.batch_sizes, spec.input_size, env.memory_bytes())
    images, _ = data.validation_batch(cfg, card, max(bc.batch_sizes))
    method = method_of(cfg)
    log.info("benchmark: batch sizes %s, %d threads, %s", bc.batch_sizes, threads, describe_method(method))
    _log_unused(cfg)
    rows = choose_rows(cfg)
    _log_rows(rows)
    ctx = Context(cfg, run_dir, "benchmark", spec, model=model, threads=threads, gpu=env.cuda_status()[0])
    results, skipped = _time_all(ctx, rows, images, method)
    results = trtexec.side_by_side(run_dir, results, backends.by_name, spec.input_name, spec.input_size, method)
    results = add_ratios(results)
    _warn_noisy(cfg, results)
    payload = _payload(cfg, spec, threads, results, skipped)
    payload["rows"] = dataclasses.asdict(rows)
    payload.update(layer_profile.benchmark_keys(ctx, results, images, threads))  # "profiles", "roofline" (issue 35)
    named = [row for pair in headline_rows(results).values() if pair for row in pair]
    with Retimer(ctx, images, method) as retimer:
        held = contests(results, retimer, cfg.tune.same_speed)
        crosscheck = benchmark_app.side_by_side(cfg, run_dir, results, spec.input_size, threads, named,
                                                retimer.block)
    payload["contests"] = {key: contest.to_json() for key, contest in held.items()}
    payload["benchmark_app"] = crosscheck.to_json()
    payload["headline"] = _headline(results, held, crosscheck)
    write_json(run_dir.file(JSON), payload)
    atomic_write(run_dir.file(MARKDOWN), markdown(payload))
    plots = write_plots(run_dir, payload) + profile_report.write_plot(run_dir, payload)
    for name in (JSON, MARKDOWN, *plots):
        record.artifact(name)
    if profile:
        profile_torch(cfg, run_dir, model, images, record)
    record.details.update({"results": len(results), "skipped": skipped, "threads": threads,
                           "headline": payload["headline"], "left_out": rows.left_out,
                           "workarounds": {r.backend: r.workaround for r in results if r.workaround}})


def _time_all(ctx: Context, chosen: Rows, images, method: TimingMethod) -> tuple[list[BenchmarkRow], list[SkippedRow]]:
    """Every chosen backend timed, in order: (result rows, skipped rows)."""
    verdicts = verify_report.read_verdicts(ctx.run_dir) or {}
    policy = verify_report.read_policy(ctx.run_dir)
    accuracies = verify_report.read_accuracies(ctx.run_dir)
    results: list[BenchmarkRow] = []
    skipped: list[SkippedRow] = []
    for name in chosen.timed:
        backend = backends.by_name(name)
        rows, skips = time_backend(backend, ctx, images, method, verify_column(backend, verdicts),
                                   accuracies.get(backends.verified_by(backend)), policy,
                                   chosen.throughput_batches)
        results += rows
        skipped += skips
    return results, skipped


def _warn_noisy(cfg: Config, results: list[BenchmarkRow]) -> None:
    noisy = [f"{r.backend}@{r.batch_size}" for r in results if r.cv_warning]
    if noisy:
        log.warning("benchmark: warning: %d of %d measurements had a trial with a coefficient of variation above "
                    "%.1f%% (%s): the machine was busy or the runs are too short; close other programs or raise "
                    "benchmark.%s", len(noisy), len(results), 100 * cfg.benchmark.cv_warn, ", ".join(noisy),
                    "max_row_s" if cfg.benchmark.method == "adaptive" else "min_duration_s")


# --------------------------------------------------------------------------- the headline, in interleaved rounds


now_s = time.perf_counter  # the contests' cost, in benchmark.json
CONTEST_ROUNDS = 6  # interleaved rounds of the headline's contenders (their order shuffled each round)
CONTEST_BLOCK_S = 0.05  # timed seconds per contender and round (9.4 s a contest at 0.1 s, load average 25)
CONTEST_MAX = 3  # contenders: the headline row and the closest others (a row timed alone can be 5x off on a busy CPU)


class Retimer:
    """Rows of this benchmark timed again, now, on the runners that timed them (each backend started once, in its
    child process, and kept until the end): what the headline's contest and the benchmark_app cross-check
    interleave with their rivals. ``block(row, seconds)``: the row's timing for ``seconds``; its median (ms; ms
    per batch for an async-throughput row)."""

    def __init__(self, ctx: Context, images, method: TimingMethod):
        self.ctx, self.images, self.method, self.runners = ctx, images, method, {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for runner in self.runners.values():
            if runner is not None:
                with contextlib.suppress(Exception):
                    runner.deactivate()

    def block(self, row: BenchmarkRow, seconds: float) -> float:
        name = row.backend
        if name not in self.runners:
            self.runners[name], _ = _start(backends.by_name(name), self.ctx)
        runner = self.runners[name]
        if runner is None:
            raise RuntimeError(f"{name} could not be started again")
        timing = TimingMethod(warmup_s=0.0, min_iterations=3, min_duration_s=seconds, trials=1,
                              cv_warn=self.method.cv_warn, throughput=row.is_throughput)
        measured = runner.measurements({self.ctx.spec.input_name: _inputs(self.images, row.batch_size)}, timing)
        got = next((m for t, m in measured if t.kind == row.timing_kind), None)
        if got is None or "error" in got:
            raise RuntimeError((got or {}).get("error") or f"{name} has no timing {str(row.timing_kind)!r} now")
        return float(np.median(got["samples"]))


@dataclass(frozen=True)
class Rival:
    """One other row of a contest: its time ratio to the headline row (per interleaved round, with its interval) and
    what that ratio says (:func:`pipeline.core.speed_claims.verdict`: faster, same speed, slower, undecided)."""

    backend: str
    ratio: Ratio
    verdict: str

    def to_json(self) -> dict:
        return {"backend": self.backend, "ratio": self.ratio.to_json(), "verdict": self.verdict}


@dataclass(frozen=True)
class Contest:
    """The headline row (``rows[0]``) against its closest rivals at one batch size, in interleaved rounds: ``tie``,
    the rows no other beats beyond the noise; ``others``, every rival's ratio to the headline row."""

    batch_size: int
    rounds: int
    rows: list[str]
    tie: list[str]
    others: list[Rival]
    seconds: float = 0.0

    def to_json(self) -> dict:
        """benchmark.json's ``contests`` entry."""
        return {"batch_size": self.batch_size, "rounds": self.rounds, "rows": self.rows, "tie": self.tie,
                "others": [o.to_json() for o in self.others], "seconds": self.seconds}


def contests(results: list[BenchmarkRow], retimer: Retimer, same_speed: float) -> dict[str, Contest]:
    """The headline rows against their closest rivals, in interleaved rounds: per device, at the smallest batch by
    latency and at the largest by time per batch, the rows :func:`headline_rows` names and the closest
    other deployable rows (at most :data:`CONTEST_MAX` in all), timed in :data:`CONTEST_ROUNDS` rounds in a shuffled
    order; the tie (:func:`pipeline.core.speed_claims.choose`: no row beats another beyond the noise,
    ``same_speed`` wide) and every other row's time ratio to the headline row with its interval. A contest that
    cannot run (a runner that will not start again) is left out, and the headline names the row as before."""
    from pipeline.core import speed_claims

    out: dict[str, Contest] = {}
    for device, named in headline_rows(results).items():
        if named is None:
            continue
        for kind, row in (("latency", named[0]), ("throughput", named[1])):
            rivals = _contenders(results, row, kind)
            if len(rivals) < 2:
                continue
            start = now_s()
            try:
                per_round = _rounds(rivals, retimer)
            except (Crashed, RuntimeError) as exc:
                log.warning("benchmark: the headline's contest at batch %d was not run: %s", row.batch_size, exc)
                continue
            ratio = {(i, j): {row.batch_size: speed_claims.ratio(per_round[i], per_round[j])}
                     for i in range(len(rivals)) for j in range(len(rivals)) if i != j}
            choice = speed_claims.choose(list(range(len(rivals))), lambda a, b, table=ratio: table[(a, b)], {},
                                         same_speed)
            others = [Rival(r.backend, ratio[(i, 0)][row.batch_size],
                            speed_claims.verdict(ratio[(i, 0)][row.batch_size], same_speed).value)
                      for i, r in enumerate(rivals) if i]
            contest = Contest(row.batch_size, CONTEST_ROUNDS, [r.backend for r in rivals],
                              [rivals[i].backend for i in choice.tie], others, round(now_s() - start, 2))
            out[f"{device}/{kind}"] = contest
            log.info("benchmark: headline contest (%s, batch %d, %d interleaved rounds, time over %s's): %s; tie: %s",
                     kind, row.batch_size, CONTEST_ROUNDS, row.backend, _rivals_text(contest), ", ".join(contest.tie))
    return out


def _contenders(results: list[BenchmarkRow], row: BenchmarkRow, kind: str) -> list[BenchmarkRow]:
    """The headline ``row`` first, then the other deployable rows of its device and batch (latency rows only for the
    latency headline), closest first."""
    def cost(r: BenchmarkRow) -> float:
        return r.latency_ms.p50 if kind == "latency" else 1.0 / max(r.throughput_per_s, 1e-12)

    same = [r for r in results if r.deployable and r.device == row.device and r is not row
            and r.batch_size == row.batch_size and (kind == "throughput" or not r.is_throughput)]
    return [row, *sorted(same, key=cost)[:CONTEST_MAX - 1]]


def _rounds(rivals: list[BenchmarkRow], retimer: Retimer) -> list[list[float]]:
    from pipeline.core.speed_claims import round_orders

    per_round: list[list[float]] = [[] for _ in rivals]
    orders = round_orders(len(rivals), CONTEST_ROUNDS + 1, seed=len(rivals))
    for i in orders[0]:  # warm-up round, not counted (the runners start here)
        retimer.block(rivals[i], CONTEST_BLOCK_S / 2)
    for order in orders[1:]:
        for i in order:
            per_round[i].append(retimer.block(rivals[i], CONTEST_BLOCK_S))
    return per_round


# --------------------------------------------------------------------------- the method and the rows


def method_of(cfg: Config) -> TimingMethod:
    """The timing method of ``benchmark.*`` (:class:`pipeline.runtime.runners.TimingMethod`)."""
    bc = cfg.benchmark
    return TimingMethod(bc.warmup_s, bc.min_iterations, bc.min_duration_s, bc.trials, bc.cv_warn, kind=bc.method,
                        min_runs=bc.min_runs, target_halfwidth=bc.target_halfwidth, max_row_s=bc.max_row_s)


def describe_method(m: TimingMethod) -> str:
    """One line for the log and the report: how every row was timed."""
    if m.kind == "adaptive":
        return (f"each row timed after {m.warmup_s:g} s of warm-up until its median's 95% interval is within "
                f"+-{100 * m.target_halfwidth:g}% or for {m.max_row_s:g} s (at least {m.min_runs} runs)")
    return (f"{m.trials} trial(s) of >= {m.min_iterations} runs and >= {m.min_duration_s:g} s after "
            f"{m.warmup_s:g} s warm-up")


FIXED_ONLY = ("trials", "min_iterations", "min_duration_s")
ADAPTIVE_ONLY = ("min_runs", "target_halfwidth", "max_row_s")


def _log_unused(cfg: Config) -> None:
    """Say which timing keys the chosen method does not read, when they were changed from their defaults."""
    bc = cfg.benchmark
    unused = FIXED_ONLY if bc.method == "adaptive" else ADAPTIVE_ONLY
    changed = [f"{k}={getattr(bc, k)}" for k in unused if getattr(bc, k) != type(bc).model_fields[k].default]
    if changed:
        log.info("benchmark: %s not used: they apply to benchmark.method=%s", ", ".join(f"benchmark.{c}"
                 for c in changed), "fixed" if bc.method == "adaptive" else "adaptive")


@dataclass(frozen=True)
class Rows:
    """Which backends benchmark times: ``chosen`` says by what ("listed": benchmark.backends; "decisive"; "all"),
    ``left_out`` the table's defaults it does not time, ``how`` the setting that times them too;
    ``throughput_batches`` the batch sizes with an async-throughput row (OpenVINO's) beside the latency row."""

    chosen: str
    timed: list[str]
    left_out: list[str]
    how: str = ""
    throughput_batches: list[int] = dataclasses.field(default_factory=list)


def decisive(backend: Backend, cfg: Config) -> bool:
    """Whether a backend's rows can change the answer: the eager reference (every "x eager FP32" ratio is to it),
    or a deployment whose verify verdict gates (only those can be named the fastest that passed)."""
    if backend.name == backends.REFERENCE:
        return True
    if not (backend.deploys and backend.verify_name):
        return False
    section = cfg.verify.candidates.get(backend.verify_name)
    return (section is None or section.enabled) and candidates.gates(cfg, backend)


def choose_rows(cfg: Config) -> Rows:
    """``benchmark.backends`` as listed; when null, the table's defaults, all or only the decisive ones. An async
    throughput row can change the answer only at the largest batch (the summary names the most images/s there, and
    the smallest batch's latency, which such a row never is): only there, unless ``benchmark.rows: all``."""
    bc = cfg.benchmark
    throughput = sorted(bc.batch_sizes) if bc.rows == "all" else [max(bc.batch_sizes)]
    if bc.backends is not None:
        return Rows("listed", list(bc.backends), [], throughput_batches=throughput)
    names = backends.default_timed()
    if bc.rows == "all":
        return Rows("all", names, [], throughput_batches=throughput)
    timed = [n for n in names if decisive(backends.by_name(n), cfg)]
    left_out = [n for n in names if n not in timed]
    return Rows("decisive", timed, left_out, "benchmark.rows=all" if left_out else "", throughput_batches=throughput)


def _log_rows(rows: Rows) -> None:
    if rows.left_out:
        log.info("benchmark: timing the backends that can change the answer (%s); left out: %s (%s times them too)",
                 ", ".join(rows.timed), ", ".join(rows.left_out), rows.how)


def check_batch_sizes(batch_sizes: list[int], input_size: list[int], memory: int | None) -> None:
    """Refuse (exit 2) a batch whose float32 inputs alone exceed an eighth of the machine's memory: the inputs,
    their copy in each runtime's child and the activations must all fit. Every row would otherwise be skipped
    with a MemoryError and benchmark would still say ok."""
    if not memory:
        return
    per_image = 4 * math.prod(input_size)
    for batch in sorted(batch_sizes, reverse=True):
        if batch * per_image > memory // 8:
            raise UsageError(f"benchmark.batch_sizes: batch {batch} needs {_gib(batch * per_image)} for its inputs "
                             f"alone ({'x'.join(map(str, input_size))} float32 images), more than an eighth of this "
                             f"machine's {_gib(memory)} of memory; the largest batch that fits is "
                             f"{memory // 8 // per_image}: lower benchmark.batch_sizes")


def _gib(n: int) -> str:
    return f"{n / 2**30:.3g} GiB"


def _payload(cfg: Config, spec: dict, threads: int, results: list[BenchmarkRow], skipped: list[SkippedRow]) -> dict:
    bc = cfg.benchmark
    environment = BenchmarkEnvironment(**env.collect(), threads=threads)
    method = BenchmarkMethod(
        kind=bc.method, warmup_s=bc.warmup_s, min_iterations=bc.min_iterations, min_duration_s=bc.min_duration_s,
        trials=bc.trials, min_runs=bc.min_runs, target_halfwidth=bc.target_halfwidth, max_row_s=bc.max_row_s,
        confidence=stopping.CONFIDENCE, cv_warn=bc.cv_warn, described=describe_method(method_of(cfg)),
        interval="distribution-free order-statistic (binomial) interval of the median",
        percentiles="linear interpolation over every timed run of every trial")
    return {
        "schema": SCHEMA,
        "created": now(),
        "model": cfg.model.name,
        "input": {"shape": ["batch", *spec.input_size], "dtype": "float32", "data": "real validation images",
                  "dynamic_batch": cfg.export.dynamic_batch},
        "method": method.to_json(),
        "environment": environment.to_json(),
        "results": to_json(results),
        "skipped": to_json(skipped),
    }


def headline_rows(results: list[BenchmarkRow]) -> dict[str, tuple[BenchmarkRow, BenchmarkRow] | None]:
    """Per device, the rows the summary names: the fastest that passed the gate (or is the reference) by p50
    latency at the smallest batch (async throughput rows excluded: their time is per batch amortised), and by
    images/s at the largest batch (throughput rows included); None where no measured backend passed."""
    named: dict[str, tuple[BenchmarkRow, BenchmarkRow] | None] = {}
    for device in sorted({r.device for r in results}):
        rows = [r for r in results if r.device == device and r.deployable]
        if not rows:
            named[device] = None
            continue
        small, large = min(r.batch_size for r in rows), max(r.batch_size for r in rows)
        latency = [r for r in rows if r.batch_size == small and not r.is_throughput] or \
            [r for r in rows if r.batch_size == small]
        best = min(latency, key=lambda r: r.latency_ms.p50)
        top = max((r for r in rows if r.batch_size == large), key=lambda r: r.throughput_per_s)
        named[device] = (best, top)
    return named


def _headline(results: list[BenchmarkRow], contests: dict[str, Contest] | None = None,
              crosscheck: CrossCheck | None = None) -> str:
    """The summary's line: per device, the rows :func:`headline_rows` names; where their lead over the runner-up is
    inside the noise (:func:`contests`), the tie instead of a winner, and every ratio with its interval; a row that
    benchmark_app's cross-check does not confirm is marked in doubt."""
    if not results:
        return "no backend measured"
    parts = []
    for device, named in headline_rows(results).items():
        if named is None:
            parts.append(f"{device}: no measured backend passed the gate")
            continue
        best, top = named
        latency, images = (contests or {}).get(f"{device}/latency"), (contests or {}).get(f"{device}/throughput")
        parts.append(f"{device}: {_contest_text(latency, 'fastest that passed the gate')} at batch "
                     f"{best.batch_size}: {best.backend} p50 {best.latency_ms.p50:.3f} ms"
                     f"{_ratio_text(best)}{_undecided(best)}{_lead_text(latency)}"
                     f"{_doubt(best, crosscheck)}; at "
                     f"batch {top.batch_size}: {top.backend} {top.throughput_per_s:.1f} images/s"
                     f"{' (async throughput)' if top.is_throughput else ''}{_ratio_text(top)}"
                     f"{_undecided(top)}"
                     f"{_lead_text(images)}{_doubt(top, crosscheck)}")
    return "; ".join(parts)


def _contest_text(contest: Contest | None, winner: str) -> str:
    """The headline's claim: the winner, or the tie the interleaved rounds found (no row beats the others)."""
    if contest and len(contest.tie) > 1:
        return f"tied for fastest that passed the gate (within the noise: {', '.join(contest.tie)})"
    if contest and contest.tie and contest.tie[0] != contest.rows[0]:
        return f"fastest that passed the gate timed alone, beaten in interleaved rounds by {contest.tie[0]}"
    return winner


def _lead_text(contest: Contest | None) -> str:
    """The lead over the others of the contest, each as a time ratio with its interval (interleaved rounds)."""
    if not contest or not contest.others:
        return ""
    return f" (interleaved rounds: {_rivals_text(contest)})"


def _rivals_text(contest: Contest) -> str:
    return ", ".join(f"{o.backend} {o.verdict} (time ratio {o.ratio.estimate:.2f} "
                     f"[{o.ratio.low:.2f}, {o.ratio.high:.2f}])" for o in contest.others)


def _doubt(row: BenchmarkRow, crosscheck: CrossCheck | None) -> str:
    for check in (crosscheck.rows or []) if crosscheck else []:
        if check.backend == row.backend and check.batch_size == row.batch_size and \
                check.mode == ("throughput" if row.is_throughput else "latency") and \
                (check.agreement or "agree") != "agree":
            return f" (in doubt: benchmark_app {check.agreement}: {check.summary or check.error})"
    return ""


def _undecided(row: BenchmarkRow) -> str:
    return " (inconclusive: passed only because the bound could not decide)" \
        if row.verify == Status.INCONCLUSIVE else ""


def _ratio_text(row: BenchmarkRow) -> str:
    """`` (20.70x eager FP32 [19.80, 21.60] by bootstrap, timed apart)``: a headline row's speed-up over eager FP32
    with its interval (``vs_eager_interval``, from :func:`add_ratios`)."""
    ratio = row.vs_eager
    if not ratio:
        return ""
    interval = row.vs_eager_interval
    band = f" [{interval[0]:.2f}, {interval[1]:.2f}] by bootstrap, timed apart" if interval else " (no interval)"
    return f" ({ratio:.2f}x eager FP32{band})"


def _plot_label(row: BenchmarkRow) -> str:
    kind = row.timing_kind
    return f"{row.backend}\n{'GPU' if kind.on_gpu else row.device}" + \
        ("\nhost" if kind.clock == TimingKind.HOST_LATENCY else "")


def add_ratios(results: list[BenchmarkRow]) -> list[BenchmarkRow]:
    """The rows with ``vs_eager``: each row's images/s over eager FP32's (``torch_fp32``) at the same batch on the
    same device, measured in this run (the same kind of timing where torch_fp32 has it: GPU compute or host
    latency), and ``vs_eager_interval``, its bootstrap interval."""
    def ratios(row: BenchmarkRow) -> dict:
        base = _eager_of(row, results)
        if not (base and base.throughput_per_s):
            return {"vs_eager": None, "vs_eager_interval": None}
        return {"vs_eager": row.throughput_per_s / base.throughput_per_s,
                "vs_eager_interval": _vs_eager_interval(row, base)}

    return [row.model_copy(update=ratios(row)) for row in results]


def _eager_of(row: BenchmarkRow, results: list[BenchmarkRow]) -> BenchmarkRow | None:
    """The eager FP32 row ``row`` is compared with: same batch and device, the same kind of timing where it has it."""
    eager = [r for r in results if r.backend == backends.REFERENCE and r.batch_size == row.batch_size
             and r.device == row.device]
    same = [r for r in eager if r.timing_kind.clock == row.timing_kind.clock]
    return (same or eager or [None])[0]


def _vs_eager_interval(row: BenchmarkRow, eager: BenchmarkRow) -> list[float] | None:
    """The 95 % percentile bootstrap interval of eager's median time over the row's (the two rows' own runs, as
    compare bootstraps them): the noise inside the two rows, not the drift between them (they were timed one after
    the other; the headline's contest is what compares in rounds). None without the runs."""
    from pipeline.evaluation.drift import bootstrap_median_ratio

    mine, theirs = row.samples_ms, eager.samples_ms
    if not mine or not theirs or row.key == eager.key:
        return None
    # 1,000 resamples, fewer for rows of many runs (at least 200): a benchmark has tens of rows, each ~0.1 s here
    resamples = max(200, min(1000, 2_000_000 // max(len(mine), len(theirs))))
    try:
        _, low, high = bootstrap_median_ratio(np.asarray(mine), np.asarray(theirs), resamples=resamples,
                                              confidence=0.95, seed=0)
    except ValueError:
        return None
    return [low, high]


def markdown(payload: dict) -> str:
    """benchmark.md: the report's benchmark rows (``tables.benchmark_section``), as Markdown."""
    from pipeline.reports import tables

    return tables.markdown([tables.benchmark_section(payload), *profile_report.sections(payload)], top=3)


def write_plots(run_dir: RunDir, payload: dict) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = rows_of(payload).results
    if not results:
        return []
    written = []
    small = min(r.batch_size for r in results)
    series = [r for r in results if r.batch_size == small and r.samples_ms]
    if series:
        fig, ax = plt.subplots(figsize=(max(6, 1.4 * len(series)), 4))
        labels = [_plot_label(r) for r in series]
        ax.boxplot([r.samples_ms for r in series], showfliers=True, whis=(1, 99))
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
    keys = sorted({(r.backend, r.timing_kind) for r in results})
    for backend, kind in keys:
        pts = sorted((r.batch_size, r.throughput_per_s) for r in results
                     if r.backend == backend and r.timing_kind == kind)
        label = backend + (" (host)" if kind.clock == TimingKind.HOST_LATENCY else "")
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


def profile_torch(cfg: Config, run_dir: RunDir, model, images, record: StageRecord) -> None:
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
