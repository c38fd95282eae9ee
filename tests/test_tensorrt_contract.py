"""Contract tests of the TensorRT path on a CPU, through a recording fake (tests/fake_tensorrt.py).

These tests check the CALLS the pipeline makes to TensorRT's bindings and to CUDA memory (signatures, bool
returns, set_input_shape before execution, buffers alive as long as the context bound to them, thread-local
graph capture), not TensorRT's numerics: the fake engine runs its ONNX file with ONNX Runtime on the CPU.
They drive build -> verify -> benchmark through the real TensorRT branches (tensorrt_fp16), and through
Polygraphy's real loaders: the build's NetworkFromOnnxPath/CreateConfig/EngineBytesFromNetwork chain and
TrtRunner run unchanged over the fake bindings.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import fake_tensorrt
from conftest import cli
from pipeline.core import env
from pipeline.core.engine_sidecar import ProfileShapes
from pipeline.runtime import backends, runners
from pipeline.runtime.builders import tensorrt_engine

# Every contract test (build, verify, benchmark over the fake bindings) in both modes of the fake: TensorRT 10.13 and
# TensorRT 11.1, whose bindings have no weak-typing flags (BuilderFlag.FP16/INT8/BF16/FP8/..., EXPLICIT_BATCH).
pytestmark = pytest.mark.parametrize("fake_trt", ["10", "11"], indirect=True)


@pytest.fixture
def fake_trt(monkeypatch, request):
    """The fake TensorRT: 10.13, or 11.1 where a test asks (``@pytest.mark.parametrize("fake_trt", ["11"],
    indirect=True)``; this module runs every test in both)."""
    fake = fake_tensorrt.install(monkeypatch, version=getattr(request, "param", "10"))
    # Runners in this process, so the fake (installed here) serves them; the child process is tested elsewhere.
    monkeypatch.setattr(backends.Backend, "isolated", False)
    yield fake
    env.tensorrt_status.cache_clear()


def built(run, fake, *overrides) -> dict:
    """Build through Polygraphy's real loaders (NetworkFromOnnxPath, CreateConfig, EngineBytesFromNetwork) over
    the fake bindings; the engine's sidecar."""
    assert cli("build", "--run-dir", run, "--require", "tensorrt", "build.max_batch=16", *overrides) == 0
    assert fake.violations == []
    return json.loads((run / "model.fp16.engine.json").read_text())


@pytest.fixture
def built_run(fake_trt, clone_run):
    run = clone_run()
    sidecar = built(run, fake_trt)
    assert sidecar["gpu"] == "Fake GPU (tests/fake_tensorrt.py)" and sidecar["tensorrt"] == fake_trt.version
    return run


def test_fake_calls_build_runs_polygraphy_s_loaders_strongly_typed_without_precision_flags(fake_trt, clone_run):
    """The builder calls Polygraphy makes for build: a strongly typed network parsed from the ONNX file, one
    profile equal to build.min/opt/max batch, no precision flag (TF32 only when build.tf32), the optimization
    level, and the timing cache loaded and saved."""
    run = clone_run()
    sidecar = built(run, fake_trt, "build.min_batch=2", "build.opt_batch=4", "build.optimization_level=2",
                    "build.precisions=[fp16]")
    calls = [c[0] for c in fake_trt.calls]
    assert calls.index("create_network") < calls.index("parse_from_file") < calls.index("build_serialized_network")
    (flags,) = [c[1] for c in fake_trt.calls if c[0] == "create_network"]
    assert flags == 1 << int(fake_trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)  # passed on 11 too (ignored)
    (parsed,) = [c[1] for c in fake_trt.calls if c[0] == "parse_from_file"]
    assert parsed.endswith("model.fp16.onnx")  # parse_from_file: external weights are found beside the file
    (config,) = fake_trt.configs
    assert not {f.name for f in config.flags} & fake_tensorrt.PRECISION_FLAG_NAMES
    assert not any(c[0] == "set_flag" for c in fake_trt.calls)  # build.tf32 is false: nothing set, TF32 cleared
    assert ("clear_flag", "TF32") in fake_trt.calls and fake_trt.BuilderFlag.TF32 not in config.flags
    assert config.builder_optimization_level == 2
    (profile,) = config.profiles
    size = sidecar["profile"]["min"][1:]
    assert profile.shapes == {sidecar["profile"]["input"]: ((2, *size), (4, *size), (16, *size))}
    assert sidecar["profile"]["min"][0] == 2 and sidecar["profile"]["opt"][0] == 4
    header = json.loads((run / "model.fp16.engine").read_bytes()[len(fake_tensorrt.MAGIC):].split(b"\n", 1)[0])
    assert header["strongly_typed"] and header["level"] == 2 and header["flags"] == []
    cache = json.loads(Path(sidecar["timing_cache"]).read_text())  # saved by EngineBytesFromNetwork
    assert len(cache["entries"]) == 1
    log = (run / "logs" / "build.tensorrt.fp16.log").read_text()  # TensorRT's INFO lines, through Polygraphy's logger
    assert "Parsing of ONNX model" in log and "Total Activation Memory" in log
    fake_trt.calls.clear()
    # the second build loads the saved cache, and TF32 is asked for
    built(run, fake_trt, "build.tf32=true", "build.precisions=[fp16]")
    assert ("set_flag", "TF32") in fake_trt.calls
    assert not fake_trt.configs[-1].flags & fake_tensorrt.PRECISION_FLAGS
    assert any(c[0] == "create_timing_cache" and c[1] > 0 for c in fake_trt.calls)


