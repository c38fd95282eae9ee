"""The gate's criteria (pipeline.precision.gate): each threshold at its boundary and one ulp either side, NaN/Inf on
both sides, the direction of the scale, the percentile, and the confidence-bounded task check. Each test here was
written to fail with one defect of the kind it names put back into pipeline/precision/gate.py."""

import math

import numpy as np
import pytest

from pipeline.core.check_results import CandidateResult
from pipeline.evaluation import candidates
from pipeline.precision import gate as criteria


def scaled_gate(**overrides):
    base = {"criterion": "scaled", "max_scaled_error": 0.1, "error_quantile": 1.0, "atol": 0.0, "rtol": 0.0,
            "check_error_stat": "elemwise", "min_top1_agreement": 0.99, "max_accuracy_drop": 0.01}
    return {**base, **overrides}


def judge(ref, cand, labels=None, **gate):
    ref, cand = np.asarray(ref, np.float32), np.asarray(cand, np.float32)
    labels = ref.argmax(1) if labels is None else np.asarray(labels)
    return criteria.judge([{"y": cand}], [{"y": ref}], labels, scaled_gate(**gate), "y", 0.95)


# --------------------------------------------------------------------------- scaled tensor check


def test_scale_is_the_rms_of_each_images_std_across_its_logits():
    ref = np.array([[0.0, 2.0], [0.0, 4.0]])  # per-image std 1 and 2 -> RMS sqrt(2.5)
    assert criteria.logit_scale(ref) == pytest.approx(math.sqrt(2.5))


def test_a_scaled_error_exactly_at_the_threshold_passes_and_one_ulp_over_fails():
    ref = np.array([[0.0, 2.0], [2.0, 0.0]])  # scale 1.0 exactly
    threshold = 0.25
    at = ref + np.array([[0.0, threshold], [0.0, 0.0]])
    assert judge(ref, at, max_scaled_error=threshold).tensor_check.passed
    assert not judge(ref, at, max_scaled_error=np.nextafter(threshold, 0)).tensor_check.passed
    assert judge(ref, at, max_scaled_error=np.nextafter(threshold, 1)).tensor_check.passed


def test_a_confident_model_with_proportional_errors_passes_like_an_unconfident_one():
    rng = np.random.default_rng(0)
    ref = rng.normal(size=(64, 10))
    noise = 0.01 * rng.normal(size=(64, 10))
    for scale in (1.0, 1000.0):  # the same relative error at two logit scales: the same verdict and statistic
        result = judge(ref * scale, (ref + noise) * scale, max_scaled_error=0.05)
        assert result.tensor_check.passed
        assert result.tensor_check.scaled_error == pytest.approx(judge(ref, ref + noise).tensor_check.scaled_error,
                                                                 rel=1e-4)


def test_the_scale_is_the_references_not_the_candidates():
    ref = np.array([[0.0, 1.0], [1.0, 0.0]])  # scale 0.5
    cand = ref * 100.0  # a candidate with a huge spread: scaled by itself its error would look small
    result = judge(ref, cand, max_scaled_error=1.0)
    assert result.tensor_check.scale == pytest.approx(0.5)
    assert not result.tensor_check.passed


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_nan_or_inf_in_the_candidate_fails_whatever_the_threshold(value):
    ref = np.array([[0.0, 1.0], [1.0, 0.0]])
    cand = ref.copy()
    cand[0, 0] = value
    result = judge(ref, cand, max_scaled_error=1e30)
    assert not result.tensor_check.passed and result.status == "failed"
    assert result.tensor_check.nonfinite == 1


@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_nan_or_inf_in_the_reference_fails_the_image(value):
    ref = np.array([[0.0, 1.0], [1.0, 0.0], [0.0, 2.0]])
    ref[1, 1] = value
    result = judge(ref, np.nan_to_num(ref, posinf=0), max_scaled_error=1e30)
    assert not result.tensor_check.passed


def test_the_quantile_holds_the_worst_images_not_the_best():
    rng = np.random.default_rng(1)
    ref = rng.normal(size=(100, 10))
    cand = ref.copy()
    cand[:5] += 5.0  # 5 % of the images are far off
    assert not judge(ref, cand, max_scaled_error=0.5, error_quantile=0.99).tensor_check.passed
    assert judge(ref, cand, max_scaled_error=0.5, error_quantile=0.95).tensor_check.passed
    assert not judge(ref, cand, max_scaled_error=0.5, error_quantile=1.0).tensor_check.passed


