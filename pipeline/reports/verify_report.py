"""verify's wording: its messages, hints and log lines, and its reports: verify.json (schema
``docs/verify.schema.json``), verify.md and verify.junit.xml.

verify.md is also appended to the file named by ``GITHUB_STEP_SUMMARY`` when that is set, so a
GitHub Actions job shows the table on its summary page.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.core import artifacts, env, verify_rows
from pipeline.core.check_results import Bound, CandidateResult, Localization, TaskCheck, TensorCheck
from pipeline.core.checks import Check
from pipeline.core.errors import InputError, PipelineError, first_line
from pipeline.core.fallback_result import FallbackResult
from pipeline.core.images_record import ImagesRecord
from pipeline.core.run import RunDir, atomic_write, now, read_json, sha256_file, write_json
from pipeline.core.stability_record import StabilityCertificate
from pipeline.core.status import Status
from pipeline.core.verdicts import JUDGED, InconclusivePolicy, Verdict, report_standing
from pipeline.core.verify_rows import CandidateRow, VerifyReport, candidates_of, clean, fallback_of, report_of
from pipeline.precision import plugs
from pipeline.reports import tables
from pipeline.reports.tables import fmt, section_keys
from pipeline.runtime import backends

if TYPE_CHECKING:  # annotations only
    from pipeline.core.config_schema import Config

log = logging.getLogger("pipeline")

SCHEMA = "pipeline.verify/2"
NOT_VERIFIED = Status.NOT_VERIFIED
JSON, MARKDOWN, JUNIT = artifacts.VERIFY_JSON, artifacts.VERIFY_MD, artifacts.VERIFY_JUNIT


# --------------------------------------------------------------------------- messages and hints

EXPORT_FIX = ("look for data-dependent control flow (exporter warnings in manifest.json) or try "
              "export.exporter=dynamo")
EXPORT_BROKEN_HINT = f"the FP32 export disagrees with PyTorch: {EXPORT_FIX}"
EXPORT_BROKEN_LOG = ("verify: the FP32 export disagrees with PyTorch; FP16 localisation and fallback are skipped "
                     "(they compare against the FP32 ONNX graph, which is already wrong)")
TENSORRT_LOCALIZE_FAILED = "verify: TensorRT layer-wise localisation failed (%s); using the faithful execution"


def kernels_hint(plug) -> str:
    """A deployment of ``plug``'s graph failed where its faithful execution passed: the graph is sound."""
    return (f"the {plug.label} graph itself passes ({plug.faithful}): this runtime's kernels compute it differently "
            "(fused kernels); deploy it elsewhere (TensorRT) or exclude it from benchmark.backends")


def stale_artifact(plug) -> str:
    """An engine or IR made from the graph the fallback just replaced."""
    return (f"built from the {plug.graph} the {plug.label} fallback replaced: build re-runs and verify checks the new "
            "engine or IR")


def with_legacy_keys(plug, result: FallbackResult) -> FallbackResult:
    """verify.json's names for what moved (schemas pipeline.verify/1 and /2), beside the fallback's ``raised``: a
    graph with a step between its precision and FP32 (INT8's FP16 regions) says what left it and what is in FP32."""
    return result.with_legacy("excluded" if len(plug.ladder) > 2 else "moved")


def disabled(name: str) -> str:
    return f"disabled (verify.candidates.{name}.enabled=false)"


def error_reason(exc: BaseException) -> str:
    text = first_line(exc)
    return f"{type(exc).__name__}: {text}"


def crashed(exc) -> CandidateResult:
    """A candidate whose child process died (:class:`pipeline.runtime.isolate.Crashed`): its result."""
    return CandidateResult(status=Status.CRASHED, reason=str(exc), log=exc.log, log_tail=list(exc.tail))


def runtime_facts(runner) -> dict:
    """How a candidate ran, for verify.json: its child's log, and a workaround applied to its runtime."""
    facts = {"log": runner.log} if getattr(runner, "log", None) else {}
    if getattr(runner, "workaround", ""):
        facts["workaround"] = runner.workaround
    return facts


