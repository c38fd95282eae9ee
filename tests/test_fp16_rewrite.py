"""The FP16 rewrite's rules (pipeline/precision/fp16_rewrite.py): which nodes move to FP32, what each consumer reads
afterwards, and that the result computes what it says, on ONNX Runtime.

Issue 46: a planted defect that read every renamed tensor's FP16 side (also for a Cast into FP32, which must read the
FP32 value the move keeps) survived the suite. Fast (tiny graphs): the mutation command runs this file.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from pipeline.precision import fp16_rewrite as rewrite

F16, F32, BF16 = TensorProto.FLOAT16, TensorProto.FLOAT, TensorProto.BFLOAT16
SMALL = 2.0 ** -12  # 1 + SMALL is exact in FP32, and 1 in FP16


def _model(nodes, outputs, inits=(), inputs=(("x", F16),)) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, t, [2]) for n, t in inputs],
                              [helper.make_tensor_value_info(n, t, [2]) for n, t in outputs], list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)], ir_version=9)


def _w(value: float = SMALL, dtype=np.float16, name: str = "w") -> TensorProto:
    return numpy_helper.from_array(np.full(2, value, dtype), name)


def _branching() -> onnx.ModelProto:
    """x + w (FP16) read by a Cast into FP32 (AutoCast's entry into an FP32 region) and by an FP16 Neg."""
    return _model([helper.make_node("Add", ["x", "w"], ["t"], name="add"),
                   helper.make_node("Cast", ["t"], ["y32"], name="up", to=F32),
                   helper.make_node("Neg", ["t"], ["y16"], name="neg")],
                  [("y32", F32), ("y16", F16)], [_w()])


def _nodes(model) -> dict:
    return {n.name: n for n in model.graph.node}


def _run(model, **feeds) -> list:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {k: np.asarray(v) for k, v in feeds.items()})


def test_a_cast_into_fp32_reads_the_fp32_value_and_other_consumers_the_fp16_copy():
    out = rewrite.keep_in_fp32(_branching(), ["add"])
    nodes = _nodes(out)
    assert list(nodes["up"].input) == ["t"]  # the FP32 value the move keeps
    assert list(nodes["neg"].input) == ["t__fp16"]  # an FP16 consumer reads the FP16 copy
    down = nodes["t/fallback_to_fp16"]
    assert (down.op_type, list(down.input), list(down.output)) == ("Cast", ["t"], ["t__fp16"])
    assert next(a.i for a in down.attribute if a.name == "to") == F16
    onnx.checker.check_model(out, full_check=True)
    y32, y16 = _run(out, x=np.ones(2, np.float16))
    np.testing.assert_array_equal(y32, np.full(2, 1 + SMALL, np.float32))  # not rounded through FP16
    np.testing.assert_array_equal(y16, np.full(2, -1.0, np.float16))


def test_a_chain_of_moved_nodes_stays_in_fp32_and_each_input_is_cast_up_once():
    model = _model([helper.make_node("Add", ["x", "w"], ["a"], name="add"),
                    helper.make_node("Mul", ["a", "x"], ["b"], name="mul"),
                    helper.make_node("Sub", ["b", "x"], ["y"], name="sub")], [("y", F16)], [_w()])
    out = rewrite.keep_in_fp32(model, ["add", "mul"])
    nodes = _nodes(out)
    assert list(nodes["mul"].input) == ["a", "x__to_fp32"]  # a stays FP32 between the two moved nodes
    assert list(nodes["sub"].input) == ["b__fp16", "x"]  # not moved: reads the FP16 copy and the FP16 input
    assert [n.name for n in out.graph.node].count("x/fallback_to_fp32") == 1
    assert [n.op_type for n in out.graph.node] == ["Cast", "Cast", "Add", "Cast", "Mul", "Cast", "Sub"]
    (y,) = _run(out, x=np.ones(2, np.float16))
    np.testing.assert_array_equal(y, np.full(2, np.float16((1 + SMALL) * 1 - 1)))  # SMALL survives the chain


