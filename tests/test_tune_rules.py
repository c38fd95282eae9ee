"""tune's decisions, each a function of plain data (pipeline/precision/sensitivity.py): the sensitivity score and
ranking, the search, the Pareto front, the choice, its confirmation and the speed gate; and the graph surgery that
cuts a mix, on a two-layer Q/DQ graph built here. Properties against oracles written another way; milliseconds.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from pipeline.core.check_results import Bound, Judgement, TaskCheck, TensorCheck
from pipeline.precision import plugs, qat_rung, sensitivity
from pipeline.precision.sensitivity import Candidate
from pipeline.precision.tune_result import GateNumbers

FAST = settings(max_examples=120, deadline=None)


def cand(high: int, status: str = "passed", ms: dict | None = None, drop: float = 0.0, error: float = 0.1,
         calibration: str = "max") -> Candidate:
    return Candidate([f"l{i}" for i in range(high)], f"top-{high}", {"status": status, "scaled_error": error,
                     "accuracy_drop": drop}, latency_ms=dict(ms or {}), calibration=calibration)


mixes = st.lists(st.builds(lambda high, ok, a, b, drop, err: cand(high, "passed" if ok else "failed", {1: a, 8: b},
                                                                    drop, err),
                           st.integers(0, 6), st.booleans(), st.floats(0.1, 10), st.floats(0.1, 10),
                           st.floats(-0.05, 0.2), st.floats(0, 2)), max_size=8)


# --------------------------------------------------------------------------- sensitivity


def _n(scaled_error) -> GateNumbers:
    return GateNumbers(scaled_error=scaled_error)


def test_score_is_the_error_alone_plus_what_raising_it_recovers():
    assert sensitivity.score(_n(0.3), _n(0.5), _n(0.9)) == pytest.approx(0.7)
    assert sensitivity.score(_n(0.3), _n(1.2), _n(0.9)) == pytest.approx(0.3)
    assert sensitivity.score(_n(None), _n(0.0), _n(0.0)) == 1e9
    assert sensitivity.score(_n(math.inf), _n(0.0), _n(0.0)) == 1e9
    assert sensitivity.score(_n(0.1), _n(math.nan), _n(0.5)) == \
        pytest.approx(0.1)  # a non-finite all-but error is "very large": it recovers nothing


@FAST
@given(st.floats(0, 5), st.floats(0, 5), st.floats(0, 5), st.floats(0, 1))
def test_score_grows_with_the_error_alone_and_with_what_raising_recovers(alone, all_but, all_low, more):
    base = sensitivity.score(_n(alone), _n(all_but), _n(all_low))
    assert sensitivity.score(_n(alone + more), _n(all_but),
                             _n(all_low)) >= base
    assert sensitivity.score(_n(alone), _n(max(0.0, all_but - more)),
                             _n(all_low)) >= base
    assert base >= alone


def test_measure_judges_each_layer_alone_and_all_but_and_ranks_most_sensitive_first():
    layers = ["a", "b", "c"]
    errors = {"a": 0.1, "b": 0.4, "c": 0.1}
    calls = []

    def evaluate(high: set) -> GateNumbers:
        calls.append(frozenset(high))
        low = set(layers) - high
        return _n(sum(errors[x] for x in low))

    ranked = sensitivity.measure(layers, {"a": "Conv", "b": "Gemm"}, evaluate, _n(0.6))
    assert [r.layer for r in ranked] == ["b", "a", "c"]  # a and c tie: graph order
    assert ranked[0].op_type == "Gemm" and ranked[2].op_type == ""
    assert ranked[0].alone.scaled_error == 0.4 and ranked[0].all_but.scaled_error == 0.2
    assert ranked[0].score == pytest.approx(0.4 + 0.4)
    assert set(calls) == {frozenset({"b", "c"}), frozenset({"a"}), frozenset({"a", "c"}), frozenset({"b"}),
                          frozenset({"a", "b"}), frozenset({"c"})}


# --------------------------------------------------------------------------- the search


def run_search(n: int, passes) -> tuple[list[Candidate], list[int]]:
    ranked = [f"layer{i}" for i in range(n)]
    judged: list[int] = []

    def judge(high, origin):
        judged.append(len(high))
        return Candidate(list(high), origin, {"status": "passed" if passes(len(high)) else "failed"})

    return sensitivity.search(ranked, judge, lowest="all low"), judged


@FAST
@given(st.integers(1, 40), st.integers(0, 41))
def test_search_finds_the_smallest_passing_k_of_a_monotone_gate(n, threshold):
    found, judged = run_search(n, lambda k: k >= threshold)
    assert 0 in judged and n in judged  # both extremes always
    assert len(judged) == len(set(judged))  # no mix judged twice
    passing = [len(c.high) for c in found if c.passed]
    if threshold > n:
        assert passing == []
    else:
        assert min(passing) == threshold  # the bisection ran to its end, not one step
        assert threshold - 1 < 0 or threshold - 1 in judged or threshold == 0  # the neighbour below was confirmed
        if threshold < n and threshold > 0:
            assert threshold + 1 in judged  # and the one above
    assert len(judged) <= 2 * math.ceil(math.log2(n + 1)) + 4
    assert [len(c.high) for c in found] == sorted(judged)
    assert found[0].origin == "all low" and found[-1].origin == "all high"
    assert all(c.origin == f"top-{len(c.high)}" for c in found[1:-1])


def test_search_keeps_its_invariant_when_the_gate_is_not_monotone():
    """A pass at k = 6, 7 that bisection steps over is not searched for: the answer is the first passing k of the
    bisection, its neighbour below judged and failing."""
    found, judged = run_search(16, lambda k: k >= 9 or k in (6, 7))
    assert min(len(c.high) for c in found if c.passed and len(c.high) >= 8) == 9
    assert 8 in judged and 10 in judged


def test_search_stops_at_the_extremes():
    found, judged = run_search(8, lambda k: True)
    assert sorted(judged) == [0, 8] and found[0].passed
    found, judged = run_search(8, lambda k: False)
    assert sorted(judged) == [0, 8] and not any(c.passed for c in found)


# --------------------------------------------------------------------------- the Pareto front and the choice


def dominated(c: Candidate, others: list[Candidate], batch: int) -> bool:
    a = (c.result["accuracy_drop"], c.latency_ms[batch])
    return any((o.result["accuracy_drop"], o.latency_ms[batch]) != a and o.result["accuracy_drop"] <= a[0]
               and o.latency_ms[batch] <= a[1] for o in others)


@FAST
@given(mixes)
def test_the_front_holds_exactly_the_undominated_mixes_fastest_first(candidates):
    front = sensitivity.pareto(candidates, 1)
    assert all(not dominated(c, candidates, 1) for c in front)
    assert all(any(c is f for f in front) for c in candidates if not dominated(c, candidates, 1))
    assert [c.latency_ms[1] for c in front] == sorted(c.latency_ms[1] for c in front)
    assert sensitivity.pareto(candidates, 4) == []  # nothing timed at batch 4


def point_beats(d: Candidate, c: Candidate, batches: list[int], same_speed: float) -> bool:
    """The rule written on plain latencies (no rounds: a point ratio, no interval): ``d`` is faster or the same speed
    at every batch (``d/c <= 1 + s``) and faster beyond the band at one (``d/c < 1/(1 + s)``)."""
    x = [d.latency_ms[b] / c.latency_ms[b] for b in batches]
    return bool(x) and all(r <= 1 + same_speed for r in x) and any(r < 1 / (1 + same_speed) for r in x)


def oracle_choice(candidates: list[Candidate], batches: list[int], same_speed: float) -> set[int]:
    """The ids of every mix the rule may return (ties on every key are allowed either way)."""
    passing = [c for c in candidates if c.passed and all(b in c.latency_ms for b in batches)]
    if not passing:
        return set()

    def cost(c):
        return sum(c.latency_ms[b] / min(p.latency_ms[b] for p in passing) for b in batches)

    tied = [c for c in passing if not any(point_beats(d, c, batches, same_speed) for d in passing if d is not c)]
    best = min((len(c.high), c.result["scaled_error"], cost(c)) for c in tied)
    return {id(c) for c in tied if (len(c.high), c.result["scaled_error"], cost(c)) == best}


@FAST
@given(mixes, st.sampled_from([[1], [1, 8], []]), st.floats(0, 0.2))
def test_the_choice_is_a_passing_mix_on_the_rule(candidates, batches, same_speed):
    pick = sensitivity.choose(candidates, batches, same_speed)
    allowed = oracle_choice(candidates, batches, same_speed)
    if not allowed:
        assert pick is None
        return
    assert pick is not None and pick.passed and id(pick) in allowed


@FAST
@given(mixes, st.floats(0, 0.2))
def test_the_choice_is_on_the_front_or_tied_with_it(candidates, same_speed):
    pick = sensitivity.choose(candidates, [1], same_speed)
    assume(pick is not None)
    passing = [c for c in candidates if c.passed]
    fastest = min(c.latency_ms[1] for c in passing)
    assert pick.latency_ms[1] <= fastest * (1 + same_speed) + 1e-12  # never slower than the noise allows


def test_choose_by_hand():
    slow, fast, tied = cand(3, ms={1: 2.0, 8: 9.0}), cand(2, ms={1: 1.2, 8: 6.0}), cand(1, ms={1: 1.22, 8: 6.1})
    fail = cand(0, "failed", {1: 1.0, 8: 5.0})
    assert sensitivity.choose([fail, slow, fast], [1, 8]) is fast
    assert sensitivity.choose([fail, slow, fast, tied], [1, 8], same_speed=0.05) is tied
    assert sensitivity.choose([fail, slow, fast, tied], [1, 8], same_speed=0.0) is fast
    assert sensitivity.choose([fail], [1, 8]) is None
    a, b = cand(2, ms={1: 1.0}, error=0.3), cand(2, ms={1: 1.0}, error=0.1)
    assert sensitivity.choose([a, b], [1]) is b  # same layers, same speed: the smaller error
    c, d = cand(2, ms={1: 1.04}), cand(2, ms={1: 1.0})
    assert sensitivity.choose([c, d], [1], same_speed=0.05) is d  # tied, same layers: the faster
    untimed = cand(1, ms={})
    assert sensitivity.choose([untimed, cand(4, ms={})], []) is untimed  # nothing timed: fewest layers raised
    assert sensitivity.choose([untimed], [1]) is None  # not timed where timing counts


def test_confirmation_moves_to_the_next_best_pick_when_the_real_graph_fails():
    first, second, third = cand(1, ms={1: 1.0}), cand(2, ms={1: 1.5}), cand(3, ms={1: 2.0})
    seen = []

    def confirm(pick):
        seen.append(pick)
        return pick is third

    assert sensitivity.confirmed([first, second, third], [1], 0.0, confirm) == (third, 3, third)
    assert seen == [first, second, third]
    assert sensitivity.confirmed([first, second], [1], 0.0, lambda p: False) == (None, 2, None)
    assert sensitivity.confirmed([first], [1], 0.0, lambda p: True) == (first, 1, first)
    assert sensitivity.confirmed([], [1], 0.0, lambda p: True) == (None, 0, None)


def test_an_incumbent_is_kept_within_the_noise_and_dropped_when_its_graph_fails():
    incumbent, faster, much = cand(2, ms={1: 1.03}), cand(1, ms={1: 1.0}), cand(1, ms={1: 0.5})
    assert sensitivity.confirmed([incumbent, faster], [1], 0.05, lambda p: True, incumbent) == \
        (incumbent, 1, faster)
    assert sensitivity.confirmed([incumbent, much], [1], 0.05, lambda p: True, incumbent) == (much, 1, much)
    tried = []
    pick = sensitivity.confirmed([incumbent, faster], [1], 0.05, lambda p: tried.append(p) or p is faster, incumbent)
    assert pick == (faster, 2, faster) and tried == [incumbent, faster]


@FAST
@given(mixes, st.integers(0, 2**31 - 1))
def test_a_confirmed_pick_passed_its_confirmation_and_was_tried_in_the_order_of_the_rule(candidates, seed):
    rng = np.random.default_rng(seed)
    verdicts = {id(c): bool(rng.integers(2)) for c in candidates}
    tried = []

    def confirm(pick):
        tried.append(pick)
        return verdicts[id(pick)]

    pick, count, _ = sensitivity.confirmed(candidates, [1, 8], 0.05, confirm)
    assert count == len(tried) == len({id(t) for t in tried})
    if pick is not None:
        assert verdicts[id(pick)] and pick is tried[-1] and pick.passed
    else:
        assert not any(verdicts[id(c)] for c in candidates if c.passed)


# --------------------------------------------------------------------------- the speed gate


@FAST
@given(st.dictionaries(st.sampled_from([1, 8, 32]), st.floats(0.01, 50), min_size=1),
       st.dictionaries(st.sampled_from([1, 8, 32]), st.floats(0.01, 50), min_size=1))
def test_speedup_is_fp32_time_over_the_mix_time_on_the_common_batches(fp32, mix):
    got = sensitivity.speedups(fp32, mix)
    assert set(got) == set(fp32) & set(mix)
    for b, s in got.items():
        assert s == pytest.approx(fp32[b] / mix[b])
        assert (s > 1) == (mix[b] < fp32[b])  # faster than FP32 is a speed-up above 1


@FAST
@given(st.dictionaries(st.integers(1, 64), st.floats(0.1, 5)), st.floats(0.5, 2))
def test_the_speed_gate_fails_exactly_the_batches_below_the_minimum(speedup, minimum):
    slow = sensitivity.too_slow(speedup, minimum)
    assert slow == {b: s for b, s in speedup.items() if s < minimum}
    assert sensitivity.too_slow(speedup, None) == {} and sensitivity.too_slow(speedup, 0) == {}


def test_the_speed_gate_boundary_and_nan():
    assert sensitivity.too_slow({1: 1.0}, 1.0) == {}
    assert sensitivity.too_slow({1: 0.999}, 1.0) == {1: 0.999}
    assert 1 in sensitivity.too_slow({1: math.nan}, 1.0)


def test_speed_failure_names_the_worst_batch_and_the_layers():
    from pipeline.reports import tune_report
    from test_tune_result import made

    payload = {"precision": "int8", "chosen": {"runtime": {"/a/Conv": "u8", "/b/Conv": "f32", "/fc/Gemm": "f32"}},
               "speedup_vs_fp32": {"1": 0.9, "8": 0.7}, "int8_dot_product": True}
    line = tune_report.speed_failure(made(**payload), 1.0)
    assert "x0.70 (no interval) at batch 8, below" in line and "2 of 3 layers run in FP32" in line
    assert "VNNI" not in line
    assert tune_report.speed_failure(made(**{**payload, "chosen": None}), 1.0) == ""
    assert tune_report.speed_failure(made(**{**payload, "speedup_vs_fp32": {}}), 1.0) == ""  # nothing timed


# --------------------------------------------------------------------------- the mix by graph surgery


def qdq_chain() -> tuple:
    """x -> Q/DQ -> MatMul(w1 via DQ) -> Q/DQ -> MatMul(w2 via DQ) -> y, and its FP32 twin."""
    rng = np.random.default_rng(0)
    w1, w2 = rng.normal(size=(4, 4)).astype(np.float32), rng.normal(size=(4, 4)).astype(np.float32)
    scale, zero = numpy_helper.from_array(np.float32(0.05), "s"), numpy_helper.from_array(np.int8(0), "z")
    q1 = numpy_helper.from_array(np.round(w1 / 0.05).astype(np.int8), "w1_q")
    q2 = numpy_helper.from_array(np.round(w2 / 0.05).astype(np.int8), "w2_q")
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"], name="q_x"),
             helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"], name="dq_x"),
             helper.make_node("DequantizeLinear", ["w1_q", "s", "z"], ["w1_d"], name="dq_w1"),
             helper.make_node("MatMul", ["xd", "w1_d"], ["h"], name="mm1"),
             helper.make_node("QuantizeLinear", ["h", "s", "z"], ["hq"], name="q_h"),
             helper.make_node("DequantizeLinear", ["hq", "s", "z"], ["hd"], name="dq_h"),
             helper.make_node("DequantizeLinear", ["w2_q", "s", "z"], ["w2_d"], name="dq_w2"),
             helper.make_node("MatMul", ["hd", "w2_d"], ["y"], name="mm2")]
    io = ([helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])])
    int8 = helper.make_model(helper.make_graph(nodes, "g", *io, [scale, zero, q1, q2]))
    fp32 = helper.make_model(helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
         helper.make_node("MatMul", ["h", "w2"], ["y"], name="mm2")], "g", *io,
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")]))
    return int8, fp32, w1, w2


def test_unquantize_feeds_a_layer_its_unquantized_input_and_fp32_weight_and_prunes_the_rest():
    int8, fp32, w1, _ = qdq_chain()
    mixed = sensitivity.unquantize(int8, fp32, ["mm1"])
    nodes = {n.name: n for n in mixed.graph.node}
    assert list(nodes["mm1"].input) == ["x", "w1__unquantized"]
    assert "q_x" not in nodes and "dq_x" not in nodes and "dq_w1" not in nodes  # nothing reads them now
    assert {"q_h", "dq_h", "dq_w2", "mm2"} <= set(nodes)  # the other layer keeps its Q/DQ
    inits = {t.name: numpy_helper.to_array(t) for t in mixed.graph.initializer}
    np.testing.assert_array_equal(inits["w1__unquantized"], w1)
    assert inits["w1__unquantized"].dtype == np.float32  # the dequantized type (the scale's)
    assert "w1_q" not in inits and "w2_q" in inits
    assert list(sensitivity.unquantize(int8, fp32, []).graph.node) == list(int8.graph.node)  # nothing raised
    assert len(int8.graph.node) == 8  # the input graph is not changed


def test_unquantize_both_layers_leaves_no_qdq_and_twice_adds_one_weight():
    int8, fp32, _, _ = qdq_chain()
    mixed = sensitivity.unquantize(int8, fp32, ["mm1", "mm2"])
    assert [n.op_type for n in mixed.graph.node] == ["MatMul", "MatMul"]
    again = sensitivity.unquantize(mixed, fp32, ["mm1"])
    assert [t.name for t in again.graph.initializer].count("w1__unquantized") == 1


def test_low_layers_are_the_units_of_each_precision_in_graph_order():
    _, fp32, _, _ = qdq_chain()
    fp32.graph.node.append(helper.make_node("Relu", ["y"], ["r"], name="relu"))
    fp32.graph.node.append(helper.make_node("Add", ["r", "r"], ["a"], name="add"))
    precisions = {"mm1": ("MatMul", "int8"), "mm2": ("MatMul", "fp16"), "relu": ("Relu", "int8"),
                  "add": ("Add", "int8")}
    assert sensitivity.low_layers(fp32, precisions, plugs.INT8) == ["mm1"]
    fp16 = {"mm1": ("MatMul", "fp16"), "mm2": ("MatMul", "fp32"), "relu": ("Relu", "fp16"), "add": ("Add", "fp16")}
    assert sensitivity.low_layers(fp32, fp16, plugs.FP16) == ["mm1", "add"]  # Relu rounds nothing
    bf16 = {name: (op, "bf16" if p == "fp16" else p) for name, (op, p) in fp16.items()}
    assert sensitivity.low_layers(fp32, bf16, plugs.BF16) == ["mm1", "add"]  # the same units in another float type
    assert sensitivity.low_layers(fp32, bf16, plugs.FP16) == []


def test_summary_keeps_the_numbers_tune_shows():
    tensor = TensorCheck(passed=True, criterion="scaled", statistic="-", scaled_error_quantile=0.2, scaled_error=0.3,
                         max_abs_error=0.5, quantile_abs_error=0.4, mean_kl=0.01)
    bound = Bound(status="passed", value=0.0, threshold=0.0)
    task = TaskCheck(status="passed", passed=True, samples=1, confidence=0.95, top1_agreement=0.99,
                     accuracy_drop=0.002, agreement=bound, drop=bound)
    result = Judgement(tensor, task, "passed")
    assert sensitivity.summary(result) == {"status": "passed", "scaled_error": 0.2, "max_abs_error": 0.5,
                                           "quantile_abs_error": 0.4, "top1_agreement": 0.99,
                                           "accuracy_drop": 0.002, "mean_kl": 0.01}
    no_quantile = Judgement(TensorCheck(passed=True, criterion="scaled", statistic="-", scaled_error=0.3), task,
                            "passed")
    assert sensitivity.summary(no_quantile)["scaled_error"] == 0.3


def test_candidate_key_and_passed():
    a = Candidate(["b", "a"], "x", {"status": "passed"}, calibration="max", fp32=["z", "y"])
    assert a.passed and a.key() == ("max", ("a", "b"), ("y", "z"))
    assert not Candidate([], "x", {"status": "inconclusive"}).passed
    assert not Candidate([], "x").passed


def test_timed_returns_the_value_and_seconds():
    value, seconds = sensitivity.timed(lambda a, b: a + b, 2, 3)
    assert value == 5 and 0 <= seconds < 1


def test_every_k_is_judged_at_most_once_over_many_gates():
    for n, threshold in itertools.product(range(1, 9), range(0, 10)):
        _, judged = run_search(n, lambda k, threshold=threshold: k >= threshold)
        assert len(judged) == len(set(judged))


def test_choose_defaults_to_five_percent_and_an_unmeasured_error_counts_as_none():
    a, b = cand(1, ms={1: 1.04}), cand(2, ms={1: 1.0})
    assert sensitivity.choose([a, b], [1]) is a  # within the default 5 %: fewer layers raised wins
    assert sensitivity.choose([cand(1, ms={1: 1.06}), b], [1]) is b
    unmeasured = Candidate(["x"], "top-1", {"status": "passed", "scaled_error": None}, latency_ms={1: 1.0})
    measured = cand(1, ms={1: 1.0}, error=0.5)
    assert sensitivity.choose([measured, unmeasured], [1]) is unmeasured


def test_confirmation_passes_the_noise_margin_on():
    a, b = cand(1, ms={1: 1.04}), cand(2, ms={1: 1.0})
    assert sensitivity.confirmed([a, b], [1], 0.0, lambda p: True)[0] is b
    assert sensitivity.confirmed([a, b], [1], 0.05, lambda p: True)[0] is a


def test_search_labels_the_lowest_mix_for_its_precision():
    found = sensitivity.search(["a", "b"], lambda high, origin: Candidate(list(high), origin, {"status": "failed"}))
    assert found[0].origin == "all INT8"


def test_metrics_judge_one_set_of_outputs_as_the_gate_does():
    ref = np.array([[3.0, 0.0], [0.0, 3.0]])
    gate = {"criterion": "scaled", "max_scaled_error": 0.1, "error_quantile": 1.0, "atol": 0.0, "rtol": 0.0,
            "check_error_stat": "elemwise", "min_top1_agreement": 1.0, "max_accuracy_drop": 0.0}
    same = sensitivity.metrics([{"y": ref}], [{"y": ref}], np.array([0, 1]), gate, "y", 0.95)
    assert same.status == "passed" and same.scaled_error == 0.0 and same.top1_agreement == 1.0
    flipped = sensitivity.metrics([{"y": ref[::-1]}], [{"y": ref}], np.array([0, 1]), gate, "y", 0.5)
    assert flipped.status == "failed" and flipped.accuracy_drop == 1.0 and flipped.mean_kl > 0


def test_unquantize_keeps_the_type_of_the_scale_and_reads_past_plain_inputs():
    int8, fp32, w1, _ = qdq_chain()
    for t in int8.graph.initializer:
        if t.name == "s":
            t.CopyFrom(numpy_helper.from_array(np.float16(0.05), "s"))
    mm1 = next(n for n in int8.graph.node if n.name == "mm1")
    mm1.input[0] = "x"  # a plain first input: the weight after it is still unquantized
    mixed = sensitivity.unquantize(int8, fp32, ["mm1"])
    inits = {t.name: numpy_helper.to_array(t) for t in mixed.graph.initializer}
    assert inits["w1__unquantized"].dtype == np.float16
    np.testing.assert_array_equal(inits["w1__unquantized"], w1.astype(np.float16))
    assert list(next(n for n in mixed.graph.node if n.name == "mm1").input) == ["x", "w1__unquantized"]


def test_unquantize_with_a_scale_from_a_node_and_a_weight_from_nowhere():
    int8, fp32, w1, _ = qdq_chain()
    int8.graph.node.insert(0, helper.make_node("Constant", [], ["s_node"], name="c",
                                               value=numpy_helper.from_array(np.float32(0.05))))
    dq = next(n for n in int8.graph.node if n.name == "dq_w1")
    dq.input[1] = "s_node"
    mixed = sensitivity.unquantize(int8, fp32, ["mm1"])
    inits = {t.name: numpy_helper.to_array(t) for t in mixed.graph.initializer}
    assert inits["w1__unquantized"].dtype == np.float32  # no initializer to read the type from: float32
    orphan = fp32.graph.node[0]
    orphan.input[1] = "h_from_elsewhere"
    with pytest.raises(ValueError, match="mm1: input 1 is neither a quantized activation nor an initializer"):
        sensitivity.unquantize(int8, fp32, ["mm1"])


def test_low_layers_skip_nodes_the_precision_map_does_not_name():
    _, fp32, _, _ = qdq_chain()
    assert sensitivity.low_layers(fp32, {"mm2": ("MatMul", "int8")}, plugs.INT8) == ["mm2"]


# --------------------------------------------------------------------------- moved from test_tune.py


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
    """The oracle: the pick beats the incumbent on plain latencies (:func:`point_beats`)."""
    return point_beats(pick, incumbent, batches, same_speed)


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
    from test_tune_result import made

    payload = {"chosen": {"runtime": {"/a/Conv": "u8", "/b/Conv": "f32", "/fc/Gemm": "f32"}},
               "speedup_vs_fp32": {"1": 0.9, "8": 1.4}, "int8_dot_product": False}
    line = tune_report.speed_failure(made(**payload), 1.2)
    assert line.startswith("INT8 is no faster than FP32 here: 2 of 3 layers run in FP32 (/b/Conv, /fc/Gemm)")
    assert "no VNNI/AMX" in line and "x0.90 (no interval) at batch 1" in line
    assert tune_report.speed_failure(made(**payload), None) == ""  # off
    assert tune_report.speed_failure(made(**{**payload, "speedup_vs_fp32": {"1": 1.3, "8": 1.4}}), 1.2) == ""


def test_the_incumbent_rule_defaults_to_five_percent_and_confirmation_passes_the_margin_on():
    kept, pick = _mix(2, "passed", 1.00, 6.0, "previous choice"), _mix(1, "passed", 0.97, 5.9)
    assert sensitivity.keep_or_replace(kept, pick, [1, 8]) is kept  # 2-3 % faster: within the default 5 %
    faster = _mix(3, "passed", 0.80, 4.5)
    assert sensitivity.keep_or_replace(kept, faster, [1, 8]) is faster  # 20-25 % faster: beyond it
    assert sensitivity.confirmed([kept, pick], [1, 8], 0.0, lambda p: True, kept)[0] is pick
    assert sensitivity.confirmed([kept, pick], [1, 8], 0.05, lambda p: True, kept)[0] is kept



# --------------------------------------------------------------------------- the third rung: QAT


@pytest.mark.parametrize(("mode", "passed", "slow", "runs"), [
    ("off", False, "", False), ("on", True, "", True), ("auto", False, "", True), ("auto", True, "too slow", True),
    ("auto", True, "", False)])
def test_tune_runs_qat_only_when_no_ptq_mix_passes_with_min_speedup(mode, passed, slow, runs):
    wanted, why = qat_rung.qat_wanted(mode, passed, slow, low_layers=3)
    assert wanted is runs and f"tune.qat={mode}" in why
    if mode in ("on", "off"):
        assert why == f"tune.qat={mode}"
    if mode == "auto" and runs:
        assert why.startswith("no PTQ mix passes the gate" if not passed else "the best PTQ mix is too slow: too slow")


@pytest.mark.parametrize("mode", ["on", "auto"])
@pytest.mark.parametrize("passed", [True, False])
def test_tune_never_runs_qat_where_ptq_puts_no_layer_in_int8(mode, passed):
    """QAT fine-tunes only where PTQ quantizes: with no layer in INT8 it would time the FP32 network again (noise once
    made that look 1.6x faster than FP32 and passed the speed gate)."""
    wanted, why = qat_rung.qat_wanted(mode, passed, "too slow", low_layers=0)
    assert (wanted, why) == (False, "PTQ's placement puts no layer in INT8 (export.int8.op_types_to_exclude, the "
                                    "fallback's fp32_nodes): QAT fine-tunes only where PTQ quantizes, so there is "
                                    "nothing to fine-tune")
    assert qat_rung.qat_wanted(mode, passed, "too slow", low_layers=1)[0]
    assert qat_rung.qat_wanted("off", passed, "too slow", low_layers=0) == (False, "tune.qat=off")


def test_tune_auto_says_why_qat_did_not_run_where_modelopts_torch_side_is_missing():
    """auto: the rung is wanted but cannot run; tune goes on with PTQ's answer and says why (never silent)."""
    wanted, why = qat_rung.qat_wanted("auto", False, "", low_layers=2, missing="qat needs ModelOpt: no requests")
    assert (wanted, why) == (False, "no PTQ mix passes the gate, but QAT cannot run here: qat needs ModelOpt: no "
                                    "requests (tune.qat=auto)")
    assert qat_rung.qat_wanted("auto", True, "", low_layers=2, missing="x")[0] is False  # not wanted anyway
    assert qat_rung.qat_wanted("auto", True, "", low_layers=2)[1].startswith("a PTQ mix passes the gate")


