"""What the engine inspector says each matrix layer ran in (pipeline.runtime.profiling.tensorrt_inspector), on real
published
dumps and on the fake inspector built from them (tests/fake_inspector.py): TensorRT 10's and 11's keys, Myelin's
layer names, ForeignNode regions, NoOp and Reformat copies, and a dynamic-shape engine inspected without a context.

Excerpts quoted below, each from its source: NVIDIA/TensorRT#4397 (an INT8 BERT on TensorRT 10), NVIDIA/TensorRT#4048
(RT-DETRv2 on TensorRT 10.0.1.6, layer names), NVIDIA/TensorRT#3665 (Myelin's wait/signal layers, TensorRT 9.2),
TensorRT's samples/sampleEditableTimingCache/README.md (a gemm layer with an empty Metadata), trex's example plan
examples/pytorch/resnet/A100/qat/resnet-qat.onnx.engine.graph.json (a NoOp copy), a YOLO11 engine's layer table
(Myelin names for attention), a TensorRT 8 dump of a dynamic-shape engine ("N/A due to dynamic shapes")."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import fake_inspector
import fake_tensorrt
from pipeline.core import env
from pipeline.runtime.profiling import tensorrt_inspection
from pipeline.runtime.profiling import tensorrt_inspector as inspector

# --------------------------------------------------------------------------- data types: TensorRT 10 and 11 keys


@pytest.mark.parametrize("text, precision", [
    ("Thirty-two wide channel vectorized row major Int8 format", "int8"), ("Row major Int8 format", "int8"),
    ("Channel major INT8 format where channel % 16 == 0", "int8"), ("Int8", "int8"),
    ("Channel major FP16 format where channel % 8 == 0", "fp16"), ("Half", "fp16"),
    ("Row major linear FP32", "fp32"), ("Float", "fp32"), ("Row major linear BFloat16 format", "bf16"),
    ("Row major linear FP8 format", "fp8"), ("Row major linear FP4 format (kLINEAR)", "fp4"),
    ("Unknown format", "unknown"), ("N/A due to dynamic shapes", "unknown")])
def test_tensor_precision_reads_tensorrt_10_s_format_strings(text, precision):
    assert inspector.tensor_precision({"Format/Datatype": text}) == precision


def test_tensor_precision_reads_tensorrt_11_s_keys_as_documented_and_falls_back():
    """TensorRT 11's migration page spells them "DataType" ("Float") and "Format" ("Row major linear FP32 format
    (kLINEAR)"); the data type wins over the format's words, the format is read when there is no data type."""
    assert inspector.tensor_precision({"DataType": "Half",
                                       "Format": "Row major linear FP32 format (kLINEAR)"}) == "fp16"
    assert inspector.tensor_precision({"DataType": "Int8"}) == "int8"
    assert inspector.tensor_precision({"Format": "Channel major FP16 format where channel % 8 == 0 (kHWC8)"}) == "fp16"
    assert inspector.tensor_precision({"Datatype": "BFloat16"}) == "bf16"  # another spelling of the key
    assert inspector.tensor_precision({"DataType": "N/A due to dynamic shapes",
                                       "Format": "N/A due to dynamic shapes"}) == "unknown"
    assert inspector.tensor_precision({"Name": "x", "Dimensions": [1, 3]}) == "unknown"


# --------------------------------------------------------------------------- layer names: Cask, Myelin, ForeignNode

YOLO = ["/model.10/m/m.0/attn/MatMul", "/model.10/m/m.0/attn/MatMul_1", "/model.10/m/m.0/attn/qkv/conv/Conv"]
RTDETR = ["/model/decoder/decoder/layers.0/self_attn/MatMul", "/model/decoder/decoder/layers.0/self_attn/MatMul_1",
          "/model/decoder/decoder/layers.0/self_attn/Gemm"]
BERT = [f"/encoder/layers.2/mha/attn/{p}/MatMul" for p in ("mha_prob/key", "mha_prob/query", "value")]


