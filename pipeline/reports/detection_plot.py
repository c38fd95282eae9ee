"""A detector's verification, drawn: a few validation images with the reference's boxes beside a candidate's
(``verify_boxes.png``, embedded in report.html). The candidate is the first gating one that failed, else the
gating one of the lowest precision that ran: where boxes are most likely to have moved."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pipeline.core.run import atomic_path
from pipeline.core.status import Status

SHOWN = 4  # images
ORDER = ("int8", "bf16", "fp16", "fp32")  # the candidate shown when none failed: the lowest precision first


def chosen(checks) -> object | None:
    ran = [c for c in checks if c.gates and c.status in (Status.PASSED, Status.FAILED, Status.INCONCLUSIVE)]
    failed = [c for c in ran if c.status == Status.FAILED]
    if failed:
        return failed[0]
    ran.sort(key=lambda c: ORDER.index(c.precision) if c.precision in ORDER else len(ORDER))
    return ran[0] if ran else None


def draw(path: Path, images: np.ndarray, mean, std, reference: np.ndarray, candidate: np.ndarray, name: str,
         classes: list[str], min_score: float) -> None:
    """``images`` [n, 3, h, w] as fed (normalised); detections [n, k, 6]; boxes scored at least ``min_score``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    n = min(SHOWN, len(images))
    fig, axes = plt.subplots(2, n, figsize=(2.4 * n, 5), squeeze=False)
    pixels = np.clip(images[:n].transpose(0, 2, 3, 1) * np.asarray(std) + np.asarray(mean), 0, 1)
    for col in range(n):
        for row, (dets, who) in enumerate(((reference, "reference (FP32)"), (candidate, name))):
            ax = axes[row][col]
            ax.imshow(pixels[col], interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
            if col == 0:
                ax.set_ylabel(who, fontsize=8)
            for x1, y1, x2, y2, score, label in dets[col]:
                if score < min_score:
                    continue
                colour = "lime" if row == 0 else "red"
                ax.add_patch(Rectangle((x1 - 0.5, y1 - 0.5), x2 - x1, y2 - y1, fill=False, color=colour, lw=1))
                text = classes[int(label)] if 0 <= int(label) < len(classes) else str(int(label))
                ax.text(x1, y1, f"{text} {score:.2f}", color=colour, fontsize=5, va="bottom")
    fig.suptitle(f"boxes scored >= {min_score:g}: reference (top) and {name} (bottom)", fontsize=9)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)
