"""The tune stage: the fastest INT8 mix that passes the gate, chosen by measured sensitivity and measured speed.

Over a trained and exported run (docs/verify.md, "Tuning the precision mix"):

1. For each calibration method (``tune.calibration_methods``): ModelOpt quantizes ``model.onnx`` once, every
   layer in INT8 (export's own :func:`pipeline.precision.convert.quantize_int8`); every other mix is that graph with some
   layers unquantized (:func:`pipeline.precision.sensitivity.unquantize`), so no mix re-calibrates.
2. Per-layer sensitivity on ``tune.sensitivity_samples`` validation images, executed exactly (``int8_exact``),
   against the FP32 PyTorch reference, with the gate's criteria; ranked.
3. The search: top-k layers kept out of INT8 (bisection, neighbours confirmed), the greedy fallback's answer
   (:func:`pipeline.precision.fallback.run`, the loop of ``verify --auto-fallback``, in a scratch folder), all INT8 and all
   high: every one judged by the full gate verify applies to ``model.int8.onnx`` on every verify image.
4. Speed of every distinct mix on the target (OpenVINO IR on the CPU, the benchmark's timing method) at batch 1
   and the largest ``benchmark.batch_sizes``; the Pareto front; the fastest passing mix, confirmed by
   re-quantizing it exactly as export will and judging that graph again.
5. The choice goes to ``int8_fallback.json`` (with its calibration method), which export reads: ``all`` then
   rebuilds, verifies and benchmarks exactly that artifact. ``tune.json``/``tune.md`` keep every number.
6. The speed gate (``tune.min_speedup``): exit 1 when the chosen mix is not that much faster than FP32.

verify and export are stage modules; the functions used from them (verify's evidence, gate thresholds, re-check
round and localisation; export's quantization) are the same ones ``verify --auto-fallback`` uses, so a mix is
judged and made exactly as verify judges and export makes it.
"""

from __future__ import annotations

import logging
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import onnx

from pipeline.core.status import Status
from pipeline.evaluation import candidates
from pipeline.core import env, modeling, onnx_io
from pipeline.precision import convert, fallback, fp16, int8, sensitivity
from pipeline.runtime import openvino_speed
from pipeline.reports import tune_report
from pipeline.core.artifacts import FP32_ONNX, INT8_FALLBACK
from pipeline.runtime.backends import Context
from pipeline.core.errors import BackendUnavailable, CheckFailed, UsageError
from pipeline.core.run import RunDir, StageRecord, write_json
from pipeline.precision.sensitivity import Candidate

log = logging.getLogger("pipeline")

SCRATCH_INT8 = "model.int8.tune.onnx"  # the all-INT8 graph of one calibration method, while tune works on it


