"""The verify stage: the precision gate.

Reference: the trained FP32 PyTorch model on the CPU. Candidates, each on the same real
validation images:

=================  =========  ==============================================================
candidate          precision  what runs
=================  =========  ==============================================================
onnxrt_fp32        fp32       ONNX Runtime (CPU) on ``model.onnx``
fp16_emulation     fp16       ``model.fp16.onnx`` with every FP16 tensor rounded (see fp16.py)
onnxrt_fp16_cpu    fp16       ONNX Runtime CPU on ``model.fp16.onnx``: a CPU deployment; it
                              computes FP16 regions in FP32, so it is no evidence for TensorRT
tensorrt_fp16      fp16       the TensorRT engine (GPU + TensorRT only)
onnxrt_cuda_fp16   fp16       ONNX Runtime's CUDA provider on ``model.fp16.onnx`` (GPU only)
=================  =========  ==============================================================

A candidate passes when both checks pass: the tensor check (Polygraphy's ``SimpleCompareFunc``
on every batch: with ``elemwise`` an element fails only if it exceeds atol AND rtol, relative
error taken against the reference; NaN/Inf in the candidate always fails) and the task check
(top-1 agreement with the reference and accuracy against the labels).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import onnx

from pipeline import build, env, export, fp16, localize, modeling, onnx_io
from pipeline import verify_report as report
from pipeline.errors import BackendUnavailable, CheckFailed, InputError, StageFailed
from pipeline.run import RunDir, StageRecord, now, sha256_file
from pipeline.runners import TorchRunner, collect, onnxrt_runner, ort_session_uses

log = logging.getLogger("pipeline")

REFERENCE = "torch_fp32"
FALLBACK_CANDIDATE = "model.fp16.fallback.onnx"


@dataclass
class Candidate:
    name: str
    precision: str
    label: str
    artifact: str | None
    make: Callable | None = None
    reason: str = ""
    required: bool = False
    uses_fp16_model: bool = False
    result: dict = field(default_factory=dict)


def gate_for(cfg, name: str, precision: str) -> dict:
    """The thresholds of one candidate: its own non-null keys over the precision's defaults."""
    base = (cfg.verify.fp16 if precision == "fp16" else cfg.verify.fp32).model_dump()
    own = getattr(cfg.verify.candidates, name).model_dump()
    return {key: own[key] if own.get(key) is not None else value for key, value in base.items()}


# --------------------------------------------------------------------------- candidates


def plan_candidates(cfg, run_dir: RunDir, card: dict, fp16_path: Path | None, fp16_model: onnx.ModelProto | None,
                    *, only_fp16: bool = False) -> list[Candidate]:
    vc = cfg.verify.candidates
    cands: list[Candidate] = []
    if not only_fp16:
        path = run_dir.file(export.FP32_ONNX)
        cands.append(Candidate("onnxrt_fp32", "fp32", "ONNX Runtime CPU, model.onnx", export.FP32_ONNX,
                               make=lambda: onnxrt_runner(path, name="onnxrt_fp32")))

    no_fp16 = "no model.fp16.onnx (export.fp16.enabled is false)"
    emulation = cfg.verify.emulation
    cands.append(Candidate(
        "fp16_emulation", "fp16",
        f"FP16 emulation ({emulation}: " + ("every FP16 tensor rounded, FP32 accumulation" if emulation == "fast"
                                            else "NumPy float16 reference evaluator") + "), model.fp16.onnx",
        export.FP16_ONNX, make=(lambda: fp16.candidate_runner(fp16_model, emulation, "fp16_emulation"))
        if fp16_model is not None else None, reason="" if fp16_model is not None else no_fp16,
        uses_fp16_model=True))
    cands.append(Candidate(
        "onnxrt_fp16_cpu", "fp16",
        "ONNX Runtime CPU on model.fp16.onnx (a CPU deployment; computes FP16 regions in FP32)",
        export.FP16_ONNX, make=(lambda: onnxrt_runner(fp16_model.SerializeToString(), name="onnxrt_fp16_cpu"))
        if fp16_model is not None else None, reason="" if fp16_model is not None else no_fp16,
        uses_fp16_model=True))
    cands.append(_tensorrt_candidate(cfg, run_dir, fp16_path))
    cands.append(_ort_cuda_candidate(cfg, fp16_model, no_fp16))
    for cand in cands:
        if not getattr(vc, cand.name).enabled and cand.make is not None:
            cand.make, cand.reason = None, f"disabled (verify.candidates.{cand.name}.enabled=false)"
    return cands


