"""The tune stage: the fastest low-precision mix that passes the gate, chosen by measured sensitivity and speed.

Over a trained and exported run (docs/verify.md, "Tuning the precision mix"), for ``tune.precision`` (``int8`` or
``fp16``; ``tune --precision``), through that precision's :class:`Mixes` (how a mix is made, run exactly, and kept):

1. The all-low graph: INT8, ModelOpt quantizes ``model.onnx`` once per calibration method
   (``tune.calibration_methods``), every layer in INT8; FP16, ModelOpt AutoCast once. Every other mix is that graph
   with some matrix layers raised by graph surgery (INT8: :func:`pipeline.precision.sensitivity.unquantize`; FP16:
   :func:`pipeline.precision.fp16.keep_in_fp32`), so no mix re-calibrates.
2. Per-layer sensitivity on ``tune.sensitivity_samples`` validation images, executed faithfully (``int8_exact``,
   the FP16 emulation) against the FP32 PyTorch reference, with the gate's criteria; ranked.
3. The search: top-k layers raised (bisection, neighbours confirmed), the greedy fallback's answer
   (:func:`pipeline.precision.fallback.run`, the loop of ``verify --auto-fallback``, in a scratch folder), all low
   and all high: every one judged by the full gate verify applies to the precision's graph on every verify image.
4. Speed of every distinct mix on the target (a strongly typed TensorRT engine where TensorRT and a GPU are here;
   else, for INT8, OpenVINO IR on the CPU; an FP16 graph has no CPU target) at batch 1 and the largest
   ``benchmark.batch_sizes``; the Pareto front; the fastest passing mix, confirmed by converting it exactly as
   export will and judging that graph again. The mix the fallback file already holds is judged and timed too,
   and stays unless the fastest is better beyond ``tune.same_speed``
   (:func:`pipeline.precision.sensitivity.keep_or_replace`): timing noise never flips a choice.
5. The choice goes to the precision's fallback file (``int8_fallback.json`` with its calibration method, or
   ``fp16_fallback.json``), which export reads: ``all`` then rebuilds, verifies and benchmarks exactly that
   artifact. ``tune.json``/``tune.md`` (FP16: ``tune.fp16.json``/``tune.fp16.md``) keep every number.
6. The speed gate (``tune.min_speedup``): exit 1 when the chosen mix is not that much faster than FP32 on the target.
"""

from __future__ import annotations

import logging
import tempfile
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import onnx

from pipeline.core import env, modeling, onnx_io, precision_config, roles, speed_claims
from pipeline.core.artifacts import (
    FP32_ONNX,
    QAT_BEST_CHECKPOINT,
    QAT_CHECKPOINT,
    QAT_CURVE,
    QAT_METRICS,
    SEARCH_IMAGES,
)
from pipeline.core.errors import BackendUnavailable, CheckFailed, Inconclusive, UsageError
from pipeline.core.run import RunDir, StageRecord, write_json
from pipeline.core.stability_record import StabilityCertificate
from pipeline.core.status import Status
from pipeline.evaluation import candidates
from pipeline.precision import fallback, int8, plugs, qat_rung, sensitivity
from pipeline.precision.plugs import Precision
from pipeline.precision.sensitivity import QAT_FACTS, Candidate, Confirmation, GreedyRun, MethodRun, QatRun
from pipeline.precision.tune_result import (
    GateNumbers,
    HeldOutConfirmation,
    RatioRow,
    Sanity,
    SanityCheck,
    VerdictImages,
)
from pipeline.reports import tune_report
from pipeline.runtime.backends import Context
from pipeline.runtime.builders import tensorrt_engine
from pipeline.runtime.speed import interleave, openvino_speed
from pipeline.training import qat_recipe

if TYPE_CHECKING:  # annotations only
    from pipeline.core.config_schema import Config

log = logging.getLogger("pipeline")

RETIMES = 2  # rounds timed again, at most, while a sanity rule fails (then: undecided, exit 5)
FP32_REFERENCE = "FP32 reference"  # the FP32 deployment, timed in the same rounds as the mixes
SCRATCH = "model.tune.onnx"  # the graph tune is converting, while it converts it
PREVIOUS = "previous choice"  # the origin of the fallback file's mix, judged again (tune._incumbent)


# --------------------------------------------------------------------------- one precision's mixes (its plug)


def _unavailable(plug: Precision, cfg: Config) -> str:
    """Why the precision cannot be tuned with this config: export would write no graph to apply the choice to."""
    return "" if plug.enabled(cfg) else \
        f"export.{plug.name}.enabled is false: there is no {plug.label} graph to tune (set it to true)"


