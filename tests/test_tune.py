"""python -m pipeline tune: the sensitivity search keeps more layers in INT8 than greedy fallback and still passes,
the chosen mix round-trips through export/build/verify, the sensitivity table is reproducible, and the speed
gate fails (naming the layers) where the INT8 artifact cannot be faster. tune's decisions on plain data (search,
choice, re-run rule, speed gate): tests/test_tune_rules.py."""

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from conftest import ROOT, cli, copy_run, listed, trained_and_exported
from pipeline.core import artifacts
from pipeline.precision import fp16, int8

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
    _roles_are_disjoint(run, report)
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


def _roles_are_disjoint(run: Path, report: dict) -> None:
    """Issue 48: by default calibration (the training split), tune's search and the verdict (verify's and tune's
    held-out confirmation) are disjoint: the indices and content hashes recorded in the run directory do not
    intersect, and verify.json says so. On the planted decoy the held-out confirmation agrees with the search, or
    tune.md shows the difference."""
    calibration = json.loads((run / "calibration_images.json").read_text())
    search = json.loads((run / "search_images.json").read_text())
    verdict = json.loads((run / "verify.json").read_text())["images"]
    keys = {name: {(entry["split"], i) for i in entry["indices"]} for name, entry in
            [*((f"{p} calibration", e) for p, e in calibration.items() if e.get("calibrated", True)),
             ("search", search), ("verdict", verdict["verdict"])]}
    hashes = {name: set(entry["sha256_16"]) for name, entry in
              [*((f"{p} calibration", e) for p, e in calibration.items() if e.get("calibrated", True)),
               ("search", search), ("verdict", verdict["verdict"])]}
    assert {"int8 calibration", "fp16 calibration", "search", "verdict"} <= keys.keys()
    for role in keys.keys() - {"verdict"}:
        assert not keys[role] & keys["verdict"] and not hashes[role] & hashes["verdict"], role
    assert not keys["search"] & keys["int8 calibration"]
    assert verdict["held_out"]["status"] == "held out", verdict["held_out"]
    assert set(verdict["held_out"]["checked"]) >= {"int8 calibration", "tune search"}
    held = report["held_out_confirmation"]
    assert held["ran"] and held["images"] == len(verdict["verdict"]["indices"])
    assert held["held_out"]["status"] == "held out"
    assert "Held-out confirmation" in (run / "tune.md").read_text()
    if not held["agrees"]:
        assert "differs from the search's" in (run / "tune.md").read_text()


