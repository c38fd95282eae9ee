"""The rows of every run report, built once: verify.md, benchmark.md, report.md and report.html.

The builders here turn the manifest, ``verify.json`` and ``benchmark.json`` into :class:`Section`s
(a heading, paragraphs, tables of :class:`Cell`s); they choose and format every number. The two
renderers, :func:`markdown` and :func:`html`, only lay sections out. A builder reads its payload's
keys directly, so a payload missing a key raises ``KeyError`` (the report turns that into one line).
"""

from __future__ import annotations

import html as _html
import re
from dataclasses import dataclass

from pipeline.core import records
from pipeline.core.benchmark_rows import BenchmarkRow, CrossCheck, facts_of, rows_of
from pipeline.core.check_results import Localization
from pipeline.core.fallback_result import FallbackResult
from pipeline.core.images_record import ImagesRecord, ValidationSplit
from pipeline.core.manifest import STAGE_ORDER, entries
from pipeline.core.stability_record import SpreadRow, StabilityCertificate
from pipeline.core.status import Status
from pipeline.core.verify_rows import CandidateRow, fallback_of, localization_of, report_of
from pipeline.precision import plugs
from pipeline.runtime.speed import trtexec


@dataclass(frozen=True)
class Cell:
    """One table cell, or one piece of a paragraph."""

    text: str
    status: str | None = None  # a verdict or stage status (passed, failed, skipped, ok, ...): coloured in HTML
    note: str = ""  # said after the text: a skip reason, an error
    code: bool = False  # a node or file name: monospace


@dataclass(frozen=True)
class Table:
    headers: tuple[str, ...]
    rows: tuple[tuple[Cell, ...], ...]


@dataclass(frozen=True)
class Section:
    title: str
    status: str | None = None  # shown after the title: "Precision gate: FAILED"
    paragraphs: tuple = ()  # each a str or a tuple of Cells (to mark node names as code)
    tables: tuple[Table, ...] = ()
    preformatted: str | None = None  # shown verbatim (the configuration)
    level: int = 2  # 2: a top section, 3: under the one before


def fmt(value, spec=".3g") -> str:
    """A number for a table: 3 significant digits by default; None as '-'; strings as they are."""
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    return format(value, spec)


def percent(fraction, spec=".2f") -> str:
    return "-" if fraction is None else f"{format(100 * fraction, spec)}%"


def _row(*cells) -> tuple[Cell, ...]:
    return tuple(c if isinstance(c, Cell) else Cell(fmt(c)) for c in cells)


# --------------------------------------------------------------------------- the manifest


def stage_section(manifest: dict) -> Section:
    """One row per stage of ``STAGE_ORDER``: status, time, and the reason or error."""
    rows = []
    stage_entries = entries(manifest)
    for name in STAGE_ORDER:
        entry = stage_entries.get(name)
        status = entry.status if entry else "not run"
        time = fmt(entry.duration_s, ".1f") + " s" if entry and entry.duration_s is not None else "-"
        rows.append(_row(name, Cell(status, status=status), time, (entry and (entry.reason or entry.error)) or ""))
    return Section("Stages", tables=(Table(("stage", "status", "time", "note"), tuple(rows)),))


def training_section(manifest: dict) -> Section | None:
    train = records.from_manifest(records.TrainRecord, manifest)
    if train is None:
        return None
    rows = tuple(_row(h.epoch, fmt(h.val_loss, ".4f"), percent(h.val_acc)) for h in train.history)
    text = (f"Device {train.device}, mixed precision {train.amp} ({train.amp_note}), "
            f"{train.steps} optimizer steps, {train.skipped_steps} skipped, "
            f"{fmt(train.images_per_s, '.1f')} images/s.")
    precise = train.precise_bn
    if precise is not None and precise.best_epoch_val_acc_before is not None:
        text += (f" Precise BatchNorm statistics ({precise.batches} batches): validation accuracy of the "
                 f"exported epoch {percent(precise.best_epoch_val_acc_before)} before, "
                 f"{percent(precise.best_epoch_val_acc_after)} after.")
    line = train.learning.line if train.learning is not None else None
    paragraphs = (text, f"Learning check: {line}.") if line else (text,)
    return Section("Training", paragraphs=paragraphs, tables=(Table(("epoch", "val loss", "val accuracy"), rows),))


