"""The deploy stage: a Triton model repository of every artifact that passed the gate and that the stock Triton
backend can run the way verify gated it, and (``--serve``) that repository served as written on this machine, every
model's outputs judged by verify's criteria against the FP32 reference, one model timed from the client's side.

``python -m pipeline deploy --target triton --out DIR [--serve]``: per verify candidate with a Triton backend in the
backend table (``Backend.triton``) whose verdict counts as passed (:func:`pipeline.core.deployment.refusal`) and
whose backend can be told its precision (:func:`pipeline.core.deployment.stock_refusal`), a model folder
``DIR/<candidate>/`` with ``config.pbtxt`` (Triton's ``ModelConfig``: names, types and dims read from the artifact,
``max_batch_size`` every batch of which the backend takes, the dynamic batcher's preferred sizes from benchmark's
throughput curve, the instance group of its device, the backend's precision parameter), ``1/<model file>`` and
``pipeline.json`` (the verdict and the sha256 it was given for); ``DIR/pipeline.files.json`` lists every file written
with its sha256. Every ``config.pbtxt`` is parsed back as ``ModelConfig`` and compared with the artifact before the
repository is put in place, whole (built beside ``DIR``, then renamed); an existing ``DIR`` is replaced only while it
holds exactly what deploy wrote there. Engines are checked against ``deploy.triton_release`` first.

``--serve`` (:func:`serve_and_check`): :mod:`pipeline.runtime.serving.triton_stock` loads each model folder from disk
with its
stock backend's behaviour, Triton (PyTriton) serves it, :mod:`pipeline.evaluation.served` judges what comes back.

``deploy.json`` in the run directory, written once after every check, records what was written, refused, served and
measured (the report's serving section): a :class:`pipeline.core.deploy_result.DeployResult`, its parts made here and
in :mod:`pipeline.evaluation.served` where each is decided, and written by its ``to_json``. docs/deploy.md explains
the layout, the version tables and what runs where.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import tempfile
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from pipeline.core import artifacts as a
from pipeline.core import benchmark_rows, deployment, env, schema
from pipeline.core import run as run_files
from pipeline.core.deploy_result import (
    FILES_SCHEMA,
    MAX_ENTRIES,
    SCHEMA,
    SIDECAR_SCHEMA,
    Compatibility,
    DeployResult,
    FilesManifest,
    ModelEntry,
    Refusal,
    Serve,
    ServedModel,
    ServedTiming,
    ServedTimingMethod,
    ServerInfo,
    TensorEntry,
    TritonSidecar,
)
from pipeline.core.errors import BackendUnavailable, CheckFailed, InputError, UsageError, first_line
from pipeline.core.run import RunDir, StageRecord, now, sha256_file, write_json
from pipeline.core.status import Status
from pipeline.reports import verify_report
from pipeline.runtime import backends
from pipeline.runtime.backends import Backend
from pipeline.runtime.serving import triton

if TYPE_CHECKING:  # annotations only
    from pipeline.core.config_schema import Config

log = logging.getLogger("pipeline")


@dataclass(frozen=True)
class Format:
    """How Triton runs one kind of artifact."""

    platform: str
    backend: str
    filename: str


PLAN = Format("tensorrt_plan", "", "model.plan")
ONNX = Format("", "onnxruntime", "model.onnx")
IR = Format("", "openvino", "model.xml")
# A backend table entry's ``triton`` (pipeline/runtime/backends.py) -> how Triton runs its artifact: the only list of
# what deploys is the table (an entry verify checks, with a Triton backend); tests/test_deploy_rules.py holds every
# gating deployment to having one.
FORMATS = {"tensorrt_plan": PLAN, "onnxruntime": ONNX, "openvino": IR}
FILES_MANIFEST = "pipeline.files.json"  # the repository root: every file deploy wrote there, with its sha256


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
        return self.backend.verify_name


# --------------------------------------------------------------------------- the stage


def run(cfg: Config, run_dir: RunDir, record: StageRecord, *, target: str | None = None, out: str | None = None,
        serve: bool = False) -> None:
    if (target or cfg.deploy.target) != "triton":
        raise UsageError(f"deploy --target {target}: the only target is triton")
    serve = serve or cfg.deploy.serve
    if serve:  # before anything is written
        from pipeline.runtime.serving import triton_serve

        reason = triton_serve.available()
        if reason:
            raise BackendUnavailable(f"deploy --serve: cannot start Triton here: {reason}")
    repository = _repository_path(cfg, run_dir, out)
    plans = plan(run_dir)
    chosen = [p for p in plans if not p.refused]
    for p in plans:
        if p.refused and p.verdict != Status.SKIPPED:
            log.warning("deploy: refused %s", p.refused)
    tensorrt = _check_release(cfg, run_dir, chosen)
    if not chosen:
        raise InputError("nothing to deploy: no artifact passed the gate (" + "; ".join(p.refused for p in plans) + ")")
    curves = benchmark_curves(run_dir)
    models = write_repository(cfg, run_dir, chosen, curves, repository)
    created, entries = now(), [_model_entry(m, p, repository) for m, p in models]
    compatibility = Compatibility(tensorrt=tensorrt, releases=deployment.describe_releases(tensorrt),
                                  target_release=cfg.deploy.triton_release, source=deployment.RELEASES_SOURCE)
    served = serve_and_check(cfg, run_dir, repository, models) if serve else None
    result = DeployResult(schema=SCHEMA, created=created, target="triton", repository=str(repository),
                          models=entries, refused=[_refusal(p) for p in plans if p.refused],
                          compatibility=compatibility, serve=served)
    write_json(run_dir.file(a.DEPLOY_JSON), result.to_json())  # once, after every check
    record.artifact(a.DEPLOY_JSON)
    record.details.update(_details(result))
    log.info("deploy: wrote %s: %s", repository, ", ".join(m.name for m, _ in models))
    if served is not None and served.verdict != Status.PASSED:
        raise CheckFailed(f"what Triton serves from {repository} does not pass verify's criteria: {served.reason}")


def _repository_path(cfg: Config, run_dir: RunDir, out: str | None) -> Path:
    given = out or cfg.deploy.out
    if not given:
        raise UsageError("deploy needs the repository folder: --out DIR (or deploy.out)")
    path = Path(given).absolute()
    if path == run_dir.path.absolute() or run_dir.path.absolute() in path.parents:
        raise UsageError(f"deploy --out {given}: the repository must be outside the run directory")
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        raise UsageError(f"deploy --out {given}: not a folder (a link or a file); name a folder")
    refused = replace_refusal(path)
    if refused:
        raise UsageError(f"deploy --out {given}: refusing to replace the folder: {refused}")
    return path


def replace_refusal(path: Path) -> str:
    """Why the folder ``path`` must not be replaced ("" when it may: absent, empty, or exactly what deploy wrote)."""
    if not path.is_dir():
        return ""
    return deployment.replace_refusal(on_disk(path), written_files(path))


def on_disk(root: Path) -> dict[str, str]:
    """Every entry under ``root`` (links not followed): relative path -> a file's sha256, "dir", or "other"."""
    entries: dict[str, str] = {}
    for folder, dirs, files in os.walk(root, followlinks=False):
        for name in dirs + files:
            path = Path(folder, name)
            relative = path.relative_to(root).as_posix()
            if path.is_symlink() or not (path.is_dir() or path.is_file()):
                entries[relative] = "other"
            elif path.is_dir():
                entries[relative] = "dir"
            else:
                entries[relative] = sha256_file(path)
            if len(entries) > MAX_ENTRIES:
                entries["…"] = "other"
                return entries
    entries.pop(FILES_MANIFEST, None)
    return entries


