"""The calibration stability certificate's wording (:mod:`pipeline.evaluation.certificate`): its sections in verify.md,
tune.md and report.html (a table of the draws, the spreads, the most variable quantizers) and its plot (the gate's
scaled error of every draw against the limit)."""

from __future__ import annotations

from pipeline.core.run import RunDir, atomic_path
from pipeline.core.status import Status
from pipeline.reports.tables import Cell, Section, Table, fmt, percent


def sections(s: dict) -> list[Section]:
    cert = s["certificate"]
    status = {"stable": Status.PASSED, "failed": Status.FAILED, "lucky": Status.FAILED}.get(cert["status"],
                                                                                          cert["status"])
    gate = {k: {end: fmt(v[end]) for end in ("min", "max")} for k, v in s["gate_spread"].items()}
    act = s["scale_spread"].get("activation") or {}
    words = [f"{cert['line']}.",
             f"{cert['draws']} draws of {s['draw_size']} training images ({s['sampling']}"
             f"{'; ' + s['sampling_note'] if s.get('sampling_note') else ''}), draw 0 the deployed calibration; each "
             f"draw's graph executed faithfully (int8_exact) and judged by the gate on the {s['verdict_images']} "
             f"verdict images ({s['seconds']:g} s).",
             f"Across the draws: scaled error {gate['scaled_error']['min']} to {gate['scaled_error']['max']}, "
             f"top-1 agreement {gate['top1_agreement']['min']} to {gate['top1_agreement']['max']}, accuracy "
             f"drop {gate['accuracy_drop']['min']} to {gate['accuracy_drop']['max']}. Activation scales "
             f"({act.get('quantizers', 0)} quantizers): median relative spread {percent(act.get('median_relative'))}, "
             f"largest {percent(act.get('max_relative'))}"
             + (f" ({act['worst']})" if act.get("worst") else "") + "."]
    draws = Table(("draw", "images", "split", "gate", "scaled error", "top-1 agreement", "accuracy drop"), tuple(
        (Cell(f"{r['draw']}{' (deployed)' if r['deployed'] else ''}"), Cell(str(r["images"])), Cell(r["split"]),
         Cell(r["status"], status=r["status"]), Cell(fmt(r.get("scaled_error"))), Cell(fmt(r.get("top1_agreement"))),
         Cell(fmt(r.get("accuracy_drop")))) for r in s["draws"]))
    quantizers = Table(("quantized tensor", "kind", "min scale", "max scale", "relative spread"), tuple(
        (Cell(q["tensor"], code=True), Cell(q["kind"]), Cell(fmt(q["min"])), Cell(fmt(q["max"])),
         Cell(percent(q["relative"]))) for q in s["quantizers"]))
    return [Section("Calibration stability certificate (INT8)", status, tuple(words), (draws, quantizers), level=3)]


def write_plot(run_dir: RunDir, s: dict, name: str, limit: float | None, title: str) -> str:
    """The gate's scaled error of every draw (the deployed one marked) against ``limit``: ``name`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = s["draws"]
    fig, ax = plt.subplots(figsize=(7, 3.5))
    xs = [r["draw"] for r in rows]
    ys = [r.get("scaled_error") if r.get("scaled_error") is not None else float("nan") for r in rows]
    colours = ["tab:green" if r["status"] == Status.PASSED else "tab:orange" if r["status"] == Status.INCONCLUSIVE
               else "tab:red" for r in rows]
    ax.scatter(xs, ys, c=colours, s=[120 if r["deployed"] else 40 for r in rows],
               marker="o", edgecolors=["black" if r["deployed"] else "none" for r in rows])
    if limit is not None:
        ax.axhline(limit, color="grey", linestyle="--", label=f"gate limit {limit:g}")
        ax.legend(fontsize=8)
    ax.set_xlabel("calibration draw (0: deployed, circled)")
    ax.set_ylabel("scaled error (gate statistic)")
    ax.set_xticks(xs)
    cert = s["certificate"]
    ax.set_title(f"{title}: {cert['passing']} of {cert['draws']} draws pass (green: passes)", fontsize=9)
    fig.tight_layout()
    with atomic_path(run_dir.file(name)) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)
    return name
