"""The verify stage: the precision gate.

Reference: the trained FP32 PyTorch model on the CPU. Candidates (every entry of
:data:`pipeline.backends.TABLE` with a candidate name), each on the same real validation images:

=================  =========  ==============================================================
candidate          precision  what runs
=================  =========  ==============================================================
onnxrt_fp32        fp32       ONNX Runtime (CPU) on ``model.onnx``
fp16_emulation     fp16       ``model.fp16.onnx`` with every FP16 tensor rounded (see fp16.py)
onnxrt_fp16_cpu    fp16       ONNX Runtime CPU on ``model.fp16.onnx``: a CPU deployment; it
                              computes FP16 regions in FP32, so it is no evidence for TensorRT
int8_exact         int8       ``model.int8.onnx`` executed exactly (ORT, optimisations off, FP16
                              regions rounded; see int8.py): the Q/DQ arithmetic TensorRT computes
onnxrt_int8_cpu    int8       ONNX Runtime CPU int8 kernels on ``model.int8.onnx`` (a CPU deployment)
tensorrt_fp16      fp16       the TensorRT engine (GPU + TensorRT only)
onnxrt_cuda_fp16   fp16       ONNX Runtime's CUDA provider on ``model.fp16.onnx`` (GPU only)
=================  =========  ==============================================================

A candidate passes when both checks pass: the tensor check (Polygraphy's ``SimpleCompareFunc``
on every batch: with ``elemwise`` an element fails only if it exceeds atol AND rtol, relative
error taken against the reference; NaN/Inf in the candidate always fails) and the task check
(top-1 agreement with the reference and accuracy against the labels).

Three parts: the gate's numerics (:func:`compare`, :func:`check`), the FP32 fallback loop
(:func:`auto_fallback`), and the wording, which lives in :mod:`pipeline.verify_report` with the
reports. verify never runs another stage: when the fallback replaces ``model.fp16.onnx`` it says
so in ``record.details["replaced_artifacts"]`` and the stage runner re-runs what depends on it.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass, field

import numpy as np
import onnx

from pipeline import backends, batching, data, export, fallback, gate as criteria, int8, localize, modeling, onnx_io
from pipeline import predictions, provenance
from pipeline.artifacts import INT8_ONNX, WEIGHTS
from pipeline import verify_report as report
from pipeline.backends import Backend, Context
from pipeline.errors import BackendUnavailable, CheckFailed, Inconclusive, InputError, StageFailed, disk_full
from pipeline.isolate import Crashed
from pipeline.run import RunDir, StageRecord, sha256_file
from pipeline.runners import TorchRunner, collect

log = logging.getLogger("pipeline")

REFERENCE = backends.REFERENCE


@dataclass
class Check:
    """One candidate of one verify run: its table entry, why it cannot run ("" if it can), its result."""

    backend: Backend
    label: str
    required: bool
    reason: str = ""
    result: dict = field(default_factory=dict)
    gates: bool = True  # its verdict decides the exit code (verify.gate); else it is run and reported only

    @property
    def name(self) -> str:
        return self.backend.candidate

    @property
    def precision(self) -> str:
        return self.backend.precision

    @property
    def artifact(self) -> str | None:
        return self.backend.artifact

    @property
    def status(self) -> str:
        return self.result.get("status", "")


@dataclass
class Evidence:
    """What every candidate is compared on: the feeds, the reference's outputs, the labels."""

    feeds: list[dict]
    reference: list[dict]
    labels: np.ndarray
    output_name: str
    confidence: float = 0.95  # of the task check's bounds (verify.confidence)
    names: list[str] = field(default_factory=list)  # each image's name (its file, for an image folder)
    outputs: dict = field(default_factory=dict)  # each judged candidate's outputs (verify.predictions.npz)


def gate_for(cfg, name: str, precision: str) -> dict:
    """The thresholds of one candidate: its own non-null keys over the precision's defaults."""
    base = getattr(cfg.verify, precision, cfg.verify.fp32).model_dump()  # verify.fp16/int8/bf16; else fp32
    section = getattr(cfg.verify.candidates, name, None)  # a table entry without a config section: defaults
    own = section.model_dump() if section is not None else {}
    return {key: own[key] if own.get(key) is not None else value for key, value in base.items()}


