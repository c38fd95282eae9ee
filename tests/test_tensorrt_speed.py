"""tune's GPU target (pipeline.runtime.speed.tensorrt_speed) through the recording fake of TensorRT
(tests/fake_tensorrt.py):
a mix built with the build stage's loaders (strongly typed, DETAILED profiling), timed on the virtual device with
benchmark's device-side timer, and the precision each matrix layer runs in read from the engine inspector."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import fake_tensorrt
import virtual_cuda as vc
from pipeline import config
from pipeline.core import env
from pipeline.core.errors import StageFailed, UsageError
from pipeline.runtime.builders import tensorrt_engine
from pipeline.runtime.runners import TimingMethod
from pipeline.runtime.speed import openvino_speed, tensorrt_speed

METHOD = TimingMethod(warmup_s=0, min_iterations=3, min_duration_s=0, trials=2, cv_warn=1.0)
BUILD = config.resolve(overrides=["build.min_batch=1", "build.opt_batch=2", "build.max_batch=4",
                         "verify.batch_size=4"]).build


@pytest.fixture
def fake_trt(monkeypatch):
    yield fake_tensorrt.install(monkeypatch)
    env.tensorrt_status.cache_clear()


def mix(left_out: tuple = ("conv2",), high: str = "fp16") -> onnx.ModelProto:
    """conv1 -> conv2 -> fc, each explicitly quantized (Q/DQ on its input, INT8 weights behind a DequantizeLinear),
    except those ``left_out``: in FP16 as ModelOpt leaves an unquantized layer (high_precision_dtype fp16), or in
    FP32 (``high="fp32"``)."""
    rng = np.random.default_rng(0)
    nodes, inits = [], []

    def const(name: str, array: np.ndarray) -> str:
        inits.append(numpy_helper.from_array(array, name))
        return name

    def layer(op: str, name: str, x: str, w: np.ndarray, **attrs) -> str:
        if name in left_out and high == "fp32":
            nodes.append(helper.make_node(op, [x, const(f"{name}_w", w)], [f"{name}_y"], name=name, **attrs))
            return f"{name}_y"
        if name in left_out:
            nodes.append(helper.make_node("Cast", [x], [f"{name}_x16"], to=TensorProto.FLOAT16, name=f"{name}_cast"))
            nodes.append(helper.make_node(op, [f"{name}_x16", const(f"{name}_w", w.astype(np.float16))],
                                          [f"{name}_y16"], name=name, **attrs))
            nodes.append(helper.make_node("Cast", [f"{name}_y16"], [f"{name}_y"], to=TensorProto.FLOAT,
                                          name=f"{name}_back"))
            return f"{name}_y"
        scale, zero = const(f"{name}_s", np.float32(0.05)), const(f"{name}_z", np.int8(0))
        nodes.append(helper.make_node("QuantizeLinear", [x, scale, zero], [f"{name}_xq"], name=f"{name}_q"))
        nodes.append(helper.make_node("DequantizeLinear", [f"{name}_xq", scale, zero], [f"{name}_xdq"],
                                      name=f"{name}_dq"))
        w_q = const(f"{name}_wq", np.clip(np.round(w / 0.01), -127, 127).astype(np.int8))
        nodes.append(helper.make_node("DequantizeLinear", [w_q, const(f"{name}_ws", np.float32(0.01))],
                                      [f"{name}_w"], name=f"{name}_w_dq"))
        nodes.append(helper.make_node(op, [f"{name}_xdq", f"{name}_w"], [f"{name}_y"], name=name, **attrs))
        return f"{name}_y"

    h = layer("Conv", "conv1", "x", rng.normal(size=(4, 3, 3, 3)).astype(np.float32), pads=[1, 1, 1, 1])
    nodes.append(helper.make_node("Relu", [h], ["r1"], name="relu1"))
    h = layer("Conv", "conv2", "r1", rng.normal(size=(4, 4, 3, 3)).astype(np.float32), pads=[1, 1, 1, 1])
    nodes.append(helper.make_node("GlobalAveragePool", [h], ["pooled"], name="pool"))
    nodes.append(helper.make_node("Flatten", ["pooled"], ["flat"], name="flatten"))
    h = layer("Gemm", "fc", "flat", rng.normal(size=(5, 4)).astype(np.float32), transB=1)
    nodes.append(helper.make_node("Identity", [h], ["logits"], name="out"))
    graph = helper.make_graph(nodes, "mix", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, 8, 8])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["n", 5])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    return model


IMAGES = np.random.default_rng(1).normal(size=(3, 3, 8, 8)).astype(np.float32)


def test_timing_times_every_batch_on_the_device(fake_trt, tmp_path):
    """Every batch asked for, timed with the GPU compute timer: on the virtual device an engine's kernel takes
    LAYER_NS per layer, so the device-side median is exactly that (host latency would add the binding calls)."""
    model = mix()
    result = tensorrt_speed.tensorrt_timing(model, IMAGES, [1, 4], METHOD, build_cfg=BUILD,
                                            timing_cache=tmp_path / "cache", log_path=tmp_path / "build.log")
    assert fake_trt.violations == []
    assert set(result["latency_ms"]) == set(result["p10_p90_ms"]) == {1, 4}
    kernel_ms = vc.LAYER_NS * len(model.graph.node) / 1e6
    for batch in (1, 4):
        assert result["latency_ms"][batch] == pytest.approx(kernel_ms)
        low, high = result["p10_p90_ms"][batch]
        assert low <= result["latency_ms"][batch] <= high
    assert {run["x"][0] for run in fake_trt.runs} == {1, 4}  # the engine really ran at both batches
    assert (tmp_path / "cache").is_file()  # merged into the build stage's timing cache
    (built,) = [c for c in fake_trt.calls if c[0] == "build_serialized_network"]
    assert built and not fake_trt.configs[-1].flags & fake_tensorrt.PRECISION_FLAGS  # strongly typed, no flags


def test_inspector_names_the_layer_left_out_of_int8(fake_trt):
    result = tensorrt_speed.tensorrt_timing(mix(("conv2",)), IMAGES, [1], METHOD, build_cfg=BUILD)
    assert result["runtime"] == {"conv1": "int8", "conv2": "fp16", "fc": "int8"}
    # tune's one rule for both targets' names (openvino_speed.layers_not_in) reads these names as they are
    assert openvino_speed.layers_not_in(result["runtime"], "int8") == ["conv2"]
    assert openvino_speed.layers_not_in(result["runtime"], "fp16") == ["conv1", "fc"]
    assert ("get_engine_information", "JSON") in fake_trt.calls


def test_the_config_asks_for_detailed_profiling(fake_trt):
    """Asked for explicitly, not left to Polygraphy's default (TensorRT's own default names the layers only); the
    build stage's config keeps Polygraphy's default."""
    shapes = tensorrt_engine.profile_shapes(BUILD, [3, 8, 8])
    kwargs = {"input_name": "x", "shapes": shapes, "build_cfg": BUILD, "timing_cache": None}
    assert tensorrt_engine.config_loader(**kwargs, detailed_profile=True).profiling_verbosity == \
        fake_tensorrt.ProfilingVerbosity.DETAILED
    assert tensorrt_engine.config_loader(**kwargs).profiling_verbosity is None
    tensorrt_speed.tensorrt_timing(mix(), IMAGES, [1], METHOD, build_cfg=BUILD)
    assert fake_trt.configs[-1].profiling_verbosity == fake_tensorrt.ProfilingVerbosity.DETAILED
    seen = []
    made = tensorrt_engine.config_loader
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tensorrt_engine, "config_loader", lambda **kw: seen.append(kw) or made(**kw))
        tensorrt_speed.tensorrt_timing(mix(), IMAGES, [1], METHOD, build_cfg=BUILD)
    assert [kw["detailed_profile"] for kw in seen] == [True]


def test_an_engine_without_detailed_profiling_is_refused(fake_trt, monkeypatch):
    """TensorRT's default verbosity gives the layer names only: no data types, so no answer rather than a guess."""
    from polygraphy.backend.trt import CreateConfig

    made = tensorrt_engine.config_loader
    monkeypatch.setattr(tensorrt_engine, "config_loader", lambda **kw: CreateConfig(
        profiles=made(**kw).profiles, profiling_verbosity=fake_tensorrt.ProfilingVerbosity.LAYER_NAMES_ONLY))
    with pytest.raises(StageFailed, match="layer names only .*ProfilingVerbosity.DETAILED"):
        tensorrt_speed.tensorrt_timing(mix(), IMAGES, [1], METHOD, build_cfg=BUILD)


