"""verify.json (schema ``docs/verify.schema.json``), verify.md and verify.junit.xml.

verify.md is also appended to the file named by ``GITHUB_STEP_SUMMARY`` when that is set, so a
GitHub Actions job shows the table on its summary page.
"""

from __future__ import annotations

import math
import os
import xml.etree.ElementTree as ET
from pathlib import Path

from pipeline import env, tables
from pipeline.run import RunDir, atomic_write, now, write_json
from pipeline.tables import fmt

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


def markdown(payload: dict) -> str:
    """verify.md: the report's precision-gate rows (``tables.verify_sections``), as Markdown."""
    return tables.markdown(tables.verify_sections(payload), top=3)


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
