"""Conformance beyond tolerance: an artifact that agrees with the reference on verify's batches can still be wrong
in two ways no output check sees.

**Row independence.** An image's answer must not depend on its batch: on the other images in it, on its slot, or on
the batch size (NVIDIA/TensorRT#4853: SegFormer wrong at batch > 1 and bit-exact at batch 1; #4813: a DETR's errors
depend on the batch slot and the other rows). While a candidate's runner is still active, the first
``build.max_batch`` images of the evidence run in four arrangements (:func:`arrangements`):

* ``alone``: each image at batch 1 (the base, where the artifact serves batch 1);
* ``batch``: all of them in one full batch, in order;
* ``reversed``: the same batch reversed, so every image sits in another slot beside other neighbours;
* ``companions``: each image in its own slot, the rest of its batch filled with copies of one hard image (the
  evidence's image whose reference logits are largest).

Each image's output in each arrangement is compared with its base output, in units of its own logit scale
(``max|row - base| / max|base|``, :func:`deviations`), and held to the precision's ``max_row_deviation``
(``verify.<precision>``, set from how exact each CPU backend measured here: docs/verify.md). A row over it fails
the candidate, and the reason names the arrangement, the batch size and the slot.

**The precision manifest.** Each runtime's own account of the precision each matrix layer ran in
(:mod:`pipeline.runtime.profiling.layer_account`), as shares of the matrix layers. A candidate that claims a lower
precision
(its table entry's ``claims``) fails when fewer than ``verify.min_precision_share`` of the matrix layers its graph
puts in that precision ran in it (roboflow/rf-detr#1453: ``fp16=True`` wrote an FP32 engine): an INT8 artifact
whose convolutions run in FP32 on dequantized values, a "BF16" model with no BF16 layer.

Everything here is pure (the decisions :func:`judge_rows` and :func:`judge_claim`, the arrangements, the
wording); :mod:`pipeline.evaluation.conformance_runs` runs them on a candidate's runner.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from pipeline.core.check_results import Arrangement, ClaimCheck, Conformance, RowsCheck
from pipeline.core.status import Status

if TYPE_CHECKING:  # annotations only
    from pipeline.core.config_schema import Config

ARRANGEMENTS = ("alone", "batch", "reversed", "companions")
SCALE_FLOOR = 1e-12  # an all-zero base row: its deviation is the absolute one


# --------------------------------------------------------------------------- the decisions (pure)


@dataclass(frozen=True)
class RowFinding:
    """The worst row of one arrangement: image ``image`` in slot ``slot`` of a batch of ``batch_size``."""

    arrangement: str
    batch_size: int
    slot: int
    image: int
    deviation: float  # max |row - base| over the base row's largest |logit|; inf for a non-finite row


@dataclass(frozen=True)
class RowsVerdict:
    status: str  # passed, failed, or skipped (no arrangement ran beside the base)
    worst: RowFinding | None
    failing: int  # arrangements over the tolerance


def judge_rows(findings: list[RowFinding], tolerance: float) -> RowsVerdict:
    """Passed when every arrangement's worst row is within ``tolerance`` (NaN is never within it); skipped when
    nothing was compared."""
    if not findings:
        return RowsVerdict(Status.SKIPPED, None, 0)
    over = [f for f in findings if not f.deviation <= tolerance]
    worst = max(findings, key=lambda f: f.deviation if f.deviation == f.deviation else math.inf)
    return RowsVerdict(Status.FAILED if over else Status.PASSED, worst, len(over))


@dataclass(frozen=True)
class ClaimVerdict:
    status: str  # passed, failed, or skipped (no claim, or no account from the runtime)
    required: float  # the share of the matrix layers that had to run in the claimed precision
    reason: str


def judge_claim(claimed: str | None, runtime_share: float | None, graph_share: float | None,
                min_share: float) -> ClaimVerdict:
    """A lower precision is claimed (``claimed``): the runtime must run at least ``min_share`` of the matrix layers
    the graph puts in it (``graph_share`` of them: 1.0 where the runtime, not the graph, sets the precision). A graph
    that puts none in it fails whatever the runtime says; no claim, no matrix layer (``graph_share`` None) or no
    account is skipped."""
    if claimed is None:
        return ClaimVerdict(Status.SKIPPED, 0.0, "no lower precision claimed")
    if graph_share is None:
        return ClaimVerdict(Status.SKIPPED, 0.0, "the graph has no matrix layer (convolution or matrix product)")
    if graph_share <= 0:
        return ClaimVerdict(Status.FAILED, 0.0, f"claims {claimed} but its graph puts no matrix layer in {claimed}")
    required = min_share * graph_share
    if runtime_share is None:
        return ClaimVerdict(Status.SKIPPED, required, "the runtime gave no account of its layers")
    if runtime_share < required:
        return ClaimVerdict(Status.FAILED, required,
                            f"claims {claimed} but runs {100 * runtime_share:.0f}% of its matrix layers in {claimed} "
                            f"(at least {100 * required:.0f}% required: verify.min_precision_share "
                            f"{min_share:g} of the {100 * graph_share:.0f}% its graph puts in {claimed})")
    return ClaimVerdict(Status.PASSED, required, "")


# --------------------------------------------------------------------------- the arrangements


@dataclass(frozen=True)
class Batch:
    array: np.ndarray  # the images fed
    images: np.ndarray  # the evidence image in each row (-1: a companion, not compared)


def arrangements(images: np.ndarray, hard: np.ndarray) -> dict[str, list[Batch]]:
    """The four arrangements of ``images`` (a full batch) with the companion image ``hard`` (one image)."""
    n = len(images)
    order = np.arange(n)
    half = n // 2
    fill = np.repeat(hard[None], n, axis=0)
    first = np.concatenate([images[:half], fill[half:]])
    second = np.concatenate([fill[:half], images[half:]])
    none = np.full(n, -1)
    return {
        "alone": [Batch(images[i : i + 1], order[i : i + 1]) for i in range(n)],
        "batch": [Batch(images, order)],
        "reversed": [Batch(images[::-1], order[::-1])],
        "companions": [Batch(first, np.where(order < half, order, none)),
                       Batch(second, np.where(order >= half, order, none))],
    }


def gather(batches: list[Batch], outputs: list[np.ndarray], n: int) -> tuple[np.ndarray, list[int], int]:
    """Each image's output row, its slot and the batch size, in image order."""
    rows = np.full((n, outputs[0].shape[1]), np.nan)
    slots = [-1] * n  # -1: no batch held the image (its row stays NaN)
    for batch, out in zip(batches, outputs, strict=True):
        for slot, image in enumerate(batch.images):
            if image >= 0:
                rows[image], slots[image] = out[slot], slot
    return rows, slots, len(batches[0].images)