def plan(cfg, ctx: Context, entries: list[Backend] | None = None) -> list[Check]:
    """The candidates, each with the reason it cannot run; ``enabled=false`` is decided before anything loads."""
    checks = []
    for backend in entries if entries is not None else backends.candidates():
        section = getattr(cfg.verify.candidates, backend.candidate, None)
        if section is not None and not section.enabled:
            reason = report.disabled(backend.candidate)
        else:
            reason = backend.unavailable(ctx)
        checks.append(Check(backend, backends.label(backend, cfg), backend.required(cfg), reason,
                            gates=gates(cfg, backend)))
    return checks


def gates(cfg, backend: Backend) -> bool:
    """Whether a candidate's verdict decides the exit code: named in ``verify.gate``, or (``auto``) a deployment
    target or its faithful CPU proxy (the table's ``gates``)."""
    chosen = cfg.verify.gate
    return backend.gates if chosen == "auto" else backend.candidate in chosen


# --------------------------------------------------------------------------- numerics


def compare(outputs: list[dict], reference: list[dict], labels: np.ndarray, gate: dict, output_name: str,
            confidence: float = 0.95) -> dict:
    """The tensor check and the task check of one candidate (:func:`pipeline.gate.judge`)."""
    return criteria.judge(outputs, reference, labels, gate, output_name, confidence)


def task_check(ref: np.ndarray, cand: np.ndarray, labels: np.ndarray, gate: dict, confidence: float = 0.95) -> dict:
    return criteria.task_check(ref, cand, labels, gate, confidence)


def check(chk: Check, cfg, ctx: Context, evidence: Evidence) -> dict:
    """Run one candidate on the evidence and judge it; sets and returns ``chk.result``."""
    gate = gate_for(cfg, chk.name, chk.precision)
    chk.result = {**_judge(chk, ctx, evidence, gate), "tolerance": gate}
    return chk.result


def _judge(chk: Check, ctx: Context, evidence: Evidence, gate: dict) -> dict:
    if chk.reason:
        return {"status": "skipped", "reason": chk.reason}
    try:
        runner = chk.backend.runner(ctx)  # native runtimes: in a child process (pipeline.isolate)
        outputs = collect(runner, evidence.feeds)
    except InputError:
        raise
    except Crashed as exc:  # the child died (a segfault in the runtime): a "crashed" row, the others go on
        return report.crashed(exc)
    except Exception as exc:  # a candidate that cannot run is an "error" row, not a dead stage
        if disk_full(exc):  # but a full disk ends the stage, with the documented message
            raise disk_full(exc) from None
        return {"status": "error", "reason": report.error_reason(exc)}
    problem = _output_problem(chk, outputs, evidence)
    if problem:
        return {"status": "error", "reason": problem}
    evidence.outputs[chk.name] = outputs  # the last judged outputs (after a fallback: the replacement's)
    result = compare(outputs, evidence.reference, evidence.labels, gate, evidence.output_name, evidence.confidence)
    return {**result, **report.runtime_facts(runner)}  # its child's log, a runtime workaround


def _output_problem(chk: Check, outputs: list[dict], evidence: Evidence) -> str:
    """A missing output is the candidate's error; an output of another shape than the reference's (a graph
    without static shapes, from another run) is an InputError, before NumPy fails to broadcast them."""
    name = evidence.output_name
    if name not in outputs[0]:
        return report.wrong_outputs(list(outputs[0]), name)
    got, want = tuple(outputs[0][name].shape[1:]), tuple(evidence.reference[0][name].shape[1:])
    if got != want:
        raise InputError(report.wrong_output_shape(chk.name, chk.artifact, got, want))
    return ""


JUDGED = ("passed", "failed", "inconclusive")


def _verdict(checks: list[Check], inconclusive_fails: bool = False) -> dict:
    """The gate's verdict over the gating candidates (``Check.gates``); the others are reported only. A required
    candidate that could not run fails it whether it gates or not."""
    gating = [c for c in checks if c.gates]
    ran = [c for c in gating if c.status in JUDGED]
    failed = [c for c in gating if c.status == "failed"]
    errors = [c for c in gating if c.status in ("error", "crashed")]  # nothing compared: no verdict on them
    undecided = [c for c in gating if c.status == "inconclusive"]
    missing = [c for c in checks if c.required and c.status == "skipped" and not c.result.get("after_fallback")]
    passed = not failed and not errors and not missing and not (undecided and inconclusive_fails)
    return {"passed": passed, "ran": len(ran), "failed": failed, "errors": errors, "missing_required": missing,
            "inconclusive": undecided, "deployable": [c.name for c in gating if c.status == "passed"],
            "reported_only": [c.name for c in checks if not c.gates]}


