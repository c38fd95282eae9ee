"""Detection data behind the same interface as classification's (:class:`pipeline.core.data.DataSplits`).

A sample is a normalised image (C, H, W) and its boxes as one float tensor [MAX_OBJECTS, 5]: (class, x1, y1, x2,
y2) in pixels of the resized square image, rows with class -1 are padding. A batch stacks them ([N, M, 5]), so the
loaders, the trainer and the evidence handle detection labels as they handle class labels.

Two sources:

* the embedded synthetic set (``data.source=synthetic`` with a detector): textured backgrounds with 1-4 shapes each
  (square, disc, triangle, cross, ring, bar: the first ``min(data.num_classes, 6)``), their boxes known; a
  deterministic function of ``data.seed``;
* a COCO-format folder (``data.source=coco``): ``data.path`` holds ``annotations/instances_train.json`` and
  ``annotations/instances_val.json`` (else one ``annotations.json``, split by ``data.val_fraction``) and the images
  their ``file_name`` names, relative to ``data.path`` or to ``data.path/images``; read with pycocotools.
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch.utils.data import Dataset

from pipeline.core.errors import DataError

if TYPE_CHECKING:
    from pipeline.core.config_schema import DataConfig

log = logging.getLogger("pipeline")

SHAPES = ("square", "disc", "triangle", "cross", "ring", "bar")
MAX_OBJECTS = 4  # objects per synthetic image
MAX_COCO_OBJECTS = 50  # boxes kept per COCO image (the largest first)
ANNOTATION_BYTES = 256 << 20  # an annotations file larger than this is refused


class DetectionDataset(Dataset):
    """Images and padded boxes; ``images`` uint8 in memory, or ``files`` decoded on access."""

    def __init__(self, images: torch.Tensor | None, targets: torch.Tensor, mean, std,
                 files: list[Path] | None = None, size: int = 0, decode=None):
        self.images, self.targets, self.files, self.size = images, targets.float(), files, size
        self.decode = decode  # files: pipeline.core.data.load_image
        self.mean = torch.tensor(mean, dtype=torch.float32).view(-1, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32).view(-1, 1, 1)

    def __len__(self) -> int:
        return len(self.targets)

    def _image(self, index: int) -> torch.Tensor:
        if self.images is not None:
            return self.images[index]
        return self.decode(self.files[index], self.size)

    def __getitem__(self, index: int):
        return (self._image(index).float() / 255.0 - self.mean) / self.std, self.targets[index]

    def __getitems__(self, indices: list[int]):
        images = torch.stack([self._image(i) for i in indices]).float() / 255.0
        return (images - self.mean) / self.std, self.targets[torch.as_tensor(indices, dtype=torch.long)]


# --------------------------------------------------------------------------- the embedded synthetic set


def _mask(shape: str, size: int, x1: int, y1: int, w: int, h: int) -> torch.Tensor:
    ys = torch.arange(size, dtype=torch.float32).view(-1, 1)
    xs = torch.arange(size, dtype=torch.float32).view(1, -1)
    u = (xs - x1 + 0.5) / w  # 0..1 inside the box
    v = (ys - y1 + 0.5) / h
    inside = (u >= 0) & (u <= 1) & (v >= 0) & (v <= 1)
    r = ((u - 0.5) ** 2 + (v - 0.5) ** 2).sqrt()
    if shape == "square":
        m = inside
    elif shape == "disc":
        m = r <= 0.5
    elif shape == "triangle":
        m = inside & ((u - 0.5).abs() <= v / 2)
    elif shape == "cross":
        m = inside & (((u - 0.5).abs() <= 0.17) | ((v - 0.5).abs() <= 0.17))
    elif shape == "ring":
        m = (r <= 0.5) & (r >= 0.3)
    else:  # bar: a diagonal band
        m = inside & ((u - v).abs() <= 0.25)
    return m


def synthetic_detection(classes: int, count: int, size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``count`` images [count, 3, size, size] (uint8) and their boxes [count, MAX_OBJECTS, 5]."""
    g = torch.Generator().manual_seed(seed)
    images = torch.empty(count, 3, size, size, dtype=torch.uint8)
    targets = torch.full((count, MAX_OBJECTS, 5), -1.0)
    lo, hi = max(4, size // 6), max(6, size * 2 // 5)
    ramp = torch.linspace(0, 1, size)
    for i in range(count):
        tint = torch.rand(3, generator=g) * 0.5 + 0.1
        tilt = torch.rand(2, generator=g) - 0.5
        background = tint.view(3, 1, 1) + 0.3 * (tilt[0] * ramp.view(1, -1) + tilt[1] * ramp.view(-1, 1))
        image = background + 0.08 * torch.randn(3, size, size, generator=g)
        placed: list[tuple[int, int, int, int]] = []
        for _ in range(int(torch.randint(1, MAX_OBJECTS + 1, (1,), generator=g))):
            for _try in range(8):  # a place that overlaps earlier objects little
                w, h = (int(v) for v in torch.randint(lo, hi + 1, (2,), generator=g))
                x1 = int(torch.randint(0, size - w + 1, (1,), generator=g))
                y1 = int(torch.randint(0, size - h + 1, (1,), generator=g))
                if all(_overlap((x1, y1, x1 + w, y1 + h), p) < 0.2 for p in placed):
                    break
            else:
                continue
            cls = int(torch.randint(0, classes, (1,), generator=g))
            colour = torch.rand(3, generator=g)
            texture = 1 + 0.25 * torch.sin(torch.arange(size).float() * float(torch.rand(1, generator=g)) * 2)
            mask = _mask(SHAPES[cls], size, x1, y1, w, h)
            image = torch.where(mask, colour.view(3, 1, 1) * texture.view(1, 1, -1), image)
            targets[i, len(placed)] = torch.tensor([cls, x1, y1, x1 + w, y1 + h], dtype=torch.float32)
            placed.append((x1, y1, x1 + w, y1 + h))
        images[i] = (image.clamp(0, 1) * 255).round().to(torch.uint8)
    return images, targets


def _overlap(a, b) -> float:
    iw = max(0, min(a[2], b[2]) - max(a[0], b[0]))
    ih = max(0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = iw * ih
    return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)


_LAST: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


def synthetic_splits(data_cfg: DataConfig, size: int, mean, std, decode=None) -> dict:
    """The embedded set's splits: the fields of :class:`pipeline.core.data.DataSplits`."""
    classes = min(data_cfg.num_classes, len(SHAPES))
    count = max(4, data_cfg.samples_per_class * classes // 2)
    key = (classes, count, size, data_cfg.seed)
    if key not in _LAST:
        _LAST.clear()
        _LAST[key] = synthetic_detection(*key)
    images, targets = _LAST[key]
    n_val = max(1, round(count * data_cfg.val_fraction))
    order = torch.randperm(count, generator=torch.Generator().manual_seed(data_cfg.seed + 1))
    va, tr = order[:n_val].sort().values, order[n_val:].sort().values
    return dict(
        train=DetectionDataset(images[tr], targets[tr], mean, std),
        val=DetectionDataset(images[va], targets[va], mean, std),
        classes=list(SHAPES[:classes]), source="synthetic", image_size=size,
        details={"train_images": len(tr), "val_images": len(va), "generator": "shapes on textured backgrounds",
                 "task": "detection", "boxes_per_image": f"1-{MAX_OBJECTS}", "seed": data_cfg.seed})


# --------------------------------------------------------------------------- COCO-format folder


def _annotation_files(root: Path) -> dict[str, Path]:
    split = {"train": root / "annotations" / "instances_train.json", "val": root / "annotations" / "instances_val.json"}
    if all(p.is_file() for p in split.values()):
        return split
    single = root / "annotations.json"
    if single.is_file():
        return {"all": single}
    raise DataError(f"{root} is not a COCO-format folder: it needs annotations/instances_train.json and "
                    "annotations/instances_val.json, or annotations.json (docs/detection.md)")


def _read_coco(path: Path):
    from pycocotools.coco import COCO

    if path.stat().st_size > ANNOTATION_BYTES:
        raise DataError(f"{path} is larger than {ANNOTATION_BYTES >> 20} MiB; refused")
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints its progress
            return COCO(str(path))
    except Exception as exc:  # malformed JSON or a missing key: one line
        raise DataError(f"{path} is not a COCO annotations file ({type(exc).__name__}: {exc})") from None


def _coco_set(coco, root: Path, size: int, categories: list[int], mean, std, decode) -> DetectionDataset:
    files, targets = [], []
    for image_id in sorted(coco.getImgIds()):
        info = coco.loadImgs(image_id)[0]
        file = next((p for p in (root / info["file_name"], root / "images" / info["file_name"]) if p.is_file()), None)
        if file is None:
            raise DataError(f"{root}: image {info['file_name']!r} (id {image_id}) is missing")
        sx, sy = size / float(info["width"]), size / float(info["height"])
        rows = []
        for ann in coco.loadAnns(coco.getAnnIds(imgIds=image_id, iscrowd=False)):
            if ann["category_id"] not in categories:
                continue
            x, y, w, h = (float(v) for v in ann["bbox"])
            if w <= 0 or h <= 0 or not all(map(math.isfinite, (x, y, w, h))):
                continue
            rows.append([categories.index(ann["category_id"]), x * sx, y * sy, (x + w) * sx, (y + h) * sy])
        rows.sort(key=lambda r: -(r[3] - r[1]) * (r[4] - r[2]))
        t = torch.full((MAX_COCO_OBJECTS, 5), -1.0)
        if rows:
            t[: min(len(rows), MAX_COCO_OBJECTS)] = torch.tensor(rows[:MAX_COCO_OBJECTS])
        files.append(file)
        targets.append(t)
    if not files:
        raise DataError(f"{root}: the annotations list no images")
    return DetectionDataset(None, torch.stack(targets), mean, std, files=files, size=size, decode=decode)


def coco_splits(data_cfg: DataConfig, size: int, mean, std, decode=None) -> dict:
    """A COCO-format folder's splits (the fields of :class:`pipeline.core.data.DataSplits`); ``decode(path, size)``
    reads one image file."""
    root = Path(data_cfg.path).expanduser()
    if not root.is_dir():
        raise DataError(f"data.path {root} is not a folder")
    files = _annotation_files(root)
    cocos = {k: _read_coco(p) for k, p in files.items()}
    first = next(iter(cocos.values()))
    categories = sorted(first.getCatIds())
    if not categories:
        raise DataError(f"{files[next(iter(files))]} lists no categories")
    names = [first.loadCats(c)[0]["name"] for c in categories]
    if "all" in cocos:
        whole = _coco_set(cocos["all"], root, size, categories, mean, std, decode)
        n_val = max(1, round(len(whole) * data_cfg.val_fraction))
        order = torch.randperm(len(whole), generator=torch.Generator().manual_seed(data_cfg.seed + 1))
        va, tr = sorted(order[:n_val].tolist()), sorted(order[n_val:].tolist())
        train = DetectionDataset(None, whole.targets[tr], mean, std, [whole.files[i] for i in tr], size, decode)
        val = DetectionDataset(None, whole.targets[va], mean, std, [whole.files[i] for i in va], size, decode)
    else:
        train = _coco_set(cocos["train"], root, size, categories, mean, std, decode)
        val = _coco_set(cocos["val"], root, size, categories, mean, std, decode)
    if len(train) == 0 or len(val) == 0:
        raise DataError(f"{root}: the training or validation split has no images")
    return dict(train=train, val=val, classes=names, source="coco", image_size=size,
                details={"train_images": len(train), "val_images": len(val), "task": "detection",
                         "annotations": [str(p.relative_to(root)) for p in files.values()]})
