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
import os
from dataclasses import dataclass, field

import numpy as np
import onnx

from pipeline import backends, data, export, fp16, int8, localize, modeling, onnx_io, provenance
from pipeline.artifacts import FALLBACK_CANDIDATE, INT8_ENGINE, INT8_FALLBACK, INT8_FALLBACK_CANDIDATE, INT8_ONNX, WEIGHTS
from pipeline import verify_report as report
from pipeline.backends import Backend, Context
from pipeline.errors import BackendUnavailable, CheckFailed, InputError, StageFailed, disk_full
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
        checks.append(Check(backend, backends.label(backend, cfg), backend.required(cfg), reason))
    return checks


# --------------------------------------------------------------------------- numerics


def compare(outputs: list[dict], reference: list[dict], labels: np.ndarray, gate: dict, output_name: str) -> dict:
    """Tensor check (Polygraphy SimpleCompareFunc per batch) and task check (top-1 agreement, accuracy)."""
    from polygraphy.comparator import Comparator, RunResults, SimpleCompareFunc

    results = RunResults()
    results.add(outputs, runner_name="candidate")
    results.add(reference, runner_name=REFERENCE)
    func = SimpleCompareFunc(atol=gate["atol"], rtol=gate["rtol"], check_error_stat=gate["check_error_stat"],
                             error_quantile=gate["error_quantile"], infinities_compare_equal=False)
    with np.errstate(all="ignore"):  # non-finite candidates are expected here, and fail below
        accuracy = Comparator.compare_accuracy(results, compare_func=func, comparisons=[(0, 1)])
    per_batch = list(accuracy[0].values())[0]
    failed_batches = [i for i, outs in enumerate(per_batch) if not all(bool(v) for v in outs.values())]

    cand = np.concatenate([o[output_name] for o in outputs]).astype(np.float64)
    ref = np.concatenate([r[output_name] for r in reference]).astype(np.float64)
    # The statistics over all batches, at the tolerance Polygraphy applied to this output.
    atol = localize.output_tolerance(gate["atol"], output_name, localize.DEFAULT_ATOL)
    rtol = localize.output_tolerance(gate["rtol"], output_name, localize.DEFAULT_RTOL)
    stats = localize.tensor_errors(ref, cand, atol, rtol, quantile=gate["error_quantile"])
    tensor = {"passed": not failed_batches and stats["nonfinite"] == 0, "statistic": gate["check_error_stat"]}
    for key in (f"{stat}_{kind}_error" for kind in ("abs", "rel") for stat in ("max", "mean", "median", "quantile")):
        tensor[key] = stats[key]
    tensor.update({"mismatch_fraction": stats["mismatch_fraction"], "nonfinite": stats["nonfinite"],
                   "batches": len(per_batch), "failed_batches": failed_batches})
    task = task_check(ref, cand, labels, gate)
    return {"tensor_check": tensor, "task_check": task, "passed": tensor["passed"] and task["passed"]}


def task_check(ref: np.ndarray, cand: np.ndarray, labels: np.ndarray, gate: dict) -> dict:
    """Top-1 agreement with the reference and accuracy against the labels (NaN never wins a class)."""
    ref_top1, cand_top1 = ref.argmax(1), np.nan_to_num(cand, nan=-np.inf).argmax(1)
    agreement = float((ref_top1 == cand_top1).mean())
    ref_acc, cand_acc = float((ref_top1 == labels).mean()), float((cand_top1 == labels).mean())
    task = {"top1_agreement": agreement, "reference_accuracy": ref_acc, "accuracy": cand_acc,
            "accuracy_drop": ref_acc - cand_acc, "disagreements": int((ref_top1 != cand_top1).sum())}
    task["passed"] = agreement >= gate["min_top1_agreement"] and task["accuracy_drop"] <= gate["max_accuracy_drop"]
    return task


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
    result = compare(outputs, evidence.reference, evidence.labels, gate, evidence.output_name)
    result["status"] = "passed" if result["passed"] else "failed"
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