def test_image_quantile_takes_a_real_image_from_the_top():
    errors = np.arange(1, 101, dtype=float)  # 1 .. 100
    assert criteria.image_quantile(errors, 1.0) == 100
    assert criteria.image_quantile(errors, 0.99) == 99
    assert criteria.image_quantile(errors, 0.01) == 1


def test_absolute_criterion_keeps_polygraphy_semantics_and_its_rtol():
    ref, labels = [{"y": np.array([[8.0, 0.5, 0.001]], np.float32)}], np.array([0])
    gate = scaled_gate(criterion="absolute", atol=0.02, rtol=0.02)
    ok = criteria.judge([{"y": np.array([[8.1, 0.5, 0.005]], np.float32)}], ref, labels, gate, "y", 0.95)
    assert ok.tensor_check.passed  # 8.1: abs 0.1 but rel 0.0125 <= rtol
    rtol_as_atol = criteria.judge([{"y": np.array([[8.1, 0.5, 0.005]], np.float32)}], ref, labels,
                                  scaled_gate(criterion="absolute", atol=0.02, rtol=0.0125 * 0.99), "y", 0.95)
    assert not rtol_as_atol.tensor_check.passed


def test_absolute_criterion_reports_every_elements_error_statistics():
    """The absolute tensor check carries the same error statistics as the scaled one (max abs error, its quantile,
    the scale): verify.md's "max abs err" column and tune's tables read them whatever the criterion."""
    ref = np.array([[8.0, 0.5, 0.001], [1.0, -2.0, 3.0]], np.float32)
    cand = ref + np.array([[0.1, 0.0, 0.004], [0.0, 0.3, 0.0]], np.float32)
    gate = scaled_gate(criterion="absolute", atol=0.02, rtol=0.02)
    got = criteria.judge([{"y": cand}], [{"y": ref}], np.array([0, 2]), gate, "y", 0.95).tensor_check
    want = criteria.error_statistics(ref.astype(np.float64), cand.astype(np.float64), gate["error_quantile"])
    assert want and all(getattr(got, key) == pytest.approx(value) for key, value in want.items())
    assert got.max_abs_error == pytest.approx(0.3, rel=1e-5)


# --------------------------------------------------------------------------- task check: confidence bounds


def test_wilson_interval_matches_the_textbook_values():
    lo, hi = criteria.wilson(95, 100, criteria.z_value(0.975))
    assert lo == pytest.approx(0.8882, abs=1e-3) and hi == pytest.approx(0.9785, abs=1e-3)
    assert criteria.wilson(0, 10, 1.96)[0] == 0.0


def test_agreement_exactly_at_the_minimum_passes():
    assert criteria.agreement_check(99, 100, 0.99, 1.645).status == "passed"
    assert criteria.agreement_check(98, 100, np.nextafter(0.98, 0), 1.645).status == "passed"
    below = criteria.agreement_check(98, 100, np.nextafter(0.98, 1), 1.645)
    assert below.status == "inconclusive"


def test_agreement_fails_only_when_the_sample_shows_it():
    assert criteria.agreement_check(249, 256, 0.98, 1.645).status == "inconclusive"  # 97.3 %: within noise
    assert criteria.agreement_check(2490, 2560, 0.98, 1.645).status == "failed"  # the same rate, 10x images
    assert criteria.agreement_check(27, 100, 0.98, 1.645).status == "failed"


def test_task_check_names_the_images_needed_or_says_none_would_do():
    ref = np.tile(np.array([[2.0, 1.0]]), (100, 1))
    cand = ref.copy()
    cand[:2] = [[1.0, 2.0]]  # 98 of 100 agree
    labels = np.zeros(100, int)
    task = criteria.task_check(ref, cand, labels, scaled_gate(min_top1_agreement=0.99, max_accuracy_drop=1.0), 0.95)
    assert task.status == "inconclusive" and task.more_images > 0
    close = criteria.task_check(ref, cand, labels, scaled_gate(min_top1_agreement=np.nextafter(0.98, 1),
                                                               max_accuracy_drop=1.0), 0.95)
    assert close.status == "inconclusive" and close.more_images is None