def _applied_method(t: Tuner) -> str:
    """How export makes the graph now: the fallback file's calibration (tune's earlier choice), else the config's,
    else the plug's one way (AutoCast's)."""
    configured = precision_config.calibration_method(t.cfg, t.plug.name)
    return fallback.calibration_method(t.run_dir, t.plug) or configured or t.plug.methods(t.cfg)[0]


class Tuner:
    """What every phase of one tune run shares: the evidence, the gate, the graphs, the target, the timing."""

    def __init__(self, cfg: Config, run_dir: RunDir, plug: Precision):
        self.cfg, self.run_dir, self.plug = cfg, run_dir, plug
        self.model, self.card = modeling.load_trained(cfg, run_dir, "tune")
        self.spec = self.card.spec
        self.fp32_model = onnx_io.load(run_dir.require(FP32_ONNX, "export", "tune"))
        # The search (sensitivity, every candidate, the choice's confirmation) judges on the validation split's search
        # part; the chosen mix is judged once more on the verdict part, which nothing here chose on (core.roles).
        self.evidence = candidates.evidence(cfg, self.card, self.model, roles.SEARCH)
        self.held_out_evidence = candidates.evidence(cfg, self.card, self.model, roles.VERDICT)
        self.gate = candidates.gate_for(cfg, plug.faithful, plug.name)
        # What other precisions' fallbacks keep in FP32 stays in FP32 in every mix (export applies it here too).
        self.base_fp32 = fallback.inherited_fp32(run_dir, plug, self.fp32_model)
        self.ctx = Context(cfg, run_dir, "tune", self.spec, model=self.model, isolate=False)
        n = min(cfg.tune.sensitivity_samples, len(self.evidence.labels))
        self.sens_feeds, self.sens_ref = _first_images(self.evidence, n)
        self.sens_labels = self.evidence.labels[:n]
        self.timing = timing_method(cfg)  # how each mix is timed (a calibration method is a `method: str`)
        self.batches = sorted({1, max(cfg.benchmark.batch_sizes)})
        self.target = speed_target(self)
        self.seconds: dict[str, float] = {}
        self.sanity: Sanity | None = None  # the sanity rules on the rounds (time_candidates; None: untimed)
        self.sessions_timed = 0  # sets of interleaved rounds so far (a candidate's session: which one timed it)

    def converted(self, high=(), fp32=(), method: str = "") -> onnx.ModelProto:
        """The graph export makes with ``high`` raised and ``fp32`` in FP32 (its own conversion, in a scratch file)."""
        try:
            self.plug.write(self.cfg, self.run_dir, self.card, self.plug.as_raised(list(high), list(fp32)),
                            out_name=SCRATCH, method=method)
            return onnx.load(str(self.run_dir.file(SCRATCH)))
        finally:
            self.run_dir.file(SCRATCH).unlink(missing_ok=True)

    def mix(self, all_low: onnx.ModelProto, high, fp32=()) -> onnx.ModelProto:
        return self.plug.mix(all_low, self.fp32_model, high, [n for n in fp32 if n not in self.base_fp32])

    def quick(self, model: onnx.ModelProto) -> GateNumbers:
        """The gate's criteria on the sensitivity images, run faithfully (the Q/DQ arithmetic, the FP16 rounding)."""
        from pipeline.runtime.runners import collect, faithful_runner

        outputs = collect(faithful_runner(self.plug, model, self.cfg.verify.emulation), self.sens_feeds)
        return sensitivity.metrics(outputs, self.sens_ref, self.sens_labels, self.gate, self.spec.output_name,
                                   self.evidence.confidence)

    def full(self, model: onnx.ModelProto) -> fallback.Round:
        """The full gate: every candidate verify runs on the precision's graph, on every verify image."""
        return candidates.recheck_round(self.plug, self.cfg, self.ctx, self.evidence, model)

    def judge(self, model: onnx.ModelProto, high, origin: str, method: str, fp32=()) -> Candidate:
        checked = self.full(model)
        exact = next((c for c in checked.checks if c.name == self.plug.faithful), None)
        result = sensitivity.summary(exact.judgement) if exact is not None and exact.judgement else {}
        status = Status.PASSED if checked.passed else Status.FAILED
        result.update({"status": status, "candidates": checked.results})
        cand = Candidate(list(high), origin, result, calibration=method, fp32=list(fp32 or self.base_fp32))
        cand.round = checked
        log.info("tune: %s %s (%d layers %s): %s", method, origin, len(cand.high), self.plug.raised_to, status)
        return cand


def timing_method(cfg: Config):
    from pipeline.runtime.runners import TimingMethod

    tc = cfg.tune
    return TimingMethod(warmup_s=tc.warmup_s, min_iterations=cfg.benchmark.min_iterations,
                        min_duration_s=tc.min_duration_s, trials=tc.trials, cv_warn=cfg.benchmark.cv_warn)


