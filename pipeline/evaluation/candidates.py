"""Judging candidates: the evidence (validation images and the FP32 PyTorch reference's outputs), the candidates
of the backend table with why each cannot run, running one through its runner (in a child process for a native
runtime) and judging it with the gate's criteria, the verdict over them, and the precision core's hooks (re-check
a remade graph, localise a failing candidate). verify and tune both judge this way; neither imports the other.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING

import numpy as np

from pipeline.core import data, precision_config, roles, tasks, verdicts
from pipeline.core.artifacts import CALIBRATION_IMAGES, SEARCH_IMAGES
from pipeline.core.check_results import CandidateResult, Judgement, Localization
from pipeline.core.checks import Check, Evidence  # noqa: F401  (re-exported: the evaluation's vocabulary)
from pipeline.core.errors import InputError, disk_full, first_line
from pipeline.core.run import RunDir, read_json
from pipeline.core.status import Status
from pipeline.core.verdicts import Verdict
from pipeline.evaluation import batching, conformance, conformance_runs
from pipeline.precision import detection_gate, fallback
from pipeline.precision import gate as criteria
from pipeline.precision.plugs import Precision
from pipeline.reports import verify_report
from pipeline.runtime import backends, isolate
from pipeline.runtime.backends import Backend, Context
from pipeline.runtime.isolate import Crashed
from pipeline.runtime.profiling import localize
from pipeline.runtime.runners import Answered, TorchRunner, collect, infer_all

if TYPE_CHECKING:  # annotations only
    from pipeline.core.config_schema import Config
    from pipeline.core.model_card import ModelCard

log = logging.getLogger("pipeline")


REFERENCE = backends.REFERENCE


def gate_for(cfg: Config, name: str, precision: str) -> dict:
    """The thresholds of one candidate: its own non-null keys over the precision's defaults."""
    base = precision_config.gate_section(cfg, precision).model_dump()  # verify.fp16/int8/bf16; else fp32
    section = cfg.verify.candidates.get(name)  # a table entry without a config section: defaults
    own = section.model_dump() if section is not None else {}
    return {key: own[key] if own.get(key) is not None else value for key, value in base.items()}


def plan(cfg: Config, ctx: Context, entries: list[Backend] | None = None) -> list[Check]:
    """The candidates, each with the reason it cannot run; ``enabled=false`` is decided before anything loads."""
    checks = []
    for backend in entries if entries is not None else backends.candidates():
        section = cfg.verify.candidates.get(backend.verify_name)
        if section is not None and not section.enabled:
            reason = verify_report.disabled(backend.verify_name)
        else:
            reason = backend.unavailable(ctx)
        checks.append(Check(backend, backends.label(backend, cfg), backend.required(cfg), reason,
                            gates=gates(cfg, backend)))
    return checks


def gates(cfg: Config, backend: Backend) -> bool:
    """Whether a candidate's verdict decides the exit code: named in ``verify.gate``, or (``auto``) a deployment
    target or its faithful CPU proxy (the table's ``gates``)."""
    chosen = cfg.verify.gate
    return backend.gates if chosen == "auto" else backend.verify_name in chosen


def compare(outputs: list[dict], reference: list[dict], labels: np.ndarray, gate: dict, output_name: str,
            confidence: float = 0.95) -> Judgement:
    """The tensor check and the task check of one candidate (:func:`pipeline.precision.gate.judge`)."""
    return criteria.judge(outputs, reference, labels, gate, output_name, confidence)


def check(chk: Check, cfg: Config, ctx: Context, evidence: Evidence,
          batch_feeds: dict[int, list[dict]] | None = None,
          rows: conformance.RowPlan | None = None) -> CandidateResult:
    """Run one candidate on the evidence and judge it; sets and returns ``chk.result``. With ``batch_feeds``
    (:func:`pipeline.evaluation.batching.feeds_by_size`) the same runner also runs them, for the batch-size check;
    with ``rows`` (:func:`pipeline.evaluation.conformance.plan`), the conformance checks' runs."""
    gate = gate_for(cfg, chk.name, chk.precision)
    chk.result = _judge(chk, ctx, evidence, gate, batch_feeds or {}, rows).model_copy(update={"tolerance": gate})
    return chk.result


