"""Quantization-aware fine-tuning (QAT) for INT8: fake quantization in PyTorch exactly where ModelOpt's ONNX PTQ put
its Q/DQ nodes, started from PTQ's calibration, and the way back to a Q/DQ graph of the same form.

* :func:`placement` reads the PTQ graph (``model.int8.onnx`` as export makes it with every layer in INT8): which
  module's input is quantized (and PTQ's range for it: ``amax = scale * 127``) and which module's weights are
  (per output channel). A node's module is its TorchScript scope (``/layer1/layer1.0/conv1/Conv`` is
  ``layer1.0.conv1``); a Q/DQ value that reaches a node through shape-only ops (Flatten, Reshape) counts as its input.
* :func:`quantize_model` inserts ModelOpt's PyTorch quantizers (``modelopt.torch.quantization``: 8 bits, activations
  per tensor, weights per output channel, the scheme of ModelOpt's ONNX INT8 mode) and enables exactly those.
  Activation ranges stay PTQ's during training; weight ranges follow the weights (:func:`sync_weight_ranges`, the
  per-channel max PTQ takes of the exported weights: per-channel max scaling commutes with the BatchNorm scale the
  export folds in, so the fine-tuned fake quantization is what the exported graph computes there).
* Q/DQ that PTQ puts where no module takes an input (a functional Add, the Mul inside GELU) are not simulated in
  training; they stay in the exported graph with PTQ's ranges and the gate judges the whole graph.
* :func:`transfer_ranges` writes PTQ's activation scales into the graph PTQ makes of the fine-tuned weights, so the
  exported graph quantizes activations with exactly the ranges the fine-tuning trained with.
"""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass, field

import numpy as np
import onnx
import torch
from torch import nn

from pipeline.core.run import signals_held

Q, DQ = "QuantizeLinear", "DequantizeLinear"
QUANTIZER = "modelopt.torch.quantization (fake quantization, INT8, weights per output channel)"
SHAPE_ONLY = ("Flatten", "Reshape", "Squeeze", "Unsqueeze", "Transpose", "Identity", "Cast")
INT8_MAX = 127.0
EXTRA = "qat"  # pip install -e '.[qat]'
# ModelOpt's own INT8 scheme (mtq.INT8_DEFAULT_CFG) without its name rules for language models; every quantizer is
# then switched on or off by the PTQ graph (quantize_model).
CONFIG = {"quant_cfg": [{"quantizer_name": "*", "enable": False},
                        {"quantizer_name": "*weight_quantizer", "cfg": {"num_bits": 8, "axis": 0}},
                        {"quantizer_name": "*input_quantizer", "cfg": {"num_bits": 8, "axis": None}}],
          "algorithm": "max"}


def availability() -> str:
    """"" when ModelOpt's PyTorch quantization imports here; else the reason and the install hint."""
    try:
        with signals_held(), warnings.catch_warnings():
            # "Cannot find transformers package": its LLM export, which QAT does not use
            warnings.simplefilter("ignore", UserWarning)
            import modelopt.torch.quantization  # noqa: F401
    except ImportError as exc:
        return (f"ModelOpt's PyTorch quantization does not import ({exc}); install the qat extra: "
                f"pip install -e '.[{EXTRA}]'")
    return ""


@dataclass
class Placement:
    """Where the PTQ graph quantizes, by module: input ranges (amax) and the modules whose weights are INT8."""

    inputs: dict[str, float] = field(default_factory=dict)
    weights: set[str] = field(default_factory=set)
    sites: int = 0  # activation Q/DQ pairs in the graph
    unmapped: list[str] = field(default_factory=list)  # nodes reading a Q/DQ value with no module (not simulated)


def module_of(node_name: str) -> str | None:
    """The module path of a TorchScript-exported node; None at the top level. A scope either names a child by its
    attribute (``conv1``, ``block``), or extends the scope before it by the children of a container, relative to the
    module that holds that container: ``/layer1/layer1.0/conv1/Conv`` is ``layer1.0.conv1``, and
    ``/features/features.3/block/block.1/block.1.0/Conv`` (MobileNetV3) is ``features.3.block.1.0``."""
    path, anchor, previous = "", "", None
    for scope in node_name.split("/")[1:-1]:
        if previous is None or not scope.startswith(previous + "."):
            anchor = path  # a fresh attribute: the module it is an attribute of
        path = f"{anchor}.{scope}" if anchor else scope
        previous = scope
    return path or None


def _dequantized(model: onnx.ModelProto) -> dict[str, tuple[str, float]]:
    """Every tensor holding a dequantized value: ``("weight", 0)`` or ``("input", amax)``, through shape-only ops."""
    inits = {i.name: i for i in model.graph.initializer}
    q_inputs = {n.output[0]: n.input[0] for n in model.graph.node if n.op_type == Q}
    values: dict[str, tuple[str, float]] = {}
    for node in model.graph.node:  # topological order
        if node.op_type == DQ:
            source = q_inputs.get(node.input[0], node.input[0])
            if source in inits:
                values[node.output[0]] = ("weight", 0.0)
            else:
                scale = onnx.numpy_helper.to_array(inits[node.input[1]]).astype(np.float64)
                values[node.output[0]] = ("input", float(scale.reshape(-1)[0]) * INT8_MAX)
        elif node.op_type in SHAPE_ONLY and node.input and node.input[0] in values:
            values[node.output[0]] = values[node.input[0]]
    return values


