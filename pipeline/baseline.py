"""The baseline bundle: a small, reviewable record of a verified run that later runs are compared with.

``python -m pipeline baseline --run-dir DIR --out PATH`` writes a folder of two files, fit to commit:

* ``baseline.json`` (schema ``pipeline.baseline/1``): the model card, the config, the environment (torch, ONNX
  Runtime, OpenVINO, TensorRT, the driver, the GPU, the CPU and its ISA), per artifact that passed verify's gate
  its accuracy, per-class accuracy and batch-size rows, and every benchmark row with its raw latency samples;
* ``predictions.npz``: per validation image its name and label, and per passed artifact (and the FP32 reference)
  the top-5 classes with their logits (:mod:`pipeline.evaluation.predictions`).

:func:`read` validates a bundle, and :func:`check_compatible` refuses (exit 2, one line) one from another model,
another class list or another input size, or made on other validation images.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from pipeline.core.status import Status
from pipeline.core import artifacts, env
from pipeline.evaluation import predictions
from pipeline.core.errors import InputError, UsageError
from pipeline.core.run import RunDir, atomic_write, now, read_json, sha256_file

SCHEMA = "pipeline.baseline/1"
META = "baseline.json"
PREDICTIONS = "predictions.npz"
# The CPU features that change which kernels a runtime picks (and so its numbers): recorded and diffed.
ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile", "amx_bf16", "amx_int8")


# --------------------------------------------------------------------------- the environment


def environment(collected: dict) -> dict:
    """The facts a comparison names when they change, flat: versions, driver, GPU, CPU and ISA."""
    gpu = collected.get("gpu") or {}
    flags = env.cpu_flags()
    return {
        "torch": collected.get("torch"), "onnxruntime": collected.get("onnxruntime"),
        "openvino": collected.get("openvino"), "tensorrt": collected.get("tensorrt"),
        "polygraphy": collected.get("polygraphy"), "onnx": collected.get("onnx"),
        "driver": gpu.get("driver"), "gpu": gpu.get("name"), "cpu": collected.get("cpu"),
        "cpu_isa": " ".join(f for f in ISA_FLAGS if f in flags) or None,
    }


def env_diff(before: dict, after: dict) -> list[dict]:
    """Every key whose value changed: ``{"what", "baseline", "run"}``; versions printed as "10.13 -> 11.4"."""
    return [{"what": key, "baseline": before.get(key), "run": after.get(key)}
            for key in sorted(set(before) | set(after)) if before.get(key) != after.get(key)]


def describe_env_diff(rows: list[dict]) -> str:
    """One phrase: "tensorrt 10.13 -> 11.4, driver 580 -> 590"; "no change" when empty."""
    return ", ".join(f"{r['what']} {r['baseline'] or '(none)'} -> {r['run'] or '(none)'}" for r in rows) or \
        "no change"


# --------------------------------------------------------------------------- reading a run


def _verify_payload(run: RunDir) -> dict:
    from pipeline.reports import verify_report

    run.require(artifacts.VERIFY_JSON, "verify", "baseline")
    verdicts = verify_report.read_verdicts(run) or {}
    payload = read_json(run.file(artifacts.VERIFY_JSON), "verify report")
    passed = [c for c in payload.get("candidates", []) if verdicts.get(c["name"]) == Status.PASSED]
    if not passed:
        raise UsageError(f"{run.path}: no candidate passed verify's gate for the files there now "
                         "(run verify first): nothing to baseline")
    return {**payload, "candidates": passed}


def run_predictions(run: RunDir, consumer: str) -> dict[str, np.ndarray]:
    """The run's ``verify.predictions.npz``, only if it is the file verify wrote (its manifest sha256)."""
    path = run.require(artifacts.VERIFY_PREDICTIONS, "verify", consumer)
    recorded = ((run.stage_entry("verify") or {}).get("artifacts") or {}).get(artifacts.VERIFY_PREDICTIONS) or {}
    if recorded.get("sha256") != sha256_file(path):
        raise InputError(f"{path} is not the file verify wrote (its sha256 differs from the manifest's): re-run verify")
    return predictions.read(path)


def per_class_accuracy(top1: np.ndarray, labels: np.ndarray, classes: list[str]) -> dict[str, float | None]:
    """Accuracy per class over the images of that class (None for a class without validation images)."""
    return {name: (float(np.mean(top1[labels == i] == i)) if np.any(labels == i) else None)
            for i, name in enumerate(classes)}