def float_sections(manifest: dict) -> list[Section]:
    """Each low float graph's conversion (FP16, BF16): its share of the nodes, and why a node stayed in FP32."""
    export = records.from_manifest(records.ExportRecord, manifest) or records.ExportRecord()
    sections = []
    for plug in plugs.FLOATS:
        label = plug.label
        graph = export.graph(plug.name)
        if graph is None or graph.fraction is None:
            continue
        rows = tuple(_row(Cell(n.name, code=True), n.op_type, n.reason) for n in graph.fp32_nodes)
        text = (f"{graph.nodes} nodes in {label} ({percent(graph.fraction, '.1f')}), "
                f"{graph.fp32_nodes_count} kept in FP32 by {graph.converter}.")
        tables = (Table(("node kept in FP32", "op", "why"), rows),) if rows else ()
        sections.append(Section(f"{label} conversion", paragraphs=(text,), tables=tables))
    return sections


def int8_section(manifest: dict) -> Section | None:
    """INT8 quantization: the Q/DQ count, the nodes that run INT8, FP16 and FP32, and why a compute node is not INT8."""
    export = records.from_manifest(records.ExportRecord, manifest) or records.ExportRecord()
    int8 = export.graph("int8")
    if int8 is None:
        return None
    if int8.fraction is None:
        why = int8.reason or int8.skipped or "-"
        status = "disabled" if int8.enabled is False else Status.SKIPPED
        return Section("INT8 quantization", status=status, paragraphs=(f"No model.int8.onnx: {why}.",))
    text = (f"{int8.qdq_pairs} Q/DQ pairs; {int8.nodes} nodes compute on INT8 inputs "
            f"({percent(int8.fraction, '.1f')} of the matrix ops: Conv, Gemm, MatMul), {int8.fp16_nodes} in "
            f"FP16, {int8.fp32_nodes_count} in FP32; {int8.quantizer}, calibration "
            f"{int8.calibration_method} on {int8.calibration_images} real validation images, "
            f"{fmt(int8.seconds, '.1f')} s.")
    counts = "Not INT8: " + ("; ".join(f"{n} {why}" for why, n in int8.unquantized_reasons.items())
                             or "none") + "."
    rows = tuple(_row(Cell(n.name, code=True), n.op_type, n.precision, n.reason) for n in int8.unquantized_nodes)
    tables = (Table(("matrix op not in INT8", "op", "precision", "why"), rows),) if rows else ()
    return Section("INT8 quantization", paragraphs=(text, counts), tables=tables)


def _flatten(prefix: str, value) -> list[tuple[str, str]]:
    if isinstance(value, dict):
        return [pair for key, v in value.items() for pair in _flatten(f"{prefix}.{key}" if prefix else key, v)]
    if isinstance(value, (list, tuple)):
        return [(prefix, ", ".join(map(str, value)) or "-")]
    return [(prefix, "-" if value is None else str(value))]


def environment_section(environment: dict) -> Section:
    """The run's machine and software, one row per fact (nested facts as ``gpu.name``)."""
    rows = tuple(_row(key, Cell(value)) for key, value in _flatten("", environment))
    if not rows:
        return Section("Environment", paragraphs=("Not recorded.",))
    return Section("Environment", tables=(Table(("what", "value"), rows),))


# --------------------------------------------------------------------------- verify.json


def _candidate_row(c: CandidateRow) -> tuple[Cell, ...]:
    t, k, tol = c.tensor_check, c.task_check, c.tolerance or {}
    shown = c.status + (" (required)" if c.required and c.status == Status.SKIPPED else "")
    shown += "" if c.gates else " (reported only)"
    accuracy = f"{percent(k.accuracy)} ({percent(k.reference_accuracy)})" if k is not None else "-"
    if tol.get("criterion") == "absolute":
        tolerance, error = f"atol {tol.get('atol')}, rtol {tol.get('rtol')}, {tol.get('check_error_stat')}", "-"
    elif tol:
        share = "" if tol.get("error_quantile", 1) >= 1 else f" at q{100 * tol['error_quantile']:g}"
        tolerance, error = f"scaled <= {tol.get('max_scaled_error')}{share}", t and t.scaled_error_quantile
    else:
        tolerance, error = "-", None
    return _row(c.name, c.precision, Cell(shown, status=c.status, note=c.reason or ""), error,
                t and t.max_abs_error, percent(k and k.top1_agreement), accuracy, tolerance)


