"""trtexec side by side with benchmark's own TensorRT timings (pipeline/runtime/speed/trtexec.py).

These tests check the PLUMBING, not trtexec: a stand-in ``trtexec`` (tests/fake_trtexec.py) on PATH checks the
arguments benchmark passes and writes an ``--exportTimes`` JSON in trtexec's format; the engine and its
timings come from the recording fake of TensorRT (tests/fake_tensorrt.py), so no number here is a GPU's.
"""

from __future__ import annotations

import json
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conftest import ROOT, benchmark_row
from pipeline.core.benchmark_rows import TrtexecCheck
from pipeline.runtime.speed import trtexec
from test_tensorrt_contract import bench, built_run, fake_trt  # noqa: F401  (fixtures)


@pytest.fixture
def fake_trtexec(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = bin_dir / "trtexec"
    exe.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{ROOT / "tests" / "fake_trtexec.py"}" "$@"\n')
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{__import__('os').environ['PATH']}")
    calls = tmp_path / "calls.jsonl"
    monkeypatch.setenv("FAKE_TRTEXEC_CALLS", str(calls))
    return lambda: [json.loads(line) for line in calls.read_text().splitlines()] if calls.exists() else []


def tensorrt_rows(payload):
    return [r for r in payload["results"] if r["backend"] == "tensorrt_fp16"]


def test_trtexec_runs_on_the_same_engine_and_shapes_beside_every_tensorrt_row(built_run, fake_trtexec,  # noqa: F811
                                                                               monkeypatch):
    monkeypatch.setenv("FAKE_TRTEXEC_COMPUTE_MS", "1000")  # far from the fake engine's CPU time: flagged
    payload = bench(built_run)
    calls = fake_trtexec()
    # one compute run (CUDA graphs, no transfers, profile) and one with transfers, per measured batch (1, 4)
    assert len(calls) == 4
    engine = str(built_run / "model.fp16.engine")
    for batch in (1, 4):
        runs = [c for c in calls if f"--shapes=input:{batch}x3x16x16" in c]
        assert len(runs) == 2 and all(f"--loadEngine={engine}" in c and "--useCudaGraph" in c for c in runs)
        assert sum("--noDataTransfers" in c for c in runs) == 1
        (compute,) = [c for c in runs if "--noDataTransfers" in c]
        assert any(a.startswith("--exportProfile=") for a in compute) and "--separateProfileRun" in compute
    rows = tensorrt_rows(payload)
    assert len(rows) == 4 and all("trtexec" in r for r in rows)
    for r in rows:
        t = r["trtexec"]
        assert "error" not in t, t
        assert t["metric"] == ("computeMs" if r["timing"].startswith("GPU compute") else "latencyMs")
        assert 1000 <= t["p50"] <= t["p90"] <= t["p99"] and t["iterations"] >= 10
        assert t["flag"] is True and t["difference"] < -0.25
        assert (built_run / t["times_json"]).is_file()
    host = next(r for r in rows if r["batch_size"] == 4 and r["timing"].startswith("host"))
    assert host["trtexec"]["p50"] > 1000  # latencyMs = h2d + compute + d2h
    md = (built_run / "benchmark.md").read_text()
    assert "trtexec p50 ms" in md and "large difference" in md


@pytest.mark.parametrize("fake_trt", ["11"], indirect=True)  # an engine of TensorRT 11.1, as trtexec 11.1 is
def test_trtexec_11_gets_the_flags_of_trtexec_11(built_run, fake_trtexec, monkeypatch):  # noqa: F811
    """TensorRT 11's trtexec excludes data transfers unless --includeDataTransfers (unknown to 10) and ignores
    --noDataTransfers/--useCudaGraph/--separateProfileRun: the command line follows the version it prints."""
    monkeypatch.setenv("FAKE_TRTEXEC_VERSION", "11")
    payload = bench(built_run, "benchmark.batch_sizes=[1]")
    calls = fake_trtexec()
    assert len(calls) == 2
    assert not any(a in c for c in calls for a in ("--noDataTransfers", "--useCudaGraph", "--separateProfileRun"))
    (compute,) = [c for c in calls if any(a.startswith("--exportProfile=") for a in c)]
    (transfers,) = [c for c in calls if c is not compute]
    assert "--includeDataTransfers" in transfers and "--includeDataTransfers" not in compute
    for r in tensorrt_rows(payload):
        t = r["trtexec"]
        assert "error" not in t and t["tensorrt_major"] == 11
        records = json.loads((built_run / t["times_json"]).read_text())
        transferred = [x["h2dMs"] > 0 and x["d2hMs"] > 0 for x in records]
        assert all(transferred) if r["timing"].startswith("host") else not any(transferred)
    logs = list((built_run / "trtexec").glob("*.log")) if (built_run / "trtexec").is_dir() else []
    assert not any("has no effect" in p.read_text() for p in logs)


def test_a_failing_or_hanging_trtexec_is_a_note_on_its_rows_not_the_end_of_the_stage(built_run, fake_trtexec,  # noqa: F811
                                                                                   monkeypatch):
    monkeypatch.setenv("FAKE_TRTEXEC_FAIL_BATCH", "1")
    monkeypatch.setenv("FAKE_TRTEXEC_SLEEP_BATCH", "4")
    monkeypatch.setattr(trtexec, "TIMEOUT_S", 2)
    payload = bench(built_run)  # exit 0
    rows = tensorrt_rows(payload)
    assert len(rows) == 4
    for r in rows:
        error = r["trtexec"]["error"]
        if r["batch_size"] == 1:
            assert error.startswith("trtexec exited 1: [E] Error[2]: [executionContext.cpp::setInputShape]: out of")
        else:
            assert error.startswith("trtexec timed out after 2 s")
    assert "error" in (built_run / "benchmark.md").read_text()


def test_a_trtexec_that_writes_no_usable_json_is_a_note(built_run, fake_trtexec, monkeypatch):  # noqa: F811
    monkeypatch.setenv("FAKE_TRTEXEC_GARBAGE", "1")
    payload = bench(built_run, "benchmark.batch_sizes=[1]")
    assert {r["trtexec"]["error"].split(" (")[0] for r in tensorrt_rows(payload)} == \
           {"trtexec no usable --exportTimes JSON"}


def test_without_trtexec_on_path_nothing_runs(built_run, monkeypatch):  # noqa: F811
    monkeypatch.setattr(trtexec, "find", lambda: None)
    payload = bench(built_run, "benchmark.batch_sizes=[1]")
    assert all("trtexec" not in r for r in payload["results"])


@pytest.mark.parametrize("trtexec_version, shown", [("10.14.1", "10.14.1"), ("11", "11.1.0")])
def test_trtexec_of_another_tensorrt_release_is_not_run_and_no_error(built_run, fake_trtexec, monkeypatch,  # noqa: F811
                                                                     trtexec_version, shown):
    """pip's TensorRT wheels ship no trtexec: the one on PATH may be another release than the engine's (10.13.0.35
    here), and an engine deserializes only in its own release, minor and patch included (the fake trtexec refuses
    it, as TensorRT's deserializer does). Its rows say why trtexec did not run, with both versions; no row has an
    error and nothing was launched."""
    monkeypatch.setenv("FAKE_TRTEXEC_VERSION", trtexec_version)
    payload = bench(built_run, "benchmark.batch_sizes=[1]")
    assert fake_trtexec() == []  # --help only: never asked to load the engine
    rows = tensorrt_rows(payload)
    assert rows and all("error" not in r["trtexec"] and "error" not in r for r in rows)
    assert {r["trtexec"]["not_run"] for r in rows} == {
        f"trtexec is TensorRT {shown}, the engine was built by TensorRT 10.13.0.35"}
    md = (built_run / "benchmark.md").read_text()
    assert "not run" in md and "error" not in md.split("trtexec p50 ms", 1)[1].split("\n\n", 1)[0]


def test_the_fake_trtexec_refuses_an_engine_of_another_release(built_run, tmp_path, monkeypatch):  # noqa: F811
    """The stand-in is as strict as TensorRT: 10.14.1's trtexec does not load a 10.13.0 engine (exit 1)."""
    import subprocess

    monkeypatch.setenv("FAKE_TRTEXEC_VERSION", "10.14.1")
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "fake_trtexec.py"),
                           f"--loadEngine={built_run / 'model.fp16.engine'}", "--shapes=input:1x3x16x16",
                           f"--exportTimes={tmp_path / 't.json'}", "--iterations=10"], capture_output=True, text=True)
    assert done.returncode == 1 and "expecting library version 10.14.1 got 10.13.0.35" in done.stdout