class Tuner:
    """What every phase of one tune run shares: the evidence, the gate, the graphs, the timing."""

    def __init__(self, cfg, run_dir: RunDir):
        self.cfg, self.run_dir = cfg, run_dir
        self.model, self.card = modeling.load_trained(cfg, run_dir, "tune")
        self.spec = self.card["spec"]
        self.fp32_model = onnx_io.load(run_dir.require(FP32_ONNX, "export", "tune"))
        self.evidence = candidates.evidence(cfg, self.card, self.model)
        self.gate = candidates.gate_for(cfg, "int8_exact", "int8")
        # What the FP16 fallback keeps in FP32 stays in FP32 in every mix (export applies it to the INT8 graph too).
        self.base_fp32 = fallback.read(run_dir, fallback.FP16_GRAPH).fp32
        self.ctx = Context(cfg, run_dir, "verify", self.spec, model=self.model, isolate=False)
        n = min(cfg.tune.sensitivity_samples, len(self.evidence.labels))
        self.sens_feeds, self.sens_ref = _first_images(self.evidence, n)
        self.sens_labels = self.evidence.labels[:n]
        self.method = cfg_method(cfg)
        self.batches = sorted({1, max(cfg.benchmark.batch_sizes)})
        self.seconds: dict[str, float] = {}

    # ------------------------------------------------------------------ graphs

    def quantize_all(self, method: str) -> onnx.ModelProto:
        """Every quantizable layer in INT8 with ``method``'s ranges: export's own quantization."""
        try:
            convert.quantize_int8(self.cfg, self.run_dir, self.card, [], out_name=SCRATCH_INT8,
                                 fp32_nodes=self.base_fp32, calibration_method=method)
            return onnx.load(str(self.run_dir.file(SCRATCH_INT8)))
        finally:
            self.run_dir.file(SCRATCH_INT8).unlink(missing_ok=True)

    def mix(self, quantized: onnx.ModelProto, high, fp32=()) -> onnx.ModelProto:
        model = sensitivity.unquantize(quantized, self.fp32_model, high)
        extra = [n for n in fp32 if n not in self.base_fp32]
        return fp16.keep_in_fp32(model, extra) if extra else model

    # ------------------------------------------------------------------ judging

    def quick(self, model: onnx.ModelProto) -> dict:
        """The gate's criteria on the sensitivity images, ``int8_exact`` (the Q/DQ arithmetic as written)."""
        from pipeline.runtime.runners import collect, int8_exact_runner

        outputs = collect(int8_exact_runner(model, "int8_exact"), self.sens_feeds)
        return sensitivity.metrics(outputs, self.sens_ref, self.sens_labels, self.gate, self.spec["output_name"],
                                   self.evidence.confidence)

    def full(self, model: onnx.ModelProto) -> fallback.Round:
        """The full gate: every candidate verify runs on ``model.int8.onnx``, on every verify image."""
        return candidates.recheck_round(fallback.INT8_GRAPH, self.cfg, self.ctx, self.evidence, model)

    def judge(self, model: onnx.ModelProto, high, origin: str, method: str, fp32=()) -> Candidate:
        checked = self.full(model)
        exact = next((c for c in checked.checks if c.name == "int8_exact"), None)
        result = sensitivity.summary(exact.result) if exact is not None and "task_check" in exact.result else {}
        result.update({"status": Status.PASSED if checked.passed else Status.FAILED, "candidates": checked.results})
        cand = Candidate(list(high), origin, result, calibration=method, fp32=list(fp32 or self.base_fp32))
        cand.round = checked
        log.info("tune: %s %s (%d layers out of INT8): %s", method, origin, len(cand.high), result["status"])
        return cand


def cfg_method(cfg):
    from pipeline.runtime.runners import Method

    tc = cfg.tune
    return Method(warmup_s=tc.warmup_s, min_iterations=cfg.benchmark.min_iterations,
                  min_duration_s=tc.min_duration_s, trials=tc.trials, cv_warn=cfg.benchmark.cv_warn)


def _first_images(evidence, n: int) -> tuple[list[dict], list[dict]]:
    """The feeds and reference outputs that hold the first ``n`` verify images."""
    feeds, refs, taken = [], [], 0
    for feed, ref in zip(evidence.feeds, evidence.reference):
        size = len(next(iter(feed.values())))
        keep = min(size, n - taken)
        if keep <= 0:
            break
        feeds.append({k: v[:keep] for k, v in feed.items()})
        refs.append({k: v[:keep] for k, v in ref.items()})
        taken += keep
    return feeds, refs


# --------------------------------------------------------------------------- one calibration method


def tune_method(t: Tuner, method: str) -> dict:
    """Sensitivity, search and greedy fallback for one calibration method."""
    with phase(t, f"quantize ({method})", 1) as bar:
        quantized = t.quantize_all(method)
        bar.update(1)
    layers = sensitivity.quantized_layers(t.fp32_model, quantized)
    ops = {n.name: n.op_type for n in t.fp32_model.graph.node}
    with phase(t, f"sensitivity ({method})", 2 * len(layers) + 1) as bar:
        def quick(high) -> dict:
            bar.update(1)
            return t.quick(t.mix(quantized, high))

        all_low = quick(set())
        ranked = sensitivity.measure(layers, ops, quick, all_low)
    with phase(t, f"search ({method})") as bar:
        def judge(high, origin: str) -> Candidate:
            bar.update(1)
            return t.judge(t.mix(quantized, high), high, origin, method)

        candidates = sensitivity.search([r.layer for r in ranked], judge)
        greedy = _greedy(t, quantized, method, candidates[0])
        if greedy is not None:
            candidates.append(greedy)
    return {"method": method, "layers": layers, "all_low": all_low, "ranked": ranked, "candidates": candidates,
            "quantized": quantized}


