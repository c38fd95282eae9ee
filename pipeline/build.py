"""The build stage: a strongly typed TensorRT engine from ``model.fp16.onnx``, through Polygraphy.

TensorRT 10.12 deprecated weak typing and TensorRT 11 removed it (no ``BuilderFlag.FP16``, no
layer precisions). The engine's precisions therefore come from the ONNX graph's types: the
network is parsed with ``strongly_typed=True`` (required on 10.12-10.x, implied on 11) and the
builder config carries no precision flag at all. TF32 is a deliberate choice
(``build.tf32``, default off: the layers AutoCast kept in FP32 then compute in true FP32, as
verify assumed) and is recorded.

The engine file stays a plain serialized engine; everything about it lives in the sidecar
``model.fp16.engine.json``. An engine is executable code: :func:`load_engine_bytes` refuses any
engine whose sidecar is missing, was not written by this tool, whose sha256 no longer matches,
or that was built for another GPU or TensorRT version, and any engine whose sha256 the build stage
did not record in the manifest.
"""

from __future__ import annotations

import hashlib
import logging
import time
from pathlib import Path

from pipeline import __version__, env, openvino_ir
from pipeline.artifacts import ENGINE, FP16_ONNX, FP32_ONNX, MODEL_CARD
from pipeline.artifacts import ENGINE_SIDECAR as SIDECAR
from pipeline.artifacts import TIMING_CACHE as DEFAULT_TIMING_CACHE
from pipeline.errors import BackendUnavailable, InputError, StageFailed
from pipeline.run import RunDir, StageRecord, atomic_write, now, read_json, sha256_file, write_json

log = logging.getLogger("pipeline")

SIDECAR_SCHEMA = "pipeline.engine/1"


def availability() -> tuple[bool, str]:
    """Whether an engine can be built here, and if not, the exact reason."""
    trt, reason = env.tensorrt_status()
    if trt is None:
        return False, reason
    ok, reason = env.cuda_status()
    if not ok:
        return False, f"TensorRT {trt.__version__} is installed but there is {reason}"
    return True, ""


def check_required(cfg) -> None:
    """``require: [tensorrt]`` (or ``cuda``) where no engine can be built: :class:`BackendUnavailable`."""
    if "tensorrt" in cfg.require or "cuda" in cfg.require:
        ok, reason = availability()
        if not ok:
            raise BackendUnavailable(f"TensorRT engine required but {reason}")


def timing_cache_path(cfg, run_dir: RunDir) -> Path:
    """Beside the run directories, so every run on this machine shares (and merges into) one cache."""
    if cfg.build.timing_cache:
        return Path(cfg.build.timing_cache).expanduser()
    return run_dir.path.resolve().parent / DEFAULT_TIMING_CACHE


def profile_shapes(cfg, input_size: list[int]) -> dict[str, list[int]]:
    b = cfg.build
    return {"min": [b.min_batch, *input_size], "opt": [b.opt_batch, *input_size], "max": [b.max_batch, *input_size]}


def network_loader(onnx_path: Path):
    """The strongly typed network parser (Polygraphy ``NetworkFromOnnxPath``); lazy."""
    from polygraphy.backend.trt import NetworkFromOnnxPath

    return NetworkFromOnnxPath(str(onnx_path), strongly_typed=True)


def config_loader(*, input_name: str, shapes: dict, build_cfg, timing_cache: Path | None):
    """The builder config (Polygraphy ``CreateConfig``): one profile, no precision flag; lazy."""
    from polygraphy.backend.trt import CreateConfig, Profile

    profile = Profile().add(input_name, min=shapes["min"], opt=shapes["opt"], max=shapes["max"])
    return CreateConfig(
        tf32=build_cfg.tf32,
        profiles=[profile],
        builder_optimization_level=build_cfg.optimization_level,
        load_timing_cache=str(timing_cache) if timing_cache and timing_cache.exists() else None,
    )


