"""report.html is one self-contained page: tables and embedded plots, rendered by a real browser."""

import hashlib
import json
import platform
import re
import shutil
import subprocess

import pytest

from conftest import cli


@pytest.fixture(scope="module")
def report_run(tiny_run, tmp_path_factory):
    run = tmp_path_factory.mktemp("report") / "run"
    shutil.copytree(tiny_run, run)
    assert cli("report", "--run-dir", run) == 0
    return run


@pytest.fixture(scope="module")
def report_html(report_run):
    return report_run / "report.html"


def section(html: str, heading: str) -> str:
    """The HTML between <h2>heading and the next <h2>."""
    return html.split(f"<h2>{heading}", 1)[1].split("<h2>", 1)[0]


def test_report_is_self_contained(report_html):
    html = report_html.read_text()
    assert html.count("data:image/png;base64,") == 4  # training curve, latency, throughput, per-layer profile
    assert not re.search(r"""(src|href)=['"]https?://""", html)  # nothing fetched from the network
    for heading in ("Stages", "Training", "Precision gate", "Benchmark", "Per-layer profile (CPU)", "Roofline (CPU)",
                    "Configuration", "Environment"):
        assert f"<h2>{heading}" in html
    assert html.count("<table>") >= 4


def test_report_names_the_model_and_its_environment_with_a_benchmark_present(report_run):
    """benchmark.json exists in the tiny run: the title and the environment still come from the manifest."""
    import torch

    assert (report_run / "benchmark.json").exists()
    html = (report_run / "report.html").read_text()
    assert "<title>pipeline report: tiny_cnn</title>" in html
    assert "<h1>Run report: tiny_cnn</h1>" in html
    env = section(html, "Environment")
    assert f"<td>{torch.__version__}</td>" in env and f"<td>{platform.python_version()}</td>" in env
    md = (report_run / "report.md").read_text()
    assert md.startswith("# Run report: tiny_cnn\n")
    env_md = md.split("## Environment", 1)[1]
    assert f"| torch | {torch.__version__} |" in env_md


def test_report_tables_carry_the_runs_numbers(report_run):
    html = (report_run / "report.html").read_text()
    md = (report_run / "report.md").read_text()
    verify = json.loads((report_run / "verify.json").read_text())
    bench = json.loads((report_run / "benchmark.json").read_text())
    for stage in ("train", "export", "build", "verify", "benchmark"):
        assert f"<td>{stage}</td>" in section(html, "Stages") and f"| {stage} |" in md
    for c in verify["candidates"]:
        assert f"<td>{c['name']}</td>" in section(html, "Precision gate") and f"| {c['name']} |" in md
    p50 = f"{bench['results'][0]['latency_ms']['p50']:.3f}"
    assert p50 in section(html, "Benchmark") and p50 in md
    # verify.md and benchmark.md come from the same rows as the report
    for c in verify["candidates"]:
        assert f"| {c['name']} |" in (report_run / "verify.md").read_text()
    assert p50 in (report_run / "benchmark.md").read_text()


@pytest.mark.parametrize("name, key", [("verify.json", "candidates"), ("verify.json", "inputs"),
                                       ("benchmark.json", "method")])
def test_report_with_a_key_missing_says_so_in_one_line(clone_run, capsys, name, key):
    run = clone_run()
    payload = json.loads((run / name).read_text())
    del payload[key]
    (run / name).write_text(json.dumps(payload))
    if name == "verify.json":  # as a verify of another version wrote it: recorded, or report shows it as not verified
        manifest = json.loads((run / "manifest.json").read_text())
        digest = hashlib.sha256((run / name).read_bytes()).hexdigest()
        manifest["stages"]["verify"]["artifacts"][name]["sha256"] = digest
        (run / "manifest.json").write_text(json.dumps(manifest))
    assert cli("report", "--run-dir", run) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: report: ")
    assert name in err and "Traceback" not in err
    assert repr(key) in err or f"{key}: field required" in err  # the typed rows' reader (core/verify_rows.py) says


