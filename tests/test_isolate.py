"""Native runtimes run in a child process: a crash there is that backend's "crashed" row, not a dead stage.

Also the ONNX Runtime FP16 workaround (a standard transformer encoder in FP16 segfaults ONNX Runtime's CPU
provider on AVX-512 CPUs) and Ctrl-C while ModelOpt loads its native modules.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import crash_backends
from conftest import FAULTS, ROOT, TINY, cli, run_cli
from pipeline import config
from pipeline.core import model_card
from pipeline.core.errors import EXIT_INTERRUPTED, EXIT_RUNTIME
from pipeline.core.run import RunDir
from pipeline.runtime import backends, isolate, runners


def manifest(run: Path) -> dict:
    return json.loads((run / "manifest.json").read_text())


# onnxrt_fp16_cpu is reported only by default (verify.gate: auto); these tests make it decide the exit code.
GATED = "verify.gate=[onnxrt_fp32,fp16_emulation,onnxrt_fp16_cpu]"


@pytest.fixture
def crashing(monkeypatch):
    """The ``onnxrt_fp16_cpu`` entry replaced by one whose child kills itself with SIGSEGV at ``CRASH_AT``."""
    table = [crash_backends.TABLE[0] if b.name == "onnxrt_fp16_cpu" else b for b in backends.TABLE]
    monkeypatch.setattr(backends, "TABLE", table)

    def at(where: str) -> None:
        monkeypatch.setenv("CRASH_AT", where)

    return at


@pytest.mark.parametrize("where, phase", [("start", "creating the ONNX Runtime session"),
                                          ("infer", "running inference on batch 1")])
def test_a_segfaulting_candidate_is_crashed_and_the_others_complete(capsys, clone_run, crashing, where, phase):
    run = clone_run()
    crashing(where)
    capsys.readouterr()
    assert cli("-q", "verify", "--run-dir", run, GATED) == EXIT_RUNTIME
    err = capsys.readouterr().err
    log = "logs/verify.onnxrt_fp16_cpu.log"
    assert f"onnxrt_fp16_cpu: crashed: SIGSEGV while {phase} (log: {log})" in err and "Traceback" not in err

    report = json.loads((run / "verify.json").read_text())
    jsonschema.validate(report, json.loads((ROOT / "docs" / "verify.schema.json").read_text()))
    rows = {c["name"]: c for c in report["candidates"]}
    crashed = rows["onnxrt_fp16_cpu"]
    assert crashed["status"] == "crashed" and crashed["reason"] == f"SIGSEGV while {phase}"
    assert crashed["log"] == log and f"[pipeline.runtime.isolate] {phase}" in crashed["log_tail"]
    assert (run / log).is_file()
    assert rows["onnxrt_fp32"]["status"] == "passed" and rows["fp16_emulation"]["status"] == "passed"
    assert report["passed"] is False
    assert 'type="CandidateCrashed"' in (run / "verify.junit.xml").read_text()
    assert "crashed: SIGSEGV" in (run / "verify.md").read_text()
    entry = manifest(run)["stages"]["verify"]
    assert entry["status"] == "failed"
    assert entry["details"]["crashed"] == {"onnxrt_fp16_cpu": f"SIGSEGV while {phase} (log: {log})"}
    assert not list(run.glob(".isolate.*")), "the child's temporary folder is left behind"


def test_benchmark_records_a_crash_and_completes(capsys, clone_run, crashing):
    run = clone_run()
    crashing("time")
    assert cli("-q", "benchmark", "--run-dir", run, *TINY) == 0
    payload = json.loads((run / "benchmark.json").read_text())
    measured = {(r["backend"], r["batch_size"]) for r in payload["results"]}
    assert measured == {(b, n) for b in ("torch_fp32", "onnxrt_fp32") for n in (1, 4)}
    (skip,) = [s for s in payload["skipped"] if s["backend"] == "onnxrt_fp16_cpu"]
    assert skip["reason"] == ("crashed: SIGSEGV while timing batch 1 (wall-clock, synchronous CPU call) "
                              "(log: logs/benchmark.onnxrt_fp16_cpu.log)")
    assert skip["log_tail"][-1] == "[pipeline.runtime.isolate] timing batch 1 (wall-clock, synchronous CPU call)"
    assert "Skipped onnxrt_fp16_cpu at batch 1: crashed: SIGSEGV" in (run / "benchmark.md").read_text()
    assert manifest(run)["stages"]["benchmark"]["status"] == "ok"


@pytest.mark.parametrize("name", ["fp16_emulation", "onnxrt_fp16_cpu", "openvino_fp32"])
def test_no_isolated_child_imports_torch(clone_run, name):
    """Every native runner's child starts without torch (its import was two of the emulations' 2.2 s starts, a fifth
    of the whole suite's time): what a child imports is what every verify candidate pays."""
    run = clone_run()
    cfg = config.resolve(overrides=["model.name=tiny_cnn", *TINY])
    spec = model_card.read(run / "model.json").spec
    ctx = backends.Context(cfg, RunDir(run), "verify", spec)
    runner = isolate.runner_for(backends.by_name(name), ctx)
    with runner:
        runner.infer({spec.input_name: np.zeros((1, 3, 16, 16), np.float32)})
    assert runner.torch_imported is False