def test_a_moved_graph_output_keeps_its_declared_name_and_type():
    model = _model([helper.make_node("Add", ["x", "w"], ["y"], name="add")], [("y", F16)], [_w()])
    out = rewrite.keep_in_fp32(model, ["add"])
    nodes = _nodes(out)
    assert list(nodes["add"].output) == ["y__fp32"]
    assert list(nodes["y/fallback_to_fp16"].input) == ["y__fp32"] and list(nodes["y/fallback_to_fp16"].output) == ["y"]
    assert out.graph.output[0].name == "y" and out.graph.output[0].type.tensor_type.elem_type == F16


def test_only_low_nodes_that_can_move_are_moved():
    model = _model([helper.make_node("Cast", ["x"], ["c"], name="cast", to=F32),
                    helper.make_node("Relu", ["c"], ["r"], name="relu32"),
                    helper.make_node("Cast", ["r"], ["y"], name="down", to=F16)], [("y", F16)])
    for names in (["cast", "down"], ["relu32"], ["absent"], []):  # a Cast is never moved; an FP32 node needs nothing
        out = rewrite.keep_in_fp32(model, names)
        assert out == model and out is not model


def test_a_moved_node_reads_its_fp32_original_weights():
    """With the graph converted from, a moved node's FP16 weight is replaced by the FP32 original (cast up, the FP16
    one would keep the rounding the move undoes)."""
    fp32 = _model([helper.make_node("Add", ["x", "w"], ["y"], name="add")], [("y", F32)], [_w(1 / 3, np.float32)],
                  inputs=(("x", F32),))
    low = _model([helper.make_node("Cast", ["x"], ["x16"], name="in"),
                  helper.make_node("Add", ["x16", "w"], ["y"], name="add")], [("y", F16)], [_w(1 / 3)],
                 inputs=(("x", F32),))
    low.graph.node[0].attribute.append(helper.make_attribute("to", F16))
    out = rewrite.keep_in_fp32(low, ["add"], fp32)
    add = _nodes(out)["add"]
    assert list(add.input) == ["x16__to_fp32", "w__fp32_original"]
    original = next(t for t in out.graph.initializer if t.name == "w__fp32_original")
    assert original.data_type == F32 and numpy_helper.to_array(original)[0] == np.float32(1 / 3)
    without = _nodes(rewrite.keep_in_fp32(low, ["add"]))["add"]
    assert list(without.input) == ["x16__to_fp32", "w__to_fp32"]


def test_bf16_moves_the_same_way_with_its_own_names():
    model = _model([helper.make_node("Add", ["x", "w"], ["t"], name="add"),
                    helper.make_node("Cast", ["t"], ["y32"], name="up", to=F32),
                    helper.make_node("Neg", ["t"], ["y"], name="neg")], [("y32", F32), ("y", BF16)],
                   [numpy_helper.from_array(np.array([1, 1], np.uint16), "w")], inputs=(("x", BF16),))
    model.graph.initializer[0].data_type = BF16
    nodes = _nodes(rewrite.keep_in_fp32(model, ["add"]))
    assert list(nodes["up"].input) == ["t"] and list(nodes["neg"].input) == ["t__bf16"]
    assert next(a.i for a in nodes["t/fallback_to_bf16"].attribute if a.name == "to") == BF16


@pytest.mark.parametrize(("op", "attribute", "value", "expected"), [
    ("Cast", "to", F16, F32),
    ("Cast", "to", BF16, F32),
    ("Cast", "to", TensorProto.INT8, TensorProto.INT8),
    ("Cast", "saturate", F16, F16),  # not the target type
    ("CastLike", "to", F16, F16),  # only a Cast's "to" is a type
    ("EyeLike", "dtype", F16, F32),
    ("RandomNormal", "dtype", BF16, F32),
    ("EyeLike", "dtype", TensorProto.INT32, TensorProto.INT32),
    ("EyeLike", "k", F16, F16),  # an integer attribute that is not a type
])
def test_low_float_attributes_become_fp32_and_others_stay(op, attribute, value, expected):
    node = helper.make_node(op, ["a"], ["b"], **{attribute: value})  # made here: the rewrite changes it in place
    rewrite.attributes_to_fp32(node)
    assert node.attribute[0].i == expected


