"""The stage table, input fingerprints, and running stages (one at a time or ``all`` in order).

``all`` calls exactly the same stage functions as the subcommands. With nothing changed, a
stage whose fingerprint (its config sections, the sha256 of its input artifacts, the code
and library versions, and the relevant hardware) matches the manifest, and whose recorded
outputs still hash the same, is skipped; a change re-runs that stage and, through the new
artifact hashes, everything downstream of it.
"""

from __future__ import annotations

import contextvars
import hashlib
import importlib
import importlib.util
import json
import logging
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from pipeline import env
from pipeline.errors import BackendUnavailable
from pipeline.run import RunDir, sha256_file

log = logging.getLogger("pipeline")

ORDER = ("train", "export", "build", "verify", "benchmark")

# The stage currently running, for error messages ("error: export: ...").
current_stage: contextvars.ContextVar[str] = contextvars.ContextVar("current_stage", default="pipeline")


@dataclass(frozen=True)
class Stage:
    name: str
    module: str  # pipeline.<module>.run(cfg, run_dir, record, **options)
    config_keys: tuple[str, ...]
    inputs: tuple[str, ...]  # artifact files whose hashes enter the fingerprint (when present)
    after: tuple[str, ...]  # upstream stages: when one of them re-runs, this stage re-runs too

    def function(self) -> Callable:
        return importlib.import_module(f"pipeline.{self.module}").run


STAGES = {
    "train": Stage("train", "train", ("model", "data", "train"), (), ()),
    "export": Stage("export", "export", ("model", "data", "export"),
                    ("model.safetensors", "model.json", "fp16_fallback.json"), ("train",)),
    "build": Stage("build", "build", ("build", "require"), ("model.fp16.onnx",), ("export",)),
    "verify": Stage("verify", "verify", ("model", "data", "verify", "require"),
                    ("model.safetensors", "model.json", "model.onnx", "model.fp16.onnx", "model.fp16.engine"),
                    ("train", "export", "build")),
    # Benchmark shows verify's verdicts, so those (not verify's whole report) enter its fingerprint:
    # a tolerance change that does not flip a verdict does not re-time anything.
    "benchmark": Stage("benchmark", "benchmark", ("model", "data", "benchmark"),
                       ("model.safetensors", "model.onnx", "model.fp16.onnx", "model.fp16.engine"),
                       ("train", "export", "build")),
}


# --------------------------------------------------------------------------- fingerprints


def _source_files(cfg) -> list[Path]:
    roots = [Path(__file__).parent, Path(importlib.util.find_spec("models").origin).parent]
    files = sorted(p for root in roots for p in root.rglob("*.py"))
    name = cfg.model.name
    if ":" in name:  # a user model: its source is part of the code version
        module = name.rpartition(":")[0]
        if module.endswith(".py"):
            files.append(Path(module).expanduser().resolve())
        else:
            try:
                spec = importlib.util.find_spec(module)
                if spec and spec.origin:
                    files.append(Path(spec.origin))
            except (ImportError, ValueError):
                pass
    return files


