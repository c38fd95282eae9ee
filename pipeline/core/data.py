"""Data sets behind one interface: the embedded synthetic set, ImageFolder, and CIFAR-10.

Every source yields normalised float images (C, H, W) and integer labels, split into train
and validation. The split and the synthetic images are deterministic functions of
``data.seed``; training-time randomness (order, augmentation) is seeded separately per epoch
and step by the training loop, so a resumed run sees exactly the same batches.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import pickle
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch.utils.data import Dataset

from pipeline.core import roles
from pipeline.core.errors import DataError

if TYPE_CHECKING:
    import numpy as np

    from pipeline.core.config_schema import Config, DataConfig
    from pipeline.core.model_card import ModelCard

log = logging.getLogger("pipeline")

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm")


@dataclass
class DataSplits:
    train: Dataset
    val: Dataset
    classes: list[str]
    source: str
    image_size: int
    details: dict = field(default_factory=dict)

    @property
    def num_classes(self) -> int:
        return len(self.classes)


def collate(batch):
    """Batches from ``__getitems__`` arrive stacked already; single samples are stacked here."""
    if isinstance(batch, tuple):
        return batch
    images, labels = zip(*batch, strict=True)
    return torch.stack(images), torch.tensor(labels, dtype=torch.long)


def fetch_items(dataset: Dataset, indices: list[int]):
    """The samples at ``indices`` as a DataLoader fetches them, ready for :func:`collate`.

    One ``__getitems__`` call where the data set has one (ours return the stacked batch), else a
    list of ``dataset[i]``.
    """
    if hasattr(dataset, "__getitems__"):
        return dataset.__getitems__(indices)
    return [dataset[i] for i in indices]


def validation_batch(cfg: Config, card: ModelCard, count: int, offset: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``count`` real validation images (float32) and labels, deterministic: the first ones of the split.

    ``card`` is the run's model card: its spec gives the image size and the normalisation.
    """
    splits = card_splits(cfg, card)
    n = min(count, len(splits.val) - offset)
    x, y = collate(fetch_items(splits.val, list(range(offset, offset + n))))
    return x.numpy().astype("float32"), y.numpy()


