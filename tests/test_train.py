"""The train stage: precision choice, the AMP loop, resume, torchrun/DDP, checkpoints, metrics, init weights.

Everything runs on CPU with tiny models and data, so each test takes seconds. The tests that
must see a real process boundary (resume after SIGKILL, two gloo processes) use subprocesses;
the rest call the command line in-process.
"""

from __future__ import annotations

import functools
import json
import math
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torch import nn

from conftest import ROOT, cli, listed, run_cli
from pipeline.core import env, modeling
from pipeline.core.errors import InputError
from pipeline.train import BEST_CHECKPOINT, CHECKPOINT, CURVE, METRICS, TRACE
from pipeline.training import checkpoint, device, distributed, optim, rng
from pipeline.training import metrics as metrics_log
from pipeline.training.distributed import Dist
from pipeline.training.records import EpochLine, StepLine

# 10 classes x 12 images at 16x16: 100 train / 20 val images, batch 16 -> 6 steps per epoch.
TINY_TRAIN = [
    "train.require_learning=false",  # one epoch on 100 images: the learning check has its own tests (test_recipes.py)
    "data.samples_per_class=12",
    "data.image_size=16",
    "data.batch_size=16",
    "train.epochs=1",
    "train.log_every=1",
    "train.tensorboard=false",
]

# Test models given to the CLI as file.py:factory. `dropnet` has dropout (its masks come from the
# global torch RNG, so resume must restore that exactly) and, when SLOW_FORWARD_S is set, sleeps
# in each training forward so a test can kill the process in the middle of an epoch.
# `plainnet` has no BatchNorm and no dropout: its gradients do not depend on how a batch is split.
TEST_MODELS = '''
import os
import time

import torch
from torch import nn


class Net(nn.Module):
    def __init__(self, num_classes, batchnorm, dropout):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8) if batchnorm else nn.Identity()
        self.drop = nn.Dropout(dropout)
        self.fc = nn.Linear(8 * 4 * 4, num_classes)
        self.delay = float(os.environ.get("SLOW_FORWARD_S", "0"))

    def forward(self, x):
        if self.training and self.delay:
            time.sleep(self.delay)
        x = torch.relu(self.bn(self.conv(x)))
        x = nn.functional.adaptive_avg_pool2d(x, 4).flatten(1)
        return self.fc(self.drop(x))


def dropnet(num_classes=10):
    return Net(num_classes, batchnorm=True, dropout=0.3)


def plainnet(num_classes=10):
    return Net(num_classes, batchnorm=False, dropout=0.0)
'''


