"""Data sources (synthetic, ImageFolder, CIFAR-10 python batches) and augmentation."""

from __future__ import annotations

import hashlib
import io
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from conftest import run_cli
from pipeline import config
from pipeline.core import data as data_mod
from pipeline.core.errors import DataError
from pipeline.core.model_card import CardSpec, ModelCard

MEAN, STD = (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)


def data_cfg(**overrides):
    return config.resolve(overrides=[f"data.{k}={v}" for k, v in overrides.items()]).data


def load(size: int = 16, **overrides) -> data_mod.DataSplits:
    return data_mod.load(data_cfg(**overrides), image_size=size, mean=MEAN, std=STD)


# --------------------------------------------------------------------------- synthetic


def test_synthetic_set_is_deterministic_per_seed_and_balanced():
    a_x, a_y = data_mod.synthetic_images(5, 8, 16, seed=0)
    b_x, b_y = data_mod.synthetic_images(5, 8, 16, seed=0)
    c_x, _ = data_mod.synthetic_images(5, 8, 16, seed=1)
    assert a_x.dtype == torch.uint8 and a_x.shape == (40, 3, 16, 16)
    assert torch.equal(a_x, b_x) and torch.equal(a_y, b_y)
    assert not torch.equal(a_x, c_x)
    assert torch.bincount(a_y, minlength=5).tolist() == [8] * 5
    assert a_x.float().std() > 20  # not a flat image


def test_a_synthetic_set_made_again_in_one_process_is_the_same_and_never_shared(monkeypatch):
    """The process keeps its last synthetic set (train, export, verify and benchmark each load it under `all`): a
    second load gives equal images in tensors of its own, so a caller that changes them changes nothing else."""
    first = load(num_classes=3, samples_per_class=6)
    first.train.images.zero_()
    first.val.labels.fill_(0)
    second = load(num_classes=3, samples_per_class=6)
    fresh_x, fresh_y = data_mod.synthetic_images(3, 6, 16, seed=second.details["seed"])
    assert second.train.images.float().std() > 20 and second.val.labels.unique().numel() == 3
    joined = torch.cat([second.train.images, second.val.images])
    assert sorted(joined.flatten(1).sum(1).tolist()) == sorted(fresh_x.flatten(1).sum(1).tolist())
    monkeypatch.setattr(data_mod, "SYNTHETIC_CACHE_BYTES", 3 * 16 * 16 * 18 - 1)  # over the budget: not kept
    load(num_classes=3, samples_per_class=6, seed=5)
    assert not data_mod._LAST_SYNTHETIC


def test_synthetic_splits_are_stratified_and_disjoint():
    splits = load(num_classes=4, samples_per_class=10, val_fraction=0.2)
    assert splits.classes == ["class_0", "class_1", "class_2", "class_3"] and splits.source == "synthetic"
    assert len(splits.train) == 32 and len(splits.val) == 8
    assert torch.bincount(splits.val.labels, minlength=4).tolist() == [2, 2, 2, 2]
    x, y = splits.train[0]
    assert x.shape == (3, 16, 16) and x.dtype == torch.float32 and isinstance(y, int)
    # normalised with the given mean/std: (u8 / 255 - 0.5) / 0.25 lies in [-2, 2]
    assert -2.0 <= x.min() and x.max() <= 2.0
    xs, ys = splits.train.__getitems__([0, 1, 2])
    assert torch.equal(xs[0], x) and ys.tolist()[0] == y


def test_fetch_items_gives_the_same_batch_with_or_without_getitems():
    """One ``__getitems__`` call where the data set has it, else one sample at a time: collate makes them equal."""
    splits = load(num_classes=4, samples_per_class=10)

    class OneAtATime(torch.utils.data.Dataset):
        def __len__(self):
            return len(splits.train)

        def __getitem__(self, index):
            return splits.train[index]

    indices = [5, 0, 17, 3]
    batched = data_mod.collate(data_mod.fetch_items(splits.train, indices))
    single = data_mod.fetch_items(OneAtATime(), indices)
    assert isinstance(single, list) and len(single) == 4
    x, y = data_mod.collate(single)
    assert torch.equal(x, batched[0]) and torch.equal(y, batched[1])
    assert y.tolist() == [splits.train[i][1] for i in indices]