def _first_images(evidence, n: int) -> tuple[list[dict], list[dict]]:
    """The feeds and reference outputs that hold the first ``n`` verify images."""
    feeds, refs, taken = [], [], 0
    for feed, ref in zip(evidence.feeds, evidence.reference, strict=False):
        size = len(next(iter(feed.values())))
        keep = min(size, n - taken)
        if keep <= 0:
            break
        feeds.append({k: v[:keep] for k, v in feed.items()})
        refs.append({k: v[:keep] for k, v in ref.items()})
        taken += keep
    return feeds, refs


# --------------------------------------------------------------------------- one calibration method


def tune_method(t: Tuner, method: str) -> MethodRun:
    """Sensitivity, search and greedy fallback for one calibration method."""
    with phase(t, f"convert ({method})", 1) as bar:
        all_low = t.converted(fp32=t.base_fp32, method=method)
        bar.update(1)
    layers = sensitivity.low_layers(t.fp32_model, t.plug.node_precisions(t.fp32_model, all_low), t.plug)
    ops = {n.name: n.op_type for n in t.fp32_model.graph.node}
    with phase(t, f"sensitivity ({method})", 2 * len(layers) + 1) as bar:
        def quick(high) -> GateNumbers:
            bar.update(1)
            return t.quick(t.mix(all_low, high))

        all_low_metrics = quick(set())
        ranked = sensitivity.measure(layers, ops, quick, all_low_metrics)
    with phase(t, f"search ({method})") as bar:
        def judge(high, origin: str) -> Candidate:
            bar.update(1)
            return t.judge(t.mix(all_low, high), high, origin, method)

        found = sensitivity.search([r.layer for r in ranked], judge, lowest=f"all {t.plug.label}")
        greedy = _greedy(t, all_low, method, found[0])
        if greedy is not None:
            found.append(greedy)
    return MethodRun(method, layers, all_low_metrics, ranked, found, all_low)


@contextmanager
def phase(t: Tuner, name: str, total: int | None = None):
    """A progress bar for one phase of tune (on a terminal), its seconds in ``t.seconds`` and a log line."""
    from tqdm import tqdm

    start = time.perf_counter()
    with tqdm(total=total, desc=f"tune: {name}", unit="mix", disable=None, leave=False, dynamic_ncols=True) as bar:
        yield bar
    t.seconds[name] = time.perf_counter() - start
    log.info("tune: %-26s %6.1f s%s", name, t.seconds[name], f" ({bar.n} mixes)" if bar.n else "")


def _greedy(t: Tuner, all_low: onnx.ModelProto, method: str, all_low_cand: Candidate) -> Candidate | None:
    """``verify --auto-fallback``'s loop (:func:`pipeline.precision.fallback.run`) from the all-low graph, in a
    scratch run folder so nothing of the run changes; its answer judged like every other candidate."""
    failing = all_low_cand.round.failing
    if all_low_cand.passed:  # verify --auto-fallback would move nothing: its answer is the all-low graph
        return Candidate([], "greedy fallback", dict(all_low_cand.result), calibration=method,
                         fp32=list(all_low_cand.fp32), round=all_low_cand.round, greedy=GreedyRun(None, 0))
    if failing is None:
        return None
    cfg, plug = t.cfg, t.plug
    loc = candidates.localize_candidate(cfg, plug, t.fp32_model, all_low, t.evidence, failing, None)
    with tempfile.TemporaryDirectory(prefix=".tune.") as tmp:
        scratch = RunDir(Path(tmp))

        def remake(raised: fallback.Raised, out_name: str) -> dict:
            model = t.mix(all_low, *plug.tune_raises(raised))
            onnx.save(model, str(scratch.file(out_name)))
            return {f"{plug.name}_fraction": plug.fraction(plug.node_precisions(t.fp32_model, model))}

        result = fallback.run(plug, cfg, scratch, t.fp32_model, all_low, loc, remake=remake, recheck=t.full,
                              localize=lambda current, chk: candidates.localize_candidate(
                                  cfg, plug, t.fp32_model, current, t.evidence, chk, None))
    high, fp32 = plug.tune_raises(fallback.Raised(list(result.raised.out_of_low), list(result.raised.fp32)))
    fp32 = list(dict.fromkeys([*t.base_fp32, *fp32]))
    cand = t.judge(t.mix(all_low, high, fp32), high, "greedy fallback", method, fp32)
    cand.greedy = GreedyRun(result.passed, len(result.iterations))
    return cand


# --------------------------------------------------------------------------- speed


@dataclass(frozen=True)
class SpeedTarget:
    """Where tune times the mixes: its name, ``open(model, low)`` (None: no target here) and why not."""

    name: str
    open: Callable | None = None
    reason: str | None = None


