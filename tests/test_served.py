"""`deploy --serve` serves the repository as written and gates what comes back against the FP32 reference.

The written folders are loaded from disk with the stock backends' behaviour (pipeline/runtime/serving/triton_stock.py)
and
sent the validation images at batch 1, at the largest batch and from 8 clients at once; verify's criteria judge each.
Here the serve extra's Triton is replaced by the stock backends' own scheduler (``served.in_process``: the serve
extra pins numpy<2, so CI does not install it; tests/test_serve.py runs the same through Triton where it is). Each
planted defect fails the command with exit 1 and its reason.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import cli
from pipeline.core import deploy_result

pytest.importorskip("tritonclient.grpc", reason="tritonclient[grpc] (the deploy extra, in the test extra) is not "
                    "installed")


@pytest.fixture
def stock_front_end(monkeypatch):
    """--serve without the serve extra's Triton: the stock backends called in this process."""
    from pipeline import deploy
    from pipeline.evaluation import served
    from pipeline.runtime.serving import triton_serve

    monkeypatch.setattr(triton_serve, "available", lambda: "")
    monkeypatch.setattr(deploy, "FRONT_END", served.in_process)


def _serve(run, out) -> int:
    return cli("deploy", "--run-dir", run, "--out", out, "--serve")


def _served(run) -> dict:
    return {m["model"]: m for m in json.loads((run / "deploy.json").read_text())["serve"]["models"]}


def test_every_written_model_passes_verify_criteria_at_batch_1_max_batch_and_concurrency_8(clone_run, tmp_path,
                                                                                          stock_front_end):
    run, out = clone_run(), tmp_path / "repo"
    assert _serve(run, out) == 0
    serve = json.loads((run / "deploy.json").read_text())["serve"]
    assert serve["verdict"] == "passed" and serve["reason"] == ""
    assert deploy_result.read(run / "deploy.json").serve.to_json() == serve  # read back, written in the same shape
    models = _served(run)
    written = {p.name for p in out.iterdir() if p.is_dir()}
    assert set(models) == written and {"onnxrt_fp32", "onnxrt_fp16_cpu"} <= written
    for model in models.values():
        arrangements = {(c["batch"], c["concurrency"]) for c in model["checks"]}
        assert arrangements == {(1, 1), (32, 1), (1, 8)}, model  # build.max_batch in TINY is 32
        assert all(c["status"] == "passed" for c in model["checks"]) and model["verdict"] == "passed"
    if "openvino_bf16" in models:
        assert models["openvino_bf16"]["served_precision"] == "bf16"
    assert cli("report", "--run-dir", run) == 0
    report = (run / "report.md").read_text()
    assert "Served by Triton on this machine: PASSED" in report and "batch 1 x concurrency 8" in report


def test_a_repository_without_dynamic_batch_fails_at_batch_1(clone_run, tmp_path, stock_front_end, monkeypatch,
                                                              capfd):
    """Planted: OpenVINO written with max_batch_size 32 and no ENABLE_BATCH_PADDING (the old repository): the stock
    backend fixes the batch at 32 and refuses every other."""
    from pipeline.core import deployment
    from pipeline.runtime.builders import openvino_ir

    if openvino_ir.bf16_reason():
        pytest.skip(f"no OpenVINO model is deployed on this CPU: {openvino_ir.bf16_reason()}")
    original = deployment.max_batch_size
    monkeypatch.setattr(deployment, "max_batch_size",
                        lambda **k: original(**{**k, "batch_fixed_by_backend": False}))
    run, out = clone_run(), tmp_path / "repo"
    assert _serve(run, out) == 1
    err = capfd.readouterr().err
    assert "openvino_bf16: batch 1: the request failed: expected requests with batch size '32', got '1'" in err
    assert _served(run)["openvino_bf16"]["verdict"] == "failed"
    assert _served(run)["onnxrt_fp32"]["verdict"] == "passed"