def bench(run, *extra):
    assert cli("benchmark", "--run-dir", run, "benchmark.backends=[tensorrt_fp16]", "benchmark.batch_sizes=[1,4,32]",
               *extra) == 0
    return json.loads((run / "benchmark.json").read_text())


def test_fake_calls_verify_runs_the_engine_through_trtrunner(built_run, fake_trt):
    assert cli("verify", "--run-dir", built_run, "--require", "tensorrt",
               "verify.candidates.onnxrt_cuda_fp16.enabled=false") == 0  # the fake GPU has no CUDA provider
    result = {c["name"]: c for c in json.loads((built_run / "verify.json").read_text())["candidates"]}
    assert result["tensorrt_fp16"]["status"] == "passed"
    assert fake_trt.violations == []
    # 20 images at verify.batch_size 16, then again at the profile's other sizes on the same execution context:
    # a new shape with every input buffer still alive for the context bound to it
    assert {shape["input"][0] for shape in fake_trt.runs} == {16, 4, 1, 8}
    rows = {r["batch_size"]: r["status"] for r in result["tensorrt_fp16"]["batch_sizes"]}
    assert rows == {1: "passed", 8: "passed", 16: "passed"}
    # the conformance runs on the same context: each image alone and in full batches of 16, and the engine
    # inspector's account of the precision each matrix layer ran in
    conformance = result["tensorrt_fp16"]["conformance"]
    assert conformance["rows"]["status"] == "passed" and conformance["rows"]["base"] == "alone"
    assert conformance["precision"]["source"] == "runtime" and conformance["precision"]["shares"] == {"fp16": 1.0}


@pytest.mark.parametrize("graphs", [False, True], ids=["trtrunner", "cuda_graphs"])
def test_fake_calls_benchmark_times_every_batch_with_live_buffers(built_run, fake_trt, graphs):
    payload = bench(built_run, f"benchmark.cuda_graphs={str(graphs).lower()}")
    assert fake_trt.violations == []
    rows = {(r["batch_size"], r["timing"].split(" (")[0]) for r in payload["results"]}
    assert rows == {(b, t) for b in (1, 4) for t in ("GPU compute", "host latency")}
    (skip,) = payload["skipped"]
    assert skip["batch_size"] == 32 and "outside the engine's profile" in skip["reason"]
    assert all(r["cuda_graphs"] is graphs for r in payload["results"])
    assert fake_trt.capture_modes == (["thread_local"] * 2 if graphs else [])


@pytest.mark.parametrize("call", ["execute_async_v3", "set_input_shape"])
@pytest.mark.parametrize("graphs", [False, True], ids=["trtrunner", "cuda_graphs"])
def test_fake_calls_a_false_return_is_an_error_row_not_a_timing(built_run, fake_trt, call, graphs):
    fake_trt.fail[call] = {4}
    payload = bench(built_run, f"benchmark.cuda_graphs={str(graphs).lower()}")
    assert {r["batch_size"] for r in payload["results"]} == {1}
    errors = [s for s in payload["skipped"] if s.get("batch_size") == 4]
    assert errors and all(s["reason"].startswith("error: ") for s in errors)
    assert any(call in s["reason"] or "failed" in s["reason"] for s in errors), errors