def placement(int8_model: onnx.ModelProto) -> Placement:
    """The PTQ graph's Q/DQ placement by module (see the module docstring)."""
    values = _dequantized(int8_model)
    found = Placement(sites=sum(1 for n in int8_model.graph.node if n.op_type == Q) -
                      sum(1 for v in values.values() if v[0] == "weight"))
    for node in int8_model.graph.node:
        if node.op_type in (Q, DQ, *SHAPE_ONLY):
            continue
        reads = [values[i] for i in node.input if i in values]
        if not reads:
            continue
        module = module_of(node.name)
        if module is None:
            found.unmapped.append(node.name)
            continue
        for kind, amax in reads:
            if kind == "weight":
                found.weights.add(module)
            else:
                found.inputs.setdefault(module, amax)
    return found


def quantize_model(model: nn.Module, where: Placement, forward_loop) -> dict:
    """Insert ModelOpt's quantizers into ``model`` (in place) and enable those of ``where`` with PTQ's input ranges;
    ``forward_loop(model)`` runs calibration images (ModelOpt's max calibration, overridden by PTQ's ranges).
    Returns what was simulated: ``{"inputs": [...], "weights": [...], "not_simulated": [...]}``."""
    import modelopt.torch.quantization as mtq

    with signals_held(), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # ModelOpt's LLM export helpers, unused here
        mtq.quantize(model, CONFIG, forward_loop=forward_loop)
    inputs, weights = [], []
    for name, module in model.named_modules():
        quantizer = getattr(module, "input_quantizer", None)
        if quantizer is not None:
            _switch(quantizer, name in where.inputs, where.inputs.get(name))
            inputs += [name] if name in where.inputs else []
        quantizer = getattr(module, "weight_quantizer", None)
        if quantizer is not None:
            _switch(quantizer, name in where.weights, None)
            weights += [name] if name in where.weights else []
    for module in model.modules():
        if getattr(module, "output_quantizer", None) is not None:  # PTQ quantizes no layer's output
            module.output_quantizer.disable()
    sync_weight_ranges(model)
    missing = sorted((set(where.inputs) - set(inputs)) | (set(where.weights) - set(weights)))
    return {"inputs": inputs, "weights": weights, "not_simulated": sorted(set(missing) | set(where.unmapped))}


def _switch(quantizer, on: bool, amax: float | None) -> None:
    if not on:
        quantizer.disable()
        return
    quantizer.enable()
    if amax is not None:
        quantizer.amax = torch.tensor(amax, dtype=torch.float32)


def sync_weight_ranges(model: nn.Module) -> None:
    """Every enabled weight quantizer's range set to its weight's per-output-channel absolute max (PTQ's rule)."""
    with torch.no_grad():
        for module in model.modules():
            quantizer = getattr(module, "weight_quantizer", None)
            if quantizer is None or not quantizer.is_enabled:
                continue
            weight = module.weight
            quantizer.amax = weight.detach().abs().amax(dim=tuple(range(1, weight.ndim)), keepdim=True).float()


@contextlib.contextmanager
def quantizers_off(model: nn.Module):
    """``model`` computing in FP32 (every enabled quantizer disabled, and enabled again after), e.g. to export its
    weights."""
    enabled = [q for m in model.modules() for q in (getattr(m, "input_quantizer", None),
                                                     getattr(m, "weight_quantizer", None))
               if q is not None and q.is_enabled]
    for quantizer in enabled:
        quantizer.disable()
    try:
        yield model
    finally:
        for quantizer in enabled:
            quantizer.enable()


def distillation_loss(student: torch.Tensor, teacher: torch.Tensor, labels: torch.Tensor, *, temperature: float,
                      label_weight: float) -> torch.Tensor:
    """``T^2 KL(softmax(teacher/T) || softmax(student/T))``, plus ``label_weight`` of cross-entropy on the labels."""
    t = temperature
    kd = nn.functional.kl_div(nn.functional.log_softmax(student.float() / t, dim=1),
                              nn.functional.log_softmax(teacher.float() / t, dim=1), reduction="batchmean",
                              log_target=True) * t * t
    if not label_weight:
        return kd
    return (1 - label_weight) * kd + label_weight * nn.functional.cross_entropy(student.float(), labels)


def transfer_ranges(template: onnx.ModelProto, target: onnx.ModelProto) -> tuple[int, int]:
    """Copy ``template``'s activation scales (per-tensor Q/DQ scales) into ``target`` where both have the same Q/DQ
    node; returns (copied, activation Q/DQ nodes in ``target``)."""
    ours = {i.name: i for i in target.graph.initializer}
    theirs = {i.name: i for i in template.graph.initializer}
    template_nodes = {n.name: n for n in template.graph.node if n.op_type in (Q, DQ)}
    weight_q = {n.output[0] for n in target.graph.node if n.op_type == Q and n.input[0] in ours}
    copied = total = 0
    for node in target.graph.node:
        # a weight's Q (its input is an initializer) or DQ (its input is such a Q's): per channel, PTQ's rule
        if node.op_type not in (Q, DQ) or node.input[0] in ours or node.input[0] in weight_q:
            continue
        scale = ours.get(node.input[1])
        if scale is None or list(scale.dims) not in ([], [1]):
            continue
        total += 1
        other = template_nodes.get(node.name)
        source = theirs.get(other.input[1]) if other is not None else None
        if source is not None and list(source.dims) == list(scale.dims) and source.data_type == scale.data_type:
            scale.CopyFrom(source)
            scale.name = node.input[1]
            copied += 1
    return copied, total
