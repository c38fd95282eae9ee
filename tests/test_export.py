"""Export: FP32 ONNX (dynamic batch, checked, names from the spec) and AutoCast FP16 ONNX."""

import json

import numpy as np
import onnx
import pytest

from pipeline.core import onnx_io
from pipeline.core.errors import InputError
from pipeline.precision import fallback, fp16, plugs
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
    assert report["keep_io_types"] is True and report["calibration"].startswith("real images")
    for node in report["fp32_nodes"]:
        assert node["reason"]


def test_calibration_uses_real_training_images_and_records_them(tiny_run):
    """Issue 48: AutoCast's ranges come from the training split (evenly spaced), never the verdict's validation
    images, and calibration_images.json records which (split, index, content hash)."""
    from pipeline import config
    from pipeline.core import data, roles

    calib = np.load(tiny_run / "calibration.npz")["input"]
    cfg = config.resolve(config.load_yaml_file(tiny_run / "config.yaml"))
    card = json.loads((tiny_run / "model.json").read_text())
    spec = card["spec"]
    splits = data.load(cfg.data, image_size=spec["input_size"][1], mean=spec["mean"], std=spec["std"])
    recorded = json.loads((tiny_run / "calibration_images.json").read_text())["fp16"]
    assert recorded["split"] == "train" and len(recorded["indices"]) == len(calib) == 16
    train, _ = data.collate(data.fetch_items(splits.train, recorded["indices"]))
    np.testing.assert_array_equal(calib, train.numpy())
    assert recorded["sha256_16"] == [roles.image_hash(image.tobytes()) for image in calib]


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


# --------------------------------------------------------------------------- hand-edited fallback files (issue 30, §3)


def _graph(*names: str) -> onnx.ModelProto:
    """An FP32 graph whose nodes have ``names`` (a chain of Relu)."""
    from onnx import TensorProto, helper

    tensors = ["x", *[f"t{i}" for i in range(len(names))]]
    nodes = [helper.make_node("Relu", [tensors[i]], [tensors[i + 1]], name=n) for i, n in enumerate(names)]
    io = [helper.make_tensor_value_info(t, TensorProto.FLOAT, [1, 4]) for t in (tensors[0], tensors[-1])]
    return helper.make_model(helper.make_graph(nodes, "g", [io[0]], [io[1]]))


GRAPH = _graph("/a/Conv", "/b/Add", "/c/Gemm")


def _read(tmp_path, files: dict[str, object], graph=plugs.INT8, fp32_model=GRAPH):
    from pipeline.core.run import RunDir

    for name, content in files.items():
        (tmp_path / name).write_text(content if isinstance(content, str) else json.dumps(content))
    return fallback.read(RunDir(tmp_path), graph, fp32_model)


@pytest.mark.parametrize("name, content, fragments", [
    ("fp16_fallback.json", ["/a/Conv"],  # was silently ignored
     ["fp16_fallback.json: not a valid FP16 fallback list: (top level): input should be a valid dictionary"]),
    ("fp16_fallback.json", {"nodes": "/a/Conv"}, ["nodes: input should be a valid list (got '/a/Conv')"]),  # ignored
    ("fp16_fallback.json", {"nodes": 5}, ["nodes: input should be a valid list (got 5)"]),  # exit 4, TypeError
    ("fp16_fallback.json", {"nodes": None}, ["nodes: input should be a valid list (got None)"]),  # exit 4, TypeError
    ("fp16_fallback.json", {"nodes": [7]}, ["nodes.0: input should be a valid string (got 7)"]),
    ("fp16_fallback.json", {"nodes": [""]}, ["nodes.0: string should have at least 1 character"]),
    ("fp16_fallback.json", {"node": ["/a/Conv"]}, ["nodes: field required", "(and 1 more problem(s))"]),  # a typo
    ("int8_fallback.json", {"nodes": [], "calibration_method": "bogus"},  # was recorded as the calibration used
     [("int8_fallback.json: not a valid INT8 fallback list: calibration_method: input should be 'max' or 'entropy' "
       "(got 'bogus')")]),
    ("int8_fallback.json", {"nodes": [], "fp32_nodes": {"a": 1}}, ["fp32_nodes: input should be a valid list"]),
    ("int8_fallback.json", "{\"nodes\": [NaN]}", ["is not valid JSON (NaN is not a JSON value"]),
    ("int8_fallback.json", {"nodes": ["x" * 1001]}, ["nodes.0: string should have at most 1000 characters"]),
    ("int8_fallback.json", {"nodes": ["/a/Conv"] * 50_001}, ["nodes: list should have at most 50000 items"]),
])
def test_a_malformed_fallback_file_is_one_line_exit_2(tmp_path, name, content, fragments):
    with pytest.raises(InputError) as refused:
        _read(tmp_path, {name: content})
    message = str(refused.value)
    assert refused.value.exit_code == 2 and "\n" not in message
    for fragment in fragments:
        assert fragment in message, message