def speed_target(t: Tuner) -> SpeedTarget:
    """Where the mixes are timed: a strongly typed TensorRT engine where TensorRT and a GPU are here; else the CPU
    where the plug has a CPU target (INT8: the OpenVINO CPU plugin); a low float graph has no faster CPU target
    (``open`` None, and ``reason``). ``open(model, low)`` is a context manager that yields an open
    :class:`~pipeline.runtime.speed.openvino_speed.Session` (a timer per batch, the runtime precisions)."""
    trt_ok, trt_reason = tensorrt_engine.availability()
    if trt_ok:
        return SpeedTarget("TensorRT (strongly typed engine)", _tensorrt_session(t))
    if t.plug.cpu_target:
        threads = t.cfg.benchmark.threads or env.usable_cores()
        return SpeedTarget("OpenVINO CPU (f32 hint, LATENCY)", lambda model, low: openvino_speed.openvino_session(
            model, _images(t), t.batches, threads, int8_graph=low))
    return SpeedTarget("none", None,
                       f"no {t.plug.label} deployment target here: an {t.plug.label} graph runs faster only as a "
                       f"TensorRT engine on a GPU ({trt_reason}); CPU runtimes run its nodes through FP32 kernels. "
                       f"The mix is chosen on the gate alone: the passing mix with the fewest layers "
                       f"{t.plug.raised_to}")


def _tensorrt_session(t: Tuner):
    from pipeline.runtime.speed import tensorrt_speed

    cache = tensorrt_engine.timing_cache_path(t.cfg, t.run_dir)
    return lambda model, low: tensorrt_speed.tensorrt_session(model, _images(t), t.batches, build_cfg=t.cfg.build,
                                                              timing_cache=cache)


def _images(t: Tuner):
    return t.evidence.feeds[0][t.spec.input_name]


def time_candidates(t: Tuner, runs: list[MethodRun]) -> Candidate | None:
    """Every distinct mix and the FP32 deployment timed on the target in interleaved rounds
    (:func:`time_in_rounds`), the sanity rules checked (:func:`speed_sanity`) and the rounds timed again up to
    :data:`RETIMES` times while they fail; returns the FP32 deployment as a candidate of the same rounds (None: no
    target here). ``t.sanity`` keeps what the rules found."""
    if t.target.open is None:
        log.warning("tune: speed not measured: %s", t.target.reason)
        return None
    timed = [c for r in runs for c in r.candidates]
    distinct = list({c.key(): c for c in timed}.values())
    baseline = Candidate([], FP32_REFERENCE, {"status": Status.PASSED})
    graphs = {r.method: r.graph for r in runs}
    with phase(t, f"speed, {t.target.name}", len(distinct) + 1) as bar, ExitStack() as stack:
        sessions = [stack.enter_context(t.target.open(t.fp32_model, False))]
        bar.update(1)
        for cand in distinct:
            sessions.append(stack.enter_context(t.target.open(t.mix(graphs[cand.calibration], cand.high,
                                                                           cand.fp32), True)))
            bar.update(1)
        rivals = [baseline, *distinct]
        for attempt in range(1 + RETIMES):
            time_in_rounds(t, rivals, sessions, seed=attempt)
            t.sanity = speed_sanity(rivals, t.batches, t.cfg.tune.same_speed, t.plug.label, attempt + 1)
            if t.sanity.trustworthy:
                break
            log.warning("tune: the timings are not trustworthy (attempt %d of %d): %s", attempt + 1, 1 + RETIMES,
                        "; ".join(c.text for c in t.sanity.failed()))
    for cand in timed:  # a mix found twice (the greedy fallback's answer is often a top-k) shares its timing
        same = next(c for c in distinct if c.key() == cand.key())
        cand.latency_ms, cand.rounds, cand.session, cand.runtime, cand.kernels = same.latency_ms, same.rounds, \
            same.session, same.runtime, same.kernels
    return baseline


def time_in_rounds(t: Tuner, rivals: list[Candidate], sessions: list, seed: int = 0) -> None:
    """``rivals`` (each with its open session) timed in interleaved rounds per batch
    (:func:`pipeline.runtime.speed.interleave.time_rounds`, with tune's timing settings): each rival's per-round
    latencies, median, runtime precisions and the session that pairs its rounds with the others'."""
    t.sessions_timed += 1
    for batch in t.batches:
        got = interleave.time_rounds([s.timers[batch] for s in sessions], warmup_s=t.timing.warmup_s,
                                     min_duration_s=t.timing.min_duration_s, trials=t.timing.trials,
                                     min_iterations=t.timing.min_iterations, seed=seed * 1000 + batch)
        for i, cand in enumerate(rivals):
            cand.rounds[batch], cand.latency_ms[batch] = got.per_round[i], got.median(i)
    for cand, session in zip(rivals, sessions, strict=True):
        cand.session, cand.runtime, cand.kernels = t.sessions_timed, session.runtime, session.kernels


