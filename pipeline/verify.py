"""The verify stage: the precision gate.

Reference: the trained FP32 PyTorch model on the CPU. Candidates: every entry of
:data:`pipeline.runtime.backends.TABLE` with a candidate name (``backends.candidates()``; docs/verify.md lists them
with what each runs), each on the same real validation images, each in its own child process where its runtime is
native (:mod:`pipeline.runtime.isolate`).

A candidate passes when both checks of :func:`pipeline.precision.gate.judge` pass: the tensor check (by default
the scale-free one: each image's largest logit error over the reference's logit scale, held at
``error_quantile`` to ``max_scaled_error``; ``criterion: absolute`` keeps Polygraphy's atol AND rtol; NaN/Inf
always fails) and the task check (top-1 agreement and accuracy drop, each decided by a confidence bound: passed,
failed, or inconclusive). The verdict over the gating candidates and its exit code are
:func:`pipeline.core.verdicts.verdict` and :func:`~pipeline.core.verdicts.outcome`.

Three parts here: the evidence and the candidates (:mod:`pipeline.evaluation.candidates`), localisation and the
fallback for every lower-precision graph (:func:`_precision_gate`, :mod:`pipeline.precision.fallback`: FP16 nodes
moved to FP32, INT8 layers left unquantized), and the wording (:mod:`pipeline.reports.verify_report`). verify never
runs another stage: when the fallback replaces ``model.fp16.onnx`` or ``model.int8.onnx`` it says so in
``record.details["replaced_artifacts"]`` and the stage runner re-runs what depends on it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import numpy as np
import onnx

from pipeline.core import boxes, modeling, onnx_io, provenance, roles, verdicts
from pipeline.core.artifacts import FP32_ONNX, VERIFY_BOXES, WEIGHTS
from pipeline.core.check_results import CandidateResult, Localization
from pipeline.core.errors import BackendUnavailable, CheckFailed, Inconclusive, StageFailed
from pipeline.core.fallback_result import FallbackResult
from pipeline.core.images_record import ImageSetRecord, ImagesRecord, ValidationSplit, VerdictImages
from pipeline.core.records import Learning
from pipeline.core.run import RunDir, StageRecord, sha256_file
from pipeline.core.stability_record import StabilityCertificate
from pipeline.core.status import Status
from pipeline.core.verdicts import Outcome, Verdict
from pipeline.evaluation import batching, candidates, conformance, predictions
from pipeline.evaluation.candidates import Check, Evidence
from pipeline.precision import fallback, plugs
from pipeline.precision.plugs import Precision
from pipeline.reports import verify_report
from pipeline.runtime import backends
from pipeline.runtime.backends import Context

if TYPE_CHECKING:  # annotations only
    from pipeline.core.config_schema import Config
    from pipeline.core.model_card import CardSpec, ModelCard

log = logging.getLogger("pipeline")


# --------------------------------------------------------------------------- the stage


def _load_graphs(cfg: Config, run_dir: RunDir, spec: CardSpec, hashes: dict) -> tuple[onnx.ModelProto, dict]:
    """``model.onnx`` and every lower-precision graph present, each checked against the model card; ``hashes`` gets
    the sha256 of each file as it is read. A graph the config says export writes (``export.<precision>.enabled``)
    must be there: its candidates skipped for want of it would let the gate pass without checking it at all."""
    fp32_path = run_dir.require(FP32_ONNX, "export", "verify")
    hashes[FP32_ONNX] = sha256_file(fp32_path)
    fp32_model = onnx_io.load(fp32_path)
    onnx_io.check_matches_spec(fp32_model, fp32_path, spec)
    graphs = {}
    for plug in plugs.ORDER:
        path = run_dir.file(plug.graph)
        if plug.enabled(cfg) and not run_dir.export_skipped(plug.name):
            run_dir.require(plug.graph, "export", "verify")
        if path.exists():
            hashes[plug.graph] = sha256_file(path)
            graphs[plug.name] = onnx_io.load(path, f"{plug.label} ONNX model")
            onnx_io.check_matches_spec(graphs[plug.name], path, spec)
    # Engines and IR: loaded (through their sidecar checks) by their runners; hashed for benchmark's verdicts.
    for artifact in (b.artifact for b in backends.TABLE if b.runtime in ("TensorRT", backends.OV)):
        if run_dir.file(artifact).is_file():
            hashes[artifact] = verify_report.artifact_sha256(run_dir, artifact)
    return fp32_model, graphs


# Over 60 lines on purpose: verify's steps in the order they run (load, plan, judge, fallback, certificate,
# report), each a call; split, the order would be spread over helpers that only one caller has.
def run(cfg: Config, run_dir: RunDir, record: StageRecord, *, auto_fallback: bool = False) -> None:
    model, card = modeling.load_trained(cfg, run_dir, "verify")
    spec = card.spec
    hashes = {WEIGHTS: sha256_file(run_dir.file(WEIGHTS))}  # what each verdict is about (benchmark checks them)
    fp32_model, graphs = _load_graphs(cfg, run_dir, spec, hashes)
    provenance.check_graphs(hashes[WEIGHTS], {FP32_ONNX: fp32_model, **{plugs.by_name(name).graph: graph
                                                                          for name, graph in graphs.items()}})
    evidence = candidates.evidence(cfg, card, model)
    ctx = Context(cfg, run_dir, "verify", spec, model=model, under_test=graphs)
    checks = candidates.plan(cfg, ctx)
    nonfinite = _nonfinite(evidence)
    if nonfinite:
        _refuse_broken_reference(cfg, card, run_dir, record, checks, evidence, nonfinite, hashes)
    batch_feeds = batching.feeds_by_size(cfg, evidence.feeds)  # run by each candidate's runner after its main check
    rows = conformance.plan(cfg, evidence)  # and the conformance checks' arrangements
    for chk in checks:
        candidates.check(chk, cfg, ctx, evidence, batch_feeds, rows)
        verify_report.log_check(chk)
    broken = [c for c in checks if c.backend.checks_export and c.status == Status.FAILED]
    export_broken = bool(broken)
    for chk in broken:
        chk.result = chk.result.model_copy(update={"hint": verify_report.EXPORT_BROKEN_HINT})
        log.warning(verify_report.EXPORT_BROKEN_LOG)
    for chk in (c for c in checks if c.backend.no_fallback_hint and c.status == Status.FAILED):
        chk.result = chk.result.model_copy(update={"hint": chk.backend.no_fallback_hint})  # no fallback file helps
    gated = {} if export_broken else {
        plug.name: _precision_gate(plug, cfg, run_dir, card, ctx, fp32_model, evidence, checks, hashes,
                                   auto_fallback=auto_fallback)
        for plug in plugs.ORDER}
    batching.verify_batch_sizes(cfg, checks, evidence, candidates.gate_for)  # every batch size served
    verify_report.log_batch_sizes(checks)
    conformance.verify_conformance(cfg, checks, candidates.gate_for)  # row independence, precision manifest
    verify_report.log_conformance(checks)
    # A detector's boxes are not kept per image yet (baseline/compare judge classifiers): docs/detection.md.
    written = predictions.record(run_dir, checks, evidence) if getattr(evidence, "detection", None) is None else None
    if written is not None:
        record.artifact(written.name)
    if getattr(evidence, "detection", None) is not None:
        _draw_boxes(run_dir, record, card, checks, evidence)
    gated = verify_report.with_earlier_fallbacks(run_dir, hashes, gated)
    stability = _stability(cfg, run_dir, card, evidence, fp32_model, checks)
    verdict = candidates.verdict(checks, cfg.verify.inconclusive)
    held = candidates.held_out(run_dir, evidence, graphs)
    (log.info if held.held_out else log.warning)("verify: verdict images %s", held.line())
    payload = verify_report.build_payload(cfg, card, checks, gated, verdict, len(evidence.labels),
                                          cfg.verify.batch_size, hashes=hashes, images=held_out_section(evidence, held),
                                          stability=stability)
    for p in verify_report.write_all(run_dir, payload):
        record.artifact(p.name)
    record.details.update(_details(checks, verdict, evidence, gated))
    record.details["held_out"] = held.status
    quality = _reference_quality(run_dir, evidence)
    record.details.update(quality)
    failing_first = verdict.failed[0] if verdict.failed else None
    shown_loc = (gated.get(failing_first.backend.graph) or (None, None))[0] if failing_first is not None else None
    fixable = any(c.backend.graph and not c.result.hint for c in verdict.failed)
    _raise_for(verdict, shown_loc, export_broken, suggest_fallback=fixable and not auto_fallback)
    log.info("verify: passed (%s); deployable: %s; %s", ", ".join(f"{c.name} {c.status}" for c in checks),
             ", ".join(verdict.deployable) or "none",
             verify_report.reference_words(quality["reference_accuracy"], quality["reference_learned"],
                                           quality.get("reference_task")))


def _stability(cfg: Config, run_dir: RunDir, card: ModelCard, evidence: Evidence, fp32_model,
               checks: list[Check]) -> StabilityCertificate | None:
    """The calibration stability certificate of ``model.int8.onnx`` (``export.int8.stability.in_verify``), on the
    verdict images; where ``verify.int8.min_pass_share`` finds its pass a lucky draw, every passing gating candidate
    of the INT8 graph fails, saying why. None where it does not run."""
    plug = plugs.by_name("int8")
    if not cfg.export.int8.stability.in_verify or not run_dir.file(plug.graph).is_file():
        return None
    if fallback.qat_source(run_dir, plug) is not None:
        log.info("verify: calibration stability not certified: model.int8.onnx is QAT's graph (trained ranges)")
        return None
    from pipeline.evaluation import certificate

    raised = fallback.read(run_dir, plug, fp32_model)
    method = fallback.calibration_method(run_dir, plug) or cfg.export.int8.calibration_method
    gate = candidates.gate_for(cfg, plug.faithful, plug.name)
    result = certificate.certify(cfg, run_dir, card, plug, evidence, raised, method, gate,
                                 deployed_model=onnx_io.load(run_dir.file(plug.graph)))
    cert = result.certificate
    (log.info if cert.status == Status.CERTIFIED else log.warning)("verify: calibration stability: %s", cert.line)
    if cert.fails_gate:
        for chk in checks:
            if chk.gates and candidates.runs_graph(chk, plug) and chk.status == Status.PASSED:
                chk.result = chk.result.model_copy(update={
                    "status": Status.FAILED, "reason": f"calibration stability: {'; '.join(cert.reasons)}"})
    return result


def held_out_section(evidence: Evidence, held: roles.HeldOut) -> ImagesRecord:
    """verify.json's ``images``: the verdict images (split, indices, content hashes), the validation split's cut, and
    whether the verdict is held out from calibration and tune's search (:func:`pipeline.core.roles.held_out_status`)."""
    parts = evidence.parts
    return ImagesRecord(verdict=ImageSetRecord(**evidence.images.to_json()), held_out=VerdictImages(**held.to_json()),
                        validation_split=ValidationSplit(cut=parts.split, search_part=len(parts.search),
                                                         verdict_part=len(parts.verdict), reason=parts.reason))


