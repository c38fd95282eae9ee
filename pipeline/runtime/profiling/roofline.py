"""How close each CPU artifact comes to what the machine can compute: the model's multiply-accumulates (MACs) at
its input size, the CPU's peak for each precision from the instruction set it reports and the cores benchmark used,
and the fraction of that peak each timed row reaches (``2 * MACs * batch / latency / peak``).

The MACs come from the FP32 ONNX graph with ONNX shape inference at the batch asked for; every Conv, ConvTranspose,
Gemm and MatMul counts (the layers that carry the arithmetic); element-wise work, pooling and the rest are left out,
as published MAC counts do (ResNet-18: 1.82 GMACs per 224x224 image).

The peak is an upper bound by construction: every core issuing its widest multiply-add every cycle at the clock the
machine reports. Each FLOP-per-cycle figure below counts a multiply-add as two operations and states its source.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from pipeline.core.benchmark_rows import BenchmarkRow, Roofline, RooflineRow

MATRIX_OPS = ("Conv", "ConvTranspose", "Gemm", "MatMul")
# The ISA flags the peak table reads (recorded in benchmark.json's roofline.machine).
READ_FLAGS = frozenset({"avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "avx512_fp16", "amx_tile",
                        "amx_bf16", "amx_int8", "amx_fp16"})


# --------------------------------------------------------------------------- MACs


def _shapes(model, batch: int) -> dict[str, list[int]]:
    """Every tensor's static shape with the first input's batch dimension set to ``batch`` (ONNX shape inference)."""
    import onnx

    model = onnx.shape_inference.infer_shapes(_with_batch(model, batch))
    shapes = {}
    for info in (*model.graph.input, *model.graph.value_info, *model.graph.output):
        dims = info.type.tensor_type.shape.dim
        if dims and all(d.HasField("dim_value") for d in dims):
            shapes[info.name] = [d.dim_value for d in dims]
    for init in model.graph.initializer:
        shapes[init.name] = list(init.dims)
    return shapes


def _with_batch(model, batch: int):
    import onnx

    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    initializers = {t.name for t in copy.graph.initializer}
    for info in copy.graph.input:
        dims = info.type.tensor_type.shape.dim
        if info.name not in initializers and dims:
            dims[0].Clear()
            dims[0].dim_value = batch
    del copy.graph.value_info[:]  # inferred again at this batch
    return copy


def node_macs(op: str, inputs: list[list[int] | None], output: list[int] | None, attrs: dict) -> int:
    """One node's multiply-accumulates from its input and output shapes (0 where a shape is unknown).

    Conv: every output element sums ``C_in / group * prod(kernel)`` products; ConvTranspose: every input element
    spreads ``C_out / group * prod(kernel)``; Gemm and MatMul: ``M * N * K`` (times the broadcast batch dims)."""
    if op == "Conv" and output and inputs[1]:
        return int(np.prod(output, dtype=np.int64) * int(np.prod(inputs[1][1:], dtype=np.int64)))
    if op == "ConvTranspose" and inputs[0] and inputs[1]:
        return int(np.prod(inputs[0], dtype=np.int64) * int(np.prod(inputs[1][1:], dtype=np.int64)))
    if op == "Gemm" and inputs[0] and output:
        k = inputs[0][0] if attrs.get("transA") else inputs[0][-1]
        return int(np.prod(output, dtype=np.int64)) * k
    if op == "MatMul" and inputs[0] and output:
        return int(np.prod(output, dtype=np.int64)) * inputs[0][-1]
    return 0


@dataclass(frozen=True)
class LayerMacs:
    """One matrix node's multiply-accumulates (benchmark.json's ``roofline.macs.layers`` entry)."""

    name: str
    op: str
    macs: int

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class MacCount:
    """The graph's multiply-accumulates at one batch size: in all, per image, and each matrix node's in graph
    order."""

    batch_size: int
    total: int
    per_image: int
    layers: list[LayerMacs]


def macs(model, batch: int = 1) -> MacCount:
    """The graph's multiply-accumulates at ``batch``: ``total`` and ``per_image``, and each matrix node's
    (``layers``: name, op, macs), in graph order."""
    shapes = _shapes(model, batch)
    layers = []
    for node in model.graph.node:
        if node.op_type not in MATRIX_OPS:
            continue
        attrs = {a.name: a.i for a in node.attribute if a.type == a.INT}
        count = node_macs(node.op_type, [shapes.get(i) for i in node.input], shapes.get(node.output[0]), attrs)
        layers.append(LayerMacs(node.name, node.op_type, count))
    total = sum(layer.macs for layer in layers)
    return MacCount(batch_size=batch, total=total, per_image=total // batch, layers=layers)


# --------------------------------------------------------------------------- the CPU's peak


@dataclass(frozen=True)
class Peak:
    """One precision's peak on this CPU: operations per cycle per core (a multiply-add is 2), and why."""

    precision: str
    flops_per_cycle: int  # per core
    unit: str  # the instructions the figure assumes ("AVX-512 FMA, 2 x 512-bit")
    source: str  # where the figure comes from
    gflops: float = 0.0  # flops_per_cycle * cores * GHz

    def to_json(self) -> dict:
        return asdict(self)


