"""GPU timing semantics on a virtual CUDA device (tests/virtual_cuda.py, behind tests/fake_tensorrt.py).

These tests check SEMANTICS, not TensorRT's kernels or a GPU's speed: streams and their ordering, where a
launch goes, what a pair of CUDA events brackets, when the host may read a result, what a graph capture needs.
The virtual device gives every kernel, copy and synchronize a fixed virtual time, so each timing the benchmark
reports on a GPU is compared, exactly, with what it must be:

* "GPU compute" = the engine's kernels: ``LAYER_NS`` x the layers of its ONNX graph, not the host's launch of
  them (the device starts a launch's work only once the host has launched it, and TensorRT's enqueue costs the
  host its set-up and Polygraphy's output-allocator callback first);
* "host latency" = H2D copy + kernels + D2H copy + the synchronize, with both copies from page-locked memory,
  plus the host work the stream cannot hide (the first launch; on Polygraphy's path also TensorRT's enqueue).

Polygraphy 0.53.6's real ``TrtRunner`` runs on it, with ``torch.cuda.is_available()`` True, so its torch-tensor
path (torch output buffers from its output allocator) is the one exercised.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import fake_tensorrt
import virtual_cuda as vc
from pipeline.runtime import runners
from test_tensorrt_contract import bench, built_run, fake_trt, profile_of  # noqa: F401  (fixtures)


def expected_ms(run, batch: int) -> dict:
    """What the virtual device says each timing of model.fp16.engine at ``batch`` must be."""
    model = onnx.load(str(run / "model.fp16.onnx"), load_external_data=False)

    def nbytes(value) -> int:
        dims = [batch] + [d.dim_value for d in value.type.tensor_type.shape.dim[1:]]
        itemsize = {onnx.TensorProto.FLOAT: 4, onnx.TensorProto.FLOAT16: 2}[value.type.tensor_type.elem_type]
        return int(np.prod(dims)) * itemsize

    kernel = vc.LAYER_NS * len(model.graph.node)
    h2d, d2h = (vc.copy_ns(nbytes(v), pinned=True) for v in (model.graph.input[0], model.graph.output[0]))
    return {"GPU compute": kernel / 1e6, "host latency": (h2d + kernel + d2h + vc.SYNC_NS) / 1e6,
            "H2D": h2d / 1e6}


# Host work a "host latency" of TrtRunner.infer cannot hide, beyond the copies and kernels: at least TensorRT's
# enqueue before its first kernel (set-up, Polygraphy's allocator callback, the launch), at most that plus the
# input copy it may overlap, the first launch and Polygraphy's binding calls.
ENQUEUE_MS = (vc.ENQUEUE_NS + vc.CALLBACK_NS + vc.LAUNCH_NS) / 1e6
CALLS_MS = (2 * vc.LAUNCH_NS + 20 * vc.HOST_CALL_NS) / 1e6


@pytest.mark.parametrize("graphs", [False, True], ids=["trtrunner", "cuda_graphs"])
def test_virtual_gpu_every_reported_timing_is_what_the_device_says(built_run, fake_trt, graphs):  # noqa: F811
    """GPU compute = the kernels' virtual time, never the host's launch of them; host latency = copies + kernels +
    synchronize + the launch work the stream cannot hide; every sample, every batch, both modes. Events on an idle
    stream (the launch inside the pair), a graph replayed off the events' stream, events around Polygraphy's whole
    call, a missing synchronize, an enqueue on the legacy default stream or a capture without warm-up all change
    them."""
    payload = bench(built_run, f"benchmark.cuda_graphs={str(graphs).lower()}")
    assert fake_trt.violations == []
    rows = {(r["batch_size"], r["timing"].split(" (")[0]): r for r in payload["results"]}
    assert set(rows) == {(b, t) for b in (1, 4) for t in ("GPU compute", "host latency")}, payload["skipped"]
    for (batch, timing), row in rows.items():
        want = expected_ms(built_run, batch)
        stats = row["latency_ms"]
        assert stats["min"] == pytest.approx(stats["max"], rel=1e-9), (batch, timing, stats)  # virtual: exact
        if timing == "GPU compute":
            assert stats["min"] == pytest.approx(want[timing], rel=1e-9), (batch, timing, stats, want)
        elif graphs:  # the first copy's launch is exposed; the replay's and the D2H's hide behind running work
            assert stats["min"] == pytest.approx(want[timing] + vc.LAUNCH_NS / 1e6, rel=1e-9), (batch, stats, want)
        else:
            low = want[timing] - want["H2D"] + ENQUEUE_MS
            assert low <= stats["min"] <= low + want["H2D"] + CALLS_MS, (batch, stats, want)
    device = vc.DEVICE[0]
    kernels = device.ops("kernel") + device.ops("graph")
    assert kernels and all(op.stream != vc.LEGACY for op in kernels)  # never the legacy default stream
    copies = device.ops("H2D") + device.ops("D2H")
    assert copies and all(op.pinned for op in copies)  # "pinned host memory", both ways, as the labels say
    assert all("pinned host memory" in r["timing"] for r in payload["results"] if r["timing"].startswith("host"))


def tiny_engine(input_type=onnx.TensorProto.FLOAT):
    from onnx import helper

    x = helper.make_tensor_value_info("x", input_type, ["n", 3])
    model = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"]),
                                                 helper.make_node("Neg", ["y"], ["z"]),
                                                 helper.make_node("Neg", ["z"], ["y2"]),
                                                 helper.make_node("Identity", ["y2"], ["y_out"])], "g", [x],
                                                [helper.make_tensor_value_info("y_out", input_type, ["n", 3])]),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    from polygraphy.backend.trt import util as trt_util

    return fake_tensorrt.Runtime(trt_util.get_trt_logger()).deserialize_cuda_engine(
        fake_tensorrt.serialize(model.SerializeToString(), {"min": [1, 3], "opt": [2, 3], "max": [4, 3]}))


HOST = np.array([[-1.0, 2.0, -3.0], [4.0, -5.0, 6.0]], np.float32)


def test_virtual_gpu_graphed_engine_times_its_replay_and_reads_the_output_after_the_synchronize(fake_trt):  # noqa: F811
    graphed = runners.GraphedEngine(tiny_engine(), input_name="x", output_name="y_out", host=HOST)
    assert graphed.gpu_compute() == pytest.approx(4 * vc.LAYER_NS / 1e6)  # four layers, not the replay's launch
    graphed.host_output.fill_(0)
    assert graphed.host_latency() == pytest.approx((vc.LAUNCH_NS + 2 * vc.copy_ns(HOST.nbytes, True)
                                                    + 4 * vc.LAYER_NS + vc.SYNC_NS) / 1e6)
    np.testing.assert_array_equal(graphed.host_output.numpy(), np.maximum(HOST, 0))  # not the poison
    assert fake_trt.violations == []


def test_virtual_gpu_rejects_an_input_of_another_dtype_on_every_tensorrt_path(fake_trt):  # noqa: F811
    engine = tiny_engine(onnx.TensorProto.FLOAT16)
    with pytest.raises(runners.TensorrtCallFailed, match="'x' is float32 but the engine expects float16"):
        runners.GraphedEngine(engine, input_name="x", output_name="y_out", host=HOST)
    runner = runners.TensorrtRunner(b"", profile_of((1, 4, 4)), name="t", input_name="x",
                                    output_name="y_out")
    runner._engine_or_context = engine
    with runner:
        with pytest.raises(runners.TensorrtCallFailed, match="expects float16"):
            runner.timers({"x": HOST})
        with pytest.raises(Exception, match="unexpected dtype"):  # verify's path: Polygraphy's own input check
            runner.infer({"x": HOST})
        out = runner.infer({"x": HOST.astype(np.float16)})  # the right dtype runs
    import torch

    assert isinstance(out["y_out"], torch.Tensor)  # Polygraphy's torch-tensor path (torch.cuda.is_available())
    np.testing.assert_array_equal(np.asarray(out["y_out"].numpy(), np.float32), np.maximum(HOST, 0))


def test_virtual_gpu_tensorrt_runtime_warnings_reach_the_runner_s_log(fake_trt, capsys):  # noqa: F811
    """TensorRT's runtime WARNINGs go through Polygraphy's logger to stdout, the child process's log file."""
    fake_trt.fail["warning"] = "Using default stream in enqueueV3() may lead to performance issues"
    runner = runners.TensorrtRunner(b"", profile_of((1, 4, 4)), name="t", input_name="x",
                                    output_name="y_out")
    runner._engine_or_context = tiny_engine()
    with runner:
        runner.infer({"x": HOST})
    assert "Using default stream in enqueueV3()" in capsys.readouterr().out