# --------------------------------------------------------------------------- the stage


def _load_graphs(cfg, run_dir: RunDir, spec: dict, hashes: dict) -> tuple[onnx.ModelProto, onnx.ModelProto | None]:
    """Both graphs, checked against the model card; ``hashes`` gets the sha256 of each file as it is read.

    A ``model.fp16.onnx`` the config says export writes (``export.fp16.enabled``) must be there: its
    candidates skipped for want of it would let the gate pass without checking FP16 at all.
    """
    fp32_path = run_dir.require(export.FP32_ONNX, "export", "verify")
    hashes[export.FP32_ONNX] = sha256_file(fp32_path)
    fp32_model = onnx_io.load(fp32_path)
    onnx_io.check_matches_spec(fp32_model, fp32_path, spec)
    fp16_path = run_dir.file(export.FP16_ONNX)
    if cfg.export.fp16.enabled:
        run_dir.require(export.FP16_ONNX, "export", "verify")
    fp16_model = None
    if fp16_path.exists():
        hashes[export.FP16_ONNX] = sha256_file(fp16_path)
        fp16_model = onnx_io.load(fp16_path, "FP16 ONNX model")
        onnx_io.check_matches_spec(fp16_model, fp16_path, spec)
    # Engines and IR: loaded (through their sidecar checks) by their runners; hashed for benchmark's verdicts.
    for artifact in (b.artifact for b in backends.TABLE if b.runtime in ("TensorRT", backends.OV)):
        if run_dir.file(artifact).is_file():
            hashes[artifact] = report.artifact_sha256(run_dir, artifact)
    return fp32_model, fp16_model


def _load_int8(run_dir: RunDir, spec: dict, hashes: dict) -> onnx.ModelProto | None:
    """``model.int8.onnx`` when present, checked against the model card (its absence: ``backends._needs_int8``)."""
    path = run_dir.file(INT8_ONNX)
    if not path.exists():
        return None
    hashes[INT8_ONNX] = sha256_file(path)
    model = onnx_io.load(path, "INT8 ONNX model")
    onnx_io.check_matches_spec(model, path, spec)
    return model


def _evidence(cfg, card: dict, model) -> Evidence:
    spec = card["spec"]
    names: list[str] = []
    images, labels = data.labelled_validation_batch(cfg, card, sample_count(cfg, spec), spread=True, names=names)
    bs = cfg.verify.batch_size
    feeds = [{spec["input_name"]: images[i : i + bs]} for i in range(0, len(images), bs)]
    log.info("verify: %d validation images in %d batches; reference %s", len(images), len(feeds), REFERENCE)
    ref_runner = TorchRunner(model, name=REFERENCE, input_name=spec["input_name"], output_name=spec["output_name"],
                             input_shape=tuple(spec["input_size"]))
    return Evidence(feeds, collect(ref_runner, feeds), labels, spec["output_name"], cfg.verify.confidence, names)


IMAGE_BYTES_BUDGET = 256 << 20  # the images verify holds (and hands to each child process), at most