def _tensorrt_candidate(cfg, run_dir: RunDir, fp16_path: Path | None) -> Candidate:
    cand = Candidate("tensorrt_fp16", "fp16", "TensorRT engine (strongly typed from model.fp16.onnx)", build.ENGINE,
                     required="tensorrt" in cfg.require, uses_fp16_model=True)
    ok, reason = build.availability()
    if not ok:
        cand.reason = reason
        return cand
    if not run_dir.file(build.ENGINE).exists():
        cand.reason = f"no {build.ENGINE}: run `python -m pipeline build --run-dir {run_dir.path}`"
        return cand
    engine_bytes, sidecar = build.load_engine_bytes(run_dir)
    if fp16_path is not None and fp16_path.exists() and sidecar.get("onnx_sha256") != sha256_file(fp16_path):
        raise InputError(f"{build.ENGINE} was built from another {sidecar.get('onnx')}; re-run build")
    cand.make = lambda: _trt_runner(engine_bytes)
    return cand


def _trt_runner(engine_bytes: bytes):
    from polygraphy.backend.trt import EngineFromBytes, TrtRunner

    return TrtRunner(EngineFromBytes(engine_bytes), name="tensorrt_fp16")


def _ort_cuda_candidate(cfg, fp16_model, no_fp16: str) -> Candidate:
    cand = Candidate("onnxrt_cuda_fp16", "fp16", "ONNX Runtime CUDA provider on model.fp16.onnx", export.FP16_ONNX,
                     required="cuda" in cfg.require, uses_fp16_model=True)
    if fp16_model is None:
        cand.reason = no_fp16
        return cand
    cuda_ok, reason = env.cuda_status()
    import onnxruntime

    if not cuda_ok:
        cand.reason = reason
    elif "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
        cand.reason = "this ONNX Runtime build has no CUDA provider (install onnxruntime-gpu)"
    else:
        cand.make = lambda: _CheckedCudaRunner(onnxrt_runner(fp16_model.SerializeToString(), name="onnxrt_cuda_fp16",
                                                             providers=["cuda"]))
    return cand


class _CheckedCudaRunner:
    """ONNX Runtime silently falls back to the CPU when the CUDA provider cannot load: refuse that."""

    def __init__(self, runner):
        self.runner = runner
        self.name = runner.name

    def __enter__(self):
        self.runner.__enter__()
        if not ort_session_uses(self.runner, "CUDAExecutionProvider"):
            self.runner.__exit__(None, None, None)
            raise RuntimeError("ONNX Runtime fell back to the CPU: the CUDA provider failed to load")
        return self

    def __exit__(self, *exc):
        return self.runner.__exit__(*exc)

    def infer(self, feed):
        return self.runner.infer(feed)


# --------------------------------------------------------------------------- checks


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
    nonfinite = int((~np.isfinite(cand)).sum())
    stats = localize.tensor_errors(ref, cand, localize.scalar_tolerance(gate["atol"], 0.0),
                                   localize.scalar_tolerance(gate["rtol"], 0.0))
    with np.errstate(all="ignore"):
        absdiff = np.abs(cand - ref)
        rel = absdiff / np.where(np.abs(ref) == 0, localize.EPS, np.abs(ref))
    q = gate["error_quantile"]
    tensor = {
        "passed": not failed_batches and nonfinite == 0,
        "statistic": gate["check_error_stat"],
        "max_abs_error": stats["max_abs_error"],
        "mean_abs_error": _stat(np.nanmean, absdiff),
        "median_abs_error": _stat(np.nanmedian, absdiff),
        "quantile_abs_error": _stat(np.nanquantile, absdiff, q),
        "max_rel_error": stats["max_rel_error"],
        "mean_rel_error": _stat(np.nanmean, rel),
        "median_rel_error": _stat(np.nanmedian, rel),
        "quantile_rel_error": _stat(np.nanquantile, rel, q),
        "mismatch_fraction": stats["mismatch_fraction"],
        "nonfinite": nonfinite,
        "batches": len(per_batch),
        "failed_batches": failed_batches,
    }
    ref_top1, cand_top1 = ref.argmax(1), np.nan_to_num(cand, nan=-np.inf).argmax(1)
    agreement = float((ref_top1 == cand_top1).mean())
    ref_acc, cand_acc = float((ref_top1 == labels).mean()), float((cand_top1 == labels).mean())
    task = {
        "top1_agreement": agreement,
        "reference_accuracy": ref_acc,
        "accuracy": cand_acc,
        "accuracy_drop": ref_acc - cand_acc,
        "disagreements": int((ref_top1 != cand_top1).sum()),
    }
    task["passed"] = agreement >= gate["min_top1_agreement"] and task["accuracy_drop"] <= gate["max_accuracy_drop"]
    return {"tensor_check": tensor, "task_check": task, "passed": tensor["passed"] and task["passed"]}