def test_a_float16_tensor_attribute_keeps_its_name_and_a_float_list_is_not_a_type():
    node = helper.make_node("ConstantOfShape", ["s"], ["c"], value=numpy_helper.from_array(np.array([0.5], np.float16),
                                                                                            "fill"))
    node.attribute.append(helper.make_attribute("dtype", [1.0, 2.0]))  # a FLOATS attribute named dtype: not a type
    rewrite.attributes_to_fp32(node)
    assert node.attribute[0].t.data_type == F32 and node.attribute[0].t.name == "fill"
    assert list(node.attribute[1].floats) == [1.0, 2.0]
    assert rewrite.tensor_to_fp32(numpy_helper.from_array(np.ones(2, np.float16), "w")).name == "w"


def test_a_low_constant_attribute_becomes_its_fp32_value():
    node = helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(np.array([0.1], np.float16), "v"))
    rewrite.attributes_to_fp32(node)
    assert node.attribute[0].t.data_type == F32
    assert numpy_helper.to_array(node.attribute[0].t)[0] == np.float32(np.float16(0.1))
    kept = helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(np.array([3], np.int64), "v"))
    rewrite.attributes_to_fp32(kept)
    assert kept.attribute[0].t.data_type == TensorProto.INT64


def test_infer_types_reads_inputs_initializers_constants_and_inferred_values():
    model = _model([helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(np.ones(2, np.float16),
                                                                                          "k")),
                    helper.make_node("Add", ["x", "k"], ["s"], name="add"),
                    helper.make_node("Cast", ["s"], ["y"], name="up", to=F32)], [("y", F32)], [_w()])
    assert rewrite.infer_types(model) == {"x": F16, "w": F16, "k": F16, "s": F16, "y": F32}


def test_infer_types_takes_a_constants_own_type_and_tolerates_an_unknown_op():
    model = _model([helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(np.ones(2, np.float16), "k")),
                    helper.make_node("Mystery", ["x"], ["m"], name="mystery", domain="com.example")],
                   [("k", TensorProto.UNDEFINED), ("m", F16)])
    model.opset_import.append(helper.make_opsetid("com.example", 1))
    types = rewrite.infer_types(model)
    assert types["k"] == F16 and types["x"] == F16  # the Constant's value says FP16 where the output declares none


def _with_constant(value: np.ndarray, name: str = "kc"):
    return helper.make_node("Constant", [], [name], name=f"{name}_node", value=numpy_helper.from_array(value, name))


def test_a_moved_node_reads_its_fp32_original_constant():
    add = helper.make_node("Add", ["x", "kc"], ["y"], name="add")
    fp32 = _model([_with_constant(np.full(2, 1 / 3, np.float32)), add], [("y", F32)], inputs=(("x", F32),))
    low = _model([_with_constant(np.full(2, 1 / 3, np.float16)), add], [("y", F16)])
    out = rewrite.keep_in_fp32(low, ["add"], fp32)
    assert list(_nodes(out)["add"].input) == ["x__to_fp32", "kc__fp32_original"]
    (original,) = [t for t in out.graph.initializer if t.name == "kc__fp32_original"]
    assert original.data_type == F32 and numpy_helper.to_array(original)[0] == np.float32(1 / 3)
    (y,) = _run(out, x=np.zeros(2, np.float16))
    assert y[0] == np.float16(np.float32(1 / 3))