def failing_payload() -> dict:
    """A verify.json of a failed gate with localisation and a fallback (what the tiny run does not produce)."""
    tensor = {"passed": False, "criterion": "scaled", "statistic": "q1 of per-image scaled error",
              "scaled_error_quantile": 0.5, "max_abs_error": 0.25}
    bound = {"status": "passed", "value": 0.0, "threshold": 0.01, "more_images": 0}
    task = {"status": "passed", "passed": True, "samples": 32, "confidence": 0.95, "top1_agreement": 0.97,
            "accuracy": 0.8, "reference_accuracy": 0.81, "agreement": bound, "drop": bound}
    return {
        "passed": False, "model": "m<x>", "inputs": {"samples": 32, "source": "synthetic"},
        "candidates": [{"name": "fp16_emulation", "precision": "fp16", "status": "failed", "required": False,
                        "reason": None, "tolerance": {"criterion": "scaled", "max_scaled_error": 0.05,
                                                      "error_quantile": 1.0},
                        "tensor_check": tensor, "task_check": task},
                       {"name": "tensorrt_fp16", "precision": "fp16", "status": "skipped", "required": True,
                        "reason": "no GPU | here"}],
        "localization": {"method": "all tensors marked", "first_divergent": {"name": "/Sub", "op_type": "Sub"},
                         "worst": [{"name": "/Sub", "op_type": "Sub", "max_abs_error": 0.12, "max_rel_error": 1.0,
                                    "fp32_min": -1.0, "fp32_max": 384.0, "nonfinite": 0}]},
        "fallback": {"passed": True, "iterations": [{}, {}], "moved_to_fp32": ["/Sub", "/Add"],
                     "fp16_fraction_before": 1.0, "fp16_fraction_after": 0.8},
    }


def test_verify_rows_render_the_same_numbers_in_markdown_and_html():
    from pipeline.reports import tables, verify_report

    sections = tables.verify_sections(failing_payload())
    md = verify_report.markdown(failing_payload())
    assert md.startswith("### Precision gate: FAILED\n")
    assert "| fp16_emulation | fp16 | failed | 0.5 | 0.25 | 97.00% | 80.00% (81.00%) |" in md
    assert "| tensorrt_fp16 | fp16 | skipped (required): no GPU / here |" in md  # a '|' cannot break the table
    assert "#### FP16 localisation (fp16_emulation)" in md and "First node over tolerance: `/Sub` (Sub)." in md
    assert "#### Automatic FP16 fallback: PASSED" in md and "moved to FP32: `/Sub`, `/Add`" in md
    assert "100.0% -> 80.0%" in md
    page = "".join(tables.html(s) for s in sections)
    assert "Model m&lt;x&gt;." in page and "<x>" not in page  # every text is escaped
    assert '<td><span class="failed">failed</span></td><td>0.5</td><td>0.25</td><td>97.00%</td>' in page
    assert "<h3>Automatic FP16 fallback: <span class=\"passed\">passed</span></h3>" in page


def browser():
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        if shutil.which(name):
            return shutil.which(name)
    return None


def test_report_renders_in_headless_browser(report_html, tmp_path):
    exe = browser()
    if exe is None:
        pytest.skip("no Chromium/Chrome installed (apt-get install chromium); .ci/run installs it")
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={tmp_path / 'p'}",
             "--virtual-time-budget=5000"]
    dom = subprocess.run([exe, *flags, "--dump-dom", report_html.as_uri()], capture_output=True, text=True,
                         timeout=120, check=False)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert 'data-images-loaded="4"' in dom.stdout  # every embedded plot decoded (the same 4 as above)
    assert dom.stdout.count("<table>") >= 4
    shot = tmp_path / "page.png"
    subprocess.run([exe, *flags, f"--screenshot={shot}", "--window-size=1200,2400", report_html.as_uri()],
                   capture_output=True, timeout=120, check=False)
    assert shot.exists() and shot.stat().st_size > 20_000