def speed_sanity(rivals: list[Candidate], batches: list[int], same_speed: float, label: str,
                 attempts: int = 1) -> Sanity:
    """The sanity rules on one set of rounds: pairs that the target compiles to the same kernels must time alike
    (:func:`pipeline.core.speed_claims.sane`): the "all low" mixes of every calibration method (the same graph
    with other scales), and the FP32 deployment and each calibration's "all high" mix (no matrix layer left in the
    low precision) where the target's compiled graphs show the same kernels (``Candidate.kernels``: a Q/DQ pair left
    on a pooling layer, say, makes "all high" another network, and that pair is listed as not checked, with why).
    ``trustworthy``: every checked pair timed alike; ``attempts``: the sets of rounds timed so far."""
    reference = next(c for c in rivals if c.origin == FP32_REFERENCE)
    all_high = [c for c in rivals if c.origin == "all high"]
    all_low = [c for c in rivals if c.origin == f"all {label}" and not c.high]
    pairs = [(reference, c, c.kernels is not None and c.kernels == reference.kernels) for c in all_high] + \
        [(a, b, a.kernels is None or b.kernels is None or a.kernels == b.kernels)
         for a, b in zip(all_low, all_low[1:], strict=False)]
    checks = []
    for a, b, twins in pairs:
        what = f"{b.origin} ({b.calibration}) over {a.origin}{f' ({a.calibration})' if a.calibration else ''}"
        ratios = sensitivity.time_ratio(b, a, batches)
        timed = ", ".join(f"{r.text()} at batch {k}" for k, r in ratios.items())
        rows = {str(k): RatioRow.of(r) for k, r in ratios.items()}
        if not twins:
            checks.append(SanityCheck(pair=[a.origin, f"{b.origin} {b.calibration}"], checked=False, sane=True,
                                      ratios=rows, text=f"{what}: {timed}; not checked: the target compiles them to "
                                      f"different kernels ({_kernel_difference(a.kernels, b.kernels)})"))
            continue
        sane = speed_claims.sane(ratios, same_speed)
        checks.append(SanityCheck(pair=[f"{a.origin} {a.calibration}".strip(), f"{b.origin} {b.calibration}"],
                                  checked=True, sane=sane, ratios=rows, text=f"{what}: {timed}" + (
                                      "" if sane else " (they compile to the same kernels: they must time alike)")))
    return Sanity(checks=checks, trustworthy=all(c.sane for c in checks), attempts=attempts)


def _kernel_difference(a: tuple | None, b: tuple | None) -> str:
    """What the second compiled graph runs that the first does not, and the other way round (a few kernels)."""
    if a is None or b is None:
        return "not known on this target"
    more, fewer = dict(b), dict(a)
    extra = [f"{'/'.join(k)} x{n - fewer.get(k, 0)}" for k, n in more.items() if n > fewer.get(k, 0)]
    missing = [f"{'/'.join(k)} x{n - more.get(k, 0)}" for k, n in fewer.items() if n > more.get(k, 0)]
    return "; ".join(x for x in (f"+ {', '.join(extra[:3])}" if extra else "",
                                 f"- {', '.join(missing[:3])}" if missing else "") if x)


# --------------------------------------------------------------------------- the stage