INTEL_AMX = "Intel, 'Accelerate AI workloads with Intel AMX' (2048 INT8 / 1024 BF16 ops per cycle per core)"
INTEL_FMA = "Intel 64 and IA-32 Optimization Reference Manual: 2 FMA units per core (Skylake-SP and later Xeons)"
AMD_ZEN4 = ("AMD Software Optimization Guide for Zen 4 (57647): AVX-512 executes on 256-bit datapaths, 2 FMA pipes "
            "(a 512-bit FMA takes two)")
DOT = "dot-product instructions: {n} products per 32-bit lane per instruction, issued as often as an FMA"


def _fp32(flags: set[str], vendor: str, family: int) -> Peak:
    """FP32 multiply-adds: 2 FMA units of the widest datapath the core has."""
    if "avx512f" in flags and not (vendor == "AuthenticAMD" and family < 26):
        return Peak("fp32", 64, "AVX-512 FMA, 2 x 16 lanes", INTEL_FMA + "; AMD Zen 5: full 512-bit datapath")
    if "avx512f" in flags:  # AMD Zen 4 (family 25): AVX-512 decoded, executed as two 256-bit halves
        return Peak("fp32", 32, "AVX-512 FMA on 256-bit datapaths, 2 x 8 lanes", AMD_ZEN4)
    if {"avx2", "fma"} <= flags:
        return Peak("fp32", 32, "AVX2 FMA, 2 x 8 lanes", INTEL_FMA + "; AMD Zen 2/3: 2 x 256-bit FMA")
    return Peak("fp32", 16, "SSE/AVX multiply and add, no FMA", "one 8-lane multiply and one add per cycle")


def peaks(flags: set[str], vendor: str, family: int) -> dict[str, Peak]:
    """Each precision's per-core peak from the ISA flags (``/proc/cpuinfo``), the vendor and the CPU family.

    FP32: :func:`_fp32`. BF16: AMX-BF16 1024/cycle; AVX512_BF16's VDPBF16PS does 2 products per FP32 lane (2x FP32);
    without either, FP32's (bf16 is converted and computed in FP32). INT8: AMX-INT8 2048/cycle; VNNI's VPDPBUSD does
    4 products per 32-bit lane (4x FP32 at the same width); without VNNI, the VPMADDUBSW/VPMADDWD/VPADDD sequence
    (about 2x FP32, oneDNN's AVX2 int8 path). FP16: AVX512_FP16 2x FP32, AMX-FP16 1024; without them FP32's (F16C
    only converts)."""
    fp32 = _fp32(flags, vendor, family)
    f = fp32.flops_per_cycle
    bf16 = Peak("bf16", 1024, "AMX-BF16 tiles", INTEL_AMX) if "amx_bf16" in flags else \
        Peak("bf16", 2 * f, "AVX512_BF16 VDPBF16PS", DOT.format(n=2)) if "avx512_bf16" in flags else \
        Peak("bf16", f, "none: bf16 computed in FP32", fp32.source)
    vnni = flags & {"avx512_vnni", "avx_vnni"}
    vnni_width = f if "avx512_vnni" in flags else min(f, 32)
    int8 = Peak("int8", 2048, "AMX-INT8 tiles", INTEL_AMX) if "amx_int8" in flags else \
        Peak("int8", 4 * vnni_width, f"{'AVX512_VNNI' if 'avx512_vnni' in vnni else 'AVX_VNNI'} VPDPBUSD",
             DOT.format(n=4)) if vnni else \
        Peak("int8", 2 * f, "VPMADDUBSW + VPMADDWD + VPADDD", "oneDNN's int8 path without VNNI: about 2x FP32")
    fp16 = Peak("fp16", 1024, "AMX-FP16 tiles", INTEL_AMX) if "amx_fp16" in flags else \
        Peak("fp16", 2 * f, "AVX512_FP16 FMA", "32 FP16 lanes per 512-bit FMA") if "avx512_fp16" in flags else \
        Peak("fp16", f, "none: fp16 computed in FP32 (F16C converts only)", fp32.source)
    return {p.precision: p for p in (fp32, bf16, int8, fp16)}