def _normalize(images_u8: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    return (images_u8.float().div_(255.0) - mean) / std


class TensorImageDataset(Dataset):
    """uint8 images held in memory, normalised on access."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, mean, std):
        assert images.dtype == torch.uint8 and images.ndim == 4
        self.images = images
        self.labels = labels.long()
        self.mean = torch.tensor(mean, dtype=torch.float32).view(-1, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32).view(-1, 1, 1)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int):
        return _normalize(self.images[index], self.mean, self.std), int(self.labels[index])

    def __getitems__(self, indices: list[int]):
        index = torch.as_tensor(indices, dtype=torch.long)
        return _normalize(self.images[index], self.mean, self.std), self.labels[index]


class FileImageDataset(Dataset):
    """Images decoded from files with Pillow on access (workers parallelise this)."""

    def __init__(self, files: list[Path], labels: list[int], size: int, mean, std):
        self.files = files
        self.labels = labels
        self.size = size
        self.mean = torch.tensor(mean, dtype=torch.float32).view(-1, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32).view(-1, 1, 1)

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int):
        image = load_image(self.files[index], self.size)
        return _normalize(image, self.mean, self.std), self.labels[index]


def load_image(path: Path, size: int) -> torch.Tensor:
    """Decode, convert to RGB, resize the short side to ``size`` and centre-crop: uint8 (3, size, size)."""
    from PIL import Image, UnidentifiedImageError

    try:
        with _bomb_warnings_quiet(), Image.open(path) as img:  # said once, up front, by _check_images
            img = _to_rgb(img)
            w, h = img.size
            scale = size / min(w, h)
            _check_resize_cost(path, w, h, scale)
            img = img.resize((max(size, round(w * scale)), max(size, round(h * scale))), Image.BILINEAR)
            w, h = img.size
            left, top = (w - size) // 2, (h - size) // 2
            img = img.crop((left, top, left + size, top + size))
            data = torch.frombuffer(bytearray(img.tobytes()), dtype=torch.uint8)
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as exc:
        raise DataError(f"cannot read image {path}: {exc}") from None
    return data.view(size, size, 3).permute(2, 0, 1).contiguous()


# The resized image, before its centre crop, is at most this many pixels (3 bytes each): a 5,000,000x1 PNG
# passes Pillow's decompression-bomb limit but its short side scaled to 224 would need gigabytes.
MAX_RESIZED_PIXELS = 1 << 26


def _check_resize_cost(path: Path, w: int, h: int, scale: float) -> None:
    pixels = max(1, round(w * scale)) * max(1, round(h * scale))
    if pixels > MAX_RESIZED_PIXELS:
        raise DataError(f"cannot read image {_shown(path)}: {w}x{h} pixels; resizing its short side to "
                        f"{round(min(w, h) * scale)} would need {pixels * 3 / 2**30:.1f} GiB (limit "
                        f"{MAX_RESIZED_PIXELS * 3 / 2**30:.1f} GiB); crop it or move it out of the data")


def _shown(path: Path) -> str:
    """``path`` printable in any encoding: a file name that is not UTF-8 shows its bytes escaped, never fails."""
    return str(path).encode("utf-8", "backslashreplace").decode("utf-8")


def _to_rgb(img):
    """RGB at 8 bits per channel. 16-bit grayscale (``I;16``, and ``I`` holding 16-bit values) is scaled
    down to 0..255; ``convert("RGB")`` alone would clip it at 255 and saturate all but the darkest pixels."""
    from PIL import Image

    if img.mode.startswith("I;16") or img.mode == "I":
        import numpy as np

        values = np.asarray(img).astype(np.float64)
        if img.mode.startswith("I;16") or values.max(initial=0) > 255:
            values = np.clip(values, 0, 65535) / 257.0  # 65535 / 257 = 255
        img = Image.fromarray(np.round(np.clip(values, 0, 255)).astype(np.uint8))
    return img.convert("RGB")


# --------------------------------------------------------------------------- synthetic


def synthetic_images(num_classes: int, per_class: int, size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each class is a fixed layout of coloured blobs; every image jitters and obscures it.

    A class prototype is three soft ellipses with class-specific colours, positions and sizes.
    Each image shifts it by up to 1/8 of its size, may mirror it, blends in a random distractor
    layout (20-50 %), changes brightness and contrast and adds pixel noise, so the model must
    learn the layout rather than any single pixel. Deterministic in ``seed``.
    """
    g = torch.Generator().manual_seed(seed)
    n = num_classes * per_class
    labels = torch.arange(num_classes).repeat_interleave(per_class)
    labels = labels[torch.randperm(n, generator=g)]

    def uniform(lo, hi, *shape):
        return lo + (hi - lo) * torch.rand(*shape, generator=g)

    coords = torch.linspace(-1.0, 1.0, size)
    yy, xx = torch.meshgrid(coords, coords, indexing="ij")

    def layouts(k: int, blobs: int = 3) -> torch.Tensor:
        """k random layouts: a tinted background plus soft coloured ellipses, (k, 3, size, size) in [0, 1]."""
        out = uniform(0.2, 0.8, k, 3, 1, 1).expand(k, 3, size, size).clone()
        for _ in range(blobs):
            cx, cy = uniform(-0.6, 0.6, k, 1, 1), uniform(-0.6, 0.6, k, 1, 1)
            rx, ry = uniform(0.2, 0.55, k, 1, 1), uniform(0.2, 0.55, k, 1, 1)
            mask = torch.sigmoid((1 - ((xx - cx) / rx) ** 2 - ((yy - cy) / ry) ** 2) * 6.0)[:, None]
            out = out + (uniform(0, 1, k, 3, 1, 1) - out) * mask
        return out

    prototypes = layouts(num_classes)
    shift = max(1, size // 8)
    dy = torch.randint(-shift, shift + 1, (n,), generator=g).tolist()
    dx = torch.randint(-shift, shift + 1, (n,), generator=g).tolist()
    images = torch.stack([torch.roll(prototypes[c], (y, x), (1, 2))
                          for c, y, x in zip(labels.tolist(), dy, dx, strict=True)])
    mirror = torch.rand(n, generator=g) < 0.5
    images[mirror] = images[mirror].flip(-1)
    blend = uniform(0.2, 0.5, n, 1, 1, 1)
    images = (1 - blend) * images + blend * layouts(n)
    images = (images - 0.5) * uniform(0.8, 1.2, n, 1, 1, 1) + 0.5 + uniform(-0.1, 0.1, n, 1, 1, 1)
    images = images + 0.06 * torch.randn(images.shape, generator=g)
    images = (images.clamp(0, 1) * 255).round().to(torch.uint8)
    return images, labels


def _split_indices(labels: list[int] | torch.Tensor, val_fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """Stratified split: each class gives ``val_fraction`` of its samples (at least one if it has two)."""
    labels = torch.as_tensor(labels)
    g = torch.Generator().manual_seed(seed + 1)
    train_idx, val_idx = [], []
    for c in labels.unique().tolist():
        idx = torch.nonzero(labels == c).flatten()
        idx = idx[torch.randperm(len(idx), generator=g)].tolist()
        n_val = round(len(idx) * val_fraction)
        if len(idx) >= 2:
            n_val = min(max(n_val, 1), len(idx) - 1)
        val_idx += idx[:n_val]
        train_idx += idx[n_val:]
    return sorted(train_idx), sorted(val_idx)


# The last synthetic set this process made, while it is small (9 MiB at the defaults; 440 MiB at 224x224 is made
# again instead): train, export's calibration, verify and benchmark each load it, and `all` runs them in one process.
_LAST_SYNTHETIC: dict[tuple[int, int, int, int], tuple[torch.Tensor, torch.Tensor]] = {}
SYNTHETIC_CACHE_BYTES = 64 << 20


def _synthetic_set(num_classes: int, per_class: int, size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`synthetic_images`, made once per process for the last arguments it was asked (the callers index it,
    which copies: the kept tensors are never changed)."""
    key = (num_classes, per_class, size, seed)
    if key in _LAST_SYNTHETIC:
        return _LAST_SYNTHETIC[key]
    images, labels = synthetic_images(*key)
    _LAST_SYNTHETIC.clear()
    if images.numel() <= SYNTHETIC_CACHE_BYTES:
        _LAST_SYNTHETIC[key] = (images, labels)
    return images, labels


def _synthetic(data_cfg: DataConfig, size: int, mean, std) -> DataSplits:
    images, labels = _synthetic_set(data_cfg.num_classes, data_cfg.samples_per_class, size, data_cfg.seed)
    tr, va = _split_indices(labels, data_cfg.val_fraction, data_cfg.seed)
    tr, va = torch.tensor(tr), torch.tensor(va)
    return DataSplits(
        train=TensorImageDataset(images[tr], labels[tr], mean, std),
        val=TensorImageDataset(images[va], labels[va], mean, std),
        classes=[f"class_{i}" for i in range(data_cfg.num_classes)],
        source="synthetic",
        image_size=size,
        details={"train_images": len(tr), "val_images": len(va), "generator": "blob layouts", "seed": data_cfg.seed},
    )


# --------------------------------------------------------------------------- ImageFolder


# Split folders are recognised by name (case-insensitively), at the top of data.path, one folder below it
# (an unpacked archive), or inside every class folder.
SPLIT_NAMES = {"train": "train", "training": "train", "val": "val", "valid": "val", "validation": "val",
               "test": "test", "testing": "test"}


def _subfolders(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))


def _split_folders(folder: Path) -> dict[str, Path]:
    """The split folders directly inside ``folder``: {"train"|"val"|"test": path}."""
    found: dict[str, Path] = {}
    for sub in _subfolders(folder):
        split = SPLIT_NAMES.get(sub.name.lower())
        if split in found:
            raise DataError(f"image folder {folder} has two {split} folders: {found[split].name}/ and {sub.name}/")
        if split:
            found[split] = sub
    return found


def detect_layout(root: Path) -> tuple[str, dict[str, list[tuple[str, Path]]]]:
    """How ``root`` is laid out, and for each split the (class name, folder) pairs that hold its images.

    Without split folders the one "split" is ``all``: ``root``'s sub-folders are the classes.
    """
    if not root.is_dir():
        raise DataError(f"image folder {root} does not exist or is not a directory")
    outer = _subfolders(root)
    base = root
    if len(outer) == 1 and not _split_folders(root) and _split_folders(outer[0]):
        base = outer[0]  # one wrapping folder, as an archive unpacks
    splits = _split_folders(base)
    if splits:
        return _splits_of_classes(base, splits)
    per_class = {c: _split_folders(c) for c in outer}
    if outer and all(per_class.values()):
        return _classes_of_splits(root, per_class)
    return f"class folders in {root} (no train/, val/ or test/ split folders)", {"all": [(c.name, c) for c in outer]}


def _splits_of_classes(base: Path, splits: dict[str, Path]):
    """``base/<split>/<class>/``."""
    names = ", ".join(f"{p.name}/" for p in splits.values())
    others = [p.name for p in _subfolders(base) if p not in splits.values()]
    if others:
        raise DataError(f"image folder {base} mixes split folders ({names}) with other folders "
                        f"({', '.join(others[:5])}); put the class folders inside the split folders")
    layout = {split: [(c.name, c) for c in _subfolders(folder)] for split, folder in splits.items()}
    for split, folder in splits.items():
        if not layout[split]:
            raise DataError(f"split folder {folder} has no class sub-folders (expected {folder}/<class>/<image>)")
    return f"split folders {names} in {base}", layout


def _classes_of_splits(root: Path, per_class: dict[Path, dict[str, Path]]):
    """``root/<class>/<split>/``."""
    layout: dict[str, list[tuple[str, Path]]] = {}
    for c, found in per_class.items():
        loose = [p for p in c.iterdir() if not p.name.startswith(".") and p not in found.values()]
        if loose:
            raise DataError(f"{loose[0]} is outside the split folders of class folder {c}; move it into one of them")
        for split, folder in found.items():
            layout.setdefault(split, []).append((c.name, folder))
    names = ", ".join(f"{s}/" for s in sorted({p.name for found in per_class.values() for p in found.values()}))
    return f"split folders ({names}) inside each class folder of {root}", layout


def scan_classes(folders: list[tuple[str, Path]], where: Path,
                 skipped: list[Path] | None = None) -> tuple[list[str], list[Path], list[int]]:
    """Classes are the sorted folder names; every regular file in them must be an image.

    Anything that is not a regular file (a FIFO, socket, device, broken link) is never opened, since
    reading one can block forever; it is appended to ``skipped``.
    """
    if not folders:
        raise DataError(f"image folder {where} has no class sub-folders (expected {where}/<class>/<image>)")
    by_class: dict[str, list[Path]] = {}
    for name, folder in folders:
        by_class.setdefault(name, []).append(folder)
    classes = sorted(by_class)
    files, labels = [], []
    for index, name in enumerate(classes):
        class_files = []
        for folder in by_class[name]:
            for path in sorted(folder.rglob("*")):
                if path.name.startswith(".") or path.is_dir():
                    continue
                if not path.is_file():
                    if skipped is not None:
                        skipped.append(path)
                    continue
                if path.suffix.lower() not in IMAGE_EXTENSIONS:
                    _refuse_run_dir_in_data(path, where)
                    raise DataError(
                        f"{path} is not an image file (expected one of {', '.join(IMAGE_EXTENSIONS)}); "
                        "move it out of the class folder"
                    )
                class_files.append(path)
        if not class_files:
            raise DataError(f"class folder {by_class[name][0]} contains no images")
        files += class_files
        labels += [index] * len(class_files)
    _check_images(files)
    return classes, files, labels


def _refuse_run_dir_in_data(path: Path, where: Path) -> None:
    """A run directory inside ``data.path`` would be read as a class folder: say that, not "not an image file"."""
    from pipeline.core.artifacts import CONFIG, MANIFEST

    if path.name in (CONFIG, MANIFEST) or (path.parent / MANIFEST).is_file():
        raise DataError(f"the run directory {_shown(path.parent)} is inside the data ({_shown(where)}, data.path): "
                        "its files would be read as images; use a --run-dir outside the data folder")


def _warn_classes_without_validation(classes: list[str], labels: list[int], details: dict) -> None:
    """A class with no validation image is never checked by verify: trained, but not measured; say so."""
    missing = [c for i, c in enumerate(classes) if i not in set(labels)]
    if missing:
        details["classes_without_validation_images"] = missing
        log.warning("data: class(es) with no validation image (too few images to hold one out): %s; their "
                    "accuracy is not measured: add images or raise data.val_fraction",
                    ", ".join(_shown(Path(c)) for c in missing))


def _check_images(files: list[Path]) -> None:
    """Read every header up front, so a corrupt file fails before training starts, naming the file."""
    from PIL import Image

    for path in files:
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", Image.DecompressionBombWarning)
                with Image.open(path) as img:
                    img.verify()
                    pixels = img.width * img.height
        except Exception as exc:  # Pillow raises many types for bad files
            raise DataError(f"cannot read image {path}: {type(exc).__name__}: {exc}") from None
        if any(issubclass(w.category, Image.DecompressionBombWarning) for w in caught):
            log.warning("data: image %s is %s pixels, beyond Pillow's decompression-bomb limit of %s: it is read "
                        "anyway, slowly and with that much memory each time; shrink it if that is not meant",
                        path, f"{pixels:,}", f"{Image.MAX_IMAGE_PIXELS:,}")
        for w in caught:  # anything else Pillow warned about goes on as it came
            if not issubclass(w.category, Image.DecompressionBombWarning):
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)


@contextlib.contextmanager
def _bomb_warnings_quiet():
    """Pillow's DecompressionBombWarning silenced while one image decodes: :func:`_check_images` said it in one line
    per image; a raw warning per decode (every epoch, every worker) would only repeat it."""
    from PIL import Image

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        yield


def _image_folder(data_cfg: DataConfig, size: int, mean, std) -> DataSplits:
    root = Path(data_cfg.path).expanduser()
    layout, folders = detect_layout(root)
    skipped: list[Path] = []
    if "all" not in folders and "train" not in folders:
        present = ", ".join(f"{s}/" for s in ("val", "test") if s in folders)
        raise DataError(f"image folder {root} has {present} but no train/ folder")
    held_out = "val" if "val" in folders else "test" if "test" in folders else None
    classes, train_files, train_labels = scan_classes(folders.get("train") or folders["all"], root, skipped)
    _require_two_classes(root, classes, layout)
    if held_out:
        val_classes, val_files, val_labels = scan_classes(folders[held_out], root, skipped)
        if val_classes != classes:
            raise DataError(f"{_split_where(folders[held_out])} has classes {val_classes}, "
                            f"but {_split_where(folders['train'])} has {classes}")
        split = f"train/ and {held_out}/ folders"
        if held_out == "test":
            split += " (test/ is the validation split: there is no val/)"
        elif "test" in folders:
            split += " (test/ is not used)"
    else:
        tr, va = _split_indices(train_labels, data_cfg.val_fraction, data_cfg.seed)
        val_files, val_labels = [train_files[i] for i in va], [train_labels[i] for i in va]
        train_files, train_labels = [train_files[i] for i in tr], [train_labels[i] for i in tr]
        split = f"stratified {data_cfg.val_fraction:.0%} held out (seed {data_cfg.seed})"
        if "train" in folders:
            split += " of train/ (there is no val/ or test/)"
    if not val_files:
        raise DataError(f"image folder {root}: the validation split is empty; add images or raise data.val_fraction")
    details = {"root": str(root), "layout": layout, "split": split, "train_images": len(train_files),
               "val_images": len(val_files)}
    _warn_classes_without_validation(classes, val_labels, details)
    log.info("data: image folder %s: %s; %s", root, layout, split)
    if skipped:
        details["skipped_not_regular_files"] = [str(p) for p in skipped[:20]] + (
            [f"... and {len(skipped) - 20} more"] if len(skipped) > 20 else [])
        log.warning("data: skipped %d path(s) that are not regular files (a FIFO, socket, device or broken "
                    "link), never opened: %s", len(skipped),
                    ", ".join(str(p) for p in skipped[:5]) + (" ..." if len(skipped) > 5 else ""))
    return DataSplits(
        train=FileImageDataset(train_files, train_labels, size, mean, std),
        val=FileImageDataset(val_files, val_labels, size, mean, std),
        classes=classes,
        source="imagefolder",
        image_size=size,
        details=details,
    )


def _split_where(folders: list[tuple[str, Path]]) -> str:
    """Where a split's images are, for a message: its folder, or a class folder's split folder as a pattern."""
    parents = {folder.parent for _, folder in folders}
    if len(parents) == 1:
        return str(parents.pop())
    return str(folders[0][1].parent.parent / "<class>" / folders[0][1].name)


def _require_two_classes(root: Path, classes: list[str], layout: str) -> None:
    if len(classes) < 2:
        raise DataError(
            f"image folder {root} has one class ({classes[0]!r}; layout: {layout}); a classifier needs at least "
            f"two: use {root}/<class>/<image>, or {root}/train/<class>/<image> with optional val/ and test/"
        )


# --------------------------------------------------------------------------- CIFAR-10

# md5 of the files in the official cifar-10-python.tar.gz (as published by the data set's authors
# and checked by torchvision). The files are pickles: they are unpickled only after their checksum
# matches, and then only with an unpickler that admits nothing but NumPy arrays and builtins.
CIFAR10_MD5 = {
    "data_batch_1": "c99cafc152244af753f735de768cd75f",
    "data_batch_2": "d4bba439e000b95fd0a9bffe97cbabec",
    "data_batch_3": "54ebc095f3ab1f0389bbae665268c751",
    "data_batch_4": "634d18415352ddfa80567beed471001a",
    "data_batch_5": "482c414d41f54cd18b22e5b47cb7c3cb",
    "test_batch": "40351d587109b95175f43aff81a1287e",
    "batches.meta": "5ff9c542aee3614f3951f8cda6e48888",
}


class _NumpyOnlyUnpickler(pickle.Unpickler):
    ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("numpy.core.multiarray", "scalar"),
        ("numpy._core.multiarray", "scalar"),
    }

    def find_class(self, module, name):
        if (module, name) in self.ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}")


def _md5(path: Path) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def _load_cifar_file(path: Path) -> dict:
    expected = CIFAR10_MD5[path.name]
    if not path.is_file():
        raise DataError(f"CIFAR-10 file {path} is missing")
    actual = _md5(path)
    if actual != expected:
        raise DataError(f"CIFAR-10 file {path} has md5 {actual}, expected {expected}: "
                        "the file is corrupt or not CIFAR-10")
    try:
        with open(path, "rb") as f:
            return _NumpyOnlyUnpickler(f, encoding="latin1").load()
    except Exception as exc:
        raise DataError(f"cannot read CIFAR-10 file {path}: {exc}") from None


def _cifar10(data_cfg: DataConfig, size: int, mean, std) -> DataSplits:
    root = Path(data_cfg.path).expanduser()
    if (root / "cifar-10-batches-py").is_dir():
        root = root / "cifar-10-batches-py"
    if not root.is_dir():
        raise DataError(f"CIFAR-10 directory {root} does not exist")

    def load(names: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        images, labels = [], []
        for name in names:
            batch = _load_cifar_file(root / name)
            try:
                data, batch_labels = batch["data"], batch["labels"]
                if (data.dtype.name != "uint8" or data.ndim != 2 or data.shape[1] != 3072
                        or len(batch_labels) != len(data)):
                    raise ValueError(f"data {data.dtype.name} {data.shape}, {len(batch_labels)} labels")
                images.append(torch.from_numpy(data.reshape(-1, 3, 32, 32).copy()))
                labels.append(torch.tensor(batch_labels, dtype=torch.long))
                if labels[-1].numel() and (labels[-1].min() < 0 or labels[-1].max() > 9):
                    raise ValueError("labels outside 0..9")
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                raise DataError(f"CIFAR-10 file {root / name} does not hold a CIFAR-10 batch "
                                f"(uint8 'data' (N, 3072) and N 'labels'): {exc}") from None
        return torch.cat(images), torch.cat(labels)

    meta = _load_cifar_file(root / "batches.meta")
    if not isinstance(meta, dict) or len(meta.get("label_names", ())) != 10:
        raise DataError(f"CIFAR-10 file {root / 'batches.meta'} has no list of 10 'label_names'")
    train_x, train_y = load([f"data_batch_{i}" for i in range(1, 6)])
    val_x, val_y = load(["test_batch"])
    if size != 32:
        train_x, val_x = (_resize_u8(x, size) for x in (train_x, val_x))
    return DataSplits(
        train=TensorImageDataset(train_x, train_y, mean, std),
        val=TensorImageDataset(val_x, val_y, mean, std),
        classes=list(meta["label_names"]),
        source="cifar10",
        image_size=size,
        details={"root": str(root), "train_images": len(train_y), "val_images": len(val_y), "split": "test_batch"},
    )


def _resize_u8(images: torch.Tensor, size: int) -> torch.Tensor:
    out = torch.nn.functional.interpolate(images.float(), size=(size, size), mode="bilinear", align_corners=False)
    return out.round().clamp(0, 255).to(torch.uint8)


# --------------------------------------------------------------------------- entry point

_SOURCES = {"synthetic": _synthetic, "imagefolder": _image_folder, "cifar10": _cifar10}


def load(data_cfg: DataConfig, *, image_size: int, mean, std, task: str = "classification") -> DataSplits:
    """Load the configured data set at ``image_size``, normalised with ``mean``/``std``; ``task`` (the model
    spec's) picks the label format: class indices, or boxes (:mod:`pipeline.core.detection_data`)."""
    if task == "detection" or data_cfg.source in ("coco", "scenes"):
        return _load_detection(data_cfg, image_size, mean, std, task)
    splits = _SOURCES[data_cfg.source](data_cfg, image_size, mean, std)
    splits.details["normalisation"] = {"mean": [float(v) for v in mean], "std": [float(v) for v in std]}
    return splits


def _load_detection(data_cfg: DataConfig, image_size: int, mean, std, task: str) -> DataSplits:
    from pipeline.core import detection_data, scene_data  # they import nothing from here (load_image decodes)

    if task != "detection":
        raise DataError(f"data.source={data_cfg.source} holds boxes, but the model is a classifier; pick a detector "
                        "(python -m pipeline models) or an image-folder data source")
    sources = {"synthetic": detection_data.synthetic_splits, "coco": detection_data.coco_splits,
               "scenes": scene_data.scene_splits}
    if data_cfg.source not in sources:
        raise DataError(f"data.source={data_cfg.source} has class labels, but the model is a detector; use "
                        "data.source=coco (a COCO-format folder), synthetic (the embedded detection set) or scenes "
                        "(real images shipped with matplotlib, composited)")
    splits = DataSplits(**sources[data_cfg.source](data_cfg, image_size, mean, std, load_image))
    splits.details["normalisation"] = {"mean": [float(v) for v in mean], "std": [float(v) for v in std]}
    return splits


def augment(images: torch.Tensor, generator: torch.Generator, pad: int = 4) -> torch.Tensor:
    """Random crop from a reflection-padded image and random horizontal flip, per image."""
    n, _, h, w = images.shape
    mode = "reflect" if min(h, w) > pad else "replicate"
    padded = torch.nn.functional.pad(images, (pad, pad, pad, pad), mode=mode)
    dy = torch.randint(0, 2 * pad + 1, (n,), generator=generator).tolist()
    dx = torch.randint(0, 2 * pad + 1, (n,), generator=generator).tolist()
    out = torch.stack([padded[i, :, y : y + h, x : x + w] for i, (y, x) in enumerate(zip(dy, dx, strict=True))])
    flip = torch.rand(n, generator=generator) < 0.5
    out[flip] = out[flip].flip(-1)
    return out


# --------------------------------------------------------------------------- content summary and class check


DIGESTS_SCHEMA = "pipeline.data-digests/1"
DIGESTS_LIMIT = 256 << 20  # the cache of a million files is about 150 MB; a larger one is not read (all re-hashed)
_MEMO: dict[str, dict[str, list]] = {}  # this process's digests per data root: the later stages of `all` reuse them
_STORED: dict[str, dict[str, list]] = {}  # what each cache file holds, as this process read or wrote it


def content_summary(data_cfg: DataConfig, cache: Path | None = None) -> dict:
    """A summary of the data's content for the stage fingerprints: its files' contents, not their names and mtimes.

    For an image folder or CIFAR-10: every file and folder under ``data.path`` (relative path, size, and the sha256
    of its bytes, read streamed) folded into one sha256, the file count, and the top-level folder names (class or
    split folders, whatever the layout). Adding, removing, renaming or changing an image changes it, also with its
    size and mtime restored; touching one does not. A file's digest is reused while its (size, mtime, ctime, inode,
    device) are the ones it was hashed with (ctime: a write with the mtime set back still changes it), from this
    process's memory or from ``cache`` (a JSON file of the run directory, written when given), so a re-run hashes
    only what changed. The synthetic set is a function of the config alone. A missing path is summarised as such;
    the stage that reads the data reports it.
    """
    import os

    if data_cfg.source == "synthetic":
        return {"source": "synthetic"}  # the same for a detector: the model's name is in every fingerprint
    if data_cfg.source == "scenes":  # a function of the config and of matplotlib's sample files: their bytes
        from pipeline.core import scene_data

        return {"source": "scenes", "sha256": scene_data.files_sha256()}
    root = Path(data_cfg.path).expanduser()
    if not root.is_dir():
        return {"source": data_cfg.source, "missing": str(root)}
    known = _MEMO.get(str(root), {})
    if cache is not None and str(cache) not in _STORED:
        _STORED[str(cache)] = _read_digests(cache, root)
    known = known or (_STORED[str(cache)] if cache is not None else {})
    fresh: dict[str, list] = {}
    digest, files, top = hashlib.sha256(), 0, []
    for folder, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        rel = os.path.relpath(folder, root)
        if rel == ".":
            top = list(dirs)
        digest.update(f"D {rel}\n".encode(errors="surrogateescape"))  # a non-UTF-8 name: its own bytes
        for name in sorted(n for n in names if not n.startswith(".")):
            path, key = os.path.join(folder, name), f"{rel}/{name}"
            content = _file_digest(path, key, known, fresh)
            digest.update(f"F {key} {content}\n".encode(errors="surrogateescape"))
            files += 1
    _MEMO[str(root)] = fresh
    if cache is not None and fresh != _STORED[str(cache)]:
        _write_digests(cache, root, fresh)
        _STORED[str(cache)] = fresh
    return {"source": data_cfg.source, "root": _shown(root), "folders": [_shown(Path(d)) for d in top], "files": files,
            "sha256": digest.hexdigest()}


def _file_digest(path: str, key: str, known: dict[str, list], fresh: dict[str, list]) -> str:
    """``size sha256`` of one file (its digest reused while its stat is the one it was hashed with); a dangling link
    or a file that cannot be read counts by its name and what stopping it gave, never by a digest of nothing."""
    import os
    import stat as stat_mod

    try:
        st = os.stat(path)
    except OSError:  # a dangling link: its name still counts
        return "unreadable"
    if not stat_mod.S_ISREG(st.st_mode):
        return "not a file"
    identity = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]
    hit = known.get(key)
    if hit is not None and hit[:-1] == identity:
        fresh[key] = hit
        return f"{st.st_size} {hit[-1]}"
    try:
        with open(path, "rb") as f:
            sha = hashlib.file_digest(f, "sha256").hexdigest()
    except OSError as exc:
        return f"unreadable ({exc.errno})"
    fresh[key] = [*identity, sha]
    return f"{st.st_size} {sha}"


def _read_digests(cache: Path | None, root: Path) -> dict[str, list]:
    """The digests a run directory cached for ``root``; empty when there are none, or none for this root, or the
    file is damaged (then every file is hashed again: the cache can only save time, never decide)."""
    if cache is None or not cache.is_file():
        return {}
    from pipeline.core import schema
    from pipeline.core.errors import PipelineError

    try:
        data = schema.load_json(cache, "data digests", limit=DIGESTS_LIMIT)
    except PipelineError as exc:
        log.debug("data digests not used (%s): every file is hashed", exc)
        return {}
    if not isinstance(data, dict) or data.get("schema") != DIGESTS_SCHEMA or data.get("root") != str(root):
        return {}
    files = data.get("files")
    if not isinstance(files, dict):
        return {}
    return {key: row for key, row in files.items() if isinstance(row, list) and len(row) == 6
            and all(isinstance(v, int) and not isinstance(v, bool) for v in row[:5]) and isinstance(row[5], str)}


def _write_digests(cache: Path, root: Path, files: dict[str, list]) -> None:
    from pipeline.core.run import write_json

    write_json(cache, {"schema": DIGESTS_SCHEMA, "root": str(root), "files": files})


def check_classes(card: ModelCard, classes: list[str]) -> None:
    """The data's classes must be the ones the model was trained on (the model card's), in the same order."""
    trained = card.classes
    if trained is None or list(trained) == list(classes):
        return
    added = [c for c in classes if c not in trained]
    gone = [c for c in trained if c not in classes]
    what = "; ".join(part for part in (f"new in the data: {', '.join(added)}" if added else "",
                                       f"missing from the data: {', '.join(gone)}" if gone else "") if part)
    raise DataError(f"the data has classes {list(classes)}, but the model was trained on "
                    f"{list(trained)} ({what or 'same names, other order'}); re-run train")


def _labels_of(dataset: Dataset) -> list[int]:
    """A split's labels without decoding an image: the strata of the search/verdict partition. A detection image
    holds boxes of several classes, not one label: its split is one stratum (a random, unstratified partition)."""
    labels = getattr(dataset, "labels", None)
    if labels is None:
        return [0] * len(dataset)
    return labels.tolist() if isinstance(labels, torch.Tensor) else list(labels)


def validation_parts(cfg: Config, splits: DataSplits) -> roles.ValidationParts:
    """The validation split cut into tune's search part and the verdict part (:func:`roles.partition_validation`)."""
    return roles.partition_validation(_labels_of(splits.val), cfg.verify.search_fraction,
                                      cfg.verify.min_held_out_images, cfg.data.seed + 2)


def _image_set(role: str, split: str, indices: list[int], images: np.ndarray) -> roles.ImageSet:
    return roles.ImageSet(role, split, tuple(indices), tuple(roles.image_hash(img.tobytes()) for img in images))


def card_splits(cfg: Config, card: ModelCard) -> DataSplits:
    """The configured data set as the run's model card reads it: its image size, normalisation and task."""
    spec = card.spec
    return load(cfg.data, image_size=spec.image_size, mean=spec.mean, std=spec.std, task=spec.task)


def calibration_batch(cfg: Config, card: ModelCard, count: int) -> tuple[np.ndarray, roles.ImageSet]:
    """``count`` calibration images (float32), evenly spaced over the split ``export.calibration_split`` names:
    the training split by default, which no verdict judges on (``validation``: the first validation images, the old
    way, which verify then reports as not held out)."""
    splits = card_splits(cfg, card)
    if cfg.export.calibration_split == "validation":
        split, dataset = "val", splits.val
        indices = list(range(min(count, len(dataset))))
    else:
        split, dataset = "train", splits.train
        indices = roles.spread(list(range(len(dataset))), count)
    x, _ = collate(fetch_items(dataset, indices))
    images = x.numpy().astype("float32")
    return images, _image_set(roles.CALIBRATION, split, indices, images)


def training_images(cfg: Config, card: ModelCard, indices: list[int]) -> np.ndarray:
    """The training split's images at ``indices`` (float32): a calibration draw of the stability certificate."""
    splits = card_splits(cfg, card)
    x, _ = collate(fetch_items(splits.train, list(indices)))
    return x.numpy().astype("float32")


def training_size(cfg: Config, card: ModelCard) -> int:
    return len(card_splits(cfg, card).train)


def role_batch(cfg: Config, card: ModelCard, role: str, count: int, *, names: list[str] | None = None,
               record: list | None = None) -> tuple[np.ndarray, np.ndarray]:
    """:func:`labelled_validation_batch` over one part of the validation split: ``role`` is ``search`` (tune's
    sensitivity and candidate search) or ``verdict`` (verify, tune's held-out confirmation). ``record``, when given,
    receives the :class:`roles.ImageSet` of the images and the :class:`roles.ValidationParts` they come from."""
    splits = card_splits(cfg, card)
    check_classes(card, splits.classes)
    parts = validation_parts(cfg, splits)
    indices = roles.spread(list(parts.search if role == roles.SEARCH else parts.verdict), count)
    if names is not None:
        names[:] = [_image_name(cfg, splits.val, i) for i in indices]
    x, y = collate(fetch_items(splits.val, indices))
    images = x.numpy().astype("float32")
    if record is not None:
        record[:] = [_image_set(role, "val", indices, images), parts]
    return images, y.numpy()


def labelled_validation_batch(cfg: Config, card: ModelCard, count: int, *, spread: bool = False,
                              names: list[str] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """:func:`validation_batch` for a consumer that judges with the labels: refuses data whose classes
    differ from the model card's (a 2-class model against 3-class labels judges nothing). ``spread``: when
    ``count`` is below the split's size, images evenly spaced over the split (an image folder's split is
    ordered by class, so its first images would be the first classes only). ``names``, when given, receives
    each image's name: its file (relative to data.path) for an image folder, else ``val[<index>]``."""
    splits = card_splits(cfg, card)
    check_classes(card, splits.classes)
    n = min(count, len(splits.val))
    indices = list(range(n))
    if spread and n < len(splits.val):
        indices = sorted({int(i) for i in torch.linspace(0, len(splits.val) - 1, n).round().tolist()})
    if names is not None:
        names[:] = [_image_name(cfg, splits.val, i) for i in indices]
    x, y = collate(fetch_items(splits.val, indices))
    return x.numpy().astype("float32"), y.numpy()


def _image_name(cfg: Config, dataset: Dataset, index: int) -> str:
    files = getattr(dataset, "files", None)
    if files is None:
        return f"val[{index}]"
    path = Path(files[index])
    with contextlib.suppress(ValueError):
        return str(path.relative_to(Path(cfg.data.path).expanduser()))
    return str(path)