def _stat(fn, values: np.ndarray, *args) -> float:
    """A NaN-ignoring statistic of the finite errors; NaN when there are none (all outputs non-finite)."""
    finite = values[np.isfinite(values)]
    return float(fn(finite, *args)) if finite.size else float("nan")


def check_candidate(cand: Candidate, feeds, reference, labels, gate: dict, output_name: str) -> dict:
    if cand.make is None:
        return {"status": "skipped", "reason": cand.reason}
    try:
        outputs = collect(cand.make(), feeds)
    except InputError:
        raise
    except Exception as exc:
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return {"status": "error", "reason": f"{type(exc).__name__}: {text}"}
    if output_name not in outputs[0]:
        return {"status": "error", "reason": f"candidate produced {list(outputs[0])}, not {output_name!r}"}
    result = compare(outputs, reference, labels, gate, output_name)
    result["status"] = "passed" if result["passed"] else "failed"
    return result


def _describe_failure(result: dict, gate: dict) -> str:
    """The failing criteria only, with their numbers and thresholds."""
    t, k = result.get("tensor_check", {}), result.get("task_check", {})
    parts = []
    if t and not t["passed"]:
        parts.append(f"max abs error {t['max_abs_error']:.4g}, max rel error {t['max_rel_error']:.4g} "
                     f"(atol {gate['atol']}, rtol {gate['rtol']}, {t['statistic']}) in "
                     f"{len(t['failed_batches'])}/{t['batches']} batches"
                     + (f", {t['nonfinite']} non-finite values" if t["nonfinite"] else ""))
    if k and k["top1_agreement"] < gate["min_top1_agreement"]:
        parts.append(f"top-1 agreement {100 * k['top1_agreement']:.2f}% (min {100 * gate['min_top1_agreement']:.2f}%)")
    if k and k["accuracy_drop"] > gate["max_accuracy_drop"]:
        parts.append(f"accuracy drop {100 * k['accuracy_drop']:.2f} points (max {100 * gate['max_accuracy_drop']:.2f})")
    return ", ".join(parts) or result.get("reason", "")


def _failure_message(verdict: dict, localization, export_broken: bool, suggest_fallback: bool) -> str:
    failed = verdict["failed"]
    first = failed[0]
    text = (f"{len(failed)} of {verdict['ran']} candidates failed ({', '.join(c.name for c in failed)}); "
            f"{first.name}: {_describe_failure(first.result, first.result['tolerance'])}")
    if export_broken:
        text += ("; the FP32 export itself disagrees with PyTorch, so every ONNX candidate inherits the error: "
                 "check the exporter warnings in manifest.json (data-dependent control flow?) or try "
                 "export.exporter=dynamo")
    elif localization and localization.get("first_divergent"):
        node = localization["first_divergent"]
        text += f"; first node over tolerance: {node['name']} ({node['op_type']})"
    if suggest_fallback and not export_broken:
        text += "; `verify --auto-fallback` can move the offending nodes to FP32"
    return text + "; details in verify.md"


# --------------------------------------------------------------------------- the stage