def test_validation_batch_is_the_first_validation_images():
    cfg = config.resolve(overrides=["data.num_classes=4", "data.samples_per_class=10", "data.image_size=16"])
    card = ModelCard(spec=CardSpec(input_size=[3, 16, 16], num_classes=4, mean=list(MEAN), std=list(STD),
                                   input_name="input", output_name="logits"))
    images, labels = data_mod.validation_batch(cfg, card, 3, offset=2)
    val = load(num_classes=4, samples_per_class=10).val
    assert images.dtype == np.float32 and images.shape == (3, 3, 16, 16)
    assert np.array_equal(images[0], val[2][0].numpy()) and labels.tolist() == [val[i][1] for i in (2, 3, 4)]
    everything, _ = data_mod.validation_batch(cfg, card, 1000)
    assert len(everything) == len(val)  # no more than there is


def test_a_small_model_learns_the_synthetic_set():
    splits = load(num_classes=4, samples_per_class=24)
    x, y = splits.train.__getitems__(list(range(len(splits.train))))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.AvgPool2d(2), torch.nn.Flatten(), torch.nn.Linear(3 * 8 * 8, 4))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    losses = []
    for _ in range(40):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]
    accuracy = (model(x).argmax(1) == y).float().mean().item()
    assert accuracy > 0.6  # chance is 0.25


# --------------------------------------------------------------------------- ImageFolder


def write_image(path: Path, color: tuple[int, int, int], size: tuple[int, int] = (20, 14), fmt: str = "PNG") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, color).save(path, fmt)


def make_folder(root: Path, classes: dict[str, int]) -> Path:
    for i, (name, count) in enumerate(classes.items()):
        for j in range(count):
            write_image(root / name / f"img{j}.png", (40 * i, 10 * j, 200))
    return root


def test_image_folder_classes_are_sorted_folder_names_and_split_is_stratified(tmp_path):
    root = make_folder(tmp_path / "imgs", {"zebra": 5, "apple": 5, "Mango": 5})
    (root / ".hidden").mkdir()
    splits = load(source="imagefolder", path=root, val_fraction=0.2)
    assert splits.classes == ["Mango", "apple", "zebra"] and splits.source == "imagefolder"
    assert len(splits.train) == 12 and len(splits.val) == 3
    assert sorted(splits.val.labels) == [0, 1, 2]  # one of each class
    assert "stratified" in splits.details["split"]
    x, y = splits.train[0]
    assert x.shape == (3, 16, 16) and y == 0  # resized short side + centre crop
    # the mango folder's first image: colour (0, 0, 200) everywhere
    assert torch.allclose(x[2], torch.full((16, 16), (200 / 255 - 0.5) / 0.25))


def test_image_folder_uses_train_and_val_subfolders(tmp_path):
    make_folder(tmp_path / "imgs" / "train", {"cat": 4, "dog": 3})
    make_folder(tmp_path / "imgs" / "val", {"cat": 1, "dog": 2})
    splits = load(source="imagefolder", path=tmp_path / "imgs")
    assert splits.classes == ["cat", "dog"] and splits.details["split"] == "train/ and val/ folders"
    assert (len(splits.train), len(splits.val)) == (7, 3)
    assert sorted(splits.val.labels) == [0, 1, 1]


def test_image_folder_val_with_other_classes_is_refused(tmp_path):
    make_folder(tmp_path / "imgs" / "train", {"cat": 2, "dog": 2})
    make_folder(tmp_path / "imgs" / "val", {"cat": 1, "cow": 1})
    with pytest.raises(DataError, match=r"val has classes \['cat', 'cow'\]"):
        load(source="imagefolder", path=tmp_path / "imgs")


@pytest.mark.parametrize("case", ["missing", "no-classes", "empty-class", "corrupt-png", "not-an-image"])
def test_image_folder_errors_name_the_file_or_folder(tmp_path, case):
    root = tmp_path / "imgs"
    if case == "missing":
        named, match = root, "does not exist"
    else:
        make_folder(root, {"a": 2, "b": 2})
        if case == "no-classes":
            root = tmp_path / "flat"
            write_image(root / "x.png", (1, 2, 3))
            named, match = root, "has no class sub-folders"
        elif case == "empty-class":
            (root / "c").mkdir()
            named, match = root / "c", "contains no images"
        elif case == "corrupt-png":
            named = root / "b" / "broken.png"
            named.write_bytes(b"\x00garbage, not a PNG" * 20)
            match = "cannot read image"
        else:
            named = root / "a" / "notes.txt"
            named.write_text("labels are folder names")
            match = "is not an image file"
    with pytest.raises(DataError, match=match) as info:
        load(source="imagefolder", path=root)
    assert str(named) in str(info.value)