def _verdict(checks: list[Check]) -> dict:
    ran = [c for c in checks if c.status in ("passed", "failed")]
    failed = [c for c in checks if c.status == "failed"]
    errors = [c for c in checks if c.status in ("error", "crashed")]  # nothing compared: no verdict on them
    missing = [c for c in checks if c.required and c.status == "skipped" and not c.result.get("after_fallback")]
    return {"passed": not failed and not errors and not missing, "ran": len(ran), "failed": failed,
            "errors": errors, "missing_required": missing}


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
    images, labels = data.labelled_validation_batch(cfg, card, cfg.verify.samples)
    bs = cfg.verify.batch_size
    feeds = [{spec["input_name"]: images[i : i + bs]} for i in range(0, len(images), bs)]
    log.info("verify: %d validation images in %d batches; reference %s", len(images), len(feeds), REFERENCE)
    ref_runner = TorchRunner(model, name=REFERENCE, input_name=spec["input_name"], output_name=spec["output_name"],
                             input_shape=tuple(spec["input_size"]))
    return Evidence(feeds, collect(ref_runner, feeds), labels, spec["output_name"])


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
    failing_fp16 = [c for c in checks if c.backend.uses_fp16_model and c.status == "failed"]
    localization = fallback = None
    if export_broken:
        next(c for c in checks if c.name == "onnxrt_fp32").result["hint"] = report.EXPORT_BROKEN_HINT
        log.warning(report.EXPORT_BROKEN_LOG)
    elif failing_fp16 and cfg.verify.localize:
        localization = _localize(cfg, fp32_model, fp16_model, run_dir.file(export.FP16_ONNX), evidence,
                                 failing_fp16[0], spec)
    if failing_fp16 and auto_fallback and not export_broken:
        fallback = auto_fallback_loop(cfg, run_dir, card, ctx, fp32_model, evidence, checks, localization)
    for chk in (c for c in checks if c.name == "openvino_bf16" and c.status == "failed"):
        chk.result["hint"] = report.OPENVINO_BF16_NO_FALLBACK  # the FP32 fallback cannot reach an OpenVINO kernel
    if fallback and fallback["passed"]:  # the rechecked FP16 candidates judged the replacement
        hashes[export.FP16_ONNX] = sha256_file(run_dir.file(export.FP16_ONNX))
    int8_loc, int8_fb = _int8_gate(cfg, run_dir, card, ctx, fp32_model, evidence, checks, hashes,
                                   auto_fallback=auto_fallback and not export_broken, export_broken=export_broken)
    fallback, int8_fb = report.with_earlier_fallbacks(run_dir, hashes, fallback, int8_fb)
    verdict = _verdict(checks)
    payload = report.build_payload(cfg, card, checks, localization, fallback, verdict, len(evidence.labels),
                                   cfg.verify.batch_size, hashes=hashes, int8_localization=int8_loc,
                                   int8_fallback=int8_fb)
    for p in report.write_all(run_dir, payload):
        record.artifact(p.name)
    record.details.update({
        "passed": verdict["passed"],
        "candidates": {c.name: c.status for c in checks},
        **report.runtime_details(checks),
        "samples": len(evidence.labels),
        "fallback": None if fallback is None else {k: fallback[k] for k in ("passed", "moved_to_fp32")},
        "int8_fallback": None if int8_fb is None else {k: int8_fb[k] for k in ("passed", "excluded_from_int8",
                                                                                 "int8_fraction_after")},
        # The stage runner re-runs the stages that produce and consume these (verify runs none itself).
        "replaced_artifacts": (fallback["replaced"] if fallback else []) + (int8_fb["replaced"] if int8_fb else []),
    })
    failing_first = verdict["failed"][0] if verdict["failed"] else None
    shown_loc = int8_loc if failing_first is not None and failing_first.backend.uses_int8_model else localization
    fixable = any((c.backend.uses_fp16_model or c.backend.uses_int8_model) and not c.result.get("hint")
                  for c in verdict["failed"])
    _raise_for(verdict, shown_loc, export_broken, suggest_fallback=fixable and not auto_fallback)
    log.info("verify: passed (%s)", ", ".join(f"{c.name} {c.status}" for c in checks))


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