def run(cfg, run_dir: RunDir, record: StageRecord, *, auto_fallback: bool = False) -> None:
    model, card = modeling.load_trained(cfg, run_dir, "verify")
    spec = card["spec"]
    fp32_path = run_dir.require(export.FP32_ONNX, "export", "verify")
    fp32_model = onnx_io.load(fp32_path)
    onnx_io.check_matches_spec(fp32_model, fp32_path, spec)
    fp16_path = run_dir.file(export.FP16_ONNX)
    fp16_model = None
    if fp16_path.exists():
        fp16_model = onnx_io.load(fp16_path, "FP16 ONNX model")
        onnx_io.check_matches_spec(fp16_model, fp16_path, spec)

    images, labels = export.validation_batch(cfg, card, cfg.verify.samples)
    bs = cfg.verify.batch_size
    feeds = [{spec["input_name"]: images[i : i + bs]} for i in range(0, len(images), bs)]
    log.info("verify: %d validation images in %d batches; reference %s", len(images), len(feeds), REFERENCE)
    ref_runner = TorchRunner(model, name=REFERENCE, input_name=spec["input_name"], output_name=spec["output_name"],
                             input_shape=tuple(spec["input_size"]))
    reference = collect(ref_runner, feeds)

    candidates = plan_candidates(cfg, run_dir, card, fp16_path if fp16_model is not None else None, fp16_model)
    for cand in candidates:
        gate = gate_for(cfg, cand.name, cand.precision)
        cand.result = check_candidate(cand, feeds, reference, labels, gate, spec["output_name"])
        cand.result["tolerance"] = gate
        _log_candidate(cand)

    export_broken = any(c.name == "onnxrt_fp32" and c.result["status"] == "failed" for c in candidates)
    failing_fp16 = [c for c in candidates if c.uses_fp16_model and c.result["status"] == "failed"]
    localization = fallback = None
    if export_broken:
        next(c for c in candidates if c.name == "onnxrt_fp32").result["hint"] = (
            "the FP32 export disagrees with PyTorch: look for data-dependent control flow (exporter warnings in "
            "manifest.json) or try export.exporter=dynamo")
        log.warning("verify: the FP32 export disagrees with PyTorch; FP16 localisation and fallback are skipped "
                    "(they compare against the FP32 ONNX graph, which is already wrong)")
    elif failing_fp16 and cfg.verify.localize:
        localization = _localize(cfg, run_dir, fp32_model, fp16_model, fp16_path, feeds, failing_fp16, spec)
    if failing_fp16 and auto_fallback and not export_broken:
        fallback = _auto_fallback(cfg, run_dir, card, fp32_model, fp16_model, feeds, reference, labels, candidates,
                                  localization)

    verdict = _verdict(candidates)
    payload = report.build_payload(cfg, card, candidates, localization, fallback, verdict, len(images), bs)
    paths = report.write_all(run_dir, payload)
    for p in paths:
        record.artifact(p.name)
    record.details.update({
        "passed": verdict["passed"],
        "candidates": {c.name: c.result["status"] for c in candidates},
        "samples": len(images),
        "fallback": None if fallback is None else {k: fallback[k] for k in ("passed", "moved_to_fp32")},
    })
    if fallback and fallback["passed"]:
        from pipeline import stages

        # The FP16 model changed: recompute this stage's fingerprint so an unchanged re-run skips verify.
        record.entry["fingerprint"] = stages.fingerprint(stages.STAGES["verify"], cfg, run_dir)
    if verdict["missing_required"]:
        raise BackendUnavailable("required candidate(s) could not run: " + "; ".join(
            f"{c.name}: {c.result['reason']}" for c in verdict["missing_required"]))
    if verdict["failed"]:
        raise CheckFailed(_failure_message(verdict, localization, export_broken,
                                           suggest_fallback=bool(failing_fp16) and not auto_fallback))
    if verdict["errors"]:
        raise StageFailed("candidate(s) failed to run: " + "; ".join(
            f"{c.name}: {c.result['reason']}" for c in verdict["errors"]))
    log.info("verify: passed (%s)", ", ".join(f"{c.name} {c.result['status']}" for c in candidates))


