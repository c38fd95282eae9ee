"""The learning check's decision (a pure function: properties with Hypothesis, in milliseconds) and its words, and
precise BatchNorm statistics on small modules."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from pipeline.precision.gate import wilson, z_value
from pipeline.training import batchnorm, learning
from pipeline.training.learning import LearningEvidence, LearningPolicy, judge

POLICY = LearningPolicy(confidence=0.95, require_learning=True, min_val_accuracy=None, min_mode_agreement=0.8)


@st.composite
def evidence(draw) -> LearningEvidence:
    classes = draw(st.integers(2, 1000))
    samples = draw(st.integers(1, 5000))
    mode_samples = draw(st.integers(0, samples))
    mode_agree = draw(st.integers(0, mode_samples))
    return LearningEvidence(
        classes=classes, samples=samples, correct=draw(st.integers(0, samples)),
        majority=draw(st.integers(-(-samples // classes), samples)), mode_samples=mode_samples,
        mode_agree=mode_agree, train_mode_correct=draw(st.integers(0, mode_samples)),
        batchnorm_agree=draw(st.none() | st.integers(0, mode_samples)), dropout=draw(st.booleans()),
        precise_bn=draw(st.booleans()))


@st.composite
def policies(draw) -> LearningPolicy:
    return LearningPolicy(confidence=draw(st.floats(0.5, 0.999)), require_learning=draw(st.booleans()),
                          min_val_accuracy=draw(st.none() | st.floats(0, 1)),
                          min_mode_agreement=draw(st.floats(0, 1)))


@settings(max_examples=150, deadline=None)
@given(evidence(), policies())
def test_the_verdict_follows_its_definition(e, policy):
    v = judge(e, policy)
    assert v.chance >= 1 / e.classes and v.chance == max(1 / e.classes, e.majority / e.samples)
    assert v.learned == (v.lower > v.chance)
    assert v.lower <= v.accuracy + 1e-12  # a lower bound
    assert v.failed == ((policy.require_learning and not v.learned) or v.below_minimum)
    assert v.below_minimum == (policy.min_val_accuracy is not None and v.accuracy < policy.min_val_accuracy)
    assert v.mode_gap == (v.mode_upper < policy.min_mode_agreement)
    assert (v.gap_cause is None) == (not v.mode_gap)
    assert v.gap_cause in (None, *learning.CAUSES)
    assert v.train_mode_learned == (wilson(e.train_mode_correct, e.mode_samples, z_value(policy.confidence))[0]
                                    > v.chance)


@settings(max_examples=150, deadline=None)
@given(evidence(), policies())
def test_no_better_than_chance_never_learned(e, policy):
    """Accuracy at or below chance (uniform, or the most common label's share) is never "learned"."""
    v = judge(e, policy)
    if v.accuracy <= v.chance:
        assert not v.learned
        if policy.require_learning:
            assert v.failed


@settings(max_examples=150, deadline=None)
@given(evidence(), policies(), st.integers(1, 100))
def test_more_right_answers_never_unlearn(e, policy, more):
    """Monotone: the same validation set with more images right stays learned (and above any minimum)."""
    v = judge(e, policy)
    better = judge(dataclasses.replace(e, correct=min(e.samples, e.correct + more)), policy)
    assert better.accuracy >= v.accuracy
    assert better.learned or not v.learned
    assert not better.below_minimum or v.below_minimum


@settings(max_examples=100, deadline=None)
@given(evidence(), policies(), st.floats(0.5, 0.999))
def test_more_confidence_asks_more(e, policy, other):
    """Learned at a higher confidence implies learned at a lower one (the bound only widens)."""
    low, high = sorted((policy.confidence, other))
    if judge(e, dataclasses.replace(policy, confidence=high)).learned:
        assert judge(e, dataclasses.replace(policy, confidence=low)).learned


@settings(max_examples=100, deadline=None)
@given(evidence(), policies())
def test_nothing_required_nothing_fails(e, policy):
    v = judge(e, dataclasses.replace(policy, require_learning=False, min_val_accuracy=None))
    assert not v.failed


@settings(max_examples=100, deadline=None)
@given(evidence(), policies())
def test_modes_that_agree_show_no_gap(e, policy):
    agreeing = dataclasses.replace(e, mode_agree=e.mode_samples)
    assert not judge(agreeing, dataclasses.replace(policy, min_mode_agreement=min(policy.min_mode_agreement,
                                                                                   0.5))).mode_gap


def test_the_bounds_are_the_gates():
    """Wilson's one-sided bounds at verify.confidence, as verify's task check computes them."""
    e = LearningEvidence(classes=10, samples=600, correct=60, majority=60, mode_samples=256, mode_agree=30,
                         train_mode_correct=220, batchnorm_agree=40, dropout=True, precise_bn=False)
    v = judge(e, POLICY)
    assert v.lower == wilson(60, 600, z_value(0.95))[0] and v.mode_upper == wilson(30, 256, z_value(0.95))[1]


def collapsed(**changes) -> LearningEvidence:
    """Issue 31: MobileNetV3 after a short schedule, eval mode answering one class; train mode right."""
    return dataclasses.replace(LearningEvidence(
        classes=10, samples=600, correct=60, majority=60, mode_samples=256, mode_agree=26, train_mode_correct=222,
        batchnorm_agree=27, dropout=True, precise_bn=False), **changes)


def test_the_collapse_is_chance_and_names_batchnorm():
    e = collapsed()
    v = judge(e, POLICY)
    assert not v.learned and v.failed and v.mode_gap and v.gap_cause == "batchnorm"
    line = learning.not_learned_line(e, v, 0.95)
    assert line.startswith("the model did not learn: val acc 10.0 % is chance for 10 classes (its lower bound at "
                           "95 % confidence over 600 validation images is 8.2 %, not above 10.0 %)")
    assert "in train mode the same weights reach 86.7 %" in line and "train.precise_bn.enabled=true" in line


def test_the_train_mode_hint_only_where_train_mode_learned():
    e = collapsed(train_mode_correct=30)
    v = judge(e, POLICY)
    assert v.mode_gap and not v.train_mode_learned and "train mode" not in learning.not_learned_line(e, v, 0.95)


@pytest.mark.parametrize("changes, cause", [
    ({"precise_bn": True}, "data"),  # the statistics were just re-estimated: training and validation images differ
    ({"batchnorm_agree": 250}, "dropout"),  # BatchNorm alone agrees: dropout makes the difference
    ({"batchnorm_agree": None, "dropout": False}, "other"),
])
def test_the_gap_names_its_likely_cause(changes, cause):
    assert judge(collapsed(**changes), POLICY).gap_cause == cause


def test_majority_class_is_chance_on_imbalanced_labels():
    e = LearningEvidence(classes=2, samples=100, correct=80, majority=80, mode_samples=0, mode_agree=0,
                         train_mode_correct=0, batchnorm_agree=None, dropout=False, precise_bn=False)
    v = judge(e, POLICY)
    assert v.chance == 0.8 and v.majority_chance and not v.learned  # 80 % is what "always the common class" gets
    assert "chance for these validation labels (the most common class is 80.0 % of them)" in \
        learning.not_learned_line(e, v, 0.95)


def test_above_chance_but_too_few_images_is_not_clearly_above():
    e = LearningEvidence(classes=10, samples=20, correct=4, majority=2, mode_samples=0, mode_agree=0,
                         train_mode_correct=0, batchnorm_agree=None, dropout=False, precise_bn=True)
    v = judge(e, POLICY)
    assert not v.learned and "val acc 20.0 % is not clearly above chance for 10 classes" in \
        learning.not_learned_line(e, v, 0.95)


def test_min_val_accuracy_is_a_quality_gate():
    e = collapsed(correct=500, mode_agree=256, batchnorm_agree=256)
    policy = dataclasses.replace(POLICY, min_val_accuracy=0.9)
    v = judge(e, policy)
    assert v.learned and v.below_minimum and v.failed and not v.mode_gap
    assert learning.below_minimum_line(e, v, policy).startswith(
        "val acc 83.3 % is below train.min_val_accuracy 90.0 % (over 600 validation images")


# --------------------------------------------------------------------------- precise BatchNorm statistics


def small_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4, momentum=0.01), nn.ReLU(), nn.Dropout(0.5),
                         nn.Flatten(), nn.Linear(4 * 6 * 6, 3))


