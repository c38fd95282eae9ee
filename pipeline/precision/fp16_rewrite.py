"""Keeping nodes of a low float graph (FP16, BF16) in FP32: the rewrite's rules, pure (a graph in, a graph out; no
ModelOpt, no runtime). :mod:`pipeline.precision.fp16` converts with AutoCast and emulates; tune, the automatic
fallback and INT8's FP16 regions raise nodes through :func:`keep_in_fp32`. In the mutation command's scope
(scripts/mutation.sh), with tests/test_fp16_rewrite.py."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

FLOAT, FLOAT16, BFLOAT16 = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16
LOW = (FLOAT16, BFLOAT16)  # the low float types a graph's tensors can have
NAMES = {FLOAT16: "fp16", BFLOAT16: "bf16", FLOAT: "fp32"}  # each float type as a precision's name


def infer_types(model: onnx.ModelProto) -> dict[str, int]:
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    types = {}
    for value in list(inferred.graph.input) + list(inferred.graph.output) + list(inferred.graph.value_info):
        if value.type.HasField("tensor_type"):
            types[value.name] = value.type.tensor_type.elem_type
    for init in inferred.graph.initializer:
        types[init.name] = init.data_type
    for node in inferred.graph.node:
        if node.op_type == "Constant":
            for attr in node.attribute:
                if attr.name == "value":
                    types[node.output[0]] = attr.t.data_type
    return types


NOT_MOVABLE = ("Cast", "Constant", "QuantizeLinear", "DequantizeLinear")


def keep_in_fp32(model: onnx.ModelProto, nodes, fp32_model: onnx.ModelProto | None = None) -> onnx.ModelProto:
    """The same graph with ``nodes`` (those that compute in FP16) computing in FP32: their FP16 inputs cast up,
    their outputs computed in FP32, and cast back to FP16 only for consumers outside the set, so a chain of
    moved nodes (``(f + 384) - 384``) stays in FP32 throughout. What AutoCast's ``nodes_to_exclude`` gives the
    FP16 graph, for a graph AutoCast did not make: ModelOpt's INT8 quantization converts the regions it leaves
    unquantized to FP16 by op type only. Every FP16 value is exact in FP32, so nothing else changes. With
    ``fp32_model`` (the graph converted from), a moved node's FP16 weights and constants are its FP32 originals,
    as AutoCast's exclusion keeps them: cast up, they would keep the rounding the move is meant to undo."""
    types = infer_types(model)
    wanted = set(nodes)  # once, not per node of the graph
    moved = {n.name for n in model.graph.node if n.name in wanted and n.op_type not in NOT_MOVABLE
             and any(types.get(o) in LOW for o in n.output)}
    out = onnx.ModelProto()
    out.CopyFrom(model)
    if not moved:
        return out
    # A moved output keeps its name, now holding the FP32 value (what localisation compares with model.onnx),
    # and an FP16 copy serves the consumers outside the set; a graph output keeps its declared FP16 name.
    graph_outputs = {o.name for o in model.graph.output}
    renamed = {o: (f"{o}__fp32", o) if o in graph_outputs else (o, f"{o}__{NAMES[types[o]]}")
               for n in model.graph.node if n.name in moved for o in n.output if types.get(o) in LOW}
    originals = _fp32_originals(model, fp32_model, moved, out) if fp32_model is not None else {}
    nodes_out, cast_up = [], {}
    for node in model.graph.node:
        if node.name in moved:
            nodes_out += _moved(node, renamed, types, originals, cast_up)
        else:
            nodes_out.append(_reading_renamed(node, renamed))
    del out.graph.node[:]
    out.graph.node.extend(nodes_out)
    kept = [v for v in out.graph.value_info if v.name not in renamed]  # their types changed
    del out.graph.value_info[:]
    out.graph.value_info.extend(kept)
    return out


