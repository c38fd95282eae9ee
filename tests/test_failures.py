"""Failure behaviour: every way a run can go wrong ends in one clear line and the documented exit code.

Each case asserts the message (a meaningful substring), the exit code (or the state left behind), exactly
one ``error:`` line family on stderr, and never a traceback. Most cases run the command line in-process on
a copy of the session's tiny run (``clone_run``); the cases that need a real process (SIGKILL, Ctrl-C, a
second process holding the lock, a read-only directory) start ``python -m pipeline``.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import pickle
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import ROOT, TINY, cli, listed
from pipeline import config
from pipeline.core import config_schema, onnx_io
from pipeline.core.errors import (
    EXIT_BACKEND_UNAVAILABLE,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_RUNTIME,
    EXIT_USAGE,
    ConfigError,
    InputError,
)
from pipeline.runtime.builders import tensorrt_engine

# --------------------------------------------------------------------------- helpers


def run_main(capsys, *args) -> tuple[int, str]:
    """The command line in this process (quiet): exit code and stderr."""
    capsys.readouterr()
    code = cli("-q", *args)
    return code, capsys.readouterr().err


def assert_error(err: str, *fragments: str, family: str | None = None) -> list[str]:
    """One ``error: <where>:`` family on stderr, no traceback, and every fragment in it; returns the lines."""
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert lines, f"no error line in:\n{err}"
    prefixes = {line.split(":", 2)[1].strip() for line in lines}
    assert len(prefixes) == 1, f"more than one error family: {lines}"
    if family is not None:
        assert prefixes == {family}, lines
    if len(lines) > 1:
        assert prefixes == {"config"}, f"only config problems are listed one per line: {lines}"
    text = "\n".join(lines)
    for fragment in fragments:
        assert fragment in text, f"{fragment!r} not in:\n{text}"
    return lines


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def snapshot(run: Path) -> dict[str, str]:
    return {p.name: sha(p) for p in sorted(run.iterdir()) if p.is_file() and p.name != ".lock"}


def temporaries(run: Path) -> list[str]:
    return sorted(p.name for p in run.rglob("*.tmp"))


def manifest(run: Path) -> dict:
    return json.loads((run / "manifest.json").read_text())


def stage(run: Path, name: str) -> dict:
    return manifest(run)["stages"].get(name, {})


def tiny_args(run_dir: Path, *extra: str) -> list[str]:
    return ["--model", "tiny_cnn", "--run-dir", str(run_dir), *TINY, *extra]


def no_tensorrt() -> None:
    ok, _ = tensorrt_engine.availability()
    if ok:
        pytest.skip("TensorRT and a GPU are available here, so nothing is missing")


# --------------------------------------------------------------------------- configuration and usage


def test_unknown_model(capsys, tmp_path):
    code, err = run_main(capsys, "train", "--model", "resnet19", "--run-dir", tmp_path / "r")
    assert code == EXIT_USAGE
    assert_error(err, "unknown model 'resnet19'", "known models:", "tiny_cnn", family="train")


@pytest.mark.parametrize("text, fragment", [
    ("train:\n  epochs: [1\n", "malformed YAML (line 3, column 1)"),
    ("train:\n\tepochs: 2\n", "malformed YAML (line 2"),
    ("- train\n- data\n", "top level must be a mapping of sections, got list"),
])
def test_malformed_yaml(capsys, tmp_path, text, fragment):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(text)
    code, err = run_main(capsys, "train", "--run-dir", tmp_path / "r", "--config", cfg)
    assert code == EXIT_USAGE
    assert_error(err, str(cfg), fragment, family="config")
    assert not (tmp_path / "r").exists()  # nothing starts before the config is valid


def test_yaml_tags_never_construct_python_objects(capsys, tmp_path):
    marker = tmp_path / "marker"
    cfg = tmp_path / "evil.yaml"
    cfg.write_text(f"train: !!python/object/apply:os.system ['touch {marker}']\n")
    code, err = run_main(capsys, "config", "--config", cfg)
    assert code == EXIT_USAGE
    assert_error(err, "malformed YAML", "python/object/apply", family="config")
    assert not marker.exists()


def test_unknown_and_mistyped_keys_all_listed_with_suggestions(capsys, tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("trian:\n  epochs: 2\ndata:\n  batchsize: 8\n")
    code, err = run_main(capsys, "train", "--run-dir", tmp_path / "r", "--config", cfg,
                         "train.epoch=3", "verify.fp16.atoll=0.1", "benchmarks.trials=2")
    assert code == EXIT_USAGE
    lines = assert_error(err, "trian: unknown key (did you mean train?)",
                         "data.batchsize: unknown key (did you mean data.batch_size?)",
                         "train.epoch: unknown key (did you mean train.epochs?)",
                         "verify.fp16.atoll: unknown key (did you mean verify.fp16.atol?)",
                         "benchmarks: unknown key (did you mean benchmark?)", family="config")
    assert len(lines) == 5
    assert not (tmp_path / "r").exists()


def test_wrong_types_and_ranges_all_listed_at_once(capsys, tmp_path):
    code, err = run_main(capsys, "train", "--run-dir", tmp_path / "r", "train.epochs=-1", "data.batch_size=0",
                         "verify.fp16.atol=-0.1", "train.lr=fast", "data.augment=maybe", "export.opset=12.5")
    assert code == EXIT_USAGE
    lines = assert_error(err, "train.epochs: input should be greater than or equal to 1 (got -1)",
                         "data.batch_size: input should be greater than or equal to 1 (got 0)",
                         "verify.fp16: atol must be >= 0",
                         "train.lr: input should be a valid number (got 'fast')",
                         "data.augment: input should be a valid boolean (got 'maybe')",
                         "export.opset: input should be a valid integer (got 12.5)", family="config")
    assert len(lines) == 6
    assert not (tmp_path / "r").exists()


def test_malformed_overrides_listed_together(capsys, tmp_path):
    code, err = run_main(capsys, "config", "--run-dir", tmp_path, "--", "train.epochs", "1abc=3",
                         "data.image_size=[16")
    assert code == EXIT_USAGE
    lines = assert_error(err, "override 'train.epochs': expected key=value",
                         "'1abc' is not a dotted key", "override data.image_size: malformed YAML",
                         family="config")
    assert len(lines) == 3


def test_run_dir_is_a_file(capsys, tmp_path):
    path = tmp_path / "file"
    path.write_text("not a directory")
    for command in ("train", "verify", "all"):
        code, err = run_main(capsys, command, "--run-dir", path, "--model", "tiny_cnn")
        assert code == EXIT_USAGE
        assert_error(err, f"run directory {path} exists and is not a directory")
    assert path.read_text() == "not a directory"


def _restricted_prefix(tmp_path: Path) -> list[str]:
    """A command prefix under which a 0o555 directory is really read-only (root ignores mode bits)."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root, where chmod does not stop writes, and setpriv (util-linux) is not installed "
                    "to drop CAP_DAC_OVERRIDE")
    probe = tmp_path / "probe"
    probe.mkdir()
    probe.chmod(0o555)
    prefix = [setpriv, "--bounding-set=-dac_override,-dac_read_search", "--"]
    try:
        result = subprocess.run([*prefix, sys.executable, "-c", f"open({str(probe / 'x')!r}, 'w')"],
                                capture_output=True, text=True, timeout=60)
    finally:
        probe.chmod(0o755)
    if result.returncode == 0:
        pytest.skip("running as root and dropping CAP_DAC_OVERRIDE with setpriv does not make a 0o555 directory "
                    "read-only here")
    return prefix