def test_only_float_originals_of_held_inputs_replace_and_each_is_added_once():
    fp32 = _model([_with_constant(np.array([2, 1], np.int64), "shape"),
                   helper.make_node("Add", ["x", "w"], ["a"], name="add1"),
                   helper.make_node("Add", ["a", "w"], ["b"], name="add2"),
                   helper.make_node("Mul", ["b", "w2"], ["c"], name="mul"),
                   helper.make_node("Reshape", ["c", "shape"], ["y"], name="reshape")],
                  [("y", F32)], [_w(1 / 3, np.float32), _w(1 / 7, np.float32, "w2")], inputs=(("x", F32),))
    low = _model([_with_constant(np.array([2, 1], np.int64), "shape"),
                  helper.make_node("Add", ["x", "w"], ["a"], name="add1"),
                  helper.make_node("Add", ["a", "w"], ["b"], name="add2"),
                  helper.make_node("Mul", ["b", "w2"], ["c"], name="mul"),
                  helper.make_node("Reshape", ["c", "shape"], ["y"], name="reshape")],
                 [("y", F16)], [_w(1 / 3), _w(1 / 7, name="w2")])
    low.graph.output[0].type.tensor_type.shape.Clear()
    fp32.graph.output[0].type.tensor_type.shape.Clear()
    out = rewrite.keep_in_fp32(low, ["add1", "add2", "reshape"], fp32)
    nodes = _nodes(out)
    assert list(nodes["add2"].input) == ["a", "w__fp32_original"]
    assert list(nodes["mul"].input) == ["b__fp16", "w2"]  # not moved: its own FP16 weight, no FP32 copy made
    assert list(nodes["reshape"].input) == ["c__to_fp32", "shape"]  # an int64 shape is neither cast nor replaced
    assert sorted(t.name for t in out.graph.initializer) == ["w", "w2", "w__fp32_original"]
    onnx.checker.check_model(out)


def test_an_activation_input_is_cast_up_even_where_the_fp32_graph_had_a_weight():
    """The original's input at the same place is an initializer, but here the node reads a computed tensor: cast up,
    never swapped for the weight. Inputs after one replaced by its original are still handled."""
    fp32 = _model([helper.make_node("Add", ["w", "w"], ["y"], name="add")], [("y", F32)], [_w(1 / 3, np.float32)],
                  inputs=(("x", F32),))
    low = _model([helper.make_node("Add", ["w", "x"], ["y"], name="add")], [("y", F16)], [_w(1 / 3)])
    add = _nodes(rewrite.keep_in_fp32(low, ["add"], fp32))["add"]
    assert list(add.input) == ["w__fp32_original", "x__to_fp32"]
    missing = _nodes(rewrite.keep_in_fp32(low, ["add"], _model([], [], inputs=())))["add"]  # no such node there
    assert list(missing.input) == ["w__to_fp32", "x__to_fp32"]


def test_a_cast_to_a_low_type_reads_the_low_copy_and_stale_value_info_goes():
    model = _model([helper.make_node("Add", ["x", "w"], ["t"], name="add"),
                    helper.make_node("Cast", ["t"], ["y"], name="down", to=F16),
                    helper.make_node("Relu", ["y"], ["z"], name="relu")],
                   [("z", F16)], [_w()])
    model = onnx.shape_inference.infer_shapes(model)
    assert {v.name for v in model.graph.value_info} == {"t", "y"}
    out = rewrite.keep_in_fp32(model, ["add"])
    assert list(_nodes(out)["down"].input) == ["t__fp16"]
    assert [v.name for v in out.graph.value_info] == ["y"]  # t's type changed: its entry goes, y's stays


def test_infer_types_prefers_a_constants_value_over_a_declared_output_type():
    model = _model([_with_constant(np.ones(2, np.float16), "k")], [("k", F32)], inputs=())
    assert rewrite.infer_types(model) == {"k": F16}


def test_only_a_constants_value_is_an_fp32_original():
    """A ConstantOfShape's ``value`` is a fill value, not the tensor; a Constant given as ``value_float`` has no tensor:
    neither replaces the FP16 constant the low graph holds (it is cast up)."""
    shape = numpy_helper.from_array(np.array([2], np.int64), "shape")
    for source in (helper.make_node("ConstantOfShape", ["shape"], ["k"], name="fill",
                                    value=numpy_helper.from_array(np.array([1 / 3], np.float32), "v")),
                   helper.make_node("Constant", [], ["k"], name="scalar", value_float=1 / 3)):
        fp32 = _model([source, helper.make_node("Add", ["x", "k"], ["y"], name="add")], [("y", F32)], [shape],
                      inputs=(("x", F32),))
        low = _model([_with_constant(np.full(2, 1 / 3, np.float16), "k"),
                      helper.make_node("Add", ["x", "k"], ["y"], name="add")], [("y", F16)])
        out = rewrite.keep_in_fp32(low, ["add"], fp32)
        assert list(_nodes(out)["add"].input) == ["x__to_fp32", "k__to_fp32"], source.op_type