@pytest.mark.parametrize("name, graph, nodes", [
    ("/model_10/m/m_0/attn/MatMul_myl109_2", YOLO, {YOLO[0]}),  # YOLO11, TensorRT 10
    ("/model_10/m/m_0/attn/MatMul_1_myl109_5", YOLO, {YOLO[1]}),
    ("__myl_MulMaxSubExpSum_myl109_3", YOLO, set()),  # kgen: the softmax, no matrix op
    ("dummy_shape_call__mye4273_0_myl109_0", YOLO, set()),
    ("fc_/model/decoder/decoder/layers_0/self_attn/MatMul_1+fc_/model/decoder/decoder/layers_0/self_attn/MatMul_myl71_31",
     RTDETR, set(RTDETR[:2])),  # NVIDIA/TensorRT#4048
    ("fc_/model/decoder/decoder/layers_0/self_attn/Gemm_myl71_42", RTDETR, {RTDETR[2]}),
    (("/encoder/layers_2/mha/attn/mha_prob/key/MatMul+/encoder/layers_2/mha/attn/mha_prob/query/MatMul+"
      "/encoder/layers_2/mha/attn/value/MatMul_myl0_16"), BERT, set(BERT)),  # NVIDIA/TensorRT#4397
    ("matMul1_myl0_0", ["matMul1", "matMul2"], {"matMul1"}),  # sampleEditableTimingCache/README.md
    ("conv1_w_dq + conv1 + relu1 || conv9", ["conv1_w_dq", "conv1", "relu1", "conv9"],
     {"conv1_w_dq", "conv1", "relu1", "conv9"}),
    ("/model.10/m/m.0/attn/MatMul", YOLO, {YOLO[0]}),  # exact
    ("/model_10/m/m_0/attn/MatMul", YOLO, set()),  # Myelin's spelling without Myelin's suffix: not Myelin's layer
    ("a_b/MatMul_myl0_1", ["a.b/MatMul", "a_b/MatMul"], set()),  # two nodes spelled alike: neither
])
def test_layer_nodes_from_real_layer_names(name, graph, nodes):
    record = inspector.InspectedLayer.of({"Name": name, "Metadata": ""})
    assert inspector.layer_nodes(record, inspector.NodeNames.of(graph)) == nodes


def test_layer_nodes_from_the_metadata():
    layer = {"Name": "_gemm_mha_v2_myl0_17", "Metadata": "[ONNX Layer: /a/MatMul]\x1e[ONNX Layer: /a/Softmax]"
                                                          "[ONNX Layer: /a/MatMul_1]"}
    assert inspector.layer_nodes(inspector.InspectedLayer.of(layer), inspector.NodeNames.of([])) == \
        {"/a/MatMul", "/a/Softmax", "/a/MatMul_1"}


def tensor(datatype: str) -> dict:
    return {"Name": "t", "Dimensions": [1, 40, 256], "Format/Datatype": datatype}


def layer(name: str, layer_type: str, *types: str, metadata: str = "") -> dict:
    return {"Name": name, "LayerType": layer_type, "Inputs": [tensor(t) for t in types],
            "Outputs": [tensor(t) for t in types[:1]], "Metadata": metadata}


def test_read_a_tensorrt_10_bert_s_myelin_layers():
    """NVIDIA/TensorRT#4397 (TensorRT 10, INT8 BERT): its gemm, fusion and kgen records, as published."""
    info = {"Layers": [
        layer("/encoder/layers_2/mha/attn/mha_prob/key/MatMul+/encoder/layers_2/mha/attn/mha_prob/query/MatMul+"
              "/encoder/layers_2/mha/attn/value/MatMul_myl0_16", "gemm", "Half",
              metadata="".join(f"[ONNX Layer: {n}]" for n in BERT)),
        layer("_gemm_mha_v2_myl0_17", "kgen", "Half", "Half", "Half", "Half",
              metadata=("[ONNX Layer: /encoder/layers.2/mha/attn/MatMul]"
                        "[ONNX Layer: /encoder/layers.2/mha/attn/MatMul_1]")),
        layer("__myl_Fc_myl0_34", "fusion", "Half", metadata="[ONNX Layer: /encoder/layers.4/pos_ff/dense/MatMul]"),
        layer("__mye6916", "wait"), layer("__mye6918", "signal"),  # NVIDIA/TensorRT#3665
    ]}
    matrix = [*BERT, "/encoder/layers.2/mha/attn/MatMul", "/encoder/layers.2/mha/attn/MatMul_1",
              "/encoder/layers.4/pos_ff/dense/MatMul"]
    reading = inspector.read(info, matrix, matrix)
    assert reading.precisions == {n: "fp16" for n in matrix} and reading.unknown == []