def deviations(rows: np.ndarray, base: np.ndarray) -> np.ndarray:
    """Each image's largest |row - base| over its base row's largest |logit|; inf where either is not finite."""
    scale = np.maximum(np.abs(base).max(axis=1), SCALE_FLOOR)
    dev = np.abs(rows - base).max(axis=1) / scale
    finite = np.isfinite(rows).all(axis=1) & np.isfinite(base).all(axis=1)
    return np.where(finite, dev, np.inf)


# --------------------------------------------------------------------------- the plan and the wording


@dataclass(frozen=True)
class RowPlan:
    images: np.ndarray  # the full batch (build.max_batch images, or as many as there are)
    hard: np.ndarray  # the companion image
    input_name: str
    output_name: str


def plan(cfg: Config, evidence) -> RowPlan | None:
    """The first ``build.max_batch`` images and the hard companion; None when the check is off."""
    if not cfg.verify.conformance:
        return None
    name = next(iter(evidence.feeds[0]))
    images = np.concatenate([f[name] for f in evidence.feeds])
    logits = np.concatenate([r[evidence.output_name] for r in evidence.reference])
    logits = logits.reshape(len(logits), -1)  # one row per image (a detector's head is [n, c, h, w])
    finite = np.where(np.isfinite(logits).all(axis=1), np.abs(logits).max(axis=1), -np.inf)
    size = min(cfg.build.max_batch, len(images))
    return RowPlan(images[:size], images[int(np.argmax(finite))], name, evidence.output_name)


def findings(runs: dict) -> tuple[str, list[RowFinding]]:
    """The base arrangement ("alone" where it ran, else "batch") and each other arrangement's worst row."""
    base_name = "alone" if "alone" in runs else "batch"
    if base_name not in runs:
        return base_name, []
    base = runs[base_name][0]
    found = []
    for name, (rows, slots, size) in runs.items():
        if name == base_name:
            continue
        dev = deviations(rows, base)
        worst = int(np.argmax(dev))  # never NaN: a non-finite row's deviation is inf
        found.append(RowFinding(name, size, int(slots[worst]), worst, float(dev[worst])))
    return base_name, found