def test_more_images_named_for_an_inconclusive_agreement_would_decide_it():
    result = criteria.agreement_check(249, 256, 0.98, 1.645)
    n = 256 + result.more_images
    assert criteria.wilson(round(249 / 256 * n), n, 1.645)[1] < 0.98
    n -= 1
    assert criteria.wilson(round(249 / 256 * n), n, 1.645)[1] >= 0.98


def test_accuracy_drop_boundary_and_paired_bound():
    assert criteria.accuracy_drop_check(1, 0, 100, 0.01, 1.645).status == "passed"  # exactly 1 point
    assert criteria.accuracy_drop_check(2, 0, 100, 0.01, 1.645).status == "inconclusive"
    assert criteria.accuracy_drop_check(30, 0, 100, 0.01, 1.645).status == "failed"
    # Gains offset losses: 10 lost, 9 gained is a 1-point drop.
    assert criteria.accuracy_drop_check(10, 9, 100, 0.01, 1.645).status == "passed"


def test_nan_logits_never_win_the_top1():
    ref = np.array([[2.0, 1.0], [1.0, 2.0]])
    cand = np.array([[np.nan, 1.0], [1.0, 2.0]])
    assert list(criteria.top1(cand)) == [1, 1]
    task = criteria.task_check(ref, cand, np.array([0, 1]), scaled_gate(min_top1_agreement=0.0,
                                                                         max_accuracy_drop=1.0), 0.95)
    assert task.disagreements == 1


def test_a_failed_tensor_check_fails_even_when_the_task_passes():
    ref = np.array([[0.0, 1.0], [1.0, 0.0]])
    result = judge(ref, ref + np.array([[0.0, 0.4], [0.0, 0.0]]), max_scaled_error=0.1)
    assert result.task_check.status == "passed" and result.status == "failed"


def test_rule_of_a_tensor_flags_the_first_layer_over_scale():
    rule = criteria.TensorRule.of(scaled_gate(max_scaled_error=0.1))
    ref = np.ones((2, 4, 3, 3)) * np.arange(4).reshape(1, 4, 1, 1)
    assert not rule.errors(ref, ref + 0.01)["exceeds"]
    assert rule.errors(ref, ref + 0.5)["exceeds"]
    absolute = criteria.TensorRule.of(scaled_gate(criterion="absolute", atol=0.1, rtol=0.1))
    assert absolute.errors(ref, ref + 0.5)["exceeds"]


# --------------------------------------------------------------------------- localisation order and the verdict


def _chain(int8: bool):
    """x -> MatMul mmA -> a -> MatMul mmB -> y; the INT8 version quantizes both inputs, mmA's coarsely (a moderate
    error), mmB's very coarsely (a huge one): the first node over the rule is mmA, the worst mmB."""
    from onnx import TensorProto, helper, numpy_helper

    eye = numpy_helper.from_array(np.eye(4, dtype=np.float32), "w")
    inits = [eye]
    nodes = []
    x, a = "x", "a"
    if int8:
        inits += [numpy_helper.from_array(np.array(0.05, np.float32), "sx"),
                  numpy_helper.from_array(np.array(2.0, np.float32), "sa"),
                  numpy_helper.from_array(np.array(0, np.int8), "z")]
        nodes += [helper.make_node("QuantizeLinear", ["x", "sx", "z"], ["xq"], name="qx"),
                  helper.make_node("DequantizeLinear", ["xq", "sx", "z"], ["xd"], name="dqx")]
        x = "xd"
    nodes.append(helper.make_node("MatMul", [x, "w"], ["a"], name="mmA"))
    if int8:
        nodes += [helper.make_node("QuantizeLinear", ["a", "sa", "z"], ["aq"], name="qa"),
                  helper.make_node("DequantizeLinear", ["aq", "sa", "z"], ["ad"], name="dqa")]
        a = "ad"
    nodes.append(helper.make_node("MatMul", [a, "w"], ["y"], name="mmB"))
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 4])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)], ir_version=9)


def test_int8_localisation_names_the_first_node_over_the_rule_not_the_worst():
    from pipeline.runtime.profiling import localize

    feed = {"x": np.random.default_rng(0).uniform(-1, 1, (8, 4)).astype(np.float32)}
    rule = criteria.TensorRule.of(scaled_gate(max_scaled_error=0.01))
    from pipeline.precision import plugs

    result = localize.localize_faithful(plugs.INT8, _chain(False), _chain(True), feed, rule, top=5)
    errors = {row.name: row.scaled_error for row in result.worst}
    assert 0.01 < errors["mmA"] < errors["mmB"]  # both over; mmB far worse
    assert result.first_divergent.name == "mmA"


