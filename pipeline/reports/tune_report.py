"""tune's wording: tune.json, tune.md, its plots, its report section, its summary line and the speed gate's message."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.core import env, precision_config, speed_claims
from pipeline.core.artifacts import TUNE_STABILITY_PLOT, tune_files
from pipeline.core.run import RunDir, atomic_path, atomic_write, write_json
from pipeline.core.status import Status
from pipeline.precision import plugs, sensitivity, tune_result
from pipeline.precision.sensitivity import Candidate, MethodRun
from pipeline.precision.tune_result import (
    ChosenRow,
    Fp32,
    GateNumbers,
    HeldOutConfirmation,
    Ladder,
    MixRow,
    RatioRow,
    Rung,
    Samples,
    SensitivityRow,
    Timing,
    TuneResult,
)
from pipeline.reports import tables
from pipeline.reports.tables import Cell, Section, Table, fmt
from pipeline.runtime.speed import interleave
from pipeline.runtime.speed.openvino_speed import layers_not_in

if TYPE_CHECKING:  # annotations only
    from pipeline.core.config_schema import Config

SCHEMA = tune_result.SCHEMA


def _row(c: Candidate, chosen: Candidate | None, fronts: dict, precision: str, baseline: Candidate | None = None,
         row: type[MixRow] = MixRow, **more) -> MixRow:
    vs_fp32 = sensitivity.time_ratio(c, baseline, [b for b in c.latency_ms if b in baseline.latency_ms]) \
        if baseline is not None else {}
    return row(origin=c.origin, calibration=c.calibration, high=list(c.high), fp32=list(c.fp32),
               layers_raised=len(c.high), result=GateNumbers.model_validate(c.result_json()),
               latency_ms={str(b): v for b, v in c.latency_ms.items()},
               time_vs_fp32={str(b): RatioRow.of(r) for b, r in vs_fp32.items()},
               runtime_not_low=layers_not_in(c.runtime, precision), chosen=c is chosen,
               pareto=any(c is f for f in fronts.get(c.calibration, [])), **more)


def _timing(t) -> Timing:
    return Timing(warmup_s=t.timing.warmup_s, min_duration_s=t.timing.min_duration_s, trials=t.timing.trials,
                  min_iterations=t.timing.min_iterations, rounds=interleave.ROUNDS,
                  statistic=(f"every mix and the FP32 deployment timed in {interleave.ROUNDS} interleaved rounds "
                             "(order shuffled each round); latency: the median of the timed runs; ratios: the "
                             "geometric mean of the per-round ratios with its 95 % interval"))


def payload(cfg: Config, t, runs: list[MethodRun], baseline: Candidate | None, chosen: Candidate | None, why: str,
            fronts: dict) -> TuneResult:
    """Everything tune measured, and the choice."""
    plug = t.plug
    precision = plug.name
    candidates = [_row(c, chosen, fronts, precision, baseline) for r in runs for c in r.candidates]
    low_claim = _low_claim(chosen, plug, list(runs[0].layers) if runs else [])
    intervals = {b: r.inverse() for b, r in sensitivity.time_ratio(chosen, baseline, t.batches).items()} \
        if chosen and baseline and not low_claim else {}
    method = precision_config.calibration_method(cfg, precision) or plug.methods(cfg)[0]
    out = TuneResult(
        model=cfg.model.name, precision=precision, raised=plug.raised_to, target=t.target.name,
        speed_not_measured=t.target.reason, cpu=env.cpu_model(), int8_dot_product=env.cpu_has_int8_dot_product(),
        cpu_flags_simulated=env.cpu_flags_simulated(), batches=t.batches,
        samples=Samples(sensitivity=len(t.sens_labels), gate=len(t.evidence.labels)), timing=_timing(t),
        fp32=Fp32(latency_ms={str(b): v for b, v in baseline.latency_ms.items()} if baseline else {}),
        sensitivity={r.method: [SensitivityRow(layer=s.layer, op_type=s.op_type, score=s.score, alone=s.alone,
                                               all_but=s.all_but) for s in r.ranked] for r in runs},
        all_low={r.method: r.all_low for r in runs},
        candidates=candidates,
        chosen=None if chosen is None else _row(chosen, chosen, fronts, precision, baseline, ChosenRow, why=why,
                                                runtime=chosen.runtime),
        speedup_vs_fp32={str(b): r.estimate for b, r in intervals.items()},
        speedup_interval_vs_fp32={str(b): RatioRow.of(r) for b, r in intervals.items()},
        no_speedup_claimed=low_claim, same_speed=cfg.tune.same_speed, sanity=t.sanity,
        undecided=why if chosen is None and why.startswith("undecided") else "",
        seconds={k: round(v, 2) for k, v in t.seconds.items()},
        greedy=next((c for c in candidates if c.origin == "greedy fallback" and c.calibration == method), None),
        summary="")  # said of the result itself, below
    layers = [r.layer for r in runs[0].ranked] if runs else []
    return out.model_copy(update={"summary": _summary(out, chosen, layers, plug.fallback_file)})


def with_held_out(p: TuneResult, held: HeldOutConfirmation) -> TuneResult:
    """The payload with the held-out confirmation (:func:`pipeline.tune.held_out_confirmation`), and its word in the
    summary line where it ran."""
    summary = p.summary
    if held.ran:
        agrees = "agrees with the search" if held.agrees else f"DIFFERS from the search's {held.search_status}"
        summary += f"; held-out confirmation on {held.images} images: {held.status} ({agrees})"
    return p.model_copy(update={"held_out_confirmation": held, "summary": summary})


def _held_out_section(p: TuneResult) -> Section | None:
    held = p.held_out_confirmation
    if not held:
        return None
    if not held.ran:
        return Section("Held-out confirmation", None, (f"Not run: {held.why_not}.",), level=3)
    search = held.search
    table = Table(("images", "role", "gate", "scaled error", "top-1 agreement", "accuracy drop"), (
        (Cell(str(held.search_images)), Cell("search (chosen on)"),
         Cell(held.search_status or "-", status=held.search_status), Cell(fmt(search.scaled_error)),
         Cell(fmt(search.top1_agreement)), Cell(fmt(search.accuracy_drop))),
        (Cell(str(held.images)), Cell("verdict (held out)"), Cell(held.status, status=held.status),
         Cell(fmt(held.scaled_error)), Cell(fmt(held.top1_agreement)), Cell(fmt(held.accuracy_drop)))))
    words = ("The held-out verdict agrees with the search's." if held.agrees else
             f"The held-out verdict ({held.status}) differs from the search's ({held.search_status}): the "
             "search chose on its own images, and the choice does not hold on images it did not see; verify will "
             "judge the artifact on these held-out images.")
    line = held.held_out.line if held.held_out else ""
    return Section("Held-out confirmation", held.status,
                   (f"The chosen mix, converted as export will, judged by the full gate on the verdict images. "
                    f"{words} Verdict images: {line}.",), (table,), level=3)


def ladder(t, runs: list[MethodRun], ptq_chosen: Candidate | None, qat: Candidate | None, qat_why: str) -> Ladder:
    """The three rungs side by side: PTQ with every layer in INT8, the best PTQ mix, QAT (each: layers in INT8, the
    gate's numbers, speed on the target); ``qat_why``: why QAT ran or not (``tune.qat``)."""
    method = ptq_chosen.calibration if ptq_chosen else runs[0].method
    run = next((r for r in runs if r.method == method), runs[0])
    total = len(run.layers)
    all_low = next((c for c in run.candidates if not c.high and c.origin != "QAT"), None)

    def rung(name: str, c: Candidate | None, int8_layers: int | None, why_not: str = "not run") -> Rung:
        if c is None:
            return Rung(rung=name, ran=False, why_not=why_not)
        r = GateNumbers.model_validate(c.result)
        return Rung(rung=name, ran=True, origin=c.origin, calibration=c.calibration, int8_layers=int8_layers,
                    layers=total, status=r.status, scaled_error=r.scaled_error, top1_agreement=r.top1_agreement,
                    accuracy_drop=r.accuracy_drop, latency_ms={str(b): v for b, v in c.latency_ms.items()})

    return Ladder(qat_ran=qat is not None, qat_why=qat_why, rungs=[
        rung("PTQ (every layer INT8)", all_low, total),
        rung("best PTQ mix", ptq_chosen, total - len(ptq_chosen.high) if ptq_chosen else None,
             "none passes the gate"),
        rung("QAT", qat, qat.qat.int8_layers if qat and qat.qat else None)])


def _ladder_table(p: TuneResult) -> Table:
    batches = [str(b) for b in p.batches]
    rows = []
    for r in p.ladder.rungs:
        if not r.ran:
            rows.append((Cell(r.rung), Cell("-"), Cell(r.why_not or "not run"),
                         *(Cell("-") for _ in range(3 + len(batches)))))
            continue
        rows.append((Cell(r.rung), Cell(f"{r.int8_layers} of {r.layers}"),
                     Cell(r.status or "-", status=r.status), Cell(fmt(r.scaled_error)),
                     Cell(fmt(r.top1_agreement)), Cell(fmt(r.accuracy_drop)),
                     *(Cell(fmt(r.latency_ms.get(b))) for b in batches)))
    return Table(("rung", "layers in INT8", "gate", "scaled error", "top-1 agreement", "accuracy drop",
                  *(f"ms @ batch {b}" for b in batches)), tuple(rows))


def _low_claim(chosen: Candidate | None, plug, layers: list[str]) -> str:
    """Why no low-precision result or speed-up may be claimed for ``chosen``: the target runs none of its layers in
    the low precision (its runtime precisions; untimed: the mix itself raises every layer); else ""."""
    if chosen is None or not layers:
        return ""
    if chosen.runtime:
        in_low = len(chosen.runtime) - len(layers_not_in(chosen.runtime, plug.name))
        if in_low == 0:
            return f"the target runs none of the {len(chosen.runtime)} layers in {plug.label}"
        return ""
    if chosen.origin != "QAT" and raised_layers(chosen.high, layers)[0] >= len(layers):
        return f"the mix keeps all {len(layers)} layers {plug.raised_to}"
    return ""


def raised_layers(high: list[str], layers: list[str]) -> tuple[int, int]:
    """Of the nodes a mix raises: how many are tune's layers (``layers``: the units it ranks), and how many other
    nodes (a MaxPool or a Flatten the greedy fallback raised with them), each node once."""
    units = set(layers)
    raised = set(high)
    return len(raised & units), len(raised - units)


def _summary(p: TuneResult, chosen: Candidate | None, layers: list[str], written: str) -> str:
    if chosen is None:
        return p.undecided or f"no passing {_label(p)} mix"
    qat = ", quantization-aware fine-tuning" if chosen.origin == "QAT" else ""
    if p.no_speedup_claimed:
        return (f"no {_label(p)} layer: {p.no_speedup_claimed} ({chosen.calibration}{qat}), so it is the FP32 "
                f"network and no {_label(p)} result or speed-up is claimed; written to {written}")
    units, others = raised_layers(chosen.high, layers)
    also = f" and {others} other node{'s' if others != 1 else ''}" if others else ""
    head = f"{_label(p)}: {units} of {len(layers)} layers{also} {p.raised} ({chosen.calibration}{qat})"
    if not p.speedup_vs_fp32:
        return f"{head}; speed not measured (no {_label(p)} target here); written to {written}"
    big = p.batches[-1]
    return (f"{head}; {chosen.latency_ms[1]:.3f} ms at batch 1, {chosen.latency_ms[big]:.3f} ms at batch {big}; "
            + ", ".join(f"{speedup_text(p, b)} at batch {b}" for b in p.speedup_vs_fp32)
            + f" vs FP32 (95 % interval, interleaved rounds); written to {written}")


def speedup_text(p: TuneResult, batch: str) -> str:
    """``x2.08 [1.95, 2.21]`` (the interval where the rounds give one), and the verdict against ``same_speed``."""
    r = p.interval(batch)
    said = speed_claims.verdict(r.inverse(), p.same_speed)
    tail = {speed_claims.Speed.SAME: ", the same speed", speed_claims.Speed.UNDECIDED: ", undecided"}.get(said, "")
    if r.rounds > 1:
        return f"x{r.estimate:.2f} [{r.low:.2f}, {r.high:.2f}]{tail}"
    return f"x{r.estimate:.2f} (no interval){tail}"


def details(p: TuneResult) -> dict:
    """The manifest's summary of tune (the stage table's line)."""
    chosen = p.chosen
    return {"summary": p.summary, "precision": p.precision,
            "chosen": {"high": chosen.high if chosen else None, "calibration": chosen.calibration if chosen else None,
                       "latency_ms": dict(chosen.latency_ms) if chosen else None},
            "speedup_vs_fp32": dict(p.speedup_vs_fp32), "seconds": p.seconds.get("total")}


def speed_failure(p: TuneResult, min_speedup: float | None) -> str:
    """The speed gate's one line, or "" when it passes (or is off, or nothing could be timed: the report says so).
    It fails where the chosen mix's speed-up over FP32 is below ``min_speedup`` beyond its interval (the whole
    interval below), and where the target runs no layer of the mix in the low precision (no speed-up to claim)."""
    if not p.chosen or not min_speedup:
        return ""
    if p.no_speedup_claimed:
        slow = {b: math.nan for b in p.batches}
    else:
        slow = {b: r.estimate for b in p.speedup_vs_fp32 if not (r := p.interval(b)).high >= min_speedup}
    if not slow:
        return ""
    runtime = p.chosen.runtime
    not_low = layers_not_in(runtime, p.precision)
    named = ", ".join(not_low[:6]) + (", ..." if len(not_low) > 6 else "")
    cpu = f"; {_no_units(p)}" if _no_units(p) else ""
    if p.no_speedup_claimed:
        how = f"no {_label(p)} speed-up to claim ({p.no_speedup_claimed})"
    else:
        worst = min(slow, key=slow.get)
        how = f"{speedup_text(p, worst)} at batch {worst}, below"
    return (f"{_label(p)} is no faster than FP32 here: {len(not_low)} of {len(runtime)} layers run in "
            f"{_ran_in(runtime, not_low)} ({named or 'none'}){cpu}; {how} tune.min_speedup {min_speedup:g}")


def speed_in_doubt(p: TuneResult, min_speedup: float | None) -> str:
    """The speed gate cannot decide: the chosen mix's speed-up interval holds ``min_speedup`` and reaches further
    below it than the noise band (``same_speed``) allows; "" when it can (passes or fails) or is off."""
    if not p.chosen or not min_speedup or p.no_speedup_claimed or speed_failure(p, min_speedup):
        return ""
    doubt = [b for b in p.speedup_vs_fp32 if not p.interval(b).low >= min_speedup / (1 + p.same_speed)]
    if not doubt:
        return ""
    return ("tune: the speed gate is undecided: the speed-up over FP32 is " + ", ".join(
        f"{speedup_text(p, b)} at batch {b}" for b in doubt) + f", whose interval holds tune.min_speedup "
        f"{min_speedup:g} and is wider than tune.same_speed ({p.same_speed:g}); the machine is too busy "
        "to tell; run tune again on a quieter machine (see tune.md)")


def _label(p: TuneResult) -> str:
    return plugs.by_name(p.precision).label


def _no_units(p: TuneResult) -> str:
    """The plug's note where this CPU lacks the units its CPU kernels need (INT8 without VNNI/AMX); else ""."""
    plug = plugs.by_name(p.precision)
    return plug.dot_product_note if plug.dot_product_note and not p.int8_dot_product else ""


SHOWN = {"f32": "FP32", "fp32": "FP32", "f16": "FP16", "fp16": "FP16", "bf16": "BF16"}


def _ran_in(runtime: dict[str, str], layers: list[str]) -> str:
    """The precision those layers ran in, when they share one ("FP32"); else "higher precision"."""
    ran = {SHOWN.get(runtime[name], runtime[name]) for name in layers}
    return ran.pop() if len(ran) == 1 else "higher precision"


# --------------------------------------------------------------------------- tune.md and the report section


def sections(p: TuneResult) -> list[Section]:
    chosen = p.chosen
    status = Status.PASSED if chosen else Status.FAILED
    head = [f"{p.summary}.", f"Target: {p.target} on {p.cpu}"
            + (f" ({_no_units(p)}: its kernels gain little here)" if _no_units(p) else "") + ".",
            *([f"Speed not measured: {p.speed_not_measured}."] if p.speed_not_measured else []),
            (f"Sensitivity on {p.samples.sensitivity} images; every candidate judged by the full gate on "
             f"{p.samples.gate} images of the validation split's search part; timings: {p.timing.statistic}.")]
    if p.undecided:
        head.append(f"Why no choice: {p.undecided}.")
    for check in p.sanity.checks if p.sanity else []:
        state = "not checked" if not check.checked else "holds" if check.sane else "FAILS"
        head.append(f"Sanity ({state}): {check.text}.")
    if chosen:
        head.append(f"Why: {chosen.why}.")
        if chosen.runtime_not_low:
            head.append(f"Not run in {_label(p)} by the target: {', '.join(chosen.runtime_not_low)}.")
    out = [Section(f"Precision tuning (tune, {_label(p)})", status, tuple(head), (_candidates_table(p),))]
    held = _held_out_section(p)
    if held is not None:
        out.append(held)
    if p.stability:
        from pipeline.reports.tables import stability_sections

        out += stability_sections(p.stability)
    if p.ladder:
        out.append(Section("PTQ, best PTQ mix and QAT side by side", None,
                           (f"QAT: {'ran' if p.ladder.qat_ran else 'not run'} ({p.ladder.qat_why}).",),
                           (_ladder_table(p),), level=3))
    for method, rows in p.sensitivity.items():
        out.append(Section(f"Sensitivity, {method} calibration (most sensitive first)", None, (), (Table(
            ("layer", "op", "score", "alone: scaled error", "alone: KL", "all but: scaled error", "all but: drop"),
            tuple((Cell(r.layer, code=True), Cell(r.op_type), Cell(fmt(r.score)), Cell(fmt(r.alone.scaled_error)),
                   Cell(fmt(r.alone.mean_kl)), Cell(fmt(r.all_but.scaled_error)),
                   Cell(fmt(r.all_but.accuracy_drop))) for r in rows)),), level=3))
    return out


def _candidates_table(p: TuneResult) -> Table:
    batches = [str(b) for b in p.batches]
    rows = [(Cell("FP32 (reference deployment)"), Cell("-"), Cell("-"), Cell("-"), Cell("-"), Cell("-"),
             *(Cell(fmt(p.fp32.latency_ms.get(b))) for b in batches), *(Cell("1") for _ in batches), Cell(""))]
    for c in p.candidates:
        r = c.result
        mark = "chosen" if c.chosen else "Pareto" if c.pareto else ""
        rows.append((Cell(c.origin), Cell(c.calibration), Cell(str(c.layers_raised)),
                     Cell(r.status or "-", status=r.status), Cell(fmt(r.scaled_error)),
                     Cell(fmt(r.accuracy_drop)), *(Cell(fmt(c.latency_ms.get(b))) for b in batches),
                     *(Cell(_ratio_cell(c.time_vs_fp32.get(b))) for b in batches), Cell(mark)))
    return Table(("candidate", "calibration", f"layers {p.raised}", "gate", "scaled error", "accuracy drop",
                  *(f"ms @ batch {b}" for b in batches), *(f"time / FP32 @ batch {b} [95 %]" for b in batches), ""),
                 tuple(rows))


def _ratio_cell(r: RatioRow | None) -> str:
    if r is None:
        return "-"
    if r.rounds > 1:
        return f"{r.estimate:.2f} [{r.low:.2f}, {r.high:.2f}]"
    return f"{r.estimate:.2f} (no interval)"


def _drop(c: MixRow) -> float:
    return 0.0 if c.result.accuracy_drop is None else c.result.accuracy_drop


def write_plots(run_dir: RunDir, p: TuneResult) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    method = next(iter(p.sensitivity), None)
    written = []
    if method:
        rows = p.sensitivity[method]
        fig, ax = plt.subplots(figsize=(7, max(3, 0.25 * len(rows))))
        ax.barh([r.layer for r in rows][::-1], [r.score for r in rows][::-1])
        ax.set_xlabel("sensitivity score (scaled error units)")
        ax.set_title(f"{p.model}: per-layer {_label(p)} sensitivity ({method})")
        ax.tick_params(axis="y", labelsize=6)
        written.append(_save(fig, plt, run_dir, tune_files(p.precision)[2]))
    fig, ax = plt.subplots(figsize=(7, 4))
    batch = str(p.batches[0])
    for c in p.candidates:
        if batch in c.latency_ms:
            ax.scatter(c.latency_ms[batch], _drop(c), marker="*" if c.chosen else "o", s=120 if c.chosen else 30,
                       color="tab:green" if c.result.status == Status.PASSED else "tab:red")
            ax.annotate(f"{c.origin} ({c.calibration})", (c.latency_ms[batch], _drop(c)), fontsize=6)
    if batch in p.fp32.latency_ms:
        ax.axvline(p.fp32.latency_ms[batch], color="grey", linestyle="--", label="FP32")
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "speed not measured here", ha="center", transform=ax.transAxes)
    ax.set_xlabel(f"latency at batch {batch} (ms)")
    ax.set_ylabel("accuracy drop vs FP32")
    ax.set_title(f"{p.model}: accuracy vs latency (green: passes the gate)")
    written.append(_save(fig, plt, run_dir, tune_files(p.precision)[3]))
    return written


