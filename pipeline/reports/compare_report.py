"""compare's reports: compare.json, compare.md, compare.junit.xml (and the GitHub step summary), and the section
report.html / report.md show. The rows are built here once as :class:`pipeline.reports.tables.Section`s; the writers are
verify's (:func:`pipeline.reports.verify_report.write_reports`).
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from pipeline.core.status import Status
from pipeline.core import artifacts
from pipeline.reports import tables, verify_report
from pipeline.core.run import RunDir
from pipeline.reports.tables import Cell, Section, Table, fmt, percent

SCHEMA = "pipeline.compare/1"
NAMES = (artifacts.COMPARE_JSON, artifacts.COMPARE_MD, artifacts.COMPARE_JUNIT)
FLIPS_SHOWN = 20  # in the Markdown; compare.json lists every flipped image


def _artifact_row(a: dict) -> tuple[Cell, ...]:
    if a["status"] in ("missing", Status.SKIPPED):
        return (Cell(a["name"], code=True), Cell(a["status"], status=Status.FAILED if a["status"] == "missing" else
                                                 Status.SKIPPED, note=a.get("reason", "")), *[Cell("-")] * 5)
    g, acc, d = a["agreement"], a["accuracy"], a["drift"]
    return (Cell(a["name"], code=True), Cell(a["status"], status=a["status"]),
            Cell(f"{percent(g['value'])} (upper {percent(g['upper_bound'])})", status=g["status"]),
            Cell(f"{len(a['flipped'])}"),
            Cell(f"{percent(acc['baseline_accuracy'])} -> {percent(acc['accuracy'])}", status=acc["status"]),
            Cell(f"p50 {fmt(d['p50'])}, p99 {fmt(d['p99'])}, max {fmt(d['max'])}", status=d["status"]),
            Cell(_batch_text(a.get("batch_sizes"))))


def _batch_text(rows) -> str:
    return ", ".join(f"{r['batch_size']}: {r['status']}" for r in rows or [] if "batch_size" in r) or "-"


def _latency_row(r: dict) -> tuple[Cell, ...]:
    return (Cell(r["backend"], code=True), Cell(str(r["batch_size"])), Cell(r.get("timing") or "-"),
            Cell(f"{fmt(r['baseline_p50_ms'])} -> {fmt(r['run_p50_ms'])}"),
            Cell("-" if r["ratio"] is None else f"{r['ratio']:.3f} [{r['ci_low']:.3f}, {r['ci_high']:.3f}]"),
            Cell(r["status"], status=r["status"], note=r.get("reason", "") if r["status"] == Status.SKIPPED else ""))


def _flips_section(artifacts_: list[dict]) -> Section | None:
    rows = [(Cell(a["name"], code=True), Cell(f["image"], code=True), Cell(str(f["label"])),
             Cell(str(f["baseline"])), Cell(str(f["run"])))
            for a in artifacts_ for f in a.get("flipped", [])[:FLIPS_SHOWN]]
    if not rows:
        return None
    return Section("Images whose top-1 changed", paragraphs=(f"the first {FLIPS_SHOWN} per artifact; compare.json "
                                                             "lists them all",),
                   tables=(Table(("artifact", "image", "label", "baseline top-1", "run top-1"), tuple(rows)),), level=3)


def _class_section(artifacts_: list[dict]) -> Section | None:
    rows = [(Cell(a["name"], code=True), Cell(c["class"]), Cell(percent(c["baseline"])), Cell(percent(c["run"])),
             Cell(f"{100 * c['delta']:+.1f} pt"))
            for a in artifacts_ for c in a.get("per_class", []) if c["delta"]]
    if not rows:
        return None
    return Section("Per-class accuracy that changed", tables=(Table(("artifact", "class", "baseline", "run",
                                                                     "delta"), tuple(rows)),), level=3)


def sections(payload: dict) -> list[Section]:
    """The rows of compare.md and of the report's compare section."""
    env_rows = tuple((Cell(r["what"]), Cell(str(r["baseline"])), Cell(str(r["run"]))) for r in payload["environment"])
    out = [
        Section("Compared with the baseline", status=Status.PASSED if payload["passed"] else Status.FAILED,
                paragraphs=(f"baseline {payload['baseline']['path']} (made {payload['baseline'].get('created')}); "
                            f"{payload['images']} validation images; environment: {payload['environment_summary']}",),
                tables=(Table(("artifact", "verdict", "top-1 agreement", "flipped", "accuracy", "logit drift (scaled)",
                               "batch sizes"), tuple(_artifact_row(a) for a in payload["artifacts"])),)),
        Section("Environment changes", level=3,
                paragraphs=() if env_rows else ("none: the same versions, driver, GPU, CPU and ISA",),
                tables=(Table(("what", "baseline", "run"), env_rows),) if env_rows else ()),
        Section("Latency against the baseline", level=3,
                paragraphs=(f"ratio of medians with its {100 * payload['thresholds']['confidence']:g}% bootstrap "
                            f"interval; a regression only when the whole interval is above "
                            f"{payload['thresholds']['max_latency_ratio']}",),
                tables=(Table(("backend", "batch", "timing", "p50 ms", "ratio [interval]", "verdict"),
                              tuple(_latency_row(r) for r in payload["latency"])),) if payload["latency"] else ()),
    ]
    out += [s for s in (_flips_section(payload["artifacts"]), _class_section(payload["artifacts"])) if s]
    return out


def markdown(payload: dict) -> str:
    return tables.markdown(sections(payload), top=3)


def junit(payload: dict) -> str:
    cases = [(f"artifact.{a['name']}", a) for a in payload["artifacts"]] + \
            [(f"latency.{r['backend']}.b{r['batch_size']}.{r.get('timing') or ''}".rstrip("."), r)
             for r in payload["latency"]]
    failed = sum(1 for _, c in cases if c["status"] in (Status.FAILED, "missing"))
    suite = ET.Element("testsuite", name="pipeline.compare", tests=str(len(cases)), failures=str(failed),
                       errors="0", skipped=str(sum(1 for _, c in cases if c["status"] == Status.SKIPPED)),
                       timestamp=payload["created"])
    for name, c in cases:
        case = ET.SubElement(suite, "testcase", classname=f"compare.{payload['model']}", name=name)
        if c["status"] in (Status.FAILED, "missing"):
            ET.SubElement(case, "failure", type="BaselineDrift", message=c.get("reason") or c["status"])
        elif c["status"] == Status.SKIPPED:
            ET.SubElement(case, Status.SKIPPED, message=c.get("reason") or "")
    env = ET.SubElement(suite, "system-out")
    env.text = f"environment: {payload['environment_summary']}"
    ET.indent(suite)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(suite, encoding="unicode") + "\n"


def write_all(run_dir: RunDir, payload: dict) -> list[Path]:
    return verify_report.write_reports(run_dir, payload, markdown(payload), junit(payload), NAMES)


def failure_message(payload: dict) -> str:
    """exit 1's line: what crossed which threshold, and what changed in the environment."""
    parts = [f"{a['name']}: {a['reason']}" for a in payload["artifacts"] if a["status"] in (Status.FAILED, "missing")]
    parts += [f"{r['backend']} at batch {r['batch_size']}: {r['reason']}" for r in payload["latency"]
              if r["status"] == Status.FAILED]
    return (f"the run differs from the baseline: {'; '.join(parts)}; environment: {payload['environment_summary']}; "
            f"details in {artifacts.COMPARE_MD}")
