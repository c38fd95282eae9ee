"""Benchmark statistics on known series, the measuring method, and the report files."""

import json
import struct

import numpy as np
import pytest

from pipeline import benchmark


def test_summary_statistics_of_a_known_series():
    series = list(range(1, 101))  # 1..100 ms
    s = benchmark.summarize(series, batch_size=4)
    assert s["mean"] == pytest.approx(50.5)
    assert s["p50"] == pytest.approx(50.5)
    assert s["p90"] == pytest.approx(90.1)  # linear interpolation: 1 + 0.90 * 99
    assert s["p95"] == pytest.approx(95.05)
    assert s["p99"] == pytest.approx(99.01)
    assert s["std"] == pytest.approx(np.std(series, ddof=1))
    assert s["cv"] == pytest.approx(np.std(series, ddof=1) / 50.5)
    assert s["min"] == 1 and s["max"] == 100 and s["iterations"] == 100
    assert s["throughput"] == pytest.approx(4 * 1000 / 50.5)


def test_constant_series_has_zero_spread():
    s = benchmark.summarize([2.0] * 10, batch_size=1)
    assert s["std"] == 0 and s["cv"] == 0 and s["p99"] == 2.0 and s["throughput"] == pytest.approx(500.0)


def test_empty_series_is_an_error():
    with pytest.raises(ValueError):
        benchmark.summarize([], 1)


def test_measure_honours_iterations_duration_trials_and_warmup():
    calls = []

    def run_once():
        calls.append(1)
        return 1.0

    method = benchmark.Method(warmup_s=0.0, min_iterations=7, min_duration_s=0.0, trials=3, cv_warn=0.05)
    m = benchmark.measure(run_once, method)
    assert [t["iterations"] for t in m["trials"]] == [7, 7, 7]
    assert len(m["samples"]) == 21 and len(calls) == 22  # + the untimed first run
    assert m["cv_warning"] is False

    timed = benchmark.measure(lambda: 0.5, benchmark.Method(0.0, 1, 0.05, 1, 0.05))
    assert timed["trials"][0]["iterations"] > 1  # kept going until min_duration_s


def test_noisy_trials_are_flagged():
    values = iter([1.0] + [1.0, 5.0] * 50)
    m = benchmark.measure(lambda: next(values), benchmark.Method(0.0, 10, 0.0, 1, 0.05))
    assert m["cv_warning"] is True


def png_size(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def test_benchmark_outputs(tiny_run):
    payload = json.loads((tiny_run / "benchmark.json").read_text())
    assert payload["schema"] == "pipeline.benchmark/1"
    for key in ("model", "input", "method", "environment", "results", "skipped"):
        assert key in payload
    assert payload["environment"]["threads"] >= 1 and payload["environment"]["cpu"]
    backends = {r["backend"] for r in payload["results"]}
    assert {"torch_fp32", "onnxrt_fp32", "onnxrt_fp16"} <= backends
    for r in payload["results"]:
        for key in ("backend", "precision", "device", "batch_size", "timing", "latency_ms", "throughput_per_s",
                    "iterations", "trials", "cv_warning", "cuda_graphs", "verify"):
            assert key in r, key
        lat = r["latency_ms"]
        assert 0 < lat["min"] <= lat["p50"] <= lat["p90"] <= lat["p95"] <= lat["p99"] <= lat["max"]
        assert r["iterations"] >= 3 * 2  # min_iterations x trials (TINY)
    verdicts = {r["backend"]: r["verify"] for r in payload["results"]}
    assert verdicts["torch_fp32"] == "reference" and verdicts["onnxrt_fp32"] == "passed"
    assert {r["batch_size"] for r in payload["results"]} == {1, 4}
    md = (tiny_run / "benchmark.md").read_text()
    assert "| backend |" in md and "onnxrt_fp16" in md
    for name in ("benchmark_latency.png", "benchmark_throughput.png"):
        w, h = png_size(tiny_run / name)
        assert w > 300 and h > 200


def test_profile_writes_a_trace(clone_run):
    from conftest import cli

    run = clone_run()
    assert cli("benchmark", "--run-dir", run, "--profile", "benchmark.backends=[torch_fp32]",
               "benchmark.batch_sizes=[1]") == 0
    trace = json.loads((run / "benchmark.trace.json").read_text())
    assert trace["traceEvents"]
