"""The precision gate's criteria: how one candidate's outputs are judged against the FP32 reference.

Two checks, both on the same real validation images (docs/verify.md):

* **Tensor check.** ``criterion: scaled`` (the default) measures each image's worst logit error in units of
  the reference's own logit scale: ``e_i = max_j |c_ij - r_ij| / s``, where ``s`` is the root mean square,
  over the images, of each image's standard deviation across its reference logits. A confident model
  has large logits and proportionally large rounding errors; dividing by ``s`` removes that, so one
  threshold holds across models, data sets and training lengths. The gate holds the ``error_quantile``
  of the ``e_i`` (1.0: the worst image) to ``max_scaled_error``. ``criterion: absolute`` keeps
  Polygraphy's ``SimpleCompareFunc`` semantics (atol AND rtol, per batch) for users who want them.
  NaN or Inf in a candidate (or an image whose error cannot be measured) always fails.
* **Task check, with confidence bounds.** Top-1 agreement with the reference (over the images whose
  reference margin exceeds twice the tolerated error: see :func:`task_check`) and the accuracy drop
  against the labels, each decided by a one-sided bound at ``confidence``: *failed* only when the
  sample shows the threshold is crossed (Wilson bound for agreement; for the accuracy drop, a Wilson
  bound on the discordant pairs, McNemar's conditioning); *passed* when the observed value is
  within the threshold; *inconclusive* when it is not but the sample cannot show it, with the number
  of images that would decide it.

Everything here is NumPy on arrays the caller has; nothing runs a model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from pipeline.core.check_results import Bound, Judgement, TaskCheck, TensorCheck
from pipeline.core.status import Status
from pipeline.core.verdicts import fold

PASSED, FAILED, INCONCLUSIVE = Status.PASSED, Status.FAILED, Status.INCONCLUSIVE
TINY = 1e-30  # a reference whose logits are all equal has no scale: any error is then infinite


# --------------------------------------------------------------------------- tensor check: scaled


def _rows(x: np.ndarray) -> np.ndarray:
    """``x`` as float64, one row per image (the first axis); no image: no row."""
    x = np.asarray(x, np.float64)
    return x.reshape(len(x), -1) if x.size else np.zeros((len(x), 0))


def logit_scale(ref: np.ndarray) -> float:
    """RMS over the images (first axis) of each image's standard deviation across its values."""
    flat = _rows(ref)
    finite = np.isfinite(flat).all(axis=1)
    if not finite.any() or flat.shape[1] == 0:
        return TINY
    return max(float(np.sqrt(np.mean(flat[finite].var(axis=1)))), TINY)


def scaled_errors(ref: np.ndarray, cand: np.ndarray) -> np.ndarray:
    """Each image's largest absolute error divided by the reference's scale; inf where either side is not finite."""
    r, c = _rows(ref), _rows(cand)
    scale = logit_scale(ref)
    with np.errstate(all="ignore"):
        diff = np.abs(c - r)
    per_image = np.where(np.isfinite(diff).all(axis=1), diff.max(axis=1, initial=0.0), np.inf)
    return per_image / scale


def image_quantile(errors: np.ndarray, quantile: float) -> float:
    """The ``quantile`` of the per-image errors, taken as the value of a real image (no interpolation):
    1.0 is the worst image, 0.99 the image 1 % of the images exceed."""
    if errors.size == 0:
        return 0.0
    ordered = np.sort(errors)
    return float(ordered[max(0, math.ceil(quantile * len(ordered)) - 1)])  # quantile <= 1: config checks it


def probability_errors(ref: np.ndarray, cand: np.ndarray) -> dict:
    """Softmax-space differences (reported, not gated): the largest |p_c - p_r| and the mean KL(p_r || p_c)."""
    r, c = np.asarray(ref, np.float64), np.asarray(cand, np.float64)
    if r.ndim != 2 or r.size == 0 or not np.isfinite(c).all() or not np.isfinite(r).all():
        return {"max_prob_error": None, "mean_kl": None}
    log_pr = r - r.max(1, keepdims=True) - np.log(np.exp(r - r.max(1, keepdims=True)).sum(1, keepdims=True))
    log_pc = c - c.max(1, keepdims=True) - np.log(np.exp(c - c.max(1, keepdims=True)).sum(1, keepdims=True))
    pr, pc = np.exp(log_pr), np.exp(log_pc)
    return {"max_prob_error": float(np.abs(pc - pr).max()), "mean_kl": float((pr * (log_pr - log_pc)).sum(1).mean())}


