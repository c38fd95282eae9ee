"""Contract tests of the TensorRT path on a CPU, through a recording fake (tests/fake_tensorrt.py).

These tests check the CALLS the pipeline makes to TensorRT's bindings and to CUDA memory (signatures, bool
returns, set_input_shape before execution, buffers alive as long as the context bound to them, thread-local
graph capture), not TensorRT's numerics: the fake engine runs its ONNX file with ONNX Runtime on the CPU.
They drive build -> verify -> benchmark through the real TensorRT branches (tensorrt_fp16).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import fake_tensorrt
from conftest import cli
from pipeline import backends, build, env, runners


@pytest.fixture
def fake_trt(monkeypatch):
    fake = fake_tensorrt.install(monkeypatch)
    # Runners in this process, so the fake (installed here) serves them; the child process is tested elsewhere.
    monkeypatch.setattr(backends.Backend, "runner", lambda self, ctx: self.make(ctx))

    def fake_builder(onnx_path, **kw):  # the builder's output only: build's own branch runs for real
        return lambda: fake_tensorrt.serialize(onnx_path.read_bytes(), kw["shapes"])

    monkeypatch.setattr(build, "engine_loader", fake_builder)
    yield fake
    env.tensorrt_status.cache_clear()


@pytest.fixture
def built_run(fake_trt, clone_run):
    run = clone_run()
    assert cli("build", "--run-dir", run, "--require", "tensorrt", "build.max_batch=16") == 0
    sidecar = json.loads((run / "model.fp16.engine.json").read_text())
    assert sidecar["gpu"] == "Fake GPU (tests/fake_tensorrt.py)" and sidecar["tensorrt"] == "10.13.0.35"
    return run


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
    assert {shape["input"][0] for shape in fake_trt.runs} == {16, 4}  # 20 images, verify.batch_size 16


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
    import onnx
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


def test_fake_calls_a_failed_build_names_tensorrt_errors_and_keeps_the_log(fake_trt, clone_run, monkeypatch,
                                                                            capsys):
    """TensorRT's errors reach the user: the first in the message, every line in logs/build.tensorrt.log."""
    from polygraphy.logger import G_LOGGER

    def failing_builder(onnx_path, **kw):
        def build_it():
            G_LOGGER.verbose("[TRT] detail the console does not need")
            G_LOGGER.error("ModelImporter.cpp:914: While parsing node number 3 [Conv]: unsupported padding")
            G_LOGGER.critical("Invalid Engine. Please ensure the engine was built correctly")

        return build_it

    monkeypatch.setattr(build, "engine_loader", failing_builder)
    run = clone_run()
    severity = G_LOGGER.module_severity.get()
    assert cli("build", "--run-dir", run) == 4
    err = capsys.readouterr().err
    assert "TensorRT engine build failed: ModelImporter.cpp:914: While parsing node number 3 [Conv]" in err
    assert "logs/build.tensorrt.log" in err
    text = (run / "logs" / "build.tensorrt.log").read_text()
    assert "unsupported padding" in text and "detail the console does not need" in text and "Invalid Engine" in text
    assert G_LOGGER.module_severity.get() == severity  # restored