def test_isolated_runner_gives_the_same_outputs_without_torch_in_the_child(clone_run):
    run = clone_run()
    cfg = config.resolve(overrides=["model.name=tiny_cnn", *TINY])
    spec = model_card.read(run / "model.json").spec
    ctx = backends.Context(cfg, RunDir(run), "verify", spec)
    feed = {spec.input_name: np.random.default_rng(0).normal(size=(4, 3, 16, 16)).astype(np.float32)}
    entry = backends.by_name("onnxrt_fp32")
    assert entry.isolated and not backends.by_name("torch_fp32").isolated

    runner = isolate.runner_for(entry, ctx)
    assert isinstance(runner, isolate.Isolated)
    with runner:
        isolated = runner.infer(feed)
        assert list(run.glob(".isolate.*")), "inputs travel through a folder in the run directory"
    with entry.make(ctx) as local:
        expected = local.infer(feed)
    np.testing.assert_array_equal(isolated[spec.output_name], expected[spec.output_name])
    assert runner.torch_imported is False  # the child's start-up stays small
    assert not list(run.glob(".isolate.*"))


def test_a_crash_of_a_reported_only_candidate_is_its_row_and_does_not_fail_the_gate(capsys, clone_run, crashing):
    run = clone_run()
    crashing("start")
    assert cli("-q", "verify", "--run-dir", run) == 0  # onnxrt_fp16_cpu is not in verify.gate's default
    rows = {c["name"]: c for c in json.loads((run / "verify.json").read_text())["candidates"]}
    assert rows["onnxrt_fp16_cpu"]["status"] == "crashed" and rows["onnxrt_fp16_cpu"]["gates"] is False
    assert rows["fp16_emulation"]["status"] == "passed"


def test_an_exception_in_the_child_is_an_error_row_not_a_crash(capsys, clone_run, crashing):
    run = clone_run()
    crashing("raise")
    capsys.readouterr()
    assert cli("-q", "verify", "--run-dir", run, GATED) == EXIT_RUNTIME
    assert "onnxrt_fp16_cpu: RuntimeError: provider exploded" in capsys.readouterr().err
    row = next(c for c in json.loads((run / "verify.json").read_text())["candidates"] if c["name"] == "onnxrt_fp16_cpu")
    assert row["status"] == "error" and row["reason"] == "RuntimeError: provider exploded"


def test_child_errors_keep_their_type_and_message(clone_run, monkeypatch):
    """A Python exception in the child is an error row as before (its type name kept), not a crash."""
    run = clone_run()
    (run / "model.onnx").write_bytes(b"not an onnx file")
    cfg = config.resolve(overrides=["model.name=tiny_cnn", *TINY])
    spec = model_card.read(run / "model.json").spec
    ctx = backends.Context(cfg, RunDir(run), "benchmark", spec)
    from pipeline.core.errors import InputError

    with pytest.raises(InputError, match="model.onnx"):  # the child's InputError is the parent's InputError
        isolate.runner_for(backends.by_name("onnxrt_fp32"), ctx).activate()


def test_fp16_transformer_encoder_reaches_a_verdict(tmp_path):
    """nn.TransformerEncoder in FP16 segfaulted ONNX Runtime's CPU provider (AVX-512) while verify made its session."""
    run = tmp_path / "run"
    proc = run_cli("-q", "all", "--model", f"{FAULTS}:transformer_encoder", "--run-dir", run, *TINY)
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    report = json.loads((run / "verify.json").read_text())
    rows = {c["name"]: c for c in report["candidates"]}
    assert rows["onnxrt_fp16_cpu"]["status"] in ("passed", "failed")
    assert "NchwcTransformer" in rows["onnxrt_fp16_cpu"]["workaround"]
    stages = manifest(run)["stages"]
    assert "NchwcTransformer" in stages["verify"]["details"]["workarounds"]["onnxrt_fp16_cpu"]
    assert stages["verify"]["status"] in ("ok", "failed") and stages["benchmark"]["status"] in ("ok", "skipped")