def written_files(root: Path) -> dict[str, str] | None:
    """The files manifest deploy left in ``root`` (None: none, or one that is not deploy's)."""
    path = root / FILES_MANIFEST
    if not path.is_file() or path.is_symlink():
        return None
    try:
        manifest = schema.read_json(path, FilesManifest, "deploy's files manifest", limit=16 * 2**20)
    except InputError:
        return None
    return dict(manifest.files)


def _details(result: DeployResult) -> dict:
    """What the manifest records of deploy: the repository, the models written, the candidates refused (not those
    verify skipped) and, after ``--serve``, the serving verdict."""
    details = {"repository": result.repository, "models": [m.name for m in result.models],
               "refused": [r.candidate for r in result.refused if r.verdict != Status.SKIPPED]}
    if result.serve is not None:
        details["served"] = result.serve.verdict
    return details


# --------------------------------------------------------------------------- what is deployed


def plan(run_dir: RunDir) -> list[Planned]:
    """Every deployable candidate with verify's verdict for the files here now, refused unless it counts as passed."""
    _check_verify_finished(run_dir)
    verdicts = verify_report.read_verdicts(run_dir) or {}
    policy = verify_report.read_policy(run_dir)
    plans = []
    for backend in backends.candidates():
        if backend.triton is None or not backend.deploys:
            continue
        verdict = verdicts.get(backend.verify_name)
        refused = deployment.refusal(backend.verify_name, verdict, policy) or deployment.stock_refusal(
            backend.verify_name, backend.triton, backend.precision, backend.device)
        plans.append(Planned(backend, FORMATS[backend.triton], refused, verdict,
                             verify_report.artifact_sha256(run_dir, backend.artifact)))
    return plans


