"""Each runtime's own account of the layers it ran: what kind of layer, in which precision, on which kernel, and
for how long, read from the runtime itself, not from the graph it was given.

A graph says what it asks for; a runtime may run something else. ONNX Runtime's CPU provider inserts casts around
FP16 nodes it has no kernel for and runs them in FP32; a Q/DQ graph whose quantize/dequantize pairs the provider
does not fuse runs its convolutions in FP32 on dequantized values; OpenVINO may keep a layer in f32 under a bf16
hint; TensorRT picks each layer's tactic. The readers here turn each runtime's account into one list of
:class:`Layer` records (the precision manifest of :mod:`pipeline.evaluation.conformance`, and the per-layer profile):

* ONNX Runtime: its profiler (``SessionOptions.enable_profiling``): each node's ``op_name``, ``provider`` and the
  element type of its first input (``input_type_shape``), with the kernel's duration in microseconds;
* OpenVINO: the compiled model's runtime model: each executed node's ``layerType``, ``runtimePrecision`` and
  ``execType`` (and its time, where the request ran with ``PERF_COUNT``);
* TensorRT: the engine inspector, through :func:`pipeline.runtime.profiling.tensorrt_inspection.runtime_precisions`;
* an emulation (FP32 kernels that round every tensor to the low type, or a Q/DQ graph executed exactly): the
  graph's own precision decisions, since the rounding, not the kernel, is the precision it computes.
"""

from __future__ import annotations

import json
import math
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

# The precisions a layer can run in, as every reader names them.
UNKNOWN = "unknown"
# ONNX Runtime's element type names (its profiler's input_type_shape keys) and OpenVINO's runtimePrecision.
_TYPE_NAMES = {"float": "fp32", "float32": "fp32", "f32": "fp32", "double": "fp64", "f64": "fp64",
               "float16": "fp16", "f16": "fp16", "fp16": "fp16", "bfloat16": "bf16", "bf16": "bf16",
               "int8": "int8", "uint8": "int8", "i8": "int8", "u8": "int8", "fp32": "fp32"}
# The layers that carry a network's arithmetic (convolutions and matrix products), by each runtime's layer type:
# ONNX (and ONNX Runtime's fused and quantized contrib ops), OpenVINO's CPU plugin.
ORT_MATRIX = frozenset({"Conv", "ConvTranspose", "Gemm", "MatMul", "FusedConv", "FusedGemm", "FusedMatMul",
                        "NhwcConv", "NhwcFusedConv", "QLinearConv", "NhwcQLinearConv", "QLinearMatMul",
                        "ConvInteger", "MatMulInteger", "MatMulIntegerToFloat", "DynamicQuantizeMatMul", "QGemm",
                        "MatMulNBits", "FusedMatMulActivation"})
ORT_INTEGER = frozenset({"QLinearConv", "NhwcQLinearConv", "QLinearMatMul", "ConvInteger", "MatMulInteger",
                         "MatMulIntegerToFloat", "DynamicQuantizeMatMul", "QGemm"})
OPENVINO_MATRIX = frozenset({"Convolution", "GroupConvolution", "Deconvolution", "FullyConnected", "MatMul",
                             "ConvolutionBackpropData", "GroupConvolutionBackpropData"})
ONNX_MATRIX = frozenset({"Conv", "ConvTranspose", "Gemm", "MatMul"})
# The feed runs this many times and each layer's fastest run is kept: the first run pays for allocations and lazy
# initialisation, and on a shared machine any run can be preempted in the middle of one layer.
PROFILED_RUNS = 5


@dataclass(frozen=True)
class Layer:
    """One layer as its runtime ran it."""

    name: str
    kind: str  # the runtime's layer type ("FusedConv", "Convolution", "gemm", ...)
    precision: str  # "fp32", "fp16", "bf16", "int8" or "unknown"
    matrix: bool  # a convolution or matrix product: the layers whose precision sets the speed and the error
    kernel: str = ""  # the provider or implementation the runtime chose ("CPUExecutionProvider", "brgconv_avx2")
    time_us: float | None = None  # its time on the one profiled inference, where the runtime measured it

    def to_json(self) -> dict:
        return asdict(self)


def precision_name(text: str) -> str:
    """A runtime's name of an element type, as this project names precisions ("unknown" when it is no type)."""
    return _TYPE_NAMES.get(str(text).strip().lower(), UNKNOWN)


def matrix_shares(layers: list[Layer]) -> dict[str, float]:
    """The share of the matrix layers that ran in each precision (empty without matrix layers)."""
    matrix = [layer.precision for layer in layers if layer.matrix]
    return {p: matrix.count(p) / len(matrix) for p in sorted(set(matrix))}


