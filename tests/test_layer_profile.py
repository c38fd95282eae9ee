"""The per-layer profile (pipeline/runtime/profiling/layer_profile.py) on hand-made layers, and its report sections."""

import pytest

from pipeline.reports import profile_report, tables
from pipeline.runtime.profiling.layer_account import Layer
from pipeline.runtime.profiling.layer_profile import profile_entry, summarise, unfused_class

# A Q/DQ graph as ONNX Runtime's CPU provider runs it: convolutions in FP32 on dequantized values, plus the Q/DQ and
# casts it left in place (times in microseconds).
LAYERS = [
    Layer("q0", "QuantizeLinear", "fp32", False, "CPUExecutionProvider", 10.0),
    Layer("dq0", "DequantizeLinear", "int8", False, "CPUExecutionProvider", 20.0),
    Layer("conv0", "FusedConv", "fp32", True, "CPUExecutionProvider", 50.0),
    Layer("cast0", "Cast", "fp32", False, "CPUExecutionProvider", 5.0),
    Layer("conv1", "QLinearConv", "int8", True, "CPUExecutionProvider", 10.0),
    Layer("t0", "Transpose", "fp16", False, "CPUExecutionProvider", 5.0),
    Layer("shape", "Shape", "fp32", False, "CPUExecutionProvider", None),
]


def group(groups, name):
    return next(g for g in groups if g["name"] == name)


def test_the_summary_adds_up_time_by_kind_precision_and_unfused_class():
    s = summarise(LAYERS, top=2)
    assert s["layers"] == 7 and s["timed_layers"] == 6 and s["total_us"] == 100.0
    assert group(s["by_precision"], "fp32") == {"name": "fp32", "count": 4, "time_us": 65.0, "share": 0.65}
    assert group(s["by_precision"], "int8")["time_us"] == 30.0
    assert [g["name"] for g in s["by_kind"]][:2] == ["FusedConv", "DequantizeLinear"]  # slowest first
    assert group(s["matrix_by_precision"], "fp32")["share"] == 0.5
    assert group(s["matrix_by_precision"], "int8")["share"] == 0.1
    assert {g["name"]: g["count"] for g in s["unfused"]} == {"quantize": 2, "convert": 1, "reorder": 1}
    assert s["unfused_share"] == pytest.approx(0.40)
    assert s["matrix_shares"] == {"fp32": 0.5, "int8": 0.5}
    assert [x["name"] for x in s["slowest"]] == ["conv0", "dq0"] and s["slowest"][0]["share"] == 0.5


def test_a_runtime_that_timed_nothing_has_no_total_and_no_shares():
    s = summarise([Layer("c", "Convolution", "int8", True, "jit_avx512", None)])
    assert s["total_us"] is None and s["unfused_share"] is None and s["slowest"] == []
    assert s["by_kind"] == [{"name": "Convolution", "count": 1, "time_us": 0.0, "share": None}]


@pytest.mark.parametrize(("kind", "cls"), [("Reorder", "reorder"), ("Convert", "convert"), ("FakeQuantize", "quantize"),
                                           ("DequantizeLinear", "quantize"), ("Convolution", None), ("Relu", None)])
def test_unfused_classes_cover_both_runtimes_names(kind, cls):
    assert unfused_class(kind) == cls


def test_the_report_names_the_precision_the_matrix_time_ran_in_and_what_was_unfused():
    entry = profile_entry("onnxrt_int8_cpu", "int8 (Q/DQ graph)", 1, [x.to_json() for x in LAYERS])
    assert entry.source.startswith("ONNX Runtime profiler")
    text = profile_report.finding(entry)
    assert "timed as int8, but 83% of its matrix-layer time ran in fp32" in text
    assert "FusedConv fp32 50%" in text and "40% of the inference in layers left unfused" in text
    payload = {"profiles": [entry.to_json()], "results": [], "roofline": None}
    md = tables.markdown(profile_report.sections(payload))
    assert "| onnxrt_int8_cpu | 1 | int8 (Q/DQ graph) | fp32 83%, int8 17% | 0.100 | - | 40% |" in md
    assert "| FusedConv | fp32 | 1 | 0.050 | 50.0% |" in md and "`conv0`" in md


def test_an_artifact_that_runs_as_it_is_timed_has_no_precision_finding():
    layers = [Layer("c", "Convolution", "int8", True, "brgconv_avx512_int8", 90.0),
              Layer("r", "Reorder", "fp32", False, "ref", 10.0)]
    text = profile_report.finding(profile_entry("openvino_int8", "int8", 1, [x.to_json() for x in layers]))
    assert "timed as" not in text and text.startswith("10% of the inference in layers left unfused (reorder: 1")


def conv_graph(output_q: bool):
    """x -> Q -> DQ -> Conv (int8 weights through a DQ) [-> Q -> DQ] -> Relu: FP32 outside the Q/DQ."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    init = [numpy_helper.from_array(np.array(0.02, np.float32), "s"),
            numpy_helper.from_array(np.array(0, np.int8), "z"),
            numpy_helper.from_array(np.ones((8, 4, 3, 3), np.int8), "w"),
            numpy_helper.from_array(np.full(8, 0.01, np.float32), "ws"),
            numpy_helper.from_array(np.zeros(8, np.int8), "wz")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"], axis=0),
             helper.make_node("Conv", ["xd", "wd"], ["c"], pads=[1, 1, 1, 1])]
    if output_q:
        nodes += [helper.make_node("QuantizeLinear", ["c", "s", "z"], ["cq"]),
                  helper.make_node("DequantizeLinear", ["cq", "s", "z"], ["cd"])]
    nodes.append(helper.make_node("Relu", ["cd" if output_q else "c"], ["y"]))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], init)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])


@pytest.mark.parametrize(("output_q", "conv"), [(False, ("FusedConv", "fp32")), (True, ("QLinearConv", "int8"))])
def test_onnx_runtime_fuses_a_qdq_conv_only_with_a_quantize_after_it(output_q, conv):
    """The report's explanation of onnxrt_int8_cpu (profile_report.ORT_QDQ_WHY), on the installed ONNX Runtime."""
    import numpy as np
    import onnxruntime as ort

    from pipeline.runtime.profiling.layer_account import ort_layers

    model = conv_graph(output_q).SerializeToString()
    layers = ort_layers(lambda options: ort.InferenceSession(model, options, providers=["CPUExecutionProvider"]),
                        {"x": np.ones((1, 4, 8, 8), np.float32)})
    assert [(x.kind, x.precision) for x in layers if x.matrix] == [conv]
    entry = profile_entry("onnxrt_int8_cpu", "int8", 1, [x.to_json() for x in layers])
    assert ("QLinearConv) only where" in profile_report.finding(entry)) is not output_q


def test_each_layer_keeps_its_fastest_run():
    from pipeline.runtime.profiling.layer_account import ort_profile_layers

    def event(dur):
        return {"cat": "Node", "name": "/c/Conv_kernel_time", "dur": dur,
                "args": {"op_name": "Conv", "provider": "CPUExecutionProvider", "input_type_shape": [{"float": [1]}]}}

    assert [x.time_us for x in ort_profile_layers([event(90), event(12), event(30)])] == [12.0]
