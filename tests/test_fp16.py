"""The FP16 emulation must reproduce per-op FP16 rounding; ONNX Runtime CPU must be shown not to."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from pipeline.precision import fp16, plugs
from pipeline.runtime import runners
from pipeline.runtime.runners import collect, onnxrt_runner


def cancellation_graph(constant: float = 384.0) -> onnx.ModelProto:
    """FP32 in/out, an FP16 region computing (x + c) - c."""
    c = numpy_helper.from_array(np.array(constant, np.float16), "c")
    nodes = [
        helper.make_node("Cast", ["x"], ["xh"], to=TensorProto.FLOAT16, name="cast_in"),
        helper.make_node("Add", ["xh", "c"], ["a"], name="add"),
        helper.make_node("Sub", ["a", "c"], ["s"], name="sub"),
        helper.make_node("Cast", ["s"], ["y"], to=TensorProto.FLOAT, name="cast_out"),
    ]
    graph = helper.make_graph(nodes, "cancel", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 64])], [c])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    return model


def run(runner, x):
    return collect(runner, [{"x": x}])[0]["y"]


@pytest.fixture
def x():
    return (np.random.default_rng(0).random((8, 64), dtype=np.float32) - 0.5)


def true_fp16(x, constant=384.0):
    """Per-op FP16 arithmetic done by hand with NumPy float16."""
    c = np.float16(constant)
    return ((x.astype(np.float16) + c) - c).astype(np.float32)


def test_fast_emulation_reproduces_per_op_fp16_rounding(x):
    model = cancellation_graph()
    emulated = run(runners.faithful_runner(plugs.FP16, model, "fast"), x)
    np.testing.assert_array_equal(emulated, true_fp16(x))
    # FP16 spacing at 384 is 0.25: the small part is rounded to multiples of 0.25.
    assert np.abs(emulated - x).max() > 0.1


def test_strict_emulation_matches_numpy_fp16(x):
    model = cancellation_graph()
    strict = run(runners.faithful_runner(plugs.FP16, model, "strict"), x)
    np.testing.assert_array_equal(strict, true_fp16(x))


def test_onnxruntime_cpu_is_not_faithful(x):
    """The reason the emulation exists: ORT CPU runs this FP16 region in FP32."""
    model = cancellation_graph()
    ort_out = run(onnxrt_runner(model.SerializeToString(), name="ort"), x)
    assert np.abs(ort_out - x).max() < 1e-3
    assert np.abs(true_fp16(x) - x).max() > 0.1


def test_emulation_graph_is_fp32_with_rounding_pairs():
    emulated = fp16.emulation_model(cancellation_graph())
    onnx.checker.check_model(emulated)
    types = fp16.infer_types(emulated)
    assert TensorProto.FLOAT16 not in {t for name, t in types.items() if not name.endswith("__as_fp16")}
    casts = [n for n in emulated.graph.node if n.op_type == "Cast"]
    assert sum(1 for n in casts if n.attribute[0].i == TensorProto.FLOAT16) >= 3  # after cast_in, add, sub
    init = {i.name: i for i in emulated.graph.initializer}["c"]
    assert init.data_type == TensorProto.FLOAT and numpy_helper.to_array(init) == np.float32(384.0)


def test_emulation_reproduces_overflow():
    """65504 is FP16's largest value: the emulation must turn 70000 into inf, like FP16 hardware."""
    model = cancellation_graph(constant=35000.0)
    x = np.full((1, 64), 35000.0, np.float32)
    out = run(runners.faithful_runner(plugs.FP16, model, "fast"), x)
    assert np.isinf(out).all() or np.isnan(out).all()


def test_emulation_rejects_subgraphs():
    then_graph = helper.make_graph([helper.make_node("Identity", ["x"], ["t"])], "then", [],
                                   [helper.make_tensor_value_info("t", TensorProto.FLOAT, [1])])
    node = helper.make_node("If", ["cond"], ["y"], then_branch=then_graph, else_branch=then_graph, name="if")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
                                            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    with pytest.raises(NotImplementedError, match="strict"):
        fp16.emulation_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))


def test_autocast_reasons_are_explained():
    assert "data_max" in fp16._explain("reference IO out of range: min=0, max=9e4, absmax=9e4, range=[-512, 512]")
    assert "nodes_to_exclude" in fp16._explain("DisabledNodeNameRegexRule")
    assert "op type" in fp16._explain("DisabledOpTypes")
    assert "no rule" in fp16._explain(None)
    assert fp16.exact_name_regex("/layer1/Add.0") == r"^/layer1/Add\.0$"


# --------------------------------------------------------------------------- BF16: the same rewrite, another type


def bf16_cancellation_graphs(constant: float = 384.0) -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """The FP32 graph x -> (x + c) - c and its BF16 conversion (opset 22, as export writes BF16 graphs), with the
    same tensor names, as AutoCast keeps them."""
    import ml_dtypes

    def graph(low: bool) -> onnx.ModelProto:
        dtype = TensorProto.BFLOAT16 if low else TensorProto.FLOAT
        c = helper.make_tensor("c", dtype, [], [constant])
        to = (lambda name, src, dst, t: helper.make_node("Cast", [src], [dst], to=t, name=name)) if low else \
            (lambda name, src, dst, t: helper.make_node("Identity", [src], [dst], name=name))
        nodes = [to("cast_in", "x", "xh", TensorProto.BFLOAT16),
                 helper.make_node("Add", ["xh", "c"], ["a"], name="add"),
                 helper.make_node("Sub", ["a", "c"], ["s"], name="sub"), to("cast_out", "s", "y", TensorProto.FLOAT)]
        g = helper.make_graph(nodes, "cancel", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 64])], [c])
        model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 22)])
        model.ir_version = 10
        onnx.checker.check_model(model)
        return model

    assert ml_dtypes.bfloat16  # the type the emulation rounds to
    return graph(False), graph(True)


def true_bf16(x, constant=384.0):
    import ml_dtypes

    bf = ml_dtypes.bfloat16
    return ((x.astype(bf) + bf(constant)).astype(bf) - bf(constant)).astype(bf).astype(np.float32)


@pytest.mark.parametrize("mode", ["fast", "strict"])
def test_bf16_emulation_reproduces_per_op_bf16_rounding(x, mode):
    """BF16 keeps 8 significant bits: at 384 its spacing is 2, so x in [-0.5, 0.5] is wiped out. Strict mode is the
    same rounding (a BF16 unit accumulates in FP32; ONNX's reference evaluator would not)."""
    _, low = bf16_cancellation_graphs()
    emulated = run(runners.faithful_runner(plugs.BF16, low, mode), x)
    np.testing.assert_array_equal(emulated, true_bf16(x))
    assert np.abs(emulated - x).max() > 0.2


def test_bf16_localisation_names_the_first_rounding_node(x):
    """The rounding casts' own outputs are bfloat16, which ONNX Runtime cannot hand to NumPy: localisation asks only
    for the FP32 graph's tensors (a BF16 failure once crashed verify here)."""
    from pipeline.precision import gate as criteria
    from pipeline.runtime.profiling import localize

    fp32, low = bf16_cancellation_graphs()
    rule = criteria.TensorRule("scaled", 0.1, 0.0, 0.0)
    result = localize.localize_faithful(plugs.BF16, fp32, low, {"x": x}, rule, top=3)
    assert result.first_divergent.name == "add" and result.compared_nodes == 4
