"""The command line as users meet it: help anywhere, one-line errors, the end-to-end run, incremental re-runs."""

import json
import subprocess
import sys
import time


from conftest import ROOT, TINY, cli, run_cli

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
from pipeline.cli import main, build_parser, STAGE_HELP
for args in [['--help']] + [[c, '--help'] for c in ['all', *STAGE_HELP, 'report', 'bench-train', 'models', 'config']]:
    try:
        main(args)
    except SystemExit as e:
        assert e.code == 0, (args, e.code)
print('ok')
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("ok")


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
    for name, entry in manifest["stages"].items():
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


def ended(run):
    return {name: entry.get("ended") for name, entry in manifest(run)["stages"].items()}


def test_unchanged_all_skips_every_stage(clone_run, capsys):
    run = clone_run()
    before = ended(run)
    start = time.perf_counter()
    assert cli("all", "--run-dir", run) == 0
    seconds = time.perf_counter() - start
    err = capsys.readouterr().err
    assert ended(run) == before
    for stage in ("train", "export", "build", "verify", "benchmark"):
        assert f"{stage}: unchanged since" in err
    assert seconds < 15


def test_tolerance_change_reruns_only_verify(clone_run, capsys):
    run = clone_run()
    before = ended(run)
    time.sleep(1.1)  # manifest times have one-second resolution
    assert cli("all", "--run-dir", run, "verify.fp16.atol=0.03") == 0
    after = ended(run)
    changed = {s for s in before if before[s] != after[s]}
    assert changed == {"verify"}


def test_corrupted_artifact_reruns_that_stage_and_downstream(clone_run):
    run = clone_run()
    before = ended(run)
    time.sleep(1.1)
    with open(run / "model.onnx", "ab") as f:
        f.write(b"\0")  # still there, but no longer what export recorded
    assert cli("all", "--run-dir", run) == 0
    after = ended(run)
    changed = {s for s in before if before[s] != after[s]}
    assert "train" not in changed
    assert {"export", "verify", "benchmark"} <= changed


def test_force_reruns_named_stages(clone_run):
    run = clone_run()
    before = ended(run)
    time.sleep(1.1)
    assert cli("all", "--run-dir", run, "--force", "benchmark") == 0
    after = ended(run)
    assert {s for s in before if before[s] != after[s]} == {"benchmark"}


def test_stage_needs_earlier_stage(tmp_path, capsys):
    assert cli("export", "--run-dir", tmp_path / "empty", "--model", "tiny_cnn") == 2
    err = capsys.readouterr().err
    assert "run `python -m pipeline train" in err


def test_only_train_runs_under_torchrun(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    assert cli("verify", "--run-dir", tmp_path / "x", "--model", "tiny_cnn") == 2
    assert "only 'train' runs under torchrun" in capsys.readouterr().err
