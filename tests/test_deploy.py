"""`deploy --target triton` on the tiny run: a repository whose every config.pbtxt parses as Triton's own ModelConfig
(tritonclient's protobuf, parsed here independently of the tool) and matches the artifact beside it (read again with
ONNX and OpenVINO), a failed artifact refused with its reason, an engine for another Triton release refused before
anything is written, and a folder deploy did not write left alone."""

from __future__ import annotations

import json

import pytest

from conftest import cli
from pipeline.core import deploy_result

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
    folders = sorted(p for p in out.iterdir() if p.is_dir())
    from pipeline.runtime.builders import openvino_ir

    bf16 = {"openvino_bf16"} if not openvino_ir.bf16_reason() else set()  # a CPU with bf16 units runs (and passes) it
    assert {p.name for p in folders} == {"onnxrt_fp32", "onnxrt_fp16_cpu"} | bf16
    for folder in folders:
        config = _parse(folder)
        openvino = config.backend == "openvino"
        # build.max_batch, which verify checked; OpenVINO: 0, its batch dynamic in dims (the backend would fix it)
        assert config.name == folder.name and config.max_batch_size == (0 if openvino else 32)
        artifact = _dims_of_artifact(folder)
        for tensor in [*config.input, *config.output]:
            dtype, dims = artifact[tensor.name]
            assert mc.DataType.Name(tensor.data_type) == dtype
            assert (tuple(tensor.dims) if openvino else (-1, *tensor.dims)) == dims
        assert config.instance_group[0].kind == mc.ModelInstanceGroup.Kind.KIND_CPU
        sidecar = json.loads((folder / "pipeline.json").read_text())
        assert sidecar["verdict"] == "passed" == verify[folder.name]["status"]
        assert sidecar["verdict_sha256"] == verify[folder.name]["artifact_sha256"]
    if bf16:
        assert _parse(out / "openvino_bf16").parameters["HINT_BF16"].string_value == "YES"
    written = json.loads((out / "pipeline.files.json").read_text())["files"]
    on_disk = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()} - {"pipeline.files.json"}
    assert set(written) == on_disk and all(len(v) == 64 for v in written.values())
    onnx_fp32 = _parse(out / "onnxrt_fp32")
    assert onnx_fp32.backend == "onnxruntime"
    measured = {r["batch_size"] for r in benchmark if r["backend"] == "onnxrt_fp32"}
    assert set(onnx_fp32.dynamic_batching.preferred_batch_size) <= measured  # from benchmark's curve
    deployed = json.loads((run / "deploy.json").read_text())
    assert deploy_result.read(run / "deploy.json").to_json() == deployed  # read back and written in the same shape
    refused = {r["candidate"]: r["reason"] for r in deployed["refused"]}
    assert "only precision parameter is HINT_BF16" in refused["openvino_fp32"]  # it would run in bf16 on a BF16 CPU
    runs_in = {m["name"]: m["runs_in"] for m in deployed["models"]}
    loads_in = {m["name"]: m["loads_in"] for m in deployed["models"]}
    assert loads_in["onnxrt_fp32"].startswith("ONNX opset 18, IR 8: Triton 24.04–26.07")
    assert not bf16 or loads_in["openvino_bf16"].startswith("OpenVINO IR up to opset")
    assert all(runs_in.values()) and (not bf16 or runs_in["openvino_bf16"].startswith("bf16"))
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


def _tree(root):
    return {p.relative_to(root).as_posix(): (p.read_bytes() if p.is_file() else None) for p in root.rglob("*")}


def test_a_folder_deploy_did_not_write_is_left_alone(clone_run, tmp_path, capfd):
    run, out = clone_run(), tmp_path / "repo"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert cli("deploy", "--run-dir", run, "--out", out) == 2
    assert "files deploy did not write" in capfd.readouterr().err
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
    assert cli("deploy", "--run-dir", run) == 2  # no --out, no deploy.out
    assert "--out DIR" in capfd.readouterr().err
    assert cli("deploy", "--run-dir", run, "--out", run / "inside") == 2


def test_user_files_beside_folders_that_look_like_models_are_never_touched(clone_run, tmp_path, capfd):
    """The data loss of issue 44: subfolders each holding a pipeline.json were taken for an old repository and the
    folder replaced whole, a data.csv beside them with it."""
    run, out = clone_run(), tmp_path / "repo"
    for name in ("a", "b"):
        (out / name).mkdir(parents=True)
        (out / name / "pipeline.json").write_text("{}")
    (out / "data.csv").write_text("x,y\n1,2\n")
    before = _tree(out)
    assert cli("deploy", "--run-dir", run, "--out", out) == 2
    assert "no pipeline.files.json" in capfd.readouterr().err
    assert _tree(out) == before


