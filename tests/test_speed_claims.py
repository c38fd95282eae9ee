"""Speed claims under noise (pipeline.core.speed_claims): per-round ratios and their intervals, the verdicts
(faster / same speed / slower / undecided), the choice among rivals (ties to the most layers in the low precision),
the sanity rule, and the interleaved order; tune's use of them on plain data (the planted FP32-as-INT8 case)."""

import dataclasses
import json
import math
import random
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import benchmark_row
from pipeline.core import speed_claims
from pipeline.core.benchmark_rows import CrossCheck
from pipeline.core.speed_claims import Ratio, Speed
from pipeline.precision.sensitivity import MethodRun

FAST = settings(max_examples=200, deadline=None)
latencies = st.lists(st.floats(0.01, 100.0), min_size=3, max_size=20)
shares = st.floats(0.0, 1.0)


def ratios() -> st.SearchStrategy[Ratio]:
    """Any ratio with a well-formed interval: 0 < low <= estimate <= high."""
    return st.builds(lambda est, down, up, n: Ratio(est, est / down, est * up, n),
                     st.floats(0.05, 20), st.floats(1.0, 5.0), st.floats(1.0, 5.0), st.integers(1, 50))


# --------------------------------------------------------------------------- ratios and intervals


@FAST
@given(latencies, st.floats(0.1, 10.0))
def test_a_constant_ratio_in_every_round_is_that_ratio_with_no_width(rival, k):
    r = speed_claims.ratio([k * x for x in rival], rival)
    assert r.estimate == pytest.approx(k) and r.low == pytest.approx(k) and r.high == pytest.approx(k)
    assert r.rounds == len(rival)


@FAST
@given(st.lists(st.tuples(st.floats(0.01, 100.0), st.floats(0.01, 100.0)), min_size=3, max_size=20))
def test_the_interval_holds_the_estimate_and_swapping_the_rivals_inverts_it(pairs):
    a, b = [p[0] for p in pairs], [p[1] for p in pairs]
    r, back = speed_claims.ratio(a, b), speed_claims.ratio(b, a)
    assert r.low <= r.estimate * (1 + 1e-9) and r.estimate <= r.high * (1 + 1e-9)
    assert back.estimate == pytest.approx(1 / r.estimate)
    assert back.low == pytest.approx(1 / r.high) and back.high == pytest.approx(1 / r.low)


def test_too_few_rounds_give_no_interval_and_bad_rounds_are_left_out():
    assert speed_claims.ratio([1.0, 2.0], [1.0, 1.0]).high == math.inf
    assert speed_claims.verdict(speed_claims.ratio([1.0, 1.0], [2.0, 2.0]), 0.05) is Speed.UNDECIDED
    r = speed_claims.ratio([1.0, math.nan, 0.0, 1.0, 1.0, 1.0], [2.0, 2.0, 2.0, 2.0, math.inf, 2.0])
    assert r.rounds == 3 and r.estimate == pytest.approx(0.5)
    assert speed_claims.ratio([], []) is speed_claims.UNKNOWN
    assert speed_claims.verdict(speed_claims.UNKNOWN, 0.05) is Speed.UNDECIDED
    with pytest.raises(ValueError):
        speed_claims.ratio([1.0], [1.0, 2.0])  # rounds pair up, or nothing does


def test_the_interval_is_the_student_t_interval_of_the_mean_log_ratio():
    a, b = [1.0, 1.1, 0.9, 1.05], [2.0, 2.0, 2.0, 2.0]
    logs = np.log(np.array(a) / np.array(b))
    half = 3.182446305284263 * logs.std(ddof=1) / 2  # t(0.975, 3 degrees of freedom), sqrt(4)
    r = speed_claims.ratio(a, b)
    assert r.estimate == pytest.approx(math.exp(logs.mean()))
    assert (r.low, r.high) == pytest.approx((math.exp(logs.mean() - half), math.exp(logs.mean() + half)))


# --------------------------------------------------------------------------- verdicts


@FAST
@given(ratios(), shares)
def test_verdicts_follow_the_interval(r, s):
    said = speed_claims.verdict(r, s)
    inside = 1 / (1 + s) <= r.low and r.high <= 1 + s
    assert (said is Speed.SAME) == inside
    if said is Speed.FASTER:
        assert r.high < 1
    if said is Speed.SLOWER:
        assert r.low > 1
    if said is Speed.UNDECIDED:
        assert r.low <= 1 <= r.high and not inside
    if r.high < 1 and not inside:
        assert said is Speed.FASTER


