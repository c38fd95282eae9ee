"""The deploy stage: a Triton model repository of every artifact that passed the gate, and (``--serve``) one of them
served by a real Triton on this machine, checked through the gate and timed from the client's side.

``python -m pipeline deploy --target triton --out DIR [--serve]``: per deployable verify candidate whose verdict counts
as passed (:func:`pipeline.core.deployment.refusal` says why any other is refused), a model folder
``DIR/<candidate>/`` with ``config.pbtxt`` (Triton's ``ModelConfig``: names, types and dims read from the artifact,
``max_batch_size``, the dynamic batcher's preferred sizes from benchmark's throughput curve, the instance group of its
device), ``1/<model file>`` and ``pipeline.json`` (the verdict and the sha256 it was given for). Every
``config.pbtxt`` is parsed back as ``ModelConfig`` and compared with the artifact before the repository is put in
place, whole (built beside ``DIR``, then renamed). Engines are checked against ``deploy.triton_release`` first.

``deploy.json`` in the run directory records what was written, refused, served and measured (the report's serving
section). docs/deploy.md explains the layout, the version table and what runs where.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from pydantic import Field

from pipeline.core import artifacts as a
from pipeline.core import deployment, env, schema
from pipeline.core.errors import CheckFailed, InputError, UsageError
from pipeline.core.run import RunDir, StageRecord, now, sha256_file, write_json
from pipeline.core.status import Status
from pipeline.reports import verify_report
from pipeline.runtime import backends, triton
from pipeline.runtime.backends import Backend

if TYPE_CHECKING:  # annotations only
    from pipeline.core.config_schema import Config

log = logging.getLogger("pipeline")

SIDECAR_SCHEMA = "pipeline.triton/1"
SCHEMA = "pipeline.deploy/1"


@dataclass(frozen=True)
class Format:
    """How Triton runs one kind of artifact."""

    platform: str
    backend: str
    filename: str


PLAN = Format("tensorrt_plan", "", "model.plan")
ONNX = Format("", "onnxruntime", "model.onnx")
IR = Format("", "openvino", "model.xml")
# The verify candidates that are deployments (the runtime Triton runs, on the artifact verify judged). The FP16
# emulation and the exact INT8 run are proxies verify uses for TensorRT, not something a server runs.
DEPLOYMENTS = {"tensorrt_fp16": PLAN, "tensorrt_int8": PLAN, "onnxrt_fp32": ONNX, "onnxrt_fp16_cpu": ONNX,
               "onnxrt_int8_cpu": ONNX, "onnxrt_cuda_fp16": ONNX, "openvino_fp32": IR, "openvino_bf16": IR,
               "openvino_int8": IR}
PROXIES = frozenset({"fp16_emulation", "int8_exact"})


@dataclass(frozen=True)
class Planned:
    """One deployable candidate: its table entry, how Triton runs it, and why it is refused ("" when it is not)."""

    backend: Backend
    format: Format
    refused: str
    verdict: str | None
    sha256: str | None  # what its verdict is bound to (verify_report.artifact_sha256)

    @property
    def name(self) -> str:
        return self.backend.candidate


# --------------------------------------------------------------------------- the stage


def run(cfg: Config, run_dir: RunDir, record: StageRecord, *, target: str | None = None, out: str | None = None,
        serve: bool = False) -> None:
    if (target or cfg.deploy.target) != "triton":
        raise UsageError(f"deploy --target {target}: the only target is triton")
    repository = _repository_path(cfg, run_dir, out)
    plans = plan(run_dir)
    chosen = [p for p in plans if not p.refused]
    for p in plans:
        if p.refused and p.verdict != Status.SKIPPED:
            log.warning("deploy: refused %s", p.refused)
    tensorrt = _check_release(cfg, run_dir, chosen)
    if not chosen:
        raise InputError("nothing to deploy: no artifact passed the gate (" + "; ".join(p.refused for p in plans) + ")")
    if serve and cfg.deploy.serve_candidate not in {p.name for p in chosen}:
        raise UsageError(f"deploy --serve: {cfg.deploy.serve_candidate} (deploy.serve_candidate) is not among the "
                         f"models deployed ({', '.join(p.name for p in chosen)}); set deploy.serve_candidate")
    curves = benchmark_curves(run_dir)
    models = write_repository(cfg, run_dir, chosen, curves, repository)
    payload = {"schema": SCHEMA, "created": now(), "target": "triton", "repository": str(repository),
               "models": [_model_entry(m, p) for m, p in models],
               "refused": [{"candidate": p.name, "verdict": p.verdict, "reason": p.refused}
                           for p in plans if p.refused],
               "compatibility": {"tensorrt": tensorrt, "releases": deployment.describe_releases(tensorrt),
                                 "target_release": cfg.deploy.triton_release, "source": deployment.RELEASES_SOURCE}}
    if serve:
        model, planned = next((m, p) for m, p in models if p.name == cfg.deploy.serve_candidate)
        payload["serve"] = serve_and_check(cfg, run_dir, model, planned)
    write_json(run_dir.file(a.DEPLOY_JSON), payload)
    record.artifact(a.DEPLOY_JSON)
    record.details.update(_details(payload))
    log.info("deploy: wrote %s: %s", repository, ", ".join(m.name for m, _ in models))
    if serve and payload["serve"]["verdict"] != Status.PASSED:
        raise CheckFailed(f"served outputs of {cfg.deploy.serve_candidate} do not pass the gate against the verified "
                          f"artifact's: {payload['serve']['reason']}")


def _repository_path(cfg: Config, run_dir: RunDir, out: str | None) -> Path:
    given = out or cfg.deploy.out
    if not given:
        raise UsageError("deploy needs the repository folder: --out DIR (or deploy.out)")
    path = Path(given).absolute()
    if path == run_dir.path.absolute() or run_dir.path.absolute() in path.parents:
        raise UsageError(f"deploy --out {given}: the repository must be outside the run directory")
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        raise UsageError(f"deploy --out {given}: not a folder (a link or a file); name a folder")
    if path.is_dir() and not ours(path):
        raise UsageError(f"deploy --out {given}: the folder has files deploy did not write; name an empty or new "
                         "folder, or a repository deploy wrote (it is replaced whole)")
    return path


def ours(path: Path) -> bool:
    """Whether ``path`` is empty or a repository deploy wrote (every entry a model folder with its sidecar)."""
    return all(entry.is_dir() and not entry.is_symlink() and (entry / a.TRITON_SIDECAR).is_file()
               for entry in path.iterdir())


def _details(payload: dict) -> dict:
    details = {"repository": payload["repository"], "models": [m["name"] for m in payload["models"]],
               "refused": [r["candidate"] for r in payload["refused"] if r["verdict"] != Status.SKIPPED]}
    if "serve" in payload:
        details["served"] = payload["serve"]["verdict"]
    return details


# --------------------------------------------------------------------------- what is deployed


def plan(run_dir: RunDir) -> list[Planned]:
    """Every deployable candidate with verify's verdict for the files here now, refused unless it counts as passed."""
    _check_verify_finished(run_dir)
    verdicts = verify_report.read_verdicts(run_dir) or {}
    policy = verify_report.read_policy(run_dir)
    plans = []
    for backend in backends.candidates():
        if backend.candidate not in DEPLOYMENTS:
            continue
        verdict = verdicts.get(backend.candidate)
        plans.append(Planned(backend, DEPLOYMENTS[backend.candidate],
                             deployment.refusal(backend.candidate, verdict, policy), verdict,
                             verify_report.artifact_sha256(run_dir, backend.artifact)))
    return plans