def _localization_section(loc: Localization, title: str = "Localisation") -> Section:
    first = loc.first_divergent
    where = ((Cell("First node over tolerance: "), Cell(first.name, code=True), Cell(f" ({first.op_type}).")
              ) if first else "No single tensor exceeds the tolerance (the error builds up across layers).")
    rows = tuple(_row(Cell(r.name, code=True), r.op_type, r.max_abs_error, r.max_rel_error,
                      f"[{fmt(r.fp32_min)}, {fmt(r.fp32_max)}]", str(r.nonfinite))
                 for r in loc.worst)
    table = Table(("node", "op", "max abs err", "max rel err", "FP32 range", "non-finite"), rows)
    return Section(title, paragraphs=(f"{loc.method}.", where), tables=(table,), level=3)


def _names(names: list[str]) -> tuple[Cell, ...]:
    return tuple(cell for name in names for cell in (Cell(name, code=True), Cell(", ")))[:-1] or (Cell("none"),)


# verify.json's keys for each precision's localisation and fallback; FP16's kept their first names (pipeline.verify/2).
SECTION_KEYS = {"fp16": ("localization", "fallback")}


def section_keys(precision: str) -> tuple[str, str]:
    return SECTION_KEYS.get(precision, (f"{precision}_localization", f"{precision}_fallback"))


def _fallback_section(fb: FallbackResult, plug) -> Section:
    """One automatic fallback (every precision's: pipeline.precision.fallback): what moved where, and the share left
    low."""
    one_step = (Cell(f"{plug.raised_to}: "), *_names(fb.raised.out_of_low), Cell("; ")) if len(plug.ladder) > 2 else ()
    moved = (*one_step, Cell("kept in FP32: " if one_step else "moved to FP32: "), *_names(fb.raised.fp32))
    share = f"{plug.label} share"
    text = (Cell(f"{len(fb.iterations)} iteration(s); "), *moved,
            Cell(f"; {share} {percent(fb.fraction_before, '.1f')} -> {percent(fb.fraction_after, '.1f')}."))
    return Section(f"Automatic {plug.label} fallback", status=Status.PASSED if fb.passed else Status.FAILED,
                   paragraphs=(text,), level=3)


def _batch_section(candidates: list[CandidateRow], boxes: bool = False) -> Section | None:
    """Each candidate at every batch size the artifact serves (pipeline/batching.py), where that check ran."""
    rows = tuple(_row(c.name, f"{r.batch_size} ({', '.join(r.profile or [])})",
                      Cell(r.status, status=r.status, note=r.reason or ""), r.scaled_error,
                      r.max_abs_error, percent(r.top1_agreement))
                 for c in candidates for r in c.batch_sizes or [] if r.batch_size is not None)
    if not rows:
        return None
    last = "boxes: at the main batch size" if boxes else "top-1 agreement"  # a detector's: its head's tensor check
    return Section("Batch sizes served", level=3, tables=(Table(("candidate", "batch size", "status", "scaled err",
                                                                  "max abs err", last), rows),))


def _conformance_section(candidates: list[CandidateRow]) -> Section | None:
    """Each candidate's conformance (pipeline/evaluation/conformance.py): its rows' worst deviation from the same image
    alone, and the precisions its matrix layers ran in, by the runtime's own account."""
    rows = []
    for c in candidates:
        r, p = (c.conformance.rows, c.conformance.precision) if c.conformance is not None else (None, None)
        if r is None or p is None:
            continue
        worst = r.worst
        where = f" ({worst.arrangement}, slot {worst.slot} of {worst.batch_size})" if worst else ""
        shares = ", ".join(f"{k} {percent(v, '.0f')}" for k, v in (p.shares or {}).items()) or "no account"
        rows.append(_row(c.name, Cell(r.status, status=r.status, note=r.reason or ""),
                         (fmt(float(worst.deviation), ".2g") + where) if worst else "-",
                         f"{shares} of {p.matrix_layers or 0} ({p.source or ''})",
                         p.claimed or "-", Cell(p.status, status=p.status, note=p.reason or "")))
    if not rows:
        return None
    return Section("Conformance: row independence and the precision each matrix layer ran in", level=3,
                   tables=(Table(("candidate", "rows", "worst row deviation", "matrix layers ran in", "claims",
                                  "claim"), tuple(rows)),))