@FAST
@given(ratios(), shares)
def test_a_verdict_turns_around_with_the_ratio(r, s):
    flipped = {Speed.FASTER: Speed.SLOWER, Speed.SLOWER: Speed.FASTER}
    said = speed_claims.verdict(r, s)
    assert speed_claims.verdict(r.inverse(), s) is flipped.get(said, said)


@FAST
@given(ratios(), shares, st.floats(0.0, 1.0))
def test_a_wider_band_never_undoes_same_speed(r, s, more):
    if speed_claims.verdict(r, s) is Speed.SAME:
        assert speed_claims.verdict(r, s + more) is Speed.SAME


def test_verdicts_by_hand():
    assert speed_claims.verdict(Ratio(0.5, 0.45, 0.55, 15), 0.05) is Speed.FASTER
    assert speed_claims.verdict(Ratio(1.0, 0.98, 1.03, 15), 0.05) is Speed.SAME
    assert speed_claims.verdict(Ratio(0.97, 0.90, 1.02, 15), 0.05) is Speed.UNDECIDED  # holds 1, wider than 5 %
    assert speed_claims.verdict(Ratio(0.97, 0.96, 0.98, 15), 0.05) is Speed.SAME  # faster, but within the noise
    assert speed_claims.verdict(Ratio(2.0, 1.5, 2.5, 15), 0.05) is Speed.SLOWER
    assert speed_claims.verdict(Ratio(1.0, 1.0, 1.0, 15), 0.0) is Speed.SAME


@FAST
@given(st.dictionaries(st.sampled_from([1, 8, 32]), ratios(), min_size=1), shares)
def test_two_rivals_never_beat_each_other(by_batch, s):
    assert not (speed_claims.beats(by_batch, s) and speed_claims.beats({b: r.inverse() for b, r in by_batch.items()},
                                                                       s))


def test_beats_needs_a_win_and_no_loss_or_doubt():
    fast, same, slow, doubt = (Ratio(0.5, 0.45, 0.55, 9), Ratio(1, 0.99, 1.01, 9), Ratio(2, 1.8, 2.2, 9),
                               Ratio(1, 0.5, 2, 9))
    assert speed_claims.beats({1: fast, 8: same}, 0.05)
    assert not speed_claims.beats({1: fast, 8: slow}, 0.05)
    assert not speed_claims.beats({1: fast, 8: doubt}, 0.05)
    assert not speed_claims.beats({1: same}, 0.05) and not speed_claims.beats({}, 0.05)


# --------------------------------------------------------------------------- the choice


def _table(n: int, seed: int) -> dict:
    """Random ratios between n rivals, consistent by construction (the ratio of b over a is a's inverted)."""
    rng = random.Random(seed)
    table = {}
    for i in range(n):
        for j in range(i + 1, n):
            est = math.exp(rng.uniform(-1, 1))
            r = Ratio(est, est / rng.uniform(1, 2), est * rng.uniform(1, 2), 10)
            table[(i, j)], table[(j, i)] = {1: r}, {1: r.inverse()}
    return table


@FAST
@given(st.integers(1, 7), st.integers(0, 2**31), st.lists(st.integers(0, 5), min_size=7, max_size=7), shares)
def test_the_choice_is_unbeaten_and_has_the_most_low_layers_of_its_tie(n, seed, layers, s):
    table = _table(n, seed)
    rivals = list(range(n))
    lower = dict(enumerate(layers))
    choice = speed_claims.choose(rivals, lambda a, b: table[(a, b)], lower, s)
    for c in choice.tie:  # nobody beats a member of the tie
        assert not any(speed_claims.beats(table[(d, c)], s) for d in rivals if d != c)
    for c, winner in choice.beaten_by.items():  # everyone left out is beaten, by the rival named
        assert speed_claims.beats(table[(winner, c)], s)
    assert set(choice.tie) | set(choice.beaten_by) == set(rivals) and not set(choice.tie) & set(choice.beaten_by)
    if choice.tie:
        assert choice.pick in choice.tie and lower[choice.pick] == max(lower[c] for c in choice.tie)
        assert choice.pick == min((c for c in choice.tie if lower[c] == lower[choice.pick]))
    else:
        assert choice.pick is None