def _check_verify_finished(run_dir: RunDir) -> None:
    """verify.json must be the file a finished verify wrote: one that ended ok, or failed its gate (exit 1: every
    verdict was reached, and a failed one is refused here); not one edited or left by a verify that broke off."""
    path = run_dir.require(a.VERIFY_JSON, "verify", "deploy")
    entry = run_dir.stage_entry("verify")
    if entry is None or not deployment.verify_finished(entry.status, entry.exit_code,
                                      run_dir.recorded_artifacts("verify").get(a.VERIFY_JSON), sha256_file(path)):
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
    from pipeline.runtime.builders import tensorrt_engine

    _, sidecar = tensorrt_engine.load_engine_bytes(run_dir, engine=p.backend.artifact)
    return str(sidecar.platform.tensorrt)


def benchmark_curves(run_dir: RunDir) -> dict[str, list[tuple[int, float]]]:
    """Per benchmarked backend, its synchronous throughput per batch size (benchmark.json, only as benchmark wrote
    it); empty without a benchmark."""
    path = run_dir.file(a.BENCHMARK_JSON)
    if not path.is_file():
        return {}
    if run_dir.recorded_sha256("benchmark", a.BENCHMARK_JSON) != sha256_file(path):
        raise InputError(f"{a.BENCHMARK_JSON} is not the file benchmark wrote: re-run benchmark")
    curves: dict[str, list[tuple[int, float]]] = {}
    for row in benchmark_rows.read(path).results:
        if row.throughput_per_s and not row.is_throughput:  # async rows: not what a batch costs
            curves.setdefault(row.backend, []).append((row.batch_size, row.throughput_per_s))
    return curves


# --------------------------------------------------------------------------- the repository


def write_repository(cfg: Config, run_dir: RunDir, chosen: list[Planned], curves: dict,
                     repository: Path) -> list[tuple[triton.Model, Planned]]:
    """Every chosen model written into a folder beside ``repository``, each config parsed back and checked, the
    files manifest beside them, then the folder put in ``repository``'s place (an older repository deploy wrote, still
    exactly as written, is replaced whole). Modes follow the umask: a server running as another user reads it."""
    repository.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{repository.name}.", dir=repository.parent))
    try:
        os.chmod(staging, 0o777 & ~run_files.umask())  # mkdtemp's 0700 would keep the server out
        models = [(_write_model(cfg, run_dir, p, curves, staging / p.name), p) for p in chosen]
        files = {k: v for k, v in on_disk(staging).items() if v not in ("dir", "other")}
        manifest = FilesManifest(schema=FILES_SCHEMA, files=files)
        (staging / FILES_MANIFEST).write_text(json.dumps(manifest.to_json(), indent=2) + "\n", encoding="utf-8")
        _swap(staging, repository)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return models