def _latency_rows(run: RunDir) -> list[dict]:
    """benchmark.json's rows with their raw samples ([] when benchmark has not run)."""
    path = run.file(artifacts.BENCHMARK_JSON)
    if not path.is_file():
        return []
    rows = read_json(path, "benchmark report").get("results", [])
    keep = ("backend", "precision", "device", "batch_size", "timing", "verify", "samples_ms")
    return [{k: r.get(k) for k in keep} for r in rows if r.get("samples_ms")]


def _artifact_entry(candidate: dict, preds: dict, classes: list[str]) -> dict:
    name = candidate["name"]
    top1 = preds[f"{name}.top5_class"][:, 0]
    return {"name": name, "precision": candidate["precision"], "artifact": candidate["artifact"],
            "artifact_sha256": candidate["artifact_sha256"],
            "accuracy": float(np.mean(top1 == preds["labels"])),
            "per_class_accuracy": per_class_accuracy(top1, preds["labels"], classes),
            "batch_sizes": candidate.get("batch_sizes")}


# --------------------------------------------------------------------------- writing and reading a bundle


def write(run: RunDir, out: Path) -> Path:
    """The bundle of ``run`` in the folder ``out`` (created; an existing bundle there is replaced)."""
    from pipeline import config as config_mod

    card = read_json(run.require(artifacts.MODEL_CARD, "train", "baseline"), "model card")
    verify = _verify_payload(run)
    preds = run_predictions(run, "baseline")
    names = [c["name"] for c in verify["candidates"] if f"{c['name']}.top5_class" in preds]
    meta = {
        "schema": SCHEMA, "created": now(), "run_dir": str(run.path), "model": card["model"],
        "classes": card["classes"], "input_size": card["spec"]["input_size"], "model_card": card,
        "config": config_mod.load_yaml_file(run.file(artifacts.CONFIG)) if run.file(artifacts.CONFIG).is_file()
        else None,
        "environment": environment((run.manifest or {}).get("environment") or env.collect()),
        "images": len(preds["names"]),
        "artifacts": [_artifact_entry(c, preds, card["classes"]) for c in verify["candidates"] if c["name"] in names],
        "latency": _latency_rows(run),
    }
    keep = {"names", "labels"} | {f"{n}.{part}" for n in (predictions.REFERENCE, *names)
                                  for part in ("top5_class", "top5_logit")}
    if out.exists() and not (out / META).is_file():
        raise UsageError(f"{out} exists and is not a baseline bundle: choose another --out")
    out.mkdir(parents=True, exist_ok=True)
    predictions.write(out / PREDICTIONS, {k: v for k, v in preds.items() if k in keep})
    atomic_write(out / META, json.dumps(meta, indent=1, sort_keys=False, default=str) + "\n")
    return out


def read(path: Path) -> tuple[dict, dict[str, np.ndarray]]:
    """A bundle's metadata and predictions; anything else is an :class:`InputError` (exit 2) in one line."""
    if not (path / META).is_file():
        raise InputError(f"{path} is not a baseline bundle (no {META}); write one with "
                         "`python -m pipeline baseline --run-dir DIR --out PATH`")
    meta = read_json(path / META, "baseline bundle")
    if not isinstance(meta, dict) or meta.get("schema") != SCHEMA:
        found = meta.get("schema") if isinstance(meta, dict) else type(meta).__name__
        raise InputError(f"{path / META}: schema {found!r}, expected {SCHEMA!r}")
    missing = [k for k in ("model", "classes", "input_size", "environment", "artifacts", "latency") if k not in meta]
    if missing:
        raise InputError(f"{path / META} lacks {', '.join(missing)}: not a complete baseline bundle")
    return meta, predictions.read(path / PREDICTIONS)


def check_compatible(meta: dict, card: dict, names: np.ndarray, baseline_names: np.ndarray) -> None:
    """Refuse a bundle of another model, class list, input size or validation set (exit 2, one line)."""
    if meta["model"] != card["model"]:
        raise InputError(f"the baseline is of model {meta['model']!r}, this run of {card['model']!r}")
    if list(meta["classes"]) != list(card["classes"]):
        raise InputError(f"the baseline's classes {_short(meta['classes'])} differ from this run's "
                         f"{_short(card['classes'])}")
    if list(meta["input_size"]) != list(card["spec"]["input_size"]):
        raise InputError(f"the baseline's input size {'x'.join(map(str, meta['input_size']))} differs from this "
                         f"run's {'x'.join(map(str, card['spec']['input_size']))}")
    if list(baseline_names) != list(names):
        raise InputError(f"the baseline was made on other validation images ({len(baseline_names)} images, this run "
                         f"verified {len(names)}): compare needs the same data and verify.samples")


def _short(items: list) -> str:
    return str(items) if len(items) <= 6 else f"[{', '.join(map(str, items[:5]))}, ... ({len(items)} classes)]"