def test_all_tune_keeps_the_previous_choice_and_a_second_identical_run_reruns_nothing(trained, tmp_path):
    """Issue 30, §3: a second identical `all --tune` re-ran tune (its fingerprint held export's run id, and export
    re-runs after tune to apply its choice), and its choice flipped on timing noise, re-running export, build, verify
    and benchmark. Here int8_fallback.json holds a passing mix (greedy's two layers): the fastest new mix is not
    faster beyond tune.same_speed, so tune keeps it; the second identical run then re-runs no stage."""
    run = _copy(trained(f"{TUNE_MODELS}:mild_then_severe"), tmp_path)
    previous = ["/early/Conv", "/late/Conv"]
    (run / "int8_fallback.json").write_text(json.dumps({"nodes": previous, "calibration_method": "max"}))
    listed(run, "int8_fallback.json")  # as an earlier tune wrote it
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
    every FP16 node that rounds, keeps only late nodes in FP32 (with their FP32 weights) and passes, where greedy
    keeps the early shift too; with no TensorRT here there is no FP16 target, so speed is not measured and said so,
    and the choice goes to fp16_fallback.json, which export applies."""
    run = _copy(trained(f"{TUNE_MODELS}:mild_then_severe_fp16"), tmp_path)
    assert cli("tune", "--run-dir", run, "--precision", "fp16", *FAST) == 0
    report = _tune(run, "fp16")  # tune.fp16.json: an INT8 tune's tune.json is another file
    assert report["precision"] == "fp16" and report["target"] == "none" and not (run / "tune.json").exists()
    assert "no FP16 deployment target here" in report["speed_not_measured"]
    assert "ladder" not in report  # PTQ/QAT side by side is INT8's: QAT cannot make an FP16 graph
    all_fp16 = next(c for c in report["candidates"] if c["origin"] == "all FP16")
    assert all_fp16["result"]["status"] == "failed"  # the planted fault
    chosen = report["chosen"]
    assert chosen["result"]["status"] == "passed" and chosen["result"]["confirmed"]["status"] == "passed"
    ranked = [r["layer"] for r in report["sensitivity"]["autocast"]]
    assert set(chosen["high"]) == set(ranked[: len(chosen["high"])])  # the top of the ranking
    # The late fault is kept in FP32 and the early, washed-out shift is not. How many of the classifier's nodes must
    # join /Add_1 and /ReduceSum depends on the trained weights, which differ by CPU: two on an AVX-512 Xeon, five
    # (/Mul, /Sub_1, /fc/Gemm too) on an AVX2 EPYC; greedy keeps the early shift as well, seven.
    assert {"/Add_1", "/ReduceSum"} <= set(chosen["high"]) and not {"/Add", "/Sub"} & set(chosen["high"])
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
    assert "Precision tuning (tune, FP16)" in (page := (run / "report.md").read_text())
    assert "QAT" not in page and "INT8" not in (run / "tune.fp16.md").read_text()
    assert cli("tune", "--run-dir", run, "--precision", "fp32") == 2
    assert "tune --precision fp32: choose one of fp16, bf16, int8" in capsys.readouterr().err


def test_speed_gate_fails_and_names_the_layers_when_int8_cannot_be_faster(trained, tmp_path, capsys):
    """Every matrix layer left out of INT8 (export.int8.op_types_to_exclude): the tuned artifact is the FP32
    network, so it cannot be faster than FP32; the speed gate fails with exit 1 and names the layers."""
    run = _copy(trained("tiny_cnn"), tmp_path)
    # tune.qat stays auto: QAT of a graph with no layer in INT8 would only time the same FP32 network again (at these
    # 0.02 s timings noise once made it look 1.6x faster and passed the speed gate), so tune does not run it
    forced = ["export.int8.op_types_to_exclude=[Conv,Gemm]", "tune.min_speedup=1.5"]
    assert cli("tune", "--run-dir", run, *FAST, *forced) == 1
    ladder = _tune(run)["ladder"]
    assert not ladder["qat_ran"] and "puts no layer in INT8" in ladder["qat_why"]
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


def test_timings_that_stay_untrustworthy_end_tune_undecided_and_leave_the_fallback_file_as_it_was(
        trained, tmp_path, monkeypatch, capsys):
    """The stage's undecided path: the two calibrations' "all INT8" mixes compile to the same kernels, so they must
    time alike; here the second one's rounds are made 10x slower every time they are timed (a machine too busy to
    tell mixes apart, made certain). tune times them again RETIMES times, then ends inconclusive: exit 5, tune.json
    saying why, and int8_fallback.json byte for byte as it was."""
    from pipeline import tune

    run = _copy(trained(f"{TUNE_MODELS}:mild_then_severe"), tmp_path)
    fallback = run / "int8_fallback.json"
    fallback.write_text(json.dumps({"nodes": ["/late/Conv"], "calibration_method": "max"}))
    listed(run, "int8_fallback.json")  # as an earlier tune wrote it
    before = fallback.read_bytes()
    real, attempts = tune.time_in_rounds, []

    def skewed(t, rivals, sessions, seed=0):
        real(t, rivals, sessions, seed)
        attempts.append(seed)
        slow = [c for c in rivals if c.origin == "all INT8" and not c.high][-1]
        for batch in t.batches:
            slow.rounds[batch] = [ms * 10 for ms in slow.rounds[batch]]
            slow.latency_ms[batch] *= 10

    monkeypatch.setattr(tune, "time_in_rounds", skewed)
    rc = cli("tune", "--run-dir", run, *FAST, "tune.calibration_methods=[max,entropy]", "tune.same_speed=0.5")
    err = capsys.readouterr().err
    assert rc == 5, err
    assert attempts == list(range(1 + tune.RETIMES))  # timed, then timed again RETIMES times
    assert fallback.read_bytes() == before
    assert "undecided" in err and "int8_fallback.json is unchanged" in err
    report = _tune(run)
    assert report["chosen"] is None or not report["chosen"].get("high")
    assert "undecided" in json.dumps(report)
