"""The verify stage: the precision gate.

Reference: the trained FP32 PyTorch model on the CPU. Candidates (every entry of
:data:`pipeline.runtime.backends.TABLE` with a candidate name), each on the same real validation images:

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
(:func:`auto_fallback`), and the wording, which lives in :mod:`pipeline.reports.verify_report` with the
reports. verify never runs another stage: when the fallback replaces ``model.fp16.onnx`` it says
so in ``record.details["replaced_artifacts"]`` and the stage runner re-runs what depends on it.
"""

from __future__ import annotations

import logging

import numpy as np
import onnx


from pipeline.core.status import Status
from pipeline.core import modeling, onnx_io, provenance
from pipeline.precision import fallback
from pipeline.runtime import backends
from pipeline.core.artifacts import FP16_ONNX, FP32_ONNX, INT8_ONNX, WEIGHTS
from pipeline.reports import verify_report
from pipeline.runtime.backends import Context
from pipeline.core.errors import BackendUnavailable, CheckFailed, Inconclusive, StageFailed
from pipeline.core.run import RunDir, StageRecord, sha256_file

from pipeline.evaluation import batching, candidates, predictions
from pipeline.evaluation.candidates import Check, Evidence, Verdict

log = logging.getLogger("pipeline")


# --------------------------------------------------------------------------- numerics


# --------------------------------------------------------------------------- the stage


def _load_graphs(cfg, run_dir: RunDir, spec: dict, hashes: dict) -> tuple[onnx.ModelProto, onnx.ModelProto | None]:
    """Both graphs, checked against the model card; ``hashes`` gets the sha256 of each file as it is read.

    A ``model.fp16.onnx`` the config says export writes (``export.fp16.enabled``) must be there: its
    candidates skipped for want of it would let the gate pass without checking FP16 at all.
    """
    fp32_path = run_dir.require(FP32_ONNX, "export", "verify")
    hashes[FP32_ONNX] = sha256_file(fp32_path)
    fp32_model = onnx_io.load(fp32_path)
    onnx_io.check_matches_spec(fp32_model, fp32_path, spec)
    fp16_path = run_dir.file(FP16_ONNX)
    if cfg.export.fp16.enabled:
        run_dir.require(FP16_ONNX, "export", "verify")
    fp16_model = None
    if fp16_path.exists():
        hashes[FP16_ONNX] = sha256_file(fp16_path)
        fp16_model = onnx_io.load(fp16_path, "FP16 ONNX model")
        onnx_io.check_matches_spec(fp16_model, fp16_path, spec)
    # Engines and IR: loaded (through their sidecar checks) by their runners; hashed for benchmark's verdicts.
    for artifact in (b.artifact for b in backends.TABLE if b.runtime in ("TensorRT", backends.OV)):
        if run_dir.file(artifact).is_file():
            hashes[artifact] = verify_report.artifact_sha256(run_dir, artifact)
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


