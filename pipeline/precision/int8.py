"""INT8: ModelOpt post-training quantization to a Q/DQ graph, its precision report, the graph's exact
execution on any CPU, localisation on the Q/DQ graph and the nodes its fallback excludes.

TensorRT 10+/11 builds INT8 only from explicit QuantizeLinear/DequantizeLinear (Q/DQ) pairs in the
ONNX graph (implicit calibration is gone in 11), so every INT8 decision lives in ``model.int8.onnx``:

* :func:`quantize` runs ``modelopt.onnx.quantization.quantize(quantize_mode="int8")`` on
  ``model.onnx``, calibrated on real images (the training split by default), with the regions it leaves unquantized in
  FP16 (``high_precision_dtype="fp16"``), so an engine built from it is a true INT8/FP16 mix.
  Activations are quantized per tensor (symmetric), weights per output channel.
* :func:`pipeline.runtime.runners.int8_exact_runner` executes that graph as written: ONNX Runtime with graph
  optimisations off (``ORT_DISABLE_ALL``: no Q/DQ fusion, every Q and DQ computed on its own, in FP32) on the FP16
  emulation graph of :func:`pipeline.precision.fp16.emulation_model` (every FP16 tensor rounded to FP16).
  TensorRT computes the same Q/DQ arithmetic, with int32 accumulation of the int8 products.
* :func:`localize` compares the FP32 graph and the Q/DQ graph tensor by tensor (a quantized node's
  output is computed from the dequantized inputs, so it shows what quantization did) and names the
  first INT8 or FP16 node over tolerance (:mod:`pipeline.precision.fallback` raises its precision).
"""

from __future__ import annotations

import contextlib
import io
import logging
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnx

from pipeline.core.errors import StageFailed
from pipeline.core.run import signals_held
from pipeline.precision import fp16

if TYPE_CHECKING:  # annotations only
    from pipeline.core.config_schema import INT8Config

log = logging.getLogger("pipeline")

Q, DQ = "QuantizeLinear", "DequantizeLinear"
QUANTIZER = "modelopt.onnx.quantization.quantize(quantize_mode='int8')"
# What ModelOpt 0.47's INT8 mode quantizes (its int8.quantize docstring; ONNX Runtime's QDQ registry
# minus the copy and activation ops ModelOpt removes from it).
QUANTIZABLE = ("Add", "AveragePool", "BatchNormalization", "Clip", "Conv", "ConvTranspose", "Gemm",
               "GlobalAveragePool", "MatMul", "MaxPool", "Mul")
# The matrix ops, where INT8 kernels pay: the INT8 fraction is taken over these, and each one not in INT8 is listed.
MATRIX_OPS = ("Conv", "ConvTranspose", "Gemm", "MatMul")


# --------------------------------------------------------------------------- quantization


def availability() -> str:
    """"" when ModelOpt's ONNX quantization imports here; else the reason (a skipped INT8 export says it)."""
    try:
        with signals_held():  # ModelOpt's import loads LIEF (see pipeline.precision.fp16.convert)
            import modelopt.onnx.quantization  # noqa: F401
    except ImportError as exc:
        return f"ModelOpt's ONNX quantization is not installed ({exc}); reinstall the project (pip install -e .)"
    return ""


@contextlib.contextmanager
def _quiet_modelopt():
    """ModelOpt's quantize reconfigures the level and stdout handler of every ``modelopt.onnx`` logger (it logs
    an ERROR on every machine without NVML); put them back as they were, so AutoCast's reasons are still
    captured afterwards (pipeline.precision.fp16)."""
    names = ["modelopt.onnx", *(n for n in logging.root.manager.loggerDict if n.startswith("modelopt.onnx."))]
    saved = [(lg, lg.level, lg.handlers[:], lg.propagate) for lg in map(logging.getLogger, names)]
    try:  # ONNX Runtime's entropy calibrator prints its progress (print and tqdm): keep it out too
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        for lg, level, handlers, propagate in saved:
            lg.setLevel(level)
            lg.handlers[:] = handlers
            lg.propagate = propagate


