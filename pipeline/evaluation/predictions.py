"""What each verify candidate predicted, image by image: ``verify.predictions.npz`` in the run directory.

verify computes every candidate's logits on the validation images and judges them; this module keeps the part a
later run is compared on (``python -m pipeline baseline`` / ``compare``): per image its name, its label and the
sha256 of its pixels (the float32 array the models were fed: two images are the same image only when these
match), and per candidate (and the FP32 reference, ``torch_fp32``) the top-5 classes with their logits. Top-5
rather than the whole logit vector keeps a 1,000-class baseline small (1,000 images x 8 candidates: about 250 KB)
while still showing how the winning logits drifted.

:func:`read` is the one reader of such a file (the run's and a baseline bundle's): only the arrays asked for are
loaded, each bounded from its header (:func:`pipeline.core.schema.read_npz`), then checked against each other
(every top-5 array is ``[images, k]``, classes and labels within ``[0, classes)``, digests are sha256 values).
"""

from __future__ import annotations

import hashlib
import io
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.core import schema
from pipeline.core.artifacts import VERIFY_PREDICTIONS
from pipeline.core.errors import InputError
from pipeline.core.run import atomic_write
from pipeline.core.schema import ArraySpec
from pipeline.core.verdicts import JUDGED
from pipeline.runtime import backends

TOP = 5
REFERENCE = backends.REFERENCE  # the reference's predictions are stored under its table name
MAX_IMAGES = 100_000  # validation images one file may hold (verify's default is 1,000)
LIMIT = 64 * schema.MiB  # the file itself: 1,000 images and 9 candidates take about 250 KB
_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class Top5:
    """One candidate's ``k`` largest classes per image, largest first, and their logits: both ``[images, k]``."""

    classes: np.ndarray
    logits: np.ndarray

    @property
    def top1(self) -> np.ndarray:
        return self.classes[:, 0]


@dataclass(frozen=True)
class Predictions:
    """A predictions file, checked: ``names``, ``labels`` and ``digests`` per image, and the candidates asked for."""

    names: np.ndarray
    labels: np.ndarray
    digests: np.ndarray
    top5: dict[str, Top5]