@pytest.fixture(scope="module")
def test_models(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("models") / "train_test_models.py"
    path.write_text(TEST_MODELS)
    return path


def subprocess_env(**extra) -> dict:
    # One intra-op thread everywhere: runs that are compared bitwise use the same kernels.
    return {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **extra}


def load_ckpt(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


def manifest(run_dir: Path) -> dict:
    return json.loads((run_dir / "manifest.json").read_text())


def metrics(run_dir: Path) -> list[dict]:
    """metrics.jsonl's lines as written (the file's contents; the tool reads them typed: ``read_metrics``)."""
    return [json.loads(line) for line in (run_dir / METRICS).read_text().splitlines()]


def assert_same_tensors(a: dict, b: dict, exact: bool = True) -> None:
    assert a.keys() == b.keys()
    for key, value in a.items():
        if exact:
            assert torch.equal(value, b[key]), f"{key} differs"
        else:
            torch.testing.assert_close(value, b[key], rtol=1e-5, atol=1e-6, msg=f"{key} differs")


# --------------------------------------------------------------------------- resolve_amp

CPU = torch.device("cpu")


def test_resolve_amp_auto_on_cpu_without_bf16_is_off_and_names_the_cpu(monkeypatch):
    monkeypatch.setattr(env, "cpu_has_native_bf16", lambda: False)
    monkeypatch.setattr(env, "cpu_model", lambda: "Test CPU 9000")
    dtype, note = device.resolve_amp("auto", CPU)
    assert dtype is None
    assert "off" in note and "Test CPU 9000" in note and "train.amp=bf16" in note


def test_resolve_amp_auto_with_native_bf16_and_explicit_choices(monkeypatch):
    monkeypatch.setattr(env, "cpu_has_native_bf16", lambda: True)
    assert device.resolve_amp("auto", CPU)[0] is torch.bfloat16
    monkeypatch.setattr(env, "cpu_has_native_bf16", lambda: False)
    dtype, note = device.resolve_amp("bf16", CPU)
    assert dtype is torch.bfloat16 and "slower" in note  # honoured, with the warning
    dtype, note = device.resolve_amp("fp16", CPU)
    assert dtype is torch.float16 and "GradScaler" in note
    assert device.resolve_amp("off", CPU) == (None, "mixed precision off (train.amp=off)")


# --------------------------------------------------------------------------- one shared tiny run


# train.amp=auto decides by the CPU (or the PIPELINE_CPU_FLAGS test hook): bf16 where it has bf16 units.
AUTO_AMP_HERE = "bf16" if env.cpu_has_native_bf16() else "off"


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """tiny_cnn, 2 epochs, warm-up over the first epoch, logging every step, train.amp=auto."""
    run_dir = tmp_path_factory.mktemp("trained") / "run"
    assert cli("train", "--model", "tiny_cnn", "--run-dir", run_dir, *TINY_TRAIN, "train.epochs=2",
               "train.warmup_epochs=1", "train.seed=3") == 0
    return run_dir


def test_checkpoints_hold_everything_and_load_weights_only(trained):
    for name in (CHECKPOINT, BEST_CHECKPOINT):
        state = load_ckpt(trained / name)  # weights_only=True: nothing but tensors and containers
        for key in ("model", "optimizer", "scheduler", "scaler", "epoch", "step", "batch", "rng", "config"):
            assert key in state, f"{name} lacks {key}"
        assert state["format"] == checkpoint.CHECKPOINT_FORMAT
        assert set(state["rng"]) >= {"python", "numpy", "torch"}
        assert state["config"]["train"]["epochs"] == 2 and state["config"]["model"]["name"] == "tiny_cnn"
    last = load_ckpt(trained / CHECKPOINT)
    assert (last["epoch"], last["batch"], last["step"]) == (2, 0, 12)
    assert last["scheduler"]["last_epoch"] == 12
    assert distributed.state_checksum(last["model"]) == manifest(trained)["stages"]["train"]["details"][
        "final_weights_sha256"]
    # model.safetensors holds the best epoch's weights
    from safetensors.torch import load_file

    best = load_ckpt(trained / BEST_CHECKPOINT)
    assert_same_tensors(load_file(str(trained / modeling.WEIGHTS)), best["model"])
    from safetensors import safe_open

    with safe_open(str(trained / modeling.WEIGHTS), "np") as f:  # one key: a map is written in a random order,
        assert list(f.metadata()) == ["pipeline"]  # so the same weights would hash differently in every run
        assert json.loads(f.metadata()["pipeline"]) == {"epoch": best["epoch"], "model": "tiny_cnn"}


def test_metrics_records_curve_and_manifest(trained):
    records = metrics(trained)
    steps = [r for r in records if r["event"] == "step"]
    epochs = [r for r in records if r["event"] == "epoch"]
    assert [r["step"] for r in steps] == list(range(1, 13))
    for r in steps:
        for key in ("loss", "lr", "loss_scale", "skipped_steps", "images_per_s", "data_time_share"):
            assert key in r, key
        assert r["images_per_s"] > 0 and 0 <= r["data_time_share"] <= 1 and r["skipped_steps"] == 0
        assert r["loss_scale"] is None  # no GradScaler without fp16
    # The logged LR is the one each step used: linear warm-up over 6 steps, then cosine to 0.
    assert steps[0]["lr"] == pytest.approx(0.05 / 6)
    assert steps[5]["lr"] == pytest.approx(0.05)
    assert steps[-1]["lr"] == pytest.approx(0.05 * 0.5 * (1 + torch.cos(torch.tensor(torch.pi * 5 / 6)).item()))
    assert [r["epoch"] for r in epochs] == [0, 1]
    for r in epochs:
        assert 0 <= r["val_acc"] <= 1 and r["val_loss"] > 0 and r["amp"] == AUTO_AMP_HERE
    png = (trained / CURVE).read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 1000
    train = manifest(trained)["stages"]["train"]
    assert train["status"] == "ok"
    assert {CHECKPOINT, BEST_CHECKPOINT, METRICS, CURVE, modeling.WEIGHTS} <= set(train["artifacts"])
    d = train["details"]
    assert d["seed"] == 3 and d["deterministic"] is False and d["amp"] == AUTO_AMP_HERE and d["world_size"] == 1
    assert len(d["history"]) == 2 and d["steps"] == 12


def test_same_seed_same_weights_other_seed_other_weights(trained, tmp_path):
    args = ["--model", "tiny_cnn", *TINY_TRAIN, "train.epochs=2", "train.warmup_epochs=1"]
    # also with DataLoader worker processes (persistent, seeded by their own generator): same batches
    assert cli("train", "--run-dir", tmp_path / "same", *args, "train.seed=3", "train.deterministic=true",
               "data.workers=2") == 0
    try:
        assert manifest(tmp_path / "same")["stages"]["train"]["details"]["deterministic"] is True
    finally:
        torch.use_deterministic_algorithms(False)  # the in-process run switched it on for this process
    assert cli("train", "--run-dir", tmp_path / "other", *args, "train.seed=4") == 0
    ref = load_ckpt(trained / CHECKPOINT)["model"]
    assert_same_tensors(load_ckpt(tmp_path / "same" / CHECKPOINT)["model"], ref)
    other = load_ckpt(tmp_path / "other" / CHECKPOINT)["model"]
    assert not torch.equal(other["fc.weight"], ref["fc.weight"])


def test_precise_bn_changes_the_batchnorm_statistics_and_nothing_else(trained, tmp_path):
    """train.precise_bn (on in ``trained``) runs only BatchNorm in train mode and draws no random number: the weights,
    the optimizer and every step are those of a run without it; the running means and variances differ."""
    args = ["--model", "tiny_cnn", *TINY_TRAIN, "train.epochs=2", "train.warmup_epochs=1", "train.seed=3"]
    assert cli("train", "--run-dir", tmp_path / "off", *args, "train.precise_bn.enabled=false") == 0
    on, off = load_ckpt(trained / CHECKPOINT), load_ckpt(tmp_path / "off" / CHECKPOINT)
    stats = {k for k in on["model"] if k.endswith(("running_mean", "running_var"))}
    assert stats and any(not torch.equal(on["model"][k], off["model"][k]) for k in stats)
    assert_same_tensors({k: v for k, v in on["model"].items() if k not in stats},
                        {k: v for k, v in off["model"].items() if k not in stats})
    assert on["rng"]["torch"].equal(off["rng"]["torch"]) and on["step"] == off["step"]
    d = manifest(trained)["stages"]["train"]["details"]
    assert d["precise_bn"]["enabled"] and d["precise_bn"]["batchnorm_layers"] == 2 and d["precise_bn"]["batches"] == 6
    assert all("val_acc_before_precise_bn" in h for h in d["history"])
    assert "val_acc_before_precise_bn" not in manifest(tmp_path / "off")["stages"]["train"]["details"]["history"][0]


def test_metrics_go_to_tensorboard_when_it_is_installed(tmp_path, monkeypatch):
    import types

    scalars = []

    class SummaryWriter:
        def __init__(self, logdir):
            self.logdir = logdir

        def add_scalar(self, tag, value, step):
            scalars.append((tag, value, step))

        def close(self):
            scalars.append("closed")

    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", types.SimpleNamespace(SummaryWriter=SummaryWriter))
    log = metrics_log.MetricsLog(tmp_path / "m.jsonl", True, tmp_path / "tb")
    log.write(StepLine(epoch=0, step=3, loss=1.5, loss_scale=None, lr=0.1))
    log.write(EpochLine(epoch=0, step=3, val_acc=0.5, amp="off"))
    log.close()
    assert scalars == [("step/loss", 1.5, 3), ("step/lr", 0.1, 3), ("epoch/val_acc", 0.5, 3), "closed"]
    assert [r.event for r in metrics_log.read_metrics(tmp_path / "m.jsonl")] == ["step", "epoch"]
    # a line torn by a killed process is skipped
    with open(tmp_path / "m.jsonl", "a") as f:
        f.write('{"event": "st')
    assert len(metrics_log.read_metrics(tmp_path / "m.jsonl")) == 2
    silent = metrics_log.MetricsLog(tmp_path / "rank1.jsonl", False, tmp_path / "tb1")
    silent.write(StepLine(step=1))
    silent.close()
    assert not (tmp_path / "rank1.jsonl").exists()


# --------------------------------------------------------------------------- resume after SIGKILL

RESUME_ARGS = [
    # 4 classes x 18 images: 56 train images -> 7 batches of 8 -> optimizer steps of 2+2+2+1 micro-batches.
    "data.num_classes=4", "data.samples_per_class=18", "data.image_size=16", "data.batch_size=8",
    "data.augment=true", "train.epochs=2", "train.accumulate=2", "train.log_every=1",
    "train.deterministic=true", "train.tensorboard=false", "train.clip_grad_norm=5.0", "train.require_learning=false",
]


def train_cmd(model: str, run_dir: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "pipeline", "train", "--model", model, "--run-dir", str(run_dir), *RESUME_ARGS,
            *extra]


def kill_after_first_checkpoint(cmd: list[str], run_dir: Path, timeout: float = 120) -> dict:
    """Start ``cmd``, SIGKILL it as soon as checkpoint.pt exists; return that checkpoint."""
    log = run_dir.parent / "killed.stderr"
    with open(log, "w") as stderr:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=subprocess_env(SLOW_FORWARD_S="0.12"),
                                stdout=subprocess.DEVNULL, stderr=stderr)
    deadline = time.monotonic() + timeout
    try:
        while not (run_dir / CHECKPOINT).exists():
            assert proc.poll() is None, f"training ended before its first checkpoint: {log.read_text()}"
            assert time.monotonic() < deadline, "no checkpoint appeared"
            time.sleep(0.01)
        assert proc.poll() is None, "training finished before it could be interrupted"
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert manifest(run_dir)["stages"]["train"]["status"] == "running"  # killed: nobody marked it
    return load_ckpt(run_dir / CHECKPOINT)


@pytest.fixture(scope="module")
def uninterrupted(test_models, tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("uninterrupted") / "run"
    out = subprocess.run(train_cmd(f"{test_models}:dropnet", run_dir), cwd=ROOT, env=subprocess_env(),
                         check=False, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return run_dir


@pytest.mark.parametrize("checkpoint_every", [0, 1], ids=["at-epoch-end", "mid-epoch"])
def test_killed_and_resumed_run_ends_with_identical_weights(uninterrupted, test_models, tmp_path,
                                                            checkpoint_every):
    run_dir = tmp_path / "run"
    model = f"{test_models}:dropnet"
    extra = [f"train.checkpoint_every={checkpoint_every}"]
    state = kill_after_first_checkpoint(train_cmd(model, run_dir, *extra), run_dir)
    if checkpoint_every:
        assert state["epoch"] == 0 and state["batch"] in (2, 4, 6), (state["epoch"], state["batch"])
    else:
        assert (state["epoch"], state["batch"]) == (1, 0)
    assert not (run_dir / modeling.WEIGHTS).exists()

    out = subprocess.run(train_cmd(model, run_dir, *extra) + ["--resume"], cwd=ROOT, env=subprocess_env(),
                         check=False, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "resuming from checkpoint.pt" in out.stderr

    ref, got = load_ckpt(uninterrupted / CHECKPOINT), load_ckpt(run_dir / CHECKPOINT)
    assert (got["epoch"], got["step"]) == (ref["epoch"], ref["step"]) == (2, 8)
    assert_same_tensors(got["model"], ref["model"])  # bitwise
    for k, v in ref["optimizer"]["state"].items():  # momentum buffers too
        assert torch.equal(got["optimizer"]["state"][k]["momentum_buffer"], v["momentum_buffer"])
    from safetensors.torch import load_file

    assert_same_tensors(load_file(str(run_dir / modeling.WEIGHTS)), load_file(str(uninterrupted / modeling.WEIGHTS)))
    ref_sha = manifest(uninterrupted)["stages"]["train"]["details"]["final_weights_sha256"]
    assert manifest(run_dir)["stages"]["train"]["details"]["final_weights_sha256"] == ref_sha
    events = [r["event"] for r in metrics(run_dir)]
    assert events[0] == "start" and "resume" in events


def test_resume_without_checkpoint_and_with_a_malicious_one(tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert cli("train", "--resume", "--model", "tiny_cnn", "--run-dir", run_dir, *TINY_TRAIN) == 2
    assert "nothing to resume" in capsys.readouterr().err
    marker = tmp_path / "pwned"
    (run_dir / CHECKPOINT).write_bytes(pickle.dumps(Payload(marker), protocol=2))
    listed(run_dir, CHECKPOINT)  # where train writes its checkpoint: a file of the run's, tampered with
    assert cli("train", "--resume", "--model", "tiny_cnn", "--run-dir", run_dir, *TINY_TRAIN) == 2
    err = capsys.readouterr().err
    assert "checkpoint refused" in err and "Traceback" not in err
    assert not marker.exists(), "the pickle's payload ran"


# --------------------------------------------------------------------------- torchrun / DDP

DDP_ARGS = ["--model", "tiny_cnn", "data.samples_per_class=8", "data.image_size=16", "data.batch_size=8",
            "train.epochs=2", "train.log_every=1", "train.accumulate=2", "train.tensorboard=false",
            "train.require_learning=false"]
TRAIN_FILES = (CHECKPOINT, BEST_CHECKPOINT, METRICS, CURVE, modeling.WEIGHTS, modeling.MODEL_CARD)


def torchrun(tmp_path: Path, *command: str) -> tuple[subprocess.CompletedProcess, dict[int, str]]:
    """Two gloo processes on CPU; returns the launcher's result and each rank's stderr."""
    logs = tmp_path / "logs"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           "--log-dir", str(logs), "--redirects", "3", *command]
    out = subprocess.run(cmd, cwd=ROOT, env=subprocess_env(), check=False, capture_output=True, text=True,
                         timeout=300)
    stderr = {int(p.parent.name): p.read_text() for p in logs.glob("*/attempt_0/*/stderr.log")}
    return out, stderr


def test_two_gloo_processes_end_with_identical_weights(tmp_path):
    """Each rank gets its own --run-dir (see the next test for a shared one), which also shows
    that rank 1 writes none of the training files and logs nothing."""
    script = ("exec " + " ".join([sys.executable, "-m", "pipeline", "train", "--run-dir", f"{tmp_path}/rank$RANK",
                                  *DDP_ARGS]))
    out, stderr = torchrun(tmp_path, "--no-python", "sh", "-c", script)
    assert out.returncode == 0, out.stderr + "".join(stderr.values())
    rank0, rank1 = tmp_path / "rank0", tmp_path / "rank1"
    for name in TRAIN_FILES:
        assert (rank0 / name).is_file(), name
        assert not (rank1 / name).exists(), f"rank 1 wrote {name}"
    d0 = manifest(rank0)["stages"]["train"]["details"]
    assert d0["world_size"] == 2 and d0["replicas_identical"] is True
    assert len(d0["replica_sha256"]) == 2 and len(set(d0["replica_sha256"])) == 1
    if (rank1 / "manifest.json").exists():  # written by the CLI on rank 1 until cli.py leaves that to rank 0
        assert manifest(rank1)["stages"]["train"]["details"]["replica_sha256"] == d0["replica_sha256"]
    # ... and that is the checksum of what rank 0 saved (parameters and BatchNorm statistics)
    assert distributed.state_checksum(load_ckpt(rank0 / CHECKPOINT)["model"]) == d0["replica_sha256"][0]
    assert "train: epoch 2/2" in stderr[0] and "replicas hold identical weights" in stderr[0]
    assert stderr[1].strip() == "", stderr[1]
    # 64 train images / 2 ranks / batch 8 = 4 micro-batches per rank = 2 optimizer steps per epoch
    assert [r["step"] for r in metrics(rank0) if r["event"] == "step"] == [1, 2, 3, 4]


def test_two_gloo_processes_sharing_one_run_dir(tmp_path):
    run_dir = tmp_path / "run"
    out, stderr = torchrun(tmp_path, "-m", "pipeline", "train", "--run-dir", str(run_dir), *DDP_ARGS)
    assert out.returncode == 0, out.stderr + "".join(stderr.values())
    d = manifest(run_dir)["stages"]["train"]["details"]
    assert d["world_size"] == 2 and d["replicas_identical"] is True
    assert distributed.state_checksum(load_ckpt(run_dir / CHECKPOINT)["model"]) == d["replica_sha256"][0]
    assert "train: epoch 2/2" in stderr[0] and stderr[1].strip() == "", stderr[1]


# --------------------------------------------------------------------------- gradient accumulation


def test_accumulating_two_batches_of_16_equals_one_batch_of_32(test_models, tmp_path):
    """In FP32: plainnet has no BatchNorm (whose batch statistics would differ) and no dropout, so one
    optimizer step over 2 x 16 images equals one over the same 32 images at once. Under bf16 autocast
    the two differ by bf16 rounding (about 1e-3 relative), so the equivalence is checked in FP32 only."""
    common = ["--model", f"{test_models}:plainnet", "train.amp=off", "data.num_classes=4", "data.samples_per_class=10",
              "data.image_size=16", "train.epochs=1", "train.warmup_epochs=0", "train.log_every=1",
              "train.tensorboard=false", "train.clip_grad_norm=1.0", "train.require_learning=false"]  # 32 train images
    assert cli("train", "--run-dir", tmp_path / "acc", *common, "data.batch_size=16", "train.accumulate=2") == 0
    assert cli("train", "--run-dir", tmp_path / "one", *common, "data.batch_size=32", "train.accumulate=1") == 0
    acc, one = load_ckpt(tmp_path / "acc" / CHECKPOINT), load_ckpt(tmp_path / "one" / CHECKPOINT)
    assert acc["step"] == one["step"] == 1
    assert_same_tensors(acc["model"], one["model"], exact=False)
    torch.manual_seed(0)  # the initial weights, as the runs built them (seed 0)
    initial = modeling.build(modeling_cfg(test_models), 4, 16)[0].state_dict()
    assert not torch.allclose(initial["fc.weight"], acc["model"]["fc.weight"])
    # the logged loss of the accumulated step is the mean over both micro-batches
    (s_acc,), (s_one,) = ([r for r in metrics(tmp_path / n) if r["event"] == "step"] for n in ("acc", "one"))
    assert s_acc["loss"] == pytest.approx(s_one["loss"], rel=1e-5)
    assert s_acc["grad_norm"] == pytest.approx(s_one["grad_norm"], rel=1e-4)


def modeling_cfg(test_models: Path):
    from pipeline import config

    return config.resolve(overrides=[f"model.name={test_models}:plainnet", "data.image_size=16"])


# --------------------------------------------------------------------------- non-finite losses


def test_huge_lr_stops_with_a_clear_error(tmp_path, capsys):
    # 'off' quoted: the config's YAML 1.1 reading turns a bare off into false (a bug reported in config.py)
    rc = cli("train", "--model", "tiny_cnn", "--run-dir", tmp_path / "run", *TINY_TRAIN, "train.amp='off'",
             "train.lr=1e30", "train.warmup_epochs=0", "train.max_nonfinite=2")
    err = capsys.readouterr().err
    assert rc == 4
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "non-finite for 2 consecutive steps" in lines[0], err
    assert "Lower train.lr (now 1e+30)" in lines[0]
    assert "no checkpoint had been written yet" in lines[0] and "Traceback" not in err
    entry = manifest(tmp_path / "run")["stages"]["train"]
    assert entry["status"] == "failed" and entry["exit_code"] == 4


class NaNAfter(nn.CrossEntropyLoss):
    """Cross-entropy that turns NaN from the ``after``-th call on (training only: evaluate uses F.cross_entropy)."""

    calls = 0
    after = 10**9

    def forward(self, logits, target):
        type(self).calls += 1
        loss = super().forward(logits, target)
        return loss * float("nan") if type(self).calls > self.after else loss


def test_nan_loss_under_bf16_keeps_the_last_good_checkpoint(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(NaNAfter, "after", 6)  # epoch 1 (6 steps) is fine, epoch 2 is NaN
    monkeypatch.setattr(torch.nn, "CrossEntropyLoss", NaNAfter)
    run_dir = tmp_path / "run"
    rc = cli("train", "--model", "tiny_cnn", "--run-dir", run_dir, *TINY_TRAIN, "train.epochs=3",
             "train.amp=bf16", "train.max_nonfinite=3")
    err = capsys.readouterr().err
    assert rc == 4, err
    assert "non-finite for 3 consecutive steps (epoch 2, step 6" in err
    assert "the last good checkpoint (checkpoint.pt) is kept" in err
    assert err.count("non-finite loss or gradients at epoch 2") == 3  # each occurrence is logged
    assert "train.amp=off" in err
    state = load_ckpt(run_dir / CHECKPOINT)
    assert (state["epoch"], state["step"], state["skipped_steps"]) == (1, 6, 0)
    assert all(torch.isfinite(v).all() for v in state["model"].values() if v.is_floating_point())
    assert [r["epoch"] for r in metrics(run_dir) if r["event"] == "epoch"] == [0]


def plant(monkeypatch, *, train_hook=None, eval_hook=None) -> list[dict]:
    """Wrap every model the train stage builds with forward hooks; returns the model's state at
    the start of each training forward pass (weights and buffers), in order.

    ``train_hook(call, output)`` sees the output of training forward number ``call`` (1-based);
    ``eval_hook(output)`` may replace an evaluation output.
    """
    states: list[dict] = []
    build = modeling.build

    def planted(cfg, num_classes, size):
        model, spec = build(cfg, num_classes, size)

        def before(module, args):
            if module.training:
                states.append({k: v.detach().clone() for k, v in module.state_dict().items()})

        def after(module, args, output):
            if module.training and train_hook is not None:
                train_hook(len(states), output)
            elif not module.training and eval_hook is not None:
                return eval_hook(output)
            return None

        model.register_forward_pre_hook(before)
        model.register_forward_hook(after)
        return model, spec

    monkeypatch.setattr(modeling, "build", planted)
    return states


def inf_gradient(output: torch.Tensor) -> None:
    output.register_hook(lambda grad: torch.full_like(grad, float("inf")))


@pytest.mark.parametrize("amp", ["off", "bf16"])
def test_a_planted_nonfinite_gradient_is_skipped_and_leaves_weights_and_batchnorm_untouched(
        tmp_path, monkeypatch, capsys, amp):
    """The loss stays finite; only the gradients of step 3 are Inf. bf16 and FP32 have no GradScaler
    to catch that: the step must be skipped, weights and BatchNorm statistics left as they were."""
    states = plant(monkeypatch, train_hook=lambda call, out: inf_gradient(out) if call == 3 else None)
    run_dir = tmp_path / "run"
    rc = cli("train", "--model", "tiny_cnn", "--run-dir", run_dir, *TINY_TRAIN, "train.epochs=2",
             f"train.amp={amp}")
    err = capsys.readouterr().err
    assert rc == 0, err
    assert "non-finite loss or gradients at epoch 1 step 2 (1 in a row): step skipped" in err
    assert any("running_mean" in key for key in states[0])  # tiny_cnn has BatchNorm
    assert_same_tensors(states[3], states[2])  # the skipped step changed nothing, buffers included
    with pytest.raises(AssertionError):  # ... while a normal step changes weights and buffers
        assert_same_tensors(states[2], states[1])
    d = manifest(run_dir)["stages"]["train"]["details"]
    assert (d["skipped_steps"], d["steps"]) == (1, 11)  # 2 epochs x 6 batches, one skipped
    assert all(math.isfinite(h["val_loss"]) for h in d["history"])
    from safetensors.torch import load_file

    assert all(torch.isfinite(v).all() for v in load_file(str(run_dir / modeling.WEIGHTS)).values())


def test_nonfinite_gradients_every_step_stop_training(tmp_path, monkeypatch, capsys):
    plant(monkeypatch, train_hook=lambda call, out: inf_gradient(out))
    rc = cli("train", "--model", "tiny_cnn", "--run-dir", tmp_path / "run", *TINY_TRAIN, "train.amp=off",
             "train.max_nonfinite=2")
    err = capsys.readouterr().err
    assert rc == 4, err
    assert "non-finite for 2 consecutive steps (epoch 1, step 0" in err and "Traceback" not in err
    assert not (tmp_path / "run" / modeling.WEIGHTS).exists()


def test_a_nan_validation_loss_fails_train_as_diverged(tmp_path, monkeypatch, capsys):
    plant(monkeypatch, eval_hook=lambda out: out * float("nan"))
    run_dir = tmp_path / "run"
    rc = cli("train", "--model", "tiny_cnn", "--run-dir", run_dir, *TINY_TRAIN, "train.amp=off")
    err = capsys.readouterr().err
    assert rc == 4, err
    error = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and "training diverged: the validation loss is nan after epoch 1" in error[0]
    assert "Lower train.lr" in error[0] and "train: ok" not in err
    assert manifest(run_dir)["stages"]["train"]["status"] == "failed"
    assert not (run_dir / modeling.WEIGHTS).exists()


def test_resnet50_in_bf16_at_16px_never_reports_ok_with_nan(tmp_path, capsys):
    """Issue 11's reproduction. At 16x16 ResNet-50's layer4 sees 1x1 maps, where oneDNN's bf16
    weight gradient of a 3x3 stride-2 convolution is intermittently NaN on CPUs with bf16 units.
    Whatever this CPU does, train ends with finite weights and loss, or fails saying so."""
    run_dir = tmp_path / "run"
    rc = cli("train", "--model", "resnet50", "--run-dir", run_dir, "data.samples_per_class=12",
             "data.image_size=16", "data.batch_size=32", "train.epochs=1", "train.amp=bf16",
             "train.require_learning=false")
    err = capsys.readouterr().err
    if rc == 0:
        d = manifest(run_dir)["stages"]["train"]["details"]
        assert math.isfinite(d["final_val_loss"]), err
        from safetensors.torch import load_file

        assert all(torch.isfinite(v).all() for v in load_file(str(run_dir / modeling.WEIGHTS)).values())
    else:
        assert rc == 4 and "non-finite for 3 consecutive steps" in err, err


@pytest.mark.parametrize("flags, amp", [("sse4_2 avx2 fma", "off"), ("avx512f avx512_bf16 amx_tile amx_bf16", "bf16")],
                         ids=["avx2-only", "bf16-units"])
def test_auto_amp_follows_the_cpu_flags_and_says_when_they_are_simulated(tmp_path, monkeypatch, flags, amp):
    """Both branches of train.amp=auto on any machine, through the PIPELINE_CPU_FLAGS test hook."""
    monkeypatch.setenv(env.CPU_FLAGS_ENV, flags)
    assert cli("train", "--model", "tiny_cnn", "--run-dir", tmp_path / "run", *TINY_TRAIN) == 0
    d = manifest(tmp_path / "run")["stages"]["train"]["details"]
    assert d["amp"] == amp and f"{env.CPU_FLAGS_ENV}='{flags}'" in d["amp_note"]
    assert [r["amp"] for r in metrics(tmp_path / "run") if r["event"] == "epoch"] == [amp]


def _toy_step_setup(scaler_enabled: bool):
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, optim.lr_lambda(10, 2))
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16, enabled=scaler_enabled)
    step = functools.partial(optim.optimizer_step, model=model, optimizer=optimizer, scaler=scaler,
                             scheduler=scheduler, clip_grad_norm=1e6, world=Dist(), device=CPU)
    return model, optimizer, scheduler, scaler, step


def test_optimizer_step_with_scaler_skips_inf_grads_without_advancing_the_schedule():
    model, optimizer, scheduler, scaler, step = _toy_step_setup(True)
    step = functools.partial(step, loss_finite=True)
    x = torch.randn(5, 4)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    scaler.scale(model(x).sum()).backward()
    model.weight.grad[0, 0] = float("inf")
    result = step()
    assert result.skipped and not result.nonfinite
    assert scheduler.last_epoch == 0 and scaler.get_scale() == 2.0**15
    assert_same_tensors(model.state_dict(), before)
    assert model.weight.grad is None  # zeroed for the next step

    # A finite step: applied, schedule advances, and the clipped norm is of the unscaled gradients.
    scaler.scale(model(x).sum()).backward()
    expected_norm = torch.cat([p.grad.flatten() for p in model.parameters()]).norm().item() / scaler.get_scale()
    lr_used = optimizer.param_groups[0]["lr"]
    result = step()
    assert not result.skipped and result.grad_norm == pytest.approx(expected_norm, rel=1e-5)
    assert scheduler.last_epoch == 1 and optimizer.param_groups[0]["lr"] != lr_used
    assert not torch.equal(model.weight, before["weight"])


def test_optimizer_step_without_scaler_skips_a_nonfinite_loss():
    model, optimizer, scheduler, scaler, step = _toy_step_setup(False)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model(torch.randn(5, 4)).sum().backward()
    result = step(loss_finite=False)
    assert result == optim.StepResult(skipped=True, nonfinite=True, grad_norm=None)
    assert scheduler.last_epoch == 0 and model.weight.grad is None
    assert_same_tensors(model.state_dict(), before)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_optimizer_step_without_scaler_skips_nonfinite_gradients_of_a_finite_loss(bad):
    """bf16/FP32 have no GradScaler: a NaN/Inf gradient under a finite loss must not reach the weights."""
    model, optimizer, scheduler, scaler, step = _toy_step_setup(False)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model(torch.randn(5, 4)).sum().backward()
    model.bias.grad[1] = bad
    result = step(loss_finite=True)
    assert result.skipped and result.nonfinite
    assert scheduler.last_epoch == 0 and model.weight.grad is None
    assert_same_tensors(model.state_dict(), before)
    model(torch.randn(5, 4)).sum().backward()  # the next, finite step is taken
    assert not step(loss_finite=True).skipped and scheduler.last_epoch == 1


def test_fp16_loop_counts_skipped_steps_and_keeps_the_schedule_in_step(tmp_path, monkeypatch):
    # A scale of 2**24 overflows float16 gradients at first; the scaler halves it until they fit.
    monkeypatch.setattr(torch.amp, "GradScaler", functools.partial(torch.amp.GradScaler, init_scale=2.0**24))
    run_dir = tmp_path / "run"
    assert cli("train", "--model", "tiny_cnn", "--run-dir", run_dir, *TINY_TRAIN, "data.batch_size=8",
               "train.amp=fp16") == 0
    state = load_ckpt(run_dir / CHECKPOINT)
    skipped = state["skipped_steps"]
    assert 0 < skipped < 12
    assert state["step"] == 12 - skipped  # 100 images / 8 = 12 batches; a skipped one is no step
    assert state["scheduler"]["last_epoch"] == state["step"]  # the schedule only moved on real steps
    assert state["scaler"]["scale"] < 2.0**24
    steps = [r for r in metrics(run_dir) if r["event"] == "step"]
    assert [r["step"] for r in steps] == list(range(1, state["step"] + 1))
    assert steps[-1]["skipped_steps"] == skipped and steps[-1]["loss_scale"] == state["scaler"]["scale"]
    assert manifest(run_dir)["stages"]["train"]["details"]["skipped_steps"] == skipped


def test_fp32_warmup_epochs_then_requested_precision(tmp_path):
    run_dir = tmp_path / "run"
    assert cli("train", "--model", "tiny_cnn", "--run-dir", run_dir, *TINY_TRAIN, "data.samples_per_class=4",
               "data.batch_size=8", "train.epochs=3", "train.amp=bf16", "train.fp32_warmup_epochs=2") == 0
    assert [r["amp"] for r in metrics(run_dir) if r["event"] == "epoch"] == ["off", "off", "bf16"]
    assert manifest(run_dir)["stages"]["train"]["details"]["amp"] == "bf16"


# --------------------------------------------------------------------------- init_weights


class Payload:
    """Unpickling this runs a shell command that creates ``marker``."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def tiny_state(num_classes: int, width: int = 16) -> dict:
    from models.tiny import TinyCNN

    torch.manual_seed(123)
    return TinyCNN(num_classes, width).state_dict()


def test_init_weights_from_a_1000_class_safetensors_replaces_the_head(tmp_path):
    from safetensors.torch import save_file

    src = tiny_state(1000)
    path = tmp_path / "imagenet.safetensors"
    save_file(src, str(path))
    run_dir = tmp_path / "run"
    assert cli("train", "--model", "tiny_cnn", "--run-dir", run_dir, *TINY_TRAIN, f"train.init_weights={path}") == 0
    info = manifest(run_dir)["stages"]["train"]["details"]["init_weights"]
    assert sorted(info["replaced_head"]) == ["fc.bias (1000,) -> (10,)", "fc.weight (1000, 32) -> (10, 32)"]
    assert info["missing_keys"] == [] and info["unexpected_keys"] == []
    # What was loaded, before any training: everything but the head comes from the file.
    from models.tiny import TinyCNN

    module = TinyCNN(10)
    modeling.load_init_weights(module, str(path))
    own = module.state_dict()
    for key, value in src.items():
        if not key.startswith("fc."):
            assert torch.equal(own[key], value), key
    assert own["fc.weight"].shape == (10, 32)


def test_init_weights_from_pt_and_refusals(tmp_path, capsys):
    from models.tiny import TinyCNN

    pt = tmp_path / "w.pt"
    torch.save({"state_dict": tiny_state(10)}, pt)
    module = TinyCNN(10)
    info = modeling.load_init_weights(module, str(pt))
    assert info["replaced_head"] == [] and info["missing_keys"] == []
    assert_same_tensors(module.state_dict(), tiny_state(10))

    narrow = tmp_path / "narrow.pt"
    torch.save(tiny_state(10, width=8), narrow)
    with pytest.raises(InputError, match=r"does not fit model: features\.0\.weight: file \(8, 3, 3, 3\)"):
        modeling.load_init_weights(TinyCNN(10), str(narrow))
    rc = cli("train", "--model", "tiny_cnn", "--run-dir", tmp_path / "run", *TINY_TRAIN,
             f"train.init_weights={narrow}")
    err = capsys.readouterr().err
    assert rc == 2 and "does not fit model" in err and "Traceback" not in err


def test_malicious_init_weights_are_refused_without_running_them(tmp_path, capsys):
    marker = tmp_path / "pwned"
    raw, zipped = tmp_path / "evil.pt", tmp_path / "evil-zip.pt"
    raw.write_bytes(pickle.dumps(Payload(marker), protocol=2))  # a bare pickle
    torch.save({"fc.weight": torch.zeros(1), "x": Payload(marker)}, zipped)  # torch.save's zip format
    assert not marker.exists()
    # as a user runs it: a separate process, one error line, exit code 2
    out = run_cli("train", "--model", "tiny_cnn", "--run-dir", tmp_path / "run", *TINY_TRAIN,
                  f"train.init_weights={raw}", env={"OMP_NUM_THREADS": "1"})
    assert out.returncode == 2, out.stderr
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "weights file refused" in errors[0] and "Traceback" not in out.stderr
    assert cli("train", "--model", "tiny_cnn", "--run-dir", tmp_path / "run2", *TINY_TRAIN,
               f"train.init_weights={zipped}") == 2
    assert "weights file refused" in capsys.readouterr().err
    assert not marker.exists(), "the pickle's payload ran"


# --------------------------------------------------------------------------- profile and bench-train


def test_train_profile_writes_a_chrome_trace(tmp_path):
    run_dir = tmp_path / "run"
    assert cli("train", "--profile", "--model", "tiny_cnn", "--run-dir", run_dir, *TINY_TRAIN,
               "train.profile_steps=2") == 0
    trace = json.loads((run_dir / TRACE).read_text())
    assert isinstance(trace["traceEvents"], list) and trace["traceEvents"]
    assert TRACE in manifest(run_dir)["stages"]["train"]["artifacts"]


def test_bench_train_prints_both_precisions_and_the_ratio(tmp_path, capsys):
    assert cli("bench-train", "--model", "tiny_cnn", "--run-dir", tmp_path, "--steps", "4", "data.image_size=16",
               "data.batch_size=16") == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split() for line in out.splitlines()[2:4]}
    assert set(rows) == {"fp32", "bf16"}
    for row in rows.values():
        assert float(row[1]) > 0 and float(row[3]) > 0  # images/s and final loss
    assert "speed-up bf16 / fp32:" in out and out.strip().splitlines()[-1].split(":")[1].split()[0].endswith("x")


def test_bench_train_report_keeps_its_shape():
    """bench-train's result typed (issue 47): ``to_json`` keeps the report's keys, ``results`` keyed by precision."""
    from pipeline.bench_train import PrecisionRun, TrainBench, format_result

    fp32, bf16 = PrecisionRun(100.0, 10.0, (2.0, 1.0), 1.0), PrecisionRun(150.0, 6.5, (2.0, 1.25), 1.25)
    r = TrainBench(model="tiny_cnn", device="cpu", cpu="X", cpu_native_bf16=False, gpu=None, threads=2, image_size=16,
                   batch_size=16, channels_last=False, steps=2, amp="bf16", fp32=fp32, amp_run=bf16)
    assert list(r.to_json()) == ["model", "device", "cpu", "cpu_native_bf16", "gpu", "threads", "image_size",
                                 "batch_size", "channels_last", "steps", "amp", "results", "speedup"]
    assert r.to_json()["results"] == {"fp32": {"images_per_s": 100.0, "step_ms_median": 10.0, "losses": [2.0, 1.0],
                                               "final_loss": 1.0},
                                      "bf16": {"images_per_s": 150.0, "step_ms_median": 6.5, "losses": [2.0, 1.25],
                                               "final_loss": 1.25}}
    lines = format_result(r).splitlines()
    assert lines[2].split() == ["fp32", "100.0", "10.0", "1.0000"] and lines[3].split()[0] == "bf16"
    assert lines[-1] == "  speed-up bf16 / fp32: 1.50x (same batches, same initial weights)"


# --------------------------------------------------------------------------- small pieces


def test_lr_schedule_warms_up_then_decays_to_zero():
    f = optim.lr_lambda(total_steps=10, warmup_steps=4)
    assert [f(s) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert f(4) == 1.0 and f(10) == pytest.approx(0.0) and f(7) == pytest.approx(0.5)
    assert optim.lr_lambda(5, 0)(0) == 1.0


def test_too_few_images_for_one_batch_is_a_usage_error(tmp_path, capsys):
    rc = cli("train", "--model", "tiny_cnn", "--run-dir", tmp_path / "run", *TINY_TRAIN, "data.batch_size=512")
    assert rc == 2 and "fewer than one batch of 512" in capsys.readouterr().err


def test_state_checksum_ignores_memory_format_but_sees_values():
    t = torch.randn(2, 3, 4, 4)
    a = distributed.state_checksum({"w": t})
    assert distributed.state_checksum({"w": t.contiguous(memory_format=torch.channels_last)}) == a
    u = t.clone()
    u[0, 0, 0, 0] += 1e-6
    assert distributed.state_checksum({"w": u}) != a
    assert distributed.state_checksum({"v": t}) != a


# --------------------------------------------------------------------------- resume on another GPU count
# No GPU here: torch.cuda is replaced by a machine with ``gpus`` devices whose set_rng_state fails for a device
# that does not exist, as torch's own does (``torch.cuda.default_generators[idx]`` raises IndexError).


@pytest.fixture
def cuda_machine(monkeypatch):
    import logging

    import torch

    restored, messages = [], []

    def machine(gpus: int):
        def set_rng_state(new_state, device="cuda"):
            index = device if isinstance(device, int) else torch.device(device).index
            if index >= gpus:
                raise IndexError("list index out of range")
            restored.append((index, int(new_state[0])))

        monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
        monkeypatch.setattr(torch.cuda, "set_rng_state", set_rng_state)
        monkeypatch.setattr(torch.cuda.random, "set_rng_state", set_rng_state)  # what set_rng_state_all calls
        return restored, messages

    handler = logging.Handler()
    handler.emit = lambda record: messages.append(record.getMessage())
    logger = logging.getLogger("pipeline")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield machine
    logger.removeHandler(handler)
    logger.setLevel(level)


def checkpoint_rng(saved_gpus: int) -> rng.RngState:
    import dataclasses

    import torch

    return dataclasses.replace(rng.rng_state(),
                               cuda=tuple(torch.full((8,), i, dtype=torch.uint8) for i in range(saved_gpus)))


@pytest.mark.parametrize("saved, here, restored_devices, said", [
    (4, 2, [0, 1], "restored the CUDA RNG state of 2 of the checkpoint's 4 GPU(s) (this machine has 2); "
                   "GPU(s) 2-3 of the checkpoint do not exist here"),
    (1, 2, [0], "restored the CUDA RNG state of 1 of the checkpoint's 1 GPU(s) (this machine has 2); "
                "GPU(s) 1-1 here keep this run's seed"),
    (2, 0, [], "restored the CUDA RNG state of 0 of the checkpoint's 2 GPU(s) (this machine has 0)"),
    (2, 2, [0, 1], "restored the CUDA RNG state of all 2 GPU(s)"),
])
def test_resume_restores_the_cuda_rng_of_the_gpus_that_exist(cuda_machine, saved, here, restored_devices, said):
    state = checkpoint_rng(saved)  # taken on this (CPU) machine, then given the saved GPUs' states
    restored, messages = cuda_machine(here)
    rng.set_rng_state(state)
    assert restored == [(i, i) for i in restored_devices]  # GPU i gets the checkpoint's state of GPU i
    assert any(said in m for m in messages), messages


def test_a_checkpoint_without_cuda_state_restores_nothing_on_a_gpu(cuda_machine):
    import dataclasses

    state = dataclasses.replace(rng.rng_state(), cuda=())
    restored, messages = cuda_machine(2)
    rng.set_rng_state(state)
    assert restored == [] and not any("CUDA RNG" in m for m in messages)


def test_metrics_lines_are_read_typed_and_a_damaged_line_is_one_input_error(tmp_path):
    """metrics.jsonl's reader (issue 47): typed lines; a line of the wrong type or an unknown event is an
    InputError naming the line, not a KeyError later."""
    from pipeline.training.records import RunLine, read_lines

    path = tmp_path / "m.jsonl"
    path.write_text('{"event": "start", "epoch": 0, "step": 0, "time": 1.5}\n'
                    '{"event": "epoch", "epoch": 0, "step": 3, "val_loss": 0.5, "val_acc": 0.25}\n')
    start, epoch = read_lines(path)
    assert start == RunLine(event="start", epoch=0, step=0, time=1.5) and (epoch.val_acc, epoch.step) == (0.25, 3)
    for bad in ('{"event": "step", "step": "3"}', '{"event": "restart", "step": 3}', '[1, 2]'):
        path.write_text(bad + "\n")
        with pytest.raises(InputError, match="line 1"):
            read_lines(path)


def test_train_results_write_the_manifests_shape():
    """The manifest's details keep their keys and order; absent keys stay absent (issue 47)."""
    from pipeline.training.records import EpochRecord, PreciseBnDetails, TrainResult

    history = (EpochRecord(1, 0.5, 0.75), EpochRecord(2, 0.25, 0.875, val_acc_before_precise_bn=0.5))
    assert [h.to_json() for h in history] == [{"epoch": 1, "val_loss": 0.5, "val_acc": 0.75},
                                             {"epoch": 2, "val_loss": 0.25, "val_acc": 0.875,
                                              "val_acc_before_precise_bn": 0.5}]
    result = TrainResult(epochs=2, steps=8, skipped_steps=0, final_val_acc=0.875, final_val_loss=0.25,
                         best_val_acc=0.875, best_epoch=2, train_seconds=1.5, images_per_s=10.0, history=history,
                         final_weights_sha256="ab", replica_sha256=None,
                         precise_bn=PreciseBnDetails(True, 3, 2, 0.5, 0.875))
    keys = ["epochs", "steps", "skipped_steps", "final_val_acc", "final_val_loss", "best_val_acc", "best_epoch",
            "train_seconds", "images_per_s", "history", "final_weights_sha256", "precise_bn"]
    assert list(result.to_json()) == keys
    assert result.to_json()["precise_bn"] == {"enabled": True, "batchnorm_layers": 3, "batches": 2,
                                              "best_epoch_val_acc_before": 0.5, "best_epoch_val_acc_after": 0.875}
    import dataclasses

    ddp = dataclasses.replace(result, replica_sha256=("ab", "ab")).to_json()
    assert list(ddp) == [*keys[:-1], "replica_sha256", "replicas_identical", "precise_bn"]
    assert ddp["replica_sha256"] == ["ab", "ab"] and ddp["replicas_identical"] is True


def test_checkpoint_keeps_its_file_shape_and_refuses_a_damaged_one(tmp_path):
    """The checkpoint typed (issue 47): ``to_state`` writes the keys torch.save always wrote, in order; a key missing
    or of the wrong type is one InputError naming it (after the weights-only load, which stays the same)."""
    state = {"format": checkpoint.CHECKPOINT_FORMAT, "model": {"w": torch.zeros(2)}, "optimizer": {}, "scheduler": {},
             "scaler": {}, "epoch": 1, "batch": 0, "step": 6, "best_acc": 0.5, "skipped_steps": 0,
             "rng": rng.rng_state().to_state(),
             "config": {"train": {"epochs": 3}}, "spec": {}, "classes": ["a", "b"]}
    path = tmp_path / "c.pt"
    torch.save(state, path)
    saved = checkpoint.load_checkpoint(path)
    assert (saved.epoch, saved.step, saved.made_for_epochs, saved.source_weights_sha256) == (1, 6, 3, None)
    assert list(saved.to_state()) == list(state)
    checkpoint.save_checkpoint(tmp_path / "again.pt", saved)
    assert list(torch.load(tmp_path / "again.pt", weights_only=True)) == list(state)
    for key, value in (("step", "6"), ("model", [1]), ("epoch", True), ("rng", None)):  # the type checks
        torch.save({**state, key: value}, path)
        with pytest.raises(InputError, match=f"damaged: its '{key}'"):
            checkpoint.load_checkpoint(path)
    torch.save({**state, "model": {"w": 1}}, path)
    with pytest.raises(InputError, match="other than named tensors"):
        checkpoint.load_checkpoint(path)
    torch.save({**state, "rng": {**state["rng"], "torch": [1, 2]}}, path)
    with pytest.raises(InputError, match="its 'rng' is not"):
        checkpoint.load_checkpoint(path)