def scaled_check(ref: np.ndarray, cand: np.ndarray, gate: dict, **more) -> TensorCheck:
    """The scaled tensor check of one output over every image (``ref``, ``cand``: [images, ...]); ``more``: what the
    caller measured beside it (the batches, :func:`error_statistics`)."""
    scale = logit_scale(ref)
    errors = scaled_errors(ref, cand)
    statistic = image_quantile(errors, gate["error_quantile"])
    nonfinite = int((~np.isfinite(np.asarray(cand, np.float64))).sum())
    passed = bool(statistic <= gate["max_scaled_error"]) and nonfinite == 0  # NaN compares False: fails
    return TensorCheck(
        passed=passed, criterion="scaled", statistic=f"q{gate['error_quantile']:g} of per-image scaled error",
        mismatch_fraction=float((~(errors <= gate["max_scaled_error"])).mean()) if errors.size else 0.0,
        scale=scale, scaled_error=float(errors.max(initial=0)), scaled_error_quantile=statistic,
        error_quantile=gate["error_quantile"], threshold=gate["max_scaled_error"],
        images_over=int((~(errors <= gate["max_scaled_error"])).sum()),
        worst_image=int(np.argmax(errors)) if errors.size else 0,  # no NaN: scaled_errors makes it inf
        nonfinite=nonfinite, **probability_errors(ref, cand), **more)


# --------------------------------------------------------------------------- tensor check: absolute (Polygraphy)


def absolute_check(outputs: list[dict], reference: list[dict], gate: dict, output_name: str, **stats) -> TensorCheck:
    """Polygraphy's ``SimpleCompareFunc`` per batch (atol AND rtol, relative to the reference; NaN fails);
    ``stats``: :func:`error_statistics`."""
    from polygraphy.comparator import Comparator, RunResults, SimpleCompareFunc

    results = RunResults()
    results.add(outputs, runner_name="candidate")
    results.add(reference, runner_name="reference")
    func = SimpleCompareFunc(atol=gate["atol"], rtol=gate["rtol"], check_error_stat=gate["check_error_stat"],
                             error_quantile=gate["error_quantile"], infinities_compare_equal=False)
    with np.errstate(all="ignore"):  # non-finite candidates are expected here, and fail below
        accuracy = Comparator.compare_accuracy(results, compare_func=func, comparisons=[(0, 1)])
    per_batch = list(accuracy[0].values())[0]
    failed = [i for i, outs in enumerate(per_batch) if not all(bool(v) for v in outs.values())]
    cand = np.concatenate([o[output_name] for o in outputs]).astype(np.float64)
    ref = np.concatenate([r[output_name] for r in reference]).astype(np.float64)
    atol = output_tolerance(gate["atol"], output_name, DEFAULT_TOLERANCE)
    rtol = output_tolerance(gate["rtol"], output_name, DEFAULT_TOLERANCE)
    nonfinite = int((~np.isfinite(cand)).sum())
    return TensorCheck(
        passed=not failed and nonfinite == 0, criterion="absolute", statistic=gate["check_error_stat"],
        batches=len(per_batch), failed_batches=failed, nonfinite=nonfinite,
        mismatch_fraction=float(elementwise_mismatch(ref, cand, atol, rtol).mean()) if cand.size else 0.0, **stats)


# Polygraphy's SimpleCompareFunc defaults, for an output that a per-output tolerance dict does not name.
DEFAULT_TOLERANCE = 1e-5
EPS = 2.220446049250313e-16  # Polygraphy's epsilon for zero reference values


def output_tolerance(value, output_name: str, default: float) -> float:
    """The tolerance Polygraphy applies to ``output_name``: its own entry, else '' , else ``default``."""
    if isinstance(value, dict):
        return float(value.get(output_name, value.get("", default)))
    return float(value if value is not None else default)


