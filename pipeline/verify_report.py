"""verify.json (schema ``docs/verify.schema.json``), verify.md and verify.junit.xml.

verify.md is also appended to the file named by ``GITHUB_STEP_SUMMARY`` when that is set, so a
GitHub Actions job shows the table on its summary page.
"""

from __future__ import annotations

import math
import os
import xml.etree.ElementTree as ET
from pathlib import Path

from pipeline import env
from pipeline.run import RunDir, atomic_write, now, write_json

SCHEMA = "pipeline.verify/1"
JSON, MARKDOWN, JUNIT = "verify.json", "verify.md", "verify.junit.xml"


def _clean(value):
    """JSON has no NaN/Inf: write them as strings so the report stays valid JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def build_payload(cfg, card, candidates, localization, fallback, verdict, samples: int, batch_size: int) -> dict:
    return _clean({
        "schema": SCHEMA,
        "created": now(),
        "passed": verdict["passed"],
        "model": cfg.model.name,
        "reference": {"name": "torch_fp32", "precision": "fp32", "device": "cpu",
                      "what": "the trained PyTorch model in FP32 (eval mode)"},
        "inputs": {"what": "real validation images", "source": cfg.data.source, "samples": samples,
                   "batch_size": batch_size, "input_shape": ["batch", *card["spec"]["input_size"]]},
        "candidates": [
            {
                "name": c.name,
                "label": c.label,
                "precision": c.precision,
                "artifact": c.artifact,
                "required": c.required,
                "status": c.result["status"],
                "reason": c.result.get("reason"),
                "hint": c.result.get("hint"),
                "tolerance": c.result.get("tolerance"),
                "tensor_check": c.result.get("tensor_check"),
                "task_check": c.result.get("task_check"),
                "after_fallback": c.result.get("after_fallback", False),
            }
            for c in candidates
        ],
        "localization": localization,
        "fallback": fallback,
        "environment": {k: v for k, v in env.collect().items() if k in ("cpu", "gpu", "torch", "onnxruntime",
                                                                          "polygraphy", "modelopt", "tensorrt")},
    })


def fmt(value, spec=".3g") -> str:
    """A number for a table: 3 significant digits by default; None as '-'; strings as they are."""
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    return format(value, spec)


def markdown(payload: dict) -> str:
    verdict = "PASSED" if payload["passed"] else "FAILED"
    lines = [
        f"### Precision gate: {verdict} ({payload['model']})",
        "",
        f"Reference: PyTorch FP32. Inputs: {payload['inputs']['samples']} real validation images "
        f"({payload['inputs']['source']}).",
        "",
        "| candidate | precision | status | max abs err | max rel err | top-1 agreement | accuracy (ref) | tolerance |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in payload["candidates"]:
        t, k, tol = c.get("tensor_check") or {}, c.get("task_check") or {}, c.get("tolerance") or {}
        status = c["status"] + (" (required)" if c["required"] and c["status"] == "skipped" else "")
        if c["status"] in ("skipped", "error"):
            lines.append(f"| {c['name']} | {c['precision']} | {status}: {c.get('reason') or ''} | | | | | |")
            continue
        lines.append(
            f"| {c['name']} | {c['precision']} | {status} | {fmt(t.get('max_abs_error'))} | "
            f"{fmt(t.get('max_rel_error'))} | {fmt(100 * k['top1_agreement'], '.2f')}% | "
            f"{fmt(100 * k['accuracy'], '.2f')}% ({fmt(100 * k['reference_accuracy'], '.2f')}%) | "
            f"atol {tol.get('atol')}, rtol {tol.get('rtol')}, {tol.get('check_error_stat')} |")
    loc = payload.get("localization")
    if loc:
        first = loc.get("first_divergent")
        lines += ["", f"**Localisation** ({loc.get('method')}):",
                  f"first node over tolerance: `{first['name']}` ({first['op_type']})" if first
                  else "no single tensor exceeds the tolerance (the error builds up across layers)", "",
                  "| node | op | max abs err | max rel err | FP32 range | non-finite |", "|---|---|---|---|---|---|"]
        for row in loc.get("worst", []):
            lines.append(f"| `{row['name']}` | {row['op_type']} | {fmt(row['max_abs_error'])} | "
                         f"{fmt(row['max_rel_error'])} | [{fmt(row['fp32_min'])}, {fmt(row['fp32_max'])}] | "
                         f"{row['nonfinite']} |")
    fb = payload.get("fallback")
    if fb:
        lines += ["", f"**Automatic FP32 fallback**: {'passed' if fb['passed'] else 'did not pass'} after "
                      f"{len(fb['iterations'])} iteration(s); moved to FP32: "
                      + (", ".join(f"`{n}`" for n in fb["moved_to_fp32"]) or "none")
                  + f"; FP16 node fraction {100 * fb['fp16_fraction_before']:.1f}% -> "
                    f"{100 * fb['fp16_fraction_after']:.1f}%"]
    return "\n".join(lines) + "\n"


def junit(payload: dict) -> str:
    cases = payload["candidates"]
    failures = sum(1 for c in cases if c["status"] == "failed")
    errors = sum(1 for c in cases if c["status"] == "error" or (c["required"] and c["status"] == "skipped"))
    skipped = sum(1 for c in cases if c["status"] == "skipped" and not c["required"])
    suite = ET.Element("testsuite", name="pipeline.verify", tests=str(len(cases)), failures=str(failures),
                       errors=str(errors), skipped=str(skipped), timestamp=payload["created"])
    for c in cases:
        case = ET.SubElement(suite, "testcase", classname=f"verify.{payload['model']}", name=c["name"])
        t, k, tol = c.get("tensor_check") or {}, c.get("task_check") or {}, c.get("tolerance") or {}
        numbers = (f"max_abs_error={fmt(t.get('max_abs_error'))} max_rel_error={fmt(t.get('max_rel_error'))} "
                   f"atol={tol.get('atol')} rtol={tol.get('rtol')} stat={tol.get('check_error_stat')} "
                   f"failed_batches={len(t.get('failed_batches', []))}/{t.get('batches')} "
                   f"nonfinite={t.get('nonfinite')} top1_agreement={fmt(k.get('top1_agreement'))} "
                   f"accuracy_drop={fmt(k.get('accuracy_drop'))}") if t else ""
        if c["status"] == "failed":
            el = ET.SubElement(case, "failure", message=f"{c['name']} outside tolerance: {numbers}",
                               type="PrecisionCheckFailed")
            el.text = numbers
        elif c["status"] == "error":
            ET.SubElement(case, "error", message=c.get("reason") or "error", type="CandidateError")
        elif c["status"] == "skipped":
            if c["required"]:
                ET.SubElement(case, "error", message=f"required but unavailable: {c.get('reason')}",
                              type="BackendUnavailable")
            else:
                ET.SubElement(case, "skipped", message=c.get("reason") or "")
        if numbers:
            ET.SubElement(case, "system-out").text = numbers
    ET.indent(suite)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(suite, encoding="unicode") + "\n"


def write_all(run_dir: RunDir, payload: dict) -> list[Path]:
    write_json(run_dir.file(JSON), payload)
    md = markdown(payload)
    atomic_write(run_dir.file(MARKDOWN), md)
    atomic_write(run_dir.file(JUNIT), junit(payload))
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary:
        with open(summary, "a", encoding="utf-8") as f:
            f.write(md + "\n")
    return [run_dir.file(JSON), run_dir.file(MARKDOWN), run_dir.file(JUNIT)]