def row_result(runs: dict, tolerance: float) -> RowsCheck:
    """verify.json's ``conformance.rows`` of one candidate."""
    if "error" in runs:
        return RowsCheck(status=Status.ERROR, reason=runs["error"])
    base, found = findings(runs["runs"])
    verdict = judge_rows(found, tolerance)
    result = RowsCheck(status=verdict.status, base=base, tolerance=tolerance,
                       arrangements=[Arrangement(**vars(f)) for f in found], skipped=runs["skipped"])
    if verdict.status == Status.FAILED and verdict.worst is not None:
        w = verdict.worst
        return result.model_copy(update={"reason": (
            f"row independence: image {w.image} in slot {w.slot} of a batch of {w.batch_size} ({w.arrangement}) "
            f"differs from the same image {base} by {w.deviation:.3g} of its logit scale (max_row_deviation "
            f"{tolerance:g})")})
    return result


# --------------------------------------------------------------------------- verify's hooks

AFTER_FALLBACK = "checked when verify re-runs on the graph the fallback wrote"
NOT_RUN = "the candidate did not run (its status says why)"
CONFORMANCE_HINT = ("not a precision fault (the FP32 fallback cannot fix it): the runtime computes something other "
                    "than the artifact claims; see verify.json's conformance section")


def verify_conformance(cfg: Config, checks, gate_for) -> None:
    """verify's hook, after the main checks, the fallback and the batch sizes: every candidate gets its
    ``conformance`` section (skipped, with the reason, where it did not run); one that passed (or was inconclusive)
    fails when either conformance check fails."""
    if not cfg.verify.conformance:
        return
    for chk in checks:
        if chk.after_fallback or not chk.conformance_runs:
            skipped = Conformance(status=Status.SKIPPED, reason=AFTER_FALLBACK if chk.after_fallback else NOT_RUN)
            chk.result = chk.result.model_copy(update={"conformance": skipped})
            continue
        tolerance = gate_for(cfg, chk.name, chk.precision)["max_row_deviation"]
        runs = chk.conformance_runs
        section = Conformance(rows=row_result(runs["rows"], tolerance),
                              precision=precision_result(chk.backend.claims, chk.backend.deploys, runs,
                                                         cfg.verify.min_precision_share))
        failing = section.failing
        failed = {"status": Status.FAILED, "passed": False, "reason": "; ".join(failing), "hint": CONFORMANCE_HINT}
        fails = failing and chk.status in (Status.PASSED, Status.INCONCLUSIVE)  # a failed one keeps its own reason
        chk.result = chk.result.model_copy(update={"conformance": section, **(failed if fails else {})})


def precision_result(claimed: str | None, deploys: bool, runs: dict, min_share: float) -> ClaimCheck:
    """verify.json's ``conformance.precision``: the runtime's account (an emulation: its graph's), the shares of the
    matrix layers per precision, and the claim's verdict. ``runs``: :func:`pipeline.evaluation.conformance_runs.run`'s
    ``layers`` (``{"layers": [...]}`` or ``{"error": ...}``) and ``graph`` (the graph's share and layers)."""
    from pipeline.runtime.profiling.layer_account import Layer, matrix_shares

    layers, graph = runs.get("layers") or {}, runs.get("graph") or {"share": 1.0, "layers": []}
    if "error" in layers or "error" in graph:
        return ClaimCheck(status=Status.ERROR, reason=layers.get("error") or graph["error"])
    # an emulation computes its graph's decisions by rounding on FP32 kernels: its graph is its account
    source, records = ("runtime", layers.get("layers", [])) if deploys else ("graph, emulated", graph["layers"])
    records = [Layer(**layer) for layer in records]
    shares = matrix_shares(records)
    runtime_share = shares.get(claimed, 0.0) if records and claimed else None
    no_matrix = bool(records) and not shares  # the runtime ran layers, none a matrix layer: nothing to hold
    verdict = judge_claim(claimed, runtime_share, None if no_matrix else graph["share"], min_share)
    result = ClaimCheck(status=verdict.status, claimed=claimed, source=source,
                        matrix_layers=sum(1 for r in records if r.matrix), shares=shares, graph_share=graph["share"],
                        required=verdict.required, layers=[r.to_json() for r in records])
    return result.model_copy(update={"reason": verdict.reason}) if verdict.reason else result