def _save(fig, plt, run_dir: RunDir, name: str) -> str:
    fig.tight_layout()
    with atomic_path(run_dir.file(name)) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)
    return name


def write_all(run_dir: RunDir, p: TuneResult) -> list[Path]:
    report, markdown, sensitivity_plot, pareto_plot = tune_files(p.precision)
    write_json(run_dir.file(report), p.to_json())
    atomic_write(run_dir.file(markdown), f"# Precision tuning: {tables.md_escape(p.model)}\n\n"
                 + tables.markdown(sections(p)) + f"\n![sensitivity]({sensitivity_plot})\n"
                 f"![accuracy vs latency]({pareto_plot})\n")
    plots = write_plots(run_dir, p)
    if p.stability:  # tune certifies an INT8 mix only (pipeline.tune._certificate)
        from pipeline.reports import stability_report

        plots.append(stability_report.write_plot(run_dir, p.stability, TUNE_STABILITY_PLOT,
                                                 p.stability.limit, f"{p.model} tuned INT8 mix"))
        with open(run_dir.file(markdown), "a", encoding="utf-8") as f:
            f.write(f"![calibration stability]({TUNE_STABILITY_PLOT})\n")
    return [run_dir.file(report), run_dir.file(markdown), *(run_dir.file(n) for n in plots)]