def quantize(fp32_path: Path, images: np.ndarray, input_name: str, int8_cfg: INT8Config, out_path: Path,
             extra_excluded: list[str] = (), fp32_nodes: list[str] = ()) -> dict:
    """Quantize ``fp32_path`` into ``out_path`` (INT8 Q/DQ, FP16 elsewhere, ``fp32_nodes`` kept in FP32: the
    automatic fallback's, :func:`pipeline.precision.fp16.keep_in_fp32`); returns the precision report."""
    from modelopt.onnx.quantization import quantize as modelopt_quantize

    excludes = list(int8_cfg.nodes_to_exclude) + fp16.exact_names_patterns(
        extra_excluded, onnx.load(str(fp32_path), load_external_data=False))
    batch = min(8, len(images))
    images = images[: len(images) - len(images) % batch]  # whole calibration batches
    shape = "x".join(str(d) for d in (batch, *images.shape[1:]))
    start = time.perf_counter()
    with _quiet_modelopt():
        try:
            modelopt_quantize(
                str(fp32_path), quantize_mode="int8", calibration_data={input_name: images},
                calibration_method=int8_cfg.calibration_method, calibration_shapes=f"{input_name}:{shape}",
                calibration_eps=["cpu"], nodes_to_exclude=excludes or None,
                op_types_to_exclude=list(int8_cfg.op_types_to_exclude) or None, high_precision_dtype="fp16",
                output_path=str(out_path), log_level="CRITICAL")
        except Exception as exc:
            raise StageFailed(f"ModelOpt INT8 quantization failed: {type(exc).__name__}: "
                              f"{(str(exc).strip().splitlines() or [''])[0]}") from None
    quantized = onnx.load(str(out_path))
    if fp32_nodes:
        # With their FP32 weights and constants, as AutoCast's exclusion keeps them in the FP16 graph.
        quantized = fp16.keep_in_fp32(quantized, fp32_nodes, onnx.load(str(fp32_path)))
        onnx.save(quantized, str(out_path))
    seconds = time.perf_counter() - start
    report = precision_report(onnx.load(str(fp32_path), load_external_data=False), quantized, int8_cfg,
                              set(extra_excluded), set(fp32_nodes))
    report.update({"quantizer": QUANTIZER, "calibration_method": int8_cfg.calibration_method,
                   "calibration": "real images (export.calibration_split; calibration_images.json)",
                   "calibration_images": len(images), "high_precision_dtype": "fp16",
                   "activations": "per tensor, symmetric", "weights": "per output channel, symmetric",
                   "nodes_to_exclude": excludes, "op_types_to_exclude": list(int8_cfg.op_types_to_exclude),
                   "seconds": round(seconds, 2)})
    return report


def with_fp32_regions(int8_model: onnx.ModelProto) -> onnx.ModelProto:
    """The same Q/DQ graph (same nodes, Q/DQ placement, scales and zero points) with its FP16 regions in FP32.

    For CPU runtimes that compute in FP32 anyway: OpenVINO 2026.4 cannot convert ModelOpt's Q/DQ graph with
    FP16 regions ("Tensor data with element type f32, is not representable as pointer to f16"), and its CPU
    plugin would run those regions in f32 or bf16. Every FP16 value is exactly representable in FP32, so
    the INT8 decisions are unchanged; only FP16 rounding between the quantized layers goes away.
    """
    from onnx import TensorProto, numpy_helper

    model = onnx.ModelProto()
    model.CopyFrom(int8_model)
    graph = model.graph

    def upcast(tensor: onnx.TensorProto) -> None:
        if tensor.data_type == TensorProto.FLOAT16:
            tensor.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(tensor).astype(np.float32), tensor.name))

    for init in graph.initializer:
        upcast(init)
    for node in graph.node:
        for attr in node.attribute:
            if node.op_type == "Cast" and attr.name == "to" and attr.i == TensorProto.FLOAT16:
                attr.i = TensorProto.FLOAT
            elif attr.type == onnx.AttributeProto.TENSOR:
                upcast(attr.t)
    for info in (*graph.input, *graph.output, *graph.value_info):
        if info.type.tensor_type.elem_type == TensorProto.FLOAT16:
            info.type.tensor_type.elem_type = TensorProto.FLOAT
    return model