def _reference_quality(run_dir: RunDir, evidence: Evidence) -> dict:
    """The reference's own accuracy on these images, and train's learning verdict (its manifest entry): the gate
    says the artifacts agree with the reference, not that the reference is any good."""
    train = run_dir.train_record()
    learning = (train.learning if train is not None else None) or Learning()
    if learning.learned is False:
        log.warning("verify: the reference did not learn (train: %s): passing this gate says the artifacts agree "
                    "with it, not that they are any good", learning.line)
    quality = {"reference_accuracy": _reference_score(evidence),
               "reference_learned": learning.learned, "reference_learning": learning.line}
    return {**quality, "reference_task": "detection"} if getattr(evidence, "detection", None) is not None else quality


def _draw_boxes(run_dir: RunDir, record: StageRecord, card: ModelCard, checks: list[Check], evidence: Evidence) -> None:
    """A detector's first validation images with the reference's boxes and a candidate's (report.html shows it)."""
    from pipeline.reports import detection_plot

    chk = detection_plot.chosen(checks)
    if chk is None or chk.name not in evidence.outputs:
        return
    name = evidence.detection["detections"]
    images = np.concatenate([f[next(iter(f))] for f in evidence.feeds])
    reference = np.concatenate([r[name] for r in evidence.reference])
    candidate = np.concatenate([o[name] for o in evidence.outputs[chk.name]])
    spec = card.spec
    detection_plot.draw(run_dir.file(VERIFY_BOXES), images, np.reshape(spec.mean, (1, 1, -1)),
                        np.reshape(spec.std, (1, 1, -1)), reference, candidate, chk.name, card.classes or [],
                        evidence.detection["rules"]["min_score"])
    record.artifact(VERIFY_BOXES)