def test_read_skips_noop_and_reformat_copies_named_after_the_layer_they_feed():
    """The copy of a residual ("Input Tensor 1", YOLO11's table) reads another type than the convolution it feeds;
    trex's resnet-qat plan has the same NoOp in front of its Gemm."""
    name = "conv.weight + QuantizeLinear_7 + Conv_9 + Add_11"
    info = {"Layers": [
        layer("QuantizeLinear_2", "Reformat", "Row major linear FP32"),
        layer(f"Reformatting CopyNode for Input Tensor 1 to {name}", "NoOp", "Row major linear FP32"),
        layer(name, "CaskConvolution", "Thirty-two wide channel vectorized row major Int8 format",
              "Row major linear FP32"),
        layer("Reformatting CopyNode for Input Tensor 0 to fc.weight + QuantizeLinear_255 + Gemm_257", "NoOp",
              "Row major linear FP32"),
        layer("fc.weight + QuantizeLinear_255 + Gemm_257", "CaskConvolution",
              "Thirty-two wide channel vectorized row major Int8 format"),
        layer("onnx::Conv_1063", "Constant"),
    ]}
    assert inspector.read(info, ["Conv_9", "Gemm_257"], ["Conv_9", "Gemm_257"]).precisions == \
        {"Conv_9": "int8", "Gemm_257": "int8"}


def test_read_leaves_a_foreign_node_s_region_unknown():
    """One ``{ForeignNode[...]}`` layer for a Myelin region has one input type: it says nothing of each MatMul in it."""
    region = "[ONNX Layer: /a/MatMul]\x1e[ONNX Layer: /a/Softmax]\x1e[ONNX Layer: /a/MatMul_1]"
    info = {"Layers": [layer("{ForeignNode[/a/MatMul.../a/MatMul_1]}", "Myelin", "Half", metadata=region),
                       layer("/b/MatMul", "CaskGemmMatrixMultiply", "Float")]}
    reading = inspector.read(info, ["/a/MatMul", "/a/Softmax", "/a/MatMul_1", "/b/MatMul"],
                             ["/a/MatMul", "/a/MatMul_1", "/b/MatMul"])
    assert reading.precisions == {"/a/MatMul": "unknown", "/a/MatMul_1": "unknown", "/b/MatMul": "fp32"}
    assert reading.unknown == ["/a/MatMul", "/a/MatMul_1"]


def test_read_of_a_dynamic_shape_engine_without_a_context_is_unknown_not_a_guess():
    """A TensorRT 8 dump of a dynamic-shape engine inspected without an execution context: every tensor says
    "N/A due to dynamic shapes"."""
    info = {"Layers": [{"Name": "(Unnamed Layer* 1) [Convolution]", "LayerType": "CaskConvolution",
                        "Inputs": [{"Name": "x", "Dimensions": [-1, 128, 14, 14],
                                    "Format/Datatype": "N/A due to dynamic shapes"}]}]}
    assert inspector.read(info, ["(Unnamed Layer* 1) [Convolution]"], ["(Unnamed Layer* 1) [Convolution]"]).unknown \
        == ["(Unnamed Layer* 1) [Convolution]"]


def test_layer_names_only_is_refused():
    with pytest.raises(ValueError, match="names only"):
        inspector.read({"Layers": ["conv1", "conv2"]}, [], [])


# --------------------------------------------------------------------------- the fake inspector, end to end


@pytest.fixture
def fake_trt(monkeypatch):
    yield fake_tensorrt.install(monkeypatch)
    env.tensorrt_status.cache_clear()