qat_graphs = st.builds(lambda status, ms: Candidate([], "QAT", {"status": status}, ms),
                       st.sampled_from(["passed", "failed"]),
                       st.fixed_dictionaries({1: st.floats(0.1, 10), 8: st.floats(0.1, 10)}))


@given(st.one_of(st.none(), mixes), st.one_of(st.none(), qat_graphs),
       st.sampled_from([[1], [1, 8], []]), st.floats(0, 0.2))
def test_qat_is_chosen_only_when_it_passes_and_is_no_slower_than_ptqs_pick(ptq, qat, batches, same_speed):
    if ptq is not None:
        ptq.latency_ms = {1: 1.0, 8: 4.0}
    chosen, why = qat_rung.with_qat(ptq, "ptq's reason", qat, batches, same_speed)
    if qat is None or not qat.passed:
        assert (chosen, why) == (ptq, "ptq's reason")
    elif ptq is None:
        assert chosen is qat and why == "QAT's graph: no PTQ mix passes the gate"
    else:
        no_slower = not point_beats(ptq, qat, batches, same_speed)  # a tie goes to QAT's graph (all INT8)
        assert chosen is (qat if no_slower else ptq)
        assert ("slower at batch" in why) is not no_slower


def test_with_qat_by_hand():
    ptq = cand(2, ms={1: 1.0, 8: 4.0})
    fast = Candidate([], "QAT", {"status": "passed"}, {1: 1.04, 8: 3.0})
    assert qat_rung.with_qat(ptq, "p", fast, [1, 8], 0.05) == (
        fast, "QAT's graph passes with every layer in INT8 and the best PTQ mix is not faster beyond the noise "
              "(1.040 ms at batch 1, 3.000 ms at batch 8; the PTQ mix raised 2 layers)")
    tie = Candidate([], "QAT", {"status": "passed"}, {1: 1.0, 8: 4.0})  # exactly as fast: no slower, QAT's
    assert qat_rung.with_qat(ptq, "p", tie, [1, 8], 0.0)[0] is tie
    slow = Candidate([], "QAT", {"status": "passed"}, {1: 1.06, 8: 4.0})
    assert qat_rung.with_qat(ptq, "p", slow, [1, 8], 0.05) == (
        ptq, "p; QAT's graph passes but is slower at batch 1 (its time over the PTQ mix's: 1.06 [1.06, 1.06])")
    mixed = Candidate([], "QAT", {"status": "passed"}, {1: 1.06, 8: 3.0})  # slower at 1, faster at 8: a tie
    assert qat_rung.with_qat(ptq, "p", mixed, [1, 8], 0.05)[0] is mixed
    assert qat_rung.with_qat(ptq, "p", slow, [], 0.05)[1].endswith("(speed not measured; the PTQ mix raised 2 "
                                                                      "layers)")