def _reference_score(evidence: Evidence) -> float | None:
    """The reference's accuracy on the labels, or for a detector its mAP@0.5:0.95 on the ground-truth boxes."""
    if not len(evidence.labels):
        return None
    if getattr(evidence, "detection", None) is not None:
        dets = np.concatenate([r[evidence.detection["detections"]] for r in evidence.reference])
        return boxes.coco_map(list(dets), list(evidence.labels), evidence.detection["classes"])["map"]
    top1 = np.concatenate([r[evidence.output_name] for r in evidence.reference]).argmax(1)
    return float((top1 == evidence.labels).mean())


def _details(checks: list[Check], verdict: Verdict, evidence: Evidence, gated: dict) -> dict:
    """The manifest's summary of verify: what passed, what is deployable, what a fallback replaced."""
    fallbacks = {name: fb for name, (_, fb) in gated.items() if fb is not None}
    return {
        "passed": verdict.passed,
        "candidates": {c.name: c.status for c in checks},
        "deployable": verdict.deployable,
        "undecided": verdict.undecided,
        **verify_report.runtime_details(checks),
        "samples": len(evidence.labels),
        "fallbacks": {name: {"passed": fb.passed, "raised": fb.raised.to_json()} for name, fb in fallbacks.items()},
        # The stage runner re-runs the stages that produce and consume these (verify runs none itself).
        "replaced_artifacts": [a for fb in fallbacks.values() for a in fb.replaced],
    }