# Over 60 lines on purpose: the stage's steps in the order they run (search, choice, held-out confirmation,
# certificate, files), each a call; split, the order would be spread over helpers that only one caller has.
def run(cfg: Config, run_dir: RunDir, record: StageRecord, *, tune: bool = False, no_speed_gate: bool = False,
        precision: str | None = None) -> None:
    """``tune`` is ``all``'s flag (it runs this stage); ``no_speed_gate``: ``tune.min_speedup`` is reported only;
    ``precision``: ``tune --precision`` (else ``tune.precision``)."""
    start = time.perf_counter()
    plug = _plug(cfg, precision or cfg.tune.precision)
    if plug.trainable and cfg.tune.qat == "on":  # before any work: a rung asked for that cannot run here (exit 2, 3)
        qat_recipe.check(cfg)
    qat_missing = qat_recipe.missing(cfg) if plug.trainable and cfg.tune.qat != "off" else ""
    t = Tuner(cfg, run_dir, plug)
    write_json(run_dir.file(SEARCH_IMAGES), {**t.evidence.images.to_json(), "split_cut": t.evidence.parts.split})
    record.artifact(SEARCH_IMAGES)
    runs = [tune_method(t, method) for method in plug.methods(cfg)]
    incumbent = _incumbent(t, runs)
    baseline = time_candidates(t, runs)
    fronts = {r.method: sensitivity.pareto(r.candidates, t.batches[0]) for r in runs}
    if t.sanity and not t.sanity.trustworthy:
        _undecided(t, runs, baseline, fronts, record)
    with phase(t, "confirm (export's graph)"):
        chosen, why = _choose(t, runs, incumbent)
    payload = tune_report.payload(cfg, t, runs, baseline, chosen, why, fronts)
    ptq_chosen = chosen
    # The speed gate's own setting: with --no-speed-gate (all --tune) auto escalates only when no PTQ mix passes.
    wanted, qat_why = qat_rung.qat_wanted(
        cfg.tune.qat if plug.trainable else "off", chosen is not None,
        tune_report.speed_failure(payload, None if no_speed_gate else cfg.tune.min_speedup),
        low_layers=max(len(r.layers) for r in runs), missing=qat_missing)
    qat_cand = _qat_rung(t, runs, baseline, chosen) if wanted else None
    chosen, why = qat_rung.with_qat(chosen, why, qat_cand, t.batches if t.target.open is not None else [],
                                    cfg.tune.same_speed)
    with phase(t, "held-out confirmation"):
        held = held_out_confirmation(t, chosen, chosen is not None and chosen is qat_cand)
    with phase(t, "calibration stability"):
        stability = _certificate(t, chosen, chosen is not None and chosen is qat_cand)
    t.seconds["total"] = time.perf_counter() - start
    payload = tune_report.with_held_out(tune_report.payload(cfg, t, runs, baseline, chosen, why, fronts), held)
    # PTQ, best mix and QAT side by side: a precision QAT cannot make (FP16, BF16) has no ladder
    ladder = tune_report.ladder(t, runs, ptq_chosen, qat_cand, qat_why) if plug.trainable else None
    payload = payload.model_copy(update={"stability": stability, "ladder": ladder})
    if chosen is not None and chosen is qat_cand:
        qat_recipe.write_fallback(run_dir, qat_cand.qat.source, "chosen by python -m pipeline tune "
                                  "(tune.md): QAT's graph, rebuilt by export from its checkpoint")
        for name in (plug.fallback_file, QAT_CHECKPOINT, QAT_BEST_CHECKPOINT, QAT_METRICS, QAT_CURVE):
            if run_dir.file(name).exists():
                record.artifact(name)
    elif chosen is not None:
        note = (f"chosen by python -m pipeline tune (tune.md): {plug.raised_to}" +
                (", fp32_nodes kept in FP32, calibrated with calibration_method" if len(plug.ladder) > 2 else ""))
        write_json(run_dir.file(plug.fallback_file),
                   plug.fallback_payload(plug.as_raised(chosen.high, chosen.fp32), chosen.calibration, note))
        record.artifact(plug.fallback_file)
    for path in tune_report.write_all(run_dir, payload):
        record.artifact(path.name)
    record.details.update(tune_report.details(payload))
    if chosen is None:
        raise CheckFailed(f"tune: no {plug.label} mix passes the gate, not even every layer {plug.raised_to}; "
                          f"see tune.md")
    failure = tune_report.speed_failure(payload, None if no_speed_gate else cfg.tune.min_speedup)
    if failure:
        raise CheckFailed(failure)
    doubt = tune_report.speed_in_doubt(payload, None if no_speed_gate else cfg.tune.min_speedup)
    if doubt:
        raise Inconclusive(doubt)
    log.info("tune: %s", payload.summary)


def _undecided(t: Tuner, runs: list[MethodRun], baseline: Candidate | None, fronts: dict, record: StageRecord) -> None:
    """The sanity rules failed on every timing: the report says so and names the pairs, the fallback file is left
    as it was, and the stage ends inconclusive (exit 5), as a gate that cannot decide does."""
    failed = "; ".join(c.text for c in t.sanity.failed())
    why = (f"undecided: the timings are not trustworthy after {t.sanity.attempts} sets of interleaved rounds "
           f"({failed}); the machine is too busy to tell the mixes apart")
    payload = tune_report.payload(t.cfg, t, runs, baseline, None, why, fronts)
    for path in tune_report.write_all(t.run_dir, payload):
        record.artifact(path.name)
    record.details.update(tune_report.details(payload))
    raise Inconclusive(f"tune: {why}; {t.plug.fallback_file} is unchanged; run tune again on a quieter machine "
                       "(see tune.md)")


# --------------------------------------------------------------------------- the held-out confirmation