def sample_count(cfg, spec: dict) -> int:
    """``verify.samples``, or every validation image up to ``verify.max_samples`` and a memory budget (256 MiB of
    float32 images: 1,000 at 32x32 and 224x224 alike would be 12 MiB and 602 MiB)."""
    if cfg.verify.samples is not None:
        return cfg.verify.samples
    per_image = 4 * int(np.prod(spec["input_size"]))
    return max(1, min(cfg.verify.max_samples, IMAGE_BYTES_BUDGET // per_image))


def run(cfg, run_dir: RunDir, record: StageRecord, *, auto_fallback: bool = False) -> None:
    model, card = modeling.load_trained(cfg, run_dir, "verify")
    spec = card["spec"]
    hashes = {WEIGHTS: sha256_file(run_dir.file(WEIGHTS))}  # what each verdict is about (benchmark checks them)
    fp32_model, fp16_model = _load_graphs(cfg, run_dir, spec, hashes)
    int8_model = _load_int8(run_dir, spec, hashes)
    provenance.check_graphs(hashes[WEIGHTS], {export.FP32_ONNX: fp32_model, export.FP16_ONNX: fp16_model,
                                               INT8_ONNX: int8_model})  # never judge a stale graph
    evidence = _evidence(cfg, card, model)
    ctx = Context(cfg, run_dir, "verify", spec, model=model, fp16=fp16_model, int8=int8_model)
    checks = plan(cfg, ctx)
    nonfinite = _nonfinite(evidence)
    if nonfinite:
        _refuse_broken_reference(cfg, card, run_dir, record, checks, evidence, nonfinite, hashes)
    for chk in checks:
        check(chk, cfg, ctx, evidence)
        report.log_check(chk)
    export_broken = any(c.name == "onnxrt_fp32" and c.status == "failed" for c in checks)
    if export_broken:
        next(c for c in checks if c.name == "onnxrt_fp32").result["hint"] = report.EXPORT_BROKEN_HINT
        log.warning(report.EXPORT_BROKEN_LOG)
    for chk in (c for c in checks if c.name == "openvino_bf16" and c.status == "failed"):
        chk.result["hint"] = report.OPENVINO_BF16_NO_FALLBACK  # the FP32 fallback cannot reach an OpenVINO kernel
    gated = {} if export_broken else {
        graph.precision: _precision_gate(graph, cfg, run_dir, card, ctx, fp32_model, evidence, checks, hashes,
                                         auto_fallback=auto_fallback)
        for graph in (fallback.FP16_GRAPH, fallback.INT8_GRAPH)}
    (loc16, fb16), (loc8, fb8) = gated.get("fp16", (None, None)), gated.get("int8", (None, None))
    batching.verify_batch_sizes(cfg, ctx, checks, evidence, gate_for)  # every batch size the artifacts serve
    written = predictions.record(run_dir, checks, evidence)
    if written is not None:
        record.artifact(written.name)
    fb16, fb8 = report.with_earlier_fallbacks(run_dir, hashes, fb16, fb8)
    verdict = _verdict(checks, inconclusive_fails=cfg.verify.inconclusive == "fail")
    payload = report.build_payload(cfg, card, checks, loc16, fb16, verdict, len(evidence.labels),
                                   cfg.verify.batch_size, hashes=hashes, int8_localization=loc8, int8_fallback=fb8)
    for p in report.write_all(run_dir, payload):
        record.artifact(p.name)
    record.details.update(_details(checks, verdict, evidence, fb16, fb8))
    failing_first = verdict["failed"][0] if verdict["failed"] else None
    shown_loc = loc8 if failing_first is not None and failing_first.backend.uses_int8_model else loc16
    fixable = any((c.backend.uses_fp16_model or c.backend.uses_int8_model) and not c.result.get("hint")
                  for c in verdict["failed"])
    _raise_for(verdict, shown_loc, export_broken, suggest_fallback=fixable and not auto_fallback)
    log.info("verify: passed (%s); deployable: %s", ", ".join(f"{c.name} {c.status}" for c in checks),
             ", ".join(verdict["deployable"]) or "none")


def _details(checks: list[Check], verdict: dict, evidence: Evidence, fb16: dict | None, fb8: dict | None) -> dict:
    """The manifest's summary of verify: what passed, what is deployable, what a fallback replaced."""
    return {
        "passed": verdict["passed"],
        "candidates": {c.name: c.status for c in checks},
        "deployable": verdict["deployable"],
        **report.runtime_details(checks),
        "samples": len(evidence.labels),
        "fallback": None if fb16 is None else {k: fb16[k] for k in ("passed", "moved_to_fp32")},
        "int8_fallback": None if fb8 is None else {k: fb8[k] for k in ("passed", "excluded_from_int8", "kept_in_fp32",
                                                                         "int8_fraction_after") if k in fb8},
        # The stage runner re-runs the stages that produce and consume these (verify runs none itself).
        "replaced_artifacts": (fb16["replaced"] if fb16 else []) + (fb8["replaced"] if fb8 else []),
    }


def _nonfinite(evidence: Evidence) -> int:
    """How many validation images the reference itself gives NaN/Inf logits for."""
    return int(sum((~np.isfinite(r[evidence.output_name])).any(axis=1).sum() for r in evidence.reference))


def _refuse_broken_reference(cfg, card, run_dir: RunDir, record: StageRecord, checks: list[Check],
                             evidence: Evidence, nonfinite: int, hashes: dict) -> None:
    """The trained model's own FP32 output is NaN/Inf: no candidate can be judged against it, and the
    fault is the training's, not the export's. The reports say so; the gate fails (exit 1)."""
    reason = report.reference_nonfinite_reason(nonfinite, len(evidence.labels))
    for chk in checks:
        chk.result = {"status": "skipped", "reason": reason, "tolerance": gate_for(cfg, chk.name, chk.precision)}
        report.log_check(chk)
    payload = report.build_payload(cfg, card, checks, None, None, {"passed": False}, len(evidence.labels),
                                   cfg.verify.batch_size, hashes=hashes, reference_nonfinite=nonfinite)
    for p in report.write_all(run_dir, payload):
        record.artifact(p.name)
    record.details.update({"passed": False, "candidates": {c.name: c.status for c in checks},
                           "samples": len(evidence.labels), "reference_nonfinite": nonfinite,
                           "fallback": None, "replaced_artifacts": []})
    raise CheckFailed(report.reference_nonfinite_message(nonfinite, len(evidence.labels)))


def _raise_for(verdict: dict, localization, export_broken: bool, suggest_fallback: bool) -> None:
    if verdict["missing_required"]:
        raise BackendUnavailable(report.missing_required_message(verdict["missing_required"]))
    if verdict["failed"]:
        raise CheckFailed(report.failure_message(verdict, localization, export_broken, suggest_fallback))
    if verdict["errors"]:
        raise StageFailed(report.errors_message(verdict["errors"]))
    if verdict["inconclusive"] and not verdict["passed"]:
        raise Inconclusive(report.inconclusive_message(verdict["inconclusive"]))


def _worst_batch(chk: Check, evidence: Evidence) -> dict:
    """The batch with the candidate's worst image (scaled criterion), or its first failing batch (absolute)."""
    tensor = chk.result.get("tensor_check", {})
    if tensor.get("criterion") == "scaled":
        return evidence.feeds[tensor.get("worst_image", 0) // len(next(iter(evidence.feeds[0].values())))]
    return evidence.feeds[(tensor.get("failed_batches") or [0])[0]]


def _runs(chk: Check, graph: fallback.PrecisionGraph) -> bool:
    """Whether a candidate runs ``graph`` (the file itself, or an engine or IR made from it)."""
    return chk.backend.uses_int8_model if graph.precision == "int8" else chk.backend.uses_fp16_model


# --------------------------------------------------------------------------- localisation and fallback, every precision


def _precision_gate(graph: fallback.PrecisionGraph, cfg, run_dir: RunDir, card, ctx: Context, fp32_model,
                    evidence: Evidence, checks: list[Check], hashes: dict, *,
                    auto_fallback: bool) -> tuple[dict | None, dict | None]:
    """A failing gating candidate of ``graph``: localise it, then (``--auto-fallback``) raise the precision of the
    offending nodes until the graph passes. Returns (localisation, fallback), each None when it did not run."""
    failing = [c for c in checks if c.gates and c.status == "failed" and _runs(c, graph)]
    if not failing:
        return None, None
    if graph.precision == "int8" and any(c.name == "int8_exact" and c.status == "passed" for c in checks):
        for chk in failing:  # the Q/DQ graph itself is sound: a runtime's kernels compute it differently
            chk.result["hint"] = report.INT8_KERNELS_HINT
        return None, None
    model = ctx.int8_model if graph.precision == "int8" else ctx.fp16_model
    loc = _localize(cfg, graph, fp32_model, model, evidence, failing[0], run_dir) if cfg.verify.localize else None
    if not auto_fallback:
        return loc, None
    rounds: list[fallback.Round] = []

    def recheck(current) -> fallback.Round:
        rounds.append(_recheck_round(graph, cfg, ctx, evidence, current))
        return rounds[-1]

    result = fallback.run(
        graph, cfg, run_dir, fp32_model, model, loc, recheck=recheck,
        remake=lambda raised, out_name: _remake(graph, cfg, run_dir, card, raised, out_name),
        localize=lambda current, chk: _localize(cfg, graph, fp32_model, current, evidence, chk, None))
    if result["passed"]:
        _commit(graph, checks, rounds[-1].checks)
        hashes[graph.artifact] = sha256_file(run_dir.file(graph.artifact))
    return loc, _legacy_keys(graph, result)


def _remake(graph: fallback.PrecisionGraph, cfg, run_dir: RunDir, card, raised: fallback.Raised, out_name: str):
    if graph.precision == "int8":
        return export.quantize_int8(cfg, run_dir, card, raised.out_of_int8, out_name=out_name, fp32_nodes=raised.fp32)
    return export.convert_fp16(cfg, run_dir, card, raised.fp32, out_name=out_name)


def _legacy_keys(graph: fallback.PrecisionGraph, result: dict) -> dict:
    """verify.json's names for what moved (schemas pipeline.verify/1 and /2), beside the precision core's ``raised``."""
    if graph.precision == "int8":
        return {**result, "excluded_from_int8": result["raised"]["out_of_int8"],
                "kept_in_fp32": result["raised"]["fp32"]}
    return {**result, "moved_to_fp32": result["raised"]["fp32"]}


def _recheck_round(graph: fallback.PrecisionGraph, cfg, ctx: Context, evidence: Evidence, current) -> fallback.Round:
    """The candidates that run ``graph``'s file itself, on the remade graph; the round passes when every gating one
    that ran passed (inconclusive counts as passing under ``verify.inconclusive: pass``) and one at least ran."""
    sub = dataclasses.replace(ctx, **{graph.precision: current})
    rechecked = plan(cfg, sub, [b for b in backends.candidates() if b.artifact == graph.artifact])
    for chk in rechecked:
        check(chk, cfg, sub, evidence)
    fine = {"passed", "skipped"} | ({"inconclusive"} if cfg.verify.inconclusive == "pass" else set())
    gating = [c for c in rechecked if c.gates]
    passed = all(c.status in fine for c in gating) and any(c.status in JUDGED for c in gating)
    failing = next((c for c in gating if c.status == "failed"), None)
    note = "" if passed or failing else report.fallback_errors(rechecked)
    return fallback.Round({c.name: c.status for c in rechecked}, passed, failing, note, rechecked)


def _commit(graph: fallback.PrecisionGraph, checks: list[Check], rechecked: list[Check]) -> None:
    """The passing round's results replace the candidates' of the old file; what was made from the old file
    (an engine, an OpenVINO IR) is stale until build re-makes it."""
    by_name = {c.name: c for c in rechecked}
    stale = report.STALE_INT8_ENGINE if graph.precision == "int8" else report.STALE_ENGINE
    for chk in checks:
        if chk.name in by_name:
            chk.result = {**by_name[chk.name].result, "after_fallback": True}
        elif _runs(chk, graph) and chk.status != "skipped":
            chk.result = {"status": "skipped", "reason": stale, "after_fallback": True,
                          "tolerance": chk.result.get("tolerance")}


def _localize(cfg, graph: fallback.PrecisionGraph, fp32_model, model, evidence: Evidence, chk: Check,
              run_dir: RunDir | None) -> dict:
    """The first node over the gate's own rule (per tensor), on the candidate's worst batch: the INT8 graph executed
    exactly, or the FP16 emulation (on a GPU, for the FP16 engine: the engine rebuilt with every tensor marked)."""
    rule = _localization_rule(chk)
    feed = _worst_batch(chk, evidence)
    result = None
    if graph.precision == "int8":
        result = int8.localize(fp32_model, model, feed, rule, cfg.verify.localize_top)
    elif chk.artifact == backends.ENGINE and run_dir is not None:
        result = _localize_engine(cfg, fp32_model, run_dir, feed, rule, evidence)
    if result is None:
        result = localize.localize_emulation(fp32_model, model, feed, rule, cfg.verify.localize_top)
    result["candidate"] = chk.name
    report.log_localization(result)
    return result


def _localization_rule(chk: Check) -> criteria.TensorRule:
    """The gate's rule per tensor; with the scaled criterion, at most half the candidate's own output error, so a
    candidate that failed on its task check with a smaller error still has its source named (the cancellation
    fault in the INT8 graph: output error 0.4 of its scale, under INT8's 0.5, but 13 % of the images flipped)."""
    rule = criteria.TensorRule.of(chk.result["tolerance"])
    observed = chk.result.get("tensor_check", {}).get("scaled_error_quantile")
    if rule.criterion == "scaled" and observed is not None and math.isfinite(observed) and observed > 0:
        return dataclasses.replace(rule, max_scaled_error=min(rule.max_scaled_error, observed / 2))
    return rule


def _localize_engine(cfg, fp32_model, run_dir: RunDir, feed: dict, rule, evidence: Evidence) -> dict | None:
    from pipeline import build

    spec_input = next(iter(feed))
    try:
        shapes = build.profile_shapes(cfg, list(feed[spec_input].shape[1:]))
        cache = build.timing_cache_path(cfg, run_dir)
        return localize.localize_tensorrt(fp32_model, run_dir.file(export.FP16_ONNX), feed, rule,
                                          cfg.verify.localize_top, spec_input, shapes, build_cfg=cfg.build,
                                          timing_cache=cache)
    except Exception as exc:  # fall back to the emulation, and say so
        log.warning(report.TENSORRT_LOCALIZE_FAILED, exc)
        return None
