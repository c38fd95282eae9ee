"""Nothing outside the run directory, and nothing lost (issue 13, section 3).

Reads and writes stay inside the run directory (external data of every kind of tensor, symbolic links),
a damaged manifest is one clear error, a failed command leaves config.yaml as it was, trained weights
are replaced only after a one-line notice, and only engines the build stage recorded are loaded.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import cli
from pipeline import config, stages
from pipeline.core import artifacts, onnx_io
from pipeline.core.errors import EXIT_USAGE, InputError, UsageError
from pipeline.core.run import RunDir, atomic_path, atomic_write, open_append
from pipeline.runtime.builders import tensorrt_engine

# --------------------------------------------------------------------------- reads: external data of every tensor


def _external(tensor: TensorProto, location: str) -> TensorProto:
    tensor.ClearField("raw_data")
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", "0"), ("length", "8")):
        tensor.external_data.add(key=key, value=value)
    return tensor


def _sparse(name: str, location: str) -> onnx.SparseTensorProto:
    values = _external(numpy_helper.from_array(np.array([1.0, 2.0], dtype=np.float32), name), location)
    indices = numpy_helper.from_array(np.array([0, 3], dtype=np.int64), name + "_indices")
    return helper.make_sparse_tensor(values, indices, [4])


def _model(*, sparse_initializer=None, attribute=None, subgraph_attribute=None) -> onnx.ModelProto:
    """y = x + b, with one hostile tensor in the place under test."""
    b = numpy_helper.from_array(np.zeros(4, dtype=np.float32), "b")
    nodes = [helper.make_node("Add", ["x", "b"], ["y"])]
    if attribute is not None:  # a Constant node's sparse_value attribute
        nodes.append(helper.make_node("Constant", [], ["c"], sparse_value=attribute))
    if subgraph_attribute is not None:  # a Constant inside an If body
        branch = helper.make_graph([helper.make_node("Constant", [], ["k"], value=subgraph_attribute)], "branch", [],
                                   [helper.make_tensor_value_info("k", TensorProto.FLOAT, [2])])
        nodes.append(helper.make_node("If", ["cond"], ["z"], then_branch=branch, else_branch=branch))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])], initializer=[b],
                              sparse_initializer=[sparse_initializer] if sparse_initializer is not None else None)
    return helper.make_model(graph)


HOSTILE = ["../../secret.bin", "/etc/passwd"]


@pytest.mark.parametrize("location", HOSTILE)
@pytest.mark.parametrize("place", ["sparse_initializer", "attribute", "subgraph"])
def test_external_data_of_every_tensor_is_confined_to_the_model_folder(tmp_path, place, location):
    if place == "sparse_initializer":
        model = _model(sparse_initializer=_sparse("s", location))
    elif place == "attribute":
        model = _model(attribute=_sparse("a", location))
    else:
        model = _model(subgraph_attribute=_external(numpy_helper.from_array(np.ones(2, np.float32), "k"), location))
    path = tmp_path / "model.onnx"
    path.write_bytes(model.SerializeToString())
    with pytest.raises(InputError, match="outside the model's folder; refusing to load it") as err:
        onnx_io.check_external_data(path)
    assert err.value.exit_code == EXIT_USAGE
    with pytest.raises(InputError, match="refusing to load it"):
        onnx_io.load(path)


def test_sparse_initializer_inside_the_folder_is_allowed(tmp_path):
    (tmp_path / "weights.bin").write_bytes(np.array([1.0, 2.0], dtype=np.float32).tobytes())
    path = tmp_path / "model.onnx"
    path.write_bytes(_model(sparse_initializer=_sparse("s", "weights.bin")).SerializeToString())
    onnx_io.check_external_data(path)
    kinds = [t.name for t in onnx_io.all_tensors(onnx.load(str(path), load_external_data=False))]
    assert kinds == ["b", "s", "s_indices"]


def test_verify_refuses_a_model_whose_sparse_initializer_reads_outside(clone_run, capsys):
    run = clone_run()
    secret = run.parent.parent / "secret.bin"
    secret.write_bytes(b"\0" * 64)
    model = onnx.load(str(run / artifacts.FP32_ONNX))
    model.graph.sparse_initializer.append(_sparse("planted", "../../secret.bin"))
    (run / artifacts.FP32_ONNX).write_bytes(model.SerializeToString())
    assert cli("verify", "--run-dir", run) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "points to external data '../../secret.bin' outside the model's folder" in err[-1]


# --------------------------------------------------------------------------- writes: symbolic links


@pytest.fixture
def outside(tmp_path) -> Path:
    target = tmp_path / "outside.txt"
    target.write_text("precious\n")
    return target


def test_lock_symlink_is_refused_and_its_target_untouched(tmp_path, outside):
    run = tmp_path / "run"
    run.mkdir()
    (run / artifacts.LOCK).symlink_to(outside)
    with pytest.raises(UsageError, match=r"refusing to write .*\.lock: it is a symbolic link") as err:
        with RunDir(run).locked():
            pass
    assert err.value.exit_code == EXIT_USAGE
    assert outside.read_text() == "precious\n"


def test_lock_symlink_on_the_command_line_is_one_line_exit_2(clone_run, outside, capsys):
    run = clone_run()
    (run / artifacts.LOCK).symlink_to(outside)
    assert cli("verify", "--run-dir", run) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is a symbolic link" in err[0]
    assert outside.read_text() == "precious\n"


def test_metrics_symlink_is_not_appended_to(clone_run, outside, capsys):
    run = clone_run()
    (run / artifacts.METRICS).unlink()
    (run / artifacts.METRICS).symlink_to(outside)
    assert cli("train", "--run-dir", run, "--resume") == 2
    assert "metrics.jsonl: it is a symbolic link" in capsys.readouterr().err
    assert outside.read_text() == "precious\n"


def test_metrics_log_refuses_a_symlink(tmp_path, outside):
    from pipeline.training.metrics import MetricsLog

    (tmp_path / "metrics.jsonl").symlink_to(outside)
    with pytest.raises(UsageError, match="symbolic link"):
        MetricsLog(tmp_path / "metrics.jsonl", True, None)
    assert outside.read_text() == "precious\n"


def test_append_opens_with_o_nofollow(tmp_path, outside, monkeypatch):
    """A link planted after the check is still not followed: the open itself refuses it."""
    import pipeline.core.run as run_mod

    (tmp_path / "metrics.jsonl").symlink_to(outside)
    monkeypatch.setattr(run_mod, "refuse_symlink", lambda path: None)
    with pytest.raises(UsageError, match="symbolic link"):
        open_append(tmp_path / "metrics.jsonl")
    assert outside.read_text() == "precious\n"


def test_atomic_write_refuses_a_symlink(tmp_path, outside):
    (tmp_path / "config.yaml").symlink_to(outside)
    with pytest.raises(UsageError, match="symbolic link"):
        atomic_write(tmp_path / "config.yaml", "model: {name: x}\n")
    assert outside.read_text() == "precious\n" and (tmp_path / "config.yaml").is_symlink()


def test_atomic_write_refuses_a_symlink_planted_while_writing(tmp_path, outside):
    path = tmp_path / "model.onnx"
    with pytest.raises(UsageError, match="symbolic link"):
        with atomic_path(path) as tmp:
            tmp.write_text("new")
            path.symlink_to(outside)
    assert outside.read_text() == "precious\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx", "outside.txt"]  # no temporary file left


# --------------------------------------------------------------------------- manifest damage


def _damage(m: dict, how: str) -> None:
    train = m["stages"]["train"]
    if how == "stage-string":
        m["stages"]["train"] = "ok"
    elif how == "null-artifacts":
        train["artifacts"] = None
    elif how == "no-sha256":
        del train["artifacts"][artifacts.WEIGHTS]["sha256"]
    elif how == "absolute-name":
        train["artifacts"]["/etc/passwd"] = {"sha256": "0" * 64, "bytes": 1}
    elif how == "dotdot-name":
        train["artifacts"]["../secret.bin"] = {"sha256": "0" * 64, "bytes": 1}
    elif how == "stages-list":
        m["stages"] = []


DAMAGE = ["stage-string", "null-artifacts", "no-sha256", "absolute-name", "dotdot-name", "stages-list"]


@pytest.mark.parametrize("how", DAMAGE)
def test_damaged_manifest_is_one_line_exit_2(clone_run, capsys, how):
    run = clone_run()
    m = json.loads((run / artifacts.MANIFEST).read_text())
    _damage(m, how)
    (run / artifacts.MANIFEST).write_text(json.dumps(m))
    with pytest.raises(InputError, match="manifest.json is damaged: "):
        RunDir(run)
    assert cli("all", "--run-dir", run) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error")]
    assert len(errors) == 1 and "manifest.json is damaged" in errors[0] and "Error:" not in errors[0]


def test_artifact_names_are_plain_file_names(tmp_path):
    from pipeline.core import manifest

    ok = {"schema": "pipeline.manifest/1", "stages": {"x": {"status": "ok", "artifacts": {
        "model.onnx": {"sha256": "a" * 64, "bytes": 3}}}}}
    manifest.validate(ok, tmp_path / "manifest.json")
    for name in ("/etc/passwd", "../x", "sub/x", "..", "", "a\\b"):
        bad = json.loads(json.dumps(ok))
        bad["stages"]["x"]["artifacts"] = {name: {"sha256": "a" * 64, "bytes": 3}}
        with pytest.raises(InputError, match="not a plain file name"):
            manifest.validate(bad, tmp_path / "manifest.json")


# --------------------------------------------------------------------------- config of a failed command


def _run_ids(run: Path) -> dict:
    return {k: v.get("run_id") for k, v in json.loads((run / artifacts.MANIFEST).read_text())["stages"].items()}


def test_failed_command_does_not_save_its_overrides(clone_run, capsys):
    run = clone_run()
    before, ids = (run / artifacts.CONFIG).read_bytes(), _run_ids(run)
    assert cli("verify", "--run-dir", run, "--model", "resnet18") == 2
    assert (run / artifacts.CONFIG).read_bytes() == before
    capsys.readouterr()
    assert cli("all", "--run-dir", run) == 0  # the next plain `all` keeps the trained model
    err = capsys.readouterr().err
    assert "train: unchanged since" in err and "replaces the trained weights" not in err
    assert _run_ids(run)["train"] == ids["train"]


def _cfg(run: Path, *overrides: str):
    return config.resolve(config.load_yaml_file(run / artifacts.CONFIG), None, list(overrides))


def test_retrain_notice_names_the_config_change(clone_run):
    run_dir = clone_run()
    run = RunDir(run_dir)
    assert stages.retrain_notice(_cfg(run_dir), run, set()) is None
    assert stages.retrain_notice(_cfg(run_dir, "verify.samples=32"), run, set()) is None  # not a train input
    assert stages.retrain_notice(_cfg(run_dir, "train.epochs=2"), run, {"train"}) is None  # asked for
    notice = stages.retrain_notice(_cfg(run_dir, "train.epochs=2", "data.seed=7"), run, set())
    assert notice == ("all: the model/data/train config changed since train ran (data.seed 0 → 7, train.epochs 1 → 2): "
                      "train re-runs and replaces the trained weights (model.safetensors)")


def test_all_says_so_before_it_retrains_and_keeps_the_config_of_stages_that_ran(clone_run, capsys):
    """`all train.epochs=2 --require tensorrt`: train and export run, build fails (exit 3). The notice comes
    first; config.yaml then describes the weights on disk (epochs 2), without this call's requirement."""

    if tensorrt_engine.availability()[0]:
        pytest.skip("TensorRT is available here: build would not fail")
    run = clone_run()
    assert cli("all", "--run-dir", run, "--require", "tensorrt", "train.epochs=2") == 3
    lines = capsys.readouterr().err.splitlines()
    notice = lines.index("all: the model/data/train config changed since train ran (train.epochs 1 → 2): "
                         "train re-runs and replaces the trained weights (model.safetensors)")
    first_train_line = next(i for i, line in enumerate(lines) if line.startswith("train:"))
    assert notice < first_train_line
    saved = config.load_yaml_file(run / artifacts.CONFIG)
    assert saved["train"]["epochs"] == 2 and saved["require"] == []