def held_out_confirmation(t: Tuner, chosen: Candidate | None, qat: bool) -> HeldOutConfirmation:
    """The chosen mix, converted as export will, judged by the full gate on the verdict images: those no search here
    chose on. It changes no choice (choosing again on them would make them a search set too); it says whether the
    search's verdict holds on held-out images, and where it does not, the report shows the difference."""
    if chosen is None:
        return HeldOutConfirmation(ran=False, why_not="no mix passed the search")
    if qat:
        return HeldOutConfirmation(ran=False, why_not="QAT's graph: verify judges it on the verdict images")
    checked = candidates.recheck_round(t.plug, t.cfg, t.ctx, t.held_out_evidence,
                                       t.converted(chosen.high, chosen.fp32, chosen.calibration))
    exact = next((c for c in checked.checks if c.name == t.plug.faithful), None)
    numbers = GateNumbers.model_validate(sensitivity.summary(exact.judgement) if exact is not None
                                         and exact.judgement else {})
    status = Status.PASSED if checked.passed else Status.FAILED
    searched = GateNumbers.model_validate(chosen.result)
    search = chosen.confirmed.status if chosen.confirmed else searched.status
    calibration = _calibration_images(t)
    others = {f"{t.plug.name} calibration": calibration, "tune search": t.evidence.images}
    parts = t.held_out_evidence.parts
    held = roles.held_out_status(t.held_out_evidence.images, others, parts.split, parts.reason)
    result = HeldOutConfirmation(
        ran=True, status=status, search_status=search, agrees=status == search,
        images=len(t.held_out_evidence.labels), search_images=len(t.evidence.labels),
        held_out=VerdictImages(**held.to_json()), candidates=checked.results,
        search=GateNumbers(scaled_error=searched.scaled_error, top1_agreement=searched.top1_agreement,
                           accuracy_drop=searched.accuracy_drop),
        scaled_error=numbers.scaled_error, top1_agreement=numbers.top1_agreement, accuracy_drop=numbers.accuracy_drop)
    (log.info if result.agrees else log.warning)(
        "tune: held-out confirmation on %d verdict images: %s (search: %s)%s; %s", result.images, status, search,
        "" if result.agrees else ": the search's verdict does not hold on held-out images (tune.md)", held.line())
    return result


def _certificate(t: Tuner, chosen: Candidate | None, qat: bool) -> StabilityCertificate | None:
    """The calibration stability certificate of the chosen INT8 mix (``export.int8.stability.in_tune``), on the
    verdict images (:mod:`pipeline.evaluation.certificate`); None where it does not apply."""
    if chosen is None or qat or t.plug.name != "int8" or not t.cfg.export.int8.stability.in_tune:
        return None
    from pipeline.evaluation import certificate

    result = certificate.certify(t.cfg, t.run_dir, t.card, t.plug, t.held_out_evidence,
                                 t.plug.as_raised(chosen.high, chosen.fp32), chosen.calibration, t.gate)
    result = result.model_copy(update={"limit": t.gate.get("max_scaled_error")})  # the plot's line
    cert = result.certificate
    (log.info if cert.status == Status.CERTIFIED else log.warning)("tune: calibration stability: %s", cert.line)
    return result


def _calibration_images(t: Tuner):
    """The images the plug's conversion calibrates on (None where it reads none: AutoCast without its range rule)."""
    from pipeline.core import data

    section = precision_config.export_section(t.cfg, t.plug.name)
    if not getattr(section, "range_rule", True):
        return None
    return data.calibration_batch(t.cfg, t.card, section.calibration_samples)[1]


# --------------------------------------------------------------------------- the third rung: QAT


def _qat_rung(t: Tuner, runs: list[MethodRun], baseline: Candidate | None, ptq: Candidate | None) -> Candidate:
    """QAT (:func:`pipeline.training.qat_recipe.fine_tune`) into a scratch graph, judged by the full gate and timed
    in interleaved rounds with the FP32 deployment (``baseline``) and the best PTQ mix (``ptq``); its checkpoint
    stays (export rebuilds the graph from it if it is chosen)."""
    method = _applied_method(t)
    with phase(t, "QAT (fine-tune, export)"):
        try:
            details = qat_recipe.fine_tune(t.cfg, t.run_dir, out_name=SCRATCH)
            graph = onnx.load(str(t.run_dir.file(SCRATCH)))
        finally:
            t.run_dir.file(SCRATCH).unlink(missing_ok=True)
    with phase(t, "QAT (gate, speed)"):
        cand = t.judge(graph, [], "QAT", method, t.base_fp32)
        if t.target.open is not None:  # in rounds with the FP32 deployment and the best PTQ mix, to compare
            rivals = [(baseline, t.fp32_model, False), (cand, graph, True)]
            if ptq is not None:
                ptq_graph = t.mix(next(r.graph for r in runs if r.method == ptq.calibration), ptq.high, ptq.fp32)
                rivals.append((ptq, ptq_graph, True))
            with ExitStack() as stack:
                sessions = [stack.enter_context(t.target.open(g, low)) for _, g, low in rivals]
                time_in_rounds(t, [c for c, _, _ in rivals], sessions)
    cand.qat = QatRun(**{k: details[k] for k in QAT_FACTS})
    next((r for r in runs if r.method == method), runs[0]).candidates.append(cand)
    return cand


