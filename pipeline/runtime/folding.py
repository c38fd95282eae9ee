"""The constants of a graph ONNX Runtime runs unoptimised, computed once by ONNX Runtime itself.

``int8_exact`` runs the Q/DQ graph with every optimisation off (the graph as written), so ONNX Runtime dequantizes
every weight again on every inference: at 32x32 that was most of ResNet-18's time at batch 1 (10.8 ms; 4.6 ms with
the weights computed once). :func:`fold` runs the nodes whose inputs are all constants (the weights'
DequantizeLinear, the FP16 emulation's rounding casts of them) once, in ONNX Runtime with optimisations off, and puts
their outputs in the graph as initializers. The same kernels on the same inputs give the same values, so the graph
computes what it computed before, bit for bit (``tests/test_int8.py``); only element-wise and layout operators are
folded, whose every output element is one rounding of its inputs whatever the threads.
"""

from __future__ import annotations

import logging

import onnx
from onnx import numpy_helper, shape_inference

log = logging.getLogger("pipeline")

# Operators whose output elements each depend on their inputs' elements alone (no sum whose order threads change).
FOLDABLE = frozenset({"DequantizeLinear", "QuantizeLinear", "Cast", "Constant", "Identity", "Reshape", "Transpose",
                      "Unsqueeze", "Squeeze", "Flatten", "Concat", "Mul", "Add", "Sub", "Div", "Neg"})
# A folded graph is handed to ONNX Runtime as one protobuf (2 GiB at most); its weights grow fourfold from int8.
MAX_FOLDED_BYTES = 1 << 30  # the computed values, at most


def fold(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with its constant-only nodes replaced by their values; ``model`` itself where nothing folds, where
    a value's type cannot be inferred, or where the result would be too large to hand over."""
    graph = model.graph
    constants = {t.name for t in graph.initializer}
    folded = []
    for node in graph.node:
        if _foldable(node, constants):
            folded.append(node)
            constants.update(name for name in node.output if name)
    if not folded:
        return model
    produced = {name for node in folded for name in node.output}
    kept = [node for node in graph.node if not any(name in produced for name in node.output)]
    wanted = list(dict.fromkeys([*(name for node in kept for name in node.input if name in produced),
                                 *(out.name for out in graph.output if out.name in produced)]))
    try:
        values = _compute(model, folded, wanted)
    except Exception as exc:  # only a saving: the graph as it is computes the same
        log.debug("folding: left as it is: %s: %s", type(exc).__name__, exc)
        values = None
    if values is None:
        return model
    used = {name for node in kept for name in node.input} | {out.name for out in graph.output}
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:], out.graph.initializer[:], out.graph.value_info[:]
    out.graph.node.extend(kept)
    out.graph.initializer.extend([t for t in graph.initializer if t.name in used and t.name not in produced])
    out.graph.initializer.extend(numpy_helper.from_array(value, name) for name, value in zip(wanted, values,
                                                                                             strict=True))
    return out


def _foldable(node: onnx.NodeProto, constants: set[str]) -> bool:
    if node.op_type not in FOLDABLE or node.domain not in ("", "ai.onnx"):
        return False
    if node.op_type == "Constant":
        return True
    inputs = [name for name in node.input if name]
    return bool(inputs) and all(name in constants for name in inputs)


def _compute(model: onnx.ModelProto, nodes: list[onnx.NodeProto], wanted: list[str]):
    """The values of ``wanted``, from ``nodes`` and the initializers they read alone, by ONNX Runtime with
    optimisations off; None when one's type is unknown or they would be too large."""
    import onnxruntime as ort

    read = {name for node in nodes for name in node.input}
    sub = onnx.ModelProto()
    sub.CopyFrom(model)
    del sub.graph.node[:], sub.graph.input[:], sub.graph.output[:], sub.graph.value_info[:], sub.graph.initializer[:]
    sub.graph.node.extend(nodes)
    sub.graph.initializer.extend(t for t in model.graph.initializer if t.name in read)
    infos = {v.name: v for v in shape_inference.infer_shapes(sub).graph.value_info}
    if any(name not in infos or not infos[name].type.tensor_type.elem_type for name in wanted):
        return None
    sub.graph.output.extend(infos[name] for name in wanted)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    values = ort.InferenceSession(sub.SerializeToString(), options, providers=["CPUExecutionProvider"]).run(wanted, {})
    return None if sum(v.nbytes for v in values) > MAX_FOLDED_BYTES else values