# --------------------------------------------------------------------------- forged engines

PLATFORM = {"tensorrt": "10.13.0", "gpu": "NVIDIA H200", "compute_capability": "9.0"}


def _forged_engine(run_dir: Path) -> str:
    """An engine and a sidecar as an attacker would write them: right hash, guessed platform, no build ran."""
    engine = run_dir / tensorrt_engine.FP16_ENGINE
    engine.write_bytes(b"\x00planted engine\x00")
    digest = hashlib.sha256(engine.read_bytes()).hexdigest()
    (run_dir / tensorrt_engine.SIDECAR).write_text(json.dumps({"schema": tensorrt_engine.SIDECAR_SCHEMA,
                                                               "built_by": "pipeline 0.1.0",
                                                               "engine": tensorrt_engine.FP16_ENGINE, "sha256": digest,
                                                               **PLATFORM}))
    return digest


def test_forged_engine_with_a_good_sidecar_is_refused(tmp_path):
    _forged_engine(tmp_path)
    with pytest.raises(InputError, match="not the engine the build stage recorded in the manifest "
                                         r"\(no build is recorded\)") as err:
        tensorrt_engine.load_engine_bytes(RunDir(tmp_path), platform=PLATFORM)
    assert err.value.exit_code == EXIT_USAGE and "rebuild it with" in str(err.value)


def test_engine_replaced_after_a_recorded_build_is_refused(tmp_path):
    digest = _forged_engine(tmp_path)
    run = RunDir(tmp_path)
    run.manifest["stages"]["build"] = {"status": "ok",
                                       "artifacts": {tensorrt_engine.FP16_ENGINE: {"sha256": "1" * 64, "bytes": 1}}}
    with pytest.raises(InputError, match="the build recorded sha256 111111111111"):
        tensorrt_engine.load_engine_bytes(run, platform=PLATFORM)
    run.manifest["stages"]["build"] = {"status": "failed",
                                       "artifacts": {tensorrt_engine.FP16_ENGINE: {"sha256": digest, "bytes": 1}}}
    with pytest.raises(InputError, match="no build is recorded"):
        tensorrt_engine.load_engine_bytes(run, platform=PLATFORM)
    run.manifest["stages"]["build"]["status"] = "ok"
    assert tensorrt_engine.load_engine_bytes(run, platform=PLATFORM)[0] == b"\x00planted engine\x00"
    run.save_manifest()
    assert tensorrt_engine.load_engine_bytes(RunDir(tmp_path), platform=PLATFORM)[1].platform.gpu == "NVIDIA H200"

