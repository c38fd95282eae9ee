"""The stock Triton backends as pipeline/runtime/serving/triton_stock.py reproduces them, each behaviour held to the
line of the source it follows:

- OV: triton-inference-server/openvino_backend src/openvino.cc, branch r25.08 (commit 64651dcd5a7e); lines 1-1250 are
  the same in r24.10 (ddda22f31f35), the release of nvidia-pytriton's Triton 2.51.
- ORT: triton-inference-server/onnxruntime_backend src/onnxruntime.cc, branch r25.08 (commit 78357801c133).

The pure functions are checked on their own; the loaded models on the tiny run's IR and ONNX graph, written into a
model folder the way deploy writes one (and the ways it must not).
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest

pytest.importorskip("tritonclient.grpc", reason="tritonclient[grpc] (the deploy extra, in the test extra) is not "
                    "installed")

from pipeline.runtime.serving import triton_stock as stock  # noqa: E402
from pipeline.runtime.serving.triton_stock import StockError  # noqa: E402

# --------------------------------------------------------------------------- parameters (OV 235-405)


@pytest.mark.parametrize("value, want", [("yes", True), ("YES", True), ("Yes", True), ("true", False), ("1", False),
                                         ("", False), ("no", False)])
def test_openvino_bool_parameters_are_yes_in_any_case_and_nothing_else(value, want):
    """OV 297-313 ParseBoolParameter: lower-cased, compared with "yes"."""
    assert stock.openvino_bool(value) is want


def test_openvino_reads_three_booleans_for_the_model():
    """OV 235-250: SKIP_OV_DYNAMIC_BATCHSIZE, ENABLE_BATCH_PADDING, RESHAPE_IO_LAYERS."""
    settings = stock.openvino_settings({"ENABLE_BATCH_PADDING": "YES", "RESHAPE_IO_LAYERS": "true"})
    assert settings.enable_batch_padding and not settings.reshape_io_layers and not settings.skip_dynamic_batchsize


def test_hint_bf16_is_the_only_precision_parameter_and_takes_only_yes():
    """OV 358-367: HINT_BF16=YES -> inference_precision(bf16); any other value is an error; nothing asks for f32."""
    assert stock.openvino_properties({"HINT_BF16": "YES"}) == (("INFERENCE_PRECISION_HINT", "bf16"),)
    with pytest.raises(StockError, match="expected the parameter 'HINT_BF16' to be YES, got no"):
        stock.openvino_properties({"HINT_BF16": "NO"})
    assert stock.openvino_properties({"INFERENCE_PRECISION_HINT": "f32"}) == ()  # not a key the backend reads


def test_openvino_cpu_properties_in_the_backends_order_and_its_errors():
    """OV 253-272 (the keys, in order) and 333-405 (each value)."""
    got = stock.openvino_properties({"PERFORMANCE_HINT": "Latency", "NUM_STREAMS": "auto", "INFERENCE_NUM_THREADS": "4",
                                     "COMPILATION_NUM_THREADS": ""})
    assert got == (("INFERENCE_NUM_THREADS", 4), ("NUM_STREAMS", "AUTO"), ("PERFORMANCE_HINT", "LATENCY"))
    with pytest.raises(StockError, match="non-negative number, got -1"):  # OV 48-54 IsNumber: digits only
        stock.openvino_properties({"INFERENCE_NUM_THREADS": "-1"})
    with pytest.raises(StockError, match="AUTO/NUMA/<int_value>"):
        stock.openvino_properties({"NUM_STREAMS": "many"})
    with pytest.raises(StockError, match="LATENCY/THROUGHPUT/CUMULATIVE_THROUGHPUT"):
        stock.openvino_properties({"PERFORMANCE_HINT": "fast"})


# --------------------------------------------------------------------------- batching (OV 596-600, 701-760, 955-1098)


def test_max_batch_size_is_autofilled_only_for_a_batch_layout_and_zero():
    """OV 701-760 AutoCompleteBatching: max(default_max_batch_size, 1) when every layout has N and the config says 0."""
    assert stock.openvino_autocomplete_max_batch(0, True, 4) == 4
    assert stock.openvino_autocomplete_max_batch(0, True, 0) == 1
    assert stock.openvino_autocomplete_max_batch(0, False, 4) == 0  # deploy's IRs: no layout, so 0 stays 0
    assert stock.openvino_autocomplete_max_batch(8, True, 4) == 8


def test_auto_batching_is_allowed_with_a_batch_unless_skipped():
    """OV 955-961."""
    assert stock.openvino_allow_auto_batching(8, False) and not stock.openvino_allow_auto_batching(8, True)
    assert not stock.openvino_allow_auto_batching(0, False)


def test_a_batch_other_than_max_batch_size_is_refused_without_padding():
    """OV 1032-1066: with max_batch_size > 0 the requests of an execution must add up to exactly max_batch_size."""
    batching = stock.OpenVinoBatching(32, enable_padding=False)
    assert batching.total([16, 16]) == 32
    with pytest.raises(StockError, match="expected requests with batch size '32', got '1'.*ENABLE_BATCH_PADDING"):
        batching.total([1])


def test_padding_is_kept_after_a_short_batch_so_a_full_one_then_fails():
    """OV 1049-1052 sets batch_pad_size_ only when a batch is short and never resets it; OV 1345-1363 then expects
    max_batch_size - pad rows, so a full batch after a short one comes back cut (why deploy does not rely on
    ENABLE_BATCH_PADDING and writes OpenVINO models with a dynamic batch instead)."""
    batching = stock.OpenVinoBatching(8, enable_padding=True)
    assert batching.total([3]) == 3 and batching.pad == 5 and batching.output_rows(8) == 3
    assert batching.total([8]) == 8 and batching.pad == 5  # not reset
    assert batching.output_rows(8) == 3  # 5 of the 8 requested rows are not handed back


def test_without_batching_every_request_is_an_execution_of_its_own():
    """OV 1067-1098: max_batch_size 0 counts one per request and allows one."""
    batching = stock.OpenVinoBatching(0, enable_padding=False)
    assert batching.total([17]) == 1 and batching.output_rows(17) == 17
    with pytest.raises(StockError, match="max allowed is 0"):
        batching.total([1, 1])


@pytest.mark.parametrize("compiled, hint, cpu, want", [("f32", False, None, "f32"), ("bf16", False, None, "bf16"),
                                                       ("f32", False, True, "bf16"), ("f32", True, True, "bf16"),
                                                       ("bf16", True, False, "f32")])
def test_the_precision_is_what_the_compiled_model_reports_or_the_simulated_cpus(compiled, hint, cpu, want):
    assert stock.openvino_precision(compiled, hint, cpu) == want


# --------------------------------------------------------------------------- ONNX Runtime (ORT 217-302)


@pytest.mark.parametrize("level, want", [(None, "ORT_ENABLE_ALL"), (0, "ORT_ENABLE_ALL"), (-1, "ORT_ENABLE_BASIC"),
                                         (1, "ORT_ENABLE_EXTENDED"), (2, "ORT_DISABLE_ALL"), (7, "ORT_ENABLE_ALL")])
def test_onnxruntime_graph_level(level, want):
    """ORT 217-237: optimization.graph.level -1/1/2, anything else all optimizations."""
    from pipeline.runtime.serving import triton

    config = triton.model_config_pb2().ModelConfig(name="m")
    if level is not None:
        config.optimization.graph.level = level
    assert stock.onnxruntime_optimization_level(config) == want


def test_onnxruntime_session_parameters():
    """ORT 239-302: execution_mode 0/1 only; thread counts as integers, 0 when absent."""
    assert stock.onnxruntime_session_settings({}) == {"execution_mode": 0, "intra_op_thread_count": 0,
                                                      "inter_op_thread_count": 0}
    assert stock.onnxruntime_session_settings({"intra_op_thread_count": "2"})["intra_op_thread_count"] == 2
    with pytest.raises(StockError, match="execution_mode are 0 or 1"):
        stock.onnxruntime_session_settings({"execution_mode": "2"})
    with pytest.raises(StockError, match="integral number"):
        stock.onnxruntime_session_settings({"inter_op_thread_count": "two"})


# --------------------------------------------------------------------------- Triton's core


@pytest.mark.parametrize("shape, dims, max_batch, ok", [
    ((1, 3, 16, 16), [3, 16, 16], 32, True), ((32, 3, 16, 16), [3, 16, 16], 32, True),
    ((33, 3, 16, 16), [3, 16, 16], 32, False), ((1, 3, 8, 8), [3, 16, 16], 32, False),
    ((5, 3, 16, 16), [-1, 3, 16, 16], 0, True), ((3, 16, 16), [-1, 3, 16, 16], 0, False)])
def test_a_request_is_checked_against_dims_and_max_batch_size(shape, dims, max_batch, ok):
    assert (stock.request_problem(shape, dims, max_batch) == "") is ok


# --------------------------------------------------------------------------- loaded from a model folder


def _folder(tmp_path, run, *, backend: str, max_batch: int, parameters=(), count: int = 1, dynamic: bool = True):
    """A model folder as deploy writes one (config.pbtxt built by pipeline.runtime.serving.triton), with the tiny run's
    artifact."""
    from pipeline.runtime.serving import triton

    name = f"m_{backend}_{max_batch}_{len(parameters)}_{count}"
    folder = tmp_path / name
    (folder / "1").mkdir(parents=True)
    if backend == "openvino":
        shutil.copyfile(run / "openvino" / "fp32.xml", folder / "1" / "model.xml")
        shutil.copyfile(run / "openvino" / "fp32.bin", folder / "1" / "model.bin")
    else:
        shutil.copyfile(run / "model.onnx", folder / "1" / "model.onnx")
    signature = triton.Signature((triton.Tensor("input", "TYPE_FP32", (-1, 3, 16, 16)),),
                                 (triton.Tensor("logits", "TYPE_FP32", (-1, 10)),))
    model = triton.Model(name=name, platform="", backend=backend,
                         filename="model.xml" if backend == "openvino" else "model.onnx", signature=signature,
                         max_batch_size=max_batch, preferred_batch_sizes=(), max_queue_delay_us=100, gpu=False,
                         instances=count, parameters=tuple(parameters))
    (folder / "config.pbtxt").write_text(triton.to_text(triton.build_config(model)))
    return folder


def _images(n: int) -> np.ndarray:
    return np.random.default_rng(0).normal(size=(n, 3, 16, 16)).astype(np.float32)


def test_an_openvino_model_with_max_batch_size_rejects_batch_1(tiny_run, tmp_path):
    """OV 596-600 then 1032-1066: the batch is fixed at max_batch_size; the repository deploy used to write."""
    model = stock.Model(_folder(tmp_path, tiny_run, backend="openvino", max_batch=32))
    assert model.execute([_images(32)])[0].shape == (32, 10)
    with pytest.raises(StockError, match="expected requests with batch size '32', got '1'"):
        model.execute([_images(1)])


def test_an_openvino_model_with_a_dynamic_batch_serves_every_batch_as_openvino_computes_it(tiny_run, tmp_path):
    """max_batch_size 0, dims [-1, 3, H, W] (what deploy writes): every batch 1..32, and the outputs are OpenVINO's
    own for the same properties (the backend adds nothing of its own to the numbers)."""
    import openvino as ov

    model = stock.Model(_folder(tmp_path, tiny_run, backend="openvino", max_batch=0,
                                parameters=(("HINT_BF16", "YES"),)), cpu_bf16=None)
    compiled = ov.Core().compile_model(str(tiny_run / "openvino" / "fp32.xml"), "CPU",
                                       {"INFERENCE_PRECISION_HINT": "bf16"})
    images = _images(32)
    for batch in (1, 7, 32):
        served = model.execute([images[:batch]])[0]
        assert np.array_equal(served, compiled({"input": images[:batch]})[0])


def test_padding_serves_a_short_batch_and_then_cuts_a_full_one(tiny_run, tmp_path):
    """ENABLE_BATCH_PADDING=YES end to end: batch 1 works, a full batch after it fails the output check (OV 1352)."""
    model = stock.Model(_folder(tmp_path, tiny_run, backend="openvino", max_batch=8,
                                parameters=(("ENABLE_BATCH_PADDING", "YES"),)))
    assert model.execute([_images(1)])[0].shape == (1, 10)
    with pytest.raises(StockError, match="output batch 1 for requests totalling 8"):
        model.execute([_images(8)])


def test_instances_are_the_configs_count_each_with_its_own_request(tiny_run, tmp_path):
    model = stock.Model(_folder(tmp_path, tiny_run, backend="openvino", max_batch=0, count=3))
    assert len(model.instances) == 3 and len({id(i.run) for i in model.instances}) == 3
    onnx = stock.Model(_folder(tmp_path, tiny_run, backend="onnxruntime", max_batch=32, count=2))
    assert len(onnx.instances) == 2


def test_an_fp32_ir_without_a_hint_runs_in_bf16_on_a_cpu_with_bf16_units(tiny_run, tmp_path):
    """What the stock backend does with openvino_fp32 (why deploy refuses it): compiled with no precision property,
    OpenVINO's CPU plugin reports bf16 on a CPU with bf16 units."""
    from pipeline.runtime.builders import openvino_ir

    if openvino_ir.bf16_reason():
        pytest.skip(f"this CPU has no bf16 units: {openvino_ir.bf16_reason()}")
    model = stock.Model(_folder(tmp_path, tiny_run, backend="openvino", max_batch=0))
    assert model.precision == "bf16"


def test_a_repository_batches_concurrent_requests_up_to_max_batch_size(tiny_run, tmp_path):
    """The dynamic batcher: 8 clients' single images gathered into executions of at most max_batch_size, each client
    given its own image's output."""
    import threading

    folder = _folder(tmp_path, tiny_run, backend="onnxruntime", max_batch=4)
    images = _images(16)
    with stock.Repository(tmp_path, [folder.name]) as repository:
        model = repository.models[folder.name]
        sizes, original = [], model.execute

        def recording(requests):
            sizes.append(sum(len(r) for r in requests))
            return original(requests)

        model.execute = recording
        outputs = [None] * 16

        def client(i):
            outputs[i] = repository.infer(folder.name, images[i: i + 1])

        threads = [threading.Thread(target=client, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        whole = original([images[:4]])[0]
    assert max(sizes) <= 4 and sum(sizes) == 16
    assert np.allclose(np.concatenate(outputs)[:4], whole, atol=1e-5)