@FAST
@given(st.lists(st.integers(0, 5), min_size=1, max_size=6), st.integers(0, 2**31))
def test_rivals_that_time_alike_tie_and_the_most_low_layers_win(layers, seed):
    """Noise alone (every ratio holds 1) never picks a winner: the tie goes to the most layers in INT8."""
    rng = random.Random(seed)
    same = {1: Ratio(1.0, 1 / rng.uniform(1, 1.5), rng.uniform(1, 1.5), 10)}
    choice = speed_claims.choose(list(range(len(layers))), lambda a, b: same, dict(enumerate(layers)), 0.05)
    assert len(choice.tie) == len(layers) and choice.pick == layers.index(max(layers))


def test_a_clear_winner_is_a_tie_of_one():
    table = {("a", "b"): {1: Ratio(0.5, 0.45, 0.55, 9)}, ("b", "a"): {1: Ratio(2, 1 / 0.55, 1 / 0.45, 9)}}
    choice = speed_claims.choose(["a", "b"], lambda x, y: table[(x, y)], {"a": 1, "b": 3}, 0.05)
    assert choice.pick == "a" and choice.tie == ("a",) and choice.beaten_by == {"b": "a"}


# --------------------------------------------------------------------------- the sanity rule and the rounds


@FAST
@given(st.dictionaries(st.sampled_from([1, 8]), ratios(), min_size=1), shares)
def test_twins_are_sane_unless_one_is_found_faster_or_slower(by_batch, s):
    found = {speed_claims.verdict(r, s) for r in by_batch.values()}
    assert speed_claims.sane(by_batch, s) == (not found & {Speed.FASTER, Speed.SLOWER})


@FAST
@given(st.integers(1, 6), st.integers(1, 20), st.integers(0, 2**31))
def test_every_round_runs_every_rival_once_in_a_reproducible_order(rivals, rounds, seed):
    orders = speed_claims.round_orders(rivals, rounds, seed)
    assert len(orders) == rounds and all(sorted(o) == list(range(rivals)) for o in orders)
    assert orders == speed_claims.round_orders(rivals, rounds, seed)


def test_orders_are_shuffled_not_fixed():
    orders = speed_claims.round_orders(3, 30, 0)
    assert len({tuple(o) for o in orders}) > 1 and {o[0] for o in orders} == {0, 1, 2}


@FAST
@given(st.integers(0, 2**31), st.floats(1.5, 3.0))
def test_drift_shared_by_a_round_cancels_and_a_real_difference_shows(seed, factor):
    """A machine whose speed changes from round to round (x1 to x5) slows both rivals of a round alike: the ratio
    of two twins stays the same speed, and a rival ``factor`` times slower is found slower."""
    rng = np.random.default_rng(seed)
    drift = rng.uniform(1, 5, 15)
    a = drift * rng.uniform(0.99, 1.01, 15)
    twin = drift * rng.uniform(0.99, 1.01, 15)
    slow = factor * drift * rng.uniform(0.99, 1.01, 15)
    assert speed_claims.verdict(speed_claims.ratio(twin, a), 0.05) is Speed.SAME
    assert speed_claims.verdict(speed_claims.ratio(slow, a), 0.05) is Speed.SLOWER
    assert float(speed_claims.speedup_text(speed_claims.ratio(a, slow))[1:].split()[0]) == pytest.approx(factor,
                                                                                                  rel=0.02)


def test_speedup_text_gives_the_interval():
    assert speed_claims.speedup_text(Ratio(0.5, 0.4, 0.625, 9)) == "x2.00 [1.60, 2.50]"
    assert speed_claims.speedup_text(Ratio(0.5, 0.5, 0.5, 0)) == "x? (not timed in rounds)"


# --------------------------------------------------------------------------- tune: no INT8 claim without INT8


def _tuner(batches=(1, 8)):
    from pipeline.precision import plugs
    from pipeline.tune import SpeedTarget

    return SimpleNamespace(plug=plugs.PLUGS["int8"], batches=list(batches), sens_labels=[0] * 4,
                           evidence=SimpleNamespace(labels=[0] * 8), target=SpeedTarget("OpenVINO CPU"),
                           timing=SimpleNamespace(warmup_s=0, min_duration_s=0.1, trials=1, min_iterations=3),
                           seconds={}, sanity={})


