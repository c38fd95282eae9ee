"""``python -m pipeline report``: one self-contained HTML page (and Markdown) for a run.

The HTML embeds its plots as data URIs and its style inline, so it opens in a browser with no
network access and can be attached to a ticket or a CI artefact on its own.
"""

from __future__ import annotations

import base64
import html
import json
from pathlib import Path

import yaml

from pipeline.run import CONFIG, RunDir, atomic_write, now, read_json
from pipeline.verify_report import fmt

HTML_NAME, MD_NAME = "report.html", "report.md"
PLOTS = [
    ("train_curve.png", "Training curves"),
    ("benchmark_latency.png", "Latency distribution"),
    ("benchmark_throughput.png", "Throughput versus batch size"),
]

STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2rem auto;max-width:1100px;color:#222;
padding:0 1rem}
h1{font-size:1.6rem}h2{font-size:1.25rem;border-bottom:1px solid #ddd;padding-bottom:.2rem;margin-top:2rem}
table{border-collapse:collapse;margin:.6rem 0;font-size:.85rem}th,td{border:1px solid #ccc;padding:.25rem .5rem;
text-align:left;vertical-align:top}th{background:#f3f3f3}.passed,.ok{color:#17702a;font-weight:600}
.failed,.error,.interrupted{color:#b00020;font-weight:600}.skipped{color:#8a6d00}img{max-width:100%;
border:1px solid #eee}pre{background:#f7f7f7;padding:.6rem;overflow:auto;font-size:.8rem}.muted{color:#666}
"""


# Records how many embedded images decoded, so a headless browser test can tell the page rendered.
LOAD_CHECK = ("<script>window.addEventListener('load',function(){document.body.setAttribute('data-images-loaded',"
              "Array.prototype.filter.call(document.images,function(i){return i.complete&&i.naturalWidth>0})"
              ".length)})</script>\n")


def _load(run: RunDir, name: str):
    path = run.file(name)
    if not path.exists():
        return None
    return read_json(path, name)


def _esc(value) -> str:
    return html.escape("" if value is None else str(value))


def _table(headers: list[str], rows: list[list], raw_cols: tuple[int, ...] = ()) -> str:
    head = "".join(f"<th>{_esc(h)}</th>" for h in headers)
    body = ""
    for row in rows:
        cells = "".join(f"<td>{cell if i in raw_cols else _esc(cell)}</td>" for i, cell in enumerate(row))
        body += f"<tr>{cells}</tr>"
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _status(status: str) -> str:
    return f'<span class="{_esc(status)}">{_esc(status)}</span>'


def sections(run: RunDir, cfg) -> dict:
    """Everything the report shows, gathered once for both renderings."""
    return {
        "manifest": run.manifest,
        "verify": _load(run, "verify.json"),
        "benchmark": _load(run, "benchmark.json"),
        "config_yaml": run.file(CONFIG).read_text(encoding="utf-8") if run.file(CONFIG).exists()
        else yaml.safe_dump(cfg.to_dict(), sort_keys=False),
        "plots": [(name, title) for name, title in PLOTS if run.file(name).exists()],
    }


def _stage_rows(manifest: dict) -> list[list]:
    rows = []
    for name in ("train", "export", "build", "verify", "benchmark"):
        entry = manifest.get("stages", {}).get(name)
        if not entry:
            rows.append([name, _status("not run"), "", ""])
            continue
        note = entry.get("reason") or entry.get("error") or ""
        rows.append([name, _status(entry.get("status", "?")), fmt(entry.get("duration_s"), ".1f") + " s", _esc(note)])
    return rows


def render_html(run: RunDir, cfg) -> str:
    s = sections(run, cfg)
    m = s["manifest"]
    parts = [f"<h1>Run report: {_esc(m.get('model', cfg.model.name))}</h1>",
             f"<p class='muted'>{_esc(run.path.resolve())} &middot; written {_esc(now())}</p>"]
    parts += ["<h2>Stages</h2>", _table(["stage", "status", "time", "note"], _stage_rows(m), raw_cols=(1, 3))]

    train = m.get("stages", {}).get("train", {}).get("details") or {}
    if train:
        rows = [[h["epoch"], fmt(h["val_loss"], ".4f"), fmt(100 * h["val_acc"], ".2f") + " %"]
                for h in train.get("history", [])]
        parts += ["<h2>Training</h2>",
                  f"<p>device {_esc(train.get('device'))}, mixed precision {_esc(train.get('amp'))} "
                  f"({_esc(train.get('amp_note'))}), {_esc(train.get('steps'))} optimizer steps, "
                  f"{_esc(train.get('skipped_steps'))} skipped, {fmt(train.get('images_per_s'), '.1f')} images/s.</p>",
                  _table(["epoch", "val loss", "val accuracy"], rows)]
    export = m.get("stages", {}).get("export", {}).get("details") or {}
    fp16 = export.get("fp16") or {}
    if fp16.get("fp16_fraction") is not None:
        rows = [[n["name"], n["op_type"], n["reason"]] for n in fp16.get("fp32_nodes", [])]
        parts += ["<h2>FP16 conversion</h2>",
                  f"<p>{_esc(fp16.get('fp16_nodes'))} nodes in FP16 ({fmt(100 * fp16['fp16_fraction'], '.1f')} %), "
                  f"{_esc(fp16.get('fp32_nodes_count'))} kept in FP32 by {_esc(fp16.get('converter'))}.</p>",
                  _table(["node kept in FP32", "op", "why"], rows) if rows else ""]
    if s["verify"]:
        v = s["verify"]
        rows = []
        for c in v["candidates"]:
            t, k, tol = c.get("tensor_check") or {}, c.get("task_check") or {}, c.get("tolerance") or {}
            rows.append([c["name"], c["precision"], _status(c["status"]) + (
                f" <span class='muted'>{_esc(c.get('reason'))}</span>" if c.get("reason") else ""),
                fmt(t.get("max_abs_error")), fmt(t.get("max_rel_error")),
                fmt(100 * k["top1_agreement"], ".2f") + " %" if k else "-",
                fmt(100 * k["accuracy"], ".2f") + " %" if k else "-",
                f"atol {tol.get('atol')}, rtol {tol.get('rtol')}, {tol.get('check_error_stat')}" if tol else ""])
        parts += [f"<h2>Verification: {_status('passed' if v['passed'] else 'failed')}</h2>",
                  f"<p>Reference PyTorch FP32; {_esc(v['inputs']['samples'])} real validation images.</p>",
                  _table(["candidate", "precision", "status", "max abs err", "max rel err", "top-1 agreement",
                          "accuracy", "tolerance"], rows, raw_cols=(2,))]
        loc = v.get("localization")
        if loc:
            rows = [[r["name"], r["op_type"], fmt(r["max_abs_error"]), fmt(r["max_rel_error"]),
                     f"[{fmt(r['fp32_min'])}, {fmt(r['fp32_max'])}]", r["nonfinite"]] for r in loc.get("worst", [])]
            first = loc.get("first_divergent")
            parts += ["<h3>Localisation</h3>", f"<p>{_esc(loc.get('method'))}. First node over tolerance: "
                      f"<b>{_esc(first['name'] if first else 'none')}</b></p>",
                      _table(["node", "op", "max abs err", "max rel err", "FP32 range", "non-finite"], rows)]
        if v.get("fallback"):
            fb = v["fallback"]
            parts += [f"<h3>Automatic FP32 fallback: {_status('passed' if fb['passed'] else 'failed')}</h3>",
                      f"<p>Moved to FP32: {_esc(', '.join(fb['moved_to_fp32']) or 'none')}; FP16 node fraction "
                      f"{fmt(100 * fb['fp16_fraction_before'], '.1f')} % &rarr; "
                      f"{fmt(100 * fb['fp16_fraction_after'], '.1f')} %.</p>"]
    if s["benchmark"]:
        b = s["benchmark"]
        rows = [[r["backend"], r["precision"], r["device"], r["batch_size"], fmt(r["latency_ms"]["p50"], ".3f"),
                 fmt(r["latency_ms"]["p90"], ".3f"), fmt(r["latency_ms"]["p99"], ".3f"),
                 fmt(100 * r["latency_ms"]["cv"], ".1f") + " %", fmt(r["throughput_per_s"], ".1f"), r["timing"],
                 _status(r["verify"]) if r["verify"] in ("passed", "failed")
                 else f"<span class='muted'>{_esc(r['verify'])}</span>"]
                for r in b["results"]]
        m = b["method"]
        method = (f"{m['trials']} trials of at least {m['min_iterations']} runs and {m['min_duration_s']} s each, "
                  f"after {m['warmup_s']} s of warm-up; percentiles by {m['percentiles']}; "
                  f"{b['environment'].get('threads')} threads; input {b['input']['shape']} "
                  f"({b['input']['data']}).")
        parts += ["<h2>Benchmark</h2>", f"<p>{_esc(method)}</p>",
                  _table(["backend", "precision", "device", "batch", "p50 ms", "p90 ms", "p99 ms", "cv", "images/s",
                          "timing", "verify"], rows, raw_cols=(10,))]
        for skipped in b.get("skipped", []):
            parts.append(f"<p class='muted'>skipped {_esc(skipped['backend'])}: {_esc(skipped['reason'])}</p>")
    if s["plots"]:
        parts.append("<h2>Plots</h2>")
        for name, title in s["plots"]:
            data = base64.b64encode(run.file(name).read_bytes()).decode()
            parts.append(f"<figure><figcaption>{_esc(title)}</figcaption>"
                         f"<img alt='{_esc(title)}' src='data:image/png;base64,{data}'></figure>")
    parts += ["<h2>Configuration</h2>", f"<pre>{_esc(s['config_yaml'])}</pre>",
              "<h2>Environment</h2>", f"<pre>{_esc(json.dumps(m.get('environment', {}), indent=2))}</pre>"]
    body = "\n".join(p for p in parts if p)
    return (f"<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
            f"<title>pipeline report: {_esc(m.get('model', ''))}</title><style>{STYLE}</style></head>"
            f"<body>\n{body}\n{LOAD_CHECK}</body></html>\n")


def render_markdown(run: RunDir, cfg) -> str:
    s = sections(run, cfg)
    m = s["manifest"]
    lines = [f"# Run report: {m.get('model', cfg.model.name)}", "", "| stage | status | time | note |",
             "|---|---|---|---|"]
    for name in ("train", "export", "build", "verify", "benchmark"):
        e = m.get("stages", {}).get(name) or {}
        lines.append(f"| {name} | {e.get('status', 'not run')} | {fmt(e.get('duration_s'), '.1f')} s | "
                     f"{(e.get('reason') or e.get('error') or '').replace('|', '/')} |")
    if run.file("verify.md").exists():
        lines += ["", run.file("verify.md").read_text(encoding="utf-8")]
    if run.file("benchmark.md").exists():
        lines += ["", run.file("benchmark.md").read_text(encoding="utf-8")]
    for name, title in s["plots"]:
        lines += ["", f"![{title}]({name})"]
    return "\n".join(lines) + "\n"


def write(run: RunDir, cfg) -> list[Path]:
    atomic_write(run.file(HTML_NAME), render_html(run, cfg))
    atomic_write(run.file(MD_NAME), render_markdown(run, cfg))
    return [run.file(HTML_NAME), run.file(MD_NAME)]