def with_clock(table: dict[str, Peak], cores: int, mhz: float) -> dict[str, Peak]:
    """The table with each peak in GFLOP/s (GOP/s for INT8) for ``cores`` cores at ``mhz``."""
    return {k: Peak(p.precision, p.flops_per_cycle, p.unit, p.source, round(p.flops_per_cycle * cores * mhz / 1e3, 1))
            for k, p in table.items()}


@dataclass(frozen=True)
class CpuIdentity:
    """The CPU as ``/proc/cpuinfo`` and cpufreq name it (benchmark.json's ``roofline.machine``, less cores and
    flags)."""

    vendor: str
    family: int
    model_name: str
    mhz: float
    mhz_source: str

    def to_json(self) -> dict:
        return asdict(self)


def cpu_identity() -> CpuIdentity:
    """Vendor, family and clock from ``/proc/cpuinfo`` and cpufreq: the clock is cpufreq's maximum where the kernel
    exposes it, else /proc/cpuinfo's "cpu MHz" (a virtual machine reports its nominal clock there; boost may be
    higher, which would make the fractions below too high by up to that ratio)."""
    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    mhz, source = float(fields.get("cpu MHz") or 0.0), "/proc/cpuinfo cpu MHz"
    maximum = Path("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq")
    if maximum.exists():
        mhz, source = int(maximum.read_text().strip()) / 1e3, "cpufreq cpuinfo_max_freq"
    return CpuIdentity(vendor=fields.get("vendor_id", ""), family=int(fields.get("cpu family") or 0),
                       model_name=fields.get("model name", ""), mhz=mhz, mhz_source=source)


# --------------------------------------------------------------------------- fractions


def row_precision(row: BenchmarkRow, table: dict[str, Peak]) -> str:
    """The precision a row's peak is taken in: the first word of its precision column, FP32 where that is no
    precision of the table ("mixed")."""
    word = str(row.precision).split()[0]
    return word if word in table else "fp32"


def fraction(row: BenchmarkRow, macs_per_image: int, table: dict[str, Peak]) -> RooflineRow:
    """One benchmark row's achieved rate (``2 * MACs * batch / p50``) and its fraction of its precision's peak."""
    precision = row_precision(row, table)
    seconds = row.latency_ms.p50 / 1e3
    achieved = 2 * macs_per_image * row.batch_size / seconds / 1e9 if seconds > 0 else None
    peak = table[precision].gflops
    return RooflineRow(backend=row.backend, batch_size=row.batch_size, timing=row.timing, peak_precision=precision,
                       p50_ms=row.latency_ms.p50, achieved_gflops=achieved, peak_gflops=peak,
                       fraction=achieved / peak if achieved is not None and peak else None,
                       fraction_of_fp32=achieved / table["fp32"].gflops if achieved is not None
                       and table["fp32"].gflops else None)


def section(onnx_path: Path, results: list[BenchmarkRow], cores: int, flags: set[str]) -> Roofline:
    """benchmark.json's ``roofline``: the machine, each precision's peak, the model's MACs per image, and each CPU
    row's fraction of its precision's peak."""
    import onnx

    cpu = cpu_identity()
    table = with_clock(peaks(flags, cpu.vendor, cpu.family), cores, cpu.mhz)
    counted = macs(onnx.load(str(onnx_path), load_external_data=False), 1)  # shapes only: no weights needed
    rows = [fraction(r, counted.per_image, table) for r in results if r.device == "cpu"]
    return Roofline.model_validate({
        "machine": {**cpu.to_json(), "cores": cores, "flags": sorted(flags & READ_FLAGS)},
        "peaks": {k: p.to_json() for k, p in table.items()},
        "macs": {"per_image": counted.per_image, "source": onnx_path.name,
                 "layers": [layer.to_json() for layer in counted.layers]},
        "rows": rows}, strict=False)