def _nonfinite(evidence: Evidence) -> int:
    """How many validation images the reference itself gives NaN/Inf logits for."""
    return int(sum((~np.isfinite(r[evidence.output_name].reshape(len(r[evidence.output_name]), -1))).any(axis=1).sum()
                   for r in evidence.reference))


def _refuse_broken_reference(cfg: Config, card, run_dir: RunDir, record: StageRecord, checks: list[Check],
                             evidence: Evidence, nonfinite: int, hashes: dict) -> None:
    """The trained model's own FP32 output is NaN/Inf: no candidate can be judged against it, and the
    fault is the training's, not the export's. The reports say so; the gate fails (exit 1)."""
    reason = verify_report.reference_nonfinite_reason(nonfinite, len(evidence.labels))
    for chk in checks:
        chk.result = CandidateResult(status=Status.SKIPPED, reason=reason,
                                     tolerance=candidates.gate_for(cfg, chk.name, chk.precision))
        verify_report.log_check(chk)
    payload = verify_report.build_payload(cfg, card, checks, {}, Verdict(passed=False), len(evidence.labels),
                                          cfg.verify.batch_size, hashes=hashes, reference_nonfinite=nonfinite)
    for p in verify_report.write_all(run_dir, payload):
        record.artifact(p.name)
    record.details.update({"passed": False, "candidates": {c.name: c.status for c in checks},
                           "samples": len(evidence.labels), "reference_nonfinite": nonfinite,
                           "fallbacks": {}, "replaced_artifacts": []})
    raise CheckFailed(verify_report.reference_nonfinite_message(nonfinite, len(evidence.labels)))


