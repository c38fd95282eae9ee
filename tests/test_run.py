"""The run directory: atomic writes, the manifest, the lock, and per-stage bookkeeping (unit tests, no training)."""

from __future__ import annotations

import errno
import json
import os
import stat

import pytest

from pipeline.core import run as run_mod
from pipeline.core.errors import EXIT_RUNTIME, EXIT_USAGE, InputError, PipelineError, StageFailed, UsageError
from pipeline.core.run import MANIFEST, RunDir, atomic_path, atomic_write, read_json


def temporaries(directory) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp"))


# --------------------------------------------------------------------------- atomic writes


def test_atomic_write_replaces_the_file_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "a.txt"
    atomic_write(target, "old")
    atomic_write(target, b"new")
    assert target.read_bytes() == b"new"
    assert temporaries(tmp_path) == []


def test_atomic_path_keeps_the_old_file_when_the_writer_fails(tmp_path):
    target = tmp_path / "model.onnx"
    target.write_text("previous")
    with pytest.raises(ValueError, match="writer broke"):
        with atomic_path(target) as tmp:
            tmp.write_text("half a mod")
            raise ValueError("writer broke")
    assert target.read_text() == "previous"
    assert temporaries(tmp_path) == []


def test_atomic_path_keeps_the_old_file_on_ctrl_c(tmp_path):
    target = tmp_path / "checkpoint.pt"
    target.write_text("previous")
    with pytest.raises(KeyboardInterrupt):
        with atomic_path(target) as tmp:
            tmp.write_text("torn")
            raise KeyboardInterrupt
    assert target.read_text() == "previous"
    assert temporaries(tmp_path) == []


def test_full_disk_is_one_clear_error_and_nothing_is_replaced(tmp_path):
    target = tmp_path / "model.safetensors"
    target.write_text("previous")
    with pytest.raises(StageFailed, match="no space left on device") as info:
        with atomic_path(target) as tmp:
            tmp.write_text("partial")
            raise OSError(errno.ENOSPC, "No space left on device")
    assert info.value.exit_code == EXIT_RUNTIME
    assert "nothing was replaced" in str(info.value) and str(target) in str(info.value)
    assert target.read_text() == "previous"
    assert temporaries(tmp_path) == []


@pytest.mark.parametrize("error", [
    RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534"),  # torch.save, full disk
    Exception("Error while serializing: I/O error: No space left on device (os error 28)"),  # safetensors
])
def test_full_disk_reported_by_a_library_in_its_own_words(tmp_path, monkeypatch, error):
    """torch.save and safetensors do not raise OSError on a full disk; the message must still say so."""
    target = tmp_path / "checkpoint.pt"
    target.write_text("previous")
    if isinstance(error, RuntimeError):  # torch's message does not say why: the file system does
        real = os.statvfs

        class Full:
            def __init__(self, st):
                self.f_bavail = 0
                self.st = st

        monkeypatch.setattr(run_mod.os, "statvfs", lambda p: Full(real(p)))
    with pytest.raises(StageFailed, match="no space left on device"):
        with atomic_path(target) as tmp:
            tmp.write_text("partial")
            raise error
    assert target.read_text() == "previous"
    assert temporaries(tmp_path) == []


def test_other_writer_errors_are_not_mistaken_for_a_full_disk(tmp_path):
    with pytest.raises(RuntimeError, match="exporter"):
        with atomic_path(tmp_path / "x"):
            raise RuntimeError("exporter failed")
    assert temporaries(tmp_path) == []


def test_unwritable_directory_is_a_usage_error(tmp_path, monkeypatch):
    def refuse(*args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(run_mod.tempfile, "mkstemp", refuse)
    with pytest.raises(UsageError, match="cannot write .*a.txt: Permission denied") as info:
        atomic_write(tmp_path / "a.txt", "x")
    assert info.value.exit_code == EXIT_USAGE


def test_written_files_get_normal_permissions_not_mkstemps_0600(tmp_path):
    old = os.umask(0o022)
    try:
        atomic_write(tmp_path / "new.json", "{}")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "new.json").stat().st_mode) == 0o644
    existing = tmp_path / "kept.txt"
    existing.write_text("x")
    existing.chmod(0o640)
    atomic_write(existing, "y")
    assert stat.S_IMODE(existing.stat().st_mode) == 0o640


def test_read_json_of_a_corrupt_file_names_it(tmp_path):
    path = tmp_path / "verify.json"
    path.write_text('{"candidates": [')
    with pytest.raises(InputError, match="verify report is unreadable or corrupt"):
        read_json(path, "verify report")


# --------------------------------------------------------------------------- manifest


