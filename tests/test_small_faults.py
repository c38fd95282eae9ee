"""The smaller faults of issue 21 (§5): each is one clear line with its exit code, or simply works."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from conftest import cli, run_cli
from pipeline.core import data
from pipeline.core.errors import EXIT_USAGE, DataError, UsageError

SMALL = ["data.source=imagefolder", "data.image_size=16", "data.batch_size=4", "train.epochs=1",
         "train.require_learning=false"]


def _png(path: Path, size=(8, 8)) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(len(str(path)))
    Image.fromarray(rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)).save(path)


def _errors(err: str) -> list[str]:
    assert "Traceback" not in err, err
    return [line for line in err.splitlines() if line.startswith("error:")]


def test_a_models_folder_in_the_current_directory_is_not_the_registry(tmp_path):
    (tmp_path / "models").mkdir()
    marker = tmp_path / "ran"
    (tmp_path / "models" / "__init__.py").write_text(f"open({str(marker)!r}, 'w').write('imported')\n")
    result = run_cli("models", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "resnet18" in result.stdout and not marker.exists()


def test_an_image_whose_resize_needs_gigabytes_is_one_error_naming_it(tmp_path):
    path = tmp_path / "long.png"
    Image.new("L", (5_000_000, 1)).save(path)  # passes the decompression-bomb limit (5 M pixels)
    with pytest.raises(DataError, match=r"cannot read image .*long\.png: 5000000x1 pixels; resizing .* GiB"):
        data.load_image(path, 16)
    assert data.load_image(_png_at(tmp_path / "ok.png", (64, 16)), 16).shape == (3, 16, 16)  # 4:1 is fine


def _png_at(path: Path, size) -> Path:
    _png(path, size)
    return path


def test_non_utf8_file_and_class_names_train(tmp_path, capsys):
    root = os.fsencode(tmp_path / "data")
    for cls in (b"cat", b"dog\xff"):
        for i in range(6):
            _png(Path(os.fsdecode(root + b"/" + cls + b"/img%d\xfe.png" % i)))
    run = tmp_path / "run"
    assert cli("train", "--model", "tiny_cnn", "--run-dir", run, *SMALL, f"data.path={tmp_path / 'data'}") == 0
    assert cli("train", "--model", "tiny_cnn", "--run-dir", run, *SMALL, f"data.path={tmp_path / 'data'}",
               "--resume") == 0


def test_a_std_that_is_zero_in_float32_is_refused(tmp_path, capsys):
    code = cli("train", "--model", "tiny_cnn", "--run-dir", tmp_path / "run", "model.std=[1e-300,0.2,0.2]")
    assert code == EXIT_USAGE
    (line,) = _errors(capsys.readouterr().err)
    assert "model.std values must be at least 1.18e-38 (float32's smallest normal number)" in line


def test_a_class_with_no_validation_image_is_warned(tmp_path, capsys):
    for i in range(8):
        _png(tmp_path / "data" / "many" / f"{i}.png")
    _png(tmp_path / "data" / "one" / "0.png")
    assert cli("train", "--model", "tiny_cnn", "--run-dir", tmp_path / "run", *SMALL,
               f"data.path={tmp_path / 'data'}", "data.val_fraction=0.25") == 0
    err = capsys.readouterr().err
    assert "data: class(es) with no validation image (too few images to hold one out): one;" in err


def test_a_run_directory_inside_the_data_is_said_so(tmp_path, capsys):
    for cls in ("a", "b"):
        for i in range(4):
            _png(tmp_path / "data" / cls / f"{i}.png")
    code = cli("train", "--model", "tiny_cnn", "--run-dir", tmp_path / "data" / "run1", *SMALL,
               f"data.path={tmp_path / 'data'}")
    assert code == EXIT_USAGE
    (line,) = _errors(capsys.readouterr().err)
    assert f"the run directory {tmp_path / 'data' / 'run1'} is inside the data" in line


def test_a_batch_the_machine_cannot_hold_is_refused_with_the_whole_reason(clone_run, capsys):
    from pipeline.benchmark import check_batch_sizes

    run = clone_run()
    capsys.readouterr()
    # 10**10 is past every batch's range now (issue 46: checked before any work, with the config's other ranges)
    assert cli("benchmark", "--run-dir", run, "benchmark.batch_sizes=[1,10000000000]") == EXIT_USAGE
    (line,) = _errors(capsys.readouterr().err)
    assert line == "error: config: benchmark.batch_sizes must all be between 1 and 65536", line
    with pytest.raises(UsageError) as err:  # within that range, the memory of the machine
        check_batch_sizes([1, 60_000], [3, 224, 224], 16 << 30)
    line = str(err.value)
    assert line.startswith("benchmark.batch_sizes: batch 60000 needs 33.6 GiB for its inputs alone (3x224x224 float32 "
                           "images), more than an eighth of this machine's 16 GiB of memory")
    assert line.endswith(": lower benchmark.batch_sizes")


def test_a_failed_measurement_keeps_the_whole_reason_not_openvinos_first_line():
    from pipeline.runtime.runners import one_line

    exc = RuntimeError("Exception from src/inference/src/cpp/core.cpp:117:\n"
                       "Exception from src/core/src/runtime/tensor.cpp:42:\nCannot allocate 1.2 TB\n")
    assert one_line(exc) == "RuntimeError: Cannot allocate 1.2 TB"


def test_markdown_reports_escape_what_comes_from_the_user(tmp_path):
    """verify.md, report.md and the step summary (verify.md appended) are all written by tables.markdown."""
    from pipeline import config, report
    from pipeline.core.run import RunDir
    from pipeline.reports import tables

    hostile = "<img src=x onerror=alert(1)>"
    section = tables.Section(f"Model {hostile}", paragraphs=[f"path {hostile}"], preformatted="a\n```\n<b>",
                             tables=[tables.Table(["name"], [[tables.Cell(hostile)], [tables.Cell("`x` " + hostile,
                                                                                                code=True)]])])
    text = tables.markdown([section])
    assert "<img" not in text.replace("`'x' <img src=x onerror=alert(1)>`", "") and "&lt;img src=x" in text
    assert "\n````\na\n```\n<b>\n````" in text  # the fence outlasts the text's own backticks
    run = RunDir(tmp_path / "run")
    run.manifest["model"] = hostile
    assert "<img" not in report.render_markdown(run, config.resolve())


def test_a_model_file_named_by_a_runs_config_is_not_run_before_the_card_refuses(clone_run, tmp_path, capsys):
    run = clone_run()
    marker = tmp_path / "ran"
    evil = tmp_path / "evil.py"
    evil.write_text(f"open({str(marker)!r}, 'w').write('imported')\ndef make(num_classes=10):\n    raise SystemExit\n")
    config_yaml = run / "config.yaml"
    config_yaml.write_text(config_yaml.read_text().replace("name: tiny_cnn", f"name: {evil}:make"))
    capsys.readouterr()
    assert cli("verify", "--run-dir", run) == EXIT_USAGE
    (line,) = _errors(capsys.readouterr().err)
    assert f"holds a trained 'tiny_cnn', but the config asks for '{evil}:make'" in line
    assert not marker.exists()


def test_a_full_disk_during_verify_is_the_documented_disk_full_line(clone_run, capsys, monkeypatch):
    import errno

    from pipeline.runtime import isolate

    run = clone_run()

    def full(path, arrays):  # the parent writes each batch into the child's exchange folder
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(isolate, "_save", full)
    capsys.readouterr()
    assert cli("verify", "--run-dir", run) == 4
    (line,) = _errors(capsys.readouterr().err)
    assert line.startswith("error: verify: no space left on device while writing ") and "in.npz" in line
    assert line.endswith("; free space and re-run")


def test_a_full_disk_in_the_child_comes_back_as_the_same_oserror():
    import errno

    from pipeline.core.errors import disk_full
    from pipeline.runtime import isolate

    exc = isolate._remote_error(isolate.RemoteError("OSError", "[Errno 28] No space left on device", errno.ENOSPC))
    assert isinstance(exc, OSError) and exc.errno == errno.ENOSPC and disk_full(exc) is not None
