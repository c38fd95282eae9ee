"""Odd data and bring-your-own models (issue 13, part 4): split-folder layouts, 16-bit images, FIFOs,
one normalisation for every stage, factory failures and ``train.init_weights`` that does not fit."""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from conftest import TINY, cli
from pipeline import config
from pipeline.core import data as data_mod
from pipeline.core.errors import EXIT_OK, EXIT_USAGE, DataError

MEAN, STD = (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)


def load(root: Path, size: int = 16, **overrides) -> data_mod.DataSplits:
    cfg = config.resolve(overrides=["data.source=imagefolder", f"data.path={root}",
                                    *(f"data.{k}={v}" for k, v in overrides.items())]).data
    return data_mod.load(cfg, image_size=size, mean=MEAN, std=STD)


def make_folder(root: Path, classes: dict[str, int]) -> Path:
    for i, (name, count) in enumerate(classes.items()):
        for j in range(count):
            path = root / name / f"img{j}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.new("RGB", (20, 14), (40 * i, 10 * j, 200)).save(path)
    return root


def run_main(capsys, *args) -> tuple[int, str]:
    capsys.readouterr()
    code = cli("-q", *args)
    return code, capsys.readouterr().err


def error_lines(err: str) -> list[str]:
    assert "Traceback" not in err, err
    return [line for line in err.splitlines() if line.startswith("error:")]


# --------------------------------------------------------------------------- ImageFolder layouts


def test_train_folder_without_val_is_split_not_read_as_one_class(tmp_path, caplog):
    make_folder(tmp_path / "imgs" / "train", {"cat": 5, "dog": 5})
    with caplog.at_level(logging.INFO, logger="pipeline"):
        splits = load(tmp_path / "imgs", val_fraction=0.2)
    assert splits.classes == ["cat", "dog"]
    assert (len(splits.train), len(splits.val)) == (8, 2) and sorted(splits.val.labels) == [0, 1]
    assert splits.details["layout"] == f"split folders train/ in {tmp_path / 'imgs'}"
    assert "stratified 20% held out" in splits.details["split"] and "of train/" in splits.details["split"]
    assert "split folders train/" in caplog.text


def test_test_folder_is_the_validation_split_when_there_is_no_val(tmp_path):
    make_folder(tmp_path / "imgs" / "train", {"cat": 3, "dog": 3})
    make_folder(tmp_path / "imgs" / "test", {"cat": 1, "dog": 2})
    splits = load(tmp_path / "imgs")
    assert (len(splits.train), len(splits.val)) == (6, 3)
    assert splits.details["split"].startswith("train/ and test/ folders")
    # with val/ as well, val/ is the validation split and test/ is left alone
    make_folder(tmp_path / "imgs" / "val", {"cat": 1, "dog": 1})
    splits = load(tmp_path / "imgs")
    assert len(splits.val) == 2 and splits.details["split"] == "train/ and val/ folders (test/ is not used)"


def test_split_folders_inside_one_wrapping_folder_or_inside_each_class(tmp_path):
    make_folder(tmp_path / "a" / "cats_vs_dogs" / "Train", {"cat": 3, "dog": 3})
    make_folder(tmp_path / "a" / "cats_vs_dogs" / "validation", {"cat": 1, "dog": 1})
    splits = load(tmp_path / "a")
    assert splits.classes == ["cat", "dog"] and (len(splits.train), len(splits.val)) == (6, 2)
    assert splits.details["layout"] == f"split folders Train/, validation/ in {tmp_path / 'a' / 'cats_vs_dogs'}"

    for name in ("cat", "dog"):
        make_folder(tmp_path / "b" / name, {"train": 3, "val": 1})
    splits = load(tmp_path / "b")
    assert splits.classes == ["cat", "dog"] and (len(splits.train), len(splits.val)) == (6, 2)
    assert "inside each class folder" in splits.details["layout"]
    assert all(f.parent.name == "val" for f in splits.val.files)


def test_a_single_class_is_a_data_error(tmp_path, capsys):
    make_folder(tmp_path / "one", {"cat": 4})
    with pytest.raises(DataError, match=r"has one class \('cat'.*a classifier needs at least two"):
        load(tmp_path / "one")
    make_folder(tmp_path / "imgs" / "train", {"cat": 4})
    code, err = run_main(capsys, "train", "--model", "tiny_cnn", "--run-dir", tmp_path / "r", *TINY,
                         "data.source=imagefolder", f"data.path={tmp_path / 'imgs'}")
    assert code == EXIT_USAGE
    (line,) = error_lines(err)
    assert "has one class ('cat'" in line and not (tmp_path / "r" / "checkpoint.pt").exists()


