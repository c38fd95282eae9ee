"""The roofline's pure parts (pipeline/runtime/profiling/roofline.py): MACs of a tiny graph counted by hand, the peak
table for the CPUs this project runs on, and a row's fraction of its peak."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import benchmark_row
from pipeline.runtime.profiling import roofline


def tiny_graph() -> onnx.ModelProto:
    """x [N,3,8,8] -> Conv 4x3x3x3 pad 1 -> Conv depthwise 4x1x3x3 stride 2 pad 1 -> Flatten -> Gemm 64->5."""
    init = [numpy_helper.from_array(np.zeros(shape, np.float32), name) for name, shape in
            [("w0", (4, 3, 3, 3)), ("w1", (4, 1, 3, 3)), ("w2", (5, 64)), ("b2", (5,))]]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["a"], name="conv0", pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["a", "w1"], ["b"], name="dw", group=4, strides=[2, 2], pads=[1, 1, 1, 1]),
             helper.make_node("Flatten", ["b"], ["f"], name="flat"),
             helper.make_node("Gemm", ["f", "w2", "b2"], ["y"], name="fc", transB=1)]
    graph = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 5])], init)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_macs_of_a_tiny_graph_by_hand():
    conv0 = 4 * 8 * 8 * (3 * 3 * 3)  # each of 4x8x8 outputs sums 3 channels x 3x3
    dw = 4 * 4 * 4 * (1 * 3 * 3)  # stride 2: 4x4 outputs per channel, one input channel each
    fc = 5 * 64
    counted = roofline.macs(tiny_graph(), batch=3)
    assert [(x.name, x.macs) for x in counted.layers] == [("conv0", 3 * conv0), ("dw", 3 * dw), ("fc", 3 * fc)]
    assert counted.per_image == conv0 + dw + fc and counted.total == 3 * (conv0 + dw + fc)


def test_a_matmul_and_a_transposed_gemm_count_m_n_k():
    assert roofline.node_macs("MatMul", [[2, 7, 16], [16, 9]], [2, 7, 9], {}) == 2 * 7 * 9 * 16
    assert roofline.node_macs("Gemm", [[16, 7], [16, 9]], [7, 9], {"transA": 1}) == 7 * 9 * 16
    assert roofline.node_macs("Conv", [[1, 3, 8, 8], None], [1, 4, 8, 8], {}) == 0  # a shape unknown: not counted


ZEN4 = {"avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16"}
SAPPHIRE_RAPIDS = ZEN4 | {"amx_tile", "amx_bf16", "amx_int8", "avx512_fp16"}


@pytest.mark.parametrize(("flags", "vendor", "family", "expected"), [
    (ZEN4, "AuthenticAMD", 25, {"fp32": 32, "bf16": 64, "int8": 128, "fp16": 32}),  # 256-bit datapaths
    (ZEN4, "AuthenticAMD", 26, {"fp32": 64, "bf16": 128, "int8": 256, "fp16": 64}),  # Zen 5: full 512-bit
    (SAPPHIRE_RAPIDS, "GenuineIntel", 6, {"fp32": 64, "bf16": 1024, "int8": 2048, "fp16": 128}),
    (ZEN4 - {"avx512_bf16"}, "GenuineIntel", 6, {"fp32": 64, "bf16": 64, "int8": 256, "fp16": 64}),  # Cascade Lake
    ({"avx2", "fma"}, "AuthenticAMD", 23, {"fp32": 32, "bf16": 32, "int8": 64, "fp16": 32}),  # Zen 2: no VNNI
    ({"avx2", "fma", "avx_vnni"}, "GenuineIntel", 6, {"fp32": 32, "bf16": 32, "int8": 128, "fp16": 32}),
])
def test_peak_per_cycle_per_core_from_the_isa(flags, vendor, family, expected):
    table = roofline.peaks(flags, vendor, family)
    assert {k: p.flops_per_cycle for k, p in table.items()} == expected
    assert all(p.source and p.unit for p in table.values())


def test_a_rows_fraction_of_its_precisions_peak():
    table = roofline.with_clock(roofline.peaks(ZEN4, "AuthenticAMD", 25), cores=2, mhz=2500.0)
    assert table["fp32"].gflops == 160.0 and table["int8"].gflops == 640.0
    row = benchmark_row("openvino_int8", 8, 100.0, timing="wall-clock", precision="int8")
    f = roofline.fraction(row, 1_000_000_000, table)  # 2 x 1 GMAC x 8 in 0.1 s: 160 GOP/s
    assert f.achieved_gflops == pytest.approx(160.0) and f.fraction == pytest.approx(0.25)
    assert f.fraction_of_fp32 == pytest.approx(1.0) and f.peak_precision == "int8"
    assert roofline.fraction(row.model_copy(update={"precision": "mixed"}), 1, table).peak_precision == "fp32"
