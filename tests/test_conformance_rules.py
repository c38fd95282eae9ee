"""The conformance checks' decisions (pipeline/evaluation/conformance.py): the arrangements, each row's deviation,
the rows' verdict and the precision claim's verdict, with a runner double whose rows may depend on their batch.
Milliseconds: the mutation command runs these for every mutant of conformance.py."""

from __future__ import annotations

import math
from collections import OrderedDict
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.core.check_results import CandidateResult
from pipeline.core.status import Status
from pipeline.evaluation import conformance, conformance_runs
from pipeline.evaluation.conformance import RowFinding, judge_claim, judge_rows
from pipeline.runtime.profiling import layer_account

finite = st.floats(0, 1e6, allow_nan=False)


class Runner:
    """Logits ``x @ w``; each row gets ``mix`` times the batch's mean row (0: rows independent); ``refuse``: batch sizes
    it does not serve, with the reason."""

    def __init__(self, w: np.ndarray, mix: float = 0.0, refuse: dict | None = None):
        self.w, self.mix, self.refuse, self.sizes = w, mix, refuse or {}, []

    def batch_reason(self, size: int) -> str:
        return self.refuse.get(size, "")

    def infer(self, feed: dict) -> dict:
        x = feed["x"].reshape(len(feed["x"]), -1)
        self.sizes.append(len(x))
        y = x @ self.w
        return OrderedDict(y=y + self.mix * y.mean(axis=0, keepdims=True))


def _plan(n=8, seed=0):
    rng = np.random.default_rng(seed)
    images = rng.normal(size=(n, 2, 2, 2)).astype(np.float32)
    return conformance.RowPlan(images, rng.normal(size=(2, 2, 2)).astype(np.float32) * 5, "x", "y"), \
        rng.normal(size=(8, 4))


def _result(runner, plan, tolerance=1e-6, static=False):
    return conformance.row_result(conformance_runs.run_rows(runner, plan, static), tolerance).to_json()