def _judge(chk: Check, ctx: Context, evidence: Evidence, gate: dict, batch_feeds: dict,
           rows: conformance.RowPlan | None = None) -> CandidateResult:
    if chk.reason:
        return CandidateResult(status=Status.SKIPPED, reason=chk.reason)
    try:
        runner = isolate.runner_for(chk.backend, ctx)  # native runtimes: in a child process (pipeline.runtime.isolate)
        with runner:
            asked = Answered(runner)  # a batch asked twice (batch sizes, conformance) is answered once
            outputs = infer_all(asked, evidence.feeds)
            chk.batch_runs = _batch_runs(asked, chk, ctx, batch_feeds)
            chk.conformance_runs = conformance_runs.run(asked, chk, ctx, rows)
    except InputError:
        raise
    except Crashed as exc:  # the child died (a segfault in the runtime): a "crashed" row, the others go on
        return verify_report.crashed(exc)
    except Exception as exc:  # a candidate that cannot run is an "error" row, not a dead stage
        if disk_full(exc):  # but a full disk ends the stage, with the documented message
            raise disk_full(exc) from None
        return CandidateResult(status=Status.ERROR, reason=verify_report.error_reason(exc))
    problem = _output_problem(chk, outputs, evidence)
    if problem:
        return CandidateResult(status=Status.ERROR, reason=problem)
    evidence.outputs[chk.name] = outputs  # the last judged outputs (after a fallback: the replacement's)
    if getattr(evidence, "detection", None) is not None:  # the task plug: boxes (pipeline.precision.detection_gate)
        d = evidence.detection
        judged = detection_gate.judge(outputs, evidence.reference, evidence.labels, gate, evidence.output_name,
                                      d["detections"], d["classes"], d["rules"], evidence.confidence)
    else:
        judged = compare(outputs, evidence.reference, evidence.labels, gate, evidence.output_name, evidence.confidence)
    return CandidateResult(tensor_check=judged.tensor_check, task_check=judged.task_check, passed=judged.passed,
                           status=judged.status, **verify_report.runtime_facts(runner))  # its log, a workaround


def _batch_runs(runner, chk: Check, ctx: Context, batch_feeds: dict) -> dict:
    """The batch-size check's outputs; a runner that dies there keeps the main check's verdict and says why."""
    if not batch_feeds:
        return {}
    try:
        return batching.run_sizes(runner, chk, ctx.cfg, batch_feeds)
    except Exception as exc:
        log.warning("verify: %s: the batch-size check could not run: %s", chk.name, exc)
        return {"error": first_line(exc)}


def _output_problem(chk: Check, outputs: list[dict], evidence: Evidence) -> str:
    """A missing output is the candidate's error; an output of another shape than the reference's (a graph
    without static shapes, from another run) is an InputError, before NumPy fails to broadcast them."""
    name = evidence.output_name
    if name not in outputs[0]:
        return verify_report.wrong_outputs(list(outputs[0]), name)
    if getattr(evidence, "detection", None) is not None and evidence.detection["detections"] not in outputs[0]:
        return verify_report.wrong_outputs(list(outputs[0]), evidence.detection["detections"])
    got, want = tuple(outputs[0][name].shape[1:]), tuple(evidence.reference[0][name].shape[1:])
    if got != want:
        raise InputError(verify_report.wrong_output_shape(chk.name, chk.artifact, got, want))
    return ""


def verdict(checks: list[Check], inconclusive: verdicts.InconclusivePolicy = "pass") -> Verdict[Check]:
    """The gate's verdict over verify's candidates (:func:`pipeline.core.verdicts.verdict`)."""
    return verdicts.verdict(checks, inconclusive)


def evidence(cfg: Config, card: ModelCard, model, role: str = roles.VERDICT) -> Evidence:
    """The images of ``role`` (:mod:`pipeline.core.roles`: ``verdict`` for verify and tune's confirmation, ``search``
    for tune's search), their labels, and the reference's outputs on them."""
    spec = card.spec
    names: list[str] = []
    record: list = []
    images, labels = data.role_batch(cfg, card, role, sample_count(cfg, spec.input_size), names=names, record=record)
    bs = cfg.verify.batch_size
    feeds = [{spec.input_name: images[i : i + bs]} for i in range(0, len(images), bs)]
    log.info("%s: %d validation images (%s) in %d batches; reference %s", "verify" if role == roles.VERDICT else "tune",
             len(images), role, len(feeds), REFERENCE)
    ref_runner = TorchRunner(model, name=REFERENCE, input_name=spec.input_name, output_name=spec.output_name,
                             input_shape=tuple(spec.input_size))
    task = tasks.of(spec)
    detection = None if task.name == tasks.CLASSIFICATION else {
        "detections": tasks.DETECTIONS, "classes": spec.num_classes, "rules": cfg.verify.detection.model_dump()}
    return Evidence(feeds, collect(ref_runner, feeds), labels, spec.output_name, cfg.verify.confidence, names,
                    detection=detection, images=record[0], parts=record[1])


def held_out(run_dir: RunDir, evidence: Evidence, graphs) -> roles.HeldOut:
    """Whether ``evidence``'s images are held out from every other role recorded in the run directory: each
    lower-precision graph's calibration images (``calibration_images.json``; a graph present without its record
    cannot be called held out) and tune's search images (``search_images.json``, where tune ran)."""
    calibrations = _recorded(run_dir, CALIBRATION_IMAGES)
    search = _recorded(run_dir, SEARCH_IMAGES)
    others: dict[str, roles.ImageSet | None] = {}
    missing = []
    for precision in graphs:
        entry = calibrations.get(precision) if isinstance(calibrations, dict) else None
        if isinstance(entry, dict) and entry.get("calibrated") is False:
            continue  # its conversion read no image (AutoCast without its range rule)
        image_set = _image_set(entry)
        if image_set is None:
            missing.append(f"{precision} calibration")
        others[f"{precision} calibration"] = image_set
    if search:
        image_set = _image_set(search)
        if image_set is None:
            missing.append("tune search")
        others["tune search"] = image_set
    else:
        others["tune search"] = None
    parts = evidence.parts
    return roles.held_out_status(evidence.images, others, parts.split, parts.reason, missing)