def test_manifest_is_created_and_saved_atomically(tmp_path):
    run = RunDir(tmp_path / "run")
    run.manifest["model"] = "tiny_cnn"
    run.save_manifest()
    saved = json.loads((tmp_path / "run" / MANIFEST).read_text())
    assert saved["schema"] == run_mod.SCHEMA and saved["model"] == "tiny_cnn" and "updated" in saved
    assert RunDir(tmp_path / "run").manifest["model"] == "tiny_cnn"


def test_manifest_survives_a_failed_save(tmp_path, monkeypatch):
    run = RunDir(tmp_path)
    run.manifest["model"] = "first"
    run.save_manifest()
    before = (tmp_path / MANIFEST).read_bytes()

    def full(src, dst):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(run_mod.os, "replace", full)
    run.manifest["model"] = "second"
    with pytest.raises(StageFailed, match="manifest.json: no space left"):
        run.save_manifest()
    assert (tmp_path / MANIFEST).read_bytes() == before
    assert json.loads(before)["model"] == "first"
    assert temporaries(tmp_path) == []


def test_corrupt_manifest_is_an_input_error(tmp_path):
    (tmp_path / MANIFEST).write_text("{not json")
    with pytest.raises(InputError, match="manifest is unreadable or corrupt"):
        RunDir(tmp_path)
    (tmp_path / MANIFEST).write_text(json.dumps({"some": "other tool"}))
    with pytest.raises(InputError, match="is not a pipeline manifest"):
        RunDir(tmp_path)