def _verdict(candidates: list[Candidate]) -> dict:
    ran = [c for c in candidates if c.result["status"] in ("passed", "failed")]
    failed = [c for c in candidates if c.result["status"] == "failed"]
    errors = [c for c in candidates if c.result["status"] == "error"]
    missing = [c for c in candidates if c.required and c.result["status"] == "skipped"]
    return {"passed": not failed and not errors and not missing, "ran": len(ran), "failed": failed,
            "errors": errors, "missing_required": missing}


def _log_candidate(cand: Candidate) -> None:
    r = cand.result
    if r["status"] == "skipped":
        log.info("verify: %-17s skipped: %s", cand.name, r["reason"])
    elif r["status"] == "error":
        log.warning("verify: %-17s error: %s", cand.name, r["reason"])
    else:
        t, k = r["tensor_check"], r["task_check"]
        log.info("verify: %-17s %-6s max abs %.3g  max rel %.3g  top-1 agreement %.2f%%  acc %.2f%% (ref %.2f%%)",
                 cand.name, r["status"], t["max_abs_error"], t["max_rel_error"], 100 * k["top1_agreement"],
                 100 * k["accuracy"], 100 * k["reference_accuracy"])


def _worst_batch(cand: Candidate, feeds) -> dict:
    failed = cand.result.get("tensor_check", {}).get("failed_batches") or [0]
    return feeds[failed[0]]


def _localize(cfg, run_dir, fp32_model, fp16_model, fp16_path, feeds, failing, spec) -> dict:
    cand = failing[0]
    gate = cand.result["tolerance"]
    atol = localize.scalar_tolerance(gate["atol"], 0.0)
    rtol = localize.scalar_tolerance(gate["rtol"], 0.0)
    feed = _worst_batch(cand, feeds)
    result = None
    if cand.name == "tensorrt_fp16":
        try:
            shapes = build.profile_shapes(cfg, spec["input_size"])
            result = localize.localize_tensorrt(fp32_model, fp16_path, feed, atol, rtol, cfg.verify.localize_top,
                                                spec["input_name"], shapes)
        except Exception as exc:  # fall back to the emulation, and say so
            log.warning("verify: TensorRT layer-wise localisation failed (%s); using the FP16 emulation", exc)
    if result is None:
        result = localize.localize_emulation(fp32_model, fp16_model, feed, atol, rtol, cfg.verify.localize_top)
    result["candidate"] = cand.name
    first = result.get("first_divergent")
    if first:
        log.warning("verify: first node over tolerance: %s (%s): max abs error %.4g, max rel error %.4g, "
                    "FP32 range [%.4g, %.4g]", first["name"], first["op_type"], first["max_abs_error"],
                    first["max_rel_error"], first["fp32_min"], first["fp32_max"])
    else:
        log.warning("verify: no single tensor exceeds the tolerance; the error builds up across layers")
    return result


# --------------------------------------------------------------------------- automatic FP32 fallback


