"""The detection gate's margins on finished runs: one Markdown row per candidate that ran, from each run's verify.json.

    python scripts/detection_margins.py LABEL=RUN_DIR [LABEL=RUN_DIR ...]

Per candidate: the tensor check's scaled head error against its precision's ``max_scaled_error`` (margin: the
default over the value), the matched boxes' share against ``verify.detection.min_matched_share`` (margin: points
above it) and the mAP@0.5:0.95 drop against ``verify.detection.max_map_drop`` (margin: points under it), with the
bounds the verdict used. docs/detection.md publishes its output.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HEADER = ("| data set | candidate | status | scaled head error (default; margin) | matched boxes (bound; min; margin) "
          "| mAP drop (bound; max; margin) |\n|---|---|---|---|---|---|")


def rows(label: str, run: Path) -> list[str]:
    report = json.loads((run / "verify.json").read_text())
    out = []
    for c in report["candidates"]:
        tensor, task = c.get("tensor_check") or {}, c.get("task_check") or {}
        if not tensor or not task.get("agreement"):
            continue
        err, limit = tensor["scaled_error_quantile"], tensor["threshold"]
        agree, drop = task["agreement"], task["drop"]
        out.append(
            f"| {label} | {c['name']} | {c['status']} | {err:.3g} ({limit:g}; {limit / max(err, 1e-12):.1f}x) "
            f"| {100 * agree['value']:.2f} % of {task['boxes']} ({100 * agree['upper_bound']:.2f} %; "
            f"{100 * agree['threshold']:g} %; {100 * (agree['value'] - agree['threshold']):+.1f} pt) "
            f"| {100 * drop['value']:+.2f} pt ({100 * drop['lower_bound']:+.2f}; {100 * drop['threshold']:g}; "
            f"{100 * (drop['threshold'] - drop['value']):+.2f} pt) |")
    return out


def main(argv: list[str]) -> int:
    if not argv or any("=" not in a for a in argv):
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    print(HEADER)
    for arg in argv:
        label, run = arg.split("=", 1)
        print("\n".join(rows(label, Path(run))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