def _check_verify_finished(run_dir: RunDir) -> None:
    """verify.json must be the file a finished verify wrote: one that ended ok, or failed its gate (exit 1: every
    verdict was reached, and a failed one is refused here); not one edited or left by a verify that broke off."""
    path = run_dir.require(a.VERIFY_JSON, "verify", "deploy")
    entry = run_dir.stage_entry("verify") or {}
    finished = entry.get("status") == Status.OK or (entry.get("status") == Status.FAILED
                                                    and entry.get("exit_code") == 1)
    recorded = run_dir.recorded_artifacts("verify").get(a.VERIFY_JSON)
    if not finished or recorded != sha256_file(path):
        raise InputError(f"{a.VERIFY_JSON} is not the report of a verify that finished here (its sha256 differs from "
                         "the manifest's, or verify broke off): re-run verify")


def _check_release(cfg: Config, run_dir: RunDir, chosen: list[Planned]) -> str | None:
    """The TensorRT of the engines deployed (None without one); refused (exit 2) before anything is written when
    ``deploy.triton_release`` ships another."""
    versions = {_engine_tensorrt(run_dir, p) for p in chosen if p.format is PLAN}
    if len(versions) > 1:
        raise InputError(f"the engines were built with different TensorRT versions ({', '.join(sorted(versions))}); "
                         "rebuild them with one")
    tensorrt = next(iter(versions), None)
    refused = deployment.release_refusal(tensorrt, cfg.deploy.triton_release)
    if refused:
        raise UsageError(f"refusing to write the repository: {refused}")
    if tensorrt is not None:
        log.info("deploy: %s", deployment.describe_releases(tensorrt))
    return tensorrt


