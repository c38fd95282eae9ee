"""compare's reports: compare.json, compare.md, compare.junit.xml (and the GitHub step summary), and the section
report.html / report.md show, and compare's wording (the reason of a failed artifact or row, the failure line).
The rows are built here once as :class:`pipeline.reports.tables.Section`s; the writers are verify's
(:func:`pipeline.reports.verify_report.write_reports`). Text that came from the bundle (or from the run's image
names) is shown through :func:`pipeline.core.schema.printable`: no escape sequence, newline or table break, bounded.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from pipeline.core import artifacts, compare_result
from pipeline.core.bundle_schema import BatchRow
from pipeline.core.compare_result import ArtifactComparison, ArtifactDrift, CompareResult, LatencyComparison
from pipeline.core.run import RunDir
from pipeline.core.schema import printable
from pipeline.core.status import Status
from pipeline.reports import tables, verify_report
from pipeline.reports.tables import Cell, Section, Table, fmt, percent

SCHEMA = compare_result.SCHEMA
NAMES = (artifacts.COMPARE_JSON, artifacts.COMPARE_MD, artifacts.COMPARE_JUNIT)
FLIPS_SHOWN = 20  # in the Markdown; compare.json lists every flipped image
FAILING = (Status.FAILED, Status.MISSING)


# --------------------------------------------------------------------------- wording


def artifact_reason(result: ArtifactDrift, failed: list[str]) -> str:
    """The failed checks of one compared artifact, with their numbers and thresholds."""
    g, a, d = result.agreement, result.accuracy, result.drift
    text = {"agreement": f"top-1 agreement {100 * g.value:.2f}% (min {100 * g.threshold:.2f}%, upper bound "
                         f"{100 * g.upper_bound:.2f}%): {len(result.flipped)} images flipped",
            "accuracy": f"accuracy {100 * a.baseline_accuracy:.2f}% -> {100 * a.accuracy:.2f}% (max drop "
                        f"{100 * a.threshold:.2f} points, lower bound {100 * a.lower_bound:.2f})",
            "drift": f"logit drift {d.value:.3g} at the {100 * d.quantile:g}th-percentile image (max "
                     f"{d.threshold:g} of the baseline's logit scale)"}
    return ", ".join(text[k] for k in failed)


def latency_reason(row: LatencyComparison) -> str:
    return (f"median {row.baseline_p50_ms:.4g} ms -> {row.run_p50_ms:.4g} ms, ratio {ratio(row.ratio)} "
            f"[{ratio(row.ci_low)}, {ratio(row.ci_high)}] above {row.threshold:g}")


def ratio(value: float) -> str:
    """A ratio with three significant digits (2.23, 0.0412, 1.5e+04): never hundreds of digits."""
    return f"{value:.3g}"


# --------------------------------------------------------------------------- tables


def _name(value) -> Cell:
    return Cell(printable(value, 80), code=True)


def _artifact_row(a: ArtifactComparison) -> tuple[Cell, ...]:
    g, acc, d = a.agreement, a.accuracy, a.drift
    if a.status in (Status.MISSING, Status.SKIPPED) or g is None or acc is None or d is None:
        return (_name(a.name), Cell(a.status, status=Status.FAILED if a.status == Status.MISSING else
                                    Status.SKIPPED, note=a.reason or ""), *[Cell("-")] * 5)
    return (_name(a.name), Cell(a.status, status=a.status),
            Cell(f"{percent(g.value)} (upper {percent(g.upper_bound)})", status=g.status),
            Cell(f"{len(a.flipped or [])}"),
            Cell(f"{percent(acc.baseline_accuracy)} -> {percent(acc.accuracy)}", status=acc.status),
            Cell(f"p50 {fmt(d.p50)}, p99 {fmt(d.p99)}, max {fmt(d.max)}", status=d.status),
            Cell(_batch_text(a.batch_sizes)))


def _batch_text(rows: list[BatchRow] | None) -> str:
    return printable(", ".join(f"{r.batch_size}: {r.status}" for r in rows or [] if r.batch_size is not None)) or "-"


def _latency_row(r: LatencyComparison) -> tuple[Cell, ...]:
    shown = r.status in (Status.SKIPPED, Status.MISSING)
    return (_name(r.backend), Cell(str(r.batch_size)), Cell(printable(r.timing or "-", 80)),
            Cell(f"{fmt(r.baseline_p50_ms)} -> {fmt(r.run_p50_ms)}"),
            Cell("-" if r.ratio is None else f"{ratio(r.ratio)} [{ratio(r.ci_low)}, {ratio(r.ci_high)}]"),
            Cell(r.status, status=Status.FAILED if r.status == Status.MISSING else r.status,
                 note=r.reason or "" if shown else ""))


def _flips_section(artifacts_: list[ArtifactComparison]) -> Section | None:
    rows = [(_name(a.name), _name(f.image), Cell(printable(f.label, 80)),
             Cell(printable(f.baseline, 80)), Cell(printable(f.run, 80)))
            for a in artifacts_ for f in (a.flipped or [])[:FLIPS_SHOWN]]
    if not rows:
        return None
    return Section("Images whose top-1 changed", paragraphs=(f"the first {FLIPS_SHOWN} per artifact; compare.json "
                                                             "lists them all",),
                   tables=(Table(("artifact", "image", "label", "baseline top-1", "run top-1"), tuple(rows)),), level=3)


def _class_section(artifacts_: list[ArtifactComparison]) -> Section | None:
    rows = [(_name(a.name), Cell(printable(c.class_, 80)), Cell(percent(c.baseline)), Cell(percent(c.run)),
             Cell(f"{100 * c.delta:+.1f} pt"))
            for a in artifacts_ for c in a.per_class or [] if c.delta]
    if not rows:
        return None
    return Section("Per-class accuracy that changed", tables=(Table(("artifact", "class", "baseline", "run",
                                                                     "delta"), tuple(rows)),), level=3)


def sections(result: CompareResult) -> list[Section]:
    """The rows of compare.md and of the report's compare section."""
    env_rows = tuple((Cell(printable(r.what, 80)), Cell(printable(r.baseline)), Cell(printable(r.run)))
                     for r in result.environment)
    base, t = result.baseline, result.thresholds
    out = [
        Section("Compared with the baseline", status=Status.PASSED if result.passed else Status.FAILED,
                paragraphs=((f"baseline {printable(base.path, 400)} (made {printable(base.created, 80)}); "
                             f"{result.images} validation images; environment: {result.environment_summary}"),),
                tables=(Table(("artifact", "verdict", "top-1 agreement", "flipped", "accuracy", "logit drift (scaled)",
                               "batch sizes"), tuple(_artifact_row(a) for a in result.artifacts)),)),
        Section("Environment changes", level=3,
                paragraphs=() if env_rows else ("none: the same versions, driver, GPU, CPU and ISA",),
                tables=(Table(("what", "baseline", "run"), env_rows),) if env_rows else ()),
        Section("Latency against the baseline", level=3,
                paragraphs=(f"ratio of medians with its {100 * t.confidence:g}% bootstrap interval; a regression only "
                            f"when the whole interval is above {t.max_latency_ratio}",),
                tables=(Table(("backend", "batch", "timing", "p50 ms", "ratio [interval]", "verdict"),
                              tuple(_latency_row(r) for r in result.latency)),) if result.latency else ()),
    ]
    out += [s for s in (_flips_section(result.artifacts), _class_section(result.artifacts)) if s]
    return out


