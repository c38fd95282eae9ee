"""compare's decisions (pipeline/evaluation/drift.py), as the pure functions they are: milliseconds each, no model,
no run directory, no torch. Every branch and boundary is pinned directly (<= against <, which end of the interval,
abs, min against max), and the properties are checked with Hypothesis against oracles written another way."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.core.status import Status
from pipeline.core.timings import TimingKind
from pipeline.evaluation import drift
from pipeline.evaluation.predictions import Top5

T = drift.Thresholds(min_top1_agreement=0.99, max_accuracy_drop=0.01, max_logit_drift=0.05, drift_quantile=0.99,
                     max_latency_ratio=3.0, min_samples=20, confidence=0.95, bootstrap_resamples=200, seed=0)
CLASSES = ("cat", "dog", "bird")
FAST = settings(max_examples=40, deadline=None)


def images(n=4, **changes) -> drift.ImageSet:
    fields = {"model": "tiny_cnn", "classes": CLASSES, "input_size": (3, 16, 16),
              "names": np.array([f"val[{i}]" for i in range(n)]), "digests": np.array([f"{i:064x}" for i in range(n)]),
              "labels": np.arange(n) % 3}
    return drift.ImageSet(**{**fields, **changes})


def top5(classes, logits) -> Top5:
    return Top5(np.asarray(classes, np.int64), np.asarray(logits, np.float64))


def test_drift_imports_no_torch():
    code = "import sys, pipeline.evaluation.drift; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


# --------------------------------------------------------------------------- which images


def test_the_same_images_are_compatible():
    assert drift.incompatibility(images(), images()) is None


@pytest.mark.parametrize("change, said", [
    ({"model": "resnet18"}, "the baseline is of model 'resnet18', this run of 'tiny_cnn'"),
    ({"classes": ("cat", "dog", "fish")}, "the baseline's classes ['cat', 'dog', 'fish'] differ from this run's"),
    ({"input_size": (3, 32, 32)}, "the baseline's input size 3x32x32 differs from this run's 3x16x16"),
    ({"names": np.array(["val[0]", "val[1]", "val[9]", "val[3]"])}, "1 of 4 names differ; image 2: 'val[9]' there"),
    ({"digests": np.array([f"{i + (i == 3):064x}" for i in range(4)])},
     "1 of 4 images hold other pixels under the same name (first: 'val[3]'"),
    ({"labels": np.array([0, 1, 2, 1])}, "labels 1 of 4 images differently (first: 'val[3]': 'dog' there, 'cat' here)"),
])
def test_another_model_or_other_images_are_refused_with_what_differs(change, said):
    assert said in drift.incompatibility(images(**change), images())


def test_other_image_count_is_refused_before_names_are_compared():
    said = drift.incompatibility(images(5), images(4))
    assert "(5 images, this run verified 4)" in said and said.endswith("the same validation data and verify.samples")


def test_names_are_checked_before_pixels_and_pixels_before_labels():
    names = np.array(["a", "b", "c", "d"])
    other = images(names=names, digests=np.array(["f" * 64] * 4), labels=np.array([2, 2, 2, 2]))
    assert "names differ" in drift.incompatibility(other, images())
    assert "other pixels" in drift.incompatibility(images(digests=other.digests, labels=other.labels), images())
    assert "labels" in drift.incompatibility(images(labels=other.labels), images())


def test_refusals_show_the_bundle_text_printable():
    said = drift.incompatibility(images(model="x\x1b[31m\nred" + "y" * 5000), images())
    assert "\x1b" not in said and "\n" not in said and len(said) < 300


def test_a_long_class_list_is_shortened():
    many = tuple(f"c{i}" for i in range(20))
    said = drift.incompatibility(images(classes=many), images(classes=many[:-1] + ("other",)))
    assert "[c0, c1, c2, c3, c4, ... (20 classes)]" in said


# --------------------------------------------------------------------------- which artifacts


@pytest.mark.parametrize("verdict, policy, has, said", [
    (None, "pass", True, "this run's verify has no verdict for it"),
    (Status.NOT_VERIFIED, "pass", True, "this run's verdict is about another file"),
    (Status.FAILED, "pass", True, "failed in this run's verify (verify.inconclusive: pass)"),
    (Status.SKIPPED, "pass", True, "skipped in this run's verify"),
    (Status.CRASHED, "pass", True, "crashed in this run's verify"),
    (Status.ERROR, "pass", True, "error in this run's verify"),
    (Status.INCONCLUSIVE, "fail", True, "inconclusive in this run's verify (verify.inconclusive: fail)"),
    (Status.PASSED, "pass", False, "no predictions in this run's verify.predictions.npz"),
    (Status.INCONCLUSIVE, "pass", False, "no predictions"),
])
def test_an_artifact_without_a_current_passing_verdict_and_predictions_is_missing(verdict, policy, has, said):
    assert said in drift.missing_reason(verdict, policy, has)


@pytest.mark.parametrize("verdict, policy", [(Status.PASSED, "pass"), (Status.PASSED, "fail"),
                                             (Status.INCONCLUSIVE, "pass")])
def test_a_verdict_that_counts_as_passed_with_predictions_is_compared(verdict, policy):
    assert drift.missing_reason(verdict, policy, True) is None


# --------------------------------------------------------------------------- predictions


def test_agreement_passes_at_full_agreement_and_fails_far_below():
    same = np.zeros(48, int)
    assert drift.agreement(same, same, 0.99, 0.95).status == Status.PASSED
    result = drift.agreement(same, same + 1, 0.99, 0.95)
    assert result.status == Status.FAILED and result.value == 0.0


def test_one_flip_in_48_images_is_inconclusive_not_failed():
    base, run = np.zeros(48, int), np.zeros(48, int)
    run[0] = 1
    result = drift.agreement(base, run, 0.99, 0.95)
    assert result.status == Status.INCONCLUSIVE and result.value == pytest.approx(47 / 48)


def test_a_higher_confidence_widens_the_agreement_bound():
    base, run = np.zeros(48, int), np.r_[np.ones(3, int), np.zeros(45, int)]
    assert drift.agreement(base, run, 0.99, 0.99).upper_bound > drift.agreement(base, run, 0.99, 0.8).upper_bound


def test_accuracy_change_counts_lost_and_gained_the_right_way_round():
    labels = np.array([0, 1, 2, 0])
    base = np.array([0, 1, 0, 1])  # right on images 0, 1
    run = np.array([1, 1, 2, 1])  # right on images 1, 2: lost image 0, gained image 2
    result = drift.accuracy_change(base, run, labels, 0.01, 0.95)
    assert (result.lost, result.gained) == (1, 1)
    assert result.baseline_accuracy == 0.5 and result.accuracy == 0.5 and result.value == 0
    worse = drift.accuracy_change(base, np.array([1, 0, 0, 1]), labels, 0.01, 0.95)
    assert (worse.lost, worse.gained, worse.value) == (2, 0, 0.5)


def test_losing_every_image_fails_the_accuracy_check_and_gaining_them_passes():
    labels = np.zeros(48, int)
    lost = drift.accuracy_change(labels, labels + 1, labels, 0.01, 0.95)
    assert lost.status == Status.FAILED and lost.lost == 48
    gained = drift.accuracy_change(labels + 1, labels, labels, 0.01, 0.95)
    assert gained.status == Status.PASSED and gained.gained == 48 and gained.value == -1


def test_logit_drift_is_the_largest_absolute_change_over_the_scale():
    base = np.array([[3.0, 1.0], [2.0, 2.0]])
    run = np.array([[2.0, 1.25], [2.0, 2.25]])  # the largest change of image 0 is a decrease
    assert drift.logit_drift(base, run, 2.0).tolist() == [0.5, 0.125]
    assert drift.logit_drift(run, base, 2.0).tolist() == [0.5, 0.125]


def test_a_nan_logit_is_the_largest_drift():
    out = drift.logit_drift(np.array([[1.0, 0.0], [1.0, 0.0]]), np.array([[np.nan, 0.0], [1.0, 0.0]]), 1.0)
    assert out[0] == np.inf and out[1] == 0.0


@pytest.mark.parametrize("base, run, scale", [(np.zeros((2, 3)), np.zeros((2, 2)), 1.0),
                                              (np.zeros((2, 3)), np.zeros((1, 3)), 1.0),
                                              (np.zeros((2, 3)), np.zeros((2, 3)), 0.0),
                                              (np.zeros((2, 3)), np.zeros((2, 3)), -1.0),
                                              (np.zeros((2, 3)), np.zeros((2, 3)), float("nan"))])
def test_logit_drift_refuses_other_shapes_and_a_scale_that_is_not_positive(base, run, scale):
    with pytest.raises(ValueError):
        drift.logit_drift(base, run, scale)


def test_drift_at_the_threshold_passes_and_above_it_fails():
    at = drift.drift_check(np.full(10, 0.05), 0.99, 0.05)
    assert at.status == Status.PASSED and at.value == 0.05 and at.threshold == 0.05
    assert drift.drift_check(np.full(10, 0.0500001), 0.99, 0.05).status == Status.FAILED
    assert drift.drift_check(np.array([np.nan, 0.0]), 0.5, 0.05).status == Status.FAILED


def test_drift_is_held_at_the_quantile_image():
    values = np.arange(101) / 100  # 0.00 .. 1.00
    result = drift.drift_check(values, 0.9, 0.89)
    assert result.value == pytest.approx(0.9) and result.status == Status.FAILED and result.quantile == 0.9
    assert drift.drift_check(values, 0.5, 0.5).status == Status.PASSED
    assert (result.p50, result.p90, result.p99, result.max) == pytest.approx((0.5, 0.9, 0.99, 1.0))


def test_per_class_accuracy_and_its_changes():
    labels, base, run = np.array([0, 0, 1, 1]), np.array([0, 0, 1, 0]), np.array([0, 1, 1, 1])
    assert drift.per_class_accuracy(base, labels, CLASSES) == {"cat": 1.0, "dog": 0.5, "bird": None}
    assert [c.to_json() for c in drift.per_class_changes(base, run, labels, CLASSES)] == [
        {"class": "cat", "baseline": 1.0, "run": 0.5, "delta": -0.5},
        {"class": "dog", "baseline": 0.5, "run": 1.0, "delta": 0.5}]


def test_flips_name_each_changed_image_with_its_label_and_both_classes():
    out = drift.flips(np.array([0, 1, 2]), np.array([0, 2, 2]), np.array([0, 1, 1]), np.array(["a", "b", "c"]),
                      CLASSES)
    assert [f.to_json() for f in out] == [{"image": "b", "label": "dog", "baseline": "dog", "run": "bird"}]


def _artifact(base_classes, run_classes, base_logits=None, run_logits=None, labels=None):
    n = len(base_classes)
    base_logits = np.tile([2.0, 1.0], (n, 1)) if base_logits is None else base_logits
    run_logits = base_logits if run_logits is None else run_logits
    return drift.compare_artifact(top5(base_classes, base_logits), top5(run_classes, run_logits),
                                  np.zeros(n, int) if labels is None else labels, np.array([f"i{i}" for i in range(n)]),
                                  CLASSES, 1.0, T)


def test_an_identical_artifact_passes_with_nothing_flipped():
    same = np.tile([0, 1], (48, 1))
    result = _artifact(same, same)
    assert result.status == Status.PASSED and result.flipped == [] and drift.failed_checks(result) == []
    assert result.drift.value == 0.0 and result.agreement.value == 1.0


def test_only_the_top1_column_decides_flips():
    base, run = np.tile([0, 1], (48, 1)), np.tile([0, 2], (48, 1))
    assert _artifact(base, run).status == Status.PASSED


def test_logit_drift_alone_fails_an_artifact():
    same = np.tile([0, 1], (48, 1))
    base_logits = np.tile([2.0, 1.0], (48, 1))
    result = _artifact(same, same, base_logits, base_logits + [0.0, 0.5])
    assert result.status == Status.FAILED and drift.failed_checks(result) == ["drift"]


def test_every_failed_check_is_named_in_order():
    base, run = np.tile([0, 1], (48, 1)), np.tile([1, 0], (48, 1))
    result = _artifact(base, run, run_logits=np.tile([5.0, 1.0], (48, 1)))
    assert result.status == Status.FAILED and drift.failed_checks(result) == ["agreement", "accuracy", "drift"]
    assert len(result.flipped) == 48 and result.per_class[0].delta == -1.0


def test_an_inconclusive_check_makes_the_artifact_inconclusive_not_failed():
    base, run = np.tile([0, 1], (48, 1)), np.tile([0, 1], (48, 1))
    run[0] = [1, 0]
    labels = np.ones(48, int)  # both wrong on every image but one: no accuracy lost
    result = _artifact(base, run, labels=labels)
    assert result.agreement.status == Status.INCONCLUSIVE and result.status == Status.INCONCLUSIVE
    assert drift.failed_checks(result) == []


# --------------------------------------------------------------------------- latency


def test_chunks_split_the_resamples_under_the_budget():
    assert drift._chunks(10, 3, budget=6) == [2, 2, 2, 2, 2]
    assert drift._chunks(5, 3, budget=6) == [2, 2, 1]
    assert drift._chunks(3, 10, budget=6) == [1, 1, 1]  # one resample is larger than the budget: one at a time
    assert drift._chunks(4, 1) == [4]


def test_the_ratio_of_constant_series_is_exact():
    ratio, low, high = drift.bootstrap_median_ratio(np.full(30, 2.0), np.full(30, 5.0), resamples=100,
                                                    confidence=0.95, seed=0)
    assert (ratio, low, high) == (2.5, 2.5, 2.5)


def test_the_interval_is_the_two_sided_percentile_interval_of_the_resampled_ratios():
    """The oracle draws the same resamples (run first, then baseline, one generator) and takes the 2.5th and
    97.5th percentiles of the ratios of medians."""
    rng = np.random.default_rng(2)
    base, run = rng.uniform(1, 2, 30), rng.uniform(1, 3, 25)
    ratio, low, high = drift.bootstrap_median_ratio(base, run, resamples=300, confidence=0.95, seed=5)
    draw = np.random.default_rng(5)
    run_medians = np.median(draw.choice(run, size=(300, 25), replace=True), axis=1)
    base_medians = np.median(draw.choice(base, size=(300, 30), replace=True), axis=1)
    assert (low, high) == tuple(np.quantile(run_medians / base_medians, [0.025, 0.975]))
    assert ratio == np.median(run) / np.median(base)


def test_the_interval_is_reproducible_and_widens_with_confidence():
    rng = np.random.default_rng(1)
    base, run = rng.uniform(1, 2, 40), rng.uniform(1, 3, 40)
    first = drift.bootstrap_median_ratio(base, run, resamples=400, confidence=0.95, seed=7)
    assert first == drift.bootstrap_median_ratio(base, run, resamples=400, confidence=0.95, seed=7)
    assert first != drift.bootstrap_median_ratio(base, run, resamples=400, confidence=0.95, seed=8)
    wide = drift.bootstrap_median_ratio(base, run, resamples=400, confidence=0.99, seed=7)
    narrow = drift.bootstrap_median_ratio(base, run, resamples=400, confidence=0.5, seed=7)
    assert wide[1] < narrow[1] <= narrow[2] < wide[2]
    assert first[0] == pytest.approx(np.median(run) / np.median(base))


@pytest.mark.parametrize("base, run", [(np.array([1.0, 0.0]), np.array([1.0])), (np.array([1.0]), np.array([-1.0])),
                                       (np.array([]), np.array([1.0])), (np.array([1.0]), np.array([]))])
def test_latency_samples_must_be_positive_on_both_sides(base, run):
    with pytest.raises(ValueError):
        drift.bootstrap_median_ratio(base, run, resamples=10, confidence=0.95, seed=0)


def test_the_lower_end_of_the_interval_decides_at_the_threshold():
    assert drift.latency_status(3.0001, 3.0) == Status.FAILED
    assert drift.latency_status(3.0, 3.0) == Status.PASSED
    assert drift.latency_status(0.5, 3.0) == Status.PASSED


def test_a_regression_is_failed_with_its_numbers():
    result = drift.latency_check(np.full(30, 1.0), np.full(25, 4.0), max_ratio=3.0, resamples=100, confidence=0.95,
                                 seed=0)
    assert result.to_json() == {"status": Status.FAILED, "ratio": 4.0, "ci_low": 4.0, "ci_high": 4.0, "threshold": 3.0,
                      "baseline_p50_ms": 1.0, "run_p50_ms": 4.0, "baseline_samples": 30, "run_samples": 25}
    at = drift.latency_check(np.full(30, 1.0), np.full(30, 3.0), max_ratio=3.0, resamples=100, confidence=0.95, seed=0)
    assert at.status == Status.PASSED


def test_an_interval_that_only_reaches_above_the_threshold_passes():
    base = np.full(41, 1.0)
    run = np.r_[np.full(20, 1.0), np.full(21, 5.0)]  # the median sits on the edge: the interval spans [1, 5]
    result = drift.latency_check(base, run, max_ratio=3.0, resamples=400, confidence=0.95, seed=0)
    assert result.ci_low < 3.0 < result.ci_high and result.status == Status.PASSED


def test_a_speed_up_never_fails():
    result = drift.latency_check(np.full(30, 10.0), np.full(30, 1.0), max_ratio=1.01, resamples=100, confidence=0.95,
                                 seed=0)
    assert result.ratio == 0.1 and result.status == Status.PASSED


def _series(samples, backend="onnxrt_fp32", batch=1, kind=TimingKind.CPU_CALL, label="wall-clock"):
    return drift.LatencySeries(backend, batch, kind, label, np.asarray(samples, float))


def test_a_row_timed_in_the_baseline_and_not_here_is_missing():
    row = drift.latency_row(_series([1.0, 3.0]), None, T, seed=0)
    assert row.status == Status.MISSING and "not in this run's benchmark.json" in row.reason
    assert row.baseline_p50_ms == 2.0 and row.run_p50_ms is None and row.ratio is None


@pytest.mark.parametrize("base_n, run_n, judged", [(20, 20, True), (19, 30, False), (30, 19, False), (21, 40, True)])
def test_a_row_is_judged_only_with_min_samples_on_both_sides(base_n, run_n, judged):
    row = drift.latency_row(_series(np.full(base_n, 1.0)), _series(np.full(run_n, 2.0)), T, seed=0)
    assert (row.status == Status.PASSED) is judged
    if not judged:
        assert row.status == Status.SKIPPED and row.ratio is None and row.run_p50_ms == 2.0
        assert row.reason == f"{min(base_n, run_n)} timed runs, fewer than compare.min_samples (20)"


def test_rows_are_matched_by_backend_batch_and_timing_kind_and_seeded_by_position():
    rng = np.random.default_rng(3)
    host = TimingKind.HOST_LATENCY
    noisy = [_series(rng.uniform(1, 2, 30)), _series(rng.uniform(1, 2, 30), batch=4),
             _series(rng.uniform(1, 2, 30), kind=host, label="host")]
    here = [_series(rng.uniform(1, 2, 30), kind=host, label="host"), _series(rng.uniform(1, 2, 30), batch=4),
            _series(rng.uniform(1, 2, 30), kind=TimingKind.GPU_COMPUTE, label="device")]
    rows = drift.compare_latency(noisy, here, T)
    assert [r.status for r in rows] == [Status.MISSING, Status.PASSED, Status.PASSED]
    assert [r.timing_kind for r in rows] == [TimingKind.CPU_CALL, TimingKind.CPU_CALL, host]
    expected = drift.latency_check(noisy[1].samples_ms, here[1].samples_ms, max_ratio=3.0, resamples=200,
                                   confidence=0.95, seed=T.seed + 1)
    assert rows[1].ci_low == expected.ci_low and rows[1].batch_size == 4


@FAST
@given(st.lists(st.tuples(st.sampled_from(list(TimingKind)), st.sampled_from([1, 4]), st.integers(0, 2**31)),
                min_size=1, max_size=6, unique_by=lambda r: r[:2]),
       st.data())
def test_rewording_timing_labels_changes_no_comparison(rows, data):
    """compare keys rows on (backend, batch, timing kind): any labels, on either side, give the same rows
    (labels aside): the same statuses, ratios and intervals."""
    def side(labels, seed_offset):
        return [_series(np.random.default_rng(seed + seed_offset).uniform(1, 2, 30), batch=batch, kind=kind,
                        label=label) for (kind, batch, seed), label in zip(rows, labels, strict=True)]

    def labels():
        return data.draw(st.lists(st.none() | st.text(max_size=20), min_size=len(rows), max_size=len(rows)))

    plain = drift.compare_latency(side([k.value for k, _, _ in rows], 0), side([k.value for k, _, _ in rows], 1), T)
    reworded = drift.compare_latency(side(labels(), 0), side(labels(), 1), T)
    assert [r.model_dump(exclude={"timing"}) for r in reworded] == [r.model_dump(exclude={"timing"}) for r in plain]
    assert all(r.status != Status.MISSING for r in reworded)


# --------------------------------------------------------------------------- the gate


def test_the_gate_fails_on_a_failed_or_missing_entry_only():
    assert drift.gate_passed([])
    assert drift.gate_passed([Status.PASSED, Status.INCONCLUSIVE, Status.SKIPPED])
    assert not drift.gate_passed([Status.PASSED, Status.FAILED])
    assert not drift.gate_passed([Status.MISSING, Status.PASSED])


# --------------------------------------------------------------------------- properties


STATUSES = st.sampled_from([Status.PASSED, Status.FAILED, Status.INCONCLUSIVE, Status.SKIPPED, Status.MISSING])


@FAST
@given(st.lists(STATUSES, max_size=8))
def test_property_a_missing_or_failed_entry_always_fails_the_gate(statuses):
    assert drift.gate_passed(statuses) == (statuses.count(Status.FAILED) + statuses.count(Status.MISSING) == 0)


@FAST
@given(st.sampled_from([None, *Status]), st.sampled_from(["pass", "fail"]), st.booleans())
def test_property_only_a_passing_verdict_with_predictions_is_compared(verdict, policy, has):
    counts = verdict == Status.PASSED or (verdict == Status.INCONCLUSIVE and policy == "pass")
    assert (drift.missing_reason(verdict, policy, has) is None) == (counts and has)


LOGITS = st.floats(-50, 50, allow_nan=False)


def _arrays(draw, n, k):
    return np.array(draw(st.lists(st.lists(LOGITS, min_size=k, max_size=k), min_size=n, max_size=n)))


@st.composite
def logit_pairs(draw):
    n, k = draw(st.integers(1, 6)), draw(st.integers(1, 5))
    return _arrays(draw, n, k), _arrays(draw, n, k), draw(st.floats(0.01, 10))


@FAST
@given(logit_pairs(), st.floats(0.001, 1000))
def test_property_logit_drift_is_scale_invariant(pair, k):
    base, run, scale = pair
    assert drift.logit_drift(base * k, run * k, scale * k) == pytest.approx(drift.logit_drift(base, run, scale),
                                                                            rel=1e-9, abs=1e-9)


@FAST
@given(logit_pairs())
def test_property_logit_drift_is_symmetric_and_the_largest_absolute_change(pair):
    base, run, scale = pair
    out = drift.logit_drift(base, run, scale)
    assert out.tolist() == drift.logit_drift(run, base, scale).tolist()
    oracle = [max(abs(r - b) for r, b in zip(rr, bb, strict=True)) / scale
              for rr, bb in zip(run.tolist(), base.tolist(), strict=True)]
    assert out == pytest.approx(oracle)
    assert (out >= 0).all()


@FAST
@given(st.lists(st.floats(0, 10), min_size=1, max_size=30), st.floats(0.01, 1), st.floats(0, 10))
def test_property_drift_fails_exactly_when_the_quantile_image_exceeds_the_maximum(values, quantile, maximum):
    values = np.array(values)
    result = drift.drift_check(values, quantile, maximum)
    assert (result.status == Status.FAILED) == (np.quantile(values, quantile) > maximum)


SAMPLES = st.lists(st.floats(0.01, 100), min_size=1, max_size=40)


@FAST
@given(SAMPLES, SAMPLES, st.floats(1.01, 10), st.integers(0, 1000))
def test_property_a_row_fails_exactly_when_its_whole_interval_is_above_the_threshold(base, run, threshold, seed):
    result = drift.latency_check(np.array(base), np.array(run), max_ratio=threshold, resamples=100, confidence=0.9,
                                 seed=seed)
    assert result.ci_low <= result.ci_high
    assert (result.status == Status.FAILED) == (result.ci_low > threshold)


@FAST
@given(SAMPLES, st.floats(0.01, 1), st.floats(1.01, 10), st.integers(0, 1000))
def test_property_a_speed_up_never_fails(base, faster, threshold, seed):
    run = np.array(base) * 0 + min(base) * faster  # every run sample at most the fastest baseline sample
    result = drift.latency_check(np.array(base), run, max_ratio=threshold, resamples=100, confidence=0.9, seed=seed)
    assert result.status == Status.PASSED and result.ci_high <= 1.0


@FAST
@given(SAMPLES, st.floats(1.01, 5), st.floats(1.01, 3), st.integers(0, 1000))
def test_property_every_run_sample_beyond_the_threshold_fails(base, threshold, beyond, seed):
    run = np.full(len(base), max(base) * threshold * beyond)
    result = drift.latency_check(np.array(base), run, max_ratio=threshold, resamples=100, confidence=0.9, seed=seed)
    assert result.status == Status.FAILED


@FAST
@given(SAMPLES, SAMPLES, st.floats(1.01, 100), st.integers(0, 1000))
def test_property_latency_is_scale_invariant(base, run, k, seed):
    args = {"max_ratio": 3.0, "resamples": 100, "confidence": 0.9, "seed": seed}
    plain = drift.latency_check(np.array(base), np.array(run), **args)
    scaled = drift.latency_check(np.array(base) * k, np.array(run) * k, **args)
    for key in ("ratio", "ci_low", "ci_high"):
        assert getattr(scaled, key) == pytest.approx(getattr(plain, key), rel=1e-9)


@FAST
@given(st.integers(1, 200), st.data())
def test_property_agreement_bound_is_above_the_rate_and_more_agreement_never_fails_more(n, data):
    agree = data.draw(st.integers(0, n))
    base = np.zeros(n, int)
    run = np.r_[np.zeros(agree, int), np.ones(n - agree, int)]
    result = drift.agreement(base, run, 0.9, 0.95)
    # Wilson: 1 - 2e-16 at p = 1
    assert result.value == agree / n and result.upper_bound >= result.value - 1e-12
    if agree < n:
        better = drift.agreement(base, np.r_[np.zeros(agree + 1, int), np.ones(n - agree - 1, int)], 0.9, 0.95)
        severity = {Status.PASSED: 0, Status.INCONCLUSIVE: 1, Status.FAILED: 2}
        assert severity[better.status] <= severity[result.status]


@FAST
@given(st.lists(st.tuples(st.booleans(), st.booleans()), min_size=1, max_size=60))
def test_property_accuracy_drop_bound_is_below_the_drop_and_counts_match_an_oracle(rights):
    labels = np.zeros(len(rights), int)
    base = np.array([0 if b else 1 for b, _ in rights])
    run = np.array([0 if r else 1 for _, r in rights])
    result = drift.accuracy_change(base, run, labels, 0.01, 0.95)
    lost, gained = sum(b and not r for b, r in rights), sum(r and not b for b, r in rights)
    assert (result.lost, result.gained) == (lost, gained)
    assert result.value == pytest.approx((lost - gained) / len(rights))
    assert result.lower_bound <= result.value + 1e-12


@st.composite
def artifacts(draw):
    n = draw(st.integers(1, 30))
    base_top1 = np.array(draw(st.lists(st.integers(0, 2), min_size=n, max_size=n)))
    run_top1 = np.array(draw(st.lists(st.integers(0, 2), min_size=n, max_size=n)))
    labels = np.array(draw(st.lists(st.integers(0, 2), min_size=n, max_size=n)))
    base_logits, run_logits = _arrays(draw, n, 1), _arrays(draw, n, 1)
    return base_top1, run_top1, labels, base_logits, run_logits


@FAST
@given(artifacts())
def test_property_failed_beats_inconclusive_beats_passed_in_an_artifact(drawn):
    base_top1, run_top1, labels, base_logits, run_logits = drawn
    result = drift.compare_artifact(top5(base_top1[:, None], base_logits), top5(run_top1[:, None], run_logits),
                                    labels, np.array([str(i) for i in range(len(labels))]), CLASSES, 1.0, T)
    statuses = [check.status for check in (result.agreement, result.accuracy, result.drift)]
    expected = (Status.FAILED if Status.FAILED in statuses else
                Status.INCONCLUSIVE if Status.INCONCLUSIVE in statuses else Status.PASSED)
    assert result.status == expected
    assert drift.failed_checks(result) == [k for k, s in zip(("agreement", "accuracy", "drift"), statuses, strict=True)
                                           if s == Status.FAILED]
    assert len(result.flipped) == int(np.sum(base_top1 != run_top1))


# ----------------------------------------------------------------------- the exact words and fields (reports read them)


def test_the_reasons_an_artifact_is_missing_word_for_word():
    assert drift.missing_reason(None, "pass", True) == ("this run's verify has no verdict for it (not a candidate "
                                                         "here, or not run)")
    assert drift.missing_reason(Status.NOT_VERIFIED, "pass", True) == (
        "this run's verdict is about another file: the artifact (or the trained weights) changed or was removed "
        "since verify ran; re-run verify")
    assert drift.missing_reason(Status.PASSED, "pass", False) == "no predictions in this run's verify.predictions.npz"


def test_a_missing_row_word_for_word_with_every_field():
    row = drift.latency_row(_series([1.0, 3.0]), None, T, seed=0).to_json()
    assert row == {"backend": "onnxrt_fp32", "batch_size": 1, "timing": "wall-clock", "timing_kind": "cpu_call",
                   "baseline_p50_ms": 2.0, "ratio": None,
                   "ci_low": None, "ci_high": None, "status": Status.MISSING, "run_p50_ms": None,
                   "reason": "timed in the baseline, not in this run's benchmark.json (benchmark.backends or "
                             "batch_sizes changed, or the backend is not available here)"}
    assert list(row) == ["backend", "batch_size", "timing", "timing_kind", "baseline_p50_ms", "ratio", "ci_low",
                         "ci_high", "status", "run_p50_ms", "reason"]  # compare.json's order


def test_value_errors_say_what_is_wrong():
    with pytest.raises(ValueError, match="^latency samples must be positive, on both sides$"):
        drift.bootstrap_median_ratio(np.array([1.0]), np.array([0.0]), resamples=10, confidence=0.95, seed=0)
    with pytest.raises(ValueError, match=r"^top-k logits of shape \(2, 5\) and \(3, 5\): not the same images$"):
        drift.logit_drift(np.zeros((2, 5)), np.zeros((3, 5)), 1.0)
    with pytest.raises(ValueError, match="^logit scale 0.0: must be positive$"):
        drift.logit_drift(np.zeros((2, 5)), np.zeros((2, 5)), 0.0)


def test_other_names_are_quoted_from_both_sides_and_bounded():
    long = "n" * 300
    said = drift.incompatibility(images(names=np.array(["a", "b", "c", "d"])), images(names=np.array([long, "b", "c",
                                                                                                       "d"])))
    assert "image 0: 'a' there, " in said and "'nnnn" in said
    quoted = said.split(" there, ")[1].split(" here)")[0]
    assert len(quoted) == 80 and quoted.endswith("…")  # repr of the name, cut to 80 characters


def test_short_class_lists_are_shown_whole_up_to_six():
    six, seven = tuple(f"c{i}" for i in range(6)), tuple(f"c{i}" for i in range(7))
    assert "['c0', 'c1', 'c2', 'c3', 'c4', 'c5']" in drift.incompatibility(images(classes=six), images())
    assert "[c0, c1, c2, c3, c4, ... (7 classes)]" in drift.incompatibility(images(classes=seven), images())
    wide = ("w" * 60,)
    assert "'" + "w" * 39 + "…'" in drift.incompatibility(images(classes=wide), images())  # each cut to 40