@contextmanager
def phase(t: Tuner, name: str, total: int | None = None):
    """A progress bar for one phase of tune (on a terminal), its seconds in ``t.seconds`` and a log line."""
    from tqdm import tqdm

    start = time.perf_counter()
    with tqdm(total=total, desc=f"tune: {name}", unit="mix", disable=None, leave=False, dynamic_ncols=True) as bar:
        yield bar
    t.seconds[name] = time.perf_counter() - start
    log.info("tune: %-26s %6.1f s%s", name, t.seconds[name], f" ({bar.n} mixes)" if bar.n else "")


def _greedy(t: Tuner, quantized: onnx.ModelProto, method: str, all_int8: Candidate) -> Candidate | None:
    """``verify --auto-fallback``'s loop (:func:`pipeline.precision.fallback.run`) from the all-INT8 graph, in a scratch run
    folder so nothing of the run changes; its answer judged like every other candidate."""
    failing = all_int8.round.failing
    if all_int8.passed:  # verify --auto-fallback would move nothing: its answer is the all-INT8 graph
        return Candidate([], "greedy fallback", {**all_int8.result, "greedy_rounds": 0}, calibration=method,
                         fp32=list(all_int8.fp32), round=all_int8.round)
    if failing is None:
        return None
    cfg = t.cfg
    loc = candidates.localize_candidate(cfg, fallback.INT8_GRAPH, t.fp32_model, quantized, t.evidence, failing, None)
    with tempfile.TemporaryDirectory(prefix=".tune.") as tmp:
        scratch = RunDir(Path(tmp))

        def remake(raised: fallback.Raised, out_name: str) -> dict:
            model = t.mix(quantized, raised.out_of_int8, raised.fp32)
            onnx.save(model, str(scratch.file(out_name)))
            return {"int8_fraction": int8.int8_fraction(int8.node_precisions(t.fp32_model, model))}

        result = fallback.run(fallback.INT8_GRAPH, cfg, scratch, t.fp32_model, quantized, loc, remake=remake,
                              recheck=t.full, localize=lambda current, chk: candidates.localize_candidate(
                                  cfg, fallback.INT8_GRAPH, t.fp32_model, current, t.evidence, chk, None))
    raised = result["raised"]
    fp32 = list(dict.fromkeys([*t.base_fp32, *raised["fp32"]]))
    cand = t.judge(t.mix(quantized, raised["out_of_int8"], fp32), raised["out_of_int8"], "greedy fallback", method,
                   fp32)
    cand.result["greedy_passed"] = result["passed"]
    cand.result["greedy_rounds"] = len(result["iterations"])
    return cand


# --------------------------------------------------------------------------- speed


def time_candidates(t: Tuner, runs: list[dict]) -> dict:
    """Every distinct mix timed on the target; returns the FP32 baseline's timing."""
    threads = t.cfg.benchmark.threads or env.usable_cores()
    images = t.evidence.feeds[0][t.spec["input_name"]]
    timed = [c for r in runs for c in r["candidates"]]
    seen: dict[tuple, dict] = {}
    with phase(t, "speed (OpenVINO CPU)", len({c.key() for c in timed}) + 1) as bar:
        baseline = openvino_speed.openvino_timing(t.fp32_model, images, t.batches, t.method, threads, int8_graph=False)
        bar.update(1)
        for cand in timed:
            if cand.key() not in seen:
                quantized = next(r["quantized"] for r in runs if r["method"] == cand.calibration)
                seen[cand.key()] = openvino_speed.openvino_timing(t.mix(quantized, cand.high, cand.fp32), images,
                                                                  t.batches, t.method, threads, int8_graph=True)
                bar.update(1)
            cand.latency_ms = seen[cand.key()]["latency_ms"]
            cand.runtime = seen[cand.key()]["runtime"]
    return baseline


# --------------------------------------------------------------------------- the stage


