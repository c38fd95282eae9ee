"""Benchmark statistics on known series, the measuring method, and the report files."""

import json
import struct
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline import benchmark
from pipeline.core.timings import Timing, TimingKind
from pipeline.runtime.speed import timing


def test_summary_statistics_of_a_known_series():
    series = list(range(1, 101))  # 1..100 ms
    s = timing.summarize(series, batch_size=4)
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
    s = timing.summarize([2.0] * 10, batch_size=1)
    assert s["std"] == 0 and s["cv"] == 0 and s["p99"] == 2.0 and s["throughput"] == pytest.approx(500.0)


def test_empty_series_is_an_error():
    with pytest.raises(ValueError):
        timing.summarize([], 1)


def test_measure_honours_iterations_duration_trials_and_warmup():
    calls = []

    def run_once():
        calls.append(1)
        return 1.0

    method = benchmark.TimingMethod(warmup_s=0.0, min_iterations=7, min_duration_s=0.0, trials=3, cv_warn=0.05)
    m = benchmark.measure(run_once, method)
    assert [t["iterations"] for t in m["trials"]] == [7, 7, 7]
    assert len(m["samples"]) == 21 and len(calls) == 22  # + the untimed first run
    assert m["cv_warning"] is False

    timed = benchmark.measure(lambda: 0.5, benchmark.TimingMethod(0.0, 1, 0.05, 1, 0.05))
    assert timed["trials"][0]["iterations"] > 1  # kept going until min_duration_s


def test_adaptive_rows_stop_at_the_floor_when_steady():
    calls = []

    def run_once():
        calls.append(1)
        return 2.0

    method = benchmark.TimingMethod(0.0, 3, 0.0, 2, 0.05, kind="adaptive", min_runs=12, max_row_s=60.0)
    m = benchmark.measure(run_once, method)
    assert len(m["samples"]) == 12 and len(calls) == 13  # the floor, + the untimed first run
    assert m["stop"] == {"runs": 12, "reason": "converged", "median_ms": 2.0, "interval_ms": [2.0, 2.0],
                         "relative_halfwidth": 0.0, "coverage": pytest.approx(1 - 2 * 79 / 4096)}
    assert [t["iterations"] for t in m["trials"]] == [12]  # the row is one trial (its cv warns as before)


def test_adaptive_rows_stop_at_the_time_cap_when_noisy_but_never_below_the_floor():
    values = iter([1.0] + [1.0, 3.0] * 10_000)
    m = benchmark.measure(lambda: next(values), benchmark.TimingMethod(0.0, 3, 0.0, 1, 0.05, kind="adaptive",
                                                                 min_runs=30, max_row_s=1e-9))
    assert m["stop"]["reason"] == "time cap" and m["stop"]["runs"] == 30 == len(m["samples"])
    assert m["stop"]["interval_ms"] == [1.0, 3.0]


def test_adaptive_rows_go_on_while_the_interval_is_wide():
    values = iter([5.0] + [1.0, 1.5] * 20 + [1.0] * 10_000)  # wide at first, then the median settles on 1.0
    m = benchmark.measure(lambda: next(values), benchmark.TimingMethod(0.0, 3, 0.0, 1, 0.05, kind="adaptive",
                                                                 min_runs=20, max_row_s=60.0))
    assert m["stop"]["reason"] == "converged" and m["stop"]["median_ms"] == 1.0 and m["stop"]["runs"] > 40


def test_the_fixed_method_records_its_interval_too():
    m = benchmark.measure(lambda: 1.0, benchmark.TimingMethod(0.0, 4, 0.0, 2, 0.05))
    assert m["stop"]["reason"] == "trials done" and m["stop"]["runs"] == 8 and m["stop"]["interval_ms"] == [1.0, 1.0]


def test_decisive_rows_are_the_reference_and_the_gating_deployments():
    from pipeline import config
    from pipeline.runtime import backends

    rows = benchmark.choose_rows(config.resolve())
    assert rows.chosen == "decisive" and rows.how == "benchmark.rows=all"
    assert rows.timed == ["torch_fp32", "onnxrt_fp32", "tensorrt_fp16", "tensorrt_bf16", "tensorrt_int8",
                          "onnxrt_cuda_fp16", "openvino_fp32", "openvino_bf16", "openvino_int8"]
    # not deployments (emulations), deployments whose verdict does not gate, or not verified at all
    assert rows.left_out == ["torch_autocast", "onnxrt_fp16_cpu", "bf16_emulation", "onnxrt_int8_cpu",
                             "onnxrt_cuda_fp32"]
    every = benchmark.choose_rows(config.resolve(overrides=["benchmark.rows=all"]))
    assert (every.chosen, every.left_out, every.timed) == ("all", [], backends.default_timed())
    gate = benchmark.choose_rows(config.resolve(overrides=["verify.gate=[openvino_int8]",
                                                           "verify.candidates.onnxrt_fp32.enabled=false"]))
    assert gate.timed == ["torch_fp32", "openvino_int8"]
    off = benchmark.choose_rows(config.resolve(overrides=["verify.candidates.openvino_bf16.enabled=false"]))
    assert "openvino_bf16" in off.left_out


