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
from conftest import TINY, cli
from PIL import Image

from pipeline import config
from pipeline import data as data_mod
from pipeline.errors import EXIT_OK, EXIT_USAGE, DataError

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