# --------------------------------------------------------------------------- the device's own semantics


@pytest.fixture
def device(fake_trt):  # noqa: F811
    return vc.DEVICE[0]


def kernel(device, stream, ns):
    return device.launch("kernel", stream, ns, read=lambda: None, write=lambda _: None)


def test_virtual_gpu_legacy_default_stream_orders_with_blocking_streams_only(device):
    import torch

    pool = torch.cuda.Stream()  # non-blocking, as PyTorch's pool streams are
    blocking = device.new_stream(blocking=True)
    a = kernel(device, pool, 100_000)
    b = kernel(device, device.legacy, 100_000)
    assert b.start < a.end  # the legacy stream does not wait for the non-blocking one
    c = kernel(device, blocking, 10_000)
    assert c.start >= b.end  # a blocking stream waits for the legacy stream
    d = kernel(device, device.legacy, 10_000)
    assert d.start >= c.end  # and the legacy stream for it


def test_virtual_gpu_replay_launches_on_the_current_stream_and_events_time_their_own(device):
    import torch

    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream, capture_error_mode="thread_local"):
        kernel(device, torch.cuda.current_stream(), 50_000)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record(stream)
    graph.replay()  # outside `with torch.cuda.stream(stream)`: on the legacy default stream
    end.record(stream)
    end.synchronize()
    assert start.elapsed_time(end) == pytest.approx(vc.LAUNCH_NS / 1e6)  # the host's launch, no GPU work
    assert not device.ops("graph")  # the replay is still running on the legacy default stream
    torch.cuda.synchronize()
    assert device.ops("graph")[-1].stream == vc.LEGACY
    with torch.cuda.stream(stream):
        start.record(stream)
        graph.replay()
        end.record(stream)
    end.synchronize()
    assert start.elapsed_time(end) == pytest.approx((vc.LAUNCH_NS + 50_000) / 1e6)  # the idle stream: + the launch
    timer = runners.QueuedAheadTimer(graph.replay, stream)
    assert timer() == pytest.approx(50_000 / 1e6)  # one replay queued ahead: the replay alone
    assert device.ops("graph")[-1].stream == stream.handle


