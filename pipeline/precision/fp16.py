"""The low float types, FP16 and BF16: AutoCast conversion, the precision report, the faithful emulation on any CPU,
and keeping nodes in FP32. One implementation for both: a graph's types say which low type each tensor has, so every
function here reads the type from the graph (FP16 and BF16 plugs differ only in data: pipeline/precision/plugs.py).

TensorRT 10.12+ and 11 build what the ONNX graph's types say (strong typing), so the FP16
precision decisions live in ``model.fp16.onnx``. ONNX Runtime's CPU provider computes FP16
regions in FP32 and hides FP16 rounding, so it cannot check those decisions. Two faithful
alternatives run here:

* ``fast`` (default): :func:`emulation_model` rewrites the FP16 graph into FP32 compute that
  rounds every FP16-typed tensor to FP16 (a Cast to float16 and back after each FP16 value;
  FP16 initializers and constants keep their FP16-rounded values). ONNX Runtime keeps such
  cast pairs at every optimisation level. This models FP16 storage with FP32 accumulation
  inside each op, which is how FP16 tensor-core kernels usually accumulate.
* ``strict``: ``onnx.reference.ReferenceEvaluator`` runs the FP16 graph in NumPy float16,
  accumulation included. Stricter than TensorRT usually is, and slow.
"""

from __future__ import annotations

import contextlib
import logging
import math
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from pipeline.core.errors import StageFailed
from pipeline.core.run import signals_held

if TYPE_CHECKING:  # annotations only
    from pipeline.core.config_schema import FP16Config

log = logging.getLogger("pipeline")

FLOAT, FLOAT16, BFLOAT16 = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16
LOW = (FLOAT16, BFLOAT16)  # the low float types a graph's tensors can have
NAMES = {FLOAT16: "fp16", BFLOAT16: "bf16", FLOAT: "fp32"}  # each float type as a precision's name
TYPES = {name: kind for kind, name in NAMES.items()}


# --------------------------------------------------------------------------- AutoCast


class _ReasonCapture(logging.Handler):
    """Collects AutoCast's "Skipping node <name>: <reason>" lines (its only record of why)."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@contextlib.contextmanager
def _quiet_autocast():
    """AutoCast logs INFO to stdout by default: capture it instead, keep warnings visible in --debug."""
    names = ["modelopt.onnx.autocast", "modelopt.onnx"]
    loggers = [logging.getLogger(n) for n in names]
    saved = [(lg, lg.level, lg.handlers[:], lg.propagate) for lg in loggers]
    capture = _ReasonCapture()
    for lg in loggers:
        lg.handlers[:] = []
        lg.propagate = False
    loggers[0].setLevel(logging.INFO)
    loggers[0].addHandler(capture)
    # Some AutoCast modules configure their own child loggers on import.
    children = [logging.getLogger(n) for n in logging.root.manager.loggerDict
                if n.startswith("modelopt.onnx.autocast.")]
    child_saved = [(lg, lg.handlers[:], lg.propagate) for lg in children]
    for lg in children:
        lg.handlers[:] = []
        lg.propagate = True
    try:
        yield capture
    finally:
        for lg, level, handlers, propagate in saved:
            lg.setLevel(level)
            lg.handlers[:] = handlers
            lg.propagate = propagate
        for lg, handlers, propagate in child_saved:
            lg.handlers[:] = handlers
            lg.propagate = propagate


def exact_name_regex(name: str) -> str:
    """AutoCast matches node names with ``re.match``; anchor an exact name."""
    return f"^{re.escape(name)}$"


def exact_names_patterns(names, graph: onnx.ModelProto) -> list[str]:
    """``nodes_to_exclude`` patterns (AutoCast's, ModelOpt INT8's) that match exactly those ``names`` that are nodes
    of ``graph`` (no other can match): one pattern for all of them, [] for none. Both libraries try every pattern on
    every node with ``re.match``, which compiles a pattern again once more than 512 are in use: a pattern per name
    was nodes x names compilations (a 13 MB fp16_fallback.json kept export busy for hours), and one pattern of
    names the graph does not have would still take seconds to compile."""
    present = {node.name for node in graph.graph.node}
    kept = [n for n in dict.fromkeys(names) if n in present]
    return [f"^(?:{'|'.join(re.escape(n) for n in kept)})$"] if kept else []


def convert(fp32_path: Path, calibration_npz: Path | None, fp16_cfg: FP16Config, extra_excluded: list[str] = (),
            low: str = "fp16", opset: int | None = None) -> tuple[onnx.ModelProto, dict]:
    """Run ModelOpt AutoCast (FP32 I/O kept) to the low type ``low`` ("fp16", "bf16") and return the mixed-precision
    model and a precision report. ``opset``: AutoCast's default when None (19 for FP16, 22 for BF16)."""
    try:
        # ModelOpt's import loads LIEF, a nanobind module whose initialisation runs Python code: a
        # KeyboardInterrupt raised there is thrown through C++ and ends the process in std::terminate
        # (SIGABRT, exit 134). Held signals arrive after the import, as a KeyboardInterrupt (exit 130).
        with signals_held():
            from modelopt.onnx.autocast import convert_to_mixed_precision
    except ImportError as exc:
        raise StageFailed(f"ModelOpt AutoCast is not installed ({exc}); reinstall the project (pip install -e .), "
                          "which declares AutoCast's dependencies") from None

    data_max = fp16_cfg.data_max if fp16_cfg.range_rule else math.inf
    init_max = fp16_cfg.init_max if fp16_cfg.range_rule else math.inf
    excludes = list(fp16_cfg.nodes_to_exclude) + exact_names_patterns(
        extra_excluded, onnx.load(str(fp32_path), load_external_data=False))
    start = time.perf_counter()
    with _quiet_autocast() as capture:
        try:
            model16 = convert_to_mixed_precision(
                onnx_path=str(fp32_path),
                low_precision_type=low,
                nodes_to_exclude=excludes or None,
                op_types_to_exclude=list(fp16_cfg.op_types_to_exclude) or None,
                data_max=data_max,
                init_max=init_max,
                keep_io_types=True,
                calibration_data=str(calibration_npz) if calibration_npz and data_max != math.inf else None,
                max_depth_of_reduction=fp16_cfg.max_depth_of_reduction,
                providers=["cpu"],
                opset=opset,
            )
        except Exception as exc:
            raise StageFailed(f"AutoCast {low.upper()} conversion failed: {type(exc).__name__}: {exc}") from None
    fp32_model = onnx.load(str(fp32_path), load_external_data=False)
    report = precision_report(fp32_model, model16, capture.messages, set(extra_excluded), low)
    report.update({
        "converter": "modelopt.onnx.autocast.convert_to_mixed_precision",
        "keep_io_types": True,
        "range_rule": fp16_cfg.range_rule,
        "data_max": None if data_max == math.inf else data_max,
        "init_max": None if init_max == math.inf else init_max,
        "calibration": ("real images (export.calibration_split; calibration_images.json)"
                        if calibration_npz and data_max != math.inf else None),
        "nodes_to_exclude": excludes,
        "op_types_to_exclude": list(fp16_cfg.op_types_to_exclude),
        "seconds": round(time.perf_counter() - start, 2),
    })
    return model16, report


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