def _config():
    from pipeline.core.config_schema import Config

    return Config.model_validate({"model": {"name": "tiny_cnn"}})


def _timed(cand, rounds: dict) -> None:
    cand.session, cand.rounds = 1, rounds
    cand.latency_ms = {b: float(np.median(v)) for b, v in rounds.items()}


@pytest.mark.parametrize("runtime, claimed", [({"/a/Conv": "f32", "/b/Conv": "f32", "/fc/Gemm": "f32"}, False),
                                              ({"/a/Conv": "u8", "/b/Conv": "f32", "/fc/Gemm": "f32"}, True)])
def test_a_mix_the_target_runs_with_no_int8_layer_gets_no_int8_speedup(runtime, claimed):
    """The planted case of issue 45: the mix runs in FP32 (every layer, by the target's own account), and noise made
    it look x2.08 faster than FP32. No INT8 result, no speed-up: the summary says it is the FP32 network and the
    speed gate fails; one layer in INT8 and the same rounds give the speed-up, with its interval."""
    from pipeline.precision.sensitivity import Candidate
    from pipeline.reports import tune_report

    fp32 = Candidate([], "FP32 reference", {"status": "passed"})
    mix = Candidate(["/b/Conv", "/fc/Gemm"] if claimed else ["/a/Conv", "/b/Conv", "/fc/Gemm"], "top-2",
                    {"status": "passed"}, calibration="max", runtime=runtime)
    rng = np.random.default_rng(0)
    base = {b: list(rng.uniform(0.17, 0.19, 15) * b) for b in (1, 8)}
    _timed(fp32, base)
    _timed(mix, {b: [x / 2.08 for x in v] for b, v in base.items()})
    layers = ["/a/Conv", "/b/Conv", "/fc/Gemm"]
    ranked = [SimpleNamespace(layer=n, op_type="Conv", score=0.0, alone={}, all_but={}) for n in layers]
    runs = [MethodRun("max", layers, {}, ranked, [mix], None)]
    p = tune_report.payload(_config(), _tuner(), runs, fp32, mix, "why", {})
    if claimed:
        assert p.speedup_vs_fp32["1"] == pytest.approx(2.08) and "x2.08 [2.08, 2.08] at batch 1" in p.summary
        assert tune_report.speed_failure(p, 1.0) == ""
        return
    assert p.speedup_vs_fp32 == {} and p.speedup_interval_vs_fp32 == {}
    assert "x2.08" not in p.summary and "INT8:" not in p.summary
    assert p.summary.startswith("no INT8 layer: the target runs none of the 3 layers in INT8")
    failure = tune_report.speed_failure(p, 1.0)
    assert "INT8 is no faster than FP32 here: 3 of 3 layers run in FP32" in failure and "no INT8 speed-up" in failure
    assert tune_report.speed_failure(p, None) == ""  # --no-speed-gate: reported, not gated


def test_a_speedup_whose_interval_holds_the_minimum_is_undecided_not_passed():
    from pipeline.reports import tune_report
    from test_tune_result import made

    p = {"precision": "int8", "chosen": {"runtime": {"/a/Conv": "u8"}}, "batches": [1], "same_speed": 0.05,
         "speedup_vs_fp32": {"1": 1.1}, "int8_dot_product": True,
         "speedup_interval_vs_fp32": {"1": {"estimate": 1.1, "low": 0.7, "high": 1.6, "rounds": 15}}}
    assert tune_report.speed_failure(made(**p), 1.0) == ""
    assert "the speed gate is undecided: the speed-up over FP32 is x1.10 [0.70, 1.60]" in \
        tune_report.speed_in_doubt(made(**p), 1.0)
    decided = {**p, "speedup_interval_vs_fp32": {"1": {"estimate": 1.1, "low": 1.0, "high": 1.2, "rounds": 15}}}
    assert tune_report.speed_in_doubt(made(**decided), 1.0) == ""
    assert tune_report.speed_failure(made(**decided), 1.0) == ""
    below = {**p, "speedup_interval_vs_fp32": {"1": {"estimate": 0.8, "low": 0.7, "high": 0.9, "rounds": 15}}}
    assert "x0.80 [0.70, 0.90] at batch 1, below tune.min_speedup 1" in tune_report.speed_failure(made(**below), 1.0)


