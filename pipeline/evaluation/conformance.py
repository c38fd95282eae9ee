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
(:mod:`pipeline.runtime.layer_account`), as shares of the matrix layers. A candidate that claims a lower precision
(its table entry's ``claims``) fails when fewer than ``verify.min_precision_share`` of the matrix layers its graph
puts in that precision ran in it (roboflow/rf-detr#1453: ``fp16=True`` wrote an FP32 engine): an INT8 artifact
whose convolutions run in FP32 on dequantized values, a "BF16" model with no BF16 layer.

The decisions (:func:`judge_rows`, :func:`judge_claim`) are pure; the rest runs the runner and words the result.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from pipeline.core.errors import first_line
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


def judge_claim(claimed: str | None, runtime_share: float | None, graph_share: float, min_share: float) -> ClaimVerdict:
    """A lower precision is claimed (``claimed``): the runtime must run at least ``min_share`` of the matrix layers
    the graph puts in it (``graph_share`` of them: 1.0 where the runtime, not the graph, sets the precision). A graph
    that puts none in it fails whatever the runtime says; no claim, or no account, is skipped."""
    if claimed is None:
        return ClaimVerdict(Status.SKIPPED, 0.0, "no lower precision claimed")
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


def gather(batches: list[Batch], outputs: list[np.ndarray], n: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Each image's output row, its slot and the batch size, in image order."""
    rows = np.full((n, outputs[0].shape[1]), np.nan, dtype=np.float64)
    slots = np.zeros(n, dtype=int)
    for batch, out in zip(batches, outputs, strict=True):
        for slot, image in enumerate(batch.images):
            if image >= 0:
                rows[image], slots[image] = out[slot], slot
    return rows, slots, len(batches[0].images)


def deviations(rows: np.ndarray, base: np.ndarray) -> np.ndarray:
    """Each image's largest |row - base| over its base row's largest |logit|; inf where either is not finite."""
    rows, base = np.asarray(rows, np.float64), np.asarray(base, np.float64)
    scale = np.maximum(np.abs(base).max(axis=1), SCALE_FLOOR)
    dev = np.abs(rows - base).max(axis=1) / scale
    finite = np.isfinite(rows).all(axis=1) & np.isfinite(base).all(axis=1)
    return np.where(finite, dev, np.inf)


# --------------------------------------------------------------------------- running and wording


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
    finite = np.where(np.isfinite(logits).all(axis=1), np.abs(logits).max(axis=1), -np.inf)
    size = min(cfg.build.max_batch, len(images))
    return RowPlan(images[:size], images[int(np.argmax(finite))], name, evidence.output_name)


def run_rows(runner, row_plan: RowPlan, static: bool) -> dict:
    """Each arrangement's outputs in image order, from the active runner: ``{arrangement: (rows, slots, size)}``,
    and ``"skipped"``: why an arrangement did not run (a batch size the artifact does not serve)."""
    out: dict = {"runs": {}, "skipped": {}}
    for name, batches in arrangements(row_plan.images, row_plan.hard).items():
        size = len(batches[0].images)
        reason = "static batch (export.dynamic_batch=false)" if static and size != len(row_plan.images) else \
            runner.batch_reason(size)
        if reason:
            out["skipped"][name] = reason
            continue
        # copied: a runner may hand back the same output buffer on every call
        outputs = [np.array(runner.infer({row_plan.input_name: b.array})[row_plan.output_name]) for b in batches]
        out["runs"][name] = gather(batches, outputs, len(row_plan.images))
    return out


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
        worst = int(np.argmax(np.nan_to_num(dev, nan=np.inf)))
        found.append(RowFinding(name, size, int(slots[worst]), worst, float(dev[worst])))
    return base_name, found


def row_result(runs: dict, tolerance: float) -> dict:
    """verify.json's ``conformance.rows`` of one candidate."""
    if "error" in runs:
        return {"status": Status.ERROR, "reason": runs["error"]}
    base, found = findings(runs["runs"])
    verdict = judge_rows(found, tolerance)
    result = {"status": verdict.status, "base": base, "tolerance": tolerance,
              "arrangements": [vars(f) for f in found], "skipped": runs["skipped"]}
    if verdict.status == Status.FAILED and verdict.worst is not None:
        w = verdict.worst
        result["reason"] = (f"row independence: image {w.image} in slot {w.slot} of a batch of {w.batch_size} "
                            f"({w.arrangement}) differs from the same image {base} by {w.deviation:.3g} of its "
                            f"logit scale (max_row_deviation {tolerance:g})")
    return result


def safely(what: str, call) -> dict:
    """A conformance run that raises: its own error row; the main check's verdict stands."""
    try:
        return call()
    except Exception as exc:
        return {"error": f"the {what} could not run: {type(exc).__name__}: {first_line(exc)}"}


# --------------------------------------------------------------------------- verify's hooks

AFTER_FALLBACK = "checked when verify re-runs on the graph the fallback wrote"
NOT_RUN = "the candidate did not run (its status says why)"
CONFORMANCE_HINT = ("not a precision fault (the FP32 fallback cannot fix it): the runtime computes something other "
                    "than the artifact claims; see verify.json's conformance section")


def run(runner, chk, ctx, row_plan: RowPlan | None) -> dict:
    """While the candidate's runner is active: the row arrangements and the runtime's account of its layers."""
    if row_plan is None:
        return {}
    static = ctx.cfg.export.dynamic_batch is False and chk.artifact is not None
    rows = safely("row-independence check", lambda: run_rows(runner, row_plan, static))
    feed = {row_plan.input_name: row_plan.images}
    emulated = not chk.backend.deploys
    layers = [] if emulated or not hasattr(runner, "layers") else \
        safely("runtime's account of its layers", lambda: {"layers": runner.layers(feed)})
    return {"rows": rows, "layers": layers}


def verify_conformance(cfg: Config, checks, ctx, gate_for) -> None:
    """verify's hook, after the main checks, the fallback and the batch sizes: every candidate gets its
    ``conformance`` section (skipped, with the reason, where it did not run); one that passed (or was inconclusive)
    fails when either conformance check fails."""
    if not cfg.verify.conformance:
        return
    for chk in checks:
        if chk.after_fallback or not chk.conformance_runs:
            chk.result["conformance"] = {"status": Status.SKIPPED, "reason": AFTER_FALLBACK
                                         if chk.after_fallback else NOT_RUN}
            continue
        tolerance = gate_for(cfg, chk.name, chk.precision)["max_row_deviation"]
        section = {"rows": row_result(chk.conformance_runs["rows"], tolerance),
                   "precision": precision_result(chk, ctx, chk.conformance_runs["layers"], cfg)}
        chk.result["conformance"] = section
        failing = [part["reason"] for part in section.values() if part["status"] == Status.FAILED]
        if failing and chk.status in (Status.PASSED, Status.INCONCLUSIVE):  # a failed one keeps its own reason
            chk.result.update(status=Status.FAILED, passed=False, reason="; ".join(failing), hint=CONFORMANCE_HINT)


def precision_result(chk, ctx, layers, cfg: Config) -> dict:
    """verify.json's ``conformance.precision``: the runtime's account (or an emulation's graph), the shares of the
    matrix layers per precision, and the claim's verdict."""
    from pipeline.runtime import layer_account

    if isinstance(layers, dict) and "error" in layers:
        return {"status": Status.ERROR, "reason": layers["error"]}
    claimed = chk.backend.claims
    graph_share, graph_layers = _graph_share(chk, ctx)
    source = "runtime"
    if not chk.backend.deploys:  # an emulation computes its graph's decisions by rounding on FP32 kernels
        records = graph_layers
        source = "graph, emulated"  # FP32 kernels, every tensor rounded as the graph's types say
    else:
        records = [layer_account.Layer(**layer) for layer in layers.get("layers", [])] if layers else []
    shares = layer_account.matrix_shares(records)
    runtime_share = shares.get(claimed, 0.0) if records and claimed else None
    verdict = judge_claim(claimed, runtime_share, graph_share, cfg.verify.min_precision_share)
    result = {"status": verdict.status, "claimed": claimed, "source": source, "matrix_layers": sum(
        1 for r in records if r.matrix), "shares": shares, "graph_share": graph_share, "required": verdict.required,
        "layers": [r.to_json() for r in records]}
    if verdict.reason:
        result["reason"] = verdict.reason
    return result


def _graph_share(chk, ctx) -> tuple[float, list]:
    """The share of the matrix layers the candidate's graph puts in its claimed precision (1.0 where the runtime,
    not a graph, sets the precision), and the graph's layers (an emulation's account)."""
    from pipeline.core import onnx_io
    from pipeline.precision import plugs
    from pipeline.runtime import layer_account

    if chk.backend.graph is None or chk.backend.claims is None:
        return 1.0, []
    plug = plugs.by_name(chk.backend.graph)
    fp32 = ctx._loaded.get("fp32_model")
    if fp32 is None:
        fp32 = ctx._loaded["fp32_model"] = onnx_io.load(ctx.fp32_path())
    layers = layer_account.graph_layers(plug.node_precisions(fp32, ctx.graph(plug.name)), "FP32 kernels, rounded")
    return layer_account.matrix_shares(layers).get(chk.backend.claims, 0.0), layers