def runtime_details(checks: Sequence[Check]) -> dict:
    """The manifest's record of runtime workarounds and crashes (with the log to read)."""
    details = {"workarounds": {c.name: c.result.workaround for c in checks if c.result.workaround}}
    crashed = {c.name: f"{c.result.reason} (log: {c.result.log})" for c in checks if c.status == Status.CRASHED}
    if crashed:
        details["crashed"] = crashed
    return details


def wrong_outputs(produced: list[str], expected: str) -> str:
    return f"candidate produced {produced}, not {expected!r}"


def wrong_output_shape(name: str, artifact: str | None, got: tuple, want: tuple) -> str:
    return (f"{name}: {artifact or 'the candidate'} gives outputs of shape [batch, {', '.join(map(str, got))}], "
            f"but the trained model gives [batch, {', '.join(map(str, want))}]; the file is from another model or "
            "run: re-run export")


def reference_nonfinite_reason(nonfinite: int, samples: int) -> str:
    return (f"not compared: the reference (PyTorch FP32, eval mode) gives NaN/Inf logits for {nonfinite} of "
            f"{samples} validation images")


def reference_nonfinite_message(nonfinite: int, samples: int) -> str:
    return (f"the trained model itself (PyTorch FP32, eval mode) produces NaN/Inf logits for {nonfinite} of "
            f"{samples} validation images, so no candidate could be judged; the export is not at fault. "
            "Re-train (e.g. lower train.lr, or train.amp=off), then re-run export and verify")


def describe_tensor(t: TensorCheck, gate: dict) -> str:
    """The tensor check's numbers against its threshold, in the criterion's own terms."""
    nonfinite = f", {t.nonfinite} non-finite values" if t.nonfinite else ""
    if t.criterion == "absolute":
        return (f"max abs error {t.max_abs_error:.4g}, max rel error {t.max_rel_error:.4g} (atol {gate['atol']}, "
                f"rtol {gate['rtol']}, {t.statistic}) in {len(t.failed_batches or [])}/{t.batches} batches"
                + nonfinite)
    which = "worst image" if gate["error_quantile"] >= 1 else f"{100 * gate['error_quantile']:g}th-percentile image"
    return (f"scaled error {t.scaled_error_quantile:.4g} at the {which} (max {gate['max_scaled_error']:g} of the "
            f"reference's logit scale {t.scale:.3g}; {t.images_over} images over; max abs error "
            f"{t.max_abs_error:.4g})" + nonfinite)


def describe_task(k: TaskCheck) -> list[str]:
    """The task criteria that failed or could not be decided, with the bound that decided them."""
    parts, a, d = [], k.agreement, k.drop
    if k.detection:
        return _describe_boxes(k, a, d)
    if a.status != Status.PASSED:
        parts.append(f"top-1 agreement {100 * a.value:.2f}% (min {100 * a.threshold:.2f}%; upper bound "
                     f"{100 * a.upper_bound:.2f}% at {100 * k.confidence:g}% confidence, over the {k.decided} "
                     f"of {k.samples} images that are not near-ties)")
    if d.status != Status.PASSED:
        parts.append(f"accuracy drop {100 * d.value:.2f} points (max {100 * d.threshold:.2f}; lower bound "
                     f"{100 * d.lower_bound:.2f} at {100 * k.confidence:g}% confidence)")
    return parts


def _describe_boxes(k: TaskCheck, a: Bound, d: Bound) -> list[str]:
    """A detector's task criteria that failed or could not be decided (pipeline.precision.detection_gate)."""
    parts = []
    if a.status != Status.PASSED:
        parts.append(f"matched boxes {100 * a.value:.2f}% ({k.matched_boxes} of {k.boxes} boxes scored >= "
                     f"{k.min_score:g}, same class, IoU >= {k.match_iou:g}; min {100 * a.threshold:.2f}%; "
                     f"upper bound {100 * a.upper_bound:.2f}% at {100 * k.confidence:g}% confidence)")
    if d.status != Status.PASSED:
        parts.append(f"mAP@0.5:0.95 drop {100 * d.value:.2f} points ({100 * k.reference_map:.1f}% -> "
                     f"{100 * k.map:.1f}%; max {100 * d.threshold:.2f}; bootstrap lower bound "
                     f"{100 * d.lower_bound:.2f} at {100 * k.confidence:g}% confidence over {k.samples} "
                     "images)")
    return parts