def code_version(cfg) -> str:
    digest = hashlib.sha256()
    for path in _source_files(cfg):
        if path.is_file():
            digest.update(path.name.encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _libraries() -> dict:
    return {name: env.package_version(name) for name in
            ("torch", "onnx", "onnxruntime", "onnxruntime-gpu", "polygraphy", "nvidia-modelopt", "tensorrt",
             "tensorrt-cu12", "tensorrt-cu13")}


def _hardware(stage: str) -> dict:
    if stage == "build":
        trt, reason = env.tensorrt_status()
        return {"tensorrt": getattr(trt, "__version__", reason), "gpu": _gpu_name()}
    if stage == "benchmark":
        return {"cpu": env.cpu_model(), "cores": env.usable_cores(), "gpu": _gpu_name(),
                "tensorrt": getattr(env.tensorrt_status()[0], "__version__", None)}
    if stage == "verify":
        return {"gpu": _gpu_name(), "tensorrt": getattr(env.tensorrt_status()[0], "__version__", None)}
    return {}


def _gpu_name() -> str | None:
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else None


def fingerprint(stage: Stage, cfg, run: RunDir) -> str:
    config = cfg.to_dict()
    payload = {
        "stage": stage.name,
        "config": {key: config[key] for key in stage.config_keys},
        "inputs": {name: sha256_file(run.file(name)) if run.file(name).is_file() else None for name in stage.inputs},
        "code": code_version(cfg),
        "libraries": _libraries(),
        "hardware": _hardware(stage.name),
        # Each execution of a stage gets a new run id, so downstream stages re-run after it even
        # when it reproduced byte-identical outputs.
        "upstream_runs": {name: (run.stage_entry(name) or {}).get("run_id") for name in stage.after},
    }
    if stage.name == "benchmark":
        from pipeline.verify_report import read_verdicts

        payload["verify"] = read_verdicts(run)  # benchmark shows them; the rest of verify's report does not matter
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


def up_to_date(stage: Stage, cfg, run: RunDir) -> tuple[bool, str]:
    """Whether ``stage`` can be skipped: same fingerprint, finished, outputs still intact."""
    entry = run.stage_entry(stage.name)
    if not entry or entry.get("status") not in ("ok", "skipped"):
        return False, "not run yet" if not entry else f"last run {entry.get('status')}"
    if entry.get("fingerprint") != fingerprint(stage, cfg, run):
        return False, "inputs changed"
    for name, info in entry.get("artifacts", {}).items():
        path = run.file(name)
        if not path.is_file() or sha256_file(path) != info["sha256"]:
            return False, f"{name} is missing or was modified"
    return True, ""


# --------------------------------------------------------------------------- running


def run_stage(name: str, cfg, run: RunDir, **options) -> dict:
    """Run one stage with manifest bookkeeping; returns its manifest entry."""
    stage = STAGES[name]
    token = current_stage.set(name)
    with run.stage(name, fingerprint(stage, cfg, run)) as record:
        record.entry["run_id"] = uuid.uuid4().hex
        if "cuda" in cfg.require:
            ok, reason = env.cuda_status()
            if not ok:
                raise BackendUnavailable(f"CUDA required but {reason}")
        stage.function()(cfg, run, record, **options)
    current_stage.reset(token)  # left set on failure, so the CLI can name the stage that failed
    if (run.stage_entry(name).get("details") or {}).get("replaced_artifacts"):
        _follow_replacement(name, cfg, run)
    return run.stage_entry(name)


def _follow_replacement(name: str, cfg, run: RunDir) -> None:
    """A stage replaced an upstream artifact (verify --auto-fallback: model.fp16.onnx). Re-run the stages
    that produce and consume it, so every manifest entry describes the files on disk; then the
    replacing stage is current again, or re-runs where the model or the engine it judged changed."""
    replaced = run.stage_entry(name)["details"]["replaced_artifacts"]
    log.info("%s replaced %s: re-running export and build", name, ", ".join(replaced))
    judged = {artifact: sha256_file(run.file(artifact)) for artifact in replaced}
    run_stage("export", cfg, run)  # keeps the replacement: the moved nodes are in fp16_fallback.json
    built = run_stage("build", cfg, run)["status"] == "ok"
    if built or any(sha256_file(run.file(a)) != h for a, h in judged.items()):
        run_stage(name, cfg, run)  # judge what is on disk now (a rebuilt engine included)
    else:
        run.stage_entry(name)["fingerprint"] = fingerprint(STAGES[name], cfg, run)
        run.save_manifest()


def run_all(cfg, run: RunDir, *, force: set[str] | None = None, options: dict | None = None) -> dict:
    """train -> export -> build -> verify -> benchmark; unchanged stages are skipped unless forced."""
    force = force or set()
    options = options or {}
    for name in ORDER:
        stage = STAGES[name]
        if name not in force:
            fresh, why = up_to_date(stage, cfg, run)
            if fresh:
                entry = run.stage_entry(name)
                log.info("%s: unchanged since %s, skipped (--force %s re-runs it)", name, entry.get("ended"), name)
                continue
            log.debug("%s: %s", name, why)
        run_stage(name, cfg, run, **options.get(name, {}))
    return run.manifest