def scalar_tolerance(value, default: float) -> float:
    """Intermediate tensors have no per-output entry: use the default ('') or the tightest value."""
    if isinstance(value, dict):
        return float(value.get("", min(value.values(), default=default)))
    return float(value if value is not None else default)


def elementwise_mismatch(ref: np.ndarray, cand: np.ndarray, atol: float, rtol: float) -> np.ndarray:
    """Polygraphy's elementwise rule: an element fails when abs > atol AND rel > rtol (relative to the
    reference; NaN fails)."""
    with np.errstate(all="ignore"):
        absdiff = np.abs(cand - ref)
        denom = np.abs(ref)
        denom[denom == 0] = EPS
        reldiff = absdiff / denom
    return (np.isnan(absdiff) | (absdiff > atol)) & (np.isnan(reldiff) | (reldiff > rtol))


def error_statistics(ref: np.ndarray, cand: np.ndarray, quantile: float) -> dict:
    """Absolute and relative (to the reference) error statistics over every element, for the reports."""
    r, c = np.asarray(ref, np.float64), np.asarray(cand, np.float64)
    with np.errstate(all="ignore"):
        absdiff = np.abs(c - r)
        reldiff = absdiff / np.where(r == 0, np.finfo(np.float64).eps, np.abs(r))
    stats = {}
    for kind, diff in (("abs", absdiff), ("rel", reldiff)):
        finite = diff[np.isfinite(diff)]
        stats[f"max_{kind}_error"] = float(finite.max()) if finite.size == diff.size and diff.size else float("inf")
        for stat, fn in (("mean", np.mean), ("median", np.median)):
            stats[f"{stat}_{kind}_error"] = float(fn(finite)) if finite.size else float("nan")
        stats[f"quantile_{kind}_error"] = float(np.quantile(finite, quantile)) if finite.size else float("nan")
    return stats


# --------------------------------------------------------------------------- one tensor, for localisation


@dataclass(frozen=True)
class TensorRule:
    """When one tensor (an output or an intermediate one) is over tolerance: the gate's own criterion, applied
    to that tensor (scaled: its worst image's error in units of the tensor's own scale; absolute: Polygraphy's
    elementwise atol AND rtol)."""

    criterion: str
    max_scaled_error: float
    atol: float
    rtol: float

    @classmethod
    def of(cls, gate: dict) -> "TensorRule":
        return cls(gate.get("criterion", "scaled"), float(gate.get("max_scaled_error", 0.0)),
                   scalar_tolerance(gate.get("atol"), 0.0), scalar_tolerance(gate.get("rtol"), 0.0))

    def describe(self) -> dict:
        if self.criterion == "absolute":
            return {"atol": self.atol, "rtol": self.rtol, "rule": "elementwise: abs > atol and rel > rtol"}
        return {"max_scaled_error": self.max_scaled_error,
                "rule": "scaled: an image's largest error / the tensor's scale (RMS of each image's std) > max"}

    def errors(self, ref: np.ndarray, cand: np.ndarray) -> dict:
        """The tensor's error statistics and whether it exceeds this rule (``exceeds``)."""
        r, c = np.asarray(ref, np.float64), np.asarray(cand, np.float64)
        finite_ref = r[np.isfinite(r)]
        stats = error_statistics(r, c, 0.99)
        scaled = scaled_errors(r, c) if r.ndim and len(r) else np.zeros(0)
        stats.update({"scaled_error": float(scaled.max(initial=0.0)), "nonfinite": int((~np.isfinite(c)).sum()),
                      "fp32_min": float(finite_ref.min()) if finite_ref.size else None,
                      "fp32_max": float(finite_ref.max()) if finite_ref.size else None})
        if self.criterion == "absolute":
            bad = elementwise_mismatch(r, c, self.atol, self.rtol)
            stats["mismatch_fraction"] = float(bad.mean()) if bad.size else 0.0
            stats["exceeds"] = bool(bad.any())
        else:
            over = ~(scaled <= self.max_scaled_error)  # NaN counts as over
            stats["mismatch_fraction"] = float(over.mean()) if over.size else 0.0
            stats["exceeds"] = bool(over.any())  # a non-finite value is an infinite error: over
        return stats