def _swap(staging: Path, repository: Path) -> None:
    old = None
    if repository.exists():
        refused = replace_refusal(repository)  # again: a file may have been added since the first look
        if refused:
            raise UsageError(f"deploy --out {repository}: refusing to replace the folder: {refused}")
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
    sidecar = TritonSidecar(schema=SIDECAR_SCHEMA, candidate=p.name, verdict=p.verdict, verdict_sha256=p.sha256,
                            artifact=p.backend.artifact, run=str(run_dir.path.absolute()),
                            precision=p.backend.precision, device=p.backend.device,
                            files={f"{a.TRITON_VERSION}/{n}": hashlib.sha256(d).hexdigest() for n, d in files.items()})
    (folder / a.TRITON_SIDECAR).write_text(json.dumps(sidecar.to_json(), indent=2) + "\n", encoding="utf-8")
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
        from pipeline.runtime.builders import openvino_ir

        xml, weights, _ = openvino_ir.load(run_dir, p.backend.precision)
        return {"model.xml": xml, "model.bin": weights}, triton.openvino_signature(xml, weights)
    if p.format is PLAN:
        from pipeline.runtime.builders import tensorrt_engine

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
                                        profile_min=signature.profile_min, served_max=cfg.build.max_batch,
                                        batch_fixed_by_backend=p.format is IR)
    preferred = deployment.preferred_batch_sizes(curve, largest, cfg.deploy.preferred_fraction) if largest else ()
    return triton.Model(name=p.name, platform=p.format.platform, backend=p.format.backend,
                        filename=p.format.filename, signature=signature, max_batch_size=largest,
                        preferred_batch_sizes=preferred, max_queue_delay_us=cfg.deploy.max_queue_delay_us,
                        gpu=p.backend.device == "cuda", instances=cfg.deploy.instances,
                        parameters=deployment.stock_parameters(p.backend.triton, p.backend.precision))


def served_max_batch(cfg: Config, model: triton.Model) -> int:
    """The largest batch one request to ``model`` may carry (its ``max_batch_size``, or with the batch in ``dims``
    the artifact's own largest)."""
    signature = model.signature
    return deployment.served_batch_range(max_batch=model.max_batch_size, batch_dim=signature.batch_dim,
                                         served_max=cfg.build.max_batch, profile_min=signature.profile_min,
                                         profile_max=signature.profile_max)[1]


def _model_entry(model: triton.Model, p: Planned, repository: Path) -> ModelEntry:
    return ModelEntry(name=model.name, candidate=p.name, verdict=p.verdict, verdict_sha256=p.sha256,
                      platform=model.platform or None, backend=model.backend or None, device=p.backend.device,
                      max_batch_size=model.max_batch_size, preferred_batch_sizes=list(model.preferred_batch_sizes),
                      parameters=dict(model.parameters), gated_precision=p.backend.precision,
                      runs_in=_runs_in(model, p, repository), loads_in=_loads_in(model, repository),
                      inputs=[_tensor(t) for t in model.signature.inputs],
                      outputs=[_tensor(t) for t in model.signature.outputs])


def _tensor(t: triton.Tensor) -> TensorEntry:
    return TensorEntry(name=t.name, dtype=t.dtype, dims=list(t.dims))


def _refusal(p: Planned) -> Refusal:
    return Refusal(candidate=p.name, verdict=p.verdict, reason=p.refused)


def _loads_in(model: triton.Model, repository: Path) -> str:
    """The Triton releases whose ONNX Runtime / OpenVINO load the file written (its opset and IR version against each
    release's bundled version; pipeline/core/deployment.py names the sources); "" for an engine (deploy.triton_release
    and the TensorRT table decide those)."""
    path = repository / model.name / a.TRITON_VERSION / model.filename
    if model.backend == "onnxruntime":
        from pipeline.core import onnx_io

        graph = onnx_io.load(path, "ONNX model")
        opset = max((o.version for o in graph.opset_import if o.domain in ("", "ai.onnx")), default=0)
        return deployment.describe_onnx_releases(opset, graph.ir_version)
    if model.backend == "openvino":
        import re

        opsets = [int(v) for v in re.findall(r'version="opset(\d+)"', path.read_text(encoding="utf-8"))]
        return deployment.describe_openvino_releases(opsets)
    return ""