def run(cfg, run_dir: RunDir, record: StageRecord, *, auto_fallback: bool = False) -> None:
    model, card = modeling.load_trained(cfg, run_dir, "verify")
    spec = card["spec"]
    hashes = {WEIGHTS: sha256_file(run_dir.file(WEIGHTS))}  # what each verdict is about (benchmark checks them)
    fp32_model, fp16_model = _load_graphs(cfg, run_dir, spec, hashes)
    int8_model = _load_int8(run_dir, spec, hashes)
    provenance.check_graphs(hashes[WEIGHTS], {FP32_ONNX: fp32_model, FP16_ONNX: fp16_model,
                                               INT8_ONNX: int8_model})  # never judge a stale graph
    evidence = candidates.evidence(cfg, card, model)
    ctx = Context(cfg, run_dir, "verify", spec, model=model, fp16=fp16_model, int8=int8_model)
    checks = candidates.plan(cfg, ctx)
    nonfinite = _nonfinite(evidence)
    if nonfinite:
        _refuse_broken_reference(cfg, card, run_dir, record, checks, evidence, nonfinite, hashes)
    batch_feeds = batching.feeds_by_size(cfg, evidence.feeds)  # run by each candidate's runner after its main check
    for chk in checks:
        candidates.check(chk, cfg, ctx, evidence, batch_feeds)
        verify_report.log_check(chk)
    export_broken = any(c.name == "onnxrt_fp32" and c.status == Status.FAILED for c in checks)
    if export_broken:
        next(c for c in checks if c.name == "onnxrt_fp32").result["hint"] = verify_report.EXPORT_BROKEN_HINT
        log.warning(verify_report.EXPORT_BROKEN_LOG)
    for chk in (c for c in checks if c.name == "openvino_bf16" and c.status == Status.FAILED):
        chk.result["hint"] = verify_report.OPENVINO_BF16_NO_FALLBACK  # the FP32 fallback cannot reach an OpenVINO kernel
    gated = {} if export_broken else {
        graph.precision: _precision_gate(graph, cfg, run_dir, card, ctx, fp32_model, evidence, checks, hashes,
                                         auto_fallback=auto_fallback)
        for graph in (fallback.FP16_GRAPH, fallback.INT8_GRAPH)}
    (loc16, fb16), (loc8, fb8) = gated.get("fp16", (None, None)), gated.get("int8", (None, None))
    batching.verify_batch_sizes(cfg, checks, evidence, candidates.gate_for)  # every batch size served
    written = predictions.record(run_dir, checks, evidence)
    if written is not None:
        record.artifact(written.name)
    fb16, fb8 = verify_report.with_earlier_fallbacks(run_dir, hashes, fb16, fb8)
    verdict = candidates.verdict(checks, inconclusive_fails=cfg.verify.inconclusive == "fail")
    payload = verify_report.build_payload(cfg, card, checks, loc16, fb16, verdict, len(evidence.labels),
                                   cfg.verify.batch_size, hashes=hashes, int8_localization=loc8, int8_fallback=fb8)
    for p in verify_report.write_all(run_dir, payload):
        record.artifact(p.name)
    record.details.update(_details(checks, verdict, evidence, fb16, fb8))
    record.details.update(_reference_quality(run_dir, evidence))
    failing_first = verdict.failed[0] if verdict.failed else None
    shown_loc = loc8 if failing_first is not None and failing_first.backend.uses_int8_model else loc16
    fixable = any((c.backend.uses_fp16_model or c.backend.uses_int8_model) and not c.result.get("hint")
                  for c in verdict.failed)
    _raise_for(verdict, shown_loc, export_broken, suggest_fallback=fixable and not auto_fallback)
    log.info("verify: passed (%s); deployable: %s; %s", ", ".join(f"{c.name} {c.status}" for c in checks),
             ", ".join(verdict.deployable) or "none", verify_report.reference_words(record.details))


def _reference_quality(run_dir: RunDir, evidence: Evidence) -> dict:
    """The reference's own accuracy on these images, and train's learning verdict (its manifest entry): the gate
    says the artifacts agree with the reference, not that the reference is any good."""
    top1 = np.concatenate([r[evidence.output_name] for r in evidence.reference]).argmax(1)
    learning = ((run_dir.stage_entry("train") or {}).get("details") or {}).get("learning") or {}
    if learning.get("learned") is False:
        log.warning("verify: the reference did not learn (train: %s): passing this gate says the artifacts agree "
                    "with it, not that they are any good", learning.get("line"))
    return {"reference_accuracy": float((top1 == evidence.labels).mean()) if len(evidence.labels) else None,
            "reference_learned": learning.get("learned"), "reference_learning": learning.get("line")}