def test_names_that_are_not_nodes_of_the_graph_are_named_with_their_count(tmp_path):
    """Were accepted silently: export kept nothing in FP32 and said nothing."""
    unknown = [f"/gone/Conv_{i}" for i in range(8)]
    with pytest.raises(InputError) as refused:
        _read(tmp_path, {"fp16_fallback.json": {"nodes": ["/a/Conv", *unknown, unknown[0]]}})
    assert str(refused.value) == (
        f"{tmp_path}/fp16_fallback.json: 8 name(s) in 'nodes' are not nodes of the FP32 graph (model.onnx): "
        "/gone/Conv_0, /gone/Conv_1, /gone/Conv_2, /gone/Conv_3, /gone/Conv_4 and 3 more; remove them, or delete the "
        "file if it is from another model (verify --auto-fallback and tune write it again)")
    (tmp_path / "fp16_fallback.json").unlink()
    with pytest.raises(InputError) as refused:  # a name is shown as plain text: no escape reaches the terminal
        _read(tmp_path, {"int8_fallback.json": {"nodes": [], "fp32_nodes": ["/x/\x1b[31mred"]}})
    assert str(refused.value).startswith(f"{tmp_path}/int8_fallback.json: 1 name(s) in 'fp32_nodes' are not nodes "
                                         "of the FP32 graph (model.onnx): /x/?[31mred;")


def test_a_valid_fallback_file_reads_as_before(tmp_path):
    raised = _read(tmp_path, {
        "fp16_fallback.json": {"nodes": ["/b/Add"], "note": "kept in FP32 by verify --auto-fallback"},
        "int8_fallback.json": {"nodes": ["/c/Gemm", "/c/Gemm"], "fp32_nodes": ["/a/Conv"], "calibration_method":
                               "entropy", "note": "mine"}})
    assert raised.out_of_low == ["/c/Gemm"] and raised.fp32 == ["/a/Conv", "/b/Add"]
    from pipeline.core.run import RunDir

    assert fallback.calibration_method(RunDir(tmp_path), plugs.INT8) == "entropy"
    assert _read(tmp_path, {}, graph=plugs.FP16).fp32 == ["/b/Add"]
    assert fallback.read(RunDir(tmp_path / "none"), plugs.INT8, GRAPH) == fallback.Raised()


def test_the_calibration_methods_a_fallback_file_may_name_are_the_configs():
    from typing import get_args

    from pipeline import config

    allowed = set(get_args(config.INT8Config.model_fields["calibration_method"].annotation))
    assert allowed == set(get_args(get_args(
        fallback.Int8FallbackFile.model_fields["calibration_method"].annotation)[0]))
    assert allowed == set(get_args(get_args(config.TuneConfig.model_fields["calibration_methods"].annotation)[0]))


def test_export_refuses_a_hand_edited_fallback_file_in_one_line(clone_run, capsys):
    from conftest import cli, listed

    run = clone_run()
    listed(run, "fp16_fallback.json")  # a file verify --auto-fallback or tune wrote, then edited by hand
    cases = [({"nodes": ["/not/a/node"]}, ("1 name(s) in 'nodes' are not nodes of the FP32 graph (model.onnx): "
                                           "/not/a/node;")),
             ({"nodes": 5}, "not a valid FP16 fallback list: nodes: input should be a valid list (got 5)")]
    for content, fragment in cases:
        (run / "fp16_fallback.json").write_text(json.dumps(content))
        capsys.readouterr()
        assert cli("-q", "export", "--run-dir", run) == 2
        err = capsys.readouterr().err
        assert err.count("error:") == 1 and f"error: export: {run}/fp16_fallback.json: " in err and fragment in err, err
        assert "Traceback" not in err
    (run / "fp16_fallback.json").write_text(" " * (4 * 1024 * 1024 + 1))  # 13 MB hung export for > 300 s
    capsys.readouterr()
    assert cli("-q", "export", "--run-dir", run) == 2
    assert ("FP16 fallback list is 4,194,305 bytes, more than the 4,194,304 such a file can be"
            in capsys.readouterr().err)


def test_many_raised_names_cost_one_pattern_not_one_per_name(clone_run):
    """The hang's cause: AutoCast and ModelOpt try each nodes_to_exclude pattern on each node with re.match, which
    compiles again past 512 patterns; one pattern per listed name made export nodes x names compilations (a 13 MB
    fp16_fallback.json: > 300 s). Real names, repeated 20,000 times (within the file's bounds): one pattern."""
    from conftest import cli, listed

    run = clone_run()
    listed(run, "fp16_fallback.json")  # a file verify --auto-fallback or tune wrote, then edited by hand
    names = [n.name for n in onnx.load(str(run / "model.onnx")).graph.node if n.op_type in ("Conv", "Gemm")]
    (run / "fp16_fallback.json").write_text(json.dumps({"nodes": names * (20_000 // len(names))}))
    assert cli("-q", "export", "--run-dir", run) == 0
    report = json.loads((run / "manifest.json").read_text())["stages"]["export"]["details"]["fp16"]
    assert len(report["nodes_to_exclude"]) == 1
    assert report["nodes_to_exclude"] == fp16.exact_names_patterns(names, onnx.load(str(run / "model.onnx")))
    kept = {n["name"] for n in report["fp32_nodes"] if n["reason"] == "moved to FP32 by verify --auto-fallback"}
    assert kept == set(names)


def test_the_exclusion_pattern_matches_exactly_the_names_of_the_graph():
    import re

    graph = _graph("/a/Conv", "/a/Conv.1", "a+b", "/c/Gemm")
    (pattern,) = fp16.exact_names_patterns(["/a/Conv", "a+b", "/a/Conv", "/not/in/graph"], graph)
    assert [n for n in ("/a/Conv", "/a/Conv.1", "a+b", "aab", "/c/Gemm", "/a/Conv2") if re.match(pattern, n)] == \
        ["/a/Conv", "a+b"]
    assert fp16.exact_names_patterns(["/not/in/graph"], graph) == [] == fp16.exact_names_patterns([], graph)