def _engine_tensorrt(run_dir: RunDir, p: Planned) -> str:
    from pipeline.runtime import tensorrt_engine

    _, sidecar = tensorrt_engine.load_engine_bytes(run_dir, engine=p.backend.artifact)
    return str(sidecar.get("tensorrt"))


class _Row(schema.Open):
    backend: str = Field(max_length=200)
    batch_size: int = Field(ge=1)
    throughput_per_s: float | None = None
    timing: str = Field("", max_length=400)


class _Benchmark(schema.Open):
    results: list[_Row] = Field(default_factory=list, max_length=100_000)


def benchmark_curves(run_dir: RunDir) -> dict[str, list[tuple[int, float]]]:
    """Per benchmarked backend, its synchronous throughput per batch size (benchmark.json, only as benchmark wrote
    it); empty without a benchmark."""
    path = run_dir.file(a.BENCHMARK_JSON)
    if not path.is_file():
        return {}
    if run_dir.recorded_sha256("benchmark", a.BENCHMARK_JSON) != sha256_file(path):
        raise InputError(f"{a.BENCHMARK_JSON} is not the file benchmark wrote: re-run benchmark")
    curves: dict[str, list[tuple[int, float]]] = {}
    for row in schema.read_json(path, _Benchmark, "benchmark report").results:
        if row.throughput_per_s and not row.timing.startswith("throughput"):  # async rows: not what a batch costs
            curves.setdefault(row.backend, []).append((row.batch_size, row.throughput_per_s))
    return curves


# --------------------------------------------------------------------------- the repository


def write_repository(cfg: Config, run_dir: RunDir, chosen: list[Planned], curves: dict,
                     repository: Path) -> list[tuple[triton.Model, Planned]]:
    """Every chosen model written into a folder beside ``repository``, each config parsed back and checked, then
    the folder put in ``repository``'s place (an older repository deploy wrote is replaced whole)."""
    repository.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{repository.name}.", dir=repository.parent))
    try:
        models = [(_write_model(cfg, run_dir, p, curves, staging / p.name), p) for p in chosen]
        _swap(staging, repository)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return models


def _swap(staging: Path, repository: Path) -> None:
    old = None
    if repository.exists():
        old = repository.with_name(f".{repository.name}.old.{os.getpid()}")
        repository.rename(old)
    try:
        staging.rename(repository)
    except OSError:
        if old is not None:
            old.rename(repository)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _write_model(cfg: Config, run_dir: RunDir, p: Planned, curves: dict, folder: Path) -> triton.Model:
    files, signature = _artifact_files(run_dir, p)
    bound = _binding(p, files)
    if bound != p.sha256:
        raise InputError(f"{p.backend.artifact} changed while deploy read it "
                         "(its sha256 is not the one verify judged); "
                         "re-run verify, then deploy")
    model = _model(cfg, p, signature, curves.get(p.backend.name, []))
    version = folder / a.TRITON_VERSION
    version.mkdir(parents=True)
    for name, data in files.items():
        (version / name).write_bytes(data)
    text = triton.to_text(triton.build_config(model))
    (folder / a.TRITON_CONFIG).write_text(text, encoding="utf-8")
    _check_config(folder / a.TRITON_CONFIG, model)
    sidecar = {"schema": SIDECAR_SCHEMA, "candidate": p.name, "verdict": p.verdict, "verdict_sha256": p.sha256,
               "artifact": p.backend.artifact, "run": str(run_dir.path.absolute()), "precision": p.backend.precision,
               "device": p.backend.device, "files": {f"{a.TRITON_VERSION}/{n}": hashlib.sha256(d).hexdigest()
                                                     for n, d in files.items()}}
    (folder / a.TRITON_SIDECAR).write_text(json.dumps(sidecar, indent=2) + "\n", encoding="utf-8")
    return model