def test_async_throughput_rows_are_timed_at_the_largest_batch_unless_rows_all():
    """The summary names the smallest batch's latency (never an async row's) and the largest batch's images/s: an
    async-throughput row elsewhere cannot change the answer."""
    from pipeline import config

    sizes = "benchmark.batch_sizes=[8,1,32,4]"
    assert benchmark.choose_rows(config.resolve(overrides=[sizes])).throughput_batches == [32]
    listed = benchmark.choose_rows(config.resolve(overrides=[sizes, "benchmark.backends=[openvino_fp32]"]))
    assert listed.throughput_batches == [32]
    every = benchmark.choose_rows(config.resolve(overrides=[sizes, "benchmark.rows=all"]))
    assert every.throughput_batches == [1, 4, 8, 32]


@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.integers(1, 256), min_size=1, max_size=5), rows=st.sampled_from(["decisive", "all"]),
       listed=st.booleans())
def test_the_async_throughput_batches_are_the_largest_or_all_of_them(sizes, rows, listed):
    from pipeline import config

    overrides = [f"benchmark.batch_sizes=[{','.join(map(str, sizes))}]", f"benchmark.rows={rows}"]
    chosen = benchmark.choose_rows(config.resolve(overrides=overrides + (["benchmark.backends=[openvino_fp32]"]
                                                                         if listed else [])))
    assert max(sizes) in chosen.throughput_batches and set(chosen.throughput_batches) <= set(sizes)
    assert chosen.throughput_batches == (sorted(sizes) if rows == "all" else [max(sizes)])


def test_a_listed_backend_is_timed_whatever_benchmark_rows_says():
    from pipeline import config

    rows = benchmark.choose_rows(config.resolve(overrides=["benchmark.backends=[onnxrt_fp16_cpu,torch_autocast]"]))
    assert (rows.chosen, rows.timed, rows.left_out) == ("listed", ["onnxrt_fp16_cpu", "torch_autocast"], [])


def test_noisy_trials_are_flagged():
    values = iter([1.0] + [1.0, 5.0] * 50)
    m = benchmark.measure(lambda: next(values), benchmark.TimingMethod(0.0, 10, 0.0, 1, 0.05))
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
    assert {"torch_fp32", "onnxrt_fp32", "onnxrt_fp16_cpu"} <= backends
    for r in payload["results"]:
        for key in ("backend", "precision", "device", "batch_size", "timing", "latency_ms", "throughput_per_s",
                    "iterations", "trials", "cv_warning", "cuda_graphs", "verify", "stop"):
            assert key in r, key
        assert r["stop"]["runs"] == r["iterations"] >= 20  # benchmark.min_runs
        assert r["stop"]["reason"] in ("converged", "time cap")
        low, high = r["stop"]["interval_ms"]
        assert low <= r["stop"]["median_ms"] <= high
        assert r["stop"]["median_ms"] == pytest.approx(r["latency_ms"]["p50"])
        lat = r["latency_ms"]
        assert 0 < lat["min"] <= lat["p50"] <= lat["p90"] <= lat["p95"] <= lat["p99"] <= lat["max"]
    verdicts = {r["backend"]: r["verify"] for r in payload["results"]}
    assert verdicts["torch_fp32"] == "reference" and verdicts["onnxrt_fp32"] == "passed"
    assert {r["batch_size"] for r in payload["results"]} == {1, 4}
    assert payload["method"]["kind"] == "adaptive" and payload["rows"]["chosen"] == "listed"
    md = (tiny_run / "benchmark.md").read_text()
    assert "| backend |" in md and "onnxrt_fp16_cpu" in md
    for name in ("benchmark_latency.png", "benchmark_throughput.png"):
        w, h = png_size(tiny_run / name)
        assert w > 300 and h > 200


