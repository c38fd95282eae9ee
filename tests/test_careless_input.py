"""Careless input, each said in one line with exit 2 before any work, and what tune and the data loader say
(issue 46, low cases)."""

from __future__ import annotations

import logging
import warnings

import pytest

from conftest import TINY, cli
from pipeline import config
from pipeline.core.errors import ConfigError


def _one_error(capsys) -> str:
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, errors
    return errors[0]


# --------------------------------------------------------------------------- --model


@pytest.mark.parametrize(("model", "said"), [
    ("", "--model is empty"),
    ("   ", "--model is empty"),
    ("tiny_cnn\n", 'holds a control character'),
    ("a\tb", 'holds a control character'),
])
def test_an_empty_or_control_character_model_is_refused_not_defaulted(tmp_path, capsys, model, said):
    run = tmp_path / "run"
    assert cli("train", "--model", model, "--run-dir", run, *TINY) == 2
    line = _one_error(capsys)
    assert said in line and "YAML" not in line, line
    assert not run.exists()  # nothing was written, no resnet18 trained


def test_a_model_name_is_never_read_as_yaml(tmp_path, capsys):
    run = tmp_path / "run"
    assert cli("train", "--model", "tiny_cnn # a comment", "--run-dir", run, *TINY) == 2
    line = _one_error(capsys)
    assert "tiny_cnn # a comment" in line, line  # the whole name, refused: not tiny_cnn with a YAML comment
    assert not (run / "model.safetensors").exists()
    cfg = config.resolve(overrides=['model.name="x # c"'])
    assert cfg.model.name == "x # c"


# --------------------------------------------------------------------------- tune


def test_a_repeated_calibration_method_is_refused_before_any_work(tmp_path, capsys):
    with pytest.raises(ConfigError) as caught:
        config.resolve(overrides=["tune.calibration_methods=[max,entropy,max]"])
    assert caught.value.problems == ["tune.calibration_methods names max more than once: each method is searched "
                                     "once; list it once"]
    assert config.resolve(overrides=["tune.calibration_methods=[entropy,max]"]).tune.calibration_methods == \
        ["entropy", "max"]
    assert cli("tune", "--run-dir", tmp_path / "run", "tune.calibration_methods=[entropy,entropy]") == 2
    assert "names entropy more than once" in _one_error(capsys)


def test_tunes_summary_counts_only_its_layers_and_names_the_other_nodes():
    from pipeline.precision.sensitivity import Candidate
    from pipeline.reports import tune_report
    from test_tune_result import made

    assert tune_report.raised_layers(["conv2", "pool", "flatten", "conv2"], ["conv1", "conv2"]) == (1, 2)
    chosen = Candidate(["conv1", "conv2", "pool"], "greedy fallback", calibration="max")
    p = made(precision="int8", raised="out of INT8", speedup_vs_fp32={}, no_speedup_claimed="")
    assert tune_report._summary(p, chosen, ["conv1", "conv2"], "int8_fallback.json").startswith(
        "INT8: 2 of 2 layers and 1 other node out of INT8 (max)")
    chosen.high = ["conv2"]
    assert tune_report._summary(p, chosen, ["conv1", "conv2"], "f").startswith("INT8: 1 of 2 layers out of INT8 (max)")


# --------------------------------------------------------------------------- resuming


def test_resuming_past_the_epochs_asked_for_is_refused_naming_the_setting(tmp_path, capsys):
    from pipeline.training.qat_recipe import QATTrainer
    from pipeline.training.trainer import Trainer

    run = tmp_path / "run"
    assert cli("train", "--model", "tiny_cnn", "--run-dir", run, *TINY, "train.epochs=2") == 0
    capsys.readouterr()
    assert cli("train", "--resume", "--run-dir", run, "train.epochs=1") == 2
    line = _one_error(capsys)
    assert "checkpoint.pt has already trained 2 epochs, more than train.epochs=1" in line, line
    assert (Trainer.stage_name, Trainer.epochs_setting) == ("train", "train.epochs")
    assert (QATTrainer.stage_name, QATTrainer.epochs_setting) == ("qat", "qat.epochs")  # qat --resume's words


# --------------------------------------------------------------------------- images


def test_a_decompression_bomb_warning_becomes_one_line_naming_the_image(tmp_path, caplog):
    from PIL import Image

    from pipeline.core import data

    big = tmp_path / "big.png"
    side = int(Image.MAX_IMAGE_PIXELS ** 0.5) + 10  # over Pillow's warning limit, under its error limit
    Image.new("1", (side, side)).save(big)
    small = tmp_path / "small.png"
    Image.new("RGB", (8, 8)).save(small)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a raw warning would fail here
        with caplog.at_level(logging.WARNING, logger="pipeline"):
            data._check_images([big, small])
    (line,) = caplog.messages
    assert str(big) in line and f"{side * side:,} pixels" in line and "decompression-bomb limit" in line