# The exception each outcome ends verify with: its class carries the exit code (pipeline.core.errors).
ENDINGS = {Outcome.MISSING_REQUIRED: BackendUnavailable, Outcome.FAILED: CheckFailed, Outcome.ERRORS: StageFailed,
           Outcome.INCONCLUSIVE: Inconclusive}


def _raise_for(verdict: Verdict, localization, export_broken: bool, suggest_fallback: bool) -> None:
    """The exception of the verdict's one outcome (:func:`pipeline.core.verdicts.outcome`), with its message."""
    ending = verdicts.outcome(verdict)
    if ending is Outcome.PASSED:
        return
    messages = {
        Outcome.MISSING_REQUIRED: lambda: verify_report.missing_required_message(verdict.missing_required),
        Outcome.FAILED: lambda: verify_report.failure_message(verdict, localization, export_broken, suggest_fallback),
        Outcome.ERRORS: lambda: verify_report.errors_message(verdict.errors),
        Outcome.INCONCLUSIVE: lambda: verify_report.inconclusive_message(verdict.inconclusive)}
    raise ENDINGS[ending](messages[ending]())


# --------------------------------------------------------------------------- localisation and fallback, every precision


def _precision_gate(plug: Precision, cfg: Config, run_dir: RunDir, card, ctx: Context, fp32_model, evidence: Evidence,
                    checks: list[Check], hashes: dict, *,
                    auto_fallback: bool) -> tuple[Localization | None, FallbackResult | None]:
    """A failing gating candidate of ``plug``'s graph: localise it, then (``--auto-fallback``) raise the precision of
    the offending nodes until the graph passes. Returns (localisation, fallback), each None when it did not run."""
    failing = [c for c in checks if c.gates and c.status == Status.FAILED and candidates.runs_graph(c, plug)]
    if not failing:
        return None, None
    if any(c.name == plug.faithful and c.status == Status.PASSED for c in checks):
        for chk in failing:  # the graph itself is sound: a runtime's kernels compute it differently
            chk.result = chk.result.model_copy(update={"hint": verify_report.kernels_hint(plug)})
        return None, None
    model = ctx.graph(plug.name)
    loc = candidates.localize_candidate(cfg, plug, fp32_model, model, evidence, failing[0], run_dir) \
        if cfg.verify.localize else None
    if not auto_fallback:
        return loc, None
    rounds: list[fallback.Round] = []

    def recheck(current) -> fallback.Round:
        rounds.append(candidates.recheck_round(plug, cfg, ctx, evidence, current))
        return rounds[-1]

    result = fallback.run(
        plug, cfg, run_dir, fp32_model, model, loc, recheck=recheck,
        remake=lambda raised, out_name: plug.write(cfg, run_dir, card, raised, out_name),
        localize=lambda current, chk: candidates.localize_candidate(cfg, plug, fp32_model, current, evidence, chk,
                                                                    None))
    if result.passed:
        _commit(plug, checks, rounds[-1].checks)
        hashes[plug.graph] = sha256_file(run_dir.file(plug.graph))
    return loc, verify_report.with_legacy_keys(plug, result)


def _commit(plug: Precision, checks: list[Check], rechecked: list[Check]) -> None:
    """The passing round's results replace the candidates' of the old file; what was made from the old file
    (an engine, an OpenVINO IR) is stale until build re-makes it."""
    by_name = {c.name: c for c in rechecked}
    for chk in checks:
        if chk.name in by_name:
            chk.result = by_name[chk.name].result.model_copy(update={"after_fallback": True})
        elif candidates.runs_graph(chk, plug) and chk.status != Status.SKIPPED:
            chk.result = CandidateResult(status=Status.SKIPPED, reason=verify_report.stale_artifact(plug),
                                         after_fallback=True, tolerance=chk.result.tolerance)