# --------------------------------------------------------------------------- the precision report


def quantized_nodes(model: onnx.ModelProto) -> set[str]:
    """Names of the nodes that compute on dequantized INT8 values (an input produced by a DequantizeLinear)."""
    dq_outputs = {o for n in model.graph.node if n.op_type == DQ for o in n.output}
    return {n.name for n in model.graph.node if n.op_type not in (Q, DQ) and any(i in dq_outputs for i in n.input)}


def node_precisions(fp32_model: onnx.ModelProto, int8_model: onnx.ModelProto) -> dict[str, tuple[str, str]]:
    """``{node name: (op type, "int8" | "fp16" | "fp32")}`` for the FP32 graph's nodes that produce float tensors."""
    floats = fp16.node_precisions(fp32_model, int8_model)
    quantized = quantized_nodes(int8_model)
    return {name: (op, "int8" if name in quantized else precision) for name, (op, precision) in floats.items()}


def int8_fraction(precisions: dict) -> float:
    """The share of the matrix ops (Conv, Gemm, MatMul) that compute on INT8 inputs."""
    compute = [p for op, p in precisions.values() if op in MATRIX_OPS]
    return sum(1 for p in compute if p == "int8") / max(1, len(compute))


def precision_report(fp32_model, int8_model, int8_cfg: INT8Config, fallback: set[str],
                     fp32_fallback: set[str] = frozenset()) -> dict:
    precisions = node_precisions(fp32_model, int8_model)
    left, why_counts = [], {}
    for name, (op, precision) in precisions.items():
        if precision == "int8":
            continue
        why = "kept in FP32 by verify --auto-fallback" if name in fp32_fallback and precision == "fp32" else \
            _why_unquantized(name, op, int8_cfg, fallback)
        why_counts[why] = why_counts.get(why, 0) + 1
        if op in MATRIX_OPS:  # other ops (Relu, Add, Flatten, ...) are counted by reason only
            left.append({"name": name, "op_type": op, "precision": precision, "reason": why})
    counts = {k: sum(1 for _, p in precisions.values() if p == k) for k in ("int8", "fp16", "fp32")}
    return {
        "int8_nodes": counts["int8"],
        "fp16_nodes": counts["fp16"],
        "fp32_nodes_count": counts["fp32"],
        "qdq_pairs": sum(1 for n in int8_model.graph.node if n.op_type == Q),
        "dq_nodes": sum(1 for n in int8_model.graph.node if n.op_type == DQ),
        "int8_fraction": int8_fraction(precisions),
        "unquantized_reasons": why_counts,
        "unquantized_nodes": left,
    }


def _why_unquantized(name: str, op: str, int8_cfg: INT8Config, fallback: set[str]) -> str:
    if name in fallback:
        return "excluded by verify --auto-fallback"
    if any(re.match(pattern, name) for pattern in int8_cfg.nodes_to_exclude):
        return "excluded by name (export.int8.nodes_to_exclude)"
    if op in int8_cfg.op_types_to_exclude:
        return "excluded by op type (export.int8.op_types_to_exclude)"
    if op not in QUANTIZABLE:
        return "not a quantizable op"
    return "left unquantized by ModelOpt's Q/DQ placement (no INT8 kernel gain there, or an unsupported shape)"


# --------------------------------------------------------------------------- exact execution


def exact_model(int8_model: onnx.ModelProto) -> onnx.ModelProto:
    """The Q/DQ graph with every FP16 tensor rounded to FP16 and computed in FP32 (pipeline.precision.fp16's
    emulation)."""
    return fp16.emulation_model(int8_model)