# --------------------------------------------------------------------------- benchmark: the headline and benchmark_app


@FAST
@given(ratios())
def test_benchmark_app_agreement_reads_the_interval_against_the_band(r):
    from pipeline.runtime.speed import benchmark_app

    said = benchmark_app.agreement(r)
    band = (1 / benchmark_app.FLAG_RATIO, benchmark_app.FLAG_RATIO)
    assert (said == "agree") == (band[0] <= r.low and r.high <= band[1])
    assert (said == "far apart") == (r.high < band[0] or r.low > band[1])
    assert benchmark_app.agreement(r.inverse()) == said  # ours over theirs or theirs over ours: the same answer


def test_benchmark_app_alternates_with_our_timing_and_pairs_the_rounds():
    from pipeline.runtime.speed import benchmark_app

    calls, load = [], iter([1.0, 1.0, 2.0, 2.0, 1.0, 1.0])  # the machine's speed, one value per call in order

    def ours() -> float:
        calls.append("ours")
        return 0.3 * next(load)

    def theirs() -> benchmark_app.AppRun:
        calls.append("theirs")
        ms = 0.3 * next(load)
        return benchmark_app.AppRun(p50_ms=ms, mean_ms=ms, throughput_per_s=1000 / ms, iterations=10, requests=1,
                                    api="sync")

    row = benchmark_row("openvino_int8", 1, 0.3)
    got = benchmark_app.interleaved(row, "latency", theirs, ours, rounds=3)
    assert calls.count("ours") == calls.count("theirs") == 3
    assert all({calls[2 * i], calls[2 * i + 1]} == {"ours", "theirs"} for i in range(3))  # one of each per round
    assert got["agreement"] == "agree" and got["interval"]["low"] == pytest.approx(1.0)  # the load cancels
    assert "medians of 3 interleaved rounds; ratio 1.00 [1.00, 1.00]" in got["summary"]


def test_the_headline_names_a_tie_and_doubts_a_row_benchmark_app_does_not_confirm():
    from pipeline import benchmark

    def row(name, p50, images, batch):
        return benchmark_row(name, batch, p50, images, timing="wall-clock")

    results = [row("openvino_int8", 0.26, 3800, 1), row("onnxrt_fp32", 0.27, 3700, 1),
               row("openvino_int8", 3.0, 10000, 32), row("onnxrt_fp32", 9.0, 3500, 32)]
    tie = {"cpu/latency": benchmark.Contest(1, 6, ["openvino_int8", "onnxrt_fp32"], ["openvino_int8", "onnxrt_fp32"],
                                            [benchmark.Rival("onnxrt_fp32", Ratio(1.04, 0.9, 1.2, 6), "undecided")])}
    text = benchmark._headline(results, tie, {})
    assert text.startswith("cpu: tied for fastest that passed the gate (within the noise: openvino_int8, "
                           "onnxrt_fp32) at batch 1")
    assert "onnxrt_fp32 undecided (time ratio 1.04 [0.90, 1.20])" in text
    clear = {"cpu/latency": dataclasses.replace(tie["cpu/latency"], tie=["openvino_int8"])}
    assert benchmark._headline(results, clear, {}).startswith("cpu: fastest that passed the gate at batch 1")
    doubt = {"rows": [{"backend": "openvino_int8", "batch_size": 1, "mode": "latency", "agreement": "far apart",
                       "summary": "p50 0.301 ms (ours) vs 0.570 ms (benchmark_app)"}]}
    assert "(in doubt: benchmark_app far apart: p50 0.301 ms (ours) vs 0.570 ms" in \
        benchmark._headline(results, clear, CrossCheck.model_validate(doubt))
    agreed = {"rows": [{**doubt["rows"][0], "agreement": "agree"}]}
    assert "in doubt" not in benchmark._headline(results, clear, CrossCheck.model_validate(agreed))


def test_the_headlines_speedup_over_eager_comes_with_its_bootstrap_interval():
    from pipeline import benchmark

    rng = np.random.default_rng(0)

    def row(name, ms, verify="passed"):
        samples = list(ms * rng.uniform(0.95, 1.05, 200))
        return benchmark_row(name, 1, float(np.median(samples)), 1000.0 / float(np.mean(samples)), verify=verify,
                             timing="wall-clock", samples_ms=samples)

    results = [row("torch_fp32", 4.0, "reference"), row("openvino_int8", 0.2)]
    line = benchmark._headline(benchmark.add_ratios(results))
    got = line.split("(")[1]
    ratio, low, high = float(got.split("x")[0]), float(got.split("[")[1].split(",")[0]), \
        float(got.split(", ")[1].split("]")[0])
    assert low <= 20.0 <= high and low < ratio < high and "by bootstrap, timed apart" in line


