"""A run directory is claimed before anything is written to it (issue 46): a folder holding files this tool did not
write is refused with exit 2 and one line, by every command that opens a run directory, whatever the files' names;
nothing of the user's is read as the run's, modified or removed."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conftest import TINY, cli
from pipeline.core.artifacts import LOCK, MANIFEST
from pipeline.core.errors import EXIT_USAGE
from pipeline.core.run import BOOKKEEPING, LEDGER, RunDir, foreign_entries, owned_names

# --------------------------------------------------------------------------- the rule, pure

NAMES = st.text(alphabet="abcdefgjklmnopqrstuvwxyz._", min_size=1, max_size=12).filter(lambda n: n not in (".", ".."))


@given(entries=st.lists(NAMES, unique=True, max_size=8))
def test_a_folder_without_a_manifest_may_hold_only_the_lock_and_the_manifests_temporary(entries):
    foreign = foreign_entries(entries, None)
    for name in entries:
        ours = name == LOCK or (name.startswith(f".{MANIFEST}.") and name.endswith(".tmp"))
        assert (name in foreign) != ours, name
    assert foreign == sorted(foreign)


@given(entries=st.lists(NAMES, unique=True, max_size=8), ledger=st.lists(NAMES, max_size=4),
       artifacts=st.lists(NAMES, max_size=4))
def test_a_run_may_hold_only_its_bookkeeping_temporaries_and_what_its_manifest_lists(entries, ledger, artifacts):
    manifest = {"schema": "pipeline.manifest/1", LEDGER: ledger,
                "stages": {"train": {"status": "ok", "artifacts": {f"{a}/x" if i % 2 else a: {} for i, a in
                                                                   enumerate(artifacts)}}}}
    listed = set(ledger) | set(artifacts)
    assert owned_names(manifest) == listed
    foreign = foreign_entries(entries, manifest)
    for name in entries:
        temporary = (name.startswith(".") and name.endswith(".tmp")) or name.startswith(".isolate.")
        assert (name in foreign) == (name not in BOOKKEEPING | listed and not temporary), name


# --------------------------------------------------------------------------- every command, a folder of the user's


def _state(folder: Path) -> dict:
    """Every entry under ``folder``, with its bytes' digest and its mtime: what a command must leave as it was."""
    return {str(p.relative_to(folder)): (hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir",
                                         p.stat().st_mtime_ns) for p in sorted(folder.rglob("*"))}


USER_FILES = {"model.json": '{"mine": true}\n', "metrics.jsonl": "my notes\n", "config.yaml": "mine: 1\n",
              "holiday.jpg": "not an image\n"}
COMMANDS = [("train", "--model", "tiny_cnn", *TINY), ("export",), ("build",), ("verify",), ("benchmark",),
            ("tune",), ("qat",), ("compare", "--baseline", "elsewhere"), ("deploy", "--out", "elsewhere"),
            ("all", "--model", "tiny_cnn", *TINY), ("baseline", "--out", "elsewhere"), ("report",)]


def _refused_once(capsys, folder: Path, command: tuple[str, ...]) -> str:
    capsys.readouterr()
    before = _state(folder)
    assert cli(command[0], "--run-dir", folder, *command[1:]) == EXIT_USAGE
    err = capsys.readouterr().err.strip()
    assert _state(folder) == before, f"{command[0]} changed {folder}"
    assert len(err.splitlines()) == 1, err
    return err


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
def test_a_folder_of_the_users_is_refused_by_every_command_and_left_as_it_was(tmp_path, capsys, command):
    folder = tmp_path / "mine"
    folder.mkdir()
    for name, text in USER_FILES.items():
        (folder / name).write_text(text)
    err = _refused_once(capsys, folder, command)
    assert "not a run directory" in err, err


@pytest.mark.parametrize("command", [c for c in COMMANDS if c[0] != "train"], ids=lambda c: c[0])
def test_a_run_holding_a_file_of_the_users_is_refused_by_every_command(clone_run, capsys, command):
    run = clone_run()
    (run / "notes.txt").write_text("mine\n")
    err = _refused_once(capsys, run, command)
    assert "notes.txt" in err and "manifest does not list" in err, err