@pytest.mark.parametrize("ours, flagged", [(1.2, False), (0.8, False), (1.3, True), (0.7, True)])
def test_a_difference_above_the_threshold_is_flagged(ours, flagged):
    row = benchmark_row("tensorrt_fp16", 1, ours, timing="GPU compute (CUDA events)", timing_kind="gpu_compute")
    result = trtexec.compare(row, TrtexecCheck(p50=1.0, metric="computeMs"))
    assert result.flag is flagged and result.difference == pytest.approx(ours - 1.0)


def test_read_times_takes_the_field_of_every_record_in_either_format(tmp_path):
    path = tmp_path / "times.json"
    path.write_text(json.dumps([{"startInMs": 0, "inMs": 0.1, "computeMs": 2.0, "outMs": 0.1, "latencyMs": 2.2},
                                {"startEnqMs": 0, "h2dMs": 0.1, "computeMs": 3.0, "d2hMs": 0.1, "latencyMs": 3.2}]))
    assert trtexec.read_times(path, "computeMs") == [2.0, 3.0]
    assert trtexec.read_times(path, "latencyMs") == [2.2, 3.2]
    path.write_text("{}")
    with pytest.raises(ValueError, match="not a list"):
        trtexec.read_times(path, "computeMs")


@given(st.tuples(*[st.integers(0, 20)] * 4), st.tuples(*[st.integers(0, 20)] * 3))
def test_release_mismatch_is_empty_exactly_for_the_same_release_and_names_both(engine, tool):
    """Pure rule: trtexec ``M.m.p`` loads an engine of ``M.m.p.b`` (any build) and no other; a mismatch names both."""
    engine_version, tool_version = ".".join(map(str, engine)), ".".join(map(str, tool))
    reason = trtexec.release_mismatch(tool_version, engine_version)
    assert (reason == "") == (engine[:3] == tool)
    if reason:
        assert reason == f"trtexec is TensorRT {tool_version}, the engine was built by TensorRT {engine_version}"


@pytest.mark.parametrize("tool, engine, reason", [
    (None, "10.13.0.35", "trtexec's TensorRT release is unknown"), ("11.1.0", None, "not recorded"),
    ("11.1.0", "garbage", "not recorded")])
def test_release_mismatch_with_an_unknown_side_is_a_reason(tool, engine, reason):
    assert reason in trtexec.release_mismatch(tool, engine)