def _check(name: str, status: str, *, gates: bool = True, required: bool = False):
    from pipeline.runtime import backends

    return candidates.Check(backends.by_name(name), name, required, result=CandidateResult(status=status),
                            gates=gates)


def test_verdict_a_required_candidate_that_was_skipped_fails_the_gate():

    verdict = candidates.verdict([_check("onnxrt_fp32", "passed"), _check("tensorrt_fp16", "skipped", required=True)])
    assert not verdict.passed and [c.name for c in verdict.missing_required] == ["tensorrt_fp16"]
    assert candidates.verdict([_check("onnxrt_fp32", "passed"), _check("tensorrt_fp16", "skipped")]).passed


def test_verdict_only_gating_candidates_decide_and_inconclusive_follows_the_policy():

    reported = _check("onnxrt_int8_cpu", "failed", gates=False)
    assert candidates.verdict([_check("int8_exact", "passed"), reported]).passed
    assert not candidates.verdict([_check("int8_exact", "failed"), reported]).passed
    undecided = [_check("int8_exact", "inconclusive"), _check("onnxrt_fp32", "passed")]
    assert candidates.verdict(undecided).passed
    assert not candidates.verdict(undecided, "fail").passed
    # One decision of what inconclusive counts as (issue 30): deployable under "pass", and named as undecided.
    assert candidates.verdict(undecided).deployable == ["int8_exact", "onnxrt_fp32"]
    assert candidates.verdict(undecided).undecided == ["int8_exact"]
    assert candidates.verdict(undecided, "fail").deployable == ["onnxrt_fp32"]


def test_a_nan_image_fails_even_when_the_quantile_leaves_the_worst_images_out():
    rng = np.random.default_rng(2)
    ref = rng.normal(size=(100, 10))
    cand = ref.copy()
    cand[7, 3] = np.nan
    result = judge(ref, cand, max_scaled_error=0.5, error_quantile=0.95)
    assert result.tensor_check.scaled_error_quantile == 0.0  # the quantile alone would pass it
    assert not result.tensor_check.passed and result.status == "failed"


def test_an_undecided_gate_under_inconclusive_fail_is_exit_5_and_says_how_many_images():
    from pipeline import verify
    from pipeline.core.errors import EXIT_INCONCLUSIVE, Inconclusive

    ref = np.tile(np.array([[2.0, 1.0]]), (256, 1))
    cand = ref.copy()
    cand[:7] = [[1.0, 2.0]]  # 249 of 256 agree: 97.3 % against 98 %
    chk = _check("int8_exact", "inconclusive")
    chk.result = CandidateResult(status="inconclusive", task_check=criteria.task_check(
        ref, cand, np.zeros(256, int), scaled_gate(min_top1_agreement=0.98, max_accuracy_drop=1.0), 0.95))
    verdict = candidates.verdict([chk], "fail")
    with pytest.raises(Inconclusive, match="about 750 more validation images would decide it") as caught:
        verify._raise_for(verdict, None, False, False)
    assert caught.value.exit_code == EXIT_INCONCLUSIVE == 5


def test_flips_on_near_ties_within_the_tolerated_error_do_not_count_but_decided_ones_do():
    ref = np.tile(np.array([[1.0, 0.0, 0.0]]), (100, 1))  # scale ~0.47
    ref[:10] = [1.0, 0.99, 0.0]  # ten near-ties (margin 0.01)
    cand = ref.copy()
    cand[:10] = [0.99, 1.0, 0.0]  # every near-tie flips: within the tolerated error
    labels = ref.argmax(1)
    labels[:10] = 2  # both classes of a near-tie are wrong here: the accuracy is the same either way
    result = judge(ref, cand, labels, max_scaled_error=0.05)
    assert result.tensor_check.passed and result.task_check.near_ties == 10
    assert result.task_check.top1_agreement == 0.9 and result.task_check.agreement.value == 1.0
    assert result.status == "passed"
    cand[10:20] = [0.0, 1.0, 0.0]  # ten decided images flip: the tensor check and the task check both fail them
    flipped = criteria.task_check(ref, cand, labels, scaled_gate(), 0.95, tie_margin=0.1)
    assert flipped.agreement.value == pytest.approx(80 / 90) and flipped.status == "failed"