@pytest.mark.parametrize("command", ["report", "baseline"])
def test_report_and_baseline_write_nothing_into_an_empty_folder(tmp_path, capsys, command):
    folder = tmp_path / "empty"
    folder.mkdir()
    assert cli(command, "--run-dir", folder, *(["--out", tmp_path / "b"] if command == "baseline" else [])) == \
        EXIT_USAGE
    assert os.listdir(folder) == []
    assert "not a run directory" in capsys.readouterr().err


# --------------------------------------------------------------------------- what the tool wrote stays its own


def test_every_file_of_a_complete_run_is_listed_in_its_manifest(tiny_run):
    manifest = json.loads((tiny_run / MANIFEST).read_text())
    assert foreign_entries(os.listdir(tiny_run), manifest) == []
    assert set(os.listdir(tiny_run)) - BOOKKEEPING - {LOCK} <= set(manifest[LEDGER])


def test_a_stage_interrupted_at_its_start_keeps_its_last_files_claimed(clone_run, capsys):
    """A stage's new entry replaces its last artifacts before it runs: the ledger keeps their names, so a kill at
    that moment does not make the run's own files foreign to the next command (verify.json and the rest are listed as
    verify's artifacts only, in a run written before the ledger)."""
    run = clone_run()
    manifest = json.loads((run / MANIFEST).read_text())
    del manifest[LEDGER]  # a run written before the ledger: its files are listed as its stages' artifacts only
    (run / MANIFEST).write_text(json.dumps(manifest))
    rd = RunDir(run)
    with rd.locked(), pytest.raises(KeyboardInterrupt), rd.stage("verify"):
        raise KeyboardInterrupt
    assert json.loads((run / MANIFEST).read_text())["stages"]["verify"]["artifacts"] == {}
    assert cli("report", "--run-dir", run) == 0
    assert (run / "report.html").is_file()


def test_a_new_folder_is_claimed_with_its_manifest_before_anything_else_is_written(tmp_path):
    folder = tmp_path / "new"
    run = RunDir(folder)
    with run.locked():
        assert sorted(os.listdir(folder)) == [LOCK, MANIFEST]
    assert (folder / MANIFEST).is_file()


# --------------------------------------------------------------------------- report reads verify.json as compare does

STATUSES = st.sampled_from(["ok", "failed", "interrupted", "running", "skipped", None])
SHA = st.sampled_from(["a" * 64, "b" * 64, None])


@given(status=STATUSES, exit_code=st.sampled_from([None, 0, 1, 2, 4, 130]), recorded=SHA,
       actual=st.sampled_from(["a" * 64, "b" * 64]))
def test_verify_report_stands_only_as_the_file_a_finished_verify_wrote(status, exit_code, recorded, actual):
    from pipeline.core.verdicts import report_standing

    problem = report_standing(status, exit_code, recorded, actual)
    finished = status == "ok" or (status == "failed" and exit_code == 1)
    assert (problem is None) == (finished and recorded == actual), (status, exit_code, recorded, actual, problem)
    assert problem is None or isinstance(problem, str) and problem


def _gate_line(text: str) -> str:
    return next(line for line in text.splitlines() if "Precision gate" in line)


@pytest.mark.parametrize("damage", ["edited", "interrupted"])
def test_report_shows_a_stale_or_edited_verify_report_as_such_never_as_passed(clone_run, damage):
    run = clone_run()
    if damage == "edited":  # failed -> passed by hand: the bytes differ from what verify recorded
        report = json.loads((run / "verify.json").read_text())
        report["passed"] = True
        report["edited"] = "by hand"
        (run / "verify.json").write_text(json.dumps(report))
    else:  # a verify that broke off: its entry says interrupted, the old file is still there
        manifest = json.loads((run / MANIFEST).read_text())
        manifest["stages"]["verify"].update(status="interrupted", artifacts={})
        (run / MANIFEST).write_text(json.dumps(manifest))
    assert cli("report", "--run-dir", run) == 0
    for name in ("report.md", "report.html"):
        text = (run / name).read_text()
        assert "PASSED" not in _gate_line(text).upper().replace("NOT VERIFIED", ""), name
        assert "is not the report of a verify that finished here" in text, name
        assert "onnxrt_fp32" not in text.split("Precision gate", 1)[1].split("Benchmark", 1)[0], name


def test_report_shows_the_gate_of_a_verify_that_finished(clone_run):
    run = clone_run()
    assert cli("report", "--run-dir", run) == 0
    assert "PASSED" in _gate_line((run / "report.md").read_text())