def test_run_dir_that_is_a_file(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(UsageError, match="exists and is not a directory"):
        RunDir(tmp_path / "file")


def test_missing_run_dir_without_create(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        RunDir(tmp_path / "absent", create=False)


def test_require_names_the_stage_to_run_first(tmp_path):
    run = RunDir(tmp_path)
    with pytest.raises(InputError, match=r"verify needs model\.onnx .* which the export stage writes; "
                                         r"run `python -m pipeline export --run-dir"):
        run.require("model.onnx", "export", "verify")


# --------------------------------------------------------------------------- lock


def test_lock_refuses_a_second_holder_and_names_the_pid(tmp_path):
    first, second = RunDir(tmp_path), RunDir(tmp_path)
    with first.locked():
        assert (tmp_path / ".lock").read_text() == str(os.getpid())
        with pytest.raises(UsageError, match=rf"in use by another pipeline process \(pid {os.getpid()}\)") as info:
            with second.locked():
                pass
        assert info.value.exit_code == EXIT_USAGE
    with second.locked():  # released: the next one gets it
        pass


def test_lock_is_released_when_the_body_fails(tmp_path):
    run = RunDir(tmp_path)
    with pytest.raises(RuntimeError):
        with run.locked():
            raise RuntimeError("boom")
    with RunDir(tmp_path).locked():
        pass


def test_lock_removes_temporaries_left_by_a_killed_process(tmp_path):
    stale = [tmp_path / ".checkpoint.pt.x1y2z3.tmp", tmp_path / ".manifest.json.abc.tmp"]
    for path in stale:
        path.write_bytes(b"torn")
    keep = [tmp_path / "notes.tmp", tmp_path / ".lock", tmp_path / "model.onnx"]
    for path in keep:
        path.write_bytes(b"mine")
    run = RunDir(tmp_path)  # a run whose ledger lists the two files (the run directory holds nothing else)
    run.manifest["files"] = ["model.onnx", "notes.tmp"]
    run.save_manifest()
    with RunDir(tmp_path).locked():
        pass
    assert not any(p.exists() for p in stale)
    assert all(p.exists() for p in keep)


# --------------------------------------------------------------------------- stage bookkeeping


def on_disk(tmp_path) -> dict:
    return json.loads((tmp_path / MANIFEST).read_text())["stages"]


def test_stage_ok_records_times_and_artifacts(tmp_path):
    run = RunDir(tmp_path)
    with run.stage("export", fingerprint="abc") as record:
        assert on_disk(tmp_path)["export"]["status"] == "running"
        (tmp_path / "model.onnx").write_bytes(b"onnx")
        record.artifact("model.onnx")
        record.details["opset"] = 18
    entry = on_disk(tmp_path)["export"]
    assert entry["status"] == "ok" and entry["fingerprint"] == "abc"
    assert entry["artifacts"]["model.onnx"]["bytes"] == 4
    assert entry["details"] == {"opset": 18}
    assert entry["started"] <= entry["ended"] and entry["duration_s"] >= 0


def test_stage_skipped_keeps_its_reason(tmp_path):
    run = RunDir(tmp_path)
    with run.stage("build") as record:
        record.skip("TensorRT is not installed")
    entry = on_disk(tmp_path)["build"]
    assert entry["status"] == "skipped" and entry["reason"] == "TensorRT is not installed"


@pytest.mark.parametrize("error, status, code", [
    (InputError("model.onnx is corrupt"), "failed", EXIT_USAGE),
    (StageFailed("exporter crashed"), "failed", EXIT_RUNTIME),
    (ZeroDivisionError("unexpected"), "failed", None),
    (KeyboardInterrupt(), "interrupted", None),
])
def test_stage_failure_statuses(tmp_path, error, status, code):
    run = RunDir(tmp_path)
    with pytest.raises(type(error)):
        with run.stage("train"):
            raise error
    entry = on_disk(tmp_path)["train"]
    assert entry["status"] == status and "ended" in entry
    if code is not None:
        assert entry["exit_code"] == code and entry["error"] == str(error)
    elif status == "failed":
        assert entry["error"] == "ZeroDivisionError: unexpected"
    else:
        assert entry["error"] == "interrupted by the user"


OPENVINO_CALLBACK_ERROR = ("Check 'false' failed at src/frontends/common/src/frontend.cpp:53:\nConverting input model\n"
                           "KeyboardInterrupt: <EMPTY MESSAGE>")  # what OpenVINO raises for Ctrl-C in its callback


@pytest.fixture
def interrupt_requested():
    """The command line's SIGINT/SIGTERM handler has run (it sets the event, then raises KeyboardInterrupt)."""
    from pipeline.core.errors import interrupt_requested as event

    event.set()
    yield event
    event.clear()


@pytest.mark.parametrize("error", [RuntimeError(OPENVINO_CALLBACK_ERROR),
                                   StageFailed("AutoCast FP16 conversion failed: "
                                               f"RuntimeError: {OPENVINO_CALLBACK_ERROR}")],
                         ids=["library's own type", "wrapped by the stage"])
def test_an_error_raised_after_ctrl_c_marks_the_stage_interrupted(tmp_path, interrupt_requested, error):
    """Issue 30, §3: SIGINT 8 s into tune, in OpenVINO's model reading, was exit 4 and "failed": OpenVINO turns the
    KeyboardInterrupt raised in its Python callback into a RuntimeError that keeps only its name, with no chain."""
    run = RunDir(tmp_path)
    with pytest.raises(KeyboardInterrupt) as raised, run.stage("tune"):
        raise error
    assert raised.value.__cause__ is error  # the library's error stays readable with --debug
    entry = on_disk(tmp_path)["tune"]
    assert entry["status"] == "interrupted" and entry["error"] == "interrupted by the user"
    assert "exit_code" not in entry and "ended" in entry


def test_an_error_whose_chain_holds_a_keyboardinterrupt_is_the_interrupt(tmp_path):
    """Without the command line's handler (``run_all`` from Python, a worker thread): the chain says it."""
    run = RunDir(tmp_path)
    with pytest.raises(KeyboardInterrupt), run.stage("verify"):
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as exc:
            raise RuntimeError("the runtime gave up") from exc
    assert on_disk(tmp_path)["verify"]["status"] == "interrupted"


def test_a_stage_whose_library_swallowed_the_interrupt_does_not_end_ok(tmp_path, interrupt_requested):
    """A library that turned Ctrl-C into a failed row of its own and went on: the stage still ends interrupted."""
    run = RunDir(tmp_path)
    with pytest.raises(KeyboardInterrupt), run.stage("verify"):
        pass
    assert on_disk(tmp_path)["verify"]["status"] == "interrupted"


def test_the_word_keyboardinterrupt_alone_is_not_an_interrupt(tmp_path):
    """No interrupt was requested and none is in the chain: the error is a failure, whatever its text says."""
    run = RunDir(tmp_path)
    with pytest.raises(RuntimeError), run.stage("tune"):
        raise RuntimeError(OPENVINO_CALLBACK_ERROR)
    assert on_disk(tmp_path)["tune"]["status"] == "failed"


def test_stage_error_is_not_replaced_when_the_manifest_cannot_be_written(tmp_path, monkeypatch):
    """Disk full: the stage's own error reaches the user, not the manifest's."""
    run = RunDir(tmp_path)
    with pytest.raises(StageFailed, match="model.onnx: no space left"):
        with run.stage("export"):
            def full(src, dst):
                raise OSError(errno.ENOSPC, "No space left on device")

            monkeypatch.setattr(run_mod.os, "replace", full)
            atomic_write(tmp_path / "model.onnx", b"x")
    assert on_disk(tmp_path)["export"]["status"] == "running"  # could not be recorded; nothing torn
    assert temporaries(tmp_path) == []


def test_errors_are_pipeline_errors():
    assert issubclass(StageFailed, PipelineError) and issubclass(InputError, UsageError)
