"""Every registered model learns with its card's training defaults, and a model that did not learn is said so and
never exported (issue 31: MobileNetV3 trained to chance with every stage green)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import TINY, cli
from pipeline import stages
from pipeline.core import artifacts
from pipeline.core.registry import models
from pipeline.core.run import RunDir

# The embedded data set, smaller: 4 classes, so chance is 25 %, and each model trains for seconds at its card's
# smallest input size with the rest of its recipe (optimizer, lr, schedule, BatchNorm) as the card says.
SMALL_DATA = ["data.num_classes=4", "train.tensorboard=false", "train.log_every=100"]
# Per model: images per class, epochs, batch size; fewer images for the models that take longest per image.
SIZES = {
    "tiny_cnn": (40, 4, 64), "vit_micro": (40, 4, 64), "resnet18": (24, 2, 64),
    "resnet34": (24, 2, 64), "resnet50": (24, 2, 64), "vit_tiny_patch16_224": (24, 3, 64),
}
SLOW = {"resnet34", "resnet50", "vit_tiny_patch16_224"}


def details(run: Path, stage: str = "train") -> dict:
    return json.loads((run / artifacts.MANIFEST).read_text())["stages"][stage]["details"]


def test_every_registered_model_is_in_the_table_below():
    assert set(SIZES) == set(models.list_models()) - AT_ITS_DEFAULTS


# MobileNetV3 learns with its recipe in the test at its defaults below (10 classes, then every stage), which checks
# the same learning verdict and eval-mode agreement: training it here too cost 12 s of the suite.
AT_ITS_DEFAULTS = {"mobilenet_v3_small"}
# The detectors learn (mAP against an untrained model's) in tests/test_detection.py.
AT_ITS_DEFAULTS |= {n for n in models.list_models() if models.get_spec(n).task == "detection"}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n
                                  for n in models.list_models() if n not in AT_ITS_DEFAULTS])
def test_every_registered_model_learns_with_its_recipe(name, tmp_path):
    per_class, epochs, batch = SIZES[name]
    size = models.get_recipe(name).min_image_size
    run = tmp_path / name
    assert cli("train", "--model", name, "--run-dir", run, *SMALL_DATA, f"data.samples_per_class={per_class}",
               f"data.image_size={size}", f"train.epochs={epochs}", f"data.batch_size={batch}") == 0
    learning = details(run)["learning"]  # learned: the accuracy's lower bound (95 %) is above chance
    assert learning["learned"] and learning["accuracy"] >= 0.5, learning["line"]  # twice chance, at least
    assert not learning["mode_gap"] and learning["mode_agreement"] >= 0.7, learning  # eval mode does as train mode


# --------------------------------------------------------------------------- issue 31: MobileNetV3 at its defaults

# The smallest settings that still show it: 10 classes (chance 10 %) of 60 images, 32x32 (the card's smallest),
# 3 epochs of batches of 32, the card's recipe otherwise.
STAGES_SMALL = [a for a in TINY if not a.startswith(("data.", "train."))]  # export, verify, benchmark: small
# FP16 and OpenVINO's BF16 off: how a briefly trained MobileNetV3 fares in them is the gate's business (its scaled
# error is near the limit at these small logits: OpenVINO BF16 on AMX tiles gave 0.207 of 0.2, on AVX512-BF16 it
# passed), not this file's.
MOBILENET = ["--model", "mobilenet_v3_small", "data.samples_per_class=60", "data.batch_size=32", "train.epochs=3",
             "train.log_every=100", "train.tensorboard=false", *STAGES_SMALL, "export.fp16.enabled=false",
             "verify.candidates.openvino_bf16.enabled=false",
             "benchmark.backends=[torch_fp32,onnxrt_fp32]"]


@pytest.mark.slow
def test_mobilenet_v3_small_learns_with_its_defaults_and_all_exits_0(tmp_path):
    run = tmp_path / "run"
    assert cli("all", "--run-dir", run, *MOBILENET) == 0
    d = details(run)
    assert d["learning"]["learned"] and d["learning"]["accuracy"] >= 0.3, d["learning"]["line"]
    assert not d["learning"]["mode_gap"] and d["learning"]["mode_agreement"] >= 0.7, d["learning"]
    assert d["precise_bn"]["enabled"] and d["precise_bn"]["best_epoch_val_acc_after"] > \
        d["precise_bn"]["best_epoch_val_acc_before"]
    verify = details(run, "verify")
    assert verify["reference_learned"] is True and verify["reference_accuracy"] >= 0.3


@pytest.mark.slow
def test_mobilenet_v3_small_without_precise_bn_did_not_learn_and_nothing_is_exported(tmp_path, capsys):
    run = tmp_path / "run"
    assert cli("all", "--run-dir", run, *MOBILENET, "train.epochs=1", "train.precise_bn.enabled=false") == 1
    out, err = capsys.readouterr()
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(
        "error: train: the model did not learn: val acc 10.0 % is chance for 10 classes ("), err
    assert "likely cause: the BatchNorm running statistics" in errors[0] and "Traceback" not in err
    manifest = json.loads((run / artifacts.MANIFEST).read_text())
    assert manifest["stages"]["train"]["status"] == "failed" and manifest["stages"]["train"]["exit_code"] == 1
    assert "export" not in manifest["stages"] and not (run / artifacts.FP32_ONNX).exists()
    train_line = next(line for line in out.splitlines() if line.strip().startswith("train "))
    assert train_line.split()[:8] == ["train", "failed", "best", "val", "acc", "10.0%", "after", "1"]
    assert "; the model did not learn: val acc 10.0 %" in train_line
    assert "export     not run" in out


# --------------------------------------------------------------------------- a model that cannot learn, fast

# Answers class 0 for every image: its one parameter shifts every logit alike. Validation accuracy is exactly 1/10.
CONSTANT = '''
import torch
from torch import nn


class Constant(nn.Module):
    def __init__(self, num_classes):
        super().__init__()
        self.register_buffer("preference", torch.eye(num_classes)[0] * 2)
        self.shift = nn.Parameter(torch.zeros(1))

    def forward(self, x):
        return self.preference + self.shift * x.mean((1, 2, 3)).unsqueeze(1)


def constant(num_classes=10):
    """The same class for every image."""
    return Constant(num_classes)
'''


@pytest.fixture
def constant_model(tmp_path) -> str:
    path = tmp_path / "constant.py"
    path.write_text(CONSTANT)
    return f"{path}:constant"


def test_a_model_that_did_not_learn_fails_train_and_verify_by_hand_says_so(constant_model, tmp_path, capsys):
    run = tmp_path / "run"
    assert cli("train", "--model", constant_model, "--run-dir", run, *TINY, "train.require_learning=true") == 1
    err = capsys.readouterr().err
    assert "error: train: the model did not learn: val acc 10.0 % is chance for 10 classes" in err
    assert (run / artifacts.WEIGHTS).is_file()  # written, so a user can still look at it
    assert cli("export", "--run-dir", run) == 0
    assert cli("verify", "--run-dir", run) == 0  # the artifacts do agree with the reference...
    err = capsys.readouterr().err
    assert "verify: the reference did not learn (train: the model did not learn: val acc 10.0 %" in err
    assert "reference (FP32) val acc 10.0% (it did not learn)" in err
    line = next(li for li in stages.summary(RunDir(run)).splitlines() if li.strip().startswith("verify"))
    # ... "passed" is not "good"
    assert "reference (FP32) val acc 10.0% (it did not learn); onnxrt_fp32: passed" in line


def test_require_learning_false_goes_on_and_min_val_accuracy_gates(constant_model, tmp_path, capsys):
    run = tmp_path / "run"
    assert cli("all", "--model", constant_model, "--run-dir", run, *TINY) == 0  # TINY: train.require_learning=false
    out = capsys.readouterr()
    assert ("the model did not learn: val acc 10.0 %" in out.err
            and "(train.require_learning=false: going on)" in out.err)
    assert "reference (FP32) val acc 10.0% (it did not learn)" in out.out  # the summary's verify line
    assert cli("train", "--model", "tiny_cnn", "--run-dir", tmp_path / "gated", *TINY,
               "train.min_val_accuracy=0.99") == 1
    err = capsys.readouterr().err
    assert "error: train: val acc" in err and "is below train.min_val_accuracy 99.0 %" in err
