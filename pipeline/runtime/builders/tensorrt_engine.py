"""The TensorRT engine: which engines exist (targets), the strongly typed recipe (Polygraphy loaders), the build
log, and the only way an engine file is read back (sidecar and manifest checks).

The build stage writes engines with this recipe; verify, benchmark and localisation load and rebuild with it.
TensorRT 10.12 deprecated weak typing and TensorRT 11 removed it: every network is parsed with
``strongly_typed=True`` and the builder config carries no precision flag; an engine's precisions come from
its ONNX graph.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.core import engine_sidecar as sidecars
from pipeline.core import env
from pipeline.core.artifacts import (  # noqa: F401
    FP16_ENGINE,
    FP16_ONNX,
    INT8_ENGINE,
    INT8_ENGINE_SIDECAR,
    INT8_ONNX,
    engine_file,
    engine_sidecar,
    graph_file,
    timing_cache_name,
)

# The engines' file names, as the tests and the fakes of TensorRT read them from here.
from pipeline.core.artifacts import FP16_ENGINE_SIDECAR as SIDECAR  # noqa: F401
from pipeline.core.engine_sidecar import EngineSidecar, Platform
from pipeline.core.errors import InputError
from pipeline.core.run import RunDir
from pipeline.precision import PRECISIONS

if TYPE_CHECKING:  # annotations only
    from pipeline.core.config_schema import BuildConfig, Config

log = logging.getLogger("pipeline")

SIDECAR_SCHEMA = sidecars.SCHEMA


@dataclass(frozen=True)
class Target:
    """One engine the build stage can make: its precision, its files, and the ONNX graph it comes from."""

    precision: str  # a ``build.precisions`` entry
    onnx: str  # the strongly typed source graph export writes
    engine: str
    sidecar: str
    switch: str  # the export setting that turns the source graph off


# One engine per lower precision, strongly typed from its graph (pipeline/precision/plugs.py).
TARGETS = tuple(Target(p, graph_file(p), engine_file(p), engine_sidecar(p), f"export.{p}.enabled") for p in PRECISIONS)


def target_of(engine: str) -> Target:
    """The target that writes ``engine``; ValueError for any other name."""
    for t in TARGETS:
        if t.engine == engine:
            return t
    raise ValueError(f"{engine!r} is not an engine the build stage writes")


def skip_reason(cfg: Config, run_dir: RunDir, engine: str) -> str:
    """Why ``engine`` is not built where TensorRT can run: not selected, or recorded as skipped by build; "" else."""
    t = target_of(engine)
    if t.precision not in cfg.build.precisions:
        return f"build.precisions does not include {t.precision}"
    build = run_dir.build_record()
    return build.skipped.get(t.precision, "") if build is not None else ""


def availability() -> tuple[bool, str]:
    """Whether an engine can be built here, and if not, the exact reason."""
    trt, reason = env.tensorrt_status()
    if trt is None:
        return False, reason
    ok, reason = env.cuda_status()
    if not ok:
        return False, f"TensorRT {getattr(trt, '__version__', '?')} is installed but there is {reason}"
    return True, ""


def timing_cache_path(cfg: Config, run_dir: RunDir, platform: dict | None = None) -> Path:
    """``build.timing_cache`` when given (the user's choice wins); else beside the run directories, one file
    per TensorRT version, GPU and compute capability (``trt_timing.11.4.0.NVIDIA_H200.sm90.cache``), so every run
    on this machine with this GPU and TensorRT shares (and merges into) one cache, and no other GPU's does."""
    if cfg.build.timing_cache:
        return Path(cfg.build.timing_cache).expanduser()
    platform = platform or current_platform()
    return run_dir.path.resolve().parent / timing_cache_name(platform.get("tensorrt"), platform.get("gpu"),
                                                             platform.get("compute_capability"))


def profile_shapes(build_cfg: BuildConfig, input_size: list[int]) -> dict[str, list[int]]:
    """The one optimization profile: ``build.min/opt/max_batch`` images of ``input_size``."""
    return {"min": [build_cfg.min_batch, *input_size], "opt": [build_cfg.opt_batch, *input_size],
            "max": [build_cfg.max_batch, *input_size]}


def network_loader(onnx_path: Path):
    """The strongly typed network parser (Polygraphy ``NetworkFromOnnxPath``); lazy."""
    from polygraphy.backend.trt import NetworkFromOnnxPath

    return NetworkFromOnnxPath(str(onnx_path), strongly_typed=True)


def config_loader(*, input_name: str, shapes: dict, build_cfg: BuildConfig, timing_cache: Path | None,
                  detailed_profile: bool = False):
    """The builder config (Polygraphy ``CreateConfig``): one profile, no precision flag; lazy.

    ``detailed_profile``: ``ProfilingVerbosity.DETAILED`` asked for explicitly, for a caller that reads the engine
    inspector's layer data types (tune); TensorRT's own default names the layers only. Without it the config keeps
    Polygraphy's default (DETAILED in 0.53.6). Asking for it imports TensorRT when this is called.
    """
    from polygraphy.backend.trt import CreateConfig, Profile

    verbosity = None
    if detailed_profile:
        import tensorrt

        verbosity = tensorrt.ProfilingVerbosity.DETAILED
    profile = Profile().add(input_name, min=shapes["min"], opt=shapes["opt"], max=shapes["max"])
    return CreateConfig(
        tf32=build_cfg.tf32,
        profiles=[profile],
        builder_optimization_level=build_cfg.optimization_level,
        load_timing_cache=str(timing_cache) if timing_cache and timing_cache.exists() else None,
        profiling_verbosity=verbosity,
    )


def engine_loader(onnx_path: Path, *, input_name: str, shapes: dict, build_cfg: BuildConfig, timing_cache: Path | None):
    """The Polygraphy loader chain; lazy: nothing touches TensorRT until it is called.

    Returns an ``EngineBytesFromNetwork`` that yields the serialized engine.
    """
    from polygraphy.backend.trt import EngineBytesFromNetwork

    config = config_loader(input_name=input_name, shapes=shapes, build_cfg=build_cfg, timing_cache=timing_cache)
    return EngineBytesFromNetwork(network_loader(onnx_path), config=config,
                                  save_timing_cache=str(timing_cache) if timing_cache else None)


@contextlib.contextmanager
def tensorrt_log(path: Path):
    """Everything TensorRT, its ONNX parser and Polygraphy log while building, written to ``path``; yields the
    list of ERROR lines (TensorRT's ERROR/INTERNAL_ERROR and the parser's errors), filled as they come.

    Polygraphy forwards TensorRT's logger to its own; for the build it goes through Python logging, so the
    whole log lands in the file, and the errors reach the console and the stage's failure message.
    """
    from polygraphy.logger import G_LOGGER

    errors: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            text = re.sub(r"^\s*\[[A-Z]\]\s*", "", record.getMessage())  # Polygraphy's "[E] " prefix
            if record.levelno >= logging.ERROR and not text.startswith("[!]"):
                errors.extend(line.strip() for line in text.splitlines() if line.strip())
                log.error("build: TensorRT: %s", text)

    path.parent.mkdir(parents=True, exist_ok=True)
    saved = G_LOGGER.module_severity, G_LOGGER.use_python_logging_system, G_LOGGER.log_file
    G_LOGGER.module_severity = G_LOGGER.VERBOSE  # TensorRT's INFO arrives as Polygraphy VERBOSE
    G_LOGGER.use_python_logging_system = True
    G_LOGGER.log_file = str(path)
    polygraphy_log = logging.getLogger("Polygraphy")
    handler, propagate = Collect(), polygraphy_log.propagate
    polygraphy_log.addHandler(handler)
    polygraphy_log.propagate = False  # the file has it all; the console gets the errors only
    try:
        yield errors
    finally:
        polygraphy_log.removeHandler(handler)
        polygraphy_log.propagate = propagate
        G_LOGGER.log_file = saved[2]
        G_LOGGER.use_python_logging_system = saved[1]
        G_LOGGER.module_severity = saved[0]


def current_platform() -> dict:
    """What an engine is bound to on this machine: TensorRT version and GPU."""
    trt, _ = env.tensorrt_status()
    gpu = env.gpu_info() or {}
    return {"tensorrt": getattr(trt, "__version__", None), "gpu": gpu.get("name"),
            "compute_capability": gpu.get("compute_capability")}


def check_sidecar(engine_path: Path, engine_bytes: bytes, sidecar_path: Path, platform: dict) -> EngineSidecar:
    """Every condition under which an engine may be deserialized; raises InputError otherwise."""
    rebuild = f"rebuild it with `python -m pipeline build --run-dir {engine_path.parent}`"
    sidecar = sidecars.read(sidecar_path, engine_path.name, rebuild=rebuild, why=" (an engine is executable code)")
    if sidecar.engine != engine_path.name:
        raise InputError(f"{sidecar_path.name} describes {sidecar.engine}, not {engine_path.name}; refusing to "
                         f"load it; {rebuild}")
    actual = hashlib.sha256(engine_bytes).hexdigest()
    if actual != sidecar.sha256:
        raise InputError(f"{engine_path.name} does not match its sidecar (sha256 {actual[:12]}..., recorded "
                         f"{sidecar.sha256[:12]}...): the file was changed after the build; {rebuild}")
    built, here = sidecar.platform, Platform.model_validate(platform)
    for what, theirs, ours in (("TensorRT version", built.tensorrt, here.tensorrt), ("GPU", built.gpu, here.gpu),
                               ("compute capability", built.compute_capability, here.compute_capability)):
        if theirs != ours:
            raise InputError(f"{engine_path.name} was built for {what} {theirs}, but this machine has "
                             f"{ours}; engines only run where they were built: {rebuild}")
    return sidecar


def load_engine_bytes(run_dir: RunDir, platform: dict | None = None, *,
                      engine: str = FP16_ENGINE) -> tuple[bytes, EngineSidecar]:
    """The bytes of ``engine`` (``model.fp16.engine`` or ``model.int8.engine``), after :func:`check_sidecar`
    passed on exactly those bytes and :func:`check_recorded` found them in the manifest.

    This is the only way the pipeline reads an engine file.
    """
    t = target_of(engine)
    engine_path = run_dir.file(t.engine)
    if not engine_path.is_file():
        raise InputError(f"{engine_path} does not exist; run `python -m pipeline build --run-dir {run_dir.path}`")
    data = engine_path.read_bytes()
    sidecar = check_sidecar(engine_path, data, run_dir.file(t.sidecar), platform or current_platform())
    check_recorded(run_dir, engine_path, hashlib.sha256(data).hexdigest())
    return data, sidecar


def check_recorded(run_dir: RunDir, engine_path: Path, sha256: str) -> None:
    """The engine must be the one the build stage recorded in the manifest (sha256 of these bytes).

    A sidecar alone proves nothing: anyone who can put an engine in the run directory can write a sidecar
    with its hash and a guessed GPU and TensorRT version. The manifest entry is written only by a build
    that ran here; the run directory itself is the trust boundary (docs/run-directory.md).
    """
    recorded = run_dir.recorded_sha256("build", engine_path.name)
    if recorded != sha256:
        why = "no build is recorded" if recorded is None else f"the build recorded sha256 {recorded[:12]}..."
        raise InputError(f"{engine_path.name} (sha256 {sha256[:12]}...) is not the engine the build stage recorded in "
                         f"the manifest ({why}); only engines this tool built here are loaded (an engine is "
                         f"executable code); rebuild it with `python -m pipeline build --run-dir {run_dir.path}`")