def test_fake_calls_a_failed_graph_capture_fails_loudly(built_run, fake_trt):
    fake_trt.fail["capture"] = True
    payload = bench(built_run, "benchmark.cuda_graphs=true")
    assert payload["results"] == []
    reasons = [s["reason"] for s in payload["skipped"] if s.get("batch_size") in (1, 4)]
    assert len(reasons) == 2 and all("CUDA graph capture of the TensorRT engine failed" in r for r in reasons)


def test_fake_calls_graphed_engine_keeps_its_buffers_and_checks_shapes(fake_trt, tmp_path):
    """The hand-written path alone: a freed input, a missing shape or a host pointer are violations."""
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3])
    model = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    engine = fake_tensorrt.Runtime(None).deserialize_cuda_engine(
        fake_tensorrt.serialize(model.SerializeToString(), {"min": [1, 3], "opt": [2, 3], "max": [4, 3]}))
    host = np.array([[-1.0, 2.0, -3.0], [4.0, -5.0, 6.0]], np.float32)
    graphed = runners.GraphedEngine(engine, input_name="x", output_name="y", host=host)
    graphed.host_latency()
    np.testing.assert_array_equal(graphed.host_output.numpy(), np.maximum(host, 0))  # computed from the bound input
    assert fake_trt.violations == []

    def bind_a_local(context):  # the old defect: the bound input a local of the function that bound it
        x_dev = runners.DEVICE_MEMORY.tensor(host)
        assert context.set_input_shape("x", (2, 3)) and context.set_tensor_address("x", x_dev.data_ptr())

    context = engine.create_execution_context()
    bind_a_local(context)
    out = runners.DEVICE_MEMORY.empty((2, 3), dtype=graphed.output.dtype)
    context.set_tensor_address("y", out.data_ptr())
    assert context.execute_async_v3(fake_tensorrt.STREAM) is False
    assert "was freed" in fake_trt.violations[-1]

    fresh = engine.create_execution_context()  # no set_input_shape for the dynamic input
    keep = runners.DEVICE_MEMORY.tensor(host)
    fresh.set_tensor_address("x", keep.data_ptr())
    assert fresh.execute_async_v3(fake_tensorrt.STREAM) is False
    assert "set_input_shape was not called" in fake_trt.violations[-1]
    assert fresh.set_tensor_address("y", host.ctypes.data) is False  # host memory is not a device allocation


def test_fake_calls_a_failed_build_names_tensorrt_errors_and_keeps_the_log(fake_trt, clone_run, capsys):
    """TensorRT's errors reach the user: the parser's error (as the fake parser reports it, through Polygraphy's
    real NetworkFromOnnxPath) first in the message, every line TensorRT and Polygraphy logged in
    logs/build.tensorrt.fp16.log."""
    from polygraphy.logger import G_LOGGER

    fake_trt.fail["parse"] = "ModelImporter.cpp:914: While parsing node number 3 [Conv]: unsupported padding"
    run = clone_run()
    severity = G_LOGGER.module_severity.get()
    assert cli("build", "--run-dir", run) == 4
    err = capsys.readouterr().err
    assert "TensorRT engine build failed: ModelImporter.cpp:914: While parsing node number 3 [Conv]" in err
    assert "logs/build.tensorrt.fp16.log" in err
    text = (run / "logs" / "build.tensorrt.fp16.log").read_text()
    assert "unsupported padding" in text and "Could not parse ONNX correctly" in text
    assert not (run / "model.fp16.engine").exists()
    assert G_LOGGER.module_severity.get() == severity  # restored


def test_fake_calls_a_builder_error_is_the_failure_message(fake_trt, clone_run, monkeypatch, capsys):
    """A builder that returns no engine (here: a precision flag on the strongly typed network, which TensorRT
    10.12+ rejects) is a failed build with TensorRT's error, not "Invalid Engine" alone."""
    from polygraphy.backend.trt import CreateConfig

    made = tensorrt_engine.config_loader
    monkeypatch.setattr(tensorrt_engine, "config_loader",
                        lambda **kw: CreateConfig(bf16=True, profiles=made(**kw).profiles))
    run = clone_run()
    assert cli("build", "--run-dir", run) == 4
    err = capsys.readouterr().err
    if fake_trt.major >= 11:  # no BuilderFlag.BF16 at all: Polygraphy's CreateConfig fails before the builder
        assert "TensorRT engine build failed" in err and "bf16" in err
        assert not any(c[0] == "build_serialized_network" for c in fake_trt.calls)
        return
    assert "TensorRT engine build failed: IBuilder::buildSerializedNetwork: Error Code 4: API Usage Error " \
           "(precision flags ['BF16'] are not allowed on a strongly typed network)" in err


