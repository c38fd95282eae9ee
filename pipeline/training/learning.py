"""Did the model learn? One pure decision over plain numbers, and its words.

The train stage gathers the numbers (:class:`LearningEvidence`: counts over the validation images, in eval mode and in
train mode) and raises on the verdict; everything that decides is here, so it is tested in milliseconds
(``tests/test_learning.py``, with Hypothesis). The bounds are the precision gate's (Wilson's, one-sided at
``verify.confidence``): a model learned when the lower bound of its validation accuracy lies above chance, and
train and eval mode disagree when the upper bound of their top-1 agreement lies below
``train.min_mode_agreement``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from pipeline.precision.gate import wilson, z_value

# The likely cause of a train/eval gap, as the warning and the "did not learn" line name it.
CAUSES = {
    "batchnorm": "the BatchNorm running statistics do not match the batch statistics the weights were trained with "
                 "(train.precise_bn.enabled=true re-estimates them)",
    "data": "BatchNorm: the statistics re-estimated on training batches still differ from those of validation batches "
            "(training and validation images that differ: augmentation, normalisation, source; or batches of "
            "data.batch_size too small for steady statistics)",
    "dropout": "dropout: the predictions depend on its masks",
    "other": "a layer that computes differently in train mode",
}


@dataclass(frozen=True)
class LearningEvidence:
    """What the train stage counted on the validation images, with the model that is exported."""

    classes: int  # the data set's class count
    samples: int  # validation images
    correct: int  # ... that the exported model (eval mode) predicts right
    majority: int  # ... that carry the most common label
    mode_samples: int  # validation images predicted in both modes
    mode_agree: int  # ... with the same top-1 in train mode and in eval mode
    train_mode_correct: int  # ... predicted right in train mode
    batchnorm_agree: int | None  # ... same top-1 in eval mode and with only BatchNorm on batch statistics (None: none)
    dropout: bool  # the model has dropout layers
    precise_bn: bool  # its BatchNorm statistics were re-estimated on training batches


@dataclass(frozen=True)
class LearningPolicy:
    """The config keys that decide."""

    confidence: float  # verify.confidence: one-sided
    require_learning: bool  # train.require_learning
    min_val_accuracy: float | None  # train.min_val_accuracy
    min_mode_agreement: float  # train.min_mode_agreement


@dataclass(frozen=True)
class LearningVerdict:
    accuracy: float  # validation accuracy of the exported model
    lower: float  # its lower bound at the confidence
    chance: float  # 1 / classes, or the share of the most common validation label where that is higher
    majority_chance: bool  # chance is the most common label's share (imbalanced validation labels)
    learned: bool  # lower > chance
    below_minimum: bool  # accuracy < train.min_val_accuracy
    mode_agreement: float  # top-1 agreement of train and eval mode
    mode_upper: float  # its upper bound at the confidence
    mode_gap: bool  # mode_upper < train.min_mode_agreement
    gap_cause: str | None  # a key of CAUSES where mode_gap, else None
    train_mode_accuracy: float  # on the images of the mode check
    train_mode_learned: bool  # ... above chance at the confidence: the weights learned, whatever eval mode shows
    failed: bool  # train fails (exit 1): not learned while required, or below the minimum

    def to_dict(self) -> dict:
        return asdict(self)


def judge(evidence: LearningEvidence, policy: LearningPolicy) -> LearningVerdict:
    """The verdict on ``evidence`` under ``policy``; no I/O."""
    z = z_value(policy.confidence)
    e = evidence
    accuracy = e.correct / e.samples if e.samples else 0.0
    lower = wilson(e.correct, e.samples, z)[0]
    uniform = 1.0 / e.classes
    majority = e.majority / e.samples if e.samples else 0.0
    chance = max(uniform, majority)
    learned = lower > chance
    below = policy.min_val_accuracy is not None and accuracy < policy.min_val_accuracy
    agreement = e.mode_agree / e.mode_samples if e.mode_samples else 1.0
    upper = wilson(e.mode_agree, e.mode_samples, z)[1]
    gap = upper < policy.min_mode_agreement
    train_mode = e.train_mode_correct / e.mode_samples if e.mode_samples else 0.0
    return LearningVerdict(
        accuracy=accuracy, lower=lower, chance=chance, majority_chance=majority > uniform, learned=learned,
        below_minimum=below, mode_agreement=agreement, mode_upper=upper, mode_gap=gap,
        gap_cause=gap_cause(e) if gap else None, train_mode_accuracy=train_mode,
        train_mode_learned=wilson(e.train_mode_correct, e.mode_samples, z)[0] > chance,
        failed=(policy.require_learning and not learned) or below,
    )


def gap_cause(e: LearningEvidence) -> str:
    """Which difference between the modes accounts for most of the disagreement.

    Eval mode with only BatchNorm switched to batch statistics isolates BatchNorm: when that alone gives at least
    half the disagreement, the statistics are the cause (stale ones, or where they were just re-estimated on
    training batches, training images unlike the validation images); otherwise dropout, where the model has it.
    """
    total = e.mode_samples - e.mode_agree
    if e.batchnorm_agree is not None and 2 * (e.mode_samples - e.batchnorm_agree) >= total:
        return "data" if e.precise_bn else "batchnorm"
    return "dropout" if e.dropout else "other"


# --------------------------------------------------------------------------- words


def percent(share: float) -> str:
    return f"{100 * share:.1f} %"


def level(confidence: float) -> str:
    """A confidence as the gate words it: 0.95 -> "95 %"."""
    return f"{100 * confidence:g} %"


def chance_words(e: LearningEvidence, v: LearningVerdict) -> str:
    if v.majority_chance:
        return f"chance for these validation labels (the most common class is {percent(v.chance)} of them)"
    return f"chance for {e.classes} classes"


def not_learned_line(e: LearningEvidence, v: LearningVerdict, confidence: float) -> str:
    """``the model did not learn: val acc 10.0 % is chance for 10 classes (...)``, with the likely cause."""
    verb = "is" if v.accuracy <= v.chance else "is not clearly above"
    line = (f"the model did not learn: val acc {percent(v.accuracy)} {verb} {chance_words(e, v)} (its lower bound at "
            f"{level(confidence)} confidence over {e.samples} validation images is {percent(v.lower)}, not above "
            f"{percent(v.chance)})")
    if v.mode_gap and v.train_mode_learned:  # the weights did learn: eval mode loses it
        line += f"; in train mode the same weights reach {percent(v.train_mode_accuracy)}, likely cause: " \
                f"{CAUSES[v.gap_cause]}"
    return line


def below_minimum_line(e: LearningEvidence, v: LearningVerdict, policy: LearningPolicy) -> str:
    return (f"val acc {percent(v.accuracy)} is below train.min_val_accuracy {percent(policy.min_val_accuracy)} (over "
            f"{e.samples} validation images; lower bound {percent(v.lower)} at {level(policy.confidence)} "
            "confidence)")


def gap_line(e: LearningEvidence, v: LearningVerdict, policy: LearningPolicy) -> str:
    return (f"train mode and eval mode disagree: top-1 agreement {percent(v.mode_agreement)} over {e.mode_samples} "
            f"validation images (upper bound {percent(v.mode_upper)} at {level(policy.confidence)} confidence, "
            f"below train.min_mode_agreement {percent(policy.min_mode_agreement)}); likely cause: "
            f"{CAUSES[v.gap_cause]}")


def summary(e: LearningEvidence, v: LearningVerdict, policy: LearningPolicy) -> str:
    """One line for the manifest, the end-of-run summary and verify: the verdict and its numbers."""
    if not v.learned:
        return not_learned_line(e, v, policy.confidence)
    return (f"learned: val acc {percent(v.accuracy)} (lower bound {percent(v.lower)} at {level(policy.confidence)} "
            f"confidence) above {chance_words(e, v)} ({percent(v.chance)})")