def describe_failure(chk: Check, gate: dict) -> str:
    """The failing criteria only, with their numbers and thresholds."""
    t, k = chk.tensor_check, chk.task_check
    parts = [describe_tensor(t, gate)] if t is not None and not t.passed else []
    parts += describe_task(k) if k is not None else []
    return ", ".join(parts) or chk.result.reason or ""


def more_images(task: TaskCheck) -> str:
    needed = task.more_images
    if needed is None:
        return "the observed value is too close to the threshold for any practical number of images to decide it"
    return f"about {needed} more validation images would decide it"


def inconclusive_message(undecided: Sequence[Check]) -> str:
    return ("the gate could not decide with the images it had (verify.inconclusive=fail): " + "; ".join(
        f"{c.name}: {', '.join(describe_task(c.task_check))}: {more_images(c.task_check)}" for c in undecided)
        + " (raise verify.max_samples, or add validation images)")


def failure_message(verdict: Verdict[Check], localization: Localization | None, export_broken: bool,
                    suggest_fallback: bool) -> str:
    failed = verdict.failed
    first = failed[0]
    text = (f"{len(failed)} of {verdict.ran} candidates failed ({', '.join(c.name for c in failed)}); "
            f"{first.name}: {describe_failure(first, first.result.tolerance)}")
    if export_broken:
        text += f"; the FP32 export itself disagrees with PyTorch, so every ONNX candidate inherits the error: " \
                f"{EXPORT_FIX}"
    elif localization and localization.first_divergent:
        node = localization.first_divergent
        plug = plugs.by_name(first.backend.graph) if first.backend.graph else None
        text += f"; {plug.divergent if plug else 'first node'} over tolerance: {node.name} ({node.op_type})"
    if first.result.hint and first.backend.graph:
        text += f"; {first.result.hint}"
    if suggest_fallback and not export_broken and first.backend.graph:
        text += f"; `verify --auto-fallback` can {plugs.by_name(first.backend.graph).offer}"
    return text + "; details in verify.md"


def missing_required_message(missing: Sequence[Check]) -> str:
    return "required candidate(s) could not run: " + "; ".join(f"{c.name}: {c.result.reason}" for c in missing)


def errors_message(errors: Sequence[Check]) -> str:
    return "candidate(s) failed to run: " + "; ".join(
        f"{c.name}: crashed: {c.result.reason} (log: {c.result.log})" if c.status == Status.CRASHED
        else f"{c.name}: {c.result.reason}" for c in errors)


def fallback_errors(rechecked: Sequence[Check]) -> str:
    return "stopped: no candidate failed to localise, but " + "; ".join(
        f"{c.name}: {c.result.reason}" for c in rechecked if c.status == Status.ERROR)


# --------------------------------------------------------------------------- log lines


def log_batch_sizes(checks: Sequence[Check]) -> None:
    """One line per candidate checked at the other served batch sizes; a warning naming each that failed there."""
    for chk in checks:
        rows = chk.result.batch_sizes or []
        if not any(r.batch_size is not None for r in rows):
            continue
        log.info("verify: %-17s batch sizes %s", chk.name, ", ".join(f"{r.batch_size}: {r.status}" for r in rows))
        if any(r.status == Status.FAILED for r in rows):
            log.warning("verify: %s: %s", chk.name, chk.result.reason)