def profile_of(batches: tuple[int, int, int], *size: int) -> ProfileShapes:
    """An engine's profile for a runner made by hand: min/opt/max batch of ``size``."""
    low, opt, high = batches
    return ProfileShapes(input="x", min=[low, *size], opt=[opt, *size], max=[high, *size])


def relu_engine_bytes() -> bytes:
    """A one-node fake engine (x -> Relu -> y, batch 1..4)."""
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3])
    model = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return fake_tensorrt.serialize(model.SerializeToString(), {"min": [1, 3], "opt": [2, 3], "max": [4, 3]})


@pytest.mark.parametrize("machine", ["with /usr/local/cuda", "pip only"])
def test_a_tensorrt_runner_made_directly_loads_the_cuda13_wheel_s_libcudart(fake_trt, monkeypatch, machine):
    """A TensorrtRunner made outside the backend table (as scripts/gpu_timing_check.py makes it), first in its
    process: Polygraphy's CUDA wrapper, searching as it really does, loads the CUDA 13 wheel's libcudart
    (nvidia/cu13/lib, where Polygraphy never looks by itself), not /usr/local/cuda's, and on a pip-only machine
    finds one at all. The defect this is for: env.expose_libcudart() called only by the table's entry points."""
    from polygraphy.cuda import cuda as pcuda

    fake_tensorrt.fresh_process(monkeypatch)
    if machine == "pip only":  # no CUDA toolkit, no system libcudart: only the wheel's
        search = pcuda._find_cuda_lib_dirs
        monkeypatch.setattr(pcuda, "_find_cuda_lib_dirs",
                            lambda: [d for d in search() if not d.startswith(("/usr/", "/lib"))])
    wheel = Path(fake_tensorrt.pip_cuda13_site()) / "nvidia" / "cu13" / "lib" / "libcudart.so.13"
    runner = runners.TensorrtRunner(relu_engine_bytes(), profile_of((1, 2, 4), 3),
                                    name="tensorrt_fp16", input_name="x", output_name="y")
    with runner:
        out = runners.to_numpy(runner.infer({"x": np.array([[-1.0, 2.0, -3.0]], np.float32)})["y"])
    np.testing.assert_array_equal(out, [[0.0, 2.0, 0.0]])
    assert fake_trt.libcudart == str(wheel) and fake_trt.violations == []


def test_tensorrt_localisation_of_a_bf16_engine_runs_on_the_engine(fake_trt, clone_run):
    """GPU localisation of a BF16 engine: every tensor marked as a network output (Polygraphy's ModifyNetworkOutputs
    over the fake's layers), so the engine has BF16 outputs, which NumPy cannot hold (Polygraphy's NumPy type map has
    no bfloat16). Fed torch CUDA tensors, Polygraphy's TrtRunner returns torch bfloat16 tensors and the comparison
    runs on the engine; fed NumPy (the defect) it raised, and verify fell back to the emulation."""
    import onnx

    from conftest import BF16_ON
    from pipeline import config
    from pipeline.precision.gate import TensorRule
    from pipeline.runtime.profiling import localize

    run = clone_run()
    assert cli("export", "--run-dir", run, BF16_ON) == 0
    cfg = config.resolve(overrides=["build.min_batch=1", "build.opt_batch=2", "build.max_batch=4",
                                    "verify.batch_size=4"])
    fp32 = onnx.load(str(run / "model.onnx"))
    size = [d.dim_value for d in fp32.graph.input[0].type.tensor_type.shape.dim[1:]]
    feed = {fp32.graph.input[0].name: np.random.default_rng(0).standard_normal([2, *size]).astype(np.float32)}
    result = localize.localize_tensorrt(fp32, run / "model.bf16.onnx", feed, TensorRule("scaled", 0.5, 0.0, 0.0), 3,
                                        fp32.graph.input[0].name, tensorrt_engine.profile_shapes(cfg.build, size),
                                        build_cfg=cfg.build)
    assert fake_trt.violations == []
    marked = [c[1] for c in fake_trt.calls if c[0] == "mark_output"]
    assert len(marked) > 3  # every layer's output
    assert result.compared_nodes >= len([n for n in fp32.graph.node if n.op_type in ("Conv", "Gemm", "MatMul")])
    assert result.method.startswith("TensorRT engine rebuilt")
    worst = result.worst[0]
    assert 0 < worst.scaled_error < 0.5  # bfloat16's rounding, seen tensor by tensor on the engine