def verify_sections(payload: dict) -> list[Section]:
    """The precision gate: one row per candidate, then localisation and fallback when they ran."""
    inputs = payload["inputs"]
    text = (f"Model {payload['model']}. Reference: PyTorch FP32. Inputs: {inputs['samples']} real validation "
            f"images ({inputs['source']}).")
    boxes = payload.get("task") == "detection"  # a detector: matched boxes and mAP (docs/detection.md)
    report = report_of(payload)
    candidates = report.candidates
    table = Table(("candidate", "precision", "status", "scaled err (head)" if boxes else "scaled err", "max abs err",
                   "matched boxes" if boxes else "top-1 agreement", "mAP@0.5:0.95 (ref)" if boxes else "accuracy (ref)",
                   "tolerance"), tuple(_candidate_row(c) for c in candidates))
    deployable = payload.get("deployable")
    if deployable is not None:
        undecided = payload.get("undecided") or []
        why = (f" ({', '.join(undecided)}: inconclusive, passed only because the task check's bound could not decide, "
               f"under verify.inconclusive: {payload.get('inconclusive_policy', 'pass')})") if undecided else ""
        text += (f" Deployable (passed a gating check): {', '.join(deployable) or 'none'}{why}. Rows marked 'reported "
                 "only' do not decide the exit code (verify.gate).")
    sections = [Section("Precision gate", status=Status.PASSED if payload["passed"] else Status.FAILED,
                        paragraphs=(text,), tables=(table,))]
    images = _images_section(report.images)
    if images:
        sections.append(images)
    sections += stability_sections(report.stability)
    batches = _batch_section(candidates, boxes)
    if batches:
        sections.append(batches)
    conformance = _conformance_section(candidates)
    if conformance:
        sections.append(conformance)
    for plug in plugs.ORDER:
        loc_key, fb_key = section_keys(plug.name)
        localization, fallback = localization_of(payload, loc_key), fallback_of(payload, fb_key, plug.name)
        if localization:
            sections.append(_localization_section(localization, f"{plug.label} localisation ({plug.faithful})"))
        if fallback:
            sections.append(_fallback_section(fallback, plug))
    return sections


def _images_section(images: ImagesRecord | None) -> Section | None:
    """Whether the verdict's images are held out from calibration and tune's search (pipeline.core.roles)."""
    held = images.held_out if images is not None else None
    if images is None or held is None:
        return None
    split, verdict = images.validation_split or ValidationSplit(), images.verdict
    count = verdict.count if verdict is not None and verdict.count is not None else "?"
    text = (f"Verdict images: {count} of the validation split's verdict part "
            f"({_or_unknown(split.verdict_part)} images; {_or_unknown(split.search_part)} kept for tune's search"
            f"{'' if split.cut else ', the same images: the split was not cut'}). {held.line}.")
    return Section("Held-out images", status="held out" if held.held_out else "not held out", paragraphs=(text,),
                   level=3)


def _or_unknown(value: int | None) -> int | str:
    return "?" if value is None else value


def stability_sections(stability: StabilityCertificate | None) -> list[Section]:
    """The calibration stability certificate (pipeline.precision.stability), where it ran."""
    return [] if stability is None else [_stability_section(stability)]


def _range(spread: SpreadRow) -> str:
    return f"{fmt(spread.min)} to {fmt(spread.max)}"