def engine_loader(onnx_path: Path, *, input_name: str, shapes: dict, build_cfg, timing_cache: Path | None):
    """The Polygraphy loader chain; lazy: nothing touches TensorRT until it is called.

    Returns an ``EngineBytesFromNetwork`` that yields the serialized engine.
    """
    from polygraphy.backend.trt import EngineBytesFromNetwork

    config = config_loader(input_name=input_name, shapes=shapes, build_cfg=build_cfg, timing_cache=timing_cache)
    return EngineBytesFromNetwork(network_loader(onnx_path), config=config,
                                  save_timing_cache=str(timing_cache) if timing_cache else None)


def current_platform() -> dict:
    """What an engine is bound to on this machine: TensorRT version and GPU."""
    trt, _ = env.tensorrt_status()
    gpu = env.gpu_info() or {}
    return {"tensorrt": getattr(trt, "__version__", None), "gpu": gpu.get("name"),
            "compute_capability": gpu.get("compute_capability")}


def run(cfg, run_dir: RunDir, record: StageRecord) -> None:
    card = read_json(run_dir.require(MODEL_CARD, "train", "build"), "model card")
    fp16 = run_dir.file(FP16_ONNX).exists()
    onnx_name = FP16_ONNX if fp16 else FP32_ONNX
    onnx_path = run_dir.require(onnx_name, "export", "build")
    check_required(cfg)
    record.details["openvino"] = openvino_ir.write_all(cfg, run_dir, record)  # the CPU IR, with TensorRT or without
    ok, reason = availability()
    if not ok:
        for stale in (ENGINE, SIDECAR):  # never leave an engine that this run did not build beside its inputs
            if run_dir.file(stale).exists() and not _sidecar_matches_onnx(run_dir, onnx_path):
                run_dir.file(stale).unlink()
        record.skip(reason)
        return

    spec = card["spec"]
    shapes = profile_shapes(cfg, spec["input_size"])
    cache = timing_cache_path(cfg, run_dir)
    cache.parent.mkdir(parents=True, exist_ok=True)
    loader = engine_loader(onnx_path, input_name=spec["input_name"], shapes=shapes, build_cfg=cfg.build,
                           timing_cache=cache)
    log.info("build: %s -> %s (strongly typed, profile %s/%s/%s, optimization level %d, tf32 %s)", onnx_name,
             ENGINE, shapes["min"][0], shapes["opt"][0], shapes["max"][0], cfg.build.optimization_level,
             cfg.build.tf32)
    start = time.perf_counter()
    try:
        engine_bytes = bytes(loader())
    except Exception as exc:
        raise StageFailed(f"TensorRT engine build failed: {type(exc).__name__}: {exc}") from None
    seconds = time.perf_counter() - start
    atomic_write(run_dir.file(ENGINE), engine_bytes)
    platform = current_platform()
    export_details = (run_dir.stage_entry("export") or {}).get("details", {}).get("fp16") or {}
    sidecar = {
        "schema": SIDECAR_SCHEMA,
        "built_by": f"pipeline {__version__}",
        "engine": ENGINE,
        "sha256": sha256_file(run_dir.file(ENGINE)),
        "bytes": len(engine_bytes),
        "onnx": onnx_name,
        "onnx_sha256": sha256_file(onnx_path),
        "precision": (f"fp16 (strongly typed from {FP16_ONNX}; "
                      f"{export_details.get('fp32_nodes_count', '?')} nodes kept FP32 by AutoCast)") if fp16
        else f"fp32 (strongly typed from {FP32_ONNX}; FP16 conversion was disabled)",
        **platform,
        "profile": {"input": spec["input_name"], **shapes},
        "flags": {"strongly_typed": True, "precision_flags": [], "tf32": cfg.build.tf32,
                  "builder_optimization_level": cfg.build.optimization_level},
        "timing_cache": str(cache),
        "build_seconds": round(seconds, 2),
        "built_at": now(),
    }
    write_json(run_dir.file(SIDECAR), sidecar)
    record.details.update({k: sidecar[k] for k in ("precision", "tensorrt", "gpu", "compute_capability", "profile",
                                                    "flags", "build_seconds", "timing_cache")})
    record.artifact(ENGINE)
    record.artifact(SIDECAR)
    log.info("build: engine %.1f MiB in %.1f s on %s (TensorRT %s)", len(engine_bytes) / 2**20, seconds,
             platform["gpu"], platform["tensorrt"])