def node_precisions(fp32_model: onnx.ModelProto, low_model: onnx.ModelProto) -> dict[str, tuple[str, str]]:
    """``{node name: (op type, "fp16" | "bf16" | "fp32")}`` for the original nodes that produce float tensors: the
    lowest float type among a node's outputs."""
    original = {n.name for n in fp32_model.graph.node}
    types = infer_types(low_model)
    out = {}
    for node in low_model.graph.node:
        if node.name not in original or node.op_type == "Constant":
            continue
        kinds = [k for k in (*LOW, FLOAT) if k in {types.get(o) for o in node.output if o}]
        if kinds:
            out[node.name] = (node.op_type, NAMES[kinds[0]])
    return out


def share(precisions: dict, name: str) -> float:
    """The share of the graph's float nodes that compute in ``name`` (its report's ``<name>_fraction``)."""
    return sum(1 for _, p in precisions.values() if p == name) / max(1, len(precisions))


def precision_report(fp32_model, low_model, messages: list[str], fallback: set[str], low: str = "fp16") -> dict:
    precisions = node_precisions(fp32_model, low_model)
    reasons = {}
    for message in messages:
        if message.startswith("Skipping node "):
            rest = message[len("Skipping node "):]
            for name in precisions:
                if rest.startswith(name + ": "):
                    reasons[name] = rest[len(name) + 2:]
    fp32_nodes = []
    for name, (op, precision) in precisions.items():
        if precision != "fp32":
            continue
        if name in fallback:
            why = "moved to FP32 by verify --auto-fallback"
        else:
            why = _explain(reasons.get(name))
        fp32_nodes.append({"name": name, "op_type": op, "reason": why})
    return {
        f"{low}_nodes": sum(1 for _, p in precisions.values() if p == low),
        "fp32_nodes_count": len(fp32_nodes),
        f"{low}_fraction": share(precisions, low),
        "fp32_nodes": fp32_nodes,
    }


def _explain(reason: str | None) -> str:
    if reason is None:
        return "kept FP32 by AutoCast (no rule reported it; e.g. an op without FP16 support)"
    if reason == "DisabledNodeNameRegexRule":
        return "excluded by name (export.fp16.nodes_to_exclude)"
    if reason == "DisabledOpTypes":
        return "excluded by op type (export.fp16.op_types_to_exclude)"
    if reason.startswith("reference IO out of range"):
        return "measured values exceed data_max on the calibration images: " + reason.split(": ", 1)[-1]
    if reason.startswith("initializer"):
        return "initializer exceeds init_max: " + reason
    if reason == "DepthOfReductionRule":
        return "reduction deeper than max_depth_of_reduction"
    return reason


