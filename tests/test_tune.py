"""python -m pipeline tune: the sensitivity search keeps more layers in INT8 than greedy fallback and still passes,
the chosen mix round-trips through export/build/verify, the sensitivity table is reproducible, and the speed
gate fails (naming the layers) where the INT8 artifact cannot be faster."""

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import ROOT, cli, copy_run, trained_and_exported
from pipeline.core import artifacts
from pipeline.precision import fp16, int8, sensitivity

TUNE_MODELS = ROOT / "tests" / "fault_models.py"
TRAINED = ["data.samples_per_class=30", "data.image_size=16", "data.batch_size=32", "train.epochs=4",
           "train.log_every=1", "export.fp16.calibration_samples=16", "export.int8.calibration_samples=16",
           "verify.samples=60", "verify.batch_size=30"]
# One calibration method, short timings, two batch sizes. A 16x16 model runs in ~0.03 ms, where the clock
# measures only noise: every passing mix counts as equally fast (tune.same_speed), so the choice is the search's.
FAST = ["tune.calibration_methods=[max]", "benchmark.batch_sizes=[1,4]", "tune.min_duration_s=0.02",
        "tune.warmup_s=0", "benchmark.min_iterations=3", "tune.same_speed=100"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    return trained_and_exported(tmp_path_factory, TRAINED)


_copy = copy_run


def _tune(run: Path, precision: str = "int8") -> dict:
    return json.loads((run / artifacts.tune_files(precision)[0]).read_text())


def test_tune_keeps_more_layers_in_int8_than_greedy_fallback_and_round_trips(trained, tmp_path, capsys):
    """Greedy fallback raises the first layer over tolerance (the mildly disturbed /early/Conv, harmless in the
    logits) and then the one that breaks the gate (/late/Conv); the sensitivity ranking raises /late/Conv alone."""
    run = _copy(trained(f"{TUNE_MODELS}:mild_then_severe"), tmp_path)
    assert cli("tune", "--run-dir", run, "--no-speed-gate", *FAST) == 0
    report = _tune(run)
    ranked = [row["layer"] for row in report["sensitivity"]["max"]]
    assert ranked[0] == "/late/Conv"
    greedy = next(c for c in report["candidates"] if c["origin"] == "greedy fallback")
    assert greedy["result"]["status"] == "passed" and sorted(greedy["high"]) == ["/early/Conv", "/late/Conv"]
    chosen = report["chosen"]
    assert chosen["high"] == ["/late/Conv"] and chosen["result"]["status"] == "passed"
    assert chosen["result"]["confirmed"]["status"] == "passed"  # the graph export makes, judged again
    assert len(chosen["high"]) < len(greedy["high"])
    assert {c["origin"] for c in report["candidates"]} >= {"all INT8", "all high", "top-1", "greedy fallback"}
    assert all(c["latency_ms"].keys() == {"1", "4"} for c in report["candidates"])
    assert "/late/Conv" in (run / "tune.md").read_text()
    fallback = json.loads((run / "int8_fallback.json").read_text())
    assert fallback["nodes"] == ["/late/Conv"] and fallback["calibration_method"] == "max"

    # Round trip: export makes exactly that mix, and the gate passes on it.
    assert cli("export", "--run-dir", run) == 0
    precisions = int8.node_precisions(onnx.load(str(run / "model.onnx")), onnx.load(str(run / "model.int8.onnx")))
    assert precisions["/late/Conv"][1] != "int8" and precisions["/early/Conv"][1] == "int8"
    assert cli("build", "--run-dir", run) == 0
    assert cli("verify", "--run-dir", run) == 0
    verdicts = {c["name"]: c["status"] for c in json.loads((run / "verify.json").read_text())["candidates"]}
    assert verdicts["int8_exact"] == "passed"
    assert cli("report", "--run-dir", run) == 0
    assert "Precision tuning (tune, INT8)" in (run / "report.md").read_text()

    # The sensitivity table is the same when tune runs again (same seed, same images, same calibration).
    before = report["sensitivity"]["max"]
    assert cli("tune", "--run-dir", run, "--no-speed-gate", *FAST) == 0
    after = _tune(run)["sensitivity"]["max"]
    assert [r["layer"] for r in after] == [r["layer"] for r in before]
    np.testing.assert_allclose([r["score"] for r in after], [r["score"] for r in before], rtol=1e-6)

    # all --tune: tune is unchanged (skipped), verify and benchmark judge and time the tuned artifact, and the
    # summary names it.
    capsys.readouterr()
    assert cli("all", "--run-dir", run, "--tune", *FAST, "benchmark.backends=[onnxrt_fp32,openvino_int8]") == 0
    out = capsys.readouterr().out
    assert "tuned artifact: INT8: 1 of 3 layers out of INT8 (max)" in out, out
    assert json.loads((run / "int8_fallback.json").read_text())["nodes"] == ["/late/Conv"]


def test_all_tune_keeps_the_previous_choice_and_a_second_identical_run_reruns_nothing(trained, tmp_path):
    """Issue 30, §3: a second identical `all --tune` re-ran tune (its fingerprint held export's run id, and export
    re-runs after tune to apply its choice), and its choice flipped on timing noise, re-running export, build, verify
    and benchmark. Here int8_fallback.json holds a passing mix (greedy's two layers): the fastest new mix is not
    faster beyond tune.same_speed, so tune keeps it; the second identical run then re-runs no stage."""
    run = _copy(trained(f"{TUNE_MODELS}:mild_then_severe"), tmp_path)
    previous = ["/early/Conv", "/late/Conv"]
    (run / "int8_fallback.json").write_text(json.dumps({"nodes": previous, "calibration_method": "max"}))
    args = ("-q", "all", "--run-dir", run, "--tune", *FAST, "benchmark.backends=[onnxrt_fp32,openvino_int8]")
    assert cli(*args) == 0
    chosen = _tune(run)["chosen"]
    assert sorted(chosen["high"]) == previous and chosen["result"]["status"] == "passed"
    assert "kept as the previous choice (int8_fallback.json): the best new mix (top-1, max;" in chosen["why"]
    assert sorted(json.loads((run / "int8_fallback.json").read_text())["nodes"]) == previous
    first = json.loads((run / "manifest.json").read_text())["stages"]
    assert cli(*args) == 0
    second = json.loads((run / "manifest.json").read_text())["stages"]
    assert {name: entry["run_id"] for name, entry in second.items()} == \
        {name: entry["run_id"] for name, entry in first.items()}  # tune, export, build, verify, benchmark: unchanged


def test_fp16_tune_keeps_more_nodes_in_fp16_than_greedy_fallback_and_round_trips(trained, tmp_path, capsys):
    """FP16 (tune --precision fp16): an early shift by 48 on the feature map (its FP16 rounding shows in its own
    tensor, so greedy fallback moves it first, but the pool washes it out) and the classifier's input shifted by
    384 with its FP16 weight sum (the logits are wrong): not matrix layers but an Add and a ReduceSum. tune ranks
    every FP16 node that rounds, keeps only the late two in FP32 (with their FP32 weights) and passes, where greedy
    keeps four; with no TensorRT here there is no FP16 target, so speed is not measured and said so, and the choice
    goes to fp16_fallback.json, which export applies."""
    run = _copy(trained(f"{TUNE_MODELS}:mild_then_severe_fp16"), tmp_path)
    assert cli("tune", "--run-dir", run, "--precision", "fp16", *FAST) == 0
    report = _tune(run, "fp16")  # tune.fp16.json: an INT8 tune's tune.json is another file
    assert report["precision"] == "fp16" and report["target"] == "none" and not (run / "tune.json").exists()
    assert "no FP16 deployment target here" in report["speed_not_measured"]
    all_fp16 = next(c for c in report["candidates"] if c["origin"] == "all FP16")
    assert all_fp16["result"]["status"] == "failed"  # the planted fault
    chosen = report["chosen"]
    assert chosen["result"]["status"] == "passed" and chosen["result"]["confirmed"]["status"] == "passed"
    ranked = [r["layer"] for r in report["sensitivity"]["autocast"]]
    assert set(chosen["high"]) == set(ranked[: len(chosen["high"])])  # the top of the ranking
    assert sorted(chosen["high"]) == ["/Add_1", "/ReduceSum"]
    greedy = report["greedy"]
    assert greedy["result"]["status"] == "passed" and {"/Add", "/Sub"} <= set(greedy["high"])
    assert len(chosen["high"]) < len(greedy["high"])
    assert json.loads((run / "fp16_fallback.json").read_text())["nodes"] == chosen["high"]
    # Round trip: export keeps exactly those nodes in FP32, and the FP16 emulation passes the gate.
    assert cli("export", "--run-dir", run) == 0
    precisions = fp16.node_precisions(onnx.load(str(run / "model.onnx")), onnx.load(str(run / "model.fp16.onnx")))
    assert all(precisions[n][1] == "fp32" for n in chosen["high"])
    assert cli("verify", "--run-dir", run, "verify.gate=[fp16_emulation]") == 0  # (its INT8 graph is faulty too)
    verdicts = {c["name"]: c["status"] for c in json.loads((run / "verify.json").read_text())["candidates"]}
    assert verdicts["fp16_emulation"] == "passed"
    assert cli("report", "--run-dir", run) == 0
    assert "Precision tuning (tune, FP16)" in (run / "report.md").read_text()
    assert cli("tune", "--run-dir", run, "--precision", "fp32") == 2
    assert "tune --precision fp32: choose one of int8, fp16" in capsys.readouterr().err


def test_speed_gate_fails_and_names_the_layers_when_int8_cannot_be_faster(trained, tmp_path, capsys):
    """Every matrix layer left out of INT8 (export.int8.op_types_to_exclude): the tuned artifact is the FP32
    network, so it cannot be faster than FP32; the speed gate fails with exit 1 and names the layers."""
    run = _copy(trained("tiny_cnn"), tmp_path)
    forced = ["export.int8.op_types_to_exclude=[Conv,Gemm]", "tune.min_speedup=1.5"]
    assert cli("tune", "--run-dir", run, *FAST, *forced) == 1
    err = capsys.readouterr().err
    assert "INT8 is no faster than FP32 here: 3 of 3 layers run in FP32" in err
    for layer in ("/features/features.0/Conv", "/features/features.4/Conv", "/fc/Gemm"):
        assert layer in err
    assert "tune.min_speedup 1.5" in err
    # Off (tune --no-speed-gate, and all --tune): the same numbers are reported, the stage passes.
    assert cli("tune", "--run-dir", run, "--no-speed-gate", *FAST, *forced) == 0
    assert _tune(run)["chosen"]["runtime_not_low"] == ["/features/features.0/Conv", "/features/features.4/Conv",
                                                        "/fc/Gemm"]


def test_on_a_gpu_tune_times_tensorrt_engines_and_reads_each_layers_precision_from_the_inspector(
        trained, tmp_path, monkeypatch):
    """Where TensorRT and a GPU are (here: tests/fake_tensorrt.py on its virtual device), every mix is built as a
    strongly typed engine and timed as benchmark times one; the engine inspector says which layers ran in INT8."""
    import fake_tensorrt
    from pipeline.core import env

    run = _copy(trained("tiny_cnn"), tmp_path)  # trained on the CPU, before the fake GPU appears
    fake_tensorrt.install(monkeypatch)
    try:
        assert cli("tune", "--run-dir", run, "--no-speed-gate", *FAST) == 0
        report = _tune(run)
        assert report["target"] == "TensorRT (strongly typed engine)" and report["speed_not_measured"] is None
        assert report["fp32"]["latency_ms"].keys() == {"1", "4"}
        by_origin = {c["origin"]: c for c in report["candidates"]}
        assert all(c["latency_ms"].keys() == {"1", "4"} for c in report["candidates"])
        quantized = {r["layer"] for r in report["sensitivity"]["max"]}  # ModelOpt leaves this small Gemm alone
        assert quantized and not quantized & set(by_origin["all INT8"]["runtime_not_low"])  # INT8, says the inspector
        assert quantized <= set(by_origin["all high"]["runtime_not_low"])  # none of them ran in INT8 there
    finally:
        env.tensorrt_status.cache_clear()


def test_search_bisects_on_k_and_confirms_the_neighbours():
    """Twelve ranked layers, the gate passing from k = 7 on: bisection judges O(log n) mixes, not every k, and the
    answer's neighbours k = 6 (fails) and k = 8 (passes) are judged too; both extremes always are."""
    ranked = [f"layer{i}" for i in range(12)]
    judged = []

    def judge(high, origin):
        judged.append(len(high))
        return sensitivity.Candidate(list(high), origin, {"status": "passed" if len(high) >= 7 else "failed"})

    found = sensitivity.search(ranked, judge)
    assert {0, 6, 7, 8, 12} <= set(judged) and len(judged) <= 8
    assert min(len(c.high) for c in found if c.passed) == 7
    assert [c.origin for c in found][:1] == ["all INT8"] and found[-1].origin == "all high"


def test_choose_takes_the_fastest_passing_mix_and_treats_noise_as_a_tie():
    def cand(high: int, status: str, ms1: float, ms8: float):
        return sensitivity.Candidate([f"l{i}" for i in range(high)], f"top-{high}", {"status": status,
                                     "scaled_error": 0.1, "accuracy_drop": 0.0}, latency_ms={1: ms1, 8: ms8})

    fast_fail, slow, fast, tied = cand(0, "failed", 1.0, 5.0), cand(3, "passed", 2.0, 9.0), \
        cand(2, "passed", 1.2, 6.0), cand(1, "passed", 1.22, 6.1)
    assert sensitivity.choose([fast_fail, slow, fast], [1, 8]) is fast
    assert sensitivity.choose([fast_fail, slow, fast, tied], [1, 8], same_speed=0.05) is tied  # fewer layers out
    assert sensitivity.choose([fast_fail, slow, fast, tied], [1, 8], same_speed=0.0) is fast
    assert sensitivity.choose([fast_fail], [1, 8]) is None


# --------------------------------------------------------------------------- a re-run keeps its choice (issue 30, §3)


def _mix(high: int, status: str, ms1: float, ms8: float, origin: str = "") -> sensitivity.Candidate:
    return sensitivity.Candidate([f"l{i}" for i in range(high)], origin or f"top-{high}", {"status": status},
                                 latency_ms={1: ms1, 8: ms8}, calibration="max")


def test_a_rerun_keeps_the_previous_choice_unless_the_new_one_is_faster_beyond_the_noise():
    """A second all --tune flipped entropy to max on timing noise, and re-ran export, build, verify, benchmark."""
    kept = _mix(2, "passed", 1.00, 6.0, "previous choice")
    noise = _mix(1, "passed", 0.97, 5.9)  # 2-3 % faster: within tune.same_speed (5 %)
    faster = _mix(3, "passed", 0.80, 4.5)  # 20-25 % faster
    assert sensitivity.keep_or_replace(kept, noise, [1, 8], 0.05) is kept
    assert sensitivity.keep_or_replace(kept, faster, [1, 8], 0.05) is faster
    assert sensitivity.keep_or_replace(kept, faster, [1, 8], 0.5) is kept  # a noisier machine: a wider tie
    assert sensitivity.keep_or_replace(None, noise, [1, 8], 0.05) is noise  # no previous choice
    assert sensitivity.keep_or_replace(kept, None, [1, 8], 0.05) is kept


def test_a_failing_or_untimed_previous_choice_gives_way():
    failing = _mix(0, "failed", 0.5, 2.0, "previous choice")
    pick = _mix(2, "passed", 1.0, 6.0)
    assert sensitivity.keep_or_replace(failing, pick, [1, 8], 0.05) is pick
    assert sensitivity.keep_or_replace(failing, None, [1, 8], 0.05) is None
    untimed = sensitivity.Candidate(["l0"], "previous choice", {"status": "passed"}, calibration="max")
    assert sensitivity.keep_or_replace(untimed, pick, [1, 8], 0.05) is pick
    failing_pick = _mix(1, "failed", 0.1, 0.1)
    assert sensitivity.keep_or_replace(pick, failing_pick, [1, 8], 0.05) is pick  # a failing pick replaces nothing
    assert sensitivity.keep_or_replace(None, failing_pick, [1, 8], 0.05) is None


def test_with_nothing_timed_only_fewer_raised_layers_replace_the_previous_choice():
    """No FP16 target on a CPU: speed is not measured, and the layer count (free of timing noise) decides."""
    kept = sensitivity.Candidate(["a", "b", "c"], "previous choice", {"status": "passed"})
    assert sensitivity.keep_or_replace(kept, sensitivity.Candidate(["a", "b"], "top-2", {"status": "passed"}), [],
                                       0.05).high == ["a", "b"]
    assert sensitivity.keep_or_replace(kept, sensitivity.Candidate(["x", "y", "z"], "top-3", {"status": "passed"}),
                                       [], 0.05) is kept


latency = st.floats(min_value=1e-3, max_value=1e3, allow_nan=False)
mixes = st.builds(lambda high, passed, ms1, ms8: _mix(high, "passed" if passed else "failed", ms1, ms8),
                  st.integers(0, 5), st.booleans(), latency, latency)
shares = st.floats(min_value=0, max_value=2, allow_nan=False)


def _slower_beyond_noise(incumbent, pick, batches, same_speed) -> bool:
    """The oracle, written another way: with r the incumbent's latency over the pick's at each batch, the incumbent
    costs mean(max(r, 1)) and the pick mean(max(1/r, 1)), each relative to the faster of the two."""
    r = [incumbent.latency_ms[b] / pick.latency_ms[b] for b in batches]
    return np.mean([max(x, 1.0) for x in r]) > np.mean([max(1 / x, 1.0) for x in r]) * (1 + same_speed)


@settings(max_examples=300, deadline=None)
@given(incumbent=mixes, pick=mixes, same_speed=shares, batches=st.sampled_from([[1], [8], [1, 8]]))
def test_properties_of_keeping_a_choice(incumbent, pick, same_speed, batches):
    chosen = sensitivity.keep_or_replace(incumbent, pick, batches, same_speed)
    assert chosen is None or chosen is incumbent or chosen is pick
    # The kept choice passes, and there is one whenever either passes.
    assert (chosen is None) == (not incumbent.passed and not pick.passed)
    assert chosen is None or chosen.passed
    # A failing incumbent is always replaced by a passing pick.
    if not incumbent.passed and pick.passed:
        assert chosen is pick
    if incumbent.passed and pick.passed:
        # A challenger that is not faster beyond same_speed never replaces a passing incumbent; one that is, does.
        assert (chosen is pick) == bool(_slower_beyond_noise(incumbent, pick, batches, same_speed))


@settings(max_examples=300, deadline=None)
@given(incumbent=mixes, pick=mixes, same_speed=shares, slower=st.floats(min_value=1.0, max_value=10.0))
def test_a_slower_challenger_never_wins_where_a_faster_one_did_not(incumbent, pick, same_speed, slower):
    """Monotone in the challenger's speed: timing it slower (noise the other way) cannot flip a kept choice."""
    if sensitivity.keep_or_replace(incumbent, pick, [1, 8], same_speed) is not incumbent:
        return
    retimed = _mix(len(pick.high), pick.result["status"], pick.latency_ms[1] * slower, pick.latency_ms[8] * slower)
    assert sensitivity.keep_or_replace(incumbent, retimed, [1, 8], same_speed) is incumbent


def test_speed_gate_message_says_when_the_cpu_has_no_int8_dot_product():
    from pipeline.reports import tune_report

    payload = {"chosen": {"runtime": {"/a/Conv": "u8", "/b/Conv": "f32", "/fc/Gemm": "f32"}},
               "speedup_vs_fp32": {"1": 0.9, "8": 1.4}, "int8_dot_product": False}
    line = tune_report.speed_failure(payload, 1.2)
    assert line.startswith("INT8 is no faster than FP32 here: 2 of 3 layers run in FP32 (/b/Conv, /fc/Gemm)")
    assert "no VNNI/AMX" in line and "x0.90 at batch 1" in line
    assert tune_report.speed_failure(payload, None) == ""  # off
    assert tune_report.speed_failure({**payload, "speedup_vs_fp32": {"1": 1.3, "8": 1.4}}, 1.2) == ""
