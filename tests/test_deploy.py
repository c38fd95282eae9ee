"""`deploy --target triton` on the tiny run: a repository whose every config.pbtxt parses as Triton's own ModelConfig
(tritonclient's protobuf, parsed here independently of the tool) and matches the artifact beside it (read again with
ONNX and OpenVINO), a failed artifact refused with its reason, an engine for another Triton release refused before
anything is written, and a folder deploy did not write left alone."""

from __future__ import annotations

import json
import shutil

import pytest

from conftest import cli

pytest.importorskip("tritonclient.grpc", reason="tritonclient[grpc] (the deploy extra, in the test extra) is not "
                    "installed")

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc


def _parse(folder):
    return text_format.Parse((folder / "config.pbtxt").read_text(), mc.ModelConfig())


def _dims_of_artifact(folder) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Every tensor of the model file in ``folder/1`` as its own library reads it: name -> (Triton type, dims)."""
    if (folder / "1" / "model.onnx").exists():
        import onnx

        graph = onnx.load(str(folder / "1" / "model.onnx")).graph
        types = {1: "TYPE_FP32", 10: "TYPE_FP16"}
        return {v.name: (types[v.type.tensor_type.elem_type],
                         tuple(d.dim_value if d.HasField("dim_value") else -1 for d in v.type.tensor_type.shape.dim))
                for v in [*graph.input, *graph.output]}
    import openvino as ov

    model = ov.Core().read_model(str(folder / "1" / "model.xml"))
    return {p.get_any_name(): ({"f32": "TYPE_FP32"}[p.get_element_type().get_type_name()],
                               tuple(d.get_length() if d.is_static else -1 for d in p.get_partial_shape()))
            for p in [*model.inputs, *model.outputs]}


def test_every_config_parses_as_model_config_and_matches_its_artifact(clone_run, tmp_path):
    run, out = clone_run(), tmp_path / "repo"
    assert cli("deploy", "--run-dir", run, "--out", out) == 0
    verify = {c["name"]: c for c in json.loads((run / "verify.json").read_text())["candidates"]}
    benchmark = json.loads((run / "benchmark.json").read_text())["results"]
    folders = sorted(p for p in out.iterdir())
    from pipeline.runtime import openvino_ir

    bf16 = {"openvino_bf16"} if not openvino_ir.bf16_reason() else set()  # a CPU with bf16 units runs (and passes) it
    assert {p.name for p in folders} == {"onnxrt_fp32", "onnxrt_fp16_cpu", "openvino_fp32"} | bf16
    for folder in folders:
        config = _parse(folder)
        assert config.name == folder.name and config.max_batch_size == 32  # build.max_batch, which verify checked
        artifact = _dims_of_artifact(folder)
        for tensor in [*config.input, *config.output]:
            dtype, dims = artifact[tensor.name]
            assert mc.DataType.Name(tensor.data_type) == dtype and (-1, *tensor.dims) == dims
        assert config.instance_group[0].kind == mc.ModelInstanceGroup.Kind.KIND_CPU
        sidecar = json.loads((folder / "pipeline.json").read_text())
        assert sidecar["verdict"] == "passed" == verify[folder.name]["status"]
        assert sidecar["verdict_sha256"] == verify[folder.name]["artifact_sha256"]
    onnx_fp32 = _parse(out / "onnxrt_fp32")
    assert config.backend == "openvino" and onnx_fp32.backend == "onnxruntime"
    measured = {r["batch_size"] for r in benchmark if r["backend"] == "onnxrt_fp32"}
    assert set(onnx_fp32.dynamic_batching.preferred_batch_size) <= measured  # from benchmark's curve
    assert list(_parse(out / "openvino_fp32").dynamic_batching.preferred_batch_size) == []  # not benchmarked in TINY
    deployed = json.loads((run / "deploy.json").read_text())
    assert {m["name"] for m in deployed["models"]} == {p.name for p in folders}
    assert "deploy.json" in json.loads((run / "manifest.json").read_text())["stages"]["deploy"]["artifacts"]
    assert cli("report", "--run-dir", run) == 0
    assert "Deployment: Triton model repository" in (run / "report.md").read_text()

    assert cli("deploy", "--run-dir", run, "--out", out) == 0  # a repository deploy wrote is replaced whole
    assert not list(tmp_path.glob(".repo.*"))  # no staging or old folder left beside it


def test_a_failed_artifact_is_refused_with_the_reason(clone_run, tmp_path, capfd):
    run, out = clone_run(), tmp_path / "repo"
    assert cli("verify", "--run-dir", run, "verify.fp16.max_scaled_error=1e-9") == 1  # the FP16 candidates fail
    assert cli("deploy", "--run-dir", run, "--out", out) == 0
    assert not (out / "onnxrt_fp16_cpu").exists() and (out / "onnxrt_fp32" / "config.pbtxt").is_file()
    refused = {r["candidate"]: r for r in json.loads((run / "deploy.json").read_text())["refused"]}
    assert refused["onnxrt_fp16_cpu"]["verdict"] == "failed"
    assert "failed the precision gate" in refused["onnxrt_fp16_cpu"]["reason"]
    assert "refused onnxrt_fp16_cpu: failed the precision gate" in capfd.readouterr().err


def test_an_edited_artifact_is_not_verified_and_not_deployed(clone_run, tmp_path):
    run, out = clone_run(), tmp_path / "repo"
    (run / "openvino" / "fp32.bin").write_bytes(b"\0" * 16)  # no longer what verify judged
    assert cli("deploy", "--run-dir", run, "--out", out) == 0
    refused = {r["candidate"]: r for r in json.loads((run / "deploy.json").read_text())["refused"]}
    assert refused["openvino_fp32"]["verdict"] == "not verified" and not (out / "openvino_fp32").exists()


def test_an_engine_for_another_triton_release_is_refused_before_anything_is_written(clone_run, tmp_path, monkeypatch,
                                                                                    capfd):
    from pipeline import deploy
    from pipeline.runtime import backends

    run, out = clone_run(), tmp_path / "repo"
    engine = deploy.Planned(backends.by_name("tensorrt_fp16"), deploy.PLAN, "", "passed", "0" * 64)
    monkeypatch.setattr(deploy, "plan", lambda run_dir: [engine])
    monkeypatch.setattr(deploy, "_engine_tensorrt", lambda run_dir, p: "10.4.0.26")
    assert cli("deploy", "--run-dir", run, "--out", out, "deploy.triton_release=25.01") == 2
    err = capfd.readouterr().err
    assert "TensorRT 10.4.0.26, but Triton 25.01 ships TensorRT 10.8.0.43" in err and "24.10" in err
    assert not out.exists() and not list(tmp_path.glob(".repo.*"))


def test_a_folder_deploy_did_not_write_is_left_alone(clone_run, tmp_path, capfd):
    run, out = clone_run(), tmp_path / "repo"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert cli("deploy", "--run-dir", run, "--out", out) == 2
    assert "has files deploy did not write" in capfd.readouterr().err
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
    assert cli("deploy", "--run-dir", run) == 2  # no --out, no deploy.out
    assert "--out DIR" in capfd.readouterr().err
    assert cli("deploy", "--run-dir", run, "--out", run / "inside") == 2


def test_serve_without_the_extra_says_how_to_get_it(clone_run, tmp_path, capfd, monkeypatch):
    from pipeline.runtime import triton_serve

    monkeypatch.setattr(triton_serve, "available", lambda: "No module named 'pytriton'; " + triton_serve.INSTALL)
    run = clone_run()
    assert cli("deploy", "--run-dir", run, "--out", tmp_path / "repo", "--serve") == 3
    assert "pip install -e '.[serve]'" in capfd.readouterr().err
    shutil.rmtree(tmp_path / "repo", ignore_errors=True)


def test_an_engines_signature_and_max_batch_size_come_from_the_engine(tiny_run, monkeypatch):
    """Read through TensorRT's own calls (tests/fake_tensorrt.py checks them): I/O names, types, dims and the
    optimisation profile, whose maximum is the model's max_batch_size whatever build.max_batch says now."""
    import fake_tensorrt
    from pipeline.core import deployment
    from pipeline.runtime import triton

    fake_tensorrt.install(monkeypatch)
    blob = fake_tensorrt.serialize((tiny_run / "model.onnx").read_bytes(),
                                   {"min": [1, 3, 16, 16], "opt": [8, 3, 16, 16], "max": [16, 3, 16, 16]})
    signature = triton.engine_signature(blob)
    assert signature.inputs == (triton.Tensor("input", "TYPE_FP32", (-1, 3, 16, 16)),)
    assert signature.outputs == (triton.Tensor("logits", "TYPE_FP32", (-1, 10)),)
    assert signature.profile_max == 16
    assert deployment.max_batch_size(batch_dim=signature.batch_dim, profile_max=signature.profile_max,
                                     served_max=32) == 16