def _check_config(path: Path, model: triton.Model) -> None:
    """The file as Triton parses it describes the artifact: else the repository is not put in place (exit 4)."""
    problems = triton.mismatches(triton.parse(path.read_text(encoding="utf-8"), path), model)
    if problems:
        raise CheckFailed(f"{path.parent.name}/{path.name} does not describe its artifact: {'; '.join(problems)}")


def _artifact_files(run_dir: RunDir, p: Planned) -> tuple[dict[str, bytes], triton.Signature]:
    """The model files' bytes (through the loaders that check them) and the signature read from those bytes."""
    artifact = p.backend.artifact
    if p.format is IR:
        from pipeline.runtime import openvino_ir

        xml, weights, _ = openvino_ir.load(run_dir, p.backend.precision)
        return {"model.xml": xml, "model.bin": weights}, triton.openvino_signature(xml, weights)
    if p.format is PLAN:
        from pipeline.runtime import tensorrt_engine

        data, _ = tensorrt_engine.load_engine_bytes(run_dir, engine=artifact)
        return {"model.plan": data}, triton.engine_signature(data)
    path = run_dir.require(artifact, "export", "deploy")
    data = path.read_bytes()
    if run_dir.recorded_sha256("export", artifact) not in (None, hashlib.sha256(data).hexdigest()):
        raise InputError(f"{artifact} is not the file export wrote: re-run export")
    return {"model.onnx": data}, triton.onnx_signature(path)


def _binding(p: Planned, files: dict[str, bytes]) -> str:
    """The sha256 a verdict is bound to, of the bytes written (an IR's: over its .xml and .bin)."""
    digests = {name: hashlib.sha256(data).hexdigest() for name, data in files.items()}
    if p.format is IR:
        return hashlib.sha256(f"{digests['model.xml']} {digests['model.bin']}".encode()).hexdigest()
    return next(iter(digests.values()))


def _model(cfg: Config, p: Planned, signature: triton.Signature, curve: list[tuple[int, float]]) -> triton.Model:
    largest = deployment.max_batch_size(batch_dim=signature.batch_dim, profile_max=signature.profile_max,
                                        served_max=cfg.build.max_batch)
    preferred = deployment.preferred_batch_sizes(curve, largest, cfg.deploy.preferred_fraction) if largest else ()
    return triton.Model(name=p.name, platform=p.format.platform, backend=p.format.backend,
                        filename=p.format.filename, signature=signature, max_batch_size=largest,
                        preferred_batch_sizes=preferred, max_queue_delay_us=cfg.deploy.max_queue_delay_us,
                        gpu=p.backend.device == "cuda", instances=cfg.deploy.instances)


def _model_entry(model: triton.Model, p: Planned) -> dict:
    return {"name": model.name, "candidate": p.name, "verdict": p.verdict, "verdict_sha256": p.sha256,
            "platform": model.platform or None, "backend": model.backend or None, "device": p.backend.device,
            "max_batch_size": model.max_batch_size, "preferred_batch_sizes": list(model.preferred_batch_sizes),
            "inputs": [asdict(t) for t in model.signature.inputs],
            "outputs": [asdict(t) for t in model.signature.outputs]}


# --------------------------------------------------------------------------- serving it here