# --------------------------------------------------------------------------- ONNX Runtime


def ort_profile_layers(events: list[dict]) -> list[Layer]:
    """The node events of one ONNX Runtime profile (``cat == "Node"``, name ``<node>_kernel_time``), one Layer per
    node (its fastest run's duration, where it ran more than once)."""
    layers: dict[str, Layer] = {}
    for event in events:
        if event.get("cat") != "Node" or not str(event.get("name", "")).endswith("_kernel_time"):
            continue
        args = event.get("args") or {}
        op = str(args.get("op_name", ""))
        name = str(event["name"])[: -len("_kernel_time")]
        duration = min(float(event.get("dur", 0)), layers[name].time_us if name in layers else math.inf)
        layers[name] = Layer(name, op, _ort_precision(op, args.get("input_type_shape") or []), op in ORT_MATRIX,
                             str(args.get("provider", "")), duration)
    return list(layers.values())


def _ort_precision(op: str, inputs: list) -> str:
    """An integer kernel computes in int8 whatever it outputs; another, in its first input's type."""
    if op in ORT_INTEGER:
        return "int8"
    first = inputs[0] if inputs and isinstance(inputs[0], dict) else {}
    return precision_name(next(iter(first), UNKNOWN))


def ort_layers(make_session, feed: dict) -> list[Layer]:
    """Run ``feed`` :data:`PROFILED_RUNS` times through a session that ``make_session(options)`` creates with ONNX
    Runtime's profiler on (the same options the runner uses otherwise), and read the profile it writes into a
    temporary folder (each node's fastest run)."""
    import onnxruntime as ort

    with tempfile.TemporaryDirectory(prefix="pipeline-ort-profile.") as folder:
        options = ort.SessionOptions()
        options.enable_profiling = True
        options.profile_file_prefix = str(Path(folder) / "profile")
        session = make_session(options)
        for _ in range(PROFILED_RUNS):
            session.run(None, dict(feed))
        path = Path(session.end_profiling())
        return ort_profile_layers(json.loads(path.read_text(encoding="utf-8")))


# --------------------------------------------------------------------------- OpenVINO


def openvino_layers(compiled, perf_counts: list | None = None) -> list[Layer]:
    """The executed nodes of OpenVINO's runtime model (``CompiledModel.get_runtime_model()``), with each one's time
    from ``perf_counts`` (``InferRequest.profiling_info`` of a request of a model compiled with ``PERF_COUNT``, or a
    list of them, one per run: each node's fastest) and its kernel (the runtime model's ``primitiveType``, e.g.
    ``brgconv_avx512_amx_I8``; ``execType`` in older releases)."""
    runs = perf_counts if perf_counts and isinstance(perf_counts[0], list) else [perf_counts or []]
    times: dict[str, float] = {}
    for run in runs:
        for info in run:
            times[info.node_name] = min(info.real_time.total_seconds() * 1e6, times.get(info.node_name, math.inf))
    layers = []
    for op in compiled.get_runtime_model().get_ops():
        info = op.get_rt_info()
        kind = _rt_text(info, "layerType")
        if kind in ("Input", "Output", "Const", "Parameter", "Result") or "runtimePrecision" not in info:
            continue
        name = op.get_friendly_name()
        layers.append(Layer(name, kind, precision_name(_rt_text(info, "runtimePrecision")), kind in OPENVINO_MATRIX,
                            _rt_text(info, "primitiveType") or _rt_text(info, "execType"), times.get(name)))
    return layers


def _rt_text(info, key: str) -> str:
    return info[key].astype(str) if key in info else ""


# --------------------------------------------------------------------------- TensorRT and the emulations


def tensorrt_layers(precisions: dict[str, str]) -> list[Layer]:
    """The matrix nodes of the engine's ONNX graph, each with the precision the engine inspector says it ran in
    (:func:`pipeline.runtime.profiling.tensorrt_inspection.runtime_precisions`: ``{node: precision}``)."""
    return [Layer(name, "matrix layer", precision if precision in _TYPE_NAMES.values() else UNKNOWN, True, "TensorRT")
            for name, precision in precisions.items()]


def graph_layers(precisions: dict[str, tuple[str, str]], how: str) -> list[Layer]:
    """An emulation's layers: the graph's own decisions (``{node: (op type, precision)}``, a precision plug's
    ``node_precisions``), since it computes them by rounding on FP32 kernels (``how`` says so)."""
    return [Layer(name, op, precision, op in ONNX_MATRIX, how) for name, (op, precision) in precisions.items()]