def test_truncated_jpeg_fails_with_a_data_error_naming_it(tmp_path):
    """The up-front check reads headers only (a full decode of a large set would take minutes), so a
    truncated JPEG passes it; decoding it then raises a DataError naming the file."""
    root = make_folder(tmp_path / "imgs", {"a": 2, "b": 2})
    noise = np.random.default_rng(0).integers(0, 255, (48, 48, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(noise).save(buffer, "JPEG", quality=95)
    bad = root / "a" / "cut.jpg"
    bad.write_bytes(buffer.getvalue()[: len(buffer.getvalue()) // 2])
    splits = load(source="imagefolder", path=root, val_fraction=0.5)
    dataset = splits.train if bad in splits.train.files else splits.val
    with pytest.raises(DataError, match="truncated") as info:
        dataset[dataset.files.index(bad)]
    assert str(bad) in str(info.value)


def test_corrupt_image_through_the_cli_is_one_error_line(tmp_path):
    root = make_folder(tmp_path / "imgs", {"a": 3, "b": 3})
    (root / "a" / "broken.png").write_bytes(b"garbage" * 30)
    out = run_cli("train", "--model", "tiny_cnn", "--run-dir", tmp_path / "run", "data.source=imagefolder",
                  f"data.path={root}", "data.image_size=16", "data.batch_size=2", "train.epochs=1",
                  env={"OMP_NUM_THREADS": "1"}, timeout=120)
    assert out.returncode == 2, out.stderr
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, out.stderr
    assert "broken.png" in errors[0] and "Traceback" not in out.stderr + out.stdout


# --------------------------------------------------------------------------- CIFAR-10

LABEL_NAMES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
PER_BATCH = 20


def dump(obj, path: Path) -> None:
    path.write_bytes(pickle.dumps(obj, protocol=4))


def make_cifar(root: Path) -> dict[str, str]:
    """A CIFAR-10 python-batch directory with 20 images per batch; returns the files' md5s."""
    root.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for i, name in enumerate([f"data_batch_{k}" for k in range(1, 6)] + ["test_batch"]):
        dump({"batch_label": f"batch {i}", "labels": [int(v) for v in rng.integers(0, 10, PER_BATCH)],
              "data": rng.integers(0, 256, (PER_BATCH, 3072), dtype=np.uint8),
              "filenames": [f"img_{i}_{j}.png" for j in range(PER_BATCH)]}, root / name)
    dump({"label_names": LABEL_NAMES, "num_cases_per_batch": PER_BATCH, "num_vis": 3072}, root / "batches.meta")
    return {p.name: hashlib.md5(p.read_bytes()).hexdigest() for p in root.iterdir()}


def test_cifar10_batches_load_when_the_checksums_match(tmp_path, monkeypatch):
    md5 = make_cifar(tmp_path / "cifar-10-batches-py")
    monkeypatch.setattr(data_mod, "CIFAR10_MD5", md5)
    splits = load(size=32, source="cifar10", path=tmp_path)  # the parent of cifar-10-batches-py also works
    assert splits.classes == LABEL_NAMES and splits.source == "cifar10"
    assert (len(splits.train), len(splits.val)) == (5 * PER_BATCH, PER_BATCH)
    with open(tmp_path / "cifar-10-batches-py" / "data_batch_1", "rb") as f:
        first = pickle.load(f)
    x, y = splits.train[0]
    expected = torch.from_numpy(first["data"][0].reshape(3, 32, 32)).float() / 255
    assert y == first["labels"][0]
    assert torch.allclose(x, (expected - 0.5) / 0.25)
    assert load(size=16, source="cifar10", path=tmp_path).train[0][0].shape == (3, 16, 16)


def test_cifar10_with_wrong_checksums_names_file_and_md5s(tmp_path):
    md5 = make_cifar(tmp_path / "c")
    with pytest.raises(DataError) as info:
        load(size=32, source="cifar10", path=tmp_path / "c")
    message = str(info.value)
    assert "batches.meta" in message and md5["batches.meta"] in message
    assert data_mod.CIFAR10_MD5["batches.meta"] in message


def test_cifar10_missing_directory_and_missing_file(tmp_path, monkeypatch):
    with pytest.raises(DataError, match="does not exist"):
        load(size=32, source="cifar10", path=tmp_path / "nowhere")
    md5 = make_cifar(tmp_path / "c")
    monkeypatch.setattr(data_mod, "CIFAR10_MD5", md5)
    (tmp_path / "c" / "data_batch_3").unlink()
    with pytest.raises(DataError, match="data_batch_3 is missing"):
        load(size=32, source="cifar10", path=tmp_path / "c")


class Payload:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_cifar10_malicious_pickle_is_refused_even_with_a_matching_checksum(tmp_path, monkeypatch):
    root = tmp_path / "c"
    make_cifar(root)
    marker = tmp_path / "pwned"
    dump({"data": Payload(marker), "labels": []}, root / "data_batch_2")
    md5 = {p.name: hashlib.md5(p.read_bytes()).hexdigest() for p in root.iterdir()}
    monkeypatch.setattr(data_mod, "CIFAR10_MD5", md5)
    with pytest.raises(DataError, match=r"data_batch_2: refusing to load (posix|os)\.system"):
        load(size=32, source="cifar10", path=root)
    assert not marker.exists(), "the pickle's payload ran"


def test_cifar10_batch_of_the_wrong_shape_is_a_data_error(tmp_path, monkeypatch):
    root = tmp_path / "c"
    make_cifar(root)
    dump({"data": np.zeros((4, 100), dtype=np.uint8), "labels": [0] * 4}, root / "test_batch")
    monkeypatch.setattr(data_mod, "CIFAR10_MD5",
                        {p.name: hashlib.md5(p.read_bytes()).hexdigest() for p in root.iterdir()})
    with pytest.raises(DataError, match="test_batch does not hold a CIFAR-10 batch"):
        load(size=32, source="cifar10", path=root)


# --------------------------------------------------------------------------- augmentation


def test_augment_keeps_shapes_is_seeded_and_flips():
    images = torch.randn(64, 3, 16, 16)
    a = data_mod.augment(images, torch.Generator().manual_seed(1))
    b = data_mod.augment(images, torch.Generator().manual_seed(1))
    c = data_mod.augment(images, torch.Generator().manual_seed(2))
    assert a.shape == images.shape and a.dtype == images.dtype
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert torch.equal(images, images.clone())  # the input is left alone
    # with no crop offset (pad=0) every output is the image or its mirror, and both happen
    flips = data_mod.augment(images, torch.Generator().manual_seed(3), pad=0)
    same = [torch.equal(o, i) for o, i in zip(flips, images, strict=True)]
    mirrored = [torch.equal(o, i.flip(-1)) for o, i in zip(flips, images, strict=True)]
    assert all(s or m for s, m in zip(same, mirrored, strict=True))
    assert 10 < sum(mirrored) < 54


def test_augment_crops_from_the_padded_image():
    image = torch.arange(16.0).view(1, 1, 4, 4).repeat(32, 3, 1, 1)
    out = data_mod.augment(image, torch.Generator().manual_seed(0), pad=1)
    assert out.shape == image.shape
    assert not all(torch.equal(o, image[0]) or torch.equal(o, image[0].flip(-1)) for o in out)  # shifted crops
    # each output row is a (possibly shifted, reflected, mirrored) run of the original values
    assert set(out.unique().tolist()) <= set(range(16))


def test_collate_stacks_single_samples_and_passes_batches_through():
    x, y = data_mod.collate([(torch.zeros(3, 2, 2), 1), (torch.ones(3, 2, 2), 0)])
    assert x.shape == (2, 3, 2, 2) and y.tolist() == [1, 0] and y.dtype == torch.long
    batch = (torch.zeros(2, 3, 2, 2), torch.tensor([0, 1]))
    assert data_mod.collate(batch) is batch