def test_each_cpu_artifact_has_a_per_layer_profile_with_its_precisions_and_a_roofline(tiny_run):
    payload = json.loads((tiny_run / "benchmark.json").read_text())
    profiles = {(p["backend"], p["batch_size"]): p for p in payload["profiles"]}
    assert set(profiles) == {("onnxrt_fp32", 1), ("onnxrt_fp32", 4), ("onnxrt_fp16_cpu", 1), ("onnxrt_fp16_cpu", 4)}
    for p in profiles.values():  # torch_fp32 gives no account of its layers: no profile
        s = p["summary"]
        assert p["source"].startswith("ONNX Runtime profiler") and s["total_us"] > 0 and s["layers"] == len(p["layers"])
        assert {g["name"] for g in s["matrix_by_precision"]} <= {"fp32", "fp16"} and s["slowest"]
    # ONNX Runtime's CPU provider has no FP16 convolution: it casts the FP16 graph's inputs and runs them in FP32
    fp16 = profiles["onnxrt_fp16_cpu", 1]["summary"]
    assert {g["name"] for g in fp16["unfused"]} >= {"convert"} and fp16["unfused_share"] > 0
    roof = payload["roofline"]
    assert roof["macs"]["per_image"] > 0 and roof["peaks"]["fp32"]["gflops"] > 0
    assert {(r["backend"], r["batch_size"]) for r in roof["rows"]} >= set(profiles)
    assert all(0 < r["fraction"] < 1 for r in roof["rows"])
    md = (tiny_run / "benchmark.md").read_text()
    assert "Per-layer profile (CPU)" in md and "Profile: onnxrt_fp16_cpu" in md and "Roofline (CPU)" in md
    w, h = png_size(tiny_run / "benchmark_profile.png")
    assert w > 300 and h > 200


def test_profile_writes_a_trace_and_the_callers_torch_threads_are_left_as_they_were(clone_run):
    import torch

    from conftest import cli

    run, before = clone_run(), torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert cli("benchmark", "--run-dir", run, "--profile", "benchmark.backends=[torch_fp32]",
                   "benchmark.batch_sizes=[1]", "benchmark.threads=2") == 0
        assert torch.get_num_threads() == 1  # a Python caller (run_all, a test worker) goes on with its own count
    finally:
        torch.set_num_threads(before)
    environment = json.loads((run / "benchmark.json").read_text())["environment"]
    assert environment["threads"] == environment["torch_threads"] == 2  # what the rows were timed with
    trace = json.loads((run / "benchmark.trace.json").read_text())
    assert trace["traceEvents"]


class _FailsAtBatch:
    """A CPU runner with the benchmark hooks whose timer raises at one batch size (as CUDA OOM would),
    or whose second timer fails at that batch while the first works, or times 0 ms there (no clock measures it)."""

    def __init__(self, bad_batch: int, where: str):
        self.bad_batch, self.where, self.active = bad_batch, where, False
        self.precision = self.note = self.workaround = ""

    def activate(self):
        self.active = True

    def deactivate(self):
        self.active = False

    def batch_reason(self, batch):
        return ""

    def measurements(self, feed, method):
        from pipeline.runtime.runners import Timed

        return Timed.measurements(self, feed, method)

    def timers(self, feed, throughput=True):
        batch = len(next(iter(feed.values())))
        if self.where == "timers" and batch == self.bad_batch:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB\nsecond line")

        def ok():
            return 1.0

        def bad():
            raise RuntimeError("TensorRT execute_async_v3 returned False")

        def zero():
            return 0.0

        second = {"timer": bad, "zero": zero}.get(self.where, ok) if batch == self.bad_batch else ok
        return [(Timing(TimingKind.GPU_COMPUTE, "first"), ok), (Timing(TimingKind.HOST_LATENCY, "second"), second)]


@pytest.mark.parametrize("where", ["timers", "timer", "zero"])
def test_a_failing_measurement_is_an_error_row_and_the_rest_go_on(where):
    from pipeline import config
    from pipeline.runtime import backends
    from pipeline.runtime.backends import Backend, Context

    cfg = config.resolve(overrides=["benchmark.batch_sizes=[1,4,8]"])
    runner = _FailsAtBatch(4, where)
    backend = Backend("fails_at_4", precision="fp32", device="cpu", artifact=None, label="test",
                      unavailable=lambda ctx: "", make=lambda ctx: runner)
    ctx = Context(cfg, None, "benchmark", SimpleNamespace(input_name="x"))
    images = np.zeros((2, 3, 4, 4), np.float32)
    rows, skipped = benchmark.time_backend(backend, ctx, images, benchmark.TimingMethod(0.0, 3, 0.0, 1, 0.5), "n/a")
    measured = sorted((r.batch_size, r.timing) for r in rows)
    errors = [s for s in skipped if s.reason.startswith("error: ")]
    assert len(errors) == 1 and errors[0].batch_size == 4
    if where == "timers":  # the whole batch failed before anything ran
        assert measured == [(1, "first"), (1, "second"), (8, "first"), (8, "second")]
        # the whole reason on one line (issue 21: OpenVINO once showed only its "Exception from …cpp:117:" line)
        assert errors[0].reason == "error: RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB second line"
    else:  # only that (batch, timing) failed
        assert measured == [(1, "first"), (1, "second"), (4, "first"), (8, "first"), (8, "second")]
        why = "execute_async_v3 returned False" if where == "timer" else "not a recordable measurement: "
        assert errors[0].timing == "second" and why in errors[0].reason
    assert not runner.active  # deactivated once, after every batch
    assert backends  # the table module stays importable beside the test backend