def _worst_batch(chk: Check, feeds) -> dict:
    failed = chk.result.get("tensor_check", {}).get("failed_batches") or [0]
    return feeds[failed[0]]


def _localize(cfg, fp32_model, fp16_model, fp16_path, evidence: Evidence, chk: Check, spec) -> dict:
    gate = chk.result["tolerance"]
    atol = localize.scalar_tolerance(gate["atol"], 0.0)
    rtol = localize.scalar_tolerance(gate["rtol"], 0.0)
    feed = _worst_batch(chk, evidence.feeds)
    result = None
    if chk.artifact == backends.ENGINE:
        from pipeline import build

        try:
            shapes = build.profile_shapes(cfg, spec["input_size"])
            cache = build.timing_cache_path(cfg, RunDir(fp16_path.parent, create=False))
            result = localize.localize_tensorrt(fp32_model, fp16_path, feed, atol, rtol, cfg.verify.localize_top,
                                                spec["input_name"], shapes, build_cfg=cfg.build, timing_cache=cache)
        except Exception as exc:  # fall back to the emulation, and say so
            log.warning(report.TENSORRT_LOCALIZE_FAILED, exc)
    if result is None:
        result = localize.localize_emulation(fp32_model, fp16_model, feed, atol, rtol, cfg.verify.localize_top)
    result["candidate"] = chk.name
    report.log_localization(result)
    return result


# --------------------------------------------------------------------------- automatic FP32 fallback


def auto_fallback_loop(cfg, run_dir: RunDir, card, ctx: Context, fp32_model, evidence: Evidence,
                       checks: list[Check], localization) -> dict:
    """Move the first divergent node (or its FP16 inputs) to FP32, reconvert, re-verify; repeat.

    Only the candidates that run ``model.fp16.onnx`` itself are re-checked each round (an engine
    would need a rebuild, which is the build stage's job). A passing model replaces
    ``model.fp16.onnx``; the engine-based candidates' results then describe a stale engine and
    are marked so, for the re-run the stage runner makes after build.
    """
    moved = list(export.read_fallback(run_dir))
    before = fp16.node_precisions(fp32_model, ctx.fp16_model)
    candidate_path = run_dir.file(FALLBACK_CANDIDATE)
    iterations, current, loc, passed = [], ctx.fp16_model, localization, False
    try:
        for i in range(cfg.verify.fallback_iterations):
            first = (loc or {}).get("first_divergent")
            new = localize.nodes_to_move(first["name"], fp32_model, current, set(moved)) if first else []
            if not new:
                iterations.append({"iteration": i + 1, "moved": [], "note": report.nothing_to_move(first)})
                break
            moved += new
            report_fp16 = export.convert_fp16(cfg, run_dir, card, moved, out_name=FALLBACK_CANDIDATE)
            current = onnx.load(str(candidate_path))
            rechecked = _recheck(cfg, dataclasses.replace(ctx, fp16=current), evidence)
            passed = all(c.status in ("passed", "skipped") for c in rechecked)
            iterations.append({"iteration": i + 1, "moved": new, "divergent_node": first["name"],
                               "fp16_fraction": report_fp16["fp16_fraction"], "passed": passed,
                               "results": {c.name: c.status for c in rechecked}})
            report.log_fallback_round(i + 1, new, report_fp16["fp16_fraction"], passed)
            if passed:
                _commit(run_dir, candidate_path, moved, checks, rechecked)
                break
            failing = [c for c in rechecked if c.status == "failed"]
            if not failing:  # only errors: nothing left to localise
                iterations[-1]["note"] = report.fallback_errors(rechecked)
                break
            loc = _localize_round(cfg, fp32_model, current, evidence, failing[0])
    finally:
        candidate_path.unlink(missing_ok=True)
    after = fp16.node_precisions(fp32_model, onnx_io.load(run_dir.file(export.FP16_ONNX))) if passed else before
    return {
        "passed": passed,
        "moved_to_fp32": moved,
        "iterations": iterations,
        "fp16_fraction_before": _fp16_fraction(before),
        "fp16_fraction_after": _fp16_fraction(after),
        "budget": cfg.verify.fallback_iterations,
        "replaced": [export.FP16_ONNX] if passed else [],
    }