def _stability_section(s: StabilityCertificate) -> Section:
    cert, gate, act = s.certificate, s.gate_spread, s.scale_spread.activation
    words = [f"{cert.line}.",
             f"{cert.draws} draws of {s.draw_size} training images ({s.sampling}"
             f"{'; ' + s.sampling_note if s.sampling_note else ''}), draw 0 the deployed calibration; each "
             f"draw's graph executed faithfully (int8_exact) and judged by the gate on the {s.verdict_images} "
             f"verdict images ({s.seconds:g} s).",
             f"Across the draws: scaled error {_range(gate.scaled_error)}, top-1 agreement "
             f"{_range(gate.top1_agreement)}, accuracy drop {_range(gate.accuracy_drop)}. Activation scales "
             f"({act.quantizers if act else 0} quantizers): median relative spread "
             f"{percent(act.median_relative if act else None)}, largest {percent(act.max_relative if act else None)}"
             + (f" ({act.worst})" if act and act.worst else "") + "."]
    draws = Table(("draw", "images", "split", "gate", "scaled error", "top-1 agreement", "accuracy drop"), tuple(
        (Cell(f"{r.draw}{' (deployed)' if r.deployed else ''}"), Cell(str(r.images)), Cell(r.split),
         Cell(r.status, status=r.status), Cell(fmt(r.scaled_error)), Cell(fmt(r.top1_agreement)),
         Cell(fmt(r.accuracy_drop))) for r in s.draws))
    quantizers = Table(("quantized tensor", "kind", "min scale", "max scale", "relative spread"), tuple(
        (Cell(q.tensor, code=True), Cell(q.kind), Cell(fmt(q.min)), Cell(fmt(q.max)),
         Cell(percent(q.relative))) for q in s.quantizers))
    return Section("Calibration stability certificate (INT8)", cert.status, tuple(words), (draws, quantizers), level=3)


# --------------------------------------------------------------------------- benchmark.json


def _benchmark_row(r: BenchmarkRow) -> tuple[Cell, ...]:
    lat = r.latency_ms
    return _row(r.backend, r.precision, r.device, str(r.batch_size), fmt(lat.p50, ".3f"),
                fmt(lat.p90, ".3f"), fmt(lat.p99, ".3f"), fmt(lat.mean, ".3f"),
                percent(lat.cv, ".1f") + (" !" if r.cv_warning else ""), fmt(r.throughput_per_s, ".1f"),
                percent(r.accuracy), _vs_eager_text(r),
                r.timing, Cell(r.verify, status=r.verify))


def _vs_eager_text(r: BenchmarkRow) -> str:
    """``20.70x [19.80, 21.60]``: the row's speed-up over eager FP32 with its bootstrap interval, where it has one."""
    if not r.vs_eager:
        return fmt(r.vs_eager, ".2f")
    band = f" [{r.vs_eager_interval[0]:.2f}, {r.vs_eager_interval[1]:.2f}]" if r.vs_eager_interval else ""
    return f"{r.vs_eager:.2f}x{band}"


def _precision_rows(results: list[BenchmarkRow]) -> tuple[tuple[Cell, ...], ...]:
    """One row per backend and timing kind: batch-1 latency and largest-batch throughput, accuracy and verdict."""
    rows = []
    for key in dict.fromkeys((r.backend, r.timing_kind) for r in results):
        mine = sorted((r for r in results if (r.backend, r.timing_kind) == key), key=lambda r: r.batch_size)
        small, large = mine[0], mine[-1]
        rows.append(_row(small.backend, small.precision, small.device,
                         f"{fmt(small.latency_ms.p50, '.3f')} (b={small.batch_size})",
                         f"{fmt(large.throughput_per_s, '.1f')} (b={large.batch_size})",
                         percent(small.accuracy), small.timing, Cell(small.verify, status=small.verify)))
    return tuple(rows)