def log_conformance(checks: Sequence[Check]) -> None:
    """One line per candidate with a conformance section: its rows' worst deviation and the shares of its matrix
    layers per precision, as the runtime gave them; a warning naming each that failed there."""
    for chk in checks:
        section = chk.result.conformance
        rows, precision = (section.rows, section.precision) if section is not None else (None, None)
        if rows is None and precision is None:
            continue
        worst = max((a.deviation for a in (rows.arrangements if rows else None) or []), default=None)
        shares = ", ".join(f"{p} {100 * v:.0f}%" for p, v in ((precision.shares if precision else None) or {}).items())
        log.info("verify: %-17s rows %s (worst %s); matrix layers ran in: %s; claim %s", chk.name,
                 rows and rows.status, "-" if worst is None else f"{worst:.2g}", shares or "no account",
                 precision and precision.status)
        for part in (p for p in (rows, precision) if p is not None and p.status == Status.FAILED):
            log.warning("verify: %s: %s", chk.name, part.reason or "")


def log_check(chk: Check) -> None:
    r = chk.result
    if r.status == Status.SKIPPED:
        log.info("verify: %-17s skipped: %s", chk.name, r.reason)
    elif r.status == Status.ERROR:
        log.warning("verify: %-17s error: %s", chk.name, r.reason)
    elif r.status == Status.CRASHED:
        log.warning("verify: %-17s crashed: %s; last lines of %s:\n  %s", chk.name, r.reason, r.log,
                    "\n  ".join(r.log_tail or []) or "(empty)")
    else:
        t, k = chk.tensor_check, chk.task_check
        error = f"scaled {t.scaled_error_quantile:.3g}" if t.criterion == "scaled" else f"max rel {t.max_rel_error:.3g}"
        if k.detection:
            log.info("verify: %-17s %-12s max abs %.3g  %s  matched boxes %.2f%% (%d of %d)  mAP %.2f%% (ref %.2f%%)%s",
                     chk.name, r.status, t.max_abs_error, error, 100 * k.matched_share, k.matched_boxes,
                     k.boxes, 100 * k.map, 100 * k.reference_map,
                     "" if chk.gates else "  (reported only: not in verify.gate)")
        else:
            log.info("verify: %-17s %-12s max abs %.3g  %s  top-1 agreement %.2f%%  acc %.2f%% (ref %.2f%%)%s",
                     chk.name, r.status, t.max_abs_error, error, 100 * k.top1_agreement, 100 * k.accuracy,
                     100 * k.reference_accuracy, "" if chk.gates else "  (reported only: not in verify.gate)")
        if r.status == Status.INCONCLUSIVE:
            log.warning("verify: %s inconclusive: %s; %s", chk.name, ", ".join(describe_task(k)), more_images(k))


def log_localization(result: Localization) -> None:
    first = result.first_divergent
    if first:
        log.warning("verify: first node over tolerance: %s (%s): max abs error %.4g, max rel error %.4g, "
                    "FP32 range [%.4g, %.4g]", first.name, first.op_type, first.max_abs_error,
                    first.max_rel_error, first.fp32_min, first.fp32_max)
    else:
        log.warning("verify: no single tensor exceeds the tolerance; the error builds up across layers")


# --------------------------------------------------------------------------- reports


def build_payload(cfg: Config, card, candidates: Sequence[Check], gated: dict, verdict: Verdict[Check], samples: int,
                  batch_size: int, *, hashes: dict, reference_nonfinite: int = 0, images: ImagesRecord | None = None,
                  stability: StabilityCertificate | None = None) -> dict:
    """verify.json. ``hashes`` maps each artifact verify read to its sha256: the reference records its
    weights', each candidate that reached a verdict the file it judged (benchmark shows a verdict only
    while those still match the files it times)."""
    reference = {"name": backends.REFERENCE, "precision": "fp32", "device": "cpu",
                 "what": "the trained PyTorch model in FP32 (eval mode)", "weights": artifacts.WEIGHTS,
                 "weights_sha256": hashes.get(artifacts.WEIGHTS), "nonfinite": reference_nonfinite}
    return clean({
        "schema": SCHEMA,
        "created": now(),
        "passed": verdict.passed,
        "deployable": verdict.deployable,
        "inconclusive": [c.name for c in verdict.inconclusive],
        "undecided": verdict.undecided,  # deployable only because the task check's bound could not decide
        "inconclusive_policy": cfg.verify.inconclusive,  # what an inconclusive verdict counted as (verify.inconclusive)
        "model": cfg.model.name,
        **({"task": card.spec.task} if card.spec.task != "classification" else {}),
        "reference": reference,
        "inputs": {"what": "real validation images", "source": cfg.data.source, "samples": samples,
                   "batch_size": batch_size, "input_shape": ["batch", *card.spec.input_size]},
        "candidates": [CandidateRow.of(c, hashes).to_json() for c in candidates],
        **{key: section for name in plugs.PLUGS
           for key, section in zip(section_keys(name), gated.get(name) or (None, None), strict=True)},
        "images": images,  # which images the verdict is on, and whether they are held out (pipeline.core.roles)
        "stability": stability,  # the calibration stability certificate (docs/verify.md), where it ran
        "environment": {k: v for k, v in env.collect().items() if k in ("cpu", "gpu", "torch", "onnxruntime",
                                                                          "polygraphy", "modelopt", "tensorrt",
                                                                          "openvino")},
    })


