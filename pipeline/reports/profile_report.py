"""The per-layer profiles and the roofline of benchmark.json (``profiles``, ``roofline``) as report sections and a plot:
where each CPU artifact's time goes, in which precision its layers actually ran, what was left unfused, and how
close each row comes to the machine's peak."""

from __future__ import annotations

from pipeline.core import artifacts
from pipeline.core.benchmark_rows import BenchmarkRow, Profile, ProfileSummary, rows_of
from pipeline.reports.tables import Cell, Section, Table, _row, fmt, percent
from pipeline.runtime.profiling.layer_account import ORT_INTEGER

# Why a Q/DQ graph's convolutions run in FP32 on ONNX Runtime's CPU provider (tests/test_layer_profile.py checks it on
# the installed version: DQ -> Conv -> Q becomes QLinearConv; Conv -> Relu -> Q, or no Q after the Conv, stays float).
ORT_QDQ_WHY = ("why: ONNX Runtime's CPU provider runs a convolution in INT8 (QLinearConv) only where a QuantizeLinear "
               "takes the Conv's output directly (DequantizeLinear -> Conv -> QuantizeLinear); this graph quantizes "
               "each convolution's inputs only (TensorRT's placement: Conv -> Relu -> the next layer's "
               "QuantizeLinear), so every convolution runs as an FP32 FusedConv on dequantized values. And as ONNX "
               "Runtime keeps each DequantizeLinear for that fusion instead of folding it into a constant, every "
               "inference dequantizes all the weights again (to FP16 in ModelOpt's graph, then a Cast to FP32), and "
               "the FusedConv cannot pre-pack weights that are not constants. The same graph with FP32 regions "
               "(pipeline.precision.int8.with_fp32_regions) fuses no better. On a CPU, deploy the OpenVINO INT8 "
               "artifact (the same Q/DQ graph, run in INT8 kernels)")

KINDS_SHOWN = 12  # rows of each artifact's layer-type table; the rest are summed into one
SLOWEST_SHOWN = 5


def _ms(us) -> str:
    return "-" if us is None else f"{us / 1e3:.3f}"


def _ran_in(summary: ProfileSummary) -> str:
    """The matrix layers' time by the precision they ran in ("fp32 97%, int8 3%"), or their count shares."""
    matrix = summary.matrix_by_precision
    total = sum(g.time_us for g in matrix)
    if total:
        return ", ".join(f"{g.name} {percent(g.time_us / total, '.0f')}" for g in matrix)
    return ", ".join(f"{k} {percent(v, '.0f')} (by count)" for k, v in summary.matrix_shares.items()) or "-"


def finding(entry: Profile) -> str:
    """What the profile says about one artifact: where its matrix-layer time ran against the precision it is timed
    as, and the time left in layers that only convert, quantize or move data."""
    s, claimed = entry.summary, str(entry.precision).split()[0]
    matrix = s.matrix_by_precision
    total = sum(g.time_us for g in matrix)
    parts = []
    if total:
        elsewhere = [g for g in matrix if g.name != claimed]
        share = sum(g.time_us for g in elsewhere) / total
        if share > 0.5:
            matrix_kinds = {x.kind for x in entry.layers if x.matrix}
            kinds = [g for g in s.by_kind_precision
                     if g.name.split()[-1] != claimed and g.name.rsplit(" ", 1)[0] in matrix_kinds
                     and (g.share or 0) >= 0.01][:3]
            parts.append(f"timed as {claimed}, but {percent(share, '.0f')} of its matrix-layer time ran in "
                         f"{', '.join(g.name for g in elsewhere)} (largest: "
                         + ", ".join(f"{g.name} {percent(g.share, '.0f')}" for g in kinds) + ")")
    if s.unfused:
        parts.append(f"{percent(s.unfused_share, '.0f')} of the inference in layers left unfused ("
                     + ", ".join(f"{g.name}: {g.count} layers, {percent(g.share, '.0f')}" for g in s.unfused) + ")")
    kinds, kernels = {x.kind for x in entry.layers}, {x.kernel for x in entry.layers}
    if "DequantizeLinear" in kinds and not kinds & ORT_INTEGER and "CPUExecutionProvider" in kernels:
        parts.append(ORT_QDQ_WHY)
    return "; ".join(parts)


def _kind_table(summary: ProfileSummary) -> Table:
    groups = summary.by_kind_precision
    shown, rest = groups[:KINDS_SHOWN], groups[KINDS_SHOWN:]
    rows = [_row(*g.name.rsplit(" ", 1), str(g.count), _ms(g.time_us), percent(g.share, ".1f")) for g in shown]
    if rest:
        rows.append(_row(f"{len(rest)} other kinds", "-", str(sum(g.count for g in rest)),
                         _ms(sum(g.time_us for g in rest)), percent(sum(g.share or 0 for g in rest), ".1f")))
    return Table(("layer type", "ran in", "layers", "time ms", "share"), tuple(rows))


def _slowest_table(summary: ProfileSummary) -> Table:
    rows = tuple(_row(Cell(x.name, code=True), x.kind, x.precision, x.kernel or "-", _ms(x.time_us),
                      percent(x.share, ".1f")) for x in summary.slowest[:SLOWEST_SHOWN])
    return Table(("slowest layer", "type", "ran in", "kernel", "time ms", "share"), rows)


def _timed_p50(results: list[BenchmarkRow], backend: str, batch: int):
    rows = [r for r in results if r.backend == backend and r.batch_size == batch and not r.is_throughput]
    return rows[0].latency_ms.p50 if rows else None