def _moved(node: onnx.NodeProto, renamed: dict, types: dict, originals: dict, cast_up: dict) -> list:
    """A moved node computing in FP32, preceded by the casts up of its FP16 inputs (each tensor cast once) and
    followed by the casts down of its outputs."""
    added = []
    node = copy_node(node)
    for i, name in enumerate(node.input):
        if name in renamed:
            node.input[i] = renamed[name][0]
        elif name and types.get(name) in LOW:
            if (node.name, i) in originals:
                node.input[i] = originals[(node.name, i)]
                continue
            if name not in cast_up:
                cast_up[name] = f"{name}__to_fp32"
                added.append(helper.make_node("Cast", [name], [cast_up[name]], name=f"{name}/fallback_to_fp32",
                                              to=FLOAT))
            node.input[i] = cast_up[name]
    attributes_to_fp32(node)
    downs = []
    for i, name in enumerate(node.output):
        if name in renamed:
            node.output[i], low_name = renamed[name]
            downs.append(helper.make_node("Cast", [node.output[i]], [low_name],
                                          name=f"{name}/fallback_to_{NAMES[types[name]]}", to=types[name]))
    return [*added, node, *downs]


def _fp32_originals(model: onnx.ModelProto, fp32_model: onnx.ModelProto, moved: set[str],
                    out: onnx.ModelProto) -> dict[tuple[str, int], str]:
    """``{(moved node, input index): FP32 initializer}`` for the moved nodes' inputs that are FP16 initializers or
    Constant outputs in ``model`` and initializers or Constants in ``fp32_model`` (same node name and index); the
    FP32 tensors are added to ``out``."""
    held = {t.name for t in model.graph.initializer} | {o for n in model.graph.node if n.op_type == "Constant"
                                                         for o in n.output}
    fp32_tensors = {t.name: t for t in fp32_model.graph.initializer}
    for n in fp32_model.graph.node:
        value = next((a.t for a in n.attribute if a.name == "value"), None) if n.op_type == "Constant" else None
        if value is not None and value.data_type == FLOAT:
            fp32_tensors[n.output[0]] = value
    fp32_nodes = {n.name: n for n in fp32_model.graph.node}
    found: dict[tuple[str, int], str] = {}
    added = {t.name for t in out.graph.initializer}
    for node in model.graph.node:
        original = fp32_nodes.get(node.name)
        if node.name not in moved or original is None or len(original.input) != len(node.input):
            continue
        for i, name in enumerate(node.input):
            source = fp32_tensors.get(original.input[i])
            if name in held and source is not None and source.data_type == FLOAT:
                found[(node.name, i)] = f"{original.input[i]}__fp32_original"
                if found[(node.name, i)] not in added:
                    tensor = onnx.TensorProto()
                    tensor.CopyFrom(source)
                    tensor.name = found[(node.name, i)]
                    out.graph.initializer.append(tensor)
                    added.add(tensor.name)
    return found


def _reading_renamed(node: onnx.NodeProto, renamed: dict) -> onnx.NodeProto:
    """A node outside the set reads a moved output's FP16 copy; a Cast to FP32 (AutoCast's entry into an FP32
    region) reads the FP32 value itself: through the FP16 copy it would round exactly what the move keeps (an
    Add kept in FP32 before a Gemm that AutoCast already kept there)."""
    if not any(name in renamed for name in node.input):
        return node
    to = next((a.i for a in node.attribute if a.name == "to"), None)
    side = 0 if node.op_type == "Cast" and to == FLOAT else 1
    node = copy_node(node)
    for i, name in enumerate(node.input):
        if name in renamed:
            node.input[i] = renamed[name][side]
    return node


def attributes_to_fp32(node: onnx.NodeProto) -> None:
    """FP16 in a node's attributes (Cast targets, constant tensors, dtype) becomes FP32, in place."""
    for attr in node.attribute:
        if node.op_type == "Cast" and attr.name == "to" and attr.i in LOW:
            attr.i = FLOAT
        elif attr.type == onnx.AttributeProto.TENSOR and attr.t.data_type in LOW:
            attr.t.CopyFrom(tensor_to_fp32(attr.t))
        elif attr.name == "dtype" and attr.type == onnx.AttributeProto.INT and attr.i in LOW:
            attr.i = FLOAT


def copy_node(node: onnx.NodeProto) -> onnx.NodeProto:
    out = onnx.NodeProto()
    out.CopyFrom(node)
    return out


def tensor_to_fp32(tensor: TensorProto) -> TensorProto:
    array = numpy_helper.to_array(tensor).astype(np.float32)
    return numpy_helper.from_array(array, tensor.name)