def markdown(payload: dict) -> str:
    """verify.md: the report's precision-gate rows (``tables.verify_sections``), as Markdown."""
    return tables.markdown(tables.verify_sections(payload), top=3)


def junit(payload: dict) -> str:
    cases = candidates_of(payload)
    failures = sum(1 for c in cases if c.status == Status.FAILED)
    errors = sum(1 for c in cases
                 if c.status in (Status.ERROR, Status.CRASHED) or (c.required and c.status == Status.SKIPPED))
    skipped = sum(1 for c in cases if c.status == Status.SKIPPED and not c.required)
    broken_reference = payload["reference"].get("nonfinite", 0)
    suite = ET.Element("testsuite", name="pipeline.verify", tests=str(len(cases) + bool(broken_reference)),
                       failures=str(failures + bool(broken_reference)), errors=str(errors), skipped=str(skipped),
                       timestamp=payload["created"])
    if broken_reference:  # every candidate is skipped: the failure is the reference's own
        case = ET.SubElement(suite, "testcase", classname=f"verify.{payload['model']}", name="torch_fp32_reference")
        ET.SubElement(case, "failure", type="ReferenceNonFinite",
                      message=f"the trained model gives NaN/Inf logits for {broken_reference} validation images")
    for c in cases:
        case = ET.SubElement(suite, "testcase", classname=f"verify.{payload['model']}", name=c.name)
        numbers = _junit_numbers(c)
        if c.status == Status.FAILED:
            el = ET.SubElement(case, "failure", type="PrecisionCheckFailed",  # the reason: a batch size that fails
                               message=f"{c.name}: {c.reason}" if c.reason else
                               f"{c.name} outside tolerance: {numbers}")
            el.text = numbers
        elif c.status == Status.ERROR:
            ET.SubElement(case, "error", message=c.reason or "error", type="CandidateError")
        elif c.status == Status.CRASHED:
            el = ET.SubElement(case, "error", message=f"crashed: {c.reason} (log: {c.log})", type="CandidateCrashed")
            el.text = "\n".join(c.log_tail or [])
        elif c.status == Status.SKIPPED:
            if c.required:
                ET.SubElement(case, "error", message=f"required but unavailable: {c.reason}",
                              type="BackendUnavailable")
            else:
                ET.SubElement(case, Status.SKIPPED, message=c.reason or "")
        if numbers:
            ET.SubElement(case, "system-out").text = numbers
    ET.indent(suite)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(suite, encoding="unicode") + "\n"


def _junit_numbers(c: CandidateRow) -> str:
    """A judged candidate's numbers against its tolerance, for JUnit ("": not judged)."""
    t, tol = c.tensor_check, c.tolerance or {}
    if t is None:
        return ""
    k = c.task_check
    return (f"criterion={t.criterion} scaled_error={fmt(t.scaled_error_quantile)} "
            f"max_scaled_error={tol.get('max_scaled_error')} max_abs_error={fmt(t.max_abs_error)} "
            f"max_rel_error={fmt(t.max_rel_error)} atol={tol.get('atol')} rtol={tol.get('rtol')} "
            f"failed_batches={len(t.failed_batches or [])}/{t.batches} "
            f"nonfinite={t.nonfinite} top1_agreement={fmt(k.top1_agreement if k else None)} "
            f"accuracy_drop={fmt(k.accuracy_drop if k else None)} gates={c.gates}")


