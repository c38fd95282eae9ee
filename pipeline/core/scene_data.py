"""A real-image detection set from images shipped inside an installed package (``data.source=scenes``).

matplotlib ships sample data (``matplotlib.cbook.get_sample_data``): a photograph (Grace Hopper's portrait), an MRI
slice of a head, two icons with alpha channels and two real elevation grids. Each scene is a crop of a real
background (the Jacksboro fault's elevation or the Pacific north-west's topography and bathymetry, coloured with a
matplotlib colormap, or the flag of the portrait) with 1 to 4 objects composited on it, cut from the real images:

* ``face``: the portrait's head, under an elliptical mask;
* ``present``: the present icon, under its alpha;
* ``logo``: matplotlib's logo, under its alpha;
* ``brain``: the MRI slice, where it is brighter than a tenth of its maximum.

Each object is scaled to a random box (1/5 to 1/2 of the image wide and high, so its aspect changes), its brightness
jittered, and its box is the tight box of the pixels it covers; objects overlap little (IoU under 0.2). The set is a
deterministic function of ``data.seed``; it has the embedded set's format (:mod:`pipeline.core.detection_data`).
"""

from __future__ import annotations

import functools
import io
from pathlib import Path

import numpy as np
import torch
from torch.nn import functional as F

from pipeline.core.detection_data import MAX_OBJECTS, DetectionDataset, _overlap

OBJECTS = ("face", "present", "logo", "brain")
FILES = ("grace_hopper.jpg", "Minduka_Present_Blue_Pack.png", "logo2.png", "s1045.ima.gz", "jacksboro_fault_dem.npz",
         "topobathy.npz")
BASE = 96  # the side the sources are kept at (the largest default image is 64)


@functools.lru_cache(maxsize=1)
def files_sha256() -> str:
    """One sha256 over the sample files the scenes are made of (what the stage fingerprints compare)."""
    import hashlib

    from matplotlib import cbook

    digest = hashlib.sha256()
    for name in FILES:
        data = Path(cbook.get_sample_data(name, asfileobj=False)).read_bytes()
        digest.update(f"{name} {hashlib.sha256(data).hexdigest()}\n".encode())
    return digest.hexdigest()


def _rgba(name: str, crop: tuple[int, int, int, int] | None = None) -> np.ndarray:
    from matplotlib import cbook
    from PIL import Image

    image = Image.open(io.BytesIO(cbook.get_sample_data(name, asfileobj=True).read())).convert("RGBA")
    if crop:
        image = image.crop(crop)
    image.thumbnail((BASE, BASE), Image.Resampling.LANCZOS)
    return np.asarray(image, np.float32) / 255.0  # H, W, 4


def _ellipse(h: int, w: int) -> np.ndarray:
    y, x = np.mgrid[0:h, 0:w]
    return (((x + 0.5) / w - 0.5) ** 2 + ((y + 0.5) / h - 0.5) ** 2 <= 0.25).astype(np.float32)


@functools.lru_cache(maxsize=1)
def sources() -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The objects ([4, H, W]: RGB and a 0/1 mask, in :data:`OBJECTS` order) and the backgrounds ([3, H, W]), read
    from matplotlib's sample data."""
    from matplotlib import cbook, colormaps

    face = _rgba("grace_hopper.jpg", (150, 20, 380, 340))  # the head, cap included (the image is 512 x 600)
    face[..., 3] = _ellipse(*face.shape[:2])
    present, logo = _rgba("Minduka_Present_Blue_Pack.png"), _rgba("logo2.png")
    mri = np.frombuffer(cbook.get_sample_data("s1045.ima.gz").read(), ">u2").reshape(256, 256).astype(np.float32)
    mri = F.interpolate(torch.from_numpy(mri)[None, None], size=(BASE, BASE), mode="area")[0, 0].numpy()
    mri /= mri.max()
    brain = np.dstack([mri, mri, mri, (mri > 0.1).astype(np.float32)])
    objects = [torch.from_numpy(np.ascontiguousarray(o.transpose(2, 0, 1))) for o in (face, present, logo, brain)]
    for o in objects:
        o[3] = (o[3] > 0.5).float()
    backgrounds = []
    for name, key, cmap in (("jacksboro_fault_dem.npz", "elevation", "gist_earth"),
                            ("topobathy.npz", "topo", "terrain")):
        grid = np.asarray(cbook.get_sample_data(name)[key], np.float32)
        grid = (grid - grid.min()) / max(float(grid.max() - grid.min()), 1e-6)
        backgrounds.append(torch.from_numpy(np.ascontiguousarray(colormaps[cmap](grid)[..., :3].transpose(2, 0, 1)))
                           .float())
    flag = _rgba("grace_hopper.jpg", (0, 0, 140, 600))  # the flag beside her
    backgrounds.append(torch.from_numpy(np.ascontiguousarray(flag[..., :3].transpose(2, 0, 1))))
    return objects, backgrounds