def _auto_fallback(cfg, run_dir: RunDir, card, fp32_model, fp16_model, feeds, reference, labels, candidates,
                   localization) -> dict:
    """Move the first divergent node (or its FP16 inputs) to FP32, reconvert, re-verify; repeat."""
    spec = card["spec"]
    moved = list(export.read_fallback(run_dir))
    before = fp16.node_precisions(fp32_model, fp16_model)
    fraction_before = sum(1 for _, p in before.values() if p == "fp16") / max(1, len(before))
    iterations = []
    candidate_path = run_dir.file(FALLBACK_CANDIDATE)
    current_model, loc = fp16_model, localization
    passed = False
    try:
        for i in range(cfg.verify.fallback_iterations):
            first = (loc or {}).get("first_divergent")
            if not first:
                iterations.append({"iteration": i + 1, "moved": [], "note": "no node over tolerance to move"})
                break
            new = localize.nodes_to_move(first["name"], fp32_model, current_model, set(moved))
            if not new:
                iterations.append({"iteration": i + 1, "moved": [], "note": f"nothing left to move for {first['name']}"})
                break
            moved += new
            report_fp16 = export.convert_fp16(cfg, run_dir, card, moved, out_name=FALLBACK_CANDIDATE)
            current_model = onnx.load(str(candidate_path))
            rechecked = plan_candidates(cfg, run_dir, card, None, current_model, only_fp16=True)
            rechecked = [c for c in rechecked if c.name != "tensorrt_fp16"]  # the engine is rebuilt after a pass
            all_ok = True
            for cand in rechecked:
                gate = gate_for(cfg, cand.name, cand.precision)
                cand.result = check_candidate(cand, feeds, reference, labels, gate, spec["output_name"])
                cand.result["tolerance"] = gate
                all_ok = all_ok and cand.result["status"] in ("passed", "skipped")
            iterations.append({"iteration": i + 1, "moved": new, "divergent_node": first["name"],
                               "fp16_fraction": report_fp16["fp16_fraction"], "passed": all_ok,
                               "results": {c.name: c.result["status"] for c in rechecked}})
            log.info("verify: fallback %d: moved %s to FP32 -> FP16 fraction %.1f%%, %s", i + 1, ", ".join(new),
                     100 * report_fp16["fp16_fraction"], "passes" if all_ok else "still fails")
            if all_ok:
                passed = True
                _commit_fallback(cfg, run_dir, candidate_path, moved, report_fp16)
                by_name = {c.name: c for c in rechecked}
                for cand in candidates:
                    if cand.name in by_name:
                        cand.result = by_name[cand.name].result
                        cand.result["after_fallback"] = True
                if run_dir.file(build.ENGINE).exists() or build.availability()[0]:
                    _rebuild_engine(cfg, run_dir, candidates, feeds, reference, labels, spec)
                break
            first_failing = next(c for c in rechecked if c.result["status"] == "failed")
            gate = first_failing.result["tolerance"]
            loc = localize.localize_emulation(fp32_model, current_model, _worst_batch(first_failing, feeds),
                                              localize.scalar_tolerance(gate["atol"], 0.0),
                                              localize.scalar_tolerance(gate["rtol"], 0.0), cfg.verify.localize_top)
    finally:
        candidate_path.unlink(missing_ok=True)
    after = fp16.node_precisions(fp32_model, onnx_io.load(run_dir.file(export.FP16_ONNX))) if passed else before
    return {
        "passed": passed,
        "moved_to_fp32": moved,
        "iterations": iterations,
        "fp16_fraction_before": fraction_before,
        "fp16_fraction_after": sum(1 for _, p in after.values() if p == "fp16") / max(1, len(after)),
        "budget": cfg.verify.fallback_iterations,
        "replaced": [export.FP16_ONNX] if passed else [],
    }


def _commit_fallback(cfg, run_dir: RunDir, candidate_path: Path, moved: list[str], report_fp16: dict) -> None:
    """Replace model.fp16.onnx by the passing version and keep the export stage's record true."""
    from pipeline import stages

    os.replace(candidate_path, run_dir.file(export.FP16_ONNX))
    export.write_fallback(run_dir, moved)
    entry = run_dir.stage_entry("export")
    if entry is not None:
        entry.setdefault("artifacts", {})[export.FP16_ONNX] = {
            "sha256": sha256_file(run_dir.file(export.FP16_ONNX)),
            "bytes": run_dir.file(export.FP16_ONNX).stat().st_size}
        entry.setdefault("details", {})["fp16"] = report_fp16
        entry["fingerprint"] = stages.fingerprint(stages.STAGES["export"], cfg, run_dir)
        entry["updated_by"] = f"verify --auto-fallback at {now()}"
        run_dir.save_manifest()


def _rebuild_engine(cfg, run_dir: RunDir, candidates, feeds, reference, labels, spec) -> None:
    """After a fallback the old engine no longer matches model.fp16.onnx: rebuild (GPU) or drop it."""
    ok, reason = build.availability()
    if not ok:
        for name in (build.ENGINE, build.SIDECAR):
            run_dir.file(name).unlink(missing_ok=True)
        return
    from pipeline import stages

    stages.run_stage("build", cfg, run_dir)
    for cand in candidates:
        if cand.name == "tensorrt_fp16":
            fresh = _tensorrt_candidate(cfg, run_dir, run_dir.file(export.FP16_ONNX))
            gate = gate_for(cfg, cand.name, cand.precision)
            cand.result = check_candidate(fresh, feeds, reference, labels, gate, spec["output_name"])
            cand.result["tolerance"] = gate
            cand.result["after_fallback"] = True