def payload_sections(payload) -> list[Section]:
    """The report's compare section from compare.json as read (:func:`pipeline.core.compare_result.from_json`)."""
    return sections(compare_result.from_json(payload))


def markdown(result: CompareResult) -> str:
    return tables.markdown(sections(result), top=3)


def junit(result: CompareResult) -> str:
    cases = [(f"artifact.{printable(a.name, 80)}", a) for a in result.artifacts] + \
            [(f"latency.{printable(r.backend, 80)}.b{r.batch_size}.{r.timing_kind}", r)
             for r in result.latency]  # the kind, not the label: a reworded label keeps its test case
    failed = sum(1 for _, c in cases if c.status in FAILING)
    suite = ET.Element("testsuite", name="pipeline.compare", tests=str(len(cases)), failures=str(failed),
                       errors="0", skipped=str(sum(1 for _, c in cases if c.status == Status.SKIPPED)),
                       timestamp=result.created)
    for name, c in cases:
        case = ET.SubElement(suite, "testcase", classname=f"compare.{printable(result.model, 80)}", name=name)
        if c.status in FAILING:
            ET.SubElement(case, "failure", type="BaselineDrift", message=c.reason or c.status)
        elif c.status == Status.SKIPPED:
            ET.SubElement(case, Status.SKIPPED, message=c.reason or "")
    env = ET.SubElement(suite, "system-out")
    env.text = f"environment: {result.environment_summary}"
    ET.indent(suite)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(suite, encoding="unicode") + "\n"


def write_all(run_dir: RunDir, result: CompareResult) -> list[Path]:
    """compare.json (:meth:`CompareResult.to_json`), compare.md and compare.junit.xml."""
    return verify_report.write_reports(run_dir, result.to_json(), markdown(result), junit(result), NAMES)


def failure_message(result: CompareResult) -> str:
    """exit 1's line: what crossed which threshold, and what changed in the environment."""
    parts = [f"{printable(a.name, 80)}: {a.status}: {a.reason}" if a.status == Status.MISSING else
             f"{printable(a.name, 80)}: {a.reason}" for a in result.artifacts if a.status in FAILING]
    parts += [f"{printable(r.backend, 80)} at batch {r.batch_size}: {r.reason}" for r in result.latency
              if r.status in FAILING]
    return (f"the run differs from the baseline: {'; '.join(parts)}; environment: {result.environment_summary}; "
            f"details in {artifacts.COMPARE_MD}")