def test_split_folders_beside_class_folders_or_without_train_are_refused(tmp_path):
    make_folder(tmp_path / "mixed", {"train/cat": 2, "train/dog": 2, "bird": 2})
    with pytest.raises(DataError, match=r"mixes split folders \(train/\) with other folders \(bird\)"):
        load(tmp_path / "mixed")
    make_folder(tmp_path / "noval", {"val/cat": 2, "val/dog": 2, "test/cat": 1, "test/dog": 1})
    with pytest.raises(DataError, match="has val/, test/ but no train/ folder"):
        load(tmp_path / "noval")


# --------------------------------------------------------------------------- image content and file types


def test_16_bit_png_is_scaled_to_8_bits_not_clipped(tmp_path):
    gradient = np.tile(np.linspace(0, 65535, 64).round().astype(np.uint16), (64, 1))
    path = tmp_path / "g16.png"
    Image.fromarray(gradient).save(path)
    with Image.open(path) as img:
        assert img.mode == "I;16"
    image = data_mod.load_image(path, 64)
    assert image.shape == (3, 64, 64) and torch.equal(image[0], image[2])
    row = image[0, 32].numpy().astype(int)
    expected = np.round(gradient[0] / 257).astype(int)
    assert np.abs(row - expected).max() <= 1, row
    assert (image == 255).float().mean() < 0.05  # clipping saturated 98% of the gradient


def test_a_fifo_named_like_an_image_is_skipped_not_opened(tmp_path, caplog):
    root = make_folder(tmp_path / "imgs", {"cat": 3, "dog": 3})
    fifo = root / "cat" / "stream.png"
    os.mkfifo(fifo)
    result = {}

    def scan():
        try:
            result["splits"] = load(root, val_fraction=0.34)
        except Exception as exc:  # reported below
            result["error"] = exc

    with caplog.at_level(logging.WARNING, logger="pipeline"):
        thread = threading.Thread(target=scan, daemon=True)
        thread.start()
        thread.join(30)
        if thread.is_alive():  # release the reader blocked on the FIFO, then fail
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            os.close(fd)
            thread.join(10)
            pytest.fail("the scan blocked on a FIFO")
    assert "error" not in result, result.get("error")
    splits = result["splits"]
    assert len(splits.train) + len(splits.val) == 6
    assert splits.details["skipped_not_regular_files"] == [str(fifo)]
    assert "skipped 1 path(s) that are not regular files" in caplog.text and str(fifo) in caplog.text


# --------------------------------------------------------------------------- one normalisation

README_FACTORY = '''
import torch
from torch import nn

def my_net(num_classes: int = 10):
    """A small CNN of mine."""
    net = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
                        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, num_classes))
    net.mean, net.std = (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)  # optional: the normalisation it expects
    return net
'''


def test_a_user_models_declared_normalisation_is_what_the_data_is_loaded_with(tmp_path):
    from pipeline.core import modeling

    path = tmp_path / "my_net.py"
    path.write_text(README_FACTORY)
    cfg = config.resolve(overrides=[f"model.name={path}:my_net"])
    assert modeling.normalisation(cfg, modeling.resolve_spec(cfg)) == (MEAN, STD)
    # a config value still wins over the factory's
    cfg = config.resolve(overrides=[f"model.name={path}:my_net", "model.mean=[0.1,0.2,0.3]"])
    assert modeling.normalisation(cfg, modeling.resolve_spec(cfg)) == ((0.1, 0.2, 0.3), STD)


def test_train_loads_the_data_with_the_normalisation_in_the_model_card(tmp_path):
    """The README's example: training, the model card and so export, verify and benchmark use one normalisation."""
    path = tmp_path / "my_net.py"
    path.write_text(README_FACTORY)
    run = tmp_path / "run"
    assert cli("-q", "train", "--model", f"{path}:my_net", "--run-dir", run, *TINY) == EXIT_OK
    card = json.loads((run / "model.json").read_text())
    used = json.loads((run / "manifest.json").read_text())["stages"]["train"]["details"]["data"]["normalisation"]
    assert card["input"]["normalisation"] == used == {"mean": list(MEAN), "std": list(STD)}
    assert card["spec"]["mean"] == list(MEAN) and card["spec"]["std"] == list(STD)


# --------------------------------------------------------------------------- factory failures