def _plug(cfg: Config, precision: str) -> Precision:
    """The precision's plug, once it can be tuned here."""
    if precision not in plugs.PLUGS:
        raise UsageError(f"tune --precision {precision}: choose one of {', '.join(plugs.PLUGS)}")
    plug = plugs.PLUGS[precision]
    reason = _unavailable(plug, cfg)
    if reason:
        raise UsageError(reason)
    missing = int8.availability()  # ModelOpt: INT8 PTQ and AutoCast alike
    if missing:
        raise BackendUnavailable(f"{plug.label} tuning needs ModelOpt: {missing}")
    return plug


def _incumbent(t: Tuner, runs: list[MethodRun]) -> Candidate | None:
    """The mix the precision's fallback file holds now (tune's earlier choice, or verify --auto-fallback's), as a
    candidate of the run of its calibration, judged like every other (reused where the search judged the same mix):
    a re-run keeps it unless a new mix is better beyond the noise (:func:`sensitivity.keep_or_replace`). None without
    a fallback file, or when its calibration is not searched now."""
    if not t.run_dir.file(t.plug.fallback_file).is_file():
        return None
    raised = fallback.read(t.run_dir, t.plug, t.fp32_model)
    high, fp32 = t.plug.tune_raises(raised)
    fp32 = list(dict.fromkeys([*t.base_fp32, *fp32]))
    method = _applied_method(t)
    run = next((r for r in runs if r.method == method), None)
    if run is None:
        return None
    wanted = Candidate(high, PREVIOUS, calibration=method, fp32=fp32).key()
    same = next((c for c in run.candidates if c.key() == wanted), None)
    if same is not None:
        return same
    cand = t.judge(t.mix(run.graph, high, fp32), high, PREVIOUS, method, fp32)
    run.candidates.append(cand)
    return cand


def _choose(t: Tuner, runs: list[MethodRun], incumbent: Candidate | None = None) -> tuple[Candidate | None, str]:
    """The fastest passing mix over every calibration method, confirmed on the graph export will make (its own
    conversion with those layers raised); a mix whose real graph fails gives way to the next. The ``incumbent`` (the
    fallback file's mix) stays unless the fastest is better beyond the noise (:func:`sensitivity.keep_or_replace`)."""
    everything = [c for r in runs for c in r.candidates]
    batches = t.batches if t.target.open is not None else []  # untimed: the fewest layers raised wins

    def confirm(pick: Candidate) -> bool:
        checked = t.full(t.converted(pick.high, pick.fp32, pick.calibration))
        pick.confirmed = Confirmation(Status.PASSED if checked.passed else Status.FAILED, checked.results)
        return checked.passed

    pick, tried, fastest = sensitivity.confirmed(everything, batches, t.cfg.tune.same_speed, confirm, incumbent)
    if pick is None:
        return None, "no passing mix" + (f" (confirmation failed for {tried})" if tried else "")
    kept = pick is incumbent and fastest is not None and fastest is not incumbent
    return pick, _why(t, pick, runs, batches) + (_kept(t, fastest, batches) if kept else "")


def _kept(t: Tuner, fastest: Candidate, batches: list[int]) -> str:
    lat = ", ".join(f"{fastest.latency_ms[b]:.3f} ms at batch {b}" for b in batches) or "timing not measured"
    return (f"; kept as the previous choice ({t.plug.fallback_file}): the best new mix ({fastest.origin}, "
            f"{fastest.calibration}; {lat}) is not better beyond tune.same_speed ({t.cfg.tune.same_speed:g})")


def _why(t: Tuner, pick: Candidate, runs: list[MethodRun], batches: list[int]) -> str:
    others = [r.method for r in runs if r.method != pick.calibration]
    rest = f" (the {', '.join(others)} calibration's mixes judged and timed alike)" if others else ""
    if not batches:
        return (f"the passing mix with the fewest layers {t.plug.raised_to} (speed not measured: "
                f"{t.target.reason.split(':')[0]}), {pick.calibration}{rest}")
    lat = ", ".join(f"{pick.latency_ms[b]:.3f} ms at batch {b}" for b in batches)
    return (f"the fastest passing mix as far as the noise allows ({lat}): no passing mix beats it in interleaved "
            f"rounds (faster beyond the 95 % interval at one batch, faster or within tune.same_speed at the other); "
            f"of those no mix beats, the one with the fewest layers {t.plug.raised_to} wins, then the smallest error; "
            f"{pick.calibration} calibration{rest}")