# --------------------------------------------------------------------------- emulation (fast)


def _refuse_subgraphs(model: onnx.ModelProto) -> None:
    for node in model.graph.node:
        if any(attr.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for attr in node.attribute):
            raise NotImplementedError(f"node {node.name!r} ({node.op_type}) has a subgraph; the fast FP16 "
                                      "emulation supports flat graphs only (use verify.emulation=strict)")


def _rounder(graph: onnx.GraphProto):
    """``round_pair(src, dst, prefix, low)``: the Cast to ``low`` and back to FP32 that rounds ``src`` into
    ``dst``, with node names unique in ``graph``."""
    used_names = {n.name for n in graph.node}

    def unique(name: str) -> str:
        candidate, i = name, 0
        while candidate in used_names:
            i += 1
            candidate = f"{name}_{i}"
        used_names.add(candidate)
        return candidate

    def round_pair(src: str, dst: str, prefix: str, low: int) -> list[onnx.NodeProto]:
        name = NAMES[low]
        half = f"{dst}__as_{name}"
        return [
            helper.make_node("Cast", [src], [half], name=unique(f"{prefix}/round_to_{name}"), to=low),
            helper.make_node("Cast", [half], [dst], name=unique(f"{prefix}/round_back_fp32"), to=FLOAT),
        ]

    return round_pair


def emulation_model(fp16_model: onnx.ModelProto) -> onnx.ModelProto:
    """An FP32 model that rounds every low-typed tensor of ``fp16_model`` to its type, FP16 or BF16 (see module
    doc): ONNX Runtime's CPU Cast rounds to the nearest even in both, and keeps the cast pairs at every level."""
    _refuse_subgraphs(fp16_model)
    types = infer_types(fp16_model)
    graph = fp16_model.graph
    new_nodes = []
    round_pair = _rounder(graph)

    # Graph inputs of a low type (only when I/O types were not kept): feed FP32, round on entry.
    renamed_inputs = {}
    for value in graph.input:
        low = value.type.tensor_type.elem_type
        if low in LOW:
            value.type.tensor_type.elem_type = FLOAT
            renamed_inputs[value.name] = f"{value.name}__rounded"
            new_nodes += round_pair(value.name, renamed_inputs[value.name], value.name, low)

    for node in graph.node:
        node = _copy(node)
        for i, name in enumerate(node.input):
            if name in renamed_inputs:
                node.input[i] = renamed_inputs[name]
        _attributes_to_fp32(node)
        rounding = []
        for i, out in enumerate(node.output):
            if out and types.get(out) in LOW:
                raw = f"{out}__fp32_compute"
                node.output[i] = raw
                rounding += round_pair(raw, out, node.name or out, types[out])
        new_nodes.append(node)
        new_nodes += rounding

    initializers = [_to_fp32(t) if t.data_type in LOW else t for t in graph.initializer]
    for value in graph.output:
        if value.type.tensor_type.elem_type in LOW:
            value.type.tensor_type.elem_type = FLOAT

    new_graph = helper.make_graph(new_nodes, graph.name, list(graph.input), list(graph.output), initializers)
    model = helper.make_model(new_graph, opset_imports=list(fp16_model.opset_import),
                              producer_name="pipeline.precision.fp16")
    model.ir_version = fp16_model.ir_version
    return model


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
    node = _copy(node)
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
    _attributes_to_fp32(node)
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
    node = _copy(node)
    for i, name in enumerate(node.input):
        if name in renamed:
            node.input[i] = renamed[name][side]
    return node


def _attributes_to_fp32(node: onnx.NodeProto) -> None:
    """FP16 in a node's attributes (Cast targets, constant tensors, dtype) becomes FP32, in place."""
    for attr in node.attribute:
        if node.op_type == "Cast" and attr.name == "to" and attr.i in LOW:
            attr.i = FLOAT
        elif attr.type == onnx.AttributeProto.TENSOR and attr.t.data_type in LOW:
            attr.t.CopyFrom(_to_fp32(attr.t))
        elif attr.name == "dtype" and attr.type == onnx.AttributeProto.INT and attr.i in LOW:
            attr.i = FLOAT


def _copy(node: onnx.NodeProto) -> onnx.NodeProto:
    out = onnx.NodeProto()
    out.CopyFrom(node)
    return out


def _to_fp32(tensor: TensorProto) -> TensorProto:
    array = numpy_helper.to_array(tensor).astype(np.float32)
    return numpy_helper.from_array(array, tensor.name)