def test_a_repository_deploy_wrote_is_replaced_only_while_it_is_exactly_what_it_wrote(clone_run, tmp_path, capfd):
    run, out = clone_run(), tmp_path / "repo"
    assert cli("deploy", "--run-dir", run, "--out", out) == 0
    (out / "onnxrt_fp32" / "mine.txt").write_text("a note")  # a user's file inside a model folder
    before = _tree(out)
    assert cli("deploy", "--run-dir", run, "--out", out) == 2
    assert "onnxrt_fp32/mine.txt" in capfd.readouterr().err and _tree(out) == before
    (out / "onnxrt_fp32" / "mine.txt").unlink()
    (out / "onnxrt_fp32" / "config.pbtxt").write_text((out / "onnxrt_fp32" / "config.pbtxt").read_text() + "\n")
    before = _tree(out)
    assert cli("deploy", "--run-dir", run, "--out", out) == 2  # an edited file deploy wrote: the edit is kept
    assert "changed since deploy wrote them (onnxrt_fp32/config.pbtxt)" in capfd.readouterr().err
    assert _tree(out) == before
    (out / "onnxrt_fp32" / "config.pbtxt").unlink()  # removing a file deploy wrote loses nothing of the user's
    assert cli("deploy", "--run-dir", run, "--out", out) == 0


@pytest.mark.parametrize("umask, want", [(0o022, 0o755), (0o027, 0o750)])
def test_the_repository_follows_the_umask(clone_run, tmp_path, umask, want):
    """Readable by a Triton running as another user where the umask lets files be (the root was always 0700)."""
    import os
    import stat

    run, out = clone_run(), tmp_path / "repo"
    old = os.umask(umask)
    try:
        assert cli("deploy", "--run-dir", run, "--out", out) == 0
    finally:
        os.umask(old)
    assert stat.S_IMODE(out.stat().st_mode) == want
    for path in out.rglob("*"):
        assert stat.S_IMODE(path.stat().st_mode) == (want if path.is_dir() else want & 0o666), path


def test_serve_without_the_extra_says_how_to_get_it_before_anything_is_written(clone_run, tmp_path, capfd,
                                                                              monkeypatch):
    from pipeline.runtime.serving import triton_serve

    monkeypatch.setattr(triton_serve, "available", lambda: "No module named 'pytriton'; " + triton_serve.INSTALL)
    run = clone_run()
    assert cli("deploy", "--run-dir", run, "--out", tmp_path / "repo", "--serve") == 3
    assert "pip install -e '.[serve]'" in capfd.readouterr().err
    assert not (tmp_path / "repo").exists() and not (run / "deploy.json").exists()
    assert not list(tmp_path.glob(".repo.*"))


def test_a_bf16_engine_that_passed_deploys(clone_run, monkeypatch):
    """tensorrt_bf16 comes from the backend table like every deployment (deploy kept a second table without it)."""
    from pipeline import deploy
    from pipeline.core.run import RunDir
    from pipeline.reports import verify_report

    run = clone_run()
    monkeypatch.setattr(verify_report, "read_verdicts", lambda run_dir: {"tensorrt_bf16": "passed"})
    plans = {p.name: p for p in deploy.plan(RunDir(run))}
    assert plans["tensorrt_bf16"].refused == "" and plans["tensorrt_bf16"].format is deploy.PLAN


def test_an_engines_signature_and_max_batch_size_come_from_the_engine(tiny_run, monkeypatch):
    """Read through TensorRT's own calls (tests/fake_tensorrt.py checks them): I/O names, types, dims and the
    optimisation profile, whose maximum is the model's max_batch_size whatever build.max_batch says now."""
    import fake_tensorrt
    from pipeline.core import deployment
    from pipeline.runtime.serving import triton

    fake_tensorrt.install(monkeypatch)
    blob = fake_tensorrt.serialize((tiny_run / "model.onnx").read_bytes(),
                                   {"min": [1, 3, 16, 16], "opt": [8, 3, 16, 16], "max": [16, 3, 16, 16]})
    signature = triton.engine_signature(blob)
    assert signature.inputs == (triton.Tensor("input", "TYPE_FP32", (-1, 3, 16, 16)),)
    assert signature.outputs == (triton.Tensor("logits", "TYPE_FP32", (-1, 10)),)
    assert signature.profile_max == 16
    assert deployment.max_batch_size(batch_dim=signature.batch_dim, profile_max=signature.profile_max,
                                     served_max=32) == 16