def _fp16_fraction(precisions: dict) -> float:
    return sum(1 for _, p in precisions.values() if p == "fp16") / max(1, len(precisions))


def _recheck(cfg, ctx: Context, evidence: Evidence, artifact: str = backends.FP16_ONNX) -> list[Check]:
    """The candidates that run ``artifact`` (an ONNX model) itself, on the fallback's candidate model."""
    rechecked = plan(cfg, ctx, [b for b in backends.candidates() if b.artifact == artifact])
    for chk in rechecked:
        check(chk, cfg, ctx, evidence)
    return rechecked


def _localize_round(cfg, fp32_model, current, evidence: Evidence, chk: Check) -> dict:
    gate = chk.result["tolerance"]
    return localize.localize_emulation(fp32_model, current, _worst_batch(chk, evidence.feeds),
                                       localize.scalar_tolerance(gate["atol"], 0.0),
                                       localize.scalar_tolerance(gate["rtol"], 0.0), cfg.verify.localize_top)


def _commit(run_dir: RunDir, candidate_path, moved: list[str], checks: list[Check], rechecked: list[Check]) -> None:
    """Replace model.fp16.onnx by the passing version, remember the moved nodes, update the results."""
    os.replace(candidate_path, run_dir.file(export.FP16_ONNX))
    export.write_fallback(run_dir, moved)
    by_name = {c.name: c for c in rechecked}
    for chk in checks:
        if chk.name in by_name:
            chk.result = {**by_name[chk.name].result, "after_fallback": True}
        elif chk.artifact == backends.ENGINE and chk.status != "skipped":
            chk.result = {"status": "skipped", "reason": report.STALE_ENGINE, "after_fallback": True,
                          "tolerance": chk.result.get("tolerance")}


# --------------------------------------------------------------------------- INT8: localisation and fallback


def _int8_gate(cfg, run_dir: RunDir, card, ctx: Context, fp32_model, evidence: Evidence, checks: list[Check],
               hashes: dict, *, auto_fallback: bool, export_broken: bool) -> tuple[dict | None, dict | None]:
    """A failing INT8 candidate: localise on the Q/DQ graph, then (``--auto-fallback``) re-quantize without the
    offending layers. Returns (localisation, fallback), each None when it did not run."""
    failing = [c for c in checks if c.backend.uses_int8_model and c.status == "failed"]
    if not failing or export_broken:
        return None, None
    if any(c.name == "int8_exact" and c.status == "passed" for c in checks):  # the Q/DQ graph itself is sound
        for chk in failing:
            chk.result["hint"] = report.INT8_KERNELS_HINT
        return None, None
    loc = _localize_int8(cfg, fp32_model, ctx.int8_model, evidence, failing[0]) if cfg.verify.localize else None
    if not auto_fallback:
        return loc, None
    fb = int8_fallback_loop(cfg, run_dir, card, ctx, fp32_model, evidence, checks, loc)
    if fb["passed"]:
        hashes[INT8_ONNX] = sha256_file(run_dir.file(INT8_ONNX))
    return loc, fb


