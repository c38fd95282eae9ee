"""A precision mix on the deployment GPU: the graph built into a strongly typed TensorRT engine with the build
stage's recipe, timed with the benchmark's method on the device, and the precision each matrix layer really runs in
(TensorRT's engine inspector). The GPU twin of :mod:`pipeline.runtime.speed.openvino_speed`."""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnx

from pipeline.core.errors import StageFailed, UsageError
from pipeline.runtime.profiling.tensorrt_inspection import engine_information, runtime_precisions  # noqa: F401
from pipeline.runtime.speed.openvino_speed import Session, timed_alone

if TYPE_CHECKING:  # type-checked against tensorrt-stubs (tests/test_typecheck.py); never imported at run time

    from pipeline.core.config_schema import BuildConfig

log = logging.getLogger("pipeline")


@contextmanager
def tensorrt_session(model: onnx.ModelProto, images: np.ndarray, batches: list[int], *, build_cfg: BuildConfig,
                     timing_cache: Path | None = None, cuda_graphs: bool = False,
                     log_path: Path | None = None) -> Iterator[Session]:
    """The mix built as build builds an engine (:func:`build_engine`: strongly typed, no precision flag, one
    profile of ``build.min/opt/max_batch``, DETAILED profiling verbosity), run by benchmark's
    :class:`~pipeline.runtime.runners.TensorrtRunner`: a timer per batch, benchmark's device-side timer ("GPU
    compute": CUDA events with one inference queued ahead, over a CUDA graph with ``cuda_graphs``), and what the
    inspector says each matrix layer ran in. The same shape as
    :func:`pipeline.runtime.speed.openvino_speed.openvino_session`'s; open while timed (interleaved rounds)."""
    from pipeline.core import env
    from pipeline.core.engine_sidecar import ProfileShapes
    from pipeline.runtime.runners import BoundEngine, GraphedEngine, TensorrtRunner, check_dtypes

    input_name, output_name = model.graph.input[0].name, model.graph.output[0].name
    shapes = _shapes(build_cfg, batches, list(images.shape[1:]))
    engine_bytes = build_engine(model, input_name=input_name, shapes=shapes, build_cfg=build_cfg,
                                timing_cache=timing_cache, log_path=log_path)
    dtype = onnx.helper.tensor_dtype_to_np_dtype(model.graph.input[0].type.tensor_type.elem_type)
    env.expose_libcudart()  # before Polygraphy's CUDA wrapper looks for it
    profile = ProfileShapes.model_validate({"input": input_name, **shapes})
    runner = TensorrtRunner(engine_bytes, profile, note="a tune candidate", name="tune",
                            input_name=input_name, output_name=output_name, cuda_graphs=cuda_graphs)
    with runner:
        runtime = runtime_precisions(runner.engine, model, {input_name: profile.opt})
        bound = {}  # one execution context per batch, all open at once (the rounds alternate between them)
        try:
            for batch in batches:
                x = np.ascontiguousarray(np.resize(images, (batch, *images.shape[1:])), dtype=dtype)
                check_dtypes(runner.engine, {input_name: x.dtype})
                kind = GraphedEngine if cuda_graphs else BoundEngine
                bound[batch] = kind(runner.engine, input_name=input_name, output_name=output_name, host=x)
            yield Session({batch: engine.gpu_compute for batch, engine in bound.items()}, runtime)
        finally:
            for engine in bound.values():
                engine.close()


def tensorrt_timing(model: onnx.ModelProto, images: np.ndarray, batches: list[int], method, *, build_cfg: BuildConfig,
                    timing_cache: Path | None = None, cuda_graphs: bool = False,
                    log_path: Path | None = None) -> dict:
    """:func:`tensorrt_session` timed alone with benchmark's method: the median per batch, and the inspector's
    precisions (the same shape as :func:`pipeline.runtime.speed.openvino_speed.openvino_timing`'s result)."""
    with tensorrt_session(model, images, batches, build_cfg=build_cfg, timing_cache=timing_cache,
                          cuda_graphs=cuda_graphs, log_path=log_path) as session:
        return timed_alone(session, method)


def _shapes(build_cfg: BuildConfig, batches: list[int], input_size: list[int]) -> dict:
    """The build stage's profile; a batch it does not cover is the config's error, found before any build."""
    from pipeline.runtime.builders.tensorrt_engine import profile_shapes

    shapes = profile_shapes(build_cfg, input_size)
    outside = [b for b in batches if not shapes["min"][0] <= b <= shapes["max"][0]]
    if outside:
        raise UsageError(f"batch {', '.join(map(str, outside))} is outside the TensorRT profile "
                         f"[build.min_batch={shapes['min'][0]}, build.max_batch={shapes['max'][0]}]; widen the profile "
                         "or change benchmark.batch_sizes")
    return shapes


def build_engine(model: onnx.ModelProto, *, input_name: str, shapes: dict, build_cfg: BuildConfig,
                 timing_cache: Path | None, log_path: Path | None = None) -> bytes:
    """The serialized engine of ``model``, built with the build stage's network parser and builder config
    (:mod:`pipeline.runtime.builders.tensorrt_engine`) plus DETAILED profiling verbosity: without it the engine
    inspector
    names the layers but not their data types. The timing cache is read and merged into as build does. TensorRT's
    whole log goes to ``log_path`` (a scratch file when None); a failed build raises :class:`StageFailed` with
    TensorRT's errors."""
    from polygraphy.backend.trt import EngineBytesFromNetwork

    from pipeline.runtime.builders import tensorrt_engine

    with tempfile.TemporaryDirectory(prefix=".tune-trt.") as tmp:
        onnx_path = Path(tmp) / "candidate.onnx"
        onnx.save(model, str(onnx_path))  # the parser reads a file, as the build stage's does
        with tensorrt_engine.tensorrt_log(log_path or Path(tmp) / "build.log") as errors:
            try:
                config = tensorrt_engine.config_loader(input_name=input_name, shapes=shapes, build_cfg=build_cfg,
                                                       timing_cache=timing_cache, detailed_profile=True)
                loader = EngineBytesFromNetwork(tensorrt_engine.network_loader(onnx_path), config=config,
                                                save_timing_cache=str(timing_cache) if timing_cache else None)
                return bytes(loader())
            except Exception as exc:  # noqa: BLE001 (Polygraphy raises its own types; TensorRT logged why)
                first = "; ".join(errors[:3]) or f"{type(exc).__name__}: {str(exc).strip()}"
                raise StageFailed(f"TensorRT engine build of a candidate mix failed: {first}") from None