def write_all(run_dir: RunDir, payload: dict) -> list[Path]:
    md = markdown(payload)
    plot = []
    run_dir.file(artifacts.STABILITY_PLOT).unlink(missing_ok=True)  # a certificate not run now shows no old plot
    report = report_of(payload)
    if report.stability is not None:
        from pipeline.reports import stability_report

        limit = next((c.tolerance.get("max_scaled_error") for c in report.candidates
                      if c.name == plugs.INT8.faithful and c.tolerance), None)
        plot = [run_dir.file(stability_report.write_plot(run_dir, report.stability, artifacts.STABILITY_PLOT,
                                                         limit, f"{payload['model']} INT8"))]
        md += f"\n![calibration stability]({artifacts.STABILITY_PLOT})\n"
    return [*write_reports(run_dir, payload, md, junit(payload), (JSON, MARKDOWN, JUNIT)), *plot]


def write_reports(run_dir: RunDir, payload: dict, md: str, junit_xml: str, names: tuple[str, str, str]) -> list[Path]:
    """A gate's three reports (JSON, Markdown, JUnit; verify's and compare's), and the Markdown appended to
    ``GITHUB_STEP_SUMMARY`` when that is set."""
    json_name, md_name, junit_name = names
    write_json(run_dir.file(json_name), clean(payload))
    atomic_write(run_dir.file(md_name), md)
    atomic_write(run_dir.file(junit_name), junit_xml)
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary:
        with open(summary, "a", encoding="utf-8") as f:
            f.write(md + "\n")
    return [run_dir.file(name) for name in names]


def with_earlier_fallbacks(run_dir: RunDir, hashes: dict, gated: dict) -> dict:
    """This run's (localisation, fallback) per precision, the fallback replaced by the previous verify's passed one
    whose replacement is still the file on disk (``earlier_run``: true; nothing to replace again) where this run has
    none. verify re-runs after ``--auto-fallback`` once build re-made the engines and IR from the replaced file; its
    report still says what was moved, and why."""
    try:
        previous = read_json(run_dir.file(JSON), "verify report") if run_dir.file(JSON).is_file() else {}
    except Exception:  # a damaged report: nothing to carry
        previous = {}
    try:
        judged = {c.artifact: c.artifact_sha256 for c in candidates_of(previous)
                  if c.artifact_sha256}  # skipped candidates record none
    except PipelineError:  # damaged rows: nothing to carry
        previous, judged = {}, {}

    def carried(plug) -> FallbackResult | None:
        try:
            section = fallback_of(previous, section_keys(plug.name)[1], plug.name)
        except PipelineError:  # a damaged section: nothing to carry
            return None
        if section is not None and section.passed and judged.get(plug.graph) and \
                judged[plug.graph] == hashes.get(plug.graph):
            return section.carried()
        return None

    out = {}
    for plug in plugs.ORDER:
        loc, fb = gated.get(plug.name) or (None, None)
        out[plug.name] = (loc, fb or carried(plug))
    return out


def artifact_sha256(run_dir: RunDir, name: str) -> str | None:
    """The sha256 a verdict is tied to; for an OpenVINO IR (``.xml``) one over its ``.xml`` and ``.bin``, since
    the ``.xml`` alone stays byte-identical when only the weights or quantization scales change."""
    path = run_dir.file(name)
    if not path.is_file():
        return None
    if path.suffix != ".xml":
        return sha256_file(path)
    weights = path.with_suffix(".bin")
    if not weights.is_file():
        return None
    return hashlib.sha256(f"{sha256_file(path)} {sha256_file(weights)}".encode()).hexdigest()


def _read_report(run_dir: RunDir) -> VerifyReport | None:
    """verify.json as later stages read it; None when it is absent or damaged (verify itself reports damage)."""
    path = run_dir.file(JSON)
    if not path.exists():
        return None
    try:
        return verify_rows.read(path)
    except PipelineError:
        return None


