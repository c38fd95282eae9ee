"""What each verify candidate predicted, image by image: ``verify.predictions.npz`` in the run directory.

verify computes every candidate's logits on the validation images and judges them; this module keeps the part a
later run is compared on (``python -m pipeline baseline`` / ``compare``): per image its name, its label, and per
candidate (and the FP32 reference, ``torch_fp32``) the top-5 classes with their logits. Top-5 rather than the
whole logit vector keeps a 1,000-class baseline small (1,000 images x 8 candidates: about 250 KB) while still
showing how the winning logits drifted.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from pipeline.core.status import Status
from pipeline.core.artifacts import VERIFY_PREDICTIONS
from pipeline.core.errors import InputError

TOP = 5
REFERENCE = "torch_fp32"
JUDGED = (Status.PASSED, Status.FAILED, Status.INCONCLUSIVE)


def top_k(logits: np.ndarray, k: int = TOP) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` largest classes of each row, largest first, and their logits."""
    k = min(k, logits.shape[1])
    order = np.argsort(-logits, axis=1, kind="stable")[:, :k]
    return order.astype(np.int32), np.take_along_axis(logits, order, axis=1).astype(np.float32)


def _stack(outputs: list[dict], output_name: str) -> np.ndarray:
    return np.concatenate([np.asarray(o[output_name], dtype=np.float32) for o in outputs])


def arrays(names: list[str], labels: np.ndarray, reference: list[dict], candidates: dict[str, list[dict]],
           output_name: str) -> dict[str, np.ndarray]:
    """The file's arrays: ``names``, ``labels``, and ``<candidate>.top5_class`` / ``<candidate>.top5_logit``."""
    out = {"names": np.asarray(names, dtype=str), "labels": np.asarray(labels, dtype=np.int64)}
    for name, outputs in {REFERENCE: reference, **candidates}.items():
        out[f"{name}.top5_class"], out[f"{name}.top5_logit"] = top_k(_stack(outputs, output_name))
    return out


def write(path: Path, data: dict[str, np.ndarray]) -> None:
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **data)  # type: ignore[arg-type]  # NumPy's stub types **kwds as allow_pickle
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(buffer.getvalue())
    tmp.replace(path)


def read(path: Path) -> dict[str, np.ndarray]:
    """The arrays of a predictions file; a damaged or foreign file is an :class:`InputError` (exit 2)."""
    try:
        with np.load(path, allow_pickle=False) as npz:
            data = {key: npz[key] for key in npz.files}
    except Exception as exc:
        raise InputError(f"{path} is not a readable predictions file ({type(exc).__name__}: {exc})") from None
    if "names" not in data or "labels" not in data:
        raise InputError(f"{path} has no names/labels arrays: not a {VERIFY_PREDICTIONS} file")
    return data


def record(run_dir, checks, evidence) -> Path | None:
    """verify's hook: write the predictions of every candidate that reached a verdict; None when none did."""
    outputs = {c.name: evidence.outputs[c.name] for c in checks if c.status in JUDGED and c.name in evidence.outputs}
    if not evidence.names:
        return None
    path = run_dir.file(VERIFY_PREDICTIONS)
    write(path, arrays(evidence.names, evidence.labels, evidence.reference, outputs, evidence.output_name))
    return path
