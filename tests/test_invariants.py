"""Invariants over the whole pipeline, with the default config (INT8 on, OpenVINO on) on a tiny model (issue 21).

* A second ``all`` with nothing changed skips every stage, and every sha256 in the manifest is the file on
  disk (ModelOpt once rewrote ``model.onnx`` after export hashed it, so every later stage re-ran).
* Nothing outside the run directory is written or read: a symbolic link planted at any path a real run
  recorded (taken from its manifest, not a hand list) makes the stage that uses it refuse, exit 2, and the
  link's target is left as it was.
* Never judge a stale graph: a graph whose source weights are not the current ones is refused by verify.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from pathlib import Path

import pytest

from conftest import TINY, cli
from pipeline.core import artifacts
from pipeline.core.errors import EXIT_USAGE

# The defaults, small: every backend of the table (OpenVINO included), INT8 on, a tiny model trained long
# enough that its logits are not near-ties (the INT8 gate is then a fair test, tests/test_int8.py).
DEFAULTS_SMALL = [s for s in TINY if not s.startswith(("export.int8.enabled", "export.bf16.enabled",
                                                        "benchmark.backends"))] + [
    "data.samples_per_class=30", "train.epochs=4", "export.int8.calibration_samples=16",
    "verify.samples=60", "verify.batch_size=30", "benchmark.batch_sizes=[1]"]


def _manifest(run: Path) -> dict:
    return json.loads((run / artifacts.MANIFEST).read_text())


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def default_run(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("defaults") / "run"
    assert cli("all", "--model", "tiny_cnn", "--run-dir", run, *DEFAULTS_SMALL) == 0
    return run


def _clone(run: Path, tmp_path: Path) -> Path:
    target = tmp_path / "run"
    shutil.copytree(run, target, symlinks=True)
    (target / artifacts.LOCK).unlink(missing_ok=True)
    return target


# --------------------------------------------------------------------------- §1 a cached `all` is cached


def test_second_all_skips_every_stage_and_the_manifest_hashes_the_files_on_disk(default_run, tmp_path, capsys,
                                                                               monkeypatch):
    run = _clone(default_run, tmp_path)
    before = _manifest(run)
    assert before["stages"]["export"]["details"]["int8"].get("int8_nodes"), "INT8 must be on in this run"
    for name, entry in before["stages"].items():
        for artifact, info in entry.get("artifacts", {}).items():
            assert _sha(run / artifact) == info["sha256"], f"{name}: {artifact} is not what the manifest says"
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    capsys.readouterr()
    assert cli("all", "--run-dir", run) == 0
    err = capsys.readouterr().err
    after = _manifest(run)
    for name in before["stages"]:
        assert f"{name}: unchanged since" in err, err
        assert after["stages"][name]["run_id"] == before["stages"][name]["run_id"]
    assert not list(scratch.iterdir())  # ModelOpt's scratch copies are gone
    recorded = {p.split("/")[0] for e in after["stages"].values() for p in e.get("artifacts", {})}
    stray = [p.name for p in run.iterdir() if p.name not in recorded and not p.name.startswith(".")
             and p.name not in (artifacts.MANIFEST, artifacts.CONFIG, artifacts.LOGS, artifacts.CHECKPOINT,
                                artifacts.BEST_CHECKPOINT, artifacts.METRICS, artifacts.CALIBRATION)]
    assert stray == []  # no library wrote files of its own (model_reconciled.onnx, model_opset19.onnx)


def test_the_export_of_the_default_run_leaves_no_file_of_modelopt_in_the_run_dir(default_run):
    assert not [p.name for p in default_run.iterdir() if p.name.startswith("model_")]


# --------------------------------------------------------------------------- §2 confined to the run directory


def _recorded(run: Path) -> list[tuple[str, str]]:
    """(stage, path) for every artifact a real run recorded, and its folders (openvino/, logs/)."""
    pairs = [(stage, name) for stage, entry in _manifest(run)["stages"].items() for name in entry.get("artifacts", {})]
    folders = sorted({(stage, name.split("/")[0]) for stage, name in pairs if "/" in name})
    return pairs + folders + [(None, artifacts.LOGS)]  # written by verify's and benchmark's children


def _stage_command(stage: str) -> list[str]:
    return ["train", "--resume"] if stage == "train" else [stage]


def test_a_link_at_any_recorded_path_is_refused_and_its_target_is_untouched(default_run, tmp_path, capsys):
    pairs = _recorded(default_run)
    assert len(pairs) > 15 and ("verify", artifacts.VERIFY_JSON) in pairs and ("build", artifacts.OPENVINO_DIR) in pairs
    for i, (stage, name) in enumerate(pairs):
        case = tmp_path / str(i)
        run = _clone(default_run, case)
        victim = case / "victim"
        if (run / name).is_dir():
            shutil.copytree(run / name, victim)
            shutil.rmtree(run / name)
        else:
            victim.write_bytes(b"outside\n")
            (run / name).unlink()
        (run / name).symlink_to(victim)
        before = {p: p.read_bytes() for p in ([victim] if victim.is_file() else victim.rglob("*"))}
        commands = [["all"], _stage_command(stage)] if stage else [["verify"], ["benchmark"]]
        for command in (*commands, ["report"]):
            capsys.readouterr()
            code = cli(*command, "--run-dir", run)
            err = capsys.readouterr().err
            assert code == EXIT_USAGE, (name, command, err)
            errors = [line for line in err.splitlines() if line.startswith("error:")]
            assert len(errors) == 1 and "symbolic link" in errors[0] and "Traceback" not in err, (name, command, err)
        assert {p: p.read_bytes() for p in before} == before, name
        assert sorted(victim.rglob("*") if victim.is_dir() else []) == sorted(p for p in before if victim.is_dir())


def test_report_embeds_only_pngs_the_run_recorded(default_run, tmp_path, capsys):
    run = _clone(default_run, tmp_path)
    (run / artifacts.CURVE).write_bytes(b"secret, not a PNG")  # a plain file, but not the one train wrote
    assert cli("report", "--run-dir", run) == 0
    html = (run / artifacts.REPORT_HTML).read_text()
    import base64

    assert base64.b64encode(b"secret, not a PNG").decode() not in html
    assert f"{artifacts.CURVE} is not the file train recorded" in html


# --------------------------------------------------------------------------- §3 never judge a stale graph


def test_verify_refuses_graphs_exported_from_other_weights(default_run, tmp_path, capsys):
    run = _clone(default_run, tmp_path)
    weights = run / artifacts.WEIGHTS
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1  # new weights, as a re-train whose export then failed would leave
    weights.write_bytes(bytes(data))
    capsys.readouterr()
    assert cli("verify", "--run-dir", run) == EXIT_USAGE
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].endswith("export did not finish; re-run export"), err
    assert not (run / artifacts.INT8_FALLBACK).exists()
    assert cli("verify", "--run-dir", run, "--auto-fallback") == EXIT_USAGE  # nothing "fixed" either
    assert not (run / artifacts.INT8_FALLBACK).exists()


def test_a_failed_export_leaves_no_graph_and_the_summary_marks_earlier_rows(default_run, tmp_path, capsys,
                                                                            monkeypatch):
    import onnx

    from pipeline.core import provenance
    from pipeline.precision import fp16

    run = _clone(default_run, tmp_path)

    def broken(*args, **kwargs):
        raise KeyboardInterrupt  # interrupted while AutoCast converts, after model.onnx was written

    monkeypatch.setattr(fp16, "convert", broken)
    capsys.readouterr()
    assert cli("all", "--run-dir", run, "--force", "export") == 130
    out = capsys.readouterr().out
    for graph in (artifacts.FP16_ONNX, artifacts.INT8_ONNX):
        assert not (run / graph).exists()
    fp32 = onnx.load(str(run / artifacts.FP32_ONNX))  # the one graph left is this export's, and says so
    assert provenance.source_weights(fp32) == _sha(run / artifacts.WEIGHTS)
    rows = {line.split()[0]: line for line in out.splitlines()[2:] if line.strip()}
    assert rows["export"].split()[1] == "interrupted"
    for stage in ("build", "verify", "benchmark"):  # not run now: never shown as this run's "ok"
        assert rows[stage].split()[1] == "earlier", out


# --------------------------------------------------------------------------- §4 leftovers after SIGKILL


def _kill_when(proc, pattern_dir: Path, pattern: str) -> None:
    import signal
    import time

    deadline = time.monotonic() + 120
    while True:
        assert proc.poll() is None and time.monotonic() < deadline, "it ended before making " + pattern
        if list(pattern_dir.glob(pattern)):
            proc.send_signal(signal.SIGSTOP)  # frozen, then killed while the folder is surely there
            if list(pattern_dir.glob(pattern)):
                break
            proc.send_signal(signal.SIGCONT)
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def test_folders_left_by_a_killed_process_are_removed_by_the_next_command(default_run, tmp_path):
    import subprocess
    import sys

    from conftest import ROOT

    run = _clone(default_run, tmp_path)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = {**__import__("os").environ, "TMPDIR": str(scratch)}

    def start(*args):
        return subprocess.Popen([sys.executable, "-m", "pipeline", *args, "--run-dir", str(run)], cwd=ROOT, env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    _kill_when(start("verify"), run, ".isolate.*/job.json")  # a child's exchange folder, with its job.json
    exchange = list(run.glob(".isolate.*"))
    assert exchange and (exchange[0] / "job.json").exists()
    _kill_when(start("export"), scratch, "pipeline-scratch.*")  # ModelOpt's private copy, outside
    assert not [p for p in exchange if p.exists()]  # export's start already removed the killed verify's folder
    (run / artifacts.OPENVINO_DIR / ".ir.killed").mkdir()  # an OpenVINO conversion cut short
    (run / artifacts.OPENVINO_DIR / ".ir.killed" / "m.xml").write_text("<net/>")
    left = [*scratch.glob("pipeline-scratch.*"), *run.glob("openvino/.ir.*")]
    assert len(left) == 2
    outside = tmp_path / "keep"
    outside.mkdir()
    (run / ".isolate.link").symlink_to(outside)  # a link is never followed, nor removed through
    assert subprocess.run([sys.executable, "-m", "pipeline", "report", "--run-dir", str(run)], cwd=ROOT, env=env,
                          capture_output=True).returncode == 0
    assert not [p for p in left if p.exists()]
    assert outside.is_dir()