FACTORIES = {
    "raises": ("raise RuntimeError('no GPU here\\nsecond line')", "factory make() raised RuntimeError: no GPU here"),
    "not a module": ("return [nn.Linear(3, num_classes)]", "factory make returned list, not an nn.Module"),
    "same names": ("net.input_name = net.output_name = 'x'",
                   "factory make sets input_name and output_name both to 'x'"),
    "empty input name": ("net.input_name = ''", "factory make sets input_name='': expected a non-empty string"),
    "bad mean": ("net.mean = (0.5, 0.5)", "factory make sets mean=(0.5, 0.5): expected 3 finite numbers"),
    "mean not numbers": ("net.mean = 'imagenet'", "factory make sets mean='imagenet'"),
    "zero std": ("net.std = (0.2, 0.0, 0.2)", "factory make sets std=(0.2, 0.0, 0.2): expected 3 finite numbers"),
    "bad input size": ("net.input_size = (3, 0, 32)", "factory make sets input_size=(3, 0, 32)"),
}


@pytest.mark.parametrize("case", list(FACTORIES))
def test_a_broken_factory_is_exit_2_at_train_time_naming_it(tmp_path, capsys, case):
    line, fragment = FACTORIES[case]
    path = tmp_path / "broken.py"
    path.write_text("from torch import nn\n\n\ndef make(num_classes=10):\n"
                    "    net = nn.Sequential(nn.Flatten(), nn.LazyLinear(num_classes))\n"
                    f"    {line}\n    return net\n")
    code, err = run_main(capsys, "train", "--model", f"{path}:make", "--run-dir", tmp_path / "r", *TINY)
    assert code == EXIT_USAGE, err
    (message,) = error_lines(err)
    assert message.startswith("error: train: ") and fragment in message, message
    assert f"{path}:make" in message and "re-run train" not in message
    assert not (tmp_path / "r" / "model.json").exists()


# --------------------------------------------------------------------------- train.init_weights


def _tiny_state(num_classes: int = 10) -> dict:
    from models.tiny import TinyCNN

    torch.manual_seed(7)
    return TinyCNN(num_classes).state_dict()


def test_init_weights_that_match_no_key_are_refused_naming_the_keys(tmp_path, capsys):
    from safetensors.torch import save_file

    path = tmp_path / "prefixed.safetensors"
    save_file({f"backbone.{k}": v for k, v in _tiny_state().items()}, str(path))
    code, err = run_main(capsys, "train", "--model", "tiny_cnn", "--run-dir", tmp_path / "r", *TINY,
                         f"train.init_weights={path}")
    assert code == EXIT_USAGE
    (message,) = error_lines(err)
    assert "does not match the model" in message and "keys are not in the file: features.0.weight" in message
    assert "keys of the file are not in the model: backbone." in message and "backbone.features.0.weight" in message
    assert "only the classifier head (fc.bias, fc.weight) may differ" in message
    assert not (tmp_path / "r" / "checkpoint.pt").exists()


def test_init_weights_missing_a_layer_or_with_extra_layers_are_refused(tmp_path):
    from models.tiny import TinyCNN
    from pipeline.core import modeling
    from pipeline.core.errors import InputError

    state = _tiny_state()
    partial = {k: v for k, v in state.items() if not k.startswith("features.5.")}  # the second BatchNorm
    torch.save(partial, tmp_path / "partial.pt")
    with pytest.raises(InputError, match=r"4 of the model's \d+ keys are not in the file: features\.5\.weight"):
        modeling.load_init_weights(TinyCNN(10), str(tmp_path / "partial.pt"))
    torch.save({**state, "extra.conv.weight": torch.zeros(2, 2, 3, 3)}, tmp_path / "extra.pt")
    with pytest.raises(InputError, match="1 keys of the file are not in the model: extra.conv.weight"):
        modeling.load_init_weights(TinyCNN(10), str(tmp_path / "extra.pt"))


def test_init_weights_may_differ_only_in_the_classifier_head(tmp_path):
    from models.tiny import TinyCNN
    from pipeline.core import modeling

    state = _tiny_state(1000)
    backbone = {k: v for k, v in state.items() if not k.startswith("fc.")}
    renamed = {**backbone, "classifier.weight": state["fc.weight"], "classifier.bias": state["fc.bias"]}
    for name, weights in (("backbone", backbone), ("renamed", renamed), ("other-size", state)):
        torch.save(weights, tmp_path / f"{name}.pt")
        module = TinyCNN(10)
        info = modeling.load_init_weights(module, str(tmp_path / f"{name}.pt"))
        assert torch.equal(module.state_dict()["features.0.weight"], state["features.0.weight"]), name
        assert set(info["missing_keys"]) <= {"fc.weight", "fc.bias"}, info
