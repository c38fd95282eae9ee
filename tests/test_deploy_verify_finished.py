"""deploy reads verify.json only as the report of a verify that finished here (issue 46): a verify that ended ok, or
failed its gate with exit 1 (every verdict reached). A verify that failed any other way (an error, exit 4; a missing
backend, exit 3; bad input, exit 2; no exit code at all) broke off, and its file is refused with one line and exit 2
whatever the verdicts in it say. A planted defect that accepted every failed verify survived the suite.

Kept apart from tests/test_deploy.py so that deploy's rewrite (issue 44) keeps it as it is."""

from __future__ import annotations

import json

import pytest

from conftest import cli

pytest.importorskip("tritonclient.grpc", reason="tritonclient[grpc] (the deploy extra, in the test extra) is not "
                    "installed")

REFUSED = "verify.json is not the report of a verify that finished here"


def _verify_ended(run, status: str, exit_code: int | None) -> None:
    """The manifest says verify ended so; verify.json and its recorded sha256 stay as they were."""
    path = run / "manifest.json"
    manifest = json.loads(path.read_text())
    entry = manifest["stages"]["verify"]
    entry["status"] = status
    entry.pop("exit_code", None)
    if exit_code is not None:
        entry["exit_code"] = exit_code
    path.write_text(json.dumps(manifest, indent=2))


@pytest.mark.parametrize(("status", "exit_code"), [("failed", 4), ("failed", 3), ("failed", 2), ("failed", 5),
                                                   ("failed", None), ("interrupted", None), ("running", None)])
def test_a_verify_that_broke_off_is_refused_whatever_its_file_says(clone_run, tmp_path, capfd, status, exit_code):
    run, out = clone_run(), tmp_path / "repo"
    _verify_ended(run, status, exit_code)
    assert cli("deploy", "--run-dir", run, "--out", out) == 2
    err = capfd.readouterr().err
    assert REFUSED in err and "re-run verify" in err and "Traceback" not in err
    assert len([line for line in err.splitlines() if line.startswith("error:")]) == 1
    assert not out.exists()  # refused before anything is written


@pytest.mark.parametrize(("status", "exit_code"), [("ok", None), ("failed", 1)])
def test_a_verify_that_finished_is_read(clone_run, tmp_path, capfd, status, exit_code):
    run, out = clone_run(), tmp_path / "repo"
    _verify_ended(run, status, exit_code)
    assert cli("deploy", "--run-dir", run, "--out", out) == 0
    assert REFUSED not in capfd.readouterr().err
