"""`deploy --serve` end to end: a real Triton (the tritonserver binary of the nvidia-pytriton wheel) serves the tiny
run's repository as written, each model's executions done by its stock backend's behaviour
(pipeline/runtime/serving/triton_stock.py) from the files on disk; the validation images go through tritonclient at
batch 1, at the largest batch and from 8 clients at once; the served outputs pass verify's criteria against the FP32
reference; one model is timed over HTTP and gRPC; the numbers reach the report; nothing leaves the loopback; and the
server is stopped however the command ends (done, a failed check, Ctrl-C).

Skipped with the reason where the `serve` extra is not installed (CI: nvidia-pytriton 0.7 pins numpy<2, so it is not
in the test extra; pyproject.toml and docs/deploy.md say why).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, cli
from pipeline.runtime.serving import triton_serve

pytestmark = [pytest.mark.serve, pytest.mark.slow,
              pytest.mark.skipif(bool(triton_serve.available()), reason=f"no local Triton: {triton_serve.available()}")]

# Short enough for a test (about 30 s each, most of it Triton starting and stopping), long enough to time something.
FAST = ["deploy.serve_samples=16", "deploy.warmup_s=0.1", "deploy.window_s=0.25", "deploy.max_trials=4",
        "deploy.concurrency=[1,2]"]
GUARD = ROOT / "tests" / "netguard"


def _pid(text: str) -> int:
    found = re.search(r"serving .+? on .*\(pid (\d+)\)", text)
    assert found, text[-2000:]
    return int(found.group(1))


def _gone(pid: int, wait_s: float = 15.0) -> bool:
    """The process has exited (no /proc entry, or only a zombie waiting for its parent)."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        stat = Path(f"/proc/{pid}/stat")
        try:
            if stat.read_text().split(") ", 1)[1].startswith("Z"):
                return True
        except (FileNotFoundError, ProcessLookupError, IndexError):
            return True
        time.sleep(0.2)
    return False


def _env(tmp_path: Path, **extra) -> dict:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k.upper() not in ("NO_PROXY", "CI")}
    env.update({"HOME": str(home), "PYTHONUNBUFFERED": "1", **extra})
    return env


def test_served_outputs_pass_the_gate_over_http_and_grpc_and_stay_on_the_loopback(clone_run, tmp_path):
    from test_telemetry import Listener

    run, out, log, trace = clone_run(), tmp_path / "repo", tmp_path / "net.log", tmp_path / "connect.trace"
    proxy = Listener()  # native code that honours a proxy setting would go here: nothing may
    env = _env(tmp_path, PYTHONPATH=str(GUARD), PIPELINE_NETGUARD_LOG=str(log), PIPELINE_NETGUARD_LOOPBACK="1",
               NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost",
               **{name: proxy.url for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")})
    command = [sys.executable, "-m", "pipeline", "deploy", "--run-dir", str(run), "--out", str(out), "--serve", *FAST]
    if shutil.which("strace"):  # every connect() of every process, native code included (tritonserver, gRPC)
        command = ["strace", "-f", "-qq", "-e", "trace=connect", "-o", str(trace), *command]
    try:
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    finally:
        proxy.close()
    assert done.returncode == 0, done.stderr[-3000:]
    serve = json.loads((run / "deploy.json").read_text())["serve"]
    assert serve["verdict"] == "passed" and serve["timed"] == "onnxrt_fp32" and serve["images"] == 16
    models = {m["model"]: m for m in serve["models"]}
    assert {"onnxrt_fp32", "onnxrt_fp16_cpu"} <= set(models) and "openvino_fp32" not in models  # refused
    for model in models.values():
        assert {(c["batch"], c["concurrency"]) for c in model["checks"]} == {(1, 1), (32, 1), (1, 8)}
        assert model["verdict"] == "passed" and all(c["status"] == "passed" for c in model["checks"])
    assert {(t["where"], t["concurrency"]) for t in serve["timings"]} == \
        {("in-process", 1), ("http", 1), ("http", 2), ("grpc", 1), ("grpc", 2)}
    assert all(0 < t["p50_ms"] <= t["p99_ms"] and t["throughput_per_s"] > 0 for t in serve["timings"])
    assert _gone(_pid(done.stderr)), "tritonserver still runs after the command ended"
    assert not log.exists() or log.read_text() == "", log.read_text()[:2000]
    assert proxy.lines == []
    if trace.exists():
        text = trace.read_text()
        targets = re.findall(r'inet_addr\("([^"]+)"\)', text) + re.findall(r'inet_pton\(AF_INET6, "([^"]+)"', text)
        outside = sorted({t for t in targets if not (t.removeprefix("::ffff:").startswith("127.") or t == "::1")})
        assert targets and outside == [], outside
    assert cli("report", "--run-dir", run) == 0
    report = (run / "report.md").read_text()
    assert "Served by Triton on this machine: PASSED" in report and "Triton, gRPC client" in report


def test_a_failed_check_still_stops_the_server(clone_run, tmp_path, monkeypatch, capfd):
    """A server whose answers are off the reference (every execution's outputs shifted) fails the gate, exit 1."""
    from pipeline.runtime.serving import triton_stock

    run = clone_run()
    execute = triton_stock.Model.execute
    monkeypatch.setattr(triton_stock.Model, "execute",
                        lambda self, requests: [o + 1.0 for o in execute(self, requests)])
    assert cli("deploy", "--run-dir", run, "--out", tmp_path / "repo", "--serve", *FAST) == 1
    err = capfd.readouterr().err
    assert "does not pass verify's criteria" in err and "against the FP32 reference" in err and "Triton stopped" in err
    assert _gone(_pid(err))
    assert json.loads((run / "deploy.json").read_text())["serve"]["verdict"] == "failed"
    assert (tmp_path / "repo" / "onnxrt_fp32" / "config.pbtxt").is_file()  # the repository itself stands


def test_ctrl_c_stops_the_server(clone_run, tmp_path):
    run, errors = clone_run(), tmp_path / "stderr.txt"
    with errors.open("w") as sink:
        child = subprocess.Popen([sys.executable, "-m", "pipeline", "deploy", "--run-dir", str(run), "--out",
                                  str(tmp_path / "repo"), "--serve", *FAST, "deploy.max_trials=10",
                                  "deploy.window_s=2"],
                                 cwd=ROOT, env=_env(tmp_path), stdout=subprocess.DEVNULL, stderr=sink)
        try:
            deadline = time.monotonic() + 300
            while "serving" not in errors.read_text() and child.poll() is None and time.monotonic() < deadline:
                time.sleep(0.2)
            pid = _pid(errors.read_text())
            child.send_signal(signal.SIGINT)
            assert child.wait(timeout=120) == 130, errors.read_text()[-2000:]
        finally:
            if child.poll() is None:
                child.kill()
    text = errors.read_text()
    assert "Triton stopped" in text and "interrupted: deploy stopped" in text
    assert _gone(pid), "tritonserver still runs after Ctrl-C"
    assert json.loads((run / "manifest.json").read_text())["stages"]["deploy"]["status"] == "interrupted"