BOOT = """
import os, signal, sys

class SigintOnImport:
    fired = False

    def find_spec(self, name, path=None, target=None):
        if name == "lief" and not SigintOnImport.fired:  # ModelOpt's nanobind module starts loading
            SigintOnImport.fired = True
            os.kill(os.getpid(), signal.SIGINT)
        return None

sys.meta_path.insert(0, SigintOnImport())
from pipeline.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_ctrl_c_while_modelopt_loads_ends_with_130(clone_run, tmp_path):
    """Ctrl-C as ModelOpt's native modules load ended in SIGABRT (134) with the manifest left "running"."""
    pytest.importorskip("lief")
    run = clone_run()
    boot = tmp_path / "boot.py"
    boot.write_text(BOOT)
    proc = subprocess.run([sys.executable, str(boot), "-q", "export", "--run-dir", str(run)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.returncode == EXIT_INTERRUPTED, proc.stderr[-2000:]
    assert "interrupted: export stopped" in proc.stderr
    assert manifest(run)["stages"]["export"]["status"] == "interrupted"


@pytest.fixture
def python_sigint():
    """SIGINT's handler pinned to Python's own (KeyboardInterrupt) for one test, whatever the process had before."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def _until_noted(held: list[int], deadline_s: float = 60.0) -> None:
    """Wait until the held handler has noted a signal: a handshake on what the handler did, not a guess at how long
    it takes (on a busy machine the interpreter may run it late). The deadline only ends a test that would hang."""
    deadline = time.monotonic() + deadline_s
    while not held:
        assert time.monotonic() < deadline, "the signal sent was never noted"
        time.sleep(0.001)  # a call back into the interpreter, where it runs pending handlers


def test_signals_held_raise_after_the_block(python_sigint):
    """Issue 46: this test slept 50 ms and assumed the handler had run by then; it failed by chance in a full run."""
    from pipeline.core.run import signals_held

    reached = []
    with pytest.raises(KeyboardInterrupt):
        with signals_held() as held:
            os.kill(os.getpid(), signal.SIGINT)
            _until_noted(held)
            reached.append(True)
    assert reached == [True] and held == [signal.SIGINT]


def test_signals_held_hand_the_signal_to_the_handler_in_force_before():
    """SIGTERM held, then given once to the handler the block found (here one that records), and that handler back."""
    from pipeline.core.run import signals_held

    seen: list[int] = []

    def record(signum, frame):
        seen.append(signum)

    previous = signal.signal(signal.SIGTERM, record)
    try:
        with signals_held() as held:
            os.kill(os.getpid(), signal.SIGTERM)
            _until_noted(held)
            assert seen == []  # held, not handed over inside the block
        assert seen == [signal.SIGTERM] and signal.getsignal(signal.SIGTERM) is record
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_a_child_that_hangs_is_killed_at_its_deadline_and_its_row_says_so(capsys, clone_run, crashing):
    """A runtime that never answers (the child stops itself with SIGSTOP) no longer blocks verify for ever
    (issue 21, §4): killed after isolate.timeout_s plus its work, a "crashed: no answer in N s" row."""
    run = clone_run()
    crashing("stop")
    others = [f"verify.candidates.{b.verify_name}.enabled=false" for b in backends.TABLE
              if b.verify_name and b.verify_name != "onnxrt_fp16_cpu"]
    start = time.monotonic()
    assert cli("-q", "verify", "--run-dir", run, "isolate.timeout_s=2", GATED, *others) == EXIT_RUNTIME
    elapsed = time.monotonic() - start
    err = capsys.readouterr().err
    rows = {c["name"]: c for c in json.loads((run / "verify.json").read_text())["candidates"]}
    # 2 s plus a quarter second per image of the request: the main check's batches go in one request, here TINY's
    # 20 validation images
    assert rows["onnxrt_fp16_cpu"]["reason"] == "no answer in 7 s while running inference on batch 1", rows
    assert rows["onnxrt_fp16_cpu"]["status"] == "crashed" and "crashed: no answer in 7 s" in err
    assert 7 <= elapsed < 60
    assert not list(run.glob(".isolate.*"))


# --------------------------------------------------------------------------- the fork server (runtime/zygote.py)


def _parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _tiny_ctx(run: Path, *overrides: str) -> backends.Context:
    cfg = config.resolve(overrides=["model.name=tiny_cnn", *TINY, *overrides])
    return backends.Context(cfg, RunDir(run), "verify", model_card.read(run / "model.json").spec)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads a process's parent from /proc")
def test_children_are_forked_from_one_server_and_answer_as_a_new_interpreter_does(clone_run):
    run = clone_run()
    entry = backends.by_name("onnxrt_fp32")
    feed = {"input": np.random.default_rng(1).normal(size=(2, 3, 16, 16)).astype(np.float32)}
    answers, parents = {}, {}
    for fork_server in ("true", "false"):
        ctx = _tiny_ctx(run, f"isolate.fork_server={fork_server}")
        with isolate.Isolated(entry, ctx) as first, isolate.Isolated(entry, ctx) as second:
            parents[fork_server] = {_parent_of(first.proc.pid), _parent_of(second.proc.pid)}
            answers[fork_server] = first.infer(feed)["logits"]
            assert first.torch_imported is None  # not stopped yet
        assert first.torch_imported is False and second.torch_imported is False
    assert len(parents["true"]) == 1 and parents["true"] != {os.getpid()}  # one server, not this process
    assert parents["false"] == {os.getpid()}  # isolate.fork_server=false: a new interpreter, this process's child
    np.testing.assert_array_equal(answers["true"], answers["false"])


@pytest.mark.parametrize("fork_server", ["true", "false"])
def test_a_segfault_is_named_with_either_way_of_starting(clone_run, crashing, fork_server):
    crashing("start")
    runner = isolate.Isolated(crash_backends.TABLE[0], _tiny_ctx(clone_run(), f"isolate.fork_server={fork_server}"))
    with pytest.raises(isolate.Crashed, match="^SIGSEGV while creating the ONNX Runtime session$"):
        runner.activate()
    assert runner.proc is None


def test_a_dead_server_or_a_new_loader_path_gets_a_new_server(clone_run, monkeypatch):
    from pipeline.runtime import zygote

    run = clone_run()
    entry = backends.by_name("onnxrt_fp32")

    def server_of_a_new_child() -> int:
        with isolate.Isolated(entry, _tiny_ctx(run)) as runner:
            return _parent_of(runner.proc.pid)

    first = server_of_a_new_child()
    assert server_of_a_new_child() == first
    os.kill(first, signal.SIGKILL)  # the server dies: the next child comes from a new one
    zygote._server.proc.wait()
    with monkeypatch.context() as unseen:  # even when its death is not seen before a child is asked of it
        unseen.setattr(zygote._Server, "serves", lambda self, env: True)
        second = server_of_a_new_child()
    assert second not in (first, os.getpid())
    os.kill(second, signal.SIGKILL)
    zygote._server.proc.wait()
    assert server_of_a_new_child() not in (first, second, os.getpid())  # seen dead
    second = zygote._server.proc.pid
    # CUDA's libraries are found through LD_LIBRARY_PATH, which the loader reads once, when a process starts.
    monkeypatch.setenv("LD_LIBRARY_PATH", f"/opt/elsewhere{os.pathsep}{os.environ.get('LD_LIBRARY_PATH', '')}")
    third = server_of_a_new_child()
    assert third not in (first, second, os.getpid())
    assert zygote._server is not None and zygote._server.proc.pid == third


# --------------------------------------------------------------------------- several feeds in one request


def test_feeds_in_one_request_are_answered_each_as_alone(clone_run, monkeypatch):
    """runners.infer_all sends an isolated runner its feeds together (one round trip, not one per feed); the child
    still runs each feed as its own inference, so every answer is the one that feed gets alone."""
    run = clone_run()
    rng = np.random.default_rng(2)
    feeds = [{"input": rng.normal(size=(n, 3, 16, 16)).astype(np.float32)} for n in (1, 3, 1, 2)]
    requests = []
    send = isolate.Isolated._send
    monkeypatch.setattr(isolate.Isolated, "_send", lambda self, proc, r: (requests.append(r.op),
                                                                       send(self, proc, r)))
    with isolate.Isolated(backends.by_name("onnxrt_fp32"), _tiny_ctx(run)) as runner:
        together = runners.infer_all(runner, feeds)
        assert requests == ["infer_each"]
        alone = [runner.infer(feed) for feed in feeds]
    assert [list(out) for out in together] == [["logits"]] * 4
    for got, want, feed in zip(together, alone, feeds, strict=True):
        assert got["logits"].shape == (len(feed["input"]), 10)
        np.testing.assert_array_equal(got["logits"], want["logits"])


@given(st.lists(st.integers(0, 50), max_size=30), st.integers(1, 60))
def test_groups_keep_every_feed_in_order_and_under_the_limit(sizes, limit):
    feeds = [{"x": np.zeros(n, np.uint8)} for n in sizes]
    groups = runners._groups(feeds, limit)
    assert [id(f) for g in groups for f in g] == [id(f) for f in feeds]
    assert all(g for g in groups)
    for group in groups:
        assert len(group) == 1 or sum(f["x"].nbytes for f in group) <= limit
    for before, after in zip(groups, groups[1:], strict=False):  # a group ends only where the next feed would not fit
        assert sum(f["x"].nbytes for f in before) + after[0]["x"].nbytes > limit