def benchmark_section(payload: dict) -> Section:
    """Every (backend, batch, timing) measured, the method, the machine, and what was skipped."""
    typed, facts = rows_of(payload), facts_of(payload)
    env, m, rows = facts.environment, facts.method, facts.rows
    machine = (f"CPU: {env.cpu} ({env.cpu_cores} cores, {env.threads} threads); "
               f"GPU: {env.gpu.name if env.gpu else 'none'}; torch {env.torch}, ONNX Runtime {env.onnxruntime}, "
               f"TensorRT {env.tensorrt or 'not installed'}, OpenVINO {env.openvino or 'not installed'}.")
    how = m.described or (f"{m.trials} trials of at least {m.min_iterations} runs and "
                          f"{m.min_duration_s} s each, after {m.warmup_s} s of warm-up")
    left = (f" Left out (they cannot change the answer): {', '.join(rows.left_out)}; {rows.how} times them "
            "too." if rows.left_out else "")
    sizes = {r.batch_size for r in typed.results}
    if rows.throughput_batches and sizes - set(rows.throughput_batches):
        left += (f" Async-throughput rows (OpenVINO) at batch {', '.join(map(str, rows.throughput_batches))} "
                 "only, the batch whose images/s the summary names; benchmark.rows=all times them at every batch.")
    method = (f"Method: {how}; percentiles by {m.percentiles or '-'}; "
              f"input {payload['input']['shape']} ({payload['input']['data']}). "
              f"A '!' after the cv marks a trial whose coefficient of variation exceeded "
              f"{percent(m.cv_warn, '.0f')}. 'x eager FP32': images/s over torch_fp32's at the same batch, "
              f"with the 95 % bootstrap interval of the two rows' runs (timed apart: the noise inside them, not "
              f"the drift between them).{left}")
    skipped = tuple(f"Skipped {s.backend}" + (f" at batch {s.batch_size}" if s.batch_size else "")
                    + f": {s.reason}" for s in typed.skipped)
    table = Table(("backend", "precision", "device", "batch", "p50 ms", "p90 ms", "p99 ms", "mean ms", "cv",
                   "images/s", "accuracy", "x eager FP32", "timing", "verify"),
                  tuple(_benchmark_row(r) for r in typed.results))
    choice = Table(("backend", "precision", "device", "p50 ms (smallest batch)", "images/s (largest batch)",
                    "accuracy", "timing", "verify"), _precision_rows(typed.results))
    side = ("Every precision side by side (accuracy: verify's, on its real validation images, for the "
            "artifact timed here; a backend that failed verify is not a candidate, however fast).")
    anchor = trtexec_table(typed.results)  # trtexec on the same engines, when it was on PATH
    ov_text, ov_table = benchmark_app_table(typed.benchmark_app)  # benchmark_app on the same IRs
    return Section(f"Benchmark: {payload['model']}", paragraphs=(machine, method, *skipped, side,
                                                                 *((ov_text,) if ov_text else ())),
                   tables=(choice, table, *(t for t in (anchor, ov_table) if t)))


def trtexec_table(results: list[BenchmarkRow]) -> Table | None:
    """The "trtexec side by side" table, or None without trtexec rows."""

    rows = []
    for r in results:
        t = r.trtexec
        if t is None:
            continue
        head = (Cell(r.backend), Cell(str(r.batch_size)), Cell(r.timing.split(" (")[0]),
                Cell(fmt(r.latency_ms.p50, ".3f")))
        if t.error is not None:
            rows.append(head + (Cell("-"),) * 5 + (Cell("error", status=Status.ERROR, note=t.error),))
            continue
        if t.not_run is not None:  # trtexec of another TensorRT release than the engine's: nothing failed
            rows.append(head + (Cell("-"),) * 5 + (Cell("not run", status=Status.SKIPPED, note=t.not_run),))
            continue
        flag = Cell("large difference", status=Status.FAILED) if t.flag else Cell(Status.OK, status=Status.PASSED)
        rows.append(head + tuple(Cell(fmt(v, ".3f")) for v in (t.p50, t.p90, t.p99, t.mean))
                    + (Cell(percent(t.difference, "+.0f")), flag))
    if not rows:
        return None
    return Table(("backend", "batch", "timing", "ours p50 ms", "trtexec p50 ms", "p90 ms", "p99 ms", "mean ms",
                  "difference", f"flag (> {trtexec.FLAG_RELATIVE:.0%})"), tuple(rows))


