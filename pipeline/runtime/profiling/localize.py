"""Layer-by-layer localisation of a lower-precision failure: the first node over the gate's rule, per tensor.

Every lower-precision graph keeps the FP32 export's tensor names (AutoCast only inserts Casts, ModelOpt only Q/DQ),
so after marking every tensor as an output, the FP32 model and the candidate can be compared tensor by tensor. The
candidate is the precision's faithful execution on ONNX Runtime (any machine) or, on a GPU, the TensorRT engine
built with every tensor marked (which can change fusions; Polygraphy's own accuracy guide warns of that).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import TYPE_CHECKING

import numpy as np
import onnx

from pipeline.core import onnx_io
from pipeline.core.check_results import Localization, NodeError
from pipeline.precision.gate import TensorRule
from pipeline.runtime.profiling import localize_rules
from pipeline.runtime.runners import collect, onnxrt_runner

if TYPE_CHECKING:  # annotations only
    from pipeline.core.config_schema import BuildConfig

log = logging.getLogger("pipeline")

def _marked_outputs(model: onnx.ModelProto, feed: dict, name: str) -> OrderedDict:
    marked = onnx_io.mark_all_outputs(model)
    return collect(onnxrt_runner(marked.SerializeToString(), name=name), [feed])[0]


def compare_layers(fp32_model: onnx.ModelProto, ref: dict, cand: dict, rule: TensorRule, top: int) -> Localization:
    """Walk the FP32 graph in topological order; report the first node over ``rule`` and the worst nodes."""
    rows = []
    first = None
    for node in fp32_model.graph.node:
        if node.op_type == "Constant":
            continue
        for out in node.output:
            if out not in ref or out not in cand:
                continue
            r, c = np.asarray(ref[out]), np.asarray(cand[out])
            if r.dtype.kind != "f" or r.shape != c.shape or r.size == 0:
                continue
            row = NodeError(name=node.name, op_type=node.op_type, tensor=out, **rule.errors(r, c))
            rows.append(row)
            if first is None and row.exceeds:
                first = row
            break  # one row per node: its first float output
    worst = sorted(rows, key=lambda r: ((r.nonfinite or 0) > 0, r.scaled_error), reverse=True)[:top]
    return Localization(first_divergent=first, worst=worst, compared_nodes=len(rows), tolerance=rule.describe())


def tensorrt_layers_engine(onnx_path, *, input_name: str, shapes: dict, build_cfg: BuildConfig, timing_cache=None):
    """The localisation engine's loader: the engine's own network parser and builder config
    (``tensorrt_engine.network_loader``, ``tensorrt_engine.config_loader``: strongly typed, same profile,
    ``build.tf32``, ``build.optimization_level``, the engine's timing cache), with every tensor marked as a network
    output. Lazy: nothing touches TensorRT."""
    from polygraphy import constants
    from polygraphy.backend.trt import EngineFromNetwork, ModifyNetworkOutputs

    from pipeline.runtime.builders import tensorrt_engine

    network = ModifyNetworkOutputs(tensorrt_engine.network_loader(onnx_path), outputs=constants.MARK_ALL)
    config = tensorrt_engine.config_loader(input_name=input_name, shapes=shapes, build_cfg=build_cfg,
                                           timing_cache=timing_cache)
    return EngineFromNetwork(network, config=config)


def localize_tensorrt(fp32_model: onnx.ModelProto, fp16_path, feed: dict, rule: TensorRule, top: int,
                      input_name: str, shapes: dict, *, build_cfg: BuildConfig, timing_cache=None) -> Localization:
    """GPU: the FP16 (or BF16, INT8) engine rebuilt with every tensor marked as a network output, against FP32 ONNX
    Runtime.

    Built with the engine's configuration (:func:`tensorrt_layers_engine`), so it diagnoses the engine that failed.
    """
    from polygraphy.backend.trt import TrtRunner

    from pipeline.core import env
    from pipeline.runtime.runners import DEVICE_MEMORY

    engine = tensorrt_layers_engine(fp16_path, input_name=input_name, shapes=shapes, build_cfg=build_cfg,
                                    timing_cache=timing_cache)
    ref = _marked_outputs(fp32_model, feed, "fp32-layers")
    env.expose_libcudart()  # before Polygraphy's CUDA wrapper looks for it
    # Inputs as torch CUDA tensors, so TrtRunner returns torch tensors: a BF16 engine's marked tensors are bfloat16,
    # which Polygraphy's NumPy path cannot hold (its NumPy type map has no bfloat16); runners.to_numpy widens them.
    device_feed = {name: DEVICE_MEMORY.tensor(np.ascontiguousarray(array)) for name, array in feed.items()}
    cand = collect(TrtRunner(engine, name="tensorrt-layers"), [device_feed])[0]
    return compare_layers(fp32_model, ref, cand, rule, top).with_method(
        "TensorRT engine rebuilt with the engine's build config and every tensor marked as output (can change fusions) "
        "vs FP32 ONNX Runtime")


def localize_faithful(plug, fp32_model: onnx.ModelProto, model: onnx.ModelProto, feed: dict, rule: TensorRule,
                      top: int) -> Localization:
    """FP32 ONNX Runtime vs ``plug``'s faithful execution of ``model`` (the emulation that rounds every low tensor;
    the Q/DQ graph executed exactly, optimisations off), every tensor marked as an output. With the plug's
    ``exact_localization``, the first node over tolerance is the first one that computes below FP32."""
    ref = _marked_outputs(fp32_model, feed, "fp32-layers")
    # Only the FP32 graph's tensors are compared; the rounding casts' own outputs (bfloat16: no NumPy type in ONNX
    # Runtime) are not asked for.
    produced = [out for node in fp32_model.graph.node if node.op_type != "Constant" for out in node.output if out]
    marked = onnx_io.mark_outputs(plug.faithful_model(model), produced)
    cand = collect(onnxrt_runner(marked.SerializeToString(), name=f"{plug.faithful}-layers",
                                 optimize=plug.faithful_optimized), [feed])[0]
    if not plug.exact_localization:
        return compare_layers(fp32_model, ref, cand, rule, top).with_method(
            f"ONNX Runtime, FP32 graph vs {plug.faithful}, every tensor marked as output")
    order = {node.name: i for i, node in enumerate(fp32_model.graph.node)}
    result = compare_layers(fp32_model, ref, cand, rule, top=len(order))
    first = localize_rules.first_lowered_over(result.worst, localize_rules.lowered(
        plug.node_precisions(fp32_model, model)), order)
    # No lowered node over tolerance: compare_layers' first node over tolerance (the fallback walks upstream from it).
    return result.model_copy(update={
        "first_divergent": result.first_divergent if first is None else first, "worst": result.worst[:top],
        "method": f"ONNX Runtime, FP32 graph vs {plug.faithful} (optimisations off), every tensor marked as output; "
                  f"the first node below FP32 over tolerance"})