def test_read_only_run_dir(clone_run, tmp_path):
    prefix = _restricted_prefix(tmp_path)
    run = clone_run()
    before = snapshot(run)
    parent = tmp_path / "locked"
    parent.mkdir()
    run.chmod(0o555)
    parent.chmod(0o555)
    try:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        existing = subprocess.run([*prefix, sys.executable, "-m", "pipeline", "-q", "export", "--run-dir", str(run)],
                                  cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
        missing = subprocess.run([*prefix, sys.executable, "-m", "pipeline", "-q", "train",
                                  *tiny_args(parent / "new")], cwd=ROOT, env=env, capture_output=True, text=True,
                                 timeout=120)
    finally:
        run.chmod(0o755)
        parent.chmod(0o755)
    assert existing.returncode == EXIT_USAGE, existing.stderr
    assert_error(existing.stderr, f"run directory {run} is not writable", family="export")
    assert snapshot(run) == before
    assert missing.returncode == EXIT_USAGE, missing.stderr
    assert_error(missing.stderr, f"cannot create run directory {parent / 'new'}", "Permission denied",
                 family="train")
    assert not (parent / "new").exists()


@pytest.mark.parametrize("command, remove, fragment", [
    ("verify", None, "verify needs model.json in {run}, which the train stage writes; "
                     "run `python -m pipeline train --run-dir {run}` first"),
    ("export", None, "export needs model.json in {run}, which the train stage writes"),
    ("benchmark", None, "benchmark needs model.json in {run}"),
    ("verify", "model.onnx", "verify needs model.onnx in {run}, which the export stage writes; "
                             "run `python -m pipeline export --run-dir {run}` first"),
    ("export", "model.safetensors", "export needs model.safetensors in {run}, which the train stage writes"),
])
def test_stage_inputs_missing_names_the_stage_to_run_first(capsys, tmp_path, clone_run, command, remove, fragment):
    if remove is None:
        run = tmp_path / "empty"
        run.mkdir()
    else:
        run = clone_run()
        (run / remove).unlink()
    code, err = run_main(capsys, command, "--run-dir", run, "--model", "tiny_cnn")
    assert code == EXIT_USAGE
    assert_error(err, fragment.format(run=run), family=command)
    assert stage(run, command)["status"] == "failed" and stage(run, command)["exit_code"] == EXIT_USAGE


def test_report_on_a_missing_run_dir(capsys, tmp_path):
    code, err = run_main(capsys, "report", "--run-dir", tmp_path / "absent", "--model", "tiny_cnn")
    assert code == EXIT_USAGE
    assert_error(err, f"run directory {tmp_path / 'absent'} does not exist", family="report")
    assert not (tmp_path / "absent").exists()


# --------------------------------------------------------------------------- corrupt stage inputs


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _foreign_checkpoint(path: Path) -> None:
    import torch

    torch.save({"weights": torch.zeros(3)}, path)


@pytest.mark.parametrize("damage, fragment", [
    (_truncate, "checkpoint.pt: checkpoint is truncated or corrupt"),
    (lambda p: p.write_bytes(b""), "checkpoint.pt: checkpoint is truncated or corrupt (EOFError"),
    (lambda p: p.write_bytes(random.Random(0).randbytes(4096)), "checkpoint.pt: checkpoint refused: not a "
                                                                 "weights-only PyTorch file"),
    (_foreign_checkpoint, "checkpoint.pt is not a pipeline checkpoint; re-run train without --resume"),
    (lambda p: p.unlink(), "nothing to resume: {run}/checkpoint.pt does not exist"),
], ids=["truncated", "empty", "garbage", "foreign", "missing"])
def test_resume_from_a_bad_checkpoint(capsys, clone_run, damage, fragment):
    run = clone_run()
    weights = sha(run / "model.safetensors")
    damage(run / "checkpoint.pt")
    code, err = run_main(capsys, "train", "--resume", "--run-dir", run)
    assert code == EXIT_USAGE
    lines = assert_error(err, fragment.format(run=run), family="train")
    assert len(lines) == 1 and "weights_only` set to `False`" not in err and "\x1b[" not in err
    assert stage(run, "train")["status"] == "failed"
    assert sha(run / "model.safetensors") == weights  # the trained weights are untouched


@pytest.mark.parametrize("command", ["export", "verify"])
@pytest.mark.parametrize("damage", [_truncate, lambda p: p.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{]")],
                         ids=["truncated", "bad-header"])
def test_corrupt_weights(capsys, clone_run, command, damage):
    run = clone_run()
    damage(run / "model.safetensors")
    code, err = run_main(capsys, command, "--run-dir", run)
    assert code == EXIT_USAGE
    assert_error(err, f"{run / 'model.safetensors'} is truncated or corrupt", "re-run train", family=command)


def test_weights_of_another_model(capsys, clone_run):
    import torch
    from safetensors.torch import save_file

    run = clone_run()
    save_file({"fc.weight": torch.zeros(2, 2)}, str(run / "model.safetensors"))
    code, err = run_main(capsys, "export", "--run-dir", run)
    assert code == EXIT_USAGE
    assert_error(err, "model.safetensors does not match model 'tiny_cnn'", family="export")


@pytest.mark.parametrize("content, fragment", [
    ("{not json", "model card is unreadable or corrupt"),
    (json.dumps({"model": "tiny_cnn"}), "is not a pipeline model card; re-run train"),
    (None, "spec.input_size [3, 100000, 100000] is not [channels, height, width]"),
])
def test_corrupt_model_card(capsys, clone_run, content, fragment):
    run = clone_run()
    if content is None:  # a tampered card must not size tensors
        card = json.loads((run / "model.json").read_text())
        card["spec"]["input_size"] = [3, 100000, 100000]
        content = json.dumps(card)
    (run / "model.json").write_text(content)
    code, err = run_main(capsys, "verify", "--run-dir", run)
    assert code == EXIT_USAGE
    assert_error(err, fragment, family="verify")


def test_corrupt_manifest(capsys, clone_run):
    run = clone_run()
    (run / "manifest.json").write_text('{"schema": "pipeline.manifest/1", "stages": {')
    code, err = run_main(capsys, "verify", "--run-dir", run)
    assert code == EXIT_USAGE
    assert_error(err, "manifest.json: manifest is unreadable or corrupt")


@pytest.mark.parametrize("name, fragment", [
    ("model.onnx", "model.onnx: ONNX model is truncated or corrupt"),
    ("model.fp16.onnx", "model.fp16.onnx: FP16 ONNX model is truncated or corrupt"),
])
def test_corrupt_onnx(capsys, clone_run, name, fragment):
    run = clone_run()
    (run / name).write_bytes((run / name).read_bytes()[:100])
    code, err = run_main(capsys, "verify", "--run-dir", run)
    assert code == EXIT_USAGE
    assert_error(err, fragment, "re-run export", family="verify")


def test_corrupt_onnx_fails_benchmark(capsys, clone_run):
    run = clone_run()
    (run / "model.onnx").write_bytes((run / "model.onnx").read_bytes()[:100])
    code, err = run_main(capsys, "benchmark", "--run-dir", run)
    assert code == EXIT_USAGE
    assert_error(err, "model.onnx", family="benchmark")


def test_onnx_of_another_image_size(capsys, clone_run):
    """model.onnx replaced by an export at 24x24 while the model card says 16x16."""
    import torch

    from pipeline import config as config_mod
    from pipeline.core import modeling
    from pipeline.core.run import RunDir
    from pipeline.export import export_onnx

    run = clone_run()
    cfg = config_mod.resolve(config_mod.load_yaml_file(run / "config.yaml"))
    model, card = modeling.load_trained(cfg, RunDir(run), "test")
    export_onnx(model, torch.zeros(1, 3, 24, 24), run / "model.onnx", opset=18, exporter="torchscript",
                input_name="input", output_name="logits", dynamic_batch=True)
    code, err = run_main(capsys, "verify", "--run-dir", run)
    assert code == EXIT_USAGE
    assert_error(err, "model.onnx input 'input' has shape ['batch', 3, 24, 24], but the model expects "
                      "[batch, 3, 16, 16]; re-run export", family="verify")


# --------------------------------------------------------------------------- data


def _png(path: Path, seed: int = 0) -> None:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    Image.frombytes("RGB", (8, 8), bytes(rng.randrange(256) for _ in range(8 * 8 * 3))).save(path)


def _image_folder(root: Path, case: str) -> str:
    root.mkdir()
    if case == "no classes":
        (root / "readme.md").write_text("images go in class folders")
        return f"image folder {root} has no class sub-folders"
    for cls in ("cat", "dog"):
        for i in range(3):
            _png(root / cls / f"{i}.png", seed=i)
    if case == "empty class":
        (root / "bird").mkdir()
        return f"class folder {root / 'bird'} contains no images"
    if case == "corrupt image":
        (root / "dog" / "3.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 40)
        return f"cannot read image {root / 'dog' / '3.png'}"
    if case == "non-image file":
        (root / "cat" / "labels.csv").write_text("a,b\n")
        return f"{root / 'cat' / 'labels.csv'} is not an image file"
    if case == "missing":
        shutil.rmtree(root)
        return f"image folder {root} does not exist"
    raise AssertionError(case)


@pytest.mark.parametrize("case", ["no classes", "empty class", "corrupt image", "non-image file", "missing"])
def test_bad_image_folder(capsys, tmp_path, case):
    fragment = _image_folder(tmp_path / "images", case)
    code, err = run_main(capsys, "train", *tiny_args(tmp_path / "r"), "data.source=imagefolder",
                         f"data.path={tmp_path / 'images'}")
    assert code == EXIT_USAGE
    assert_error(err, fragment, family="train")
    assert not (tmp_path / "r" / "checkpoint.pt").exists()


class _Evil:
    """Unpickling this would create ``MARKER``: the payload of a malicious pickle."""

    marker: Path

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def _evil(marker: Path) -> _Evil:
    obj = _Evil()
    obj.marker = marker
    return obj


def test_cifar_with_a_bad_checksum(capsys, tmp_path):
    root = tmp_path / "cifar" / "cifar-10-batches-py"
    root.mkdir(parents=True)
    marker = tmp_path / "marker"
    # A pickle with a payload under a CIFAR name: the checksum is checked before anything is unpickled.
    (root / "batches.meta").write_bytes(pickle.dumps({"label_names": _evil(marker)}, protocol=2))
    for name in cifar_batches():
        (root / name).write_bytes(b"not cifar")
    code, err = run_main(capsys, "train", *tiny_args(tmp_path / "r"), "data.source=cifar10",
                         f"data.path={tmp_path / 'cifar'}")
    assert code == EXIT_USAGE
    assert_error(err, f"CIFAR-10 file {root / 'batches.meta'} has md5", "expected 5ff9c542aee3614f3951f8cda6e48888",
                 "the file is corrupt or not CIFAR-10", family="train")
    assert not marker.exists()


def cifar_batches() -> list[str]:
    return [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]


def test_cifar_missing(capsys, tmp_path):
    code, err = run_main(capsys, "train", *tiny_args(tmp_path / "r"), "data.source=cifar10",
                         f"data.path={tmp_path / 'nowhere'}")
    assert code == EXIT_USAGE
    assert_error(err, f"CIFAR-10 directory {tmp_path / 'nowhere'} does not exist", family="train")


# --------------------------------------------------------------------------- full disk


def _fail_fsync_for(monkeypatch, name: str) -> None:
    """fsync of the temporary file behind ``name`` fails with ENOSPC (where a full disk shows up)."""
    real = os.fsync

    def fsync(fd):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            target = ""
        if os.path.basename(target).startswith(f".{name}.") and target.endswith(".tmp"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd)

    monkeypatch.setattr(os, "fsync", fsync)


def test_disk_full_while_writing_an_artifact(capsys, clone_run, monkeypatch):
    if not Path("/proc/self/fd").is_dir():
        pytest.skip("needs /proc/self/fd to tell which file is being written")
    run = clone_run()
    before = sha(run / "model.onnx")
    _fail_fsync_for(monkeypatch, "model.onnx")
    code, err = run_main(capsys, "export", "--run-dir", run)
    assert code == EXIT_RUNTIME
    lines = assert_error(err, f"cannot write {run / 'model.onnx'}: no space left on device (nothing was replaced)",
                         family="export")
    assert len(lines) == 1
    assert sha(run / "model.onnx") == before
    assert temporaries(run) == []
    entry = stage(run, "export")
    assert entry["status"] == "failed" and entry["exit_code"] == EXIT_RUNTIME


def test_disk_full_while_saving_a_checkpoint(capsys, clone_run, monkeypatch):
    """torch.save reports a full disk as a bare RuntimeError; the user still reads 'no space left'."""
    import torch

    run = clone_run()
    real_save = torch.save

    def save(obj, f, *args, **kwargs):
        if str(f).endswith(".tmp") and ".checkpoint.pt." in str(f):
            Path(f).write_bytes(b"PK\x03\x04partial")
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534")
        return real_save(obj, f, *args, **kwargs)

    class Full:
        f_bavail = 0

    monkeypatch.setattr(torch, "save", save)
    monkeypatch.setattr("pipeline.core.run.os.statvfs", lambda path: Full())
    code, err = run_main(capsys, "train", "--run-dir", run)
    assert code == EXIT_RUNTIME
    assert_error(err, f"cannot write {run / 'checkpoint.pt'}: no space left on device", family="train")
    assert temporaries(run) == []
    assert stage(run, "train")["status"] == "failed"


# --------------------------------------------------------------------------- required backends


@pytest.mark.parametrize("command, require, fragment, failed_stage, ran", [
    ("build", "tensorrt", "TensorRT engine required but", "build", False),
    ("verify", "tensorrt", "required candidate(s) could not run: tensorrt_fp16:", "verify", True),
    ("verify", "cuda", "CUDA required but", "verify", False),
    ("all", "tensorrt", "TensorRT engine required but", "build", False),
])
def test_required_backend_unavailable(capsys, clone_run, command, require, fragment, failed_stage, ran):
    no_tensorrt()
    run = clone_run()
    before = manifest(run)["stages"]
    code, err = run_main(capsys, command, "--run-dir", run, "--require", require)
    assert code == EXIT_BACKEND_UNAVAILABLE
    assert_error(err, fragment, family=failed_stage)
    if ran:  # verify ran, and its report names the required candidate that could not
        entry = stage(run, failed_stage)
        assert entry["status"] == "failed" and entry["exit_code"] == EXIT_BACKEND_UNAVAILABLE
    else:  # a requirement is checked before the stage starts: no stage's record changed
        assert manifest(run)["stages"] == before


# --------------------------------------------------------------------------- engines (unit: no TensorRT needed)


PLATFORM = {"tensorrt": "10.13.0", "gpu": "NVIDIA H200", "compute_capability": "9.0"}


def _engine(tmp_path: Path, **changes) -> Path:
    engine = tmp_path / tensorrt_engine.FP16_ENGINE
    engine.write_bytes(b"\x00serialized engine\x00")
    sidecar = {"schema": tensorrt_engine.SIDECAR_SCHEMA, "built_by": "pipeline 0.1.0",
               "engine": tensorrt_engine.FP16_ENGINE, "sha256": sha(engine), **PLATFORM, **changes}
    (tmp_path / tensorrt_engine.SIDECAR).write_text(json.dumps(sidecar))
    from pipeline.core.run import RunDir

    run = RunDir(tmp_path)  # as the build stage records it: only recorded engines are loaded
    run.manifest["stages"]["build"] = {"status": "ok", "artifacts": {
        tensorrt_engine.FP16_ENGINE: {"sha256": sha(engine), "bytes": engine.stat().st_size}}}
    run.manifest["files"] = sorted({*run.manifest.get("files", []), tensorrt_engine.SIDECAR})
    run.save_manifest()
    return engine


@pytest.mark.parametrize("tamper, fragment", [
    (lambda t: (t / tensorrt_engine.FP16_ENGINE).write_bytes(b"\x00serialized engine\x00 + payload"),
     "changed after the build"),
    (lambda t: (t / tensorrt_engine.SIDECAR).unlink(), "has no sidecar model.fp16.engine.json"),
    (lambda t: _engine(t, built_by="trtexec"), "is not a pipeline engine sidecar"),
    (lambda t: _engine(t, schema="someone.else/1"), "is not a pipeline engine sidecar"),
    (lambda t: _engine(t, tensorrt="10.12.0"), "built for TensorRT version 10.12.0, but this machine has 10.13.0"),
    (lambda t: _engine(t, gpu="NVIDIA L4"), "built for GPU NVIDIA L4, but this machine has NVIDIA H200"),
    (lambda t: _engine(t, compute_capability="8.9"), "built for compute capability 8.9"),
], ids=["tampered", "no-sidecar", "foreign-builder", "foreign-schema", "trt-version", "other-device", "capability"])
def test_engine_refused_without_a_matching_sidecar(tmp_path, tamper, fragment):
    engine = _engine(tmp_path)
    assert tensorrt_engine.check_sidecar(engine, engine.read_bytes(), tmp_path / tensorrt_engine.SIDECAR,
                                         PLATFORM).platform.gpu == "NVIDIA H200"
    tamper(tmp_path)
    with pytest.raises(InputError, match="rebuild it with `python -m pipeline build --run-dir") as info:
        tensorrt_engine.check_sidecar(engine, engine.read_bytes(), tmp_path / tensorrt_engine.SIDECAR, PLATFORM)
    assert fragment in str(info.value) and info.value.exit_code == EXIT_USAGE


def test_engine_checked_on_exactly_the_bytes_that_are_loaded(tmp_path):
    from pipeline.core.run import RunDir

    _engine(tmp_path)
    data, sidecar = tensorrt_engine.load_engine_bytes(RunDir(tmp_path), platform=PLATFORM)
    assert data == b"\x00serialized engine\x00" and sidecar.platform.tensorrt == "10.13.0"
    (tmp_path / tensorrt_engine.SIDECAR).write_text("{corrupt")
    with pytest.raises(InputError, match="engine sidecar is unreadable or corrupt"):
        tensorrt_engine.load_engine_bytes(RunDir(tmp_path), platform=PLATFORM)
    (tmp_path / tensorrt_engine.FP16_ENGINE).unlink()
    with pytest.raises(InputError, match="model.fp16.engine does not exist; run `python -m pipeline build"):
        tensorrt_engine.load_engine_bytes(RunDir(tmp_path), platform=PLATFORM)


def test_build_without_tensorrt_removes_an_engine_it_did_not_build(capsys, clone_run):
    no_tensorrt()
    run = clone_run()
    _engine(run)
    code, err = run_main(capsys, "build", "--run-dir", run)
    assert code == EXIT_OK, err
    assert stage(run, "build")["status"] == "skipped"
    assert not (run / tensorrt_engine.FP16_ENGINE).exists() and not (run / tensorrt_engine.SIDECAR).exists()


# --------------------------------------------------------------------------- untrusted files


@pytest.mark.parametrize("how", ["torch.save", "raw pickle"])
def test_malicious_checkpoint_is_refused_and_never_runs(capsys, clone_run, tmp_path, how):
    import torch

    run = clone_run()
    marker = tmp_path / "pwned"
    payload = {"format": "pipeline.checkpoint/1", "model": _evil(marker)}
    if how == "torch.save":
        torch.save(payload, run / "checkpoint.pt")
    else:
        (run / "checkpoint.pt").write_bytes(pickle.dumps(payload, protocol=2))
    code, err = run_main(capsys, "train", "--resume", "--run-dir", run)
    assert code == EXIT_USAGE
    assert_error(err, "checkpoint.pt: checkpoint refused: it references", "never arbitrary pickles", family="train")
    assert "weights_only` set to `False`" not in err  # torch's advice to load it unsafely is not passed on
    assert not marker.exists()


def test_the_malicious_payload_is_live(tmp_path):
    """The control: unpickled without weights_only, the payload above does create its marker."""
    marker = tmp_path / "pwned"
    pickle.loads(pickle.dumps({"model": _evil(marker)}, protocol=2))
    assert marker.exists()


def test_malicious_init_weights_are_refused(capsys, tmp_path):
    marker = tmp_path / "pwned"
    evil = tmp_path / "pretrained.pt"
    evil.write_bytes(pickle.dumps({"state_dict": _evil(marker)}, protocol=2))
    code, err = run_main(capsys, "train", *tiny_args(tmp_path / "r"), f"train.init_weights={evil}")
    assert code == EXIT_USAGE
    assert_error(err, f"{evil}: weights file refused: it references", family="train")
    assert not marker.exists()


def _with_external_data(model_path: Path, location: str) -> None:
    """Point the first initializer of ``model_path`` at external data ``location``."""
    import onnx

    model = onnx.load(str(model_path))
    tensor = model.graph.initializer[0]
    size = len(tensor.raw_data) or 4
    tensor.ClearField("raw_data")
    del tensor.float_data[:]
    tensor.data_location = onnx.TensorProto.EXTERNAL
    del tensor.external_data[:]
    for key, value in (("location", location), ("offset", "0"), ("length", str(size))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    model_path.write_bytes(model.SerializeToString())


def _external_cases(folder: Path) -> dict[str, str]:
    outside = folder.parent / "outside.bin"
    outside.write_bytes(b"\x00" * 4096)
    (folder / "escape.bin").symlink_to(outside)
    (folder / "weights.bin").write_bytes(b"\x00" * 4096)
    if (folder / "manifest.json").is_file():  # a run: files a stage wrote there once, as far as its ledger says
        listed(folder, "escape.bin", "weights.bin")
    return {
        "../outside.bin": "points to external data '../outside.bin' outside the model's folder",
        str(outside): f"points to external data {str(outside)!r} outside the model's folder",
        "sub/../../outside.bin": "outside the model's folder",
        "escape.bin": "resolves to {outside}, outside the model's folder (a symlink?)".format(outside=outside),
    }


def test_external_data_outside_the_folder_is_refused(tmp_path, tiny_run):
    folder = tmp_path / "m"
    folder.mkdir()
    model = folder / "model.onnx"
    for location, fragment in _external_cases(folder).items():
        shutil.copy(tiny_run / "model.onnx", model)
        _with_external_data(model, location)
        with pytest.raises(InputError, match="refusing to load it") as info:
            onnx_io.check_external_data(model)
        assert fragment in str(info.value), location
        with pytest.raises(InputError, match="refusing to load it"):
            onnx_io.load(model)
    shutil.copy(tiny_run / "model.onnx", model)  # inside the folder: accepted
    _with_external_data(model, "weights.bin")
    onnx_io.check_external_data(model)


@pytest.mark.parametrize("location", ["../outside.bin", "ABSOLUTE", "escape.bin"])
def test_verify_refuses_external_data_outside_the_run(capsys, clone_run, location):
    run = clone_run()
    cases = _external_cases(run)
    location = str(run.parent / "outside.bin") if location == "ABSOLUTE" else location
    _with_external_data(run / "model.onnx", location)
    code, err = run_main(capsys, "verify", "--run-dir", run)
    assert code == EXIT_USAGE
    assert_error(err, cases[location], family="verify")


def test_external_data_that_is_missing(capsys, clone_run):
    run = clone_run()
    _with_external_data(run / "model.onnx", "weights.bin")
    code, err = run_main(capsys, "verify", "--run-dir", run)
    assert code == EXIT_USAGE
    assert_error(err, "external data of the ONNX model is missing or unreadable", family="verify")


# --------------------------------------------------------------------------- real processes

# Long enough to be interrupted mid-epoch, short enough to keep the file fast.
SLOW = ["--model", "tiny_cnn", "data.samples_per_class=40", "data.image_size=16", "data.batch_size=8",
        "train.checkpoint_every=2", "train.log_every=1", "train.tensorboard=false", "train.require_learning=false"]


def _start(run: Path, *args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "pipeline", *args, "--run-dir", str(run)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def _wait_for(predicate, proc: subprocess.Popen, what: str, timeout: float = 90.0, poll: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"the process ended (rc {proc.returncode}) before {what}:\n{err[-3000:]}")
        time.sleep(poll)
    proc.kill()
    pytest.fail(f"timed out waiting for {what}")


def _training_steps(run: Path) -> int:
    try:
        return (run / "metrics.jsonl").read_text().count('"event": "step"')
    except FileNotFoundError:
        return 0


def test_resume_after_sigkill_at_a_random_moment(capsys, tmp_path):
    epochs, steps_per_epoch = 3, 320 // 8  # 400 synthetic images, 80 held out, batches of 8
    run = tmp_path / "run"
    # A random moment: after a random number of steps (so the kill never misses the run, however fast or
    # loaded the machine), plus a random fraction of a step. A checkpoint is written every 2 steps, so the
    # kill may land in the middle of writing one.
    target, jitter = random.randint(2, epochs * steps_per_epoch - 20), random.uniform(0.0, 0.01)
    proc = _start(run, "train", *SLOW, f"train.epochs={epochs}")
    try:
        _wait_for(lambda: _training_steps(run) >= target and (run / "checkpoint.pt").exists(), proc,
                  f"{target} training steps", poll=0.002)
        time.sleep(jitter)
        proc.kill()  # SIGKILL: no handler runs, nothing is cleaned up
    finally:
        proc.kill()
        proc.communicate()
    delay = f"after step {target} + {jitter * 1000:.1f} ms"
    assert proc.returncode == -signal.SIGKILL, f"training finished before the kill ({delay})"
    assert stage(run, "train")["status"] == "running"  # what a killed process leaves behind

    # The checkpoint on disk is a complete one (atomic rename), whatever the moment of the kill.
    from pipeline.training.checkpoint import load_checkpoint
    from pipeline.training.metrics import read_metrics

    state = load_checkpoint(run / "checkpoint.pt")
    resumed_from = f"killed {delay}; resumed at epoch {state.epoch}, " \
                   f"batch {state.batch}, step {state.step}"
    assert 0 < state.step < epochs * steps_per_epoch, resumed_from

    code, err = run_main(capsys, "train", "--resume", "--run-dir", run)
    assert code == EXIT_OK, err
    entry = stage(run, "train")
    assert entry["status"] == "ok", resumed_from
    assert entry["details"]["steps"] == epochs * steps_per_epoch, resumed_from  # every step made, none twice
    assert [h["epoch"] for h in entry["details"]["history"]] == list(range(state.epoch + 1, epochs + 1))
    assert '"event": "resume"' in (run / "metrics.jsonl").read_text()
    assert read_metrics(run / "metrics.jsonl")[0].event == "start"
    assert temporaries(run) == [], resumed_from  # a temporary file the kill left behind is gone
    assert load_checkpoint(run / "checkpoint.pt").step == epochs * steps_per_epoch
    assert (run / "model.safetensors").is_file() and (run / "model.json").is_file()


def test_second_process_refused_then_ctrl_c_marks_interrupted(capsys, tmp_path):
    run = tmp_path / "run"
    proc = _start(run, "train", *SLOW, "train.epochs=50")
    try:
        _wait_for(lambda: _training_steps(run) >= 2, proc, "training to start")
        # A second process on the same run directory refuses at once, naming the holder.
        code, err = run_main(capsys, "train", "--run-dir", run)
        assert code == EXIT_USAGE
        assert_error(err, f"run directory {run} is in use by another pipeline process (pid {proc.pid})",
                     "use another --run-dir", family="train")
        assert proc.poll() is None and stage(run, "train")["status"] == "running"

        proc.send_signal(signal.SIGINT)  # Ctrl-C
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == EXIT_INTERRUPTED, err[-3000:]
    assert "interrupted: train stopped; the manifest marks it interrupted" in err
    assert "Traceback" not in err and "error:" not in err
    entry = stage(run, "train")
    assert entry["status"] == "interrupted" and entry["error"] == "interrupted by the user" and "ended" in entry
    assert temporaries(run) == []
    # The lock went with the process: the run continues from its last checkpoint.
    assert (run / "checkpoint.pt").is_file()


# --------------------------------------------------------------------------- config parser properties


SECTIONS = {name: sorted(type(getattr(config.Config(), name)).model_fields)
            for name, field in config.Config.model_fields.items() if name != "require"}
WORDS = sorted({w for name, fields in SECTIONS.items() for w in (name, *fields)} | {"require", "fp16", "atol"})

scalars = (st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12)
           | st.sampled_from(["sgd", "auto", "1e-3", "tensorrt", "", "null", "[", "~"]))


def _not_the_reported_crash(key) -> bool:
    """config._format_error drops key parts containing '[' (and 'int'/'float'/'str'); an unknown top-level key
    made only of such parts crashes it (test_unknown_key_with_a_bracket, reported). Everything else is fair game."""
    return not (isinstance(key, str) and ("[" in key or key in {"float", "int", "str"}))


texts = st.text(max_size=8).filter(_not_the_reported_crash)
keys = st.sampled_from(WORDS) | texts | st.integers() | st.none() | st.booleans() | st.floats()
trees = st.recursive(scalars, lambda kids: st.lists(kids, max_size=4) | st.dictionaries(keys, kids, max_size=4),
                     max_leaves=16)
config_like = st.dictionaries(st.sampled_from(WORDS) | texts, trees, max_size=5)

YAMLISH = ["[", "]", "{a: 1}", "{", "!!python/object/apply:os.system ['true']", "&a [*a]", "*a", "'", '"\\x"',
           "- a", ": b", "1e-3", ".nan", "-.inf", "0x1F", "0o17", "~", "null", "yes", "\t", "a: b: c", "%YAML 1.1",
           "--- a", "|\n  a", "? a", "@x", "`x`", "\x00", "\ud800", "\x85"]
leaf_keys = [key for key, _, _ in config.describe()]
override_texts = (
    st.text(max_size=30)
    | st.builds(lambda k, v: f"{k}={v}", st.sampled_from(leaf_keys) | st.text(max_size=10),
                st.sampled_from(YAMLISH) | st.text(max_size=15))
    | st.builds(lambda k, v: f"{k}={v}", st.sampled_from(leaf_keys), scalars.map(str))
)

PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                           HealthCheck.too_slow])


def _check_problems(err: ConfigError) -> None:
    assert err.exit_code == EXIT_USAGE and err.problems
    assert all(isinstance(p, str) and p.strip() for p in err.problems)


@PROPERTY
@given(text=override_texts)
def test_parse_override_never_crashes(text):
    try:
        path, _ = config.parse_override(text)
    except ConfigError as err:
        _check_problems(err)
    else:
        assert path and all(part.isidentifier() for part in path)


@PROPERTY
@given(data=st.one_of(trees, config_like))
def test_validate_accepts_or_raises_config_error(data):
    try:
        cfg = config.validate(data)
    except ConfigError as err:
        _check_problems(err)
    else:
        assert isinstance(cfg, config.Config)
        assert config.validate(cfg.to_dict()) == cfg  # what it accepted, it accepts again


@PROPERTY
@given(base=config_like, overrides=st.lists(override_texts, max_size=4))
def test_resolve_accepts_or_raises_config_error(base, overrides):
    try:
        cfg = config.resolve(base, None, overrides)
    except ConfigError as err:
        _check_problems(err)
    else:
        assert isinstance(cfg, config.Config)


@PROPERTY
@given(overrides=st.lists(override_texts, min_size=1, max_size=3))
def test_cli_config_exits_0_or_2_with_config_lines_only(capsys, tmp_path, overrides):
    capsys.readouterr()
    code = cli("config", "--run-dir", tmp_path / "never-written", "--", *overrides)
    err = capsys.readouterr().err
    assert code in (EXIT_OK, EXIT_USAGE)
    assert "Traceback" not in err
    if code == EXIT_USAGE:
        lines = err.strip().splitlines()
        assert lines and all(line.startswith("error: config: ") for line in lines), lines
    else:
        assert err == ""


class _Dumper(yaml.SafeDumper):
    """Writes values the way the config's loader reads them (it also reads ``1e-3`` as a float)."""


_Dumper.yaml_implicit_resolvers = {k: list(v) for k, v in config._Loader.yaml_implicit_resolvers.items()}


def yaml_value(value) -> str:
    # ASCII with escapes: PyYAML writes U+0085 and U+2028 raw into quoted scalars when allow_unicode is set,
    # where YAML folds them into spaces.
    text = yaml.dump(value, Dumper=_Dumper, default_flow_style=True, width=1 << 30)
    return text.removesuffix("\n...\n").removesuffix("\n")


finite = {"allow_nan": False, "allow_infinity": False}
tolerance = st.floats(0, 1e6, **finite)
VALID = {
    "train.epochs": st.integers(1, config_schema.MAX_EPOCHS),  # every number has a range now (issue 46)
    "train.lr": st.floats(min_value=0, max_value=config_schema.MAX_LR, exclude_min=True, **finite),
    "train.momentum": st.floats(0, 1, exclude_max=True),
    "train.optimizer": st.sampled_from(["sgd", "adamw"]),
    "train.amp": st.sampled_from(["auto", "fp16", "bf16", "off"]),
    "train.clip_grad_norm": st.none() | st.floats(min_value=0, max_value=config_schema.MAX_RATIO, exclude_min=True,
                                                  **finite),
    "train.init_weights": st.none() | st.text(),
    "train.deterministic": st.booleans(),
    "data.batch_size": st.integers(1, config_schema.MAX_BATCH),
    "data.image_size": st.none() | st.integers(1, 4096),
    "data.val_fraction": st.floats(0, 1, exclude_min=True, exclude_max=True),
    "data.augment": st.booleans(),
    "model.name": st.text(),
    "model.mean": st.none() | st.lists(st.floats(-config_schema.MAX_RATIO, config_schema.MAX_RATIO, **finite),
                                       max_size=4),
    "model.std": st.none() | st.lists(st.floats(min_value=config.FLOAT32_TINY, max_value=config_schema.MAX_RATIO,
                                                **finite), max_size=4),
    "export.opset": st.integers(17, 23),
    "export.fp16.nodes_to_exclude": st.lists(st.text(max_size=10), max_size=3),
    "verify.fp16.atol": tolerance | st.dictionaries(st.text(max_size=8), tolerance, max_size=3),
    "verify.candidates.tensorrt_fp16.rtol": st.none() | tolerance,
    "verify.candidates.onnxrt_fp32.enabled": st.booleans(),
    "benchmark.batch_sizes": st.lists(st.integers(1, 4096), min_size=1, max_size=5),
    "benchmark.backends": st.lists(st.sampled_from(["torch_fp32", "onnxrt_fp32", "onnxrt_fp16_cpu", "tensorrt_fp16"]),
                                   max_size=4),
    "require": st.lists(st.sampled_from(["tensorrt", "cuda"]), max_size=2),
}
valid_pairs = st.lists(st.sampled_from(sorted(VALID)).flatmap(lambda k: st.tuples(st.just(k), VALID[k])),
                       min_size=1, max_size=6, unique_by=lambda kv: kv[0])


def _resolved(cfg: config.Config, key: str):
    node = cfg
    for part in key.split("."):
        node = node[part] if isinstance(node, dict) else getattr(node, part)  # verify.candidates: by name
    return node


@PROPERTY
@given(pairs=valid_pairs)
def test_valid_overrides_resolve_to_the_value_given(pairs):
    texts = [f"{key}={yaml_value(value)}" for key, value in pairs]
    cfg = config.resolve(overrides=texts)
    for (key, value), text in zip(pairs, texts, strict=True):
        assert _resolved(cfg, key) == value, text


def test_saved_config_reads_back_with_the_pipelines_own_loader():
    """config.yaml in a run directory is read back (by load_yaml_file) on every later command."""
    cfg = config.resolve(overrides=['model.name="1e5"', 'data.path="1.5e3"', 'export.fp16.nodes_to_exclude=["2e1"]',
                                    "train.amp=off"])
    assert config.validate(config.parse_yaml(config.dump_yaml(cfg), "config.yaml")) == cfg


def test_unknown_key_with_a_bracket(capsys, tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text('"a[": 1\ntrain:\n  "x[0]": 1\n')
    code, err = run_main(capsys, "config", "--config", cfg)
    assert code == EXIT_USAGE
    assert_error(err, "a[: unknown key", "train.x[0]: unknown key", family="config")


# --------------------------------------------------------------------------- Ctrl-C inside a native library (issue 30)


def test_ctrl_c_inside_a_librarys_callback_ends_all_with_130_and_interrupted(capsys, tmp_path, monkeypatch):
    """SIGINT through the command line's own handler, raised in the Python callback OpenVINO's frontend calls while
    it converts a model: OpenVINO hands back RuntimeError("... KeyboardInterrupt ..."). Was exit 4 and "failed"."""
    import interrupted_library
    from pipeline import train

    monkeypatch.setattr(train, "run", interrupted_library.stage)
    monkeypatch.setenv("INTERRUPT_HOW", "self")
    run = tmp_path / "run"
    code, err = run_main(capsys, "all", *tiny_args(run))
    assert code == EXIT_INTERRUPTED, err[-2000:]
    assert "interrupted: train stopped; the manifest marks it interrupted" in err
    assert "Traceback" not in err and "error:" not in err
    entry = stage(run, "train")
    assert entry["status"] == "interrupted" and entry["error"] == "interrupted by the user" and "exit_code" not in entry
    assert set(manifest(run)["stages"]) == {"train"}  # all stopped there


BOOT_LIBRARY = """
import sys
sys.path.insert(0, {tests!r})
import interrupted_library
from pipeline import train
train.run = interrupted_library.stage  # the stage that converts a model through OpenVINO's frontend
from pipeline.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_sigint_from_outside_during_a_librarys_model_reading_is_130_and_interrupted(tmp_path):
    """The same, with a real Ctrl-C from another process, sent while OpenVINO waits on its callback."""
    run, marker, boot = tmp_path / "run", tmp_path / "in-callback", tmp_path / "boot.py"
    boot.write_text(BOOT_LIBRARY.format(tests=str(ROOT / "tests")))
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "INTERRUPT_HOW": "wait", "INTERRUPT_MARKER": str(marker)}
    proc = subprocess.Popen([sys.executable, str(boot), "-q", "train", *tiny_args(run)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _wait_for(marker.exists, proc, "OpenVINO called the callback")
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == EXIT_INTERRUPTED, err[-3000:]
    assert "interrupted: train stopped; the manifest marks it interrupted" in err
    assert "Traceback" not in err and "error:" not in err
    assert stage(run, "train")["status"] == "interrupted"