def test_an_openvino_fp32_model_run_in_bf16_on_a_bf16_cpu_fails(clone_run, tmp_path, stock_front_end, monkeypatch,
                                                                  capfd):
    """Planted: openvino_fp32 written although the stock backend cannot keep it in FP32. On a CPU with bf16 units
    OpenVINO computes it in bf16; where this CPU has none, that CPU is simulated (the precision it would run in)."""
    from pipeline.core import deployment
    from pipeline.runtime.serving import triton_stock

    original = deployment.stock_refusal
    monkeypatch.setattr(deployment, "stock_refusal",
                        lambda c, t, p, d: "" if c == "openvino_fp32" else original(c, t, p, d))
    monkeypatch.setattr(triton_stock, "SIMULATED_CPU_BF16", True)
    run, out = clone_run(), tmp_path / "repo"
    assert _serve(run, out) == 1
    err = capfd.readouterr().err
    assert "openvino_fp32: the backend runs it in bf16, but verify gated it in fp32" in err
    model = _served(run)["openvino_fp32"]
    assert model["verdict"] == "failed" and model["served_precision"] == "bf16"


def test_an_artifact_swapped_after_deploy_fails(clone_run, tmp_path, stock_front_end, monkeypatch, capfd):
    """Planted: the model file replaced between writing and serving (here by another graph of the run)."""
    from pipeline import deploy

    run, out = clone_run(), tmp_path / "repo"
    original = deploy.serve_and_check

    def swap_then_serve(cfg, run_dir, repository, models):
        shutil.copyfile(run / "model.fp16.onnx", repository / "onnxrt_fp32" / "1" / "model.onnx")
        return original(cfg, run_dir, repository, models)

    monkeypatch.setattr(deploy, "serve_and_check", swap_then_serve)
    assert _serve(run, out) == 1
    err = capfd.readouterr().err
    assert "onnxrt_fp32: onnxrt_fp32/1/model.onnx is not the file deploy wrote (sha256 differs)" in err
    assert _served(run)["onnxrt_fp32"]["verdict"] == "failed"


def test_outputs_off_the_reference_fail_the_gate(tmp_path):
    """The check can fail on the outputs alone: a server answering wrong logits is judged failed against the
    reference (no file or precision reason needed)."""
    from pipeline.config import resolve
    from pipeline.evaluation import candidates, served

    cfg = resolve()
    rng = np.random.default_rng(0)
    reference = rng.normal(size=(40, 10)).astype(np.float32)
    images = np.arange(40, dtype=np.float32).reshape(40, 1)
    labels = reference.argmax(1)
    model = served.Served("m", "fp32", candidates.gate_for(cfg, "onnxrt_fp32", "fp32"), {}, 8)

    def honest(name, batch):
        return reference[batch[:, 0].astype(int)]

    def lying(name, batch):
        return honest(name, batch) + rng.normal(scale=0.5, size=(len(batch), 10)).astype(np.float32)

    ok = served.check_model(model, honest, images, labels, reference, "logits", 0.95)
    bad = served.check_model(model, lying, images, labels, reference, "logits", 0.95)
    assert ok.verdict == "passed" and [c.batch for c in ok.checks] == [1, 8, 1]
    assert bad.verdict == "failed" and "failed verify's fp32 criteria against the FP32 reference" in bad.reason


@settings(max_examples=60, deadline=None)
@given(images=st.integers(1, 40), batch=st.integers(1, 32), concurrency=st.integers(1, 8))
def test_every_image_is_answered_in_order_and_the_largest_batch_is_always_sent(images, batch, concurrency):
    from pipeline.evaluation import served

    data = np.arange(images * 2, dtype=np.float32).reshape(images, 2)
    sizes = []

    def send(name, x):
        sizes.append(len(x))
        return x.sum(axis=1)  # each image's own answer

    out = served.send_all(send, "m", data, served.Arrangement(f"batch {batch}", batch, concurrency))
    np.testing.assert_array_equal(out, data.sum(axis=1))
    assert max(sizes) == batch and all(size <= batch for size in sizes), sizes