def attention(quantized: bool = False) -> onnx.ModelProto:
    """One attention block in FP16 whose score MatMul and softmax stay FP32 (as AutoCast often leaves them), named
    as PyTorch's exporter names a transformer; ``quantized``: the Q, K, V projections read INT8 (explicit Q/DQ)."""
    rng = np.random.default_rng(0)
    inits, nodes = [], []

    def const(name, array):
        inits.append(numpy_helper.from_array(array, name))
        return name

    def node(op, inputs, output, name, **attrs):
        nodes.append(helper.make_node(op, inputs, [output], name=name, **attrs))
        return output

    if quantized:
        s, z = const("xs", np.float32(0.05)), const("xz", np.int8(0))
        x = node("DequantizeLinear", [node("QuantizeLinear", ["x", s, z], "xq", "/x/QuantizeLinear"), s, z], "xdq",
                 "/x/DequantizeLinear")
    else:
        x = node("Cast", ["x"], "x16", "/Cast", to=TensorProto.FLOAT16)
    proj = {}
    for part in ("query", "key", "value"):
        w = rng.normal(size=(8, 8))
        if quantized:
            wq = const(f"{part}_wq", np.clip(np.round(w / 0.02), -127, 127).astype(np.int8))
            weight = node("DequantizeLinear", [wq, const(f"{part}_ws", np.float32(0.02))], f"{part}_w",
                          f"/{part}/DequantizeLinear")
        else:
            weight = const(f"{part}_w", w.astype(np.float16))
        proj[part] = node("MatMul", [x, weight], f"{part}_y", f"/blk.0/attn/{part}/MatMul")
    if quantized:
        proj = {k: node("Cast", [v], f"{k}_16", f"/{k}/Cast", to=TensorProto.FLOAT16) for k, v in proj.items()}
    kt = node("Transpose", [proj["key"]], "kt", "/blk.0/attn/Transpose", perm=[0, 2, 1])
    q32 = node("Cast", [proj["query"]], "q32", "/blk.0/attn/Cast", to=TensorProto.FLOAT)
    kt32 = node("Cast", [kt], "kt32", "/blk.0/attn/Cast_1", to=TensorProto.FLOAT)
    scores = node("MatMul", [q32, kt32], "scores", "/blk.0/attn/MatMul")
    probs = node("Softmax", [node("Mul", [scores, const("scale", np.float32(0.35))], "scaled", "/blk.0/attn/Mul")],
                 "probs", "/blk.0/attn/Softmax", axis=-1)
    p16 = node("Cast", [probs], "p16", "/blk.0/attn/Cast_2", to=TensorProto.FLOAT16)
    o = node("MatMul", [p16, proj["value"]], "o", "/blk.0/attn/MatMul_1")
    y = node("MatMul", [o, const("out_w", rng.normal(size=(8, 8)).astype(np.float16))], "y16", "/blk.0/attn/out/MatMul")
    node("Cast", [y], "y", "/Cast_1", to=TensorProto.FLOAT)
    graph = helper.make_graph(nodes, "attention", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4, 8])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    return model


def residual_int8() -> onnx.ModelProto:
    """An explicitly quantized convolution whose FP32 residual TensorRT fuses into it (a NoOp copies the residual)."""
    s, z = numpy_helper.from_array(np.float32(0.05), "s"), numpy_helper.from_array(np.int8(0), "z")
    w = numpy_helper.from_array(np.ones((4, 4, 3, 3), np.int8), "wq")
    ws = numpy_helper.from_array(np.float32(0.01), "ws")
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"], name="x_q"),
             helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xdq"], name="x_dq"),
             helper.make_node("DequantizeLinear", ["wq", "ws"], ["w"], name="conv1_w_dq"),
             helper.make_node("Conv", ["xdq", "w"], ["c"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c", "x"], ["a"], name="add1"),
             helper.make_node("Relu", ["a"], ["y"], name="relu1")]
    graph = helper.make_graph(nodes, "residual",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4, 8, 8])], [s, z, w, ws])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 9
    return model