def _runs_in(model: triton.Model, p: Planned, repository: Path) -> str:
    """The precision the stock backend computes this model in on this CPU (OpenVINO: compiled the way the backend
    compiles it, and asked), as conformance records it for verify."""
    if model.backend == "openvino":
        from pipeline.runtime.serving import triton_stock

        try:
            loaded = triton_stock.Model(repository / model.name, cpu_bf16=triton_stock.SIMULATED_CPU_BF16)
        except (triton_stock.StockError, InputError) as exc:
            return f"not loaded here: {first_line(exc)[:200]}"
        return f"{loaded.precision} (OpenVINO CPU plugin, on {env.cpu_model()})"
    if model.platform == "tensorrt_plan":
        return f"{p.backend.precision} (strongly typed engine: the precisions written in the graph)"
    where = "CUDA provider" if model.gpu else "CPU provider"
    return f"the {p.backend.precision} graph as ONNX Runtime's {where} computes it (verify's {p.name})"


# --------------------------------------------------------------------------- serving it here


def serve_and_check(cfg: Config, run_dir: RunDir, repository: Path,
                    models: list[tuple[triton.Model, Planned]]) -> Serve:
    """Serve the repository as written: every model folder read back from disk and executed with its stock backend's
    behaviour (:mod:`pipeline.runtime.serving.triton_stock`) behind Triton; the validation images sent at batch 1, at
    the largest batch and from 8 clients at once; each arrangement judged by verify's criteria for the model's precision
    against the FP32 PyTorch reference (:mod:`pipeline.evaluation.served`). Then one model timed from the client's
    side. The models a GPU runs are listed as not served here."""
    from pipeline.core import data, modeling
    from pipeline.evaluation import candidates, served
    from pipeline.runtime.serving import triton_serve, triton_stock

    reference_model, card = modeling.load_trained(cfg, run_dir, "deploy")
    spec = card.spec
    images, labels = data.labelled_validation_batch(cfg, card, cfg.deploy.serve_samples, spread=True)
    reference = _reference(reference_model, images, cfg.verify.batch_size)
    here = [(m, p) for m, p in models if not m.gpu and m.platform != "tensorrt_plan"]
    not_here = [ServedModel(model=m.name, verdict=Status.SKIPPED, reason="not served on this machine: it needs a GPU")
                for m, _ in models if m.name not in {h.name for h, _ in here}]
    written = written_files(repository) or {}
    method = triton_serve.PerfWindows(cfg.deploy.warmup_s, cfg.deploy.window_s, cfg.deploy.stability,
                                      cfg.deploy.max_trials)
    log_file = run_dir.file(a.child_log("deploy", "tritonserver"))
    log_file.parent.mkdir(exist_ok=True)
    with triton_stock.Repository(repository, [m.name for m, _ in here],
                                 cpu_bf16=triton_stock.SIMULATED_CPU_BF16) as stock, \
            FRONT_END(stock, [m for m, _ in here], run_dir, log_file) as (send, server, timed):
        results = []
        for m, p in here:
            model = served.Served(m.name, p.backend.precision, candidates.gate_for(cfg, p.name, p.backend.precision),
                                  {k: v for k, v in written.items() if k.startswith(f"{m.name}/")},
                                  served_max_batch(cfg, m))
            loaded = stock.models.get(m.name)
            results.append(served.check_model(model, send, images, labels, reference, spec.output_name,
                                              cfg.verify.confidence, load_error=stock.errors.get(m.name, ""),
                                              served_precision=loaded.precision if loaded else None,
                                              repository=repository))
        timed_name = _timed(cfg, [r for r in results if r.verdict == Status.PASSED])
        timings = ([ServedTiming(**asdict(t)) for t in timed(timed_name, images[:1], method, cfg.deploy.concurrency)]
                   if timed_name else [])
    verdict = deployment.serving_verdict([r.verdict for r in results])
    failing = [f"{r.model}: {r.reason}" for r in results if r.verdict != Status.PASSED]
    return Serve(server=server, cpu=env.cpu_model(), cores=env.usable_cores(), images=len(images),
                 reference="the trained FP32 PyTorch model (verify's reference)", models=results + not_here,
                 verdict=verdict, reason="; ".join(failing) or ("" if results else "no model is served here"),
                 timed=timed_name, method=ServedTimingMethod(**asdict(method)), timings=timings)


