"""deploy's sections of report.html / report.md: the Triton repository it wrote (models, batching, refusals, which
container release runs the engines), and, after ``deploy --serve``, the served outputs' checks and the client-side
latency and throughput beside the same artifact timed in this process (the serving overhead).

deploy.json is typed once (:func:`pipeline.core.deploy_result.of`) and laid out by attribute; text taken from it is
shown through :func:`pipeline.core.schema.printable`.
"""

from __future__ import annotations

from pipeline.core import deploy_result
from pipeline.core.deploy_result import DeployResult, Serve, ServedTiming
from pipeline.core.schema import printable
from pipeline.core.status import Status
from pipeline.reports.tables import Cell, Section, Table, fmt

WHERE = {"in-process": "in this process (the stock backend, no server)", "http": "Triton, HTTP client",
         "grpc": "Triton, gRPC client"}


def _code(value) -> Cell:
    return Cell(printable(value, 80), code=True)


def repository_section(result: DeployResult) -> Section:
    rows = tuple((_code(m.name), Cell(printable(m.runs_on, 40)), Cell(m.device), Cell(str(m.max_batch_size)),
                  Cell(", ".join(map(str, m.preferred_batch_sizes)) or "-"), Cell(m.verdict, status=m.verdict),
                  Cell(", ".join(f"{t.name} {t.dtype.removeprefix('TYPE_')} {t.dims}" for t in m.tensors)))
                 for m in result.models)
    refused = tuple((_code(r.candidate), Cell(r.verdict or "no verdict", status=r.verdict),
                     Cell(printable(r.reason, 300))) for r in result.refused if r.verdict != Status.SKIPPED)
    skipped = [printable(r.candidate, 80) for r in result.refused if r.verdict == Status.SKIPPED]
    compat = result.compatibility
    target = compat.target_release or "not set (deploy.triton_release)"
    paragraphs = ((f"Repository: {printable(result.repository, 200)}. Every config.pbtxt was parsed back as "
                  "Triton's ModelConfig and matched against its artifact before the repository was put in place."),
                  (f"Engines: {printable(compat.releases, 300)}; target release: {printable(target, 40)}. "
                  f"Source: {printable(compat.source, 300)}."),
                  *([(f"Not deployable here (verify skipped them: not built, or no runtime for them on this machine): "
                     f"{', '.join(skipped)}.")] if skipped else []))
    tables = [Table(("model", "runs on", "device", "max_batch_size", "preferred batch sizes", "verdict",
                     "tensors (dims, -1: dynamic)"), rows)]
    if refused:
        tables.append(Table(("refused", "verdict", "reason"), refused))
    return Section("Deployment: Triton model repository", paragraphs=paragraphs, tables=tuple(tables))


def _number(value: float | None) -> Cell:
    return Cell(fmt(value) if value is not None else "-")


def _timing_row(t: ServedTiming, base: ServedTiming | None) -> tuple[Cell, ...]:
    return (Cell(WHERE.get(t.where, printable(t.where, 40))), Cell(str(t.concurrency)),
            Cell(fmt(t.p50_ms)), Cell(fmt(t.p90_ms)), Cell(fmt(t.p95_ms)), Cell(fmt(t.p99_ms)),
            Cell(fmt(t.throughput_per_s, ".4g")),
            Cell(fmt(t.p50_ms / base.p50_ms, ".2f") + "x" if base and base.p50_ms else "-"),
            Cell("yes" if t.stable else "no", status=None if t.stable else Status.SKIPPED,
                 note="" if t.stable else f"{t.windows} windows"))


def served_section(serve: Serve) -> Section:
    server = serve.server
    checks = tuple((_code(m.model), Cell(printable(c.arrangement, 60)), _number(c.scaled_error),
                    _number(c.top1_agreement), Cell(c.status, status=c.status), Cell(printable(c.reason, 300)))
                   for m in serve.models for c in m.checks)
    models = tuple((_code(m.model), Cell(printable(m.served_precision or "-", 20)),
                    Cell(m.verdict, status=m.verdict), Cell(printable(m.reason, 400)))
                   for m in serve.models)
    rows = tuple(_timing_row(t, serve.in_process) for t in serve.timings)
    m = serve.method
    started = f"ready {server.start_s:.1f} s after start" if server.start_s is not None else "not started"
    paragraphs = (
        (f"The repository as written, served by Triton {printable(server.triton or '-', 40)} "
         f"({printable(server.binary, 200)}) on {printable(serve.cpu, 80)}, {serve.cores} cores; {started}."),
        (f"{serve.images} validation images sent at batch 1, at the largest batch and from 8 clients at once; each "
         "arrangement judged by verify's criteria for the model's precision against the FP32 reference: "
         + (serve.verdict if not serve.reason else f"{serve.verdict} ({printable(serve.reason, 600)})")
         + "."),
        (f"Timing of {printable(serve.timed or 'no model', 80)} (perf_analyzer's method, one image per request, "
         f"closed loop): {m.warmup_s:g} s warm-up, windows of {m.window_s:g} s until three agree within "
         f"{100 * m.stability:g}% (at most {m.max_trials}); percentiles over those three windows, client-side. "
         "The in-process row calls the same stock backend without the server; the last column is the served p50 over "
         "that one."))
    tables = [Table(("model", "runs in", "verdict", "reason"), models),
              Table(("model", "arrangement", "scaled error", "top-1 agreement", "gate", "reason"), checks)]
    if rows:
        tables.append(Table(("where", "concurrency", "p50 ms", "p90 ms", "p95 ms", "p99 ms", "images/s",
                             "p50 vs in-process", "stable"), rows))
    return Section("Served by Triton on this machine", status=serve.verdict, paragraphs=paragraphs,
                   tables=tuple(tables))


def sections(payload: dict) -> list[Section]:
    """deploy.json's sections: its payload (read through the bounded reader) typed once here."""
    result = deploy_result.of(payload)
    found = [repository_section(result)]
    if result.serve is not None:
        found.append(served_section(result.serve))
    return found