def _background(backgrounds: list[torch.Tensor], size: int, g: torch.Generator) -> torch.Tensor:
    source = backgrounds[int(torch.randint(len(backgrounds), (1,), generator=g))]
    _, h, w = source.shape
    side = int(torch.randint(min(h, w) // 3, min(h, w) + 1, (1,), generator=g))
    y = int(torch.randint(0, h - side + 1, (1,), generator=g))
    x = int(torch.randint(0, w - side + 1, (1,), generator=g))
    crop = F.interpolate(source[None, :, y:y + side, x:x + side], size=(size, size), mode="bilinear",
                         align_corners=False, antialias=True)[0]
    if bool(torch.rand(1, generator=g) < 0.5):
        crop = crop.flip(2)
    return crop


def scene_detection(classes: int, count: int, size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``count`` scenes [count, 3, size, size] (uint8) and their boxes [count, MAX_OBJECTS, 5], objects of the first
    ``classes`` of :data:`OBJECTS`."""
    objects, backgrounds = sources()
    g = torch.Generator().manual_seed(seed)
    images = torch.empty(count, 3, size, size, dtype=torch.uint8)
    targets = torch.full((count, MAX_OBJECTS, 5), -1.0)
    lo, hi = max(4, size // 5), max(6, size // 2)
    for i in range(count):
        image = _background(backgrounds, size, g)
        placed: list[tuple[int, int, int, int]] = []
        for _ in range(int(torch.randint(1, MAX_OBJECTS + 1, (1,), generator=g))):
            cls = int(torch.randint(0, classes, (1,), generator=g))
            w, h = (int(v) for v in torch.randint(lo, hi + 1, (2,), generator=g))
            x1 = int(torch.randint(0, size - w + 1, (1,), generator=g))
            y1 = int(torch.randint(0, size - h + 1, (1,), generator=g))
            gain = 0.7 + 0.6 * float(torch.rand(1, generator=g))
            patch = F.interpolate(objects[cls][None], size=(h, w), mode="bilinear", align_corners=False,
                                  antialias=True)[0]
            mask = patch[3] > 0.5
            if not bool(mask.any()):
                continue
            ys, xs = mask.any(1).nonzero()[:, 0], mask.any(0).nonzero()[:, 0]
            box = (x1 + int(xs[0]), y1 + int(ys[0]), x1 + int(xs[-1]) + 1, y1 + int(ys[-1]) + 1)
            if any(_overlap(box, p) >= 0.2 for p in placed):
                continue
            region = image[:, y1:y1 + h, x1:x1 + w]
            image[:, y1:y1 + h, x1:x1 + w] = torch.where(mask, (patch[:3] * gain).clamp(0, 1), region)
            targets[i, len(placed)] = torch.tensor([cls, *box], dtype=torch.float32)
            placed.append(box)
        images[i] = (image.clamp(0, 1) * 255).round().to(torch.uint8)
    return images, targets


_LAST: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


def scene_splits(data_cfg, size: int, mean, std, decode=None) -> dict:
    """The scenes' splits: the fields of :class:`pipeline.core.data.DataSplits` (``data.samples_per_class`` ×
    classes / 2 scenes, as the embedded set; ``data.val_fraction`` held out)."""
    classes = min(data_cfg.num_classes, len(OBJECTS))
    count = max(4, data_cfg.samples_per_class * classes // 2)
    key = (classes, count, size, data_cfg.seed)
    if key not in _LAST:
        _LAST.clear()
        _LAST[key] = scene_detection(*key)
    images, targets = _LAST[key]
    n_val = max(1, round(count * data_cfg.val_fraction))
    order = torch.randperm(count, generator=torch.Generator().manual_seed(data_cfg.seed + 1))
    va, tr = order[:n_val].sort().values, order[n_val:].sort().values
    return dict(
        train=DetectionDataset(images[tr], targets[tr], mean, std),
        val=DetectionDataset(images[va], targets[va], mean, std),
        classes=list(OBJECTS[:classes]), source="scenes", image_size=size,
        details={"train_images": len(tr), "val_images": len(va), "task": "detection",
                 "generator": "matplotlib's sample images (a photograph, an MRI slice, two icons) composited on "
                              "real elevation grids and the photograph's flag",
                 "boxes_per_image": f"1-{MAX_OBJECTS}", "seed": data_cfg.seed})