def _localize_int8(cfg, fp32_model, int8_model, evidence: Evidence, chk: Check) -> dict:
    gate = chk.result["tolerance"]
    result = int8.localize(fp32_model, int8_model, _worst_batch(chk, evidence.feeds),
                           localize.scalar_tolerance(gate["atol"], 0.0), localize.scalar_tolerance(gate["rtol"], 0.0),
                           cfg.verify.localize_top)
    result["candidate"] = chk.name
    report.log_localization(result)
    return result


def int8_fallback_loop(cfg, run_dir: RunDir, card, ctx: Context, fp32_model, evidence: Evidence,
                       checks: list[Check], localization) -> dict:
    """Leave the first divergent quantized layer (or the nearest quantized ones upstream) unquantized,
    re-quantize, re-check the candidates that run ``model.int8.onnx``; repeat. A passing model replaces
    ``model.int8.onnx`` and the excluded nodes go to ``int8_fallback.json`` (re-exports keep them)."""
    moved = list(export.read_fallback(run_dir, INT8_FALLBACK))
    before = int8.int8_fraction(int8.node_precisions(fp32_model, ctx.int8_model))
    candidate_path = run_dir.file(INT8_FALLBACK_CANDIDATE)
    iterations, current, loc, passed = [], ctx.int8_model, localization, False
    try:
        for i in range(cfg.verify.fallback_iterations):
            first = (loc or {}).get("first_divergent")
            new = int8.nodes_to_exclude(first["name"], fp32_model, current, set(moved)) if first else []
            if not new:
                iterations.append({"iteration": i + 1, "moved": [], "note": report.nothing_to_move(first)})
                break
            moved += new
            quantized = export.quantize_int8(cfg, run_dir, card, moved, out_name=INT8_FALLBACK_CANDIDATE)
            current = onnx.load(str(candidate_path))
            rechecked = _recheck(cfg, dataclasses.replace(ctx, int8=current), evidence, INT8_ONNX)
            passed = all(c.status in ("passed", "skipped") for c in rechecked) and \
                any(c.status == "passed" for c in rechecked)  # something judged the replacement
            iterations.append({"iteration": i + 1, "moved": new, "divergent_node": first["name"],
                               "int8_fraction": quantized["int8_fraction"], "passed": passed,
                               "results": {c.name: c.status for c in rechecked}})
            report.log_int8_fallback_round(i + 1, new, quantized["int8_fraction"], passed)
            if passed:
                _commit_int8(run_dir, candidate_path, moved, checks, rechecked)
                break
            failing = [c for c in rechecked if c.status == "failed"]
            if not failing:
                iterations[-1]["note"] = report.fallback_errors(rechecked)
                break
            loc = _localize_int8(cfg, fp32_model, current, evidence, failing[0])
    finally:
        candidate_path.unlink(missing_ok=True)
    after = int8.int8_fraction(int8.node_precisions(fp32_model, current)) if passed else before
    return {"passed": passed, "excluded_from_int8": moved, "iterations": iterations,
            "int8_fraction_before": before, "int8_fraction_after": after, "budget": cfg.verify.fallback_iterations,
            "replaced": [INT8_ONNX] if passed else []}


def _commit_int8(run_dir: RunDir, candidate_path, moved: list[str], checks: list[Check],
                 rechecked: list[Check]) -> None:
    """Replace model.int8.onnx by the passing version, remember the excluded nodes, update the results."""
    os.replace(candidate_path, run_dir.file(INT8_ONNX))
    export.write_fallback(run_dir, moved, INT8_FALLBACK)
    by_name = {c.name: c for c in rechecked}
    for chk in checks:
        if chk.name in by_name:
            chk.result = {**by_name[chk.name].result, "after_fallback": True}
        elif chk.backend.uses_int8_model and chk.status != "skipped":  # the engine or IR of the old file
            chk.result = {"status": "skipped", "reason": report.STALE_INT8_ENGINE, "after_fallback": True,
                          "tolerance": chk.result.get("tolerance")}