@pytest.mark.parametrize("n", [1, 2, 5, 8])
def test_every_image_sits_in_its_own_slot_or_the_mirrored_one(n):
    plan, _ = _plan(n)
    arranged = conformance.arrangements(plan.images, plan.hard)
    assert list(arranged) == list(conformance.ARRANGEMENTS)
    for name, batches in arranged.items():
        seen = np.concatenate([b.images[b.images >= 0] for b in batches])
        assert sorted(seen) == list(range(n)), name  # every image once, in every arrangement
        for b in batches:
            for slot, image in enumerate(b.images):
                if image >= 0:
                    np.testing.assert_array_equal(b.array[slot], plan.images[image])
                else:  # a companion: the hard image
                    np.testing.assert_array_equal(b.array[slot], plan.hard)
    assert all(len(b.images) == 1 and len(b.array) == 1 for b in arranged["alone"])
    assert all(len(b.images) == n for name in ("batch", "reversed", "companions") for b in arranged[name])
    assert list(arranged["reversed"][0].images) == list(range(n))[::-1]
    companions = arranged["companions"]
    assert [list(b.images).count(-1) for b in companions] == [n - n // 2, n // 2]


def test_independent_rows_pass_with_zero_deviation():
    plan, w = _plan()
    result = _result(Runner(w), plan)
    assert result["status"] == Status.PASSED and result["base"] == "alone"
    assert [a["arrangement"] for a in result["arrangements"]] == ["batch", "reversed", "companions"]
    assert all(a["deviation"] < 1e-12 and a["batch_size"] == 8 for a in result["arrangements"])


def test_rows_that_mix_fail_and_the_reason_names_image_slot_and_batch():
    plan, w = _plan()
    result = _result(Runner(w, mix=1e-3), plan, tolerance=1e-5)
    assert result["status"] == Status.FAILED
    worst = max(result["arrangements"], key=lambda a: a["deviation"])
    assert worst["deviation"] > 1e-5
    assert (f"image {worst['image']} in slot {worst['slot']} of a batch of 8 ({worst['arrangement']})"
            in result["reason"])
    assert "max_row_deviation 1e-05" in result["reason"]


def test_the_same_mix_within_a_loose_tolerance_passes():
    plan, w = _plan()
    assert _result(Runner(w, mix=1e-3), plan, tolerance=1.0)["status"] == Status.PASSED


def test_without_batch_1_the_full_batch_is_the_base_and_companions_still_catch_a_mix():
    plan, w = _plan()
    result = _result(Runner(w, mix=1e-3, refuse={1: "profile starts at 8"}), plan, tolerance=1e-5)
    assert result["base"] == "batch" and result["skipped"] == {"alone": "profile starts at 8"}
    assert [a["arrangement"] for a in result["arrangements"]] == ["reversed", "companions"]
    by = {a["arrangement"]: a for a in result["arrangements"]}
    assert by["reversed"]["deviation"] < 1e-12  # the same mean, other slots: a mean-mix hides there
    assert by["companions"]["deviation"] > 1e-5 and result["status"] == Status.FAILED


def test_a_static_artifact_runs_only_the_full_batch_arrangements():
    plan, w = _plan()
    runner = Runner(w)
    result = _result(runner, plan, static=True)
    assert set(result["skipped"]) == {"alone"} and set(runner.sizes) == {8}
    assert result["status"] == Status.PASSED


def test_nothing_to_compare_is_skipped():
    plan, w = _plan()
    refuse = {1: "no", 8: "no"}
    result = _result(Runner(w, refuse=refuse), plan)
    assert result["status"] == Status.SKIPPED and "reason" not in result


def test_a_runner_that_raises_is_an_error_row_not_a_dead_stage():
    plan, w = _plan()
    runner = Runner(w)
    runner.infer = lambda feed: 1 / 0
    runs = conformance_runs.safely("row-independence check", lambda: conformance_runs.run_rows(runner, plan, False))
    result = conformance.row_result(runs, 1e-4).to_json()
    assert result["status"] == Status.ERROR and "ZeroDivisionError" in result["reason"]


@given(st.lists(finite, min_size=1, max_size=6), finite)
def test_judge_rows_fails_exactly_when_a_deviation_is_over(devs, tol):
    found = [RowFinding("batch", 4, i % 4, i, d) for i, d in enumerate(devs)]
    verdict = judge_rows(found, tol)
    assert verdict.status == (Status.FAILED if max(devs) > tol else Status.PASSED)
    assert verdict.failing == sum(d > tol for d in devs)
    assert verdict.worst.deviation == max(devs)


@given(st.lists(finite, max_size=4), finite)
def test_a_nan_or_infinite_row_always_fails_and_is_the_worst(devs, tol):
    for bad in (math.nan, math.inf):
        found = [RowFinding("batch", 4, 0, i, d) for i, d in enumerate([*devs, bad])]
        verdict = judge_rows(found, tol)
        assert verdict.status == Status.FAILED and verdict.failing >= 1
        assert verdict.worst.image == len(devs)


def test_no_finding_is_skipped():
    verdict = judge_rows([], 1.0)
    assert verdict == conformance.RowsVerdict(Status.SKIPPED, None, 0)


def test_deviation_is_relative_to_each_rows_own_scale_and_inf_when_not_finite():
    base = np.array([[10.0, -20.0], [0.0, 0.0], [1.0, 1.0]])
    rows = np.array([[10.0, -19.0], [0.0, 3e-12], [np.nan, 1.0]])
    dev = conformance.deviations(rows, base)
    assert dev[0] == pytest.approx(1 / 20) and dev[1] == pytest.approx(3.0) and dev[2] == np.inf
    swapped = conformance.deviations(base, rows)
    assert swapped[2] == np.inf and np.isfinite(swapped[:2]).all()  # a non-finite base row: that row only


@given(st.sampled_from(["fp16", "bf16", "int8"]), st.floats(0, 1), st.floats(0.01, 1), st.floats(0, 1))
def test_a_claim_fails_exactly_below_its_share_of_the_graph(claimed, runtime, graph, min_share):
    verdict = judge_claim(claimed, runtime, graph, min_share)
    assert verdict.required == pytest.approx(min_share * graph)
    assert verdict.status == (Status.FAILED if runtime < min_share * graph else Status.PASSED)
    assert (claimed in verdict.reason) == (verdict.status == Status.FAILED)


def test_claim_edges():
    assert judge_claim(None, 0.0, 1.0, 0.5).status == Status.SKIPPED  # FP32 claims nothing
    assert judge_claim("int8", None, 0.5, 0.5).status == Status.SKIPPED  # no account: not guessed
    none = judge_claim("bf16", 1.0, 0.0, 0.5)  # a "BF16" graph with no BF16 layer fails whatever the runtime says
    assert none.status == Status.FAILED and "puts no matrix layer in bf16" in none.reason
    assert judge_claim("int8", 0.25, 0.5, 0.5).status == Status.PASSED  # exactly at the bound
    assert judge_claim("int8", 0.2499, 0.5, 0.5).status == Status.FAILED
    assert "runs 20% of its matrix layers in fp16 (at least 50% required" in judge_claim("fp16", 0.2, 1.0, 0.5).reason


def test_onnx_runtime_profile_events_are_read_as_layers():
    events = [
        {"cat": "Session", "name": "model_run"},
        {"cat": "Node", "name": "conv_fence_before"},
        {"cat": "Node", "name": "/c/Conv_kernel_time", "dur": 40, "args": {
            "op_name": "FusedConv", "provider": "CPUExecutionProvider", "input_type_shape": [{"float": [1, 3]}]}},
        {"cat": "Node", "name": "/q/Conv_kernel_time", "dur": 7, "args": {
            "op_name": "QLinearConv", "provider": "CPUExecutionProvider", "input_type_shape": [{"uint8": [1]}]}},
        {"cat": "Node", "name": "/h/MatMul_kernel_time", "dur": 3, "args": {
            "op_name": "MatMul", "provider": "CPUExecutionProvider", "input_type_shape": [{"float16": [1]}]}},
        {"cat": "Node", "name": "/r/Relu_kernel_time", "dur": 1, "args": {
            "op_name": "Relu", "provider": "CPUExecutionProvider", "input_type_shape": [{"float": [1]}]}},
    ]
    layers = layer_account.ort_profile_layers(events)
    assert [(x.name, x.precision, x.matrix, x.time_us) for x in layers] == [
        ("/c/Conv", "fp32", True, 40.0), ("/q/Conv", "int8", True, 7.0), ("/h/MatMul", "fp16", True, 3.0),
        ("/r/Relu", "fp32", False, 1.0)]
    assert layer_account.matrix_shares(layers) == {"fp16": 1 / 3, "fp32": 1 / 3, "int8": 1 / 3}


def test_an_emulation_is_its_graphs_decisions():
    layers = layer_account.graph_layers({"a": ("Conv", "fp16"), "b": ("Relu", "fp16"), "c": ("Gemm", "fp32")}, "x")
    assert layer_account.matrix_shares(layers) == {"fp16": 0.5, "fp32": 0.5}


def test_precision_result_uses_the_runtime_account_of_a_deployment():
    fp32 = layer_account.Layer("conv", "Convolution", "fp32", True, "brgconv", 3.0).to_json()
    i8 = layer_account.Layer("conv2", "Convolution", "int8", True).to_json()
    relu = layer_account.Layer("relu", "Eltwise", "fp32", False).to_json()

    def result(layers, graph=None):
        runs = {"layers": layers, **({"graph": graph} if graph is not None else {})}
        return conformance.precision_result("int8", True, runs, 0.5).to_json()

    failed = result({"layers": [fp32, fp32, i8, relu]})
    assert failed["status"] == Status.FAILED and failed["required"] == 0.5 and failed["graph_share"] == 1.0
    assert failed["shares"] == {"fp32": 2 / 3, "int8": 1 / 3} and failed["matrix_layers"] == 3
    assert failed["source"] == "runtime" and failed["claimed"] == "int8" and failed["layers"][0] == fp32
    assert "runs 33% of its matrix layers in int8" in failed["reason"]
    passed = result({"layers": [fp32, i8]})
    assert passed["status"] == Status.PASSED and passed["shares"] == {"fp32": 0.5, "int8": 0.5}
    assert "reason" not in passed
    half_graph = result({"layers": [fp32, fp32, fp32, i8]}, {"share": 0.5, "layers": []})
    assert half_graph["status"] == Status.PASSED and half_graph["required"] == 0.25  # 1/4 >= 0.5 x 0.5
    assert result({"layers": []})["status"] == Status.SKIPPED
    only_relu = result({"layers": [relu]})  # a model without a convolution or matrix product (a constant model)
    assert only_relu["status"] == Status.SKIPPED and "no matrix layer" in only_relu["reason"]
    assert result({"error": "boom"}) == {"status": Status.ERROR, "reason": "boom"}
    assert result({"layers": [i8]}, {"error": "no graph"}) == {"status": Status.ERROR, "reason": "no graph"}


def test_precision_result_of_an_emulation_is_its_graph():
    def judged(claimed, deploys, runs):
        return conformance.precision_result(claimed, deploys, runs, 0.5).to_json()

    fp16 = layer_account.Layer("c", "Conv", "fp16", True).to_json()
    fp32 = layer_account.Layer("g", "Gemm", "fp32", True).to_json()
    runs = {"layers": [], "graph": {"share": 0.5, "layers": [fp16, fp32]}}
    result = judged("fp16", False, runs)
    assert result["source"] == "graph, emulated" and result["shares"] == {"fp16": 0.5, "fp32": 0.5}
    assert result["status"] == Status.PASSED and result["graph_share"] == 0.5 and result["matrix_layers"] == 2
    none = judged("fp16", False, {"layers": [], "graph": {"share": 0.0, "layers": [fp32]}})
    assert none["status"] == Status.FAILED and "puts no matrix layer in fp16" in none["reason"]
    no_graph = judged("fp16", False, {"layers": []})  # an emulation whose graph was not read
    assert no_graph["status"] == Status.SKIPPED and no_graph["graph_share"] == 1.0 and no_graph["layers"] == []
    no_account = judged("int8", True, {"layers": [], "graph": {"share": 1.0, "layers": []}})
    assert no_account["status"] == Status.SKIPPED and no_account["shares"] == {}  # a runner without layers()
    unclaimed = judged(None, True, {"layers": {"layers": [fp32]}})
    assert unclaimed["status"] == Status.SKIPPED and unclaimed["claimed"] is None and unclaimed["required"] == 0.0

def _check(status=Status.PASSED, runs=None, after_fallback=False, claims=None, deploys=True):
    backend = SimpleNamespace(claims=claims, deploys=deploys, graph=None, verify_name="c")
    result = CandidateResult(status=status, passed=status == Status.PASSED, after_fallback=after_fallback)
    return SimpleNamespace(backend=backend, name="c", precision="fp32", result=result, status=status,
                           after_fallback=after_fallback, conformance_runs=runs if runs is not None else {})


def _verify_cfg(on=True):
    return SimpleNamespace(verify=SimpleNamespace(conformance=on, min_precision_share=0.5))


def _gate_for(cfg, name, precision):
    assert cfg.verify.min_precision_share == 0.5 and (name, precision) == ("c", "fp32")  # the candidate's own gate
    return {"max_row_deviation": 1e-4}


def _runs(mix: float, layers=None):
    plan, w = _plan()
    return {"rows": conformance_runs.run_rows(Runner(w, mix=mix), plan, False), "layers": layers or {"layers": []}}


@pytest.mark.parametrize("status", [Status.PASSED, Status.INCONCLUSIVE])
def test_a_mixing_candidate_that_passed_its_output_check_fails_here(status):
    chk = _check(status, _runs(1e-2))
    conformance.verify_conformance(_verify_cfg(), [chk], _gate_for)
    assert chk.result.status == Status.FAILED and chk.result.passed is False
    assert chk.result.reason.startswith("row independence: image") and chk.result.hint == \
        conformance.CONFORMANCE_HINT
    assert chk.result.conformance.rows.tolerance == 1e-4


def test_a_sound_candidate_keeps_its_verdict_and_gets_its_section():
    chk = _check(Status.PASSED, _runs(0.0))
    conformance.verify_conformance(_verify_cfg(), [chk], _gate_for)
    assert chk.result.status == Status.PASSED and chk.result.reason is None
    assert chk.result.conformance.rows.status == Status.PASSED
    assert chk.result.conformance.precision.status == Status.SKIPPED  # FP32 claims nothing


def test_a_false_claim_fails_the_candidate_and_both_reasons_are_kept():
    fp32 = layer_account.Layer("conv", "Convolution", "fp32", True).to_json()
    chk = _check(Status.PASSED, _runs(1e-2, {"layers": [fp32]}), claims="int8")
    conformance.verify_conformance(_verify_cfg(), [chk], _gate_for)
    assert chk.result.status == Status.FAILED
    assert "row independence" in chk.result.reason and "; claims int8 but runs 0%" in chk.result.reason


@pytest.mark.parametrize("status", [Status.FAILED, Status.ERROR, Status.CRASHED])
def test_a_candidate_that_did_not_pass_keeps_its_verdict_and_still_gets_its_section(status):
    chk = _check(status, _runs(1e-2))
    before = chk.result.model_dump()
    conformance.verify_conformance(_verify_cfg(), [chk], _gate_for)
    section = chk.result.conformance
    assert chk.result.model_copy(update={"conformance": None}).model_dump() == before
    assert section.rows.status == Status.FAILED


def test_after_a_fallback_or_without_runs_the_section_is_skipped_with_the_reason():
    replaced, unrun = _check(Status.PASSED, _runs(1e-2), after_fallback=True), _check(Status.SKIPPED, {})
    conformance.verify_conformance(_verify_cfg(), [replaced, unrun], _gate_for)
    assert replaced.result.status == Status.PASSED and unrun.result.status == Status.SKIPPED
    assert replaced.result.conformance.to_json() == {"status": Status.SKIPPED, "reason": conformance.AFTER_FALLBACK}
    assert unrun.result.conformance.to_json() == {"status": Status.SKIPPED, "reason": conformance.NOT_RUN}


def test_rows_are_copied_from_a_runner_that_reuses_its_output_buffer():
    plan, w = _plan()
    runner = Runner(w)
    infer, buffer = runner.infer, {}

    def reusing(feed):
        out = infer(feed)["y"]
        buffer.setdefault(out.shape, np.empty_like(out))[...] = out
        return OrderedDict(y=buffer[out.shape])

    runner.infer = reusing
    assert _result(runner, plan)["status"] == Status.PASSED


def test_conformance_off_touches_nothing():
    chk = _check(Status.PASSED, _runs(1e-2))
    conformance.verify_conformance(_verify_cfg(on=False), [chk], _gate_for)
    assert chk.result.conformance is None and chk.result.status == Status.PASSED


def test_the_plan_takes_the_first_full_batch_and_the_largest_logit_image_as_companion():
    feeds = [{"x": np.arange(4 * 2, dtype=np.float32).reshape(4, 2)}, {"x": -np.ones((4, 2), np.float32)}]
    reference = [{"y": np.array([[1.0, 0], [0, 2], [np.inf, 0], [0, 1]])}, {"y": np.array([[9.0, 0]] * 4)}]
    evidence = SimpleNamespace(feeds=feeds, reference=reference, output_name="y")
    cfg = SimpleNamespace(verify=SimpleNamespace(conformance=True), build=SimpleNamespace(max_batch=3))
    plan = conformance.plan(cfg, evidence)
    assert plan.images.shape == (3, 2) and plan.input_name == "x" and plan.output_name == "y"
    np.testing.assert_array_equal(plan.hard, -np.ones(2))  # logits 9, the largest finite ones (inf is skipped)
    cfg.build.max_batch = 64
    assert len(conformance.plan(cfg, evidence).images) == 8  # every image there is, when fewer than a full batch
    one = SimpleNamespace(feeds=feeds[:1], reference=reference[:1], output_name="y")
    assert conformance.plan(cfg, one).images.shape == (4, 2)
    cfg.verify.conformance = False
    assert conformance.plan(cfg, evidence) is None


def test_the_log_names_each_failed_part_even_of_a_candidate_that_failed_before(caplog):
    from pipeline.reports import verify_report

    chk = _check(Status.FAILED, _runs(1e-2))  # failed by its output check: no "reason" key of its own
    chk.result = chk.result.model_copy(update={"reason": None})
    conformance.verify_conformance(_verify_cfg(), [chk], _gate_for)
    with caplog.at_level("INFO", logger="pipeline"):
        verify_report.log_conformance([chk])
    assert "rows failed" in caplog.text and "row independence: image" in caplog.text


def test_claim_verdicts_exactly():
    V = conformance.ClaimVerdict
    assert judge_claim(None, 0.3, 1.0, 0.5) == V(Status.SKIPPED, 0.0, "no lower precision claimed")
    assert judge_claim("fp16", 0.0, None, 0.5) == V(Status.SKIPPED, 0.0, "the graph has no matrix layer "
                                                                       "(convolution or matrix product)")
    assert judge_claim("bf16", 0.9, 0.0, 0.5) == V(Status.FAILED, 0.0, "claims bf16 but its graph puts no matrix "
                                                                       "layer in bf16")
    assert judge_claim("int8", None, 0.5, 0.5) == V(Status.SKIPPED, 0.25, "the runtime gave no account of its layers")
    assert judge_claim("int8", 0.5, 0.5, 0.5) == V(Status.PASSED, 0.25, "")
    assert "(at least 90% required: verify.min_precision_share 0.9 of the 100%" in judge_claim("int8", 0, 1, 0.9).reason
    assert judge_claim("fp16", 0.1, 0.8, 0.5) == V(
        Status.FAILED, 0.4, "claims fp16 but runs 10% of its matrix layers in fp16 (at least 40% required: "
        "verify.min_precision_share 0.5 of the 80% its graph puts in fp16)")


def test_gather_puts_each_output_row_back_under_its_image_with_its_slot():
    batches = [conformance.Batch(np.zeros((3, 1)), np.array([2, -1, 0])),
               conformance.Batch(np.zeros((3, 1)), np.array([-1, 1, -1]))]
    outputs = [np.array([[20.0, 21], [99, 99], [0, 1]]), np.array([[98, 98], [10, 11], [97, 97]])]
    rows, slots, size = conformance.gather(batches, outputs, 3)
    np.testing.assert_array_equal(rows, [[0, 1], [10, 11], [20, 21]])
    assert rows.dtype == np.float64 and list(slots) == [2, 1, 0] and size == 3
    missing, missing_slots, _ = conformance.gather(batches[:1], outputs[:1], 3)
    assert np.isnan(missing[1]).all() and missing_slots == [2, -1, 0]  # an image no batch held: NaN, no slot
    with pytest.raises(ValueError):  # an output per batch, no fewer
        conformance.gather(batches, outputs[:1], 3)


def test_findings_name_the_worst_row_of_each_arrangement_against_the_base():
    base = np.array([[1.0, 0], [0, 2], [4, 0]])
    moved = base.copy()
    moved[1, 1] = 2.5  # image 1, off by 0.5 of its scale 2
    runs = {"alone": (base, np.zeros(3, int), 1), "batch": (base.copy(), np.arange(3), 3),
            "reversed": (moved, np.array([2, 1, 0]), 3)}
    name, found = conformance.findings(runs)
    assert name == "alone"
    assert found == [conformance.RowFinding("batch", 3, 0, 0, 0.0), conformance.RowFinding("reversed", 3, 1, 1, 0.25)]
    without = {k: v for k, v in runs.items() if k != "alone"}
    assert conformance.findings(without) == ("batch", [conformance.RowFinding("reversed", 3, 1, 1, 0.25)])
    assert conformance.findings({"reversed": runs["reversed"]}) == ("batch", [])
    nan = moved.copy()
    nan[2, 0] = np.nan
    assert conformance.findings({"alone": runs["alone"], "batch": (nan, np.arange(3), 3)})[1][0].image == 2


def test_the_row_result_words_the_worst_row():
    base = np.array([[1.0, 0], [0, 2]])
    moved = base + np.array([[0, 0], [0, 1.0]])
    runs = {"runs": {"alone": (base, np.zeros(2, int), 1), "companions": (moved, np.array([0, 1]), 2)},
            "skipped": {"reversed": "no"}}
    result = conformance.row_result(runs, 0.1).to_json()
    assert result == {"status": Status.FAILED, "base": "alone", "tolerance": 0.1, "skipped": {"reversed": "no"},
                      "arrangements": [{"arrangement": "companions", "batch_size": 2, "slot": 1, "image": 1,
                                        "deviation": 0.5}],
                      "reason": "row independence: image 1 in slot 1 of a batch of 2 (companions) differs from the "
                                "same image alone by 0.5 of its logit scale (max_row_deviation 0.1)"}
    assert "reason" not in conformance.row_result(runs, 0.5).to_json()
    assert conformance.row_result({"error": "x"}, 0.1).to_json() == {"status": Status.ERROR, "reason": "x"}