def top_k(logits: np.ndarray, k: int = TOP) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` largest classes of each row, largest first, and their logits."""
    k = min(k, logits.shape[1])
    order = np.argsort(-logits, axis=1, kind="stable")[:, :k]
    return order.astype(np.int32), np.take_along_axis(logits, order, axis=1).astype(np.float32)


def image_digests(images: np.ndarray) -> np.ndarray:
    """Per image (first axis), the sha256 of its float32 bytes, as hex: what identifies an image across runs."""
    flat = np.ascontiguousarray(images, dtype=np.float32).reshape(len(images), -1)
    return np.asarray([hashlib.sha256(row.tobytes()).hexdigest() for row in flat], dtype=str)


def _stack(outputs: list[dict], output_name: str) -> np.ndarray:
    return np.concatenate([np.asarray(o[output_name], dtype=np.float32) for o in outputs])


def arrays(names: list[str], labels: np.ndarray, digests: np.ndarray, reference: list[dict],
           candidates: dict[str, list[dict]], output_name: str) -> dict[str, np.ndarray]:
    """The file's arrays: ``names``, ``labels``, ``digests`` and ``<candidate>.top5_class`` / ``.top5_logit``."""
    out = {"names": np.asarray(names, dtype=str), "labels": np.asarray(labels, dtype=np.int64),
           "digests": np.asarray(digests, dtype=str)}
    for name, outputs in {REFERENCE: reference, **candidates}.items():
        out[f"{name}.top5_class"], out[f"{name}.top5_logit"] = top_k(_stack(outputs, output_name))
    return out


def as_arrays(predictions: Predictions) -> dict[str, np.ndarray]:
    """The arrays of a checked :class:`Predictions` (a bundle keeps the candidates it was read with)."""
    out = {"names": predictions.names, "labels": predictions.labels, "digests": predictions.digests}
    for name, top in predictions.top5.items():
        out[f"{name}.top5_class"], out[f"{name}.top5_logit"] = top.classes, top.logits
    return out


def to_bytes(data: dict[str, np.ndarray]) -> bytes:
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **data)  # type: ignore[arg-type]  # NumPy's stub types **kwds as allow_pickle
    return buffer.getvalue()


def write(path: Path, data: dict[str, np.ndarray]) -> None:
    """``path`` (confined by the caller) replaced in one rename, never written through a link."""
    atomic_write(path, to_bytes(data))


# --------------------------------------------------------------------------- reading


def _specs(candidates: Iterable[str]) -> dict[str, ArraySpec]:
    specs = {"names": ArraySpec("U", 1, MAX_IMAGES), "labels": ArraySpec("iu", 1, MAX_IMAGES),
             "digests": ArraySpec("U", 1, MAX_IMAGES, max_bytes=MAX_IMAGES * 64 * 4)}
    for name in candidates:
        specs[f"{name}.top5_class"] = ArraySpec("iu", 2, MAX_IMAGES * TOP)
        specs[f"{name}.top5_logit"] = ArraySpec("f", 2, MAX_IMAGES * TOP)
    return specs


def read(path: Path, what: str, candidates: Iterable[str], classes: int, *, optional: bool = False,
         finite: bool = True, sha256: str | None = None) -> Predictions:
    """The names, labels, digests and the ``candidates``' top-5 of a predictions file, checked; anything else in
    the file is not loaded. ``optional``: a candidate absent from the file is left out (else refused).
    ``finite``: a NaN or infinite logit is refused (a baseline's: it passed the gate, so it has none).
    ``sha256``: the digest the file must have. Anything wrong is an :class:`InputError` (exit 2), one line."""
    candidates = list(dict.fromkeys(candidates))
    specs = _specs(candidates)
    keys = tuple(k for k in specs if "." in k) if optional else ()
    data = schema.read_npz(path, specs, what, limit=LIMIT, optional=keys, sha256=sha256)
    where = f"{path}: {what}"
    images = _per_image(data, where, classes)
    top5 = {}
    for name in candidates:
        pair = data.get(f"{name}.top5_class"), data.get(f"{name}.top5_logit")
        if pair[0] is None and pair[1] is None:
            continue
        if pair[0] is None or pair[1] is None:
            raise InputError(f"{where}: {schema.printable(name, 60)} has one of its two top-5 arrays only")
        top5[name] = _top5(*pair, where=f"{where}: {schema.printable(name, 60)}", images=len(images[0]),
                           classes=classes, finite=finite)
    return Predictions(*images, top5=top5)


def _per_image(data: dict, where: str, classes: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    names, labels, digests = data["names"], data["labels"], data["digests"]
    if len(names) == 0:
        raise InputError(f"{where} holds no images")
    if len(labels) != len(names) or len(digests) != len(names):
        raise InputError(f"{where}: {len(names)} names, {len(labels)} labels and {len(digests)} digests: one per "
                         "image each")
    _in_range(labels, classes, f"{where}: labels")
    if not all(_SHA256.fullmatch(str(d)) for d in digests):
        raise InputError(f"{where}: digests are not sha256 values (64 hex digits each)")
    return names, labels, digests


def _top5(classes_: np.ndarray, logits: np.ndarray, *, where: str, images: int, classes: int,
          finite: bool) -> Top5:
    k = classes_.shape[1]
    if classes_.shape != (images, k) or logits.shape != (images, k) or not 1 <= k <= min(TOP, classes):
        raise InputError(f"{where}: top-5 arrays of shape {classes_.shape} and {logits.shape}, expected "
                         f"[{images} images, k <= {min(TOP, classes)}] both")
    _in_range(classes_, classes, f"{where}: top-5 classes")
    if finite and not np.isfinite(logits).all():
        raise InputError(f"{where}: {int((~np.isfinite(logits)).sum())} top-5 logits are NaN or infinite")
    if finite and (np.diff(logits, axis=1) > 0).any():
        raise InputError(f"{where}: top-5 logits are not in descending order: not a top-5")
    return Top5(classes_.astype(np.int64), logits.astype(np.float64))


def _in_range(values: np.ndarray, classes: int, where: str) -> None:
    if values.size and (values.min() < 0 or values.max() >= classes):
        raise InputError(f"{where} must be class indices in [0, {classes}), found {values.min()}..{values.max()}")


def record(run_dir, checks, evidence) -> Path | None:
    """verify's hook: write the predictions of every candidate that reached a verdict; None when none did."""
    outputs = {c.name: evidence.outputs[c.name] for c in checks if c.status in JUDGED and c.name in evidence.outputs}
    if not evidence.names:
        return None
    digests = np.concatenate([image_digests(next(iter(feed.values()))) for feed in evidence.feeds])
    path = run_dir.file(VERIFY_PREDICTIONS)
    write(path, arrays(evidence.names, evidence.labels, digests, evidence.reference, outputs, evidence.output_name))
    return path