def _sidecar_matches_onnx(run_dir: RunDir, onnx_path: Path) -> bool:
    try:
        sidecar = read_json(run_dir.file(SIDECAR), "engine sidecar")
        return sidecar.get("onnx_sha256") == sha256_file(onnx_path)
    except (FileNotFoundError, InputError):
        return False


def check_sidecar(engine_path: Path, engine_bytes: bytes, sidecar_path: Path, platform: dict) -> dict:
    """Every condition under which an engine may be deserialized; raises InputError otherwise."""
    rebuild = f"rebuild it with `python -m pipeline build --run-dir {engine_path.parent}`"
    if not sidecar_path.is_file():
        raise InputError(f"{engine_path.name} has no sidecar {sidecar_path.name}: only engines this tool built and "
                         f"recorded are loaded (an engine is executable code); {rebuild}")
    try:
        sidecar = read_json(sidecar_path, "engine sidecar")
    except InputError as exc:
        raise InputError(f"{exc}; refusing to load {engine_path.name}; {rebuild}") from None
    if not isinstance(sidecar, dict) or sidecar.get("schema") != SIDECAR_SCHEMA or \
            not str(sidecar.get("built_by", "")).startswith("pipeline "):
        raise InputError(f"{sidecar_path.name} is not a pipeline engine sidecar; refusing to load {engine_path.name}; "
                         f"{rebuild}")
    actual = hashlib.sha256(engine_bytes).hexdigest()
    if actual != sidecar.get("sha256"):
        raise InputError(f"{engine_path.name} does not match its sidecar (sha256 {actual[:12]}..., recorded "
                         f"{str(sidecar.get('sha256'))[:12]}...): the file was changed after the build; {rebuild}")
    for key, what in (("tensorrt", "TensorRT version"), ("gpu", "GPU"), ("compute_capability", "compute capability")):
        if sidecar.get(key) != platform.get(key):
            raise InputError(f"{engine_path.name} was built for {what} {sidecar.get(key)}, but this machine has "
                             f"{platform.get(key)}; engines only run where they were built: {rebuild}")
    return sidecar


def load_engine_bytes(run_dir: RunDir, platform: dict | None = None) -> tuple[bytes, dict]:
    """The engine's bytes, after :func:`check_sidecar` passed on exactly those bytes.

    This is the only way the pipeline reads an engine file.
    """
    engine_path = run_dir.file(ENGINE)
    if not engine_path.is_file():
        raise InputError(f"{engine_path} does not exist; run `python -m pipeline build --run-dir {run_dir.path}`")
    data = engine_path.read_bytes()
    sidecar = check_sidecar(engine_path, data, run_dir.file(SIDECAR), platform or current_platform())
    check_recorded(run_dir, engine_path, hashlib.sha256(data).hexdigest())
    return data, sidecar


def check_recorded(run_dir: RunDir, engine_path: Path, sha256: str) -> None:
    """The engine must be the one the build stage recorded in the manifest (sha256 of these bytes).

    A sidecar alone proves nothing: anyone who can put an engine in the run directory can write a sidecar
    with its hash and a guessed GPU and TensorRT version. The manifest entry is written only by a build
    that ran here; the run directory itself is the trust boundary (docs/run-directory.md).
    """
    entry = run_dir.stage_entry("build") or {}
    recorded = (entry.get("artifacts") or {}).get(ENGINE, {}).get("sha256") if entry.get("status") == "ok" else None
    if recorded != sha256:
        why = "no build is recorded" if recorded is None else f"the build recorded sha256 {recorded[:12]}..."
        raise InputError(f"{engine_path.name} (sha256 {sha256[:12]}...) is not the engine the build stage recorded in "
                         f"the manifest ({why}); only engines this tool built here are loaded (an engine is "
                         f"executable code); rebuild it with `python -m pipeline build --run-dir {run_dir.path}`")
