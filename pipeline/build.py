"""The build stage: one strongly typed TensorRT engine per precision, each from its ONNX graph (the recipe and
the loaders are in :mod:`pipeline.runtime.builders.tensorrt_engine`), and the OpenVINO IR for CPUs.

TensorRT 10.12 deprecated weak typing and TensorRT 11 removed it (no ``BuilderFlag.FP16``/``INT8``, no
layer precisions, no INT8 calibrators). An engine's precisions therefore come from its ONNX graph's
types: ``model.fp16.onnx`` (AutoCast) gives ``model.fp16.engine``, ``model.int8.onnx`` (explicit Q/DQ)
gives ``model.int8.engine``. ``build.precisions`` selects which; a precision whose ONNX graph export
did not write is skipped with its reason. Every network is parsed with ``strongly_typed=True``
(required on 10.12-10.x, implied on 11) and the builder config carries no precision flag at all.
TF32 is a deliberate choice (``build.tf32``, default off: the layers AutoCast kept in FP32 then
compute in true FP32, as verify assumed) and is recorded.

An engine file stays a plain serialized engine; everything about it lives in its sidecar
(``model.fp16.engine.json``, ``model.int8.engine.json``). An engine is executable code:
:func:`tensorrt_engine.load_engine_bytes` refuses any engine whose sidecar is missing, was not written by this tool,
whose sha256 no longer matches, or that was built for another GPU or TensorRT version, and any engine
whose sha256 the build stage did not record in the manifest.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline import __version__
from pipeline.core import engine_sidecar, precision_config
from pipeline.core.artifacts import FP32_ONNX, MODEL_CARD, build_log
from pipeline.core.engine_sidecar import BuildFlags, EngineSidecar, Platform, ProfileShapes
from pipeline.core.errors import BackendUnavailable, InputError, StageFailed
from pipeline.core.run import RunDir, StageRecord, atomic_write, now, sha256_file, write_json
from pipeline.runtime.builders import openvino_ir, tensorrt_engine
from pipeline.runtime.builders.tensorrt_engine import Target

if TYPE_CHECKING:  # annotations only
    from pipeline.core.config_schema import Config
    from pipeline.core.model_card import CardSpec

log = logging.getLogger("pipeline")

def check_required(cfg: Config) -> None:
    """``require: [tensorrt]`` (or ``cuda``) where no engine can be built: :class:`BackendUnavailable`."""
    if "tensorrt" in cfg.require or "cuda" in cfg.require:
        ok, reason = tensorrt_engine.availability()
        if not ok:
            raise BackendUnavailable(f"TensorRT engine required but {reason}")


def plan(cfg: Config, run_dir: RunDir) -> list[tuple[Target, Path | None, str]]:
    """Per target: the ONNX graph to build it from, or None and why it is skipped. A precision whose graph export
    does not write (``export.<precision>.enabled`` false, ModelOpt absent) is skipped with its reason, never built
    from another graph under its name; with its export on, a missing graph is "run export first"."""
    planned: list[tuple[Target, Path | None, str]] = []
    for t in tensorrt_engine.TARGETS:
        if t.precision not in cfg.build.precisions:
            planned.append((t, None, f"build.precisions does not include {t.precision}"))
        elif run_dir.file(t.onnx).exists():
            planned.append((t, run_dir.file(t.onnx), ""))
        else:
            planned.append((t, None, _no_onnx_reason(cfg, run_dir, t)))
    return planned


def _no_onnx_reason(cfg: Config, run_dir: RunDir, t: Target) -> str:
    if not precision_config.export_section(cfg, t.precision).enabled:
        return f"no {t.onnx} ({t.switch} is false)"
    why = run_dir.export_skipped(t.precision)  # e.g. no ModelOpt
    if why:
        return f"export wrote no {t.onnx} ({why})"
    run_dir.require(t.onnx, "export", "build")  # raises: export is enabled but wrote nothing
    return f"export wrote no {t.onnx}; run export"


def run(cfg: Config, run_dir: RunDir, record: StageRecord) -> None:
    from pipeline.core import model_card

    spec = model_card.read(run_dir.require(MODEL_CARD, "train", "build")).spec
    planned = plan(cfg, run_dir)
    check_required(cfg)
    record.details["openvino"] = openvino_ir.write_all(cfg, run_dir, record)  # the CPU IR, with TensorRT or without
    ok, reason = tensorrt_engine.availability()
    if not ok:
        for t, onnx_path, _ in planned:
            _remove_stale(run_dir, t, onnx_path)
        record.skip(reason)
        return
    platform = tensorrt_engine.current_platform()
    engines, skipped = {}, {}
    for t, onnx_path, why in planned:
        if onnx_path is None:
            _remove_stale(run_dir, t, None)
            skipped[t.precision] = why
            log.info("build: %s engine skipped: %s", t.precision, why)
            continue
        sidecar = build_engine(cfg, run_dir, t, onnx_path, spec, platform)
        engines[t.precision] = sidecar.summary()
        record.artifact(t.engine)
        record.artifact(t.sidecar)
    record.details.update({"engines": engines, "skipped": skipped, **platform})
    if not engines:
        record.skip("no engine to build: " + "; ".join(f"{p}: {why}" for p, why in skipped.items()))


def build_engine(cfg: Config, run_dir: RunDir, t: Target, onnx_path: Path, spec: CardSpec,
                 platform: dict) -> EngineSidecar:
    """Build one strongly typed engine from ``onnx_path``; write it and its sidecar; return the sidecar."""
    shapes = tensorrt_engine.profile_shapes(cfg.build, spec.input_size)  # Polygraphy's profile, and the sidecar's
    profile = ProfileShapes.model_validate({"input": spec.input_name, **shapes})
    cache = tensorrt_engine.timing_cache_path(cfg, run_dir, platform)
    cache.parent.mkdir(parents=True, exist_ok=True)
    loader = tensorrt_engine.engine_loader(onnx_path, input_name=spec.input_name, shapes=shapes, build_cfg=cfg.build,
                           timing_cache=cache)
    log.info("build: %s -> %s (strongly typed, profile %s/%s/%s, optimization level %d, tf32 %s)", onnx_path.name,
             t.engine, profile.min[0], profile.opt[0], profile.max[0], cfg.build.optimization_level,
             cfg.build.tf32)
    start = time.perf_counter()
    with tensorrt_engine.tensorrt_log(run_dir.file(build_log(t.precision))) as errors:
        try:
            engine_bytes = bytes(loader())
        except Exception as exc:
            first = "; ".join(errors[:3]) or f"{type(exc).__name__}: {str(exc).strip()}"
            raise StageFailed(f"TensorRT engine build failed: {first} ({t.engine}; whole log: "
                              f"{build_log(t.precision)})") from None
    seconds = time.perf_counter() - start
    atomic_write(run_dir.file(t.engine), engine_bytes)
    sidecar = EngineSidecar(
        schema_id=tensorrt_engine.SIDECAR_SCHEMA,
        built_by=f"pipeline {__version__}",
        engine=t.engine,
        sha256=sha256_file(run_dir.file(t.engine)),
        size=len(engine_bytes),
        onnx=onnx_path.name,
        onnx_sha256=sha256_file(onnx_path),
        precision_label=built_precision(run_dir, t, onnx_path),
        platform=Platform.model_validate(platform),
        profile=profile,
        flags=BuildFlags(strongly_typed=True, precision_flags=[], tf32=cfg.build.tf32,
                         builder_optimization_level=cfg.build.optimization_level),
        timing_cache=str(cache),
        log=build_log(t.precision),  # not a manifest artifact: logs/ is not a plain file name
        build_seconds=round(seconds, 2),
        built_at=now(),
    )
    write_json(run_dir.file(t.sidecar), sidecar.to_json())
    log.info("build: %s %.1f MiB in %.1f s on %s (TensorRT %s)", t.engine, len(engine_bytes) / 2**20, seconds,
             sidecar.platform.gpu, sidecar.platform.tensorrt)
    return sidecar


def built_precision(run_dir: RunDir, t: Target, onnx_path: Path) -> str:
    """The precision the engine really has, from the graph it was built from (recorded in sidecar and manifest)."""
    from pipeline.core import onnx_io
    from pipeline.precision import plugs

    plug = plugs.by_name(t.precision)
    graph = onnx_io.load(onnx_path, f"{plug.label} ONNX model")
    precisions = plug.node_precisions(onnx_io.load(run_dir.file(FP32_ONNX)), graph)
    counts = {p: sum(1 for _, q in precisions.values() if q == p) for p in plug.ladder}
    return (f"{t.precision} (strongly typed from {t.onnx}: " +
            ", ".join(f"{n} nodes {p}" for p, n in counts.items()) + ")")


def _remove_stale(run_dir: RunDir, t: Target, onnx_path: Path | None) -> None:
    """Never leave an engine that this run did not build beside its inputs (unless it was built from them)."""
    if onnx_path is not None and _sidecar_matches_onnx(run_dir, t, onnx_path):
        return
    for stale in (t.engine, t.sidecar):
        run_dir.file(stale).unlink(missing_ok=True)


def _sidecar_matches_onnx(run_dir: RunDir, t: Target, onnx_path: Path) -> bool:
    try:
        sidecar = engine_sidecar.read(run_dir.file(t.sidecar), t.engine, rebuild="rebuild it")
    except InputError:
        return False
    return sidecar.onnx_sha256 == sha256_file(onnx_path)