def _recorded(run_dir: RunDir, name: str):
    path = run_dir.file(name)
    if not path.is_file():
        return None
    try:
        return read_json(path, name)
    except (InputError, FileNotFoundError):
        return {"unreadable": True}


def _image_set(entry) -> roles.ImageSet | None:
    if not isinstance(entry, dict):
        return None
    try:
        return roles.ImageSet.from_json(entry)
    except ValueError:
        return None


IMAGE_BYTES_BUDGET = 256 << 20  # the images verify holds (and hands to each child process), at most


def sample_count(cfg: Config, input_size: list[int]) -> int:
    """``verify.samples``, or every validation image up to ``verify.max_samples`` and a memory budget (256 MiB of
    float32 images: 1,000 at 32x32 and 224x224 alike would be 12 MiB and 602 MiB)."""
    if cfg.verify.samples is not None:
        return cfg.verify.samples
    per_image = 4 * int(np.prod(input_size))
    return max(1, min(cfg.verify.max_samples, IMAGE_BYTES_BUDGET // per_image))


def worst_batch(chk: Check, evidence: Evidence) -> dict:
    """The batch with the candidate's worst image (scaled criterion), or its first failing batch (absolute)."""
    size = len(next(iter(evidence.feeds[0].values())))
    return evidence.feeds[criteria.worst_batch_index(chk.tensor_check, size)]


def runs_graph(chk: Check, plug: Precision) -> bool:
    """Whether a candidate runs ``plug``'s graph (the file itself, or an engine or IR made from it)."""
    return chk.backend.graph == plug.name


def recheck_round(plug: Precision, cfg: Config, ctx: Context, evidence: Evidence, current) -> fallback.Round:
    """The candidates that run ``plug``'s graph file itself, on the remade graph ``current``; the round passes when
    every gating one that ran passed (inconclusive counts as passing under ``verify.inconclusive: pass``) and one at
    least ran."""
    sub = dataclasses.replace(ctx, under_test={**ctx.under_test, plug.name: current}, _loaded={})
    rechecked = plan(cfg, sub, [b for b in backends.candidates() if b.graph == plug.name and b.artifact == plug.graph])
    for chk in rechecked:
        check(chk, cfg, sub, evidence)
    gating = [c for c in rechecked if c.gates]
    passed = verdicts.round_passed([c.status for c in gating], cfg.verify.inconclusive)
    failing = next((c for c in gating if c.status == Status.FAILED), None)
    note = "" if passed or failing else verify_report.fallback_errors(rechecked)
    return fallback.Round({c.name: c.status for c in rechecked}, passed, failing, note, rechecked)


def localize_candidate(cfg: Config, plug: Precision, fp32_model, model, evidence: Evidence, chk: Check,
                       run_dir: RunDir | None) -> Localization:
    """The first node over the gate's own rule (per tensor), on the candidate's worst batch: the precision's faithful
    execution of ``model`` (for a Q/DQ graph, the first lowered node over it), or on a GPU, for an engine of a float
    graph, the engine rebuilt with every tensor marked."""
    rule = localization_rule(chk)
    feed = worst_batch(chk, evidence)
    result = None
    if chk.artifact == plug.engine and not plug.exact_localization and run_dir is not None:
        result = _localize_engine(cfg, fp32_model, run_dir, plug, feed, rule)
    if result is None:
        result = localize.localize_faithful(plug, fp32_model, model, feed, rule, cfg.verify.localize_top)
    result = result.model_copy(update={"candidate": chk.name})
    verify_report.log_localization(result)
    return result


def localization_rule(chk: Check) -> criteria.TensorRule:
    """The gate's rule per tensor, tightened to the candidate's own output error
    (:func:`pipeline.precision.gate.localization_limit`)."""
    rule = criteria.TensorRule.of(chk.result.tolerance)
    if rule.criterion != "scaled":
        return rule
    observed = chk.tensor_check.scaled_error_quantile if chk.tensor_check is not None else None
    return dataclasses.replace(rule, max_scaled_error=criteria.localization_limit(rule.max_scaled_error, observed))


def _localize_engine(cfg: Config, fp32_model, run_dir: RunDir, plug: Precision, feed: dict,
                     rule) -> Localization | None:
    from pipeline.runtime.builders import tensorrt_engine

    spec_input = next(iter(feed))
    try:
        shapes = tensorrt_engine.profile_shapes(cfg.build, list(feed[spec_input].shape[1:]))
        cache = tensorrt_engine.timing_cache_path(cfg, run_dir)
        return localize.localize_tensorrt(fp32_model, run_dir.file(plug.graph), feed, rule,
                                          cfg.verify.localize_top, spec_input, shapes, build_cfg=cfg.build,
                                          timing_cache=cache)
    except Exception as exc:  # fall back to the emulation, and say so
        log.warning(verify_report.TENSORRT_LOCALIZE_FAILED, exc)
        return None
