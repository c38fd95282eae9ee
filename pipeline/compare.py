"""The compare stage: a release gate across runs. The run in the run directory against a baseline bundle.

``python -m pipeline compare --baseline PATH [--run-dir DIR]`` (and ``all`` after benchmark when
``compare.baseline`` is set) reads verify's per-image predictions and benchmark's raw latency samples of this run,
and the same of the bundle (:mod:`pipeline.baseline`), then judges, per artifact of the bundle, the prediction drift
and, per benchmark row present in both, the latency ratio (:mod:`pipeline.evaluation.drift`); it names every change in the
environment. Exit 1 when a threshold (``compare.*``) is crossed; a bundle of another model, class list, input
size or validation set is refused with exit 2. Reports: compare.json, compare.md, compare.junit.xml, the GitHub
step summary, and a section in report.html.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from pipeline.core.status import Status
from pipeline import baseline as bundle
from pipeline.core import artifacts
from pipeline.evaluation import drift
from pipeline.precision import gate as criteria
from pipeline.reports import compare_report
from pipeline.core.errors import CheckFailed, UsageError
from pipeline.evaluation.predictions import REFERENCE
from pipeline.core.run import RunDir, StageRecord, now, read_json

log = logging.getLogger("pipeline")


def _per_class(base: np.ndarray, run: np.ndarray, labels: np.ndarray, classes: list[str]) -> list[dict]:
    before = bundle.per_class_accuracy(base, labels, classes)
    after = bundle.per_class_accuracy(run, labels, classes)
    rows = []
    for c in classes:
        old, new = before[c], after[c]
        if old is not None and new is not None:  # the same labels: a class has images in both or in neither
            rows.append({"class": c, "baseline": old, "run": new, "delta": new - old})
    return rows


def compare_artifact(name: str, base: dict, run: dict, classes: list[str], cc, scale: float) -> dict:
    """One artifact of the bundle against the same candidate of this run, on the same images."""
    if f"{name}.top5_class" not in run:
        return {"name": name, "status": "missing", "reason": "passed verify in the baseline but has no verdict in "
                "this run (not run, skipped, or failed verify)"}
    base_top1, run_top1 = base[f"{name}.top5_class"][:, 0], run[f"{name}.top5_class"][:, 0]
    labels, names = run["labels"], run["names"]
    flips = np.flatnonzero(base_top1 != run_top1)
    result: dict = {
        "name": name,
        "agreement": drift.agreement(base_top1, run_top1, cc.min_top1_agreement, cc.confidence),
        "accuracy": drift.accuracy_change(base_top1, run_top1, labels, cc.max_accuracy_drop, cc.confidence),
        "drift": drift.drift_check(drift.logit_drift(base[f"{name}.top5_logit"], run[f"{name}.top5_logit"], scale),
                                   cc.drift_quantile, cc.max_logit_drift),
        "flipped": [{"image": str(names[i]), "label": classes[int(labels[i])], "baseline": classes[int(base_top1[i])],
                     "run": classes[int(run_top1[i])]} for i in flips],
        "per_class": _per_class(base_top1, run_top1, labels, classes),
    }
    failed = [k for k in ("agreement", "accuracy", "drift") if result[k]["status"] == Status.FAILED]
    result["status"] = Status.FAILED if failed else Status.PASSED
    if failed:
        result["reason"] = _reason(result, failed)
    return result


def _reason(result: dict, failed: list[str]) -> str:
    g, a, d = result["agreement"], result["accuracy"], result["drift"]
    text = {"agreement": f"top-1 agreement {100 * g['value']:.2f}% (min {100 * g['threshold']:.2f}%, upper bound "
                         f"{100 * g['upper_bound']:.2f}%): {len(result['flipped'])} images flipped",
            "accuracy": f"accuracy {100 * a['baseline_accuracy']:.2f}% -> {100 * a['accuracy']:.2f}% (max drop "
                        f"{100 * a['threshold']:.2f} points, lower bound {100 * a['lower_bound']:.2f})",
            "drift": f"logit drift {d['value']:.3g} at the {100 * d['quantile']:g}th-percentile image (max "
                     f"{d['threshold']:g} of the baseline's logit scale)"}
    return ", ".join(text[k] for k in failed)


def _row_key(row: dict) -> tuple:
    return row["backend"], row["batch_size"], row.get("timing")


def compare_latency(base_rows: list[dict], run_rows: list[dict], cc) -> list[dict]:
    """Every benchmark row present in both, with its ratio of medians and bootstrap interval."""
    run_by_key = {_row_key(r): r for r in run_rows if r.get("samples_ms")}
    out = []
    for i, base in enumerate(base_rows):
        run = run_by_key.get(_row_key(base))
        if run is None or not base.get("samples_ms"):
            continue
        fewest = min(len(base["samples_ms"]), len(run["samples_ms"]))
        if fewest < cc.min_samples:  # a median of a handful of runs says nothing about a regression
            out.append({"backend": base["backend"], "batch_size": base["batch_size"], "timing": base.get("timing"),
                        "status": Status.SKIPPED, "reason": f"{fewest} timed runs, fewer than compare.min_samples "
                        f"({cc.min_samples})", "baseline_p50_ms": float(np.median(base["samples_ms"])),
                        "run_p50_ms": float(np.median(run["samples_ms"])), "ratio": None, "ci_low": None,
                        "ci_high": None})
            continue
        check = drift.latency_check(base["samples_ms"], run["samples_ms"], max_ratio=cc.max_latency_ratio,
                                    resamples=cc.bootstrap_resamples, confidence=cc.confidence, seed=cc.seed + i)
        row = {"backend": base["backend"], "batch_size": base["batch_size"], "timing": base.get("timing"), **check}
        if check["status"] == Status.FAILED:
            row["reason"] = (f"median {check['baseline_p50_ms']:.4g} ms -> {check['run_p50_ms']:.4g} ms, ratio "
                             f"{check['ratio']:.2f} [{check['ci_low']:.2f}, {check['ci_high']:.2f}] above "
                             f"{cc.max_latency_ratio}")
        out.append(row)
    return out


def _run_latency(run_dir: RunDir) -> list[dict]:
    path = run_dir.file(artifacts.BENCHMARK_JSON)
    return read_json(path, "benchmark report").get("results", []) if path.is_file() else []


def build_payload(cfg, path: Path, meta: dict, base: dict, run: dict, run_env: dict, run_rows: list[dict]) -> dict:
    cc = cfg.compare
    scale = criteria.logit_scale(base[f"{REFERENCE}.top5_logit"])
    compared = [compare_artifact(a["name"], base, run, meta["classes"], cc, scale) for a in meta["artifacts"]]
    for entry, a in zip(compared, meta["artifacts"]):
        entry["batch_sizes"] = a.get("batch_sizes")
    changes = bundle.env_diff(meta["environment"], run_env)
    return {
        "schema": compare_report.SCHEMA, "created": now(), "model": meta["model"],
        "baseline": {"path": str(path), "created": meta.get("created"), "run_dir": meta.get("run_dir")},
        "thresholds": cc.model_dump(exclude={"baseline"}), "images": int(len(run["names"])),
        "environment": changes, "environment_summary": bundle.describe_env_diff(changes),
        "artifacts": compared, "latency": compare_latency(meta["latency"], run_rows, cc),
    }


def run(cfg, run_dir: RunDir, record: StageRecord, *, baseline: str | None = None) -> None:
    where = baseline or cfg.compare.baseline
    if not where:
        raise UsageError("no baseline to compare with: pass --baseline PATH or set compare.baseline "
                         "(write one with `python -m pipeline baseline --run-dir DIR --out PATH`)")
    path = Path(where).expanduser()
    meta, base = bundle.read(path)
    card = read_json(run_dir.require(artifacts.MODEL_CARD, "train", "compare"), "model card")
    current = bundle.run_predictions(run_dir, "compare")
    bundle.check_compatible(meta, card, current["names"], base["names"])
    run_env = bundle.environment((run_dir.manifest or {}).get("environment") or {})
    payload = build_payload(cfg, path, meta, base, current, run_env, _run_latency(run_dir))
    failed = [a for a in payload["artifacts"] if a["status"] in (Status.FAILED, "missing")] + \
        [r for r in payload["latency"] if r["status"] == Status.FAILED]
    payload["passed"] = not failed
    for p in compare_report.write_all(run_dir, payload):
        record.artifact(p.name)
    record.details.update({"passed": payload["passed"], "baseline": str(path),
                           "artifacts": {a["name"]: a["status"] for a in payload["artifacts"]},
                           "latency_regressions": [f"{r['backend']}@{r['batch_size']}" for r in payload["latency"]
                                                   if r["status"] == Status.FAILED],
                           "environment": payload["environment_summary"]})
    log.info("compare: %s against %s; environment: %s", Status.PASSED if payload["passed"] else "FAILED", path,
             payload["environment_summary"])
    if failed:
        raise CheckFailed(compare_report.failure_message(payload))
