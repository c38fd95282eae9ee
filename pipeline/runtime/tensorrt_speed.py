"""A precision mix on the deployment GPU: the graph built into a strongly typed TensorRT engine with the build
stage's recipe, timed with the benchmark's method on the device, and the precision each matrix layer really runs in
(TensorRT's engine inspector). The GPU twin of :mod:`pipeline.runtime.openvino_speed`."""

from __future__ import annotations

import json
import logging
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnx

from pipeline.core.errors import StageFailed, UsageError
from pipeline.precision.int8 import MATRIX_OPS

if TYPE_CHECKING:  # type-checked against tensorrt-stubs (tests/test_typecheck.py); never imported at run time
    import tensorrt as trt

    from pipeline.core.config_schema import BuildConfig

log = logging.getLogger("pipeline")
GPU_COMPUTE = "GPU compute"  # the label of TensorrtRunner's device-side timer (runners.QueuedAheadTimer)


def tensorrt_timing(model: onnx.ModelProto, images: np.ndarray, batches: list[int], method, *, build_cfg: BuildConfig,
                    timing_cache: Path | None = None, cuda_graphs: bool = False,
                    log_path: Path | None = None) -> dict:
    """The mix built as build builds an engine (:func:`build_engine`: strongly typed, no precision flag, one
    profile of ``build.min/opt/max_batch``, DETAILED profiling verbosity), run by benchmark's
    :class:`~pipeline.runtime.runners.TensorrtRunner` and timed with benchmark's device-side timer ("GPU compute":
    CUDA events with one inference queued ahead, over a CUDA graph with ``cuda_graphs``) and method
    (:func:`~pipeline.runtime.runners.measure`); the median per batch, and what the inspector says each matrix
    layer ran in. The same shape as :func:`pipeline.runtime.openvino_speed.openvino_timing`'s result."""
    from pipeline.core import env
    from pipeline.runtime.runners import TensorrtRunner, measure

    input_name, output_name = model.graph.input[0].name, model.graph.output[0].name
    shapes = _shapes(build_cfg, batches, list(images.shape[1:]))
    engine_bytes = build_engine(model, input_name=input_name, shapes=shapes, build_cfg=build_cfg,
                                timing_cache=timing_cache, log_path=log_path)
    dtype = onnx.helper.tensor_dtype_to_np_dtype(model.graph.input[0].type.tensor_type.elem_type)
    env.expose_libcudart()  # before Polygraphy's CUDA wrapper looks for it
    runner = TensorrtRunner(engine_bytes, {"profile": shapes, "precision": "a tune candidate"}, name="tune",
                            input_name=input_name, output_name=output_name, cuda_graphs=cuda_graphs)
    latency, spread = {}, {}
    with runner:
        runtime = runtime_precisions(runner.engine, model, {input_name: shapes["opt"]})
        for batch in batches:
            x = np.ascontiguousarray(np.resize(images, (batch, *images.shape[1:])), dtype=dtype)
            run_once = next(timer for label, timer in runner.timers({input_name: x}) if label.startswith(GPU_COMPUTE))
            samples = measure(run_once, method)["samples"]
            latency[batch] = float(np.median(samples))
            spread[batch] = [float(np.percentile(samples, 10)), float(np.percentile(samples, 90))]
    return {"latency_ms": latency, "p10_p90_ms": spread, "runtime": runtime}


def _shapes(build_cfg: BuildConfig, batches: list[int], input_size: list[int]) -> dict:
    """The build stage's profile; a batch it does not cover is the config's error, found before any build."""
    from pipeline.runtime.tensorrt_engine import profile_shapes

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
    (:mod:`pipeline.runtime.tensorrt_engine`) plus DETAILED profiling verbosity: without it the engine inspector
    names the layers but not their data types. The timing cache is read and merged into as build does. TensorRT's
    whole log goes to ``log_path`` (a scratch file when None); a failed build raises :class:`StageFailed` with
    TensorRT's errors."""
    from polygraphy.backend.trt import EngineBytesFromNetwork

    from pipeline.runtime import tensorrt_engine

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


def runtime_precisions(engine: trt.ICudaEngine, model: onnx.ModelProto, shapes: dict[str, list[int]]) -> dict[str, str]:
    """``{matrix layer of model: "int8" | "fp16" | "fp32" | ... | "unknown"}``: what the engine inspector says each
    matrix node ran in (:func:`pipeline.runtime.tensorrt_inspector.read`), inspected through an execution context
    with every input at ``shapes`` (``{input: shape}``), without which a dynamic-shape engine's layers show no data
    type. The unknown ones are logged: a matrix node the inspector did not tell about is reported, not guessed."""
    from pipeline.runtime import tensorrt_inspector

    info = engine_information(engine, shapes)
    matrix = [node.name for node in model.graph.node if node.op_type in MATRIX_OPS]
    try:
        reading = tensorrt_inspector.read(info, [node.name for node in model.graph.node], matrix)
    except ValueError:
        verbosity = getattr(engine, "profiling_verbosity", "unknown")
        raise StageFailed(f"the TensorRT engine inspector reports layer names only (profiling verbosity "
                          f"{verbosity}); the layers' data types need an engine built with "
                          "ProfilingVerbosity.DETAILED "
                          "(tensorrt_engine.config_loader(detailed_profile=True))") from None
    if reading.unknown:
        log.warning("tensorrt: the engine inspector tells the precision of %d of %d matrix layers; unknown: %s",
                    len(matrix) - len(reading.unknown), len(matrix), ", ".join(reading.unknown[:10]))
    return reading.precisions


def engine_information(engine: trt.ICudaEngine, shapes: dict[str, list[int]]) -> dict:
    """The inspector's JSON of ``engine`` (``LayerInformationFormat.JSON``), inspected through an execution context
    whose inputs are set to ``shapes``. ``IEngineInspector::setExecutionContext`` (TensorRT ``NvInferRuntime.h``):
    "Setting the execution context and specifying all the input shapes allows the inspector to calculate concrete
    dimensions for any dynamic shapes and display their format information. Otherwise ... format information will
    not be shown" (trtexec's ``--exportLayerInfo`` sets it too: ``samples/common/sampleInference.cpp``)."""
    import tensorrt

    from pipeline.runtime.runners import TensorrtCallFailed, checked

    context = engine.create_execution_context()
    if not context:
        raise TensorrtCallFailed("TensorRT could not create an execution context (its log above says why)")
    for name, shape in shapes.items():
        checked(context.set_input_shape(name, tuple(shape)), f"set_input_shape({name!r}, {tuple(shape)})")
    inspector = engine.create_engine_inspector()
    inspector.execution_context = context
    return json.loads(inspector.get_engine_information(tensorrt.LayerInformationFormat.JSON))