def serve_and_check(cfg: Config, run_dir: RunDir, model: triton.Model, p: Planned) -> dict:
    """Serve ``model`` (its verified runner behind Triton's dynamic batcher), send the validation images over HTTP
    and gRPC at concurrency 1 and the largest configured, judge the served outputs against the artifact's own with
    the gate, and time it from the client's side beside the runner in this process."""
    from pipeline.core import data, modeling
    from pipeline.evaluation import candidates
    from pipeline.runtime import triton_serve
    from pipeline.runtime.backends import Context

    card = modeling.read_card(run_dir, "deploy")
    spec = card["spec"]
    images, labels = data.labelled_validation_batch(cfg, card, cfg.deploy.serve_samples, spread=True)
    method = triton_serve.Method(cfg.deploy.warmup_s, cfg.deploy.window_s, cfg.deploy.stability, cfg.deploy.max_trials)
    gate = candidates.gate_for(cfg, p.name, p.backend.precision)
    ctx = Context(cfg, run_dir, "deploy", spec, isolate=False)
    with p.backend.make(ctx) as runner, _workspace(run_dir) as workspace:
        def infer(batch: np.ndarray) -> np.ndarray:
            return runner.infer({spec["input_name"]: batch})[spec["output_name"]]

        reference = np.concatenate([infer(images[i : i + cfg.verify.batch_size])
                                    for i in range(0, len(images), cfg.verify.batch_size)])
        timings = [_in_process(infer, images[:1], method)]
        log_file = run_dir.file(a.child_log("deploy", "tritonserver"))
        log_file.parent.mkdir(exist_ok=True)
        with triton_serve.served(model, infer, workspace=workspace, log_file=log_file) as server:
            checks = [_check(server, protocol, c, images, labels, reference, gate, cfg, spec)
                      for protocol in triton_serve.PROTOCOLS for c in sorted({1, max(cfg.deploy.concurrency)})]
            timings += [triton_serve.measure(triton_serve.client_sender(server, protocol, images[:1]),
                                             where=protocol, concurrency=c, method=method)
                        for protocol in triton_serve.PROTOCOLS for c in cfg.deploy.concurrency]
    matches = [deployment.ServedMatch(c["images"], c["identical"], c["max_abs_diff"], c["status"]) for c in checks]
    verdict = deployment.serving_verdict(matches)
    failing = [f"{c['protocol']} at concurrency {c['concurrency']}: {c['status']}" for c in checks
               if c["status"] != Status.PASSED]
    return {"candidate": p.name, "server": {"triton": server.version, "start_s": server.start_s,
                                            "binary": "tritonserver from nvidia-pytriton (Python backend)"},
            "cpu": env.cpu_model(), "cores": env.usable_cores(), "images": len(images),
            "max_batch_size": model.max_batch_size, "preferred_batch_sizes": list(model.preferred_batch_sizes),
            "checks": checks, "verdict": verdict, "reason": "; ".join(failing),
            "method": asdict(method), "timings": [asdict(t) for t in timings]}


@contextlib.contextmanager
def _workspace(run_dir: RunDir):
    """PyTriton's workspace (sockets, its model store): a private folder, removed afterwards."""
    folder = Path(tempfile.mkdtemp(prefix=a.DEPLOY_WORKSPACE_PREFIX))
    try:
        yield folder / "workspace"  # PyTriton creates it
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _in_process(infer, image: np.ndarray, method) -> object:
    from pipeline.runtime import triton_serve

    def make():
        return (lambda: infer(image)), (lambda: None)

    return triton_serve.measure(make, where="in-process", concurrency=1, method=method)


def _check(server, protocol: str, concurrency: int, images, labels, reference, gate: dict, cfg: Config,
           spec: dict) -> dict:
    """One protocol at one concurrency: every image served, judged against the artifact's own output."""
    from pipeline.precision import gate as criteria
    from pipeline.runtime import triton_serve

    served = triton_serve.infer_images(server, protocol, images, concurrency)
    name = spec["output_name"]
    result = criteria.judge([{name: served}], [{name: reference}], labels, gate, name, cfg.verify.confidence)
    identical = int(np.all(served == reference, axis=tuple(range(1, served.ndim))).sum())
    diff = float(np.max(np.abs(served.astype(np.float64) - reference))) if served.size else 0.0
    log.info("deploy: %s concurrency %d: %d images, %d identical, max |diff| %.3g: %s", protocol, concurrency,
             len(images), identical, diff, result["status"])
    return {"protocol": protocol, "concurrency": concurrency, "images": len(images), "identical": identical,
            "max_abs_diff": diff, "status": result["status"],
            "max_scaled_error": result["tensor_check"].get("max_scaled_error"),
            "top1_agreement": result["task_check"]["top1_agreement"]}