@pytest.mark.parametrize("left_out, high, expected", [
    (("conv1",), "fp16", {"conv1": "fp16", "conv2": "int8", "fc": "int8"}),
    (("conv1", "conv2", "fc"), "fp32", {"conv1": "fp32", "conv2": "fp32", "fc": "fp32"}),
    (("conv1", "conv2", "fc"), "fp16", {"conv1": "fp16", "conv2": "fp16", "fc": "fp16"})])
def test_runtime_precisions_follow_the_strongly_typed_graph(fake_trt, left_out, high, expected):
    """The first layer too (behind the Reformat TensorRT puts before it: that copy is not the layer's kernel)."""
    model = mix(left_out, high)
    profile = {key: [1, 3, 8, 8] for key in ("min", "opt", "max")}
    blob = fake_tensorrt.serialize(model.SerializeToString(), profile, profiling_verbosity="DETAILED")
    engine = fake_tensorrt.Runtime(None).deserialize_cuda_engine(blob)
    assert tensorrt_speed.runtime_precisions(engine, model, {"x": [1, 3, 8, 8]}) == expected


def test_a_batch_outside_the_profile_is_a_config_error_before_any_build(fake_trt):
    with pytest.raises(UsageError, match="batch 8 is outside the TensorRT profile"):
        tensorrt_speed.tensorrt_timing(mix(), IMAGES, [1, 8], METHOD, build_cfg=BUILD)
    assert not any(c[0] == "build_serialized_network" for c in fake_trt.calls)


def test_a_failed_build_names_tensorrt_s_error_and_keeps_the_log(fake_trt, tmp_path):
    fake_trt.fail["parse"] = "ModelImporter.cpp:914: While parsing node number 3 [Conv]: unsupported padding"
    with pytest.raises(StageFailed, match=r"build of a candidate mix failed: ModelImporter.cpp:914: .*\[Conv\]"):
        tensorrt_speed.tensorrt_timing(mix(), IMAGES, [1], METHOD, build_cfg=BUILD, log_path=tmp_path / "trt.log")
    assert "unsupported padding" in (tmp_path / "trt.log").read_text()
