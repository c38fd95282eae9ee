"""The calibration stability certificate's plot (verify's ``stability.png``, tune's ``tune_stability.png``): the gate's
scaled error of every draw against the limit, the deployed draw circled. Its sections (a table of the draws, the
spreads, the most variable quantizers): :func:`pipeline.reports.tables.stability_sections`."""

from __future__ import annotations

from pipeline.core.run import RunDir, atomic_path
from pipeline.core.stability_record import StabilityCertificate
from pipeline.core.status import Status


def write_plot(run_dir: RunDir, s: StabilityCertificate, name: str, limit: float | None, title: str) -> str:
    """The gate's scaled error of every draw (the deployed one marked) against ``limit``: ``name`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = s.draws
    fig, ax = plt.subplots(figsize=(7, 3.5))
    xs = [r.draw for r in rows]
    ys = [r.scaled_error if r.scaled_error is not None else float("nan") for r in rows]
    colours = ["tab:green" if r.status == Status.PASSED else "tab:orange" if r.status == Status.INCONCLUSIVE
               else "tab:red" for r in rows]
    ax.scatter(xs, ys, c=colours, s=[120 if r.deployed else 40 for r in rows],
               marker="o", edgecolors=["black" if r.deployed else "none" for r in rows])
    if limit is not None:
        ax.axhline(limit, color="grey", linestyle="--", label=f"gate limit {limit:g}")
        ax.legend(fontsize=8)
    ax.set_xlabel("calibration draw (0: deployed, circled)")
    ax.set_ylabel("scaled error (gate statistic)")
    ax.set_xticks(xs)
    cert = s.certificate
    ax.set_title(f"{title}: {cert.passing} of {cert.draws} draws pass (green: passes)", fontsize=9)
    fig.tight_layout()
    with atomic_path(run_dir.file(name)) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)
    return name