def benchmark_app_table(section: CrossCheck | None) -> tuple[str, Table | None]:
    """OpenVINO's benchmark_app beside our OpenVINO rows: a paragraph and the table (None when it did not run)."""
    if not section:
        return "", None
    if section.rows is None:
        return f"OpenVINO benchmark_app: skipped: {section.skipped}", None
    rows = []
    for r in section.rows:
        head = (Cell(r.backend), Cell(str(r.batch_size)), Cell(r.mode))
        if r.error is not None:
            rows.append(head + (Cell("-"), Cell("-"), Cell("-"), Cell("error", status=Status.ERROR, note=r.error)))
            continue
        latency = r.mode == "latency"
        theirs = (r.benchmark_app or {}).get("p50_ms" if latency else "throughput_per_s")
        if r.benchmark_app_per_round is not None:  # interleaved rounds: the median of benchmark_app's rounds
            theirs = sorted(r.benchmark_app_per_round)[len(r.benchmark_app_per_round) // 2]
        shown = (lambda v: f"{v:.3f} ms p50") if latency else (lambda v: f"{v:.1f} images/s")
        said = r.said
        flag = Cell(Status.OK, status=Status.PASSED) if said == "agree" else \
            Cell("in doubt" if said == "undecided" else said, status=Status.FAILED)
        interval = r.interval
        ratio = f"{r.ratio:.2f} [{interval.low:.2f}, {interval.high:.2f}]" if interval else fmt(r.ratio, ".2f")
        rows.append(head + (Cell(shown(r.ours)), Cell(shown(theirs)), Cell(ratio), flag))
    text = (f"OpenVINO benchmark_app beside ours: same IR, shape, precision hint and threads; {section.seconds} s "
            f"per run, alternated with our timing of the same row in interleaved rounds; a ratio (95 % interval) "
            f"outside [{1 / section.flag_ratio:.2f}, {section.flag_ratio}] is flagged far apart, one reaching "
            "across its edge is in doubt.")
    return text, Table(("backend", "batch", "mode", "ours", "benchmark_app", "ratio", "flag"), tuple(rows))


# --------------------------------------------------------------------------- rendering


def md_escape(value) -> str:
    """Text for Markdown that a browser renders (GitHub, a step summary): model names, paths and messages come
    from the user, so ``<`` is an entity: no tag can open (``<img src=x onerror=...>`` shows, never runs), while
    ``->`` and ``a & b`` stay readable as plain text."""
    return str(value).replace("<", "&lt;")


def _md_code(value) -> str:
    """A code span: its content is shown literally, so it is not escaped, but it cannot end early."""
    return "`" + str(value).replace("`", "'") + "`"


def _md_text(cell: Cell) -> str:
    text = _md_code(cell.text) if cell.code else md_escape(cell.text)
    return f"{text}: {md_escape(cell.note)}" if cell.note else text


def _md_paragraph(paragraph) -> str:
    return md_escape(paragraph) if isinstance(paragraph, str) else "".join(_md_text(c) for c in paragraph)


def _fence(text: str) -> str:
    """A code fence longer than any run of backticks in ``text``, so the text cannot close it."""
    return "`" * max(3, 1 + max((len(run) for run in re.findall(r"`+", text)), default=0))


def markdown(sections: list[Section], top: int = 2) -> str:
    """GitHub-flavoured Markdown; ``top`` is the heading level of a level-2 section."""
    lines: list[str] = []
    for s in sections:
        title = f"{s.title}: {s.status.upper()}" if s.status else s.title
        lines += [f"{'#' * (top + s.level - 2)} {md_escape(title)}", ""]
        for paragraph in s.paragraphs:
            lines += [_md_paragraph(paragraph), ""]
        for table in s.tables:
            lines.append("| " + " | ".join(md_escape(h) for h in table.headers) + " |")
            lines.append("|" + "---|" * len(table.headers))
            lines += ["| " + " | ".join(_md_text(c).replace("|", "/") for c in row) + " |" for row in table.rows]
            lines.append("")
        if s.preformatted is not None:
            fence = _fence(s.preformatted)
            lines += [fence, s.preformatted.rstrip("\n"), fence, ""]
    return "\n".join(lines)


def _esc(value) -> str:
    return _html.escape(str(value))


def _html_text(cell: Cell) -> str:
    text = f"<code>{_esc(cell.text)}</code>" if cell.code else _esc(cell.text)
    if cell.status:
        text = f'<span class="{_esc(cell.status.replace(" ", "-"))}">{text}</span>'
    return text + (f" <span class='muted'>{_esc(cell.note)}</span>" if cell.note else "")


def html_table(table: Table) -> str:
    head = "".join(f"<th>{_esc(h)}</th>" for h in table.headers)
    body = "".join("<tr>" + "".join(f"<td>{_html_text(c)}</td>" for c in row) + "</tr>" for row in table.rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def html(section: Section) -> str:
    """One section as HTML (every text escaped)."""
    title = _esc(section.title) + (f": {_html_text(Cell(section.status, status=section.status))}"
                                   if section.status else "")
    parts = [f"<h{section.level}>{title}</h{section.level}>"]
    parts += [f"<p>{_esc(p) if isinstance(p, str) else ''.join(_html_text(c) for c in p)}</p>"
              for p in section.paragraphs]
    parts += [html_table(t) for t in section.tables]
    if section.preformatted is not None:
        parts.append(f"<pre>{_esc(section.preformatted)}</pre>")
    return "\n".join(parts)
