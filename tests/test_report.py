"""report.html is one self-contained page: tables and embedded plots, rendered by a real browser."""

import re
import shutil
import subprocess

import pytest

from conftest import cli


@pytest.fixture(scope="module")
def report_html(tiny_run, tmp_path_factory):
    run = tmp_path_factory.mktemp("report") / "run"
    shutil.copytree(tiny_run, run)
    assert cli("report", "--run-dir", run) == 0
    return run / "report.html"


def test_report_is_self_contained(report_html):
    html = report_html.read_text()
    assert html.count("data:image/png;base64,") == 3  # training curve, latency, throughput
    assert not re.search(r"""(src|href)=['"]https?://""", html)  # nothing fetched from the network
    for heading in ("Stages", "Training", "Verification", "Benchmark", "Configuration", "Environment"):
        assert f"<h2>{heading}" in html
    assert html.count("<table>") >= 4
    assert (report_html.parent / "report.md").read_text().startswith("# Run report")


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
                         timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert 'data-images-loaded="3"' in dom.stdout  # every embedded plot decoded in the browser
    assert dom.stdout.count("<table>") >= 4
    shot = tmp_path / "page.png"
    subprocess.run([exe, *flags, f"--screenshot={shot}", "--window-size=1200,2400", report_html.as_uri()],
                   capture_output=True, timeout=120)
    assert shot.exists() and shot.stat().st_size > 20_000