def test_virtual_gpu_a_launch_starts_when_the_host_has_launched_it(device):
    """The semantics the "GPU compute" defect hid behind: work starts only once the host has launched it, so an
    event recorded on an idle stream fires before it; work queued ahead keeps the stream busy past the launch."""
    import torch

    stream = torch.cuda.Stream()
    start = torch.cuda.Event(enable_timing=True)
    start.record(stream)
    device.host += 30_000  # host work between the record and the launch (Python, TensorRT's enqueue set-up)
    op = kernel(device, stream, 10_000)
    assert op.start == start.time + 30_000 + vc.LAUNCH_NS
    busy = kernel(device, stream, 100_000)
    start.record(stream)
    device.host += 30_000
    after = kernel(device, stream, 10_000)
    assert start.time == busy.end and after.start == busy.end  # the launch hid behind the running kernel


def test_virtual_gpu_host_reads_poison_before_the_synchronize(device):
    import torch

    memory = runners.DEVICE_MEMORY
    src = memory.tensor(np.arange(6, dtype=np.float32))
    dst = memory.pinned_empty((6,), torch.float32)
    stream = torch.cuda.Stream()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(stream):
        start.record()
        dst.copy_(src, non_blocking=True)
        end.record()
    assert vc.poisoned(dst.numpy())
    with pytest.raises(RuntimeError, match="not ready"):
        start.elapsed_time(end)  # the copy has not completed
    stream.synchronize()
    assert start.elapsed_time(end) == pytest.approx((vc.LAUNCH_NS + vc.copy_ns(24, pinned=True)) / 1e6)
    np.testing.assert_array_equal(dst.numpy(), np.arange(6, dtype=np.float32))


def test_virtual_gpu_capture_needs_a_side_stream_and_a_warm_up_and_fixes_shapes(fake_trt, device):  # noqa: F811
    import torch

    with pytest.raises(RuntimeError, match="legacy default stream"):
        with torch.cuda.graph(torch.cuda.CUDAGraph(), stream=device.legacy, capture_error_mode="thread_local"):
            pass
    engine = tiny_engine()
    context = engine.create_execution_context()
    x, y = runners.DEVICE_MEMORY.tensor(HOST), runners.DEVICE_MEMORY.empty((4, 3), torch.float32)
    assert context.set_input_shape("x", (2, 3))
    assert context.set_tensor_address("x", x.data_ptr()) and context.set_tensor_address("y_out", y.data_ptr())
    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream, capture_error_mode="thread_local"):
        assert context.execute_async_v3(stream.cuda_stream) is False  # no warm-up enqueue yet
    assert "before any warm-up enqueue" in fake_trt.violations[-1]
    assert context.execute_async_v3(stream.cuda_stream)
    with torch.cuda.graph(graph, stream=stream, capture_error_mode="thread_local"):
        assert context.execute_async_v3(stream.cuda_stream)
    assert context.set_input_shape("x", (1, 3))  # after the capture: the replay keeps the captured shape
    runs = len(fake_trt.runs)
    with torch.cuda.stream(stream):
        graph.replay()
    stream.synchronize()
    assert len(fake_trt.runs) == runs  # a replay enqueues nothing new through the context
    np.testing.assert_array_equal(y.numpy()[:2], np.maximum(HOST, 0))