def localization_limit(max_scaled_error: float, observed: float | None) -> float:
    """The per-tensor limit localisation uses: the gate's own, or half the candidate's output error when that is
    smaller, so a candidate that failed on its task check with a smaller error still has its source named (the
    cancellation fault in the INT8 graph: output error 0.4 of its scale, under INT8's 0.5, but 13 % of the images
    flipped). An unmeasured or non-finite error leaves the gate's limit."""
    if observed is None or not math.isfinite(observed) or observed <= 0:
        return max_scaled_error
    return min(max_scaled_error, observed / 2)


def worst_batch_index(tensor_check: TensorCheck | None, batch_size: int) -> int:
    """The batch that holds a candidate's worst image (scaled criterion), or its first failing batch (absolute);
    localisation runs on that batch (none measured: the first)."""
    if tensor_check is None:
        return 0
    if tensor_check.criterion == "scaled":
        return int(tensor_check.worst_image or 0) // batch_size
    return int((tensor_check.failed_batches or [0])[0])


# --------------------------------------------------------------------------- task check with confidence bounds


def z_value(confidence: float) -> float:
    """The one-sided normal quantile of ``confidence`` (0.95 -> 1.645)."""
    return NormalDist().inv_cdf(confidence)


def wilson(successes: int, n: int, z: float) -> tuple[float, float]:
    """Wilson's score interval for a binomial proportion (good near 0 and 1, where agreement lives)."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, min(p, centre - half)), min(1.0, max(p, centre + half))  # rounding never excludes p itself


def _more_images(n: int, decided, limit: int = 1 << 24) -> int | None:
    """The fewest images, beyond ``n``, at the same observed rate, for which ``decided(n')`` holds (None: no
    practical number: the observed rate is too close to the threshold)."""
    target = n
    while target < limit:
        target *= 2
        if decided(target):
            low, high = target // 2, target
            while high - low > 1:
                mid = (low + high) // 2
                low, high = (low, mid) if decided(mid) else (mid, high)
            return high - n
    return None


def agreement_check(agree: int, n: int, minimum: float, z: float) -> Bound:
    """Top-1 agreement: failed only when Wilson's upper bound is below ``minimum`` (no image: nothing to judge)."""
    rate = agree / n if n else 1.0
    upper = wilson(agree, n, z)[1]
    if rate >= minimum:
        status, needed = PASSED, 0
    elif upper < minimum:
        status, needed = FAILED, 0
    else:
        status = INCONCLUSIVE
        needed = _more_images(n, lambda m: wilson(round(rate * m), m, z)[1] < minimum)
    return Bound(status=status, value=rate, upper_bound=upper, threshold=minimum, more_images=needed)


def accuracy_drop_check(lost: int, gained: int, n: int, maximum: float, z: float) -> Bound:
    """The accuracy drop ``(lost - gained) / n`` over paired images (lost: the reference right and the candidate
    wrong; gained: the reverse). Failed only when its lower bound exceeds ``maximum``: Wilson's lower bound on the
    share of lost among the discordant pairs, McNemar's conditioning."""
    drop = (lost - gained) / n if n else 0.0
    discordant = lost + gained

    def lower(lost_: int, discordant_: int, n_: int) -> float:
        if discordant_ == 0:
            return 0.0
        return discordant_ / n_ * (2 * wilson(lost_, discordant_, z)[0] - 1)

    bound = lower(lost, discordant, n)
    if drop <= maximum:
        status, needed = PASSED, 0
    elif bound > maximum:
        status, needed = FAILED, 0
    else:
        status = INCONCLUSIVE
        needed = _more_images(n, lambda m: lower(round(lost * m / n), round(discordant * m / n), m) > maximum)
    return Bound(status=status, value=drop, lower_bound=bound, threshold=maximum, more_images=needed)