def test_every_rows_speedup_over_eager_carries_its_interval_into_the_table_and_benchmark_json():
    from pipeline import benchmark
    from pipeline.core.benchmark_rows import BenchmarkRow
    from pipeline.reports import tables

    rng = np.random.default_rng(1)

    def row(name, ms, verify="passed"):
        samples = list(ms * rng.uniform(0.95, 1.05, 200))
        return benchmark_row(name, 1, float(np.median(samples)), 1000.0 / float(np.mean(samples)), verify=verify,
                             timing="wall-clock", samples_ms=samples)

    eager, fast, slow = benchmark.add_ratios([row("torch_fp32", 4.0, "reference"), row("openvino_int8", 0.2),
                                              row("onnxrt_fp32", 8.0)])
    assert eager.vs_eager == 1.0 and eager.vs_eager_interval is None  # eager over itself: no interval to give
    assert "vs_eager_interval" not in eager.to_json()  # and none written
    for r, truth in ((fast, 20.0), (slow, 0.5)):
        low, high = r.vs_eager_interval
        assert low <= truth <= high and low < r.vs_eager < high and high / low < 1.2
        cells = [c.text for c in tables._benchmark_row(r)]
        assert f"{r.vs_eager:.2f}x [{low:.2f}, {high:.2f}]" in cells
        assert BenchmarkRow.model_validate(json.loads(json.dumps(r.to_json()))) == r  # written and read back
    assert "1.00x" in [c.text for c in tables._benchmark_row(eager)]


# --------------------------------------------------------------------------- tune's sanity rules on its rounds


def _rival(origin: str, calibration: str, rounds: list[float], kernels=(("Convolution", "f32", "brgconv"), 1)):
    from pipeline.precision.sensitivity import Candidate

    cand = Candidate([] if "INT8" in origin else ["a", "b"], origin, {"status": "passed"}, calibration=calibration)
    cand.session, cand.rounds, cand.kernels = 1, {1: rounds}, (kernels,)
    cand.latency_ms = {1: float(np.median(rounds))}
    return cand


def test_twins_that_time_apart_make_the_timings_untrustworthy_and_other_networks_are_not_twins():
    from pipeline.tune import FP32_REFERENCE, speed_sanity

    drift = np.random.default_rng(1).uniform(1, 3, 15)
    fp32 = _rival(FP32_REFERENCE, "", list(drift))
    low_max = _rival("all INT8", "max", list(0.5 * drift))
    low_entropy = _rival("all INT8", "entropy", list(0.5 * drift))
    apart = _rival("all high", "max", list(1.3 * drift))  # "faster" FP32: the machine invented a difference
    got = speed_sanity([fp32, low_max, low_entropy, apart], [1], 0.05, "INT8")
    assert not got.trustworthy
    assert [c.sane for c in got.checks] == [False, True] and all(c.checked for c in got.checks)
    assert "all high (max) over FP32 reference: 1.30 [1.30, 1.30] at batch 1 (they compile to the same kernels" in \
        got.checks[0].text
    # The same timings, but the target runs "all high" with another kernel (a Q/DQ left on the pool): not twins.
    other = _rival("all high", "max", list(1.3 * drift), kernels=(("Reduce", "i8", "jit_avx512_i8"), 1))
    got = speed_sanity([fp32, low_max, low_entropy, other], [1], 0.05, "INT8")
    assert got.trustworthy and not got.checks[0].checked
    assert "not checked: the target compiles them to different kernels (+ Reduce/i8/jit_avx512_i8 x1; - " \
           "Convolution/f32/brgconv x1)" in got.checks[0].text
    # Wide noise that holds 1 invented no difference: undecided twins keep the timings trustworthy.
    noisy = _rival("all high", "max", list(drift * np.random.default_rng(2).uniform(0.5, 2, 15)))
    assert speed_sanity([fp32, noisy], [1], 0.05, "INT8").trustworthy