def _details(checks: list[Check], verdict: Verdict, evidence: Evidence, fb16: dict | None, fb8: dict | None) -> dict:
    """The manifest's summary of verify: what passed, what is deployable, what a fallback replaced."""
    return {
        "passed": verdict.passed,
        "candidates": {c.name: c.status for c in checks},
        "deployable": verdict.deployable,
        **verify_report.runtime_details(checks),
        "samples": len(evidence.labels),
        "fallback": None if fb16 is None else {k: fb16[k] for k in (Status.PASSED, "moved_to_fp32")},
        "int8_fallback": None if fb8 is None else {k: fb8[k] for k in (Status.PASSED, "excluded_from_int8", "kept_in_fp32",
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
    reason = verify_report.reference_nonfinite_reason(nonfinite, len(evidence.labels))
    for chk in checks:
        chk.result = {"status": Status.SKIPPED, "reason": reason, "tolerance": candidates.gate_for(cfg, chk.name, chk.precision)}
        verify_report.log_check(chk)
    payload = verify_report.build_payload(cfg, card, checks, None, None, Verdict(passed=False), len(evidence.labels),
                                   cfg.verify.batch_size, hashes=hashes, reference_nonfinite=nonfinite)
    for p in verify_report.write_all(run_dir, payload):
        record.artifact(p.name)
    record.details.update({"passed": False, "candidates": {c.name: c.status for c in checks},
                           "samples": len(evidence.labels), "reference_nonfinite": nonfinite,
                           "fallback": None, "replaced_artifacts": []})
    raise CheckFailed(verify_report.reference_nonfinite_message(nonfinite, len(evidence.labels)))


def _raise_for(verdict: Verdict, localization, export_broken: bool, suggest_fallback: bool) -> None:
    if verdict.missing_required:
        raise BackendUnavailable(verify_report.missing_required_message(verdict.missing_required))
    if verdict.failed:
        raise CheckFailed(verify_report.failure_message(verdict, localization, export_broken, suggest_fallback))
    if verdict.errors:
        raise StageFailed(verify_report.errors_message(verdict.errors))
    if verdict.inconclusive and not verdict.passed:
        raise Inconclusive(verify_report.inconclusive_message(verdict.inconclusive))


# --------------------------------------------------------------------------- localisation and fallback, every precision


def _precision_gate(graph: fallback.PrecisionGraph, cfg, run_dir: RunDir, card, ctx: Context, fp32_model,
                    evidence: Evidence, checks: list[Check], hashes: dict, *,
                    auto_fallback: bool) -> tuple[dict | None, dict | None]:
    """A failing gating candidate of ``graph``: localise it, then (``--auto-fallback``) raise the precision of the
    offending nodes until the graph passes. Returns (localisation, fallback), each None when it did not run."""
    failing = [c for c in checks if c.gates and c.status == Status.FAILED and candidates.runs_graph(c, graph)]
    if not failing:
        return None, None
    if graph.precision == "int8" and any(c.name == "int8_exact" and c.status == Status.PASSED for c in checks):
        for chk in failing:  # the Q/DQ graph itself is sound: a runtime's kernels compute it differently
            chk.result["hint"] = verify_report.INT8_KERNELS_HINT
        return None, None
    model = ctx.int8_model if graph.precision == "int8" else ctx.fp16_model
    loc = candidates.localize_candidate(cfg, graph, fp32_model, model, evidence, failing[0], run_dir) if cfg.verify.localize else None
    if not auto_fallback:
        return loc, None
    rounds: list[fallback.Round] = []

    def recheck(current) -> fallback.Round:
        rounds.append(candidates.recheck_round(graph, cfg, ctx, evidence, current))
        return rounds[-1]

    result = fallback.run(
        graph, cfg, run_dir, fp32_model, model, loc, recheck=recheck,
        remake=lambda raised, out_name: candidates.remake(graph, cfg, run_dir, card, raised, out_name),
        localize=lambda current, chk: candidates.localize_candidate(cfg, graph, fp32_model, current, evidence, chk, None))
    if result["passed"]:
        _commit(graph, checks, rounds[-1].checks)
        hashes[graph.artifact] = sha256_file(run_dir.file(graph.artifact))
    return loc, _legacy_keys(graph, result)


def _legacy_keys(graph: fallback.PrecisionGraph, result: dict) -> dict:
    """verify.json's names for what moved (schemas pipeline.verify/1 and /2), beside the precision core's ``raised``."""
    if graph.precision == "int8":
        return {**result, "excluded_from_int8": result["raised"]["out_of_int8"],
                "kept_in_fp32": result["raised"]["fp32"]}
    return {**result, "moved_to_fp32": result["raised"]["fp32"]}


def _commit(graph: fallback.PrecisionGraph, checks: list[Check], rechecked: list[Check]) -> None:
    """The passing round's results replace the candidates' of the old file; what was made from the old file
    (an engine, an OpenVINO IR) is stale until build re-makes it."""
    by_name = {c.name: c for c in rechecked}
    stale = verify_report.STALE_INT8_ENGINE if graph.precision == "int8" else verify_report.STALE_ENGINE
    for chk in checks:
        if chk.name in by_name:
            chk.result = {**by_name[chk.name].result, "after_fallback": True}
        elif candidates.runs_graph(chk, graph) and chk.status != Status.SKIPPED:
            chk.result = {"status": Status.SKIPPED, "reason": stale, "after_fallback": True,
                          "tolerance": chk.result.get("tolerance")}