def _reference(model, images: np.ndarray, batch: int) -> np.ndarray:
    import torch

    with torch.inference_mode():
        return np.concatenate([model(torch.from_numpy(images[i: i + batch])).float().numpy()
                               for i in range(0, len(images), batch)])


def _timed(cfg: Config, passed: list[ServedModel]) -> str | None:
    """The model timed: deploy.serve_candidate when it was served and passed, else the first that passed."""
    names = [r.model for r in passed]
    return cfg.deploy.serve_candidate if cfg.deploy.serve_candidate in names else (names[0] if names else None)


@contextlib.contextmanager
def triton_front_end(stock, models: list[triton.Model], run_dir: RunDir, log_file: Path):
    """Triton (the ``tritonserver`` of nvidia-pytriton, on the loopback) in front of the stock backends: each model
    bound with the repository's batching, each execution handed to the model's stock backend. Yields ``send(name,
    batch)`` (HTTP, a client per thread), the server's description and ``timed(name, image, method)``."""
    from pipeline.runtime.serving import triton_serve

    bound = [(m, _executor(stock, m.name)) for m in models if m.name in stock.models]
    if not bound:  # nothing loaded: nothing to start
        yield _refused_send, ServerInfo(triton=None, binary="not started: no model loaded"), lambda *a: []
        return
    with _workspace(run_dir) as workspace, triton_serve.served(bound, workspace=workspace,
                                                               log_file=log_file) as server:
        clients = threading.local()

        def send(name: str, batch: np.ndarray) -> np.ndarray:
            key = f"http:{name}"
            client = getattr(clients, "by", {}).get(key)
            if client is None:
                clients.by = {**getattr(clients, "by", {}),
                              key: triton_serve.Client(server, "http", server.models[name])}
                client = clients.by[key]
            return client.infer(batch)

        def timed(name: str, image: np.ndarray, method, concurrency: list[int]) -> list:
            model = server.models[name]
            rows = [_in_process(lambda b: stock.infer(name, b), image, method)]
            for protocol in triton_serve.PROTOCOLS:
                for c in concurrency:
                    rows.append(triton_serve.measure(
                        triton_serve.client_sender(server, protocol, image, model), where=protocol, concurrency=c,
                        method=method))
            return rows

        yield send, ServerInfo(triton=server.version, start_s=server.start_s,
                               binary="tritonserver from nvidia-pytriton; each model's executions by its stock "
                                      "backend's behaviour (pipeline/runtime/serving/triton_stock.py)"), timed


def _executor(stock, name: str):
    model = stock.models[name]

    def run(batch: np.ndarray) -> np.ndarray:
        return model.execute([batch])[0]

    return run


def _refused_send(name: str, batch: np.ndarray) -> np.ndarray:
    raise RuntimeError(f"{name} is not loaded")


# How --serve reaches the repository: Triton through PyTriton (the serve extra). The planted-defect tests put the stock
# backends' own scheduler here instead (pipeline.evaluation.served.in_process), where the extra is not installed.
FRONT_END = triton_front_end


@contextlib.contextmanager
def _workspace(run_dir: RunDir):
    """PyTriton's workspace (sockets, its model store): a private folder, removed afterwards."""
    folder = Path(tempfile.mkdtemp(prefix=a.DEPLOY_WORKSPACE_PREFIX))
    try:
        yield folder / "workspace"  # PyTriton creates it
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _in_process(infer, image: np.ndarray, method) -> object:
    from pipeline.runtime.serving import triton_serve

    def make():
        return (lambda: infer(image)), (lambda: None)

    return triton_serve.measure(make, where="in-process", concurrency=1, method=method)
