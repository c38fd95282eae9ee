"""``python -m pipeline report``: one self-contained HTML page (and Markdown) for a run.

The HTML embeds its plots as data URIs and its style inline, so it opens in a browser with no
network access and can be attached to a ticket or a CI artefact on its own.
"""

from __future__ import annotations

import base64
import html
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from pipeline.core import artifacts
from pipeline.core.errors import InputError
from pipeline.core.precisions import PRECISIONS
from pipeline.core.run import CONFIG, RunDir, atomic_write, now, open_confined, read_json
from pipeline.reports import profile_report, tables

if TYPE_CHECKING:  # annotations only
    from pipeline.core.config_schema import Config

HTML_NAME, MD_NAME = artifacts.REPORT_HTML, artifacts.REPORT_MD
PLOTS = [
    (artifacts.CURVE, "Training curves"),
    (artifacts.VERIFY_BOXES, "Validation images: the reference's boxes and a candidate's (a detector)"),
    (artifacts.LATENCY_PLOT, "Latency distribution"),
    (artifacts.THROUGHPUT_PLOT, "Throughput versus batch size"),
    (artifacts.PROFILE_PLOT, "Per-layer time by layer type and the precision it ran in (each CPU artifact)"),
    (artifacts.STABILITY_PLOT, "Calibration stability: the gate's scaled error of every calibration draw (verify)"),
    (artifacts.TUNE_STABILITY_PLOT, "Calibration stability of tune's chosen INT8 mix: every draw's scaled error"),
    *((plot, f"{caption} ({precision.upper()} tune)") for precision in PRECISIONS
      for plot, caption in zip(artifacts.tune_files(precision)[2:],
                               ("Per-layer sensitivity", "Accuracy versus latency of the tuned mixes"), strict=True)),
]

STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2rem auto;max-width:1100px;color:#222;
padding:0 1rem}
h1{font-size:1.6rem}h2{font-size:1.25rem;border-bottom:1px solid #ddd;padding-bottom:.2rem;margin-top:2rem}
table{border-collapse:collapse;margin:.6rem 0;font-size:.85rem}th,td{border:1px solid #ccc;padding:.25rem .5rem;
text-align:left;vertical-align:top}th{background:#f3f3f3}.passed,.ok{color:#17702a;font-weight:600}
.failed,.error,.interrupted{color:#b00020;font-weight:600}.skipped{color:#8a6d00}
.not-run,.not-verified,.reference{color:#666}.certified,.held-out{color:#17702a;font-weight:600}
.lucky,.not-held-out{color:#b00020;font-weight:600}.unstable{color:#8a6d00;font-weight:600}code{font-size:.8rem}img{max-width:100%;
border:1px solid #eee}pre{background:#f7f7f7;padding:.6rem;overflow:auto;font-size:.8rem}.muted{color:#666}
"""


# Records how many embedded images decoded, so a headless browser test can tell the page rendered.
LOAD_CHECK = ("<script>window.addEventListener('load',function(){document.body.setAttribute('data-images-loaded',"
              "Array.prototype.filter.call(document.images,function(i){return i.complete&&i.naturalWidth>0})"
              ".length)})</script>\n")


# The command that rewrites each JSON file the report reads, for the hint.
WRITTEN_BY = {artifacts.VERIFY_JSON: "python -m pipeline verify",
              artifacts.BENCHMARK_JSON: "python -m pipeline benchmark", artifacts.MANIFEST: "python -m pipeline all",
              **{artifacts.tune_files(p)[0]: f"python -m pipeline tune --precision {p}"
                 for p in PRECISIONS},
              artifacts.COMPARE_JSON: "python -m pipeline compare", artifacts.DEPLOY_JSON: "python -m pipeline deploy"}


def _load(run: RunDir, name: str):
    path = run.file(name)
    if not path.exists():
        return None
    return read_json(path, name)


def _esc(value) -> str:
    return html.escape(str(value))


def _built(name: str, builder, payload):
    """``builder(payload)``, with a payload that lacks a key or has the wrong shape as one line (exit 2)."""
    try:
        return builder(payload)
    except KeyError as exc:
        problem = f"has no key {exc.args[0]!r}"
    except (TypeError, AttributeError, IndexError, ValueError) as exc:
        problem = f"has an unexpected shape ({type(exc).__name__}: {exc})"
    raise InputError(f"{name} {problem}: it was written by another version or edited by hand; "
                     f"re-run {WRITTEN_BY[name]}")


def _verify_sections(run: RunDir, verify) -> list:
    """verify.json's sections, only where it is the report of a verify that finished here (the check compare, baseline
    and deploy make); otherwise one section saying why its verdicts are not shown, never a verdict."""
    from pipeline.reports import verify_report

    problem = verify_report.standing(run)
    if problem is None:
        return _built(artifacts.VERIFY_JSON, tables.verify_sections, verify)
    return [tables.Section("Precision gate", status=verify_report.NOT_VERIFIED, paragraphs=(
        f"{artifacts.VERIFY_JSON} is not the report of a verify that finished here ({problem}); its verdicts are not "
        f"shown: re-run {WRITTEN_BY[artifacts.VERIFY_JSON]}.",))]


@dataclass(frozen=True)
class Sections:
    """Everything the run report shows, gathered once for both renderings (HTML and Markdown)."""

    model: str  # the title
    body: list[tables.Section]  # each stage's sections, in the order the stages run
    plots: list[tuple[str, str]]  # (file name, title) of each plot the run has
    tail: list[tables.Section]  # the configuration and the environment


def sections(run: RunDir, cfg: Config) -> Sections:
    """Everything the report shows, gathered once for both renderings: the rows, the plots, the title."""
    manifest = run.manifest
    verify, bench = _load(run, artifacts.VERIFY_JSON), _load(run, artifacts.BENCHMARK_JSON)
    config_yaml = (run.file(CONFIG).read_text(encoding="utf-8") if run.file(CONFIG).exists()
                   else yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    body = [_built(artifacts.MANIFEST, f, manifest) for f in (tables.stage_section, tables.training_section)]
    body += [*_built(artifacts.MANIFEST, tables.float_sections, manifest),
             _built(artifacts.MANIFEST, tables.int8_section, manifest)]
    if verify is not None:
        body += _verify_sections(run, verify)
    if bench is not None:
        body.append(_built(artifacts.BENCHMARK_JSON, tables.benchmark_section, bench))
        body += _built(artifacts.BENCHMARK_JSON, profile_report.sections, bench)  # per-layer profiles, roofline
    for precision in PRECISIONS:
        name = artifacts.tune_files(precision)[0]
        tuned = _load(run, name)
        if tuned is not None:
            from pipeline.precision import tune_result
            from pipeline.reports import tune_report

            body += _built(name, tune_report.sections, tune_result.result_of(tuned, name))
    compared = _load(run, artifacts.COMPARE_JSON)
    if compared is not None:  # the release gate against a baseline bundle (pipeline/compare.py)
        from pipeline.reports import compare_report

        body += _built(artifacts.COMPARE_JSON, compare_report.payload_sections, compared)
    deployed = _load(run, artifacts.DEPLOY_JSON)
    if deployed is not None:  # the Triton repository and, after --serve, the served numbers (pipeline/deploy.py)
        from pipeline.reports import deploy_report

        body += _built(artifacts.DEPLOY_JSON, deploy_report.sections, deployed)
    tail = [tables.Section("Configuration", preformatted=config_yaml),
            _built(artifacts.MANIFEST, tables.environment_section, manifest.get("environment") or {})]
    return Sections(model=manifest.get("model", cfg.model.name),
                    body=[section for section in body if section is not None],
                    plots=[(name, title) for name, title in PLOTS if run.file(name).exists()],
                    tail=tail)


def _html_head(model: str) -> str:
    return (f"<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
            f"<title>pipeline report: {_esc(model)}</title><style>{STYLE}</style></head>")


def _html_plots(run: RunDir, plots: list[tuple[str, str]]) -> str:
    if not plots:
        return ""
    figures = ["<h2>Plots</h2>"]
    for name, title in plots:
        png, problem = recorded_png(run, name)
        if png is None:
            figures.append(f"<figure><figcaption>{_esc(title)}</figcaption><p class='failed'>{_esc(problem)}"
                           "; not embedded</p></figure>")
            continue
        data = base64.b64encode(png).decode()
        figures.append(f"<figure><figcaption>{_esc(title)}</figcaption>"
                       f"<img alt='{_esc(title)}' src='data:image/png;base64,{data}'></figure>")
    return "\n".join(figures)


PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def recorded_png(run: RunDir, name: str) -> tuple[bytes | None, str]:
    """The bytes of plot ``name`` if it is a real PNG that a stage of this run wrote (its sha256 in the manifest),
    read without following a link; else ``(None, why)``. The page is attached to tickets: it must never carry
    another file's content."""
    import hashlib

    stage, recorded = next(((stage, run.recorded_artifacts(stage)[name]) for stage in run.manifest["stages"]
                            if name in run.recorded_artifacts(stage)), (None, None))
    with open_confined(run.file(name)) as f:
        data = f.read()
    if recorded is None:
        return None, f"{name} is not recorded in the manifest"
    if hashlib.sha256(data).hexdigest() != recorded or not data.startswith(PNG_SIGNATURE):
        return None, f"{name} is not the file {stage} recorded"
    return data, ""


def render_html(run: RunDir, cfg: Config) -> str:
    s = sections(run, cfg)
    parts = [f"<h1>Run report: {_esc(s.model)}</h1>",
             f"<p class='muted'>{_esc(run.path.resolve())} &middot; written {_esc(now())}</p>",
             *(tables.html(section) for section in s.body),
             _html_plots(run, s.plots),
             *(tables.html(section) for section in s.tail)]
    body = "\n".join(p for p in parts if p)
    return f"{_html_head(s.model)}\n<body>\n{body}\n{LOAD_CHECK}</body></html>\n"


def render_markdown(run: RunDir, cfg: Config) -> str:
    s = sections(run, cfg)
    lines = [f"# Run report: {tables.md_escape(s.model)}", "", tables.markdown(s.body)]
    if s.plots:
        lines += ["## Plots", "", *(f"![{title}]({name})\n" for name, title in s.plots)]
    lines.append(tables.markdown(s.tail))
    return "\n".join(lines).rstrip("\n") + "\n"


def write(run: RunDir, cfg: Config) -> list[Path]:
    for stage in run.manifest["stages"]:  # one link in the run directory: refused before anything is read
        for name in run.recorded_artifacts(stage):
            run.file(name)
    run.file(artifacts.LOGS)
    atomic_write(run.file(HTML_NAME), render_html(run, cfg))
    atomic_write(run.file(MD_NAME), render_markdown(run, cfg))
    return [run.file(HTML_NAME), run.file(MD_NAME)]