def read_verdicts(run_dir: RunDir) -> dict | None:
    """verify.json's status per candidate name, for the files in the run directory now; None when there is
    no readable verify.json.

    A verdict ("passed"/"failed") stands only while the sha256 verify recorded for the candidate's artifact
    and for the reference's weights match the files here; otherwise (re-trained, re-exported, a model.onnx
    copied in, or a verify.json from before hashes were recorded) it reads "not verified". The one reader
    of verify's verdicts (benchmark's verify column, benchmark's fingerprint).
    """
    report = _read_report(run_dir)
    if report is None:
        return None
    weights = report.reference.weights_sha256
    # The artifact of each candidate comes from the backend table, never from the file's own claim
    # (a candidate without one runs the trained PyTorch model: its artifact is the weights).
    artifact_of = {b.verify_name: b.artifact or artifacts.WEIGHTS for b in backends.candidates()}
    current = functools.cache(lambda name: artifact_sha256(run_dir, name))
    verdicts = {}
    for case in report.candidates:
        status = case.status
        if status in JUDGED:
            artifact = artifact_of.get(case.name)
            fresh = (weights is not None and weights == current(artifacts.WEIGHTS) and artifact is not None
                     and case.artifact_sha256 is not None and case.artifact_sha256 == current(artifact))
            status = status if fresh else NOT_VERIFIED
        verdicts[case.name] = status
    return verdicts


def standing(run_dir: RunDir) -> str | None:
    """Why the run's verify.json does not stand (:func:`pipeline.core.verdicts.report_standing`); None when it does
    or when there is none."""
    path = run_dir.file(JSON)
    if not path.is_file():
        return None
    entry = run_dir.stage_entry("verify")
    return report_standing(entry.status if entry else None, entry.exit_code if entry else None,
                           run_dir.recorded_artifacts("verify").get(JSON), sha256_file(path))


def require_standing(run_dir: RunDir, consumer: str) -> None:
    """verify.json must be there and stand (:func:`standing`); otherwise one :class:`InputError` (exit 2)."""
    path = run_dir.require(JSON, "verify", consumer)
    problem = standing(run_dir)
    if problem:
        raise InputError(f"{path} is not the report of a verify that finished here ({problem}): re-run verify")


def read_policy(run_dir: RunDir) -> InconclusivePolicy:
    """What an inconclusive verdict counted as when verify ran (``verify.inconclusive``). A report written before
    it was recorded, or none: ``fail``, so an inconclusive verdict of unknown standing never counts as passed."""
    report = _read_report(run_dir)
    return (report.inconclusive_policy if report is not None else None) or "fail"


def read_accuracies(run_dir: RunDir) -> dict:
    """verify.json's task accuracy per candidate name (and ``"reference"``: the FP32 model's), only where
    :func:`read_verdicts` still vouches for the verdict: benchmark's accuracy column."""
    verdicts = read_verdicts(run_dir)
    report = _read_report(run_dir)
    if not verdicts or report is None:
        return {}
    tasks = {c.name: c.task_check for c in report.candidates if c.task_check is not None}
    accuracies = {name: task.accuracy for name, task in tasks.items()
                  if verdicts.get(name) in JUDGED and task.accuracy is not None}
    reference = next((t.reference_accuracy for n, t in tasks.items() if n in accuracies), None)
    if reference is not None:
        accuracies["reference"] = reference
    return accuracies


def reference_words(accuracy: float | None, learned: bool | None, task: str | None = None) -> str:
    """The reference beside the verdicts (verify's log and its summary line): "passed" means the artifacts agree with
    the FP32 model; its own accuracy (a detector's mAP), and train's learning check, say whether that model is any
    good."""
    metric = "val mAP@0.5:0.95" if task == "detection" else "val acc"
    words = "reference (FP32) " + ("accuracy unknown" if accuracy is None else f"{metric} {100 * accuracy:.1f}%")
    return words + (" (it did not learn)" if learned is False else "")
