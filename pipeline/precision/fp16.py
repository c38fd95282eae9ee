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

import onnx
from onnx import helper

from pipeline.core.errors import StageFailed
from pipeline.core.run import signals_held
from pipeline.precision.fp16_rewrite import (  # noqa: F401  (the types and the rewrite, re-exported)
    BFLOAT16,
    FLOAT,
    FLOAT16,
    LOW,
    NAMES,
    NOT_MOVABLE,
    attributes_to_fp32,
    copy_node,
    infer_types,
    keep_in_fp32,
    tensor_to_fp32,
)

if TYPE_CHECKING:  # annotations only
    from pipeline.core.config_schema import FP16Config

log = logging.getLogger("pipeline")


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
        node = copy_node(node)
        for i, name in enumerate(node.input):
            if name in renamed_inputs:
                node.input[i] = renamed_inputs[name]
        attributes_to_fp32(node)
        rounding = []
        for i, out in enumerate(node.output):
            if out and types.get(out) in LOW:
                raw = f"{out}__fp32_compute"
                node.output[i] = raw
                rounding += round_pair(raw, out, node.name or out, types[out])
        new_nodes.append(node)
        new_nodes += rounding

    initializers = [tensor_to_fp32(t) if t.data_type in LOW else t for t in graph.initializer]
    for value in graph.output:
        if value.type.tensor_type.elem_type in LOW:
            value.type.tensor_type.elem_type = FLOAT

    new_graph = helper.make_graph(new_nodes, graph.name, list(graph.input), list(graph.output), initializers)
    model = helper.make_model(new_graph, opset_imports=list(fp16_model.opset_import),
                              producer_name="pipeline.precision.fp16")
    model.ir_version = fp16_model.ir_version
    return model
