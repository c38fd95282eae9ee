"""The data's fingerprint is its content (issue 46): images swapped between classes with their sizes and mtimes kept
re-run train and verify; a re-run hashes only the files whose stat changed."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest

from conftest import TINY, cli
from pipeline import config as config_mod
from pipeline.core import data as data_mod


def _ppm(path: Path, seed: int, size: int = 8) -> None:
    """A binary PPM: every image of one size has the same byte count, so a swap keeps every file's size."""
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = np.random.default_rng(seed).integers(0, 256, (size, size, 3), dtype=np.uint8)
    path.write_bytes(f"P6 {size} {size} 255\n".encode() + pixels.tobytes())


def _folder(root: Path, per_class: int = 6) -> None:
    for k, cls in enumerate(("cat", "dog")):
        for i in range(per_class):
            _ppm(root / cls / f"{i}.ppm", seed=100 * k + i)


def _swap_keeping_sizes_and_mtimes(a: Path, b: Path) -> None:
    """Swap the bytes of ``a`` and ``b`` in place (same inodes), then set each mtime back to what it was."""
    times = {p: (p.stat().st_atime_ns, p.stat().st_mtime_ns) for p in (a, b)}
    data_a, data_b = a.read_bytes(), b.read_bytes()
    assert len(data_a) == len(data_b)
    a.write_bytes(data_b)
    b.write_bytes(data_a)
    for p, ns in times.items():
        os.utime(p, ns=ns)


def _swap_classes(root: Path) -> None:
    for a in sorted((root / "cat").iterdir()):
        _swap_keeping_sizes_and_mtimes(a, root / "dog" / a.name)


def _summary(root: Path, cache: Path | None = None) -> dict:
    cfg = config_mod.resolve({}, overrides=["data.source=imagefolder", f"data.path={root}"])
    return data_mod.content_summary(cfg.data, cache)


@pytest.fixture
def fresh_process(monkeypatch):
    """As a new process: no digests remembered in memory."""
    monkeypatch.setattr(data_mod, "_MEMO", {})
    monkeypatch.setattr(data_mod, "_STORED", {})


def test_swapped_contents_with_sizes_and_mtimes_kept_change_the_summary(tmp_path, fresh_process):
    root = tmp_path / "images"
    _folder(root)
    before = _summary(root)
    stats = {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*.ppm")}
    _swap_classes(root)
    assert {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*.ppm")} == stats
    assert _summary(root)["sha256"] != before["sha256"]  # the same process, its digests remembered


def test_touching_an_image_is_not_a_change_but_one_changed_byte_is(tmp_path, fresh_process):
    root = tmp_path / "images"
    _folder(root)
    before = _summary(root)["sha256"]
    image = root / "cat" / "0.ppm"
    os.utime(image, ns=(1, 1))
    assert _summary(root)["sha256"] == before
    raw = bytearray(image.read_bytes())
    raw[-1] ^= 1
    image.write_bytes(bytes(raw))
    assert _summary(root)["sha256"] != before


def test_a_cached_re_run_hashes_only_the_files_that_changed(tmp_path, monkeypatch):
    root, cache = tmp_path / "images", tmp_path / "run" / "data.digests.json"
    cache.parent.mkdir()
    _folder(root)
    hashed = []
    real = hashlib.file_digest
    monkeypatch.setattr(hashlib, "file_digest", lambda f, name: hashed.append(f.name) or real(f, name))
    monkeypatch.setattr(data_mod, "_MEMO", {})
    monkeypatch.setattr(data_mod, "_STORED", {})
    first = _summary(root, cache)
    assert len(hashed) == 12 and cache.is_file()
    hashed.clear()
    monkeypatch.setattr(data_mod, "_MEMO", {})  # a new process: only the cache file remembers
    monkeypatch.setattr(data_mod, "_STORED", {})
    assert _summary(root, cache) == first and hashed == []
    _swap_keeping_sizes_and_mtimes(root / "cat" / "1.ppm", root / "dog" / "1.ppm")
    monkeypatch.setattr(data_mod, "_MEMO", {})
    monkeypatch.setattr(data_mod, "_STORED", {})
    assert _summary(root, cache)["sha256"] != first["sha256"]
    assert sorted(Path(p).name for p in hashed) == ["1.ppm", "1.ppm"]


def test_a_damaged_cache_is_not_trusted(tmp_path, fresh_process):
    root, cache = tmp_path / "images", tmp_path / "data.digests.json"
    _folder(root)
    first = _summary(root, cache)
    forged = json.loads(cache.read_text())
    forged["files"]["cat/0.ppm"][-1] = "0" * 64  # a forged digest with the file's stat: the cache decides nothing
    cache.write_text(json.dumps(forged) + "{")
    data_mod._MEMO.clear()
    data_mod._STORED.clear()
    assert _summary(root, cache) == first


IMAGEFOLDER = [a for a in TINY if not a.startswith("data.samples_per_class")]


def test_all_re_runs_train_and_verify_after_images_are_swapped_between_classes(tmp_path):
    root, run = tmp_path / "images", tmp_path / "run"
    _folder(root)
    args = ("all", "--model", "tiny_cnn", "--run-dir", run, *IMAGEFOLDER, "data.source=imagefolder",
            f"data.path={root}", "data.val_fraction=0.5", "data.batch_size=4")
    assert cli(*args) == 0

    def run_ids() -> dict:
        return {name: entry.get("run_id") for name, entry in
                json.loads((run / "manifest.json").read_text())["stages"].items()}

    first = run_ids()
    _swap_classes(root)
    assert cli(*args) == 0
    after = run_ids()
    assert after["train"] != first["train"] and after["verify"] != first["verify"]
