"""Export: FP32 ONNX (dynamic batch, checked, names from the spec) and AutoCast FP16 ONNX."""

import json

import numpy as np
import onnx
import pytest

from pipeline.core import onnx_io
from pipeline.precision import fp16
from pipeline.runtime.runners import collect, onnxrt_runner


def test_fp32_onnx_is_checked_and_dynamic(tiny_run):
    model = onnx.load(str(tiny_run / "model.onnx"))
    onnx.checker.check_model(model, full_check=True)
    assert model.opset_import[0].version >= 17
    card = json.loads((tiny_run / "model.json").read_text())
    inputs, outputs = onnx_io.io_names(model)
    assert inputs == [card["spec"]["input_name"]] and outputs == [card["spec"]["output_name"]]
    assert onnx_io.input_shape(model, "input")[0] == "batch"
    # The dynamic axis really works: batch 1 and batch 5.
    for batch in (1, 5):
        x = np.random.default_rng(batch).standard_normal((batch, 3, 16, 16)).astype(np.float32)
        out = collect(onnxrt_runner(tiny_run / "model.onnx", name="ort"), [{"input": x}])[0]["logits"]
        assert out.shape == (batch, 10)


def test_fp16_onnx_has_fp16_nodes_and_fp32_io(tiny_run):
    model = onnx.load(str(tiny_run / "model.fp16.onnx"))
    onnx.checker.check_model(model, full_check=True)
    assert model.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert model.graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    precisions = fp16.node_precisions(onnx.load(str(tiny_run / "model.onnx")), model)
    assert sum(1 for _, p in precisions.values() if p == "fp16") >= 3


def test_manifest_records_exporter_and_fp16_report(tiny_run):
    details = json.loads((tiny_run / "manifest.json").read_text())["stages"]["export"]["details"]
    assert details["exporter"].startswith("torch.onnx.export(dynamo=False)")
    assert details["checker"].startswith("onnx.checker.check_model(full_check=True)")
    report = details["fp16"]
    assert 0 < report["fp16_fraction"] <= 1
    assert report["keep_io_types"] is True and report["calibration"] == "real validation images"
    for node in report["fp32_nodes"]:
        assert node["reason"]


def test_calibration_uses_real_validation_images(tiny_run):
    from pipeline import config, export

    calib = np.load(tiny_run / "calibration.npz")["input"]
    cfg = config.resolve(config.load_yaml_file(tiny_run / "config.yaml"))
    card = json.loads((tiny_run / "model.json").read_text())
    images, _ = export.validation_batch(cfg, card, len(calib))
    np.testing.assert_array_equal(calib, images)


@pytest.mark.slow
def test_range_rule_keeps_overflowing_nodes_fp32(tmp_path):
    """With real calibration data AutoCast keeps the x40000 region of the overflow model in FP32."""
    from conftest import FAULTS, TINY, cli

    run = tmp_path / "run"
    assert cli("train", "--model", f"{FAULTS}:overflow", "--run-dir", run, *TINY) == 0
    assert cli("export", "--run-dir", run) == 0
    details = json.loads((run / "manifest.json").read_text())["stages"]["export"]["details"]["fp16"]
    kept = {n["name"]: n["reason"] for n in details["fp32_nodes"]}
    assert "/Mul" in kept and "data_max" in kept["/Mul"]


def test_dynamo_exporter_is_recorded_and_verified(clone_run):
    from conftest import cli

    run = clone_run()
    assert cli("export", "--run-dir", run, "export.exporter=dynamo") == 0
    details = json.loads((run / "manifest.json").read_text())["stages"]["export"]["details"]
    assert details["exporter"].startswith("torch.onnx.export(dynamo=True)")
    assert onnx_io.input_shape(onnx.load(str(run / "model.onnx")), "input")[0] not in (None, 2)  # dynamic batch
    assert cli("build", "--run-dir", run) == 0  # the OpenVINO IR of the new model.onnx (the old one is refused)
    assert cli("verify", "--run-dir", run) == 0