def test_precise_statistics_are_the_average_over_the_batches_and_nothing_else_changes():
    net = small_net()
    batches = [torch.randn(8, 3, 8, 8) * (i + 1) + i for i in range(5)]
    bn = net[1]
    bn.num_batches_tracked.fill_(123)
    params = {k: v.clone() for k, v in net.named_parameters()}
    rng = torch.get_rng_state()
    net.train()
    assert batchnorm.recompute_statistics(net, batches, amp_dtype=None, device_type="cpu") == 5
    features = [net[0](x) for x in batches]
    with torch.no_grad():
        expected_mean = torch.stack([f.mean((0, 2, 3)) for f in features]).mean(0)
        expected_var = torch.stack([f.var((0, 2, 3), unbiased=True) for f in features]).mean(0)
    torch.testing.assert_close(bn.running_mean, expected_mean)
    torch.testing.assert_close(bn.running_var, expected_var)
    assert bn.momentum == 0.01 and int(bn.num_batches_tracked) == 123  # only mean and variance change
    assert all(torch.equal(p, params[k]) for k, p in net.named_parameters())
    assert torch.equal(torch.get_rng_state(), rng)  # dropout stayed off: no random number drawn
    assert net.training and all(m.training for m in net.modules())  # modes restored


def test_precise_statistics_do_not_depend_on_the_statistics_before():
    a, b = small_net(), small_net()
    b[1].running_mean.fill_(5.0)
    b[1].running_var.fill_(9.0)
    batches = [torch.randn(8, 3, 8, 8) for _ in range(3)]
    for net in (a, b):
        batchnorm.recompute_statistics(net, batches, amp_dtype=None, device_type="cpu")
    assert torch.equal(a[1].running_mean, b[1].running_mean) and torch.equal(a[1].running_var, b[1].running_var)


def test_mode_predictions_leave_buffers_modes_and_rng_as_they_were():
    net = small_net().eval()
    images = torch.randn(16, 3, 8, 8)
    buffers = [b.clone() for b in net.buffers()]
    rng = torch.get_rng_state()
    modes = batchnorm.mode_predictions(net, images, batch_size=8, seed=0)
    assert modes.eval.shape == modes.train.shape == modes.batchnorm_only.shape == (16,)
    assert all(torch.equal(a, b) for a, b in zip(net.buffers(), buffers, strict=True))
    assert torch.equal(torch.get_rng_state(), rng) and not net.training
    again = batchnorm.mode_predictions(net, images, batch_size=8, seed=0)
    assert torch.equal(again.train, modes.train)  # dropout's masks come from the seed