def run(cfg, run_dir: RunDir, record: StageRecord, *, tune: bool = False, no_speed_gate: bool = False) -> None:
    """``tune`` is ``all``'s flag (it runs this stage); ``no_speed_gate``: ``tune.min_speedup`` is reported only."""
    start = time.perf_counter()
    if not cfg.export.int8.enabled:  # export would write no INT8 graph to apply the choice to
        raise UsageError("export.int8.enabled is false: there is no INT8 graph to tune (set it to true)")
    reason = int8.availability()
    if reason:
        raise BackendUnavailable(f"INT8 tuning needs ModelOpt: {reason}")
    t = Tuner(cfg, run_dir)
    runs = [tune_method(t, method) for method in cfg.tune.calibration_methods]
    baseline = time_candidates(t, runs)
    with phase(t, "confirm (export's graph)"):
        chosen, why = _choose(t, runs)
    fronts = {r["method"]: sensitivity.pareto(r["candidates"], t.batches[0]) for r in runs}
    t.seconds["total"] = time.perf_counter() - start
    payload = tune_report.payload(cfg, t, runs, baseline, chosen, why, fronts)
    if chosen is not None:
        _write_fallback(run_dir, chosen)
        record.artifact(INT8_FALLBACK)
    for path in tune_report.write_all(run_dir, payload):
        record.artifact(path.name)
    record.details.update(tune_report.details(payload))
    if chosen is None:
        raise CheckFailed("tune: no mix passes the gate, not even every layer out of INT8; see tune.md")
    gate = None if no_speed_gate else cfg.tune.min_speedup
    failure = tune_report.speed_failure(payload, gate)
    if failure:
        raise CheckFailed(failure)
    log.info("tune: %s", payload["summary"])


def _choose(t: Tuner, runs: list[dict]) -> tuple[Candidate | None, str]:
    """The fastest passing mix over every calibration method, confirmed on the graph export will make (ModelOpt
    re-quantizing with those layers excluded); a mix whose real graph fails gives way to the next."""
    everything = [c for r in runs for c in r["candidates"]]
    tried = []
    while True:
        pick = sensitivity.choose([c for c in everything if all(c is not x for x in tried)], t.batches,
                                  t.cfg.tune.same_speed)
        if pick is None:
            return None, "no passing mix" + (f" (confirmation failed for {len(tried)})" if tried else "")
        tried.append(pick)
        confirmed = _confirm(t, pick)
        pick.result["confirmed"] = confirmed
        if confirmed["status"] == Status.PASSED:
            return pick, _why(pick, runs, t.batches)


def _confirm(t: Tuner, cand: Candidate) -> dict:
    """The mix made as export will make it (ModelOpt, the layers excluded, the calibration method) and judged."""
    try:
        convert.quantize_int8(t.cfg, t.run_dir, t.card, cand.high, out_name=SCRATCH_INT8, fp32_nodes=cand.fp32,
                             calibration_method=cand.calibration)
        model = onnx.load(str(t.run_dir.file(SCRATCH_INT8)))
    finally:
        t.run_dir.file(SCRATCH_INT8).unlink(missing_ok=True)
    checked = t.full(model)
    return {"status": Status.PASSED if checked.passed else Status.FAILED, "candidates": checked.results}


def _why(pick: Candidate, runs: list[dict], batches: list[int]) -> str:
    lat = ", ".join(f"{pick.latency_ms[b]:.3f} ms at batch {b}" for b in batches)
    others = [r["method"] for r in runs if r["method"] != pick.calibration]
    rest = f" (the {', '.join(others)} calibration's mixes judged and timed alike)" if others else ""
    return (f"the fastest passing mix ({lat}; mixes within tune.same_speed of the fastest count as equally fast, "
            f"and of those the one with the fewest layers out of INT8 wins), {pick.calibration} calibration{rest}")


def _write_fallback(run_dir: RunDir, chosen: Candidate) -> None:
    """The choice as the file export reads: the layers left out of INT8, the FP32 nodes, the calibration."""
    write_json(run_dir.file(INT8_FALLBACK), {
        "nodes": chosen.high, "fp32_nodes": chosen.fp32, "calibration_method": chosen.calibration,
        "note": "chosen by python -m pipeline tune (tune.md): nodes left out of INT8, fp32_nodes kept in FP32, "
                "calibrated with calibration_method"})
