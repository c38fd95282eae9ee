"""The tool sends nothing anywhere (issue 30, §3): `all` with INT8 and OpenVINO on, in a subprocess whose every Python
socket connection and name lookup is refused and recorded (tests/netguard/sitecustomize.py, inherited by every child
through PYTHONPATH), with HTTP(S)_PROXY pointing at a listener that records what native code sends, and a fresh home
folder (no consent file of an earlier run). Before pipeline/core/telemetry.py this run made 44 Google Analytics
connections (OpenVINO's openvino-telemetry: a forked process per event, urlopen; refused by the guard) and 3
`CONNECT mobile.events.data.microsoft.com:443` (ONNX Runtime's native 1DS uploader; seen by the proxy)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from conftest import ROOT, TINY
from pipeline.core import telemetry

GUARD = ROOT / "tests" / "netguard"
# TINY with what the default config runs and TINY leaves out: INT8 (ModelOpt's calibration runs ONNX Runtime) and the
# OpenVINO rows with benchmark_app beside them.
EVERYTHING = [*TINY, "export.int8.enabled=true", "export.int8.calibration_samples=16", "verify.samples=16",
              "verify.batch_check_samples=0", "benchmark.backends=[openvino_int8]", "benchmark.benchmark_app_s=0.2"]


# What would hide a regression: the opt-out itself, and the CI markers with which OpenVINO's telemetry (CI, TF_BUILD,
# JENKINS_URL) and ONNX Runtime's (ORT_RUNNING_UNIT_TESTS, CI) stay quiet on their own; also a proxy bypass.
UNSET = {"NO_PROXY", "ORT_DISABLE_TELEMETRY", "ORT_RUNNING_UNIT_TESTS", "CI", "TF_BUILD", "JENKINS_URL",
         "GITHUB_ACTIONS", "GITLAB_CI", "BUILD_BUILDID", "CONTINUOUS_INTEGRATION", "BUILDKITE", "CIRCLECI", "TRAVIS"}


class Listener:
    """A TCP listener on the loopback that records the first line each client sends (``CONNECT host:443 ...``)."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            with client:
                client.settimeout(2)
                try:
                    self.lines.append(client.recv(4096).split(b"\r\n")[0].decode(errors="replace"))
                except OSError as exc:
                    self.lines.append(f"(connected, sent nothing: {exc})")

    def close(self) -> None:
        self.server.close()


def test_all_makes_no_network_connection(tmp_path):
    home, log, proxy = tmp_path / "home", tmp_path / "net.log", Listener()
    home.mkdir()
    env = {key: value for key, value in os.environ.items() if key.upper() not in UNSET}
    env.update({"HOME": str(home), "PYTHONPATH": str(GUARD), "PIPELINE_NETGUARD_LOG": str(log),
                "PYTHONUNBUFFERED": "1", **{name: proxy.url for name in
                                            ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")}})
    try:
        done = subprocess.run([sys.executable, "-m", "pipeline", "-q", "all", "--model", "tiny_cnn", "--run-dir",
                               str(tmp_path / "run"), *EVERYTHING], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=600, check=False)
    finally:
        proxy.close()
    assert done.returncode == 0, done.stderr[-3000:]
    attempts = log.read_text().splitlines() if log.exists() else []
    assert attempts == [] and proxy.lines == [], \
        f"{len(attempts)} connection(s) refused in Python, {len(proxy.lines)} through the proxy: " \
        f"{sorted(set(proxy.lines))} {attempts[:3]}"
    assert (home / "intel" / "openvino_telemetry").read_text() == "0"


# --------------------------------------------------------------------------- each opt-out, and a user's own choice


@pytest.fixture
def fresh_home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path))
    return tmp_path


def _openvino_consent():
    from openvino_telemetry.utils.opt_in_checker import ConsentCheckResult, OptInChecker

    result = OptInChecker().check(enable_opt_in_dialog=False, disable_in_ci=False)  # as ovc asks, outside CI
    return {ConsentCheckResult.DECLINED: "declined", ConsentCheckResult.ACCEPTED: "accepted",
            ConsentCheckResult.NO_FILE: "no file (sends)"}[result]


def test_openvino_reads_the_file_the_tool_writes_as_declined(fresh_home):
    assert _openvino_consent() == "no file (sends)"
    assert telemetry.openvino_opt_out.__wrapped__() == "written"
    assert (fresh_home / "intel" / "openvino_telemetry").read_text() == "0"
    assert _openvino_consent() == "declined"
    assert telemetry.openvino_opt_out.__wrapped__() == "declined"  # written once, then only read


def test_a_user_who_opted_in_to_openvino_telemetry_keeps_that_choice(fresh_home, caplog):
    consent = fresh_home / "intel" / "openvino_telemetry"
    consent.parent.mkdir()
    consent.write_text("1")  # opt_in_out --opt_in
    with caplog.at_level("INFO", logger="pipeline"):
        assert telemetry.openvino_opt_out.__wrapped__() == "consented"
    assert consent.read_text() == "1" and _openvino_consent() == "accepted"
    assert "holds 1 (this user opted in); `opt_in_out --opt_out` stops it" in caplog.text


def test_an_unwritable_home_is_said_not_hidden(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("HOME", str(tmp_path / "gone"))  # no such folder: the consent file cannot be written
    with caplog.at_level("WARNING", logger="pipeline"):
        assert telemetry.openvino_opt_out.__wrapped__() == "unwritable"
    assert "OpenVINO's telemetry could not be turned off" in caplog.text and "opt_in_out --opt_out" in caplog.text


def test_onnx_runtime_is_told_before_it_starts_and_a_users_own_setting_stays():
    probe = "import os, pipeline; print(os.environ.get('ORT_DISABLE_TELEMETRY'))"
    env = {k: v for k, v in os.environ.items() if k != "ORT_DISABLE_TELEMETRY"}

    def run(extra: dict) -> str:
        return subprocess.run([sys.executable, "-c", probe], env={**env, **extra}, capture_output=True, text=True,
                              check=True).stdout.strip()

    assert run({}) == "1"
    assert run({"ORT_DISABLE_TELEMETRY": "0"}) == "0"  # the user's own, explicit choice


def test_openvino_consent_is_settled_before_openvino_is_imported(tmp_path):
    """`import openvino` alone sends an event (openvino.tools.ovc's import): the consent file must exist by then."""
    probe = ("import sys, pipeline; from pathlib import Path; consent = Path.home() / 'intel' / 'openvino_telemetry';"
             "assert not consent.exists(); import openvino_telemetry.main as m; real = m.Telemetry.init\n"
             "def init(self, *a, **k):\n"
             "    print('consent file at init:', consent.read_text()); return real(self, *a, **k)\n"
             "m.Telemetry.init = init; import openvino")
    done = subprocess.run([sys.executable, "-c", probe], env={**os.environ, "HOME": str(tmp_path)}, capture_output=True,
                          text=True, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "consent file at init: 0" in done.stdout