def engine(model: onnx.ModelProto, dims: list[int]):
    profile = {key: dims for key in ("min", "opt", "max")}
    blob = fake_tensorrt.serialize(model.SerializeToString(), profile, profiling_verbosity="DETAILED")
    return fake_tensorrt.Runtime(None).deserialize_cuda_engine(blob)


MATMULS = {"/blk.0/attn/query/MatMul": "fp16", "/blk.0/attn/key/MatMul": "fp16", "/blk.0/attn/value/MatMul": "fp16",
           "/blk.0/attn/MatMul": "fp32", "/blk.0/attn/MatMul_1": "fp16", "/blk.0/attn/out/MatMul": "fp16"}


@pytest.mark.parametrize("version", ["10.13.0.35", "11.4.0.9"])
@pytest.mark.parametrize("metadata", [True, False], ids=["metadata", "empty_metadata"])
@pytest.mark.parametrize("quantized", [False, True], ids=["fp16", "int8"])
def test_an_attention_block_s_matrix_layers_through_myelin(monkeypatch, version, metadata, quantized):
    """Myelin's expanded layers (gemm, kgen, shape_call, the Reformat after the region), with and without Metadata,
    in TensorRT 10's and 11's keys: each MatMul's precision, none unknown."""
    fake = fake_tensorrt.install(monkeypatch, version=version)
    fake.inspector.metadata = metadata
    model = attention(quantized)
    kinds = {layer.type for layer in fake_inspector.engine_layers(model, fake.inspector)}
    assert {"gemm", "kgen", "shape_call", "Reformat"} <= kinds
    expected = {**MATMULS, **({f"/blk.0/attn/{p}/MatMul": "int8" for p in ("query", "key", "value")} if quantized
                              else {})}
    assert tensorrt_inspection.runtime_precisions(engine(model, [2, 4, 8]), model, {"x": [2, 4, 8]}) == expected
    env.tensorrt_status.cache_clear()


def test_a_foreign_node_region_is_unknown_and_counted(fake_trt, caplog):
    """The whole block as one {ForeignNode[...]} layer: no MatMul gets the region's one input type (Float)."""
    fake_trt.inspector.myelin = "foreign"
    model = attention()
    (region,) = [layer for layer in fake_inspector.engine_layers(model, fake_trt.inspector) if layer.type == "Myelin"]
    assert region.name == "{ForeignNode[/Cast.../Cast_1]}" and region.inputs[0].type == "Float"
    precisions = tensorrt_inspection.runtime_precisions(engine(model, [2, 4, 8]), model, {"x": [2, 4, 8]})
    assert precisions == {name: "unknown" for name in MATMULS}
    assert "tells the precision of 0 of 6 matrix layers" in caplog.text


def test_a_residual_s_noop_copy_does_not_speak_for_the_int8_convolution(fake_trt):
    model = residual_int8()
    names = [(layer.type, layer.name) for layer in fake_inspector.engine_layers(model, fake_trt.inspector)]
    assert names == [("Reformat", "x_q"),
                     ("NoOp", "Reformatting CopyNode for Input Tensor 1 to conv1_w_dq + conv1 + add1 + relu1"),
                     ("CaskConvolution", "conv1_w_dq + conv1 + add1 + relu1")]
    assert tensorrt_inspection.runtime_precisions(engine(model, [1, 4, 8, 8]), model, {"x": [1, 4, 8, 8]}) == \
        {"conv1": "int8"}


def test_a_dynamic_shape_engine_is_inspected_through_a_context_with_its_shapes(fake_trt):
    """Without a context the fake says "N/A due to dynamic shapes", as TensorRT does; runtime_precisions sets one."""
    import json

    model = residual_int8()
    built = engine(model, [1, 4, 8, 8])
    bare = json.loads(built.create_engine_inspector().get_engine_information(fake_tensorrt.LayerInformationFormat.JSON))
    assert {t["Format/Datatype"] for layer in bare["Layers"] for t in layer["Inputs"]} == {fake_inspector.DYNAMIC}
    info = tensorrt_inspection.engine_information(built, {"x": [1, 4, 8, 8]})
    assert inspector.read(info, ["conv1"], ["conv1"]).precisions == {"conv1": "int8"}
