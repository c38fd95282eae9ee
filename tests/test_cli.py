"""The command line as users meet it: help anywhere, one-line errors, the end-to-end run, incremental re-runs."""

import json
import subprocess
import sys

import pytest

from conftest import ROOT, TINY, cli, run_cli
from pipeline.runtime.builders import tensorrt_engine
from pipeline.stages import ORDER

HEAVY = ("torch", "onnx", "onnxruntime", "tensorrt", "polygraphy", "modelopt", "numpy", "matplotlib")


def test_help_works_without_heavy_dependencies():
    """Every --help must work on a machine without torch, CUDA or TensorRT: block their import."""
    code = f"""
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in {HEAVY!r}:
            raise ImportError('blocked: ' + name)
sys.meta_path.insert(0, Block())
from pipeline.cli import main, build_parser
from pipeline.stages import STAGES
for args in [['--help']] + [[c, '--help'] for c in ['all', *STAGES, 'report', 'bench-train', 'models', 'config']]:
    try:
        main(args)
    except SystemExit as e:
        assert e.code == 0, (args, e.code)
print('ok')
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("ok")


def test_tune_precision_help_names_every_precision_the_config_accepts(capsys):
    """`tune --precision` help once said `int8|fp16` though bf16 was accepted: it is derived from the config."""
    import typing

    from pipeline.cli import build_parser
    from pipeline.core.config_schema import TuneConfig

    with pytest.raises(SystemExit):
        build_parser().parse_args(["tune", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    accepted = typing.get_args(TuneConfig.model_fields["precision"].annotation)
    assert f"--precision {'|'.join(accepted)}" in text
    assert all(name in text.split("--precision", 2)[2] for name in accepted)


def test_models_lists_registry(capsys):
    assert cli("models") == 0
    out = capsys.readouterr().out
    for name in ("resnet18", "tiny_cnn", "mobilenet_v3_small", "vit_micro"):
        assert name in out
    assert "3x224x224" in out and "1000" in out


def test_unknown_model_is_one_line_exit_2():
    out = run_cli("train", "--model", "resnet19", "--run-dir", "/tmp/never-created-by-this-test")
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "resnet19" in lines[0]
    assert "resnet18" in lines[0] and "Traceback" not in out.stderr


def test_bad_config_lists_every_problem(tmp_path, capsys):
    rc = cli("train", "--run-dir", tmp_path / "r", "trian.epochs=3", "train.lr=fast", "data.batch_size=0")
    assert rc == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(line.startswith("error: config: ") for line in err)
    assert any("did you mean train" in line for line in err)
    assert not (tmp_path / "r").exists()  # nothing starts before the config is valid


def test_config_command_prints_resolved_yaml(capsys, tmp_path):
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("train:\n  epochs: 7\nverify:\n  fp16:\n    atol: 1e-3\n")
    assert cli("config", "--config", cfg_file, "data.image_size=48") == 0
    import yaml

    data = yaml.safe_load(capsys.readouterr().out)
    assert data["train"]["epochs"] == 7 and data["data"]["image_size"] == 48
    assert data["verify"]["fp16"]["atol"] == 1e-3
    assert cli("config", "--keys") == 0
    assert "verify.fp16.atol" in capsys.readouterr().out


def test_end_to_end_command_line(tmp_path):
    """`python -m pipeline all` as a subprocess into a temporary directory, then the report."""
    run = tmp_path / "e2e"
    out = run_cli("all", "--model", "tiny_cnn", "--run-dir", run, *TINY)
    assert out.returncode == 0, out.stderr
    manifest = json.loads((run / "manifest.json").read_text())
    statuses = {name: entry["status"] for name, entry in manifest["stages"].items()}
    assert statuses["train"] == statuses["export"] == statuses["verify"] == statuses["benchmark"] == "ok"
    assert statuses["build"] in ("ok", "skipped")
    for _name, entry in manifest["stages"].items():
        for artifact, info in entry["artifacts"].items():
            assert (run / artifact).is_file() and len(info["sha256"]) == 64
    env = manifest["environment"]
    assert env["torch"] and env["onnx"] and env["onnxruntime"] and env["polygraphy"] and env["cpu"]
    bench = json.loads((run / "benchmark.json").read_text())
    assert {r["backend"] for r in bench["results"]} >= {"torch_fp32", "onnxrt_fp32"}
    assert "run directory:" in out.stdout
    report = run_cli("report", "--run-dir", run)
    assert report.returncode == 0 and (run / "report.html").is_file()


# --------------------------------------------------------------------------- incremental re-runs


def manifest(run):
    return json.loads((run / "manifest.json").read_text())


def run_ids(run):
    """Each execution of a stage gets a new run id; a skipped stage keeps its old one."""
    return {name: entry.get("run_id") for name, entry in manifest(run)["stages"].items()}


def reran(before, run):
    after = run_ids(run)
    return {name for name in after if before.get(name) != after[name]}


def test_unchanged_all_skips_every_stage(clone_run, capsys):
    run = clone_run()
    before = run_ids(run)
    assert set(before) == set(ORDER) and all(before.values())
    assert cli("all", "--run-dir", run) == 0
    err = capsys.readouterr().err
    assert reran(before, run) == set()
    for stage in ORDER:
        assert f"{stage}: unchanged since" in err


def test_tolerance_change_reruns_only_verify(clone_run):
    run = clone_run()
    before = run_ids(run)
    assert cli("all", "--run-dir", run, "verify.fp16.atol=0.03") == 0
    assert reran(before, run) == {"verify"}


def test_corrupted_artifact_reruns_that_stage_and_downstream(clone_run):
    run = clone_run()
    before = run_ids(run)
    with open(run / "model.onnx", "ab") as f:
        f.write(b"\0")  # still there, but no longer what export recorded
    assert cli("all", "--run-dir", run) == 0
    changed = reran(before, run)
    assert "train" not in changed
    assert {"export", "verify", "benchmark"} <= changed


def test_force_reruns_named_stages(clone_run):
    run = clone_run()
    before = run_ids(run)
    assert cli("all", "--run-dir", run, "--force", "benchmark") == 0
    assert reran(before, run) == {"benchmark"}


def test_unmet_requirement_does_not_make_the_next_all_redo_work(clone_run, capsys):
    """`build --require tensorrt` exits 3 here; it ran nothing, so the next unchanged `all` skips every stage."""

    if tensorrt_engine.availability()[0]:
        pytest.skip("TensorRT is available here, so the requirement is met")
    run = clone_run()
    before = run_ids(run)
    assert cli("build", "--run-dir", run, "--require", "tensorrt") == 3
    assert cli("all", "--run-dir", run) == 0
    assert reran(before, run) == set()
    assert cli("all", "--run-dir", run, "--require", "tensorrt") == 3  # still checked when nothing re-runs
    assert "TensorRT engine required" in capsys.readouterr().err


def test_stage_needs_earlier_stage(tmp_path, capsys):
    assert cli("export", "--run-dir", tmp_path / "empty", "--model", "tiny_cnn") == 2
    err = capsys.readouterr().err
    assert "run `python -m pipeline train" in err


def test_only_train_runs_under_torchrun(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    assert cli("verify", "--run-dir", tmp_path / "x", "--model", "tiny_cnn") == 2
    assert "only 'train' runs under torchrun" in capsys.readouterr().err