def top1(logits: np.ndarray) -> np.ndarray:
    """Each image's top-1 class; NaN never wins (a NaN logit counts as -inf)."""
    return np.nan_to_num(np.asarray(logits, np.float64), nan=-np.inf).argmax(1)


def top1_margins(ref: np.ndarray) -> np.ndarray:
    """Each image's reference margin: its top logit minus its second (inf with one class)."""
    r = np.sort(np.nan_to_num(np.asarray(ref, np.float64), nan=-np.inf), axis=1)
    return r[:, -1] - r[:, -2] if r.shape[1] > 1 else np.full(len(r), np.inf)


def task_check(ref: np.ndarray, cand: np.ndarray, labels: np.ndarray, gate: dict, confidence: float,
               tie_margin: float = 0.0) -> TaskCheck:
    """Top-1 agreement with the reference and accuracy against the labels, each with its confidence bound.

    Agreement is counted over the *decided* images: those whose reference margin (top logit minus second) exceeds
    ``tie_margin``, twice the error the tensor check tolerates. On a near-tie, that tolerated error alone can swap
    the top two classes; counting such a flip again would fail every barely trained model for noise the tensor
    check accepts. The accuracy drop counts every image (gains offset losses there)."""
    ref_top1, cand_top1 = top1(ref), top1(cand)
    n = len(labels)
    z = z_value(confidence)
    decided = top1_margins(ref) > tie_margin
    ref_right, cand_right = ref_top1 == labels, cand_top1 == labels
    agreement = agreement_check(int(((ref_top1 == cand_top1) & decided).sum()), int(decided.sum()),
                                gate["min_top1_agreement"], z)
    drop = accuracy_drop_check(int((ref_right & ~cand_right).sum()), int((~ref_right & cand_right).sum()), n,
                               gate["max_accuracy_drop"], z)
    status = fold((agreement.status, drop.status))  # failed over inconclusive over passed
    return TaskCheck(status=status, passed=status == PASSED, samples=n, confidence=confidence,
                     top1_agreement=float((ref_top1 == cand_top1).mean()) if n else 1.0,
                     reference_accuracy=float(ref_right.mean()) if n else 0.0,
                     accuracy=float(cand_right.mean()) if n else 0.0, accuracy_drop=drop.value,
                     disagreements=int((ref_top1 != cand_top1).sum()), near_ties=int((~decided).sum()),
                     tie_margin=tie_margin, agreement=agreement, drop=drop,
                     more_images=_most(agreement.more_images, drop.more_images, status))


def _most(a: int | None, b: int | None, status: str) -> int | None:
    """The images still needed: the larger need; None when an inconclusive check has no practical one."""
    if status != INCONCLUSIVE:
        return 0
    return None if a is None or b is None else max(a, b)


# --------------------------------------------------------------------------- one candidate


def judge(outputs: list[dict], reference: list[dict], labels: np.ndarray, gate: dict, output_name: str,
          confidence: float) -> Judgement:
    """Both checks of one candidate; ``status`` is failed when either fails, inconclusive when the tensor check
    passes and the task check cannot decide, else passed."""
    cand = np.concatenate([o[output_name] for o in outputs]).astype(np.float64)
    ref = np.concatenate([r[output_name] for r in reference]).astype(np.float64)
    tensor = tensor_check(outputs, reference, ref, cand, gate, output_name)
    tie = 2 * gate["max_scaled_error"] * tensor.scale if tensor.criterion == "scaled" else 0.0
    task = task_check(ref, cand, labels, gate, confidence, tie_margin=tie)
    return Judgement(tensor, task, fold((PASSED if tensor.passed else FAILED, task.status)))


def tensor_check(outputs: list[dict], reference: list[dict], ref: np.ndarray, cand: np.ndarray, gate: dict,
                 output_name: str) -> TensorCheck:
    """The tensor check of ``gate``'s criterion over every batch, with every element's error statistics."""
    stats = error_statistics(ref, cand, gate["error_quantile"])
    if gate["criterion"] == "absolute":
        return absolute_check(outputs, reference, gate, output_name, **stats)
    return scaled_check(ref, cand, gate, batches=len(outputs), failed_batches=[], **stats)