def profile_sections(payload: dict) -> list[Section]:
    """One overview table of every profile, then a section per artifact at its smallest batch."""
    typed = rows_of(payload)
    profiles = typed.profiles or []
    if not profiles:
        return []
    overview = tuple(_row(p.backend, str(p.batch_size), p.precision, _ran_in(p.summary), _ms(p.summary.total_us),
                          fmt(_timed_p50(typed.results, p.backend, p.batch_size), ".3f"),
                          percent(p.summary.unfused_share, ".0f")) for p in profiles)
    intro = ("Each CPU artifact once more after the timings, each layer's fastest of five profiled inferences by the "
             "runtime's own counters: ONNX Runtime's profiler (per-node kernel time, the element type of each node's "
             "first input), OpenVINO's runtime model with PERF_COUNT (per-layer time, primitiveType, "
             "runtimePrecision). "
             "The layers' sum leaves out what runs between them (ONNX Runtime's session overhead, OpenVINO's "
             "request), so it is below the timed p50; 'unfused' is the time in reorders, converts and Q/DQ.")
    sections = [Section("Per-layer profile (CPU)", paragraphs=(intro,), tables=(Table(
        ("backend", "batch", "timed as", "matrix layers ran in (time)", "layers' sum ms", "timed p50 ms", "unfused"),
        overview),))]
    smallest: dict[str, Profile] = {}
    for p in profiles:
        smallest.setdefault(p.backend, p)
    for p in smallest.values():
        text = f"{p.source}; {p.summary.layers} layers at batch {p.batch_size}."
        found = finding(p)
        sections.append(Section(f"Profile: {p.backend}", level=3,
                                paragraphs=(text, *((found[0].upper() + found[1:] + ".",) if found else ())),
                                tables=(_kind_table(p.summary), _slowest_table(p.summary))))
    return sections


def roofline_section(payload: dict) -> Section | None:
    """The machine's peak per precision, the model's MACs, and each CPU row's fraction of its precision's peak."""
    roof = rows_of(payload).roofline
    if not roof:
        return None
    m = roof.machine
    text = (f"{m.model_name or m.vendor} ({m.vendor}, family {m.family}), {m.cores} cores at "
            f"{m.mhz:.0f} MHz ({m.mhz_source}); {roof.macs.per_image / 1e6:.1f} M multiply-accumulates "
            f"per image ({roof.macs.source}: every Conv, Gemm and MatMul). Peak: every core issuing its widest "
            "multiply-add every cycle (a multiply-add is 2 operations); fraction = 2 x MACs x batch / p50 / peak of "
            "the row's precision.")
    peaks = tuple(_row(p.precision, p.unit, str(p.flops_per_cycle), fmt(p.gflops, ".1f"), Cell(p.source))
                  for p in roof.peaks.values())
    rows = tuple(_row(r.backend, str(r.batch_size), r.timing.split(" (")[0], r.peak_precision, fmt(r.p50_ms, ".3f"),
                      fmt(r.achieved_gflops, ".2f"), fmt(r.peak_gflops, ".1f"), percent(r.fraction, ".1f"),
                      percent(r.fraction_of_fp32, ".1f")) for r in roof.rows)
    return Section("Roofline (CPU)", paragraphs=(text,), tables=(
        Table(("precision", "unit", "ops/cycle/core", "peak GOP/s", "source"), peaks),
        Table(("backend", "batch", "timing", "peak in", "p50 ms", "achieved GOP/s", "peak GOP/s", "fraction of peak",
               "of FP32 peak"), rows)))


def sections(payload: dict) -> list[Section]:
    roof = roofline_section(payload)
    return [*profile_sections(payload), *((roof,) if roof else ())]


def write_plot(run_dir, payload: dict) -> list[str]:
    """benchmark_profile.png: per artifact at its smallest batch, time by layer type, stacked by the precision it ran
    in ([] without profiles)."""
    profiles = list({p.backend: p for p in reversed(rows_of(payload).profiles or [])}.values())[::-1]
    profiles = [p for p in profiles if p.summary.total_us]
    if not profiles:
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from pipeline.core.run import atomic_path

    precisions = sorted({g.name for p in profiles for g in p.summary.by_precision})
    colours = dict(zip(precisions, plt.rcParams["axes.prop_cycle"].by_key()["color"] * 3, strict=False))
    fig, axes = plt.subplots(len(profiles), 1, figsize=(8, 2.2 + 1.9 * len(profiles)), squeeze=False)
    for ax, p in zip(axes[:, 0], profiles, strict=True):
        _stacked(ax, p, colours)
    fig.tight_layout()
    with atomic_path(run_dir.file(artifacts.PROFILE_PLOT)) as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    plt.close(fig)
    return [artifacts.PROFILE_PLOT]


def _stacked(ax, profile: Profile, colours: dict) -> None:
    """One artifact's horizontal bars: its slowest layer types, each split by the precision it ran in."""
    s = profile.summary
    kinds = [g.name for g in s.by_kind[:8]][::-1]
    cell = {g.name: g.time_us / 1e3 for g in s.by_kind_precision}
    left = [0.0] * len(kinds)
    for precision, colour in colours.items():
        widths = [cell.get(f"{kind} {precision}", 0.0) for kind in kinds]
        if any(widths):
            ax.barh(kinds, widths, left=left, color=colour, label=precision)
            left = [a + b for a, b in zip(left, widths, strict=True)]
    ax.set_title(f"{profile.backend} (timed as {profile.precision}), batch {profile.batch_size}: "
                 f"{s.total_us / 1e3:.3f} ms in layers, {percent(s.unfused_share, '.0f')} unfused", fontsize=9)
    ax.set_xlabel("time (ms)", fontsize=8)
    ax.tick_params(labelsize=8)
    ax.legend(fontsize=7, loc="lower right")
