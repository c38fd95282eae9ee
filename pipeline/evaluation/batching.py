"""Verify at every batch size the artifact serves: the build profile's minimum, optimum and maximum.

An engine built for a profile (``build.min_batch/opt_batch/max_batch``) chooses its kernels (tactics) per shape,
and OpenVINO compiles its IR for each batch: the same image can come out differently at batch 1 than at batch 16
(NVIDIA/TensorRT 4813: an engine built with opt=16 drops detections at batch 1). A graph can also compute a
statistic over the batch (BatchNorm left in train mode), so an image's output depends on its neighbours. verify
judges each candidate at ``verify.batch_size``; while its runner is still active, this module runs it again on
the same images, batched at each profile batch size, and judges each batching with the candidate's own gate
against the same reference outputs, on the first ``verify.batch_check_samples`` images (64: a batch-dependent
output differs on every image, so a few suffice, and batch 1 over verify's 1,000 images would cost minutes).
A batch size where the candidate fails fails the candidate, and the reason names it. A static artifact
(``export.dynamic_batch=false``) or a batch the runtime says it cannot take is skipped with the reason.

The main check calls :func:`run_sizes` on its active runner; once every candidate is judged, verify calls
:func:`verify_batch_sizes`, which judges those outputs for each candidate that passed or was inconclusive; the
rows land in verify.json as each candidate's ``batch_sizes``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from pipeline.core.check_results import BatchSizeRow
from pipeline.core.errors import first_line
from pipeline.core.status import Status
from pipeline.precision import gate as criteria
from pipeline.runtime.isolate import Crashed
from pipeline.runtime.runners import infer_all

if TYPE_CHECKING:  # annotations only
    from pipeline.core.config_schema import Config

BATCH_HINT = ("not a precision fault (the FP32 fallback cannot fix it): the same images give other outputs at "
              "another batch size; look for a statistic over the batch (BatchNorm in train mode) or rebuild with "
              "build.opt_batch at the batch you serve")
AFTER_FALLBACK = ("checked when verify re-runs on the graph the fallback wrote (the stage runner re-runs export, "
                  "build and verify after a replacement)")
# failed, skipped, error, crashed: nothing more to learn at other sizes
RECHECKED = (Status.PASSED, Status.INCONCLUSIVE)


def served_batches(cfg: Config) -> dict[int, list[str]]:
    """Each batch size of the build profile, with the keys that name it (min and opt may coincide)."""
    sizes: dict[int, list[str]] = {}
    for key in ("min_batch", "opt_batch", "max_batch"):
        sizes.setdefault(getattr(cfg.build, key), []).append(f"build.{key}")
    return dict(sorted(sizes.items()))


def rebatch(batches: list[dict], name: str, size: int) -> list[dict]:
    """The same rows (images or outputs), in the same order, cut into batches of ``size`` (the last may be short)."""
    rows = np.concatenate([b[name] for b in batches])
    return [{name: rows[i : i + size]} for i in range(0, len(rows), size)]


def _first(batches: list[dict], name: str, count: int) -> list[dict]:
    """The first ``count`` rows of ``batches``, as one batch."""
    return [{name: np.concatenate([b[name] for b in batches])[:count]}]


def feeds_by_size(cfg: Config, feeds: list[dict]) -> dict[int, list[dict]]:
    """The first ``verify.batch_check_samples`` images, batched at each served size other than ``verify.batch_size``
    (the main check's own batching); empty when the check is off."""
    count = cfg.verify.batch_check_samples
    if not count:
        return {}
    name = next(iter(feeds[0]))
    first = _first(feeds, name, count)
    return {size: rebatch(first, name, size) for size in served_batches(cfg) if size != cfg.verify.batch_size}


def run_sizes(runner, chk, cfg: Config, feeds: dict[int, list[dict]]) -> dict[int, dict]:
    """Each batch size's outputs from the runner the main check has just run, still active (a second start of a child
    process, session or compiled IR would double verify's time): ``{"outputs": [...]}``, or a status and reason."""
    if cfg.export.dynamic_batch is False and chk.artifact is not None:
        why = "static batch (export.dynamic_batch=false): the artifact serves one batch size"
        return {size: {"status": Status.SKIPPED, "reason": why} for size in feeds}
    return {size: _run_size(runner, size, batches) for size, batches in feeds.items()}


def _run_size(runner, size: int, batches: list[dict]) -> dict:
    reason = runner.batch_reason(size)
    if reason:
        return {"status": Status.SKIPPED, "reason": reason}
    try:
        return {"outputs": infer_all(runner, batches)}
    except Crashed:
        raise
    except Exception as exc:  # a batch the artifact claims to serve and cannot run: the candidate fails there
        return {"status": Status.FAILED,
                "reason": f"cannot run at batch {size}: {type(exc).__name__}: {first_line(exc)}"}


def _judged(run: dict, evidence, gate: dict, size: int, count: int) -> dict:
    """One batch size's outputs judged by the candidate's gate against the same images' reference outputs: the
    numbers of its row (or why it did not run there)."""
    if "outputs" not in run:
        return run
    outputs = run["outputs"]
    reference = rebatch(_first(evidence.reference, evidence.output_name, count), evidence.output_name, size)
    labels = evidence.labels[:count]
    if getattr(evidence, "detection", None) is not None:  # a detector: its head's tensor check (boxes: main size)
        return _judged_head(outputs, reference, evidence, gate, len(labels))
    judged = criteria.judge(outputs, reference, labels, gate, evidence.output_name, evidence.confidence)
    tensor, task = judged.tensor_check, judged.task_check
    return {"status": judged.status, "images": len(labels), "batches": len(outputs),
            "max_abs_error": tensor.max_abs_error, "scaled_error": tensor.scaled_error_quantile,
            "top1_agreement": task.top1_agreement, "tensor_passed": tensor.passed, "task_status": task.status}


def _judged_head(outputs: list[dict], reference: list[dict], evidence, gate: dict, images: int) -> dict:
    name = evidence.output_name
    ref = np.concatenate([r[name] for r in reference]).astype(np.float64)
    cand = np.concatenate([o[name] for o in outputs]).astype(np.float64)
    tensor = criteria.tensor_check(outputs, reference, ref, cand, gate, name)
    return {"status": Status.PASSED if tensor.passed else Status.FAILED, "images": images, "batches": len(outputs),
            "max_abs_error": tensor.max_abs_error, "scaled_error": tensor.scaled_error_quantile,
            "top1_agreement": None, "tensor_passed": tensor.passed, "task_status": None}


def candidate_rows(chk, cfg: Config, evidence, gate: dict) -> list[BatchSizeRow]:
    """The rows of one candidate, one per served batch size; ``verify.batch_size`` is the main check's row."""
    rows = []
    for size, keys in served_batches(cfg).items():
        if size == cfg.verify.batch_size:
            row = {"status": chk.status, "reason": "verify.batch_size: the main check"}
        else:
            run = chk.batch_runs.get(size, {"status": Status.SKIPPED, "reason": "not run"})
            row = _judged(run, evidence, gate, size, cfg.verify.batch_check_samples)
        rows.append(BatchSizeRow(batch_size=size, profile=keys, **row))
    return rows


def describe(rows: list[BatchSizeRow]) -> str:
    """The failing batch sizes, in one phrase: "differs at batch 1 (build.min_batch): top-1 agreement 62.5%, ..."."""
    parts = []
    for r in rows:
        where = f"batch {r.batch_size} ({', '.join(r.profile or [])})"
        if not r.judged:  # it did not run there: its reason
            parts.append(f"{where}: {r.reason}")
            continue
        error = f"scaled error {r.scaled_error:.3g}" if r.scaled_error is not None else \
            f"max abs error {r.max_abs_error:.3g}"
        parts.append(f"{where}: {error}" + (
            f", top-1 agreement {100 * r.top1_agreement:.1f}%" if r.top1_agreement is not None else ""))
    return "the output depends on the batch size: fails at " + "; ".join(parts)


def verify_batch_sizes(cfg: Config, checks, evidence, gate_for) -> None:
    """verify's hook: every candidate that passed (or was inconclusive) at ``verify.batch_size`` is judged on the
    outputs it gave at each served batch size (:func:`run_sizes`, during its main check); one failing batch size
    fails the candidate and says which (:func:`pipeline.reports.verify_report.log_batch_sizes` words it)."""
    if not cfg.verify.batch_check_samples:
        return
    for chk in checks:
        if chk.status not in RECHECKED:
            continue
        if chk.result.after_fallback:  # ctx still holds the graph the fallback replaced
            rows = [BatchSizeRow(status=Status.SKIPPED, reason=AFTER_FALLBACK)]
        elif "error" in chk.batch_runs:  # the runner died after the main check: say so, keep the verdict
            rows = [BatchSizeRow(status=Status.ERROR, reason=chk.batch_runs["error"])]
        else:
            rows = candidate_rows(chk, cfg, evidence, gate_for(cfg, chk.name, chk.precision))
        failing = [r for r in rows if r.status == Status.FAILED]
        failed = {"status": Status.FAILED, "passed": False, "reason": describe(failing), "hint": BATCH_HINT}
        chk.result = chk.result.model_copy(update={"batch_sizes": rows, **(failed if failing else {})})
