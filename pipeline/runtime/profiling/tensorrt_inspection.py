"""A built TensorRT engine's own account of its layers: the engine inspector's JSON, read through an execution
context with every input shape set, and the precision each matrix node of the source graph ran in (the parsing is
:mod:`pipeline.runtime.profiling.tensorrt_inspector`'s, pure). tune's GPU target and verify's precision manifest both
read engines this way."""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING

import onnx

from pipeline.core.errors import StageFailed
from pipeline.precision.int8 import MATRIX_OPS
from pipeline.runtime.tensorrt_calls import TensorrtCallFailed, checked

if TYPE_CHECKING:  # type-checked against tensorrt-stubs (tests/test_typecheck.py); never imported at run time
    import tensorrt as trt

log = logging.getLogger("pipeline")


def runtime_precisions(engine: trt.ICudaEngine, model: onnx.ModelProto, shapes: dict[str, list[int]]) -> dict[str, str]:
    """``{matrix layer of model: "int8" | "fp16" | "fp32" | ... | "unknown"}``: what the engine inspector says each
    matrix node ran in (:func:`pipeline.runtime.profiling.tensorrt_inspector.read`), inspected through an execution
    context
    with every input at ``shapes`` (``{input: shape}``), without which a dynamic-shape engine's layers show no data
    type. The unknown ones are logged: a matrix node the inspector did not tell about is reported, not guessed."""
    from pipeline.runtime.profiling import tensorrt_inspector

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

    context = engine.create_execution_context()
    if not context:
        raise TensorrtCallFailed("TensorRT could not create an execution context (its log above says why)")
    for name, shape in shapes.items():
        checked(context.set_input_shape(name, tuple(shape)), f"set_input_shape({name!r}, {tuple(shape)})")
    inspector = engine.create_engine_inspector()
    inspector.execution_context = context
    return json.loads(inspector.get_engine_information(tensorrt.LayerInformationFormat.JSON))
