"""Verify at every batch size the artifact serves: the build profile's minimum, optimum and maximum.

An engine built for a profile (``build.min_batch/opt_batch/max_batch``) chooses its kernels (tactics) per shape,
and OpenVINO compiles its IR for each batch: the same image can come out differently at batch 1 than at batch 16
(NVIDIA/TensorRT 4813: an engine built with opt=16 drops detections at batch 1). A graph can also compute a
statistic over the batch (BatchNorm left in train mode), so an image's output depends on its neighbours. verify
judges each candidate at ``verify.batch_size``; this module runs every candidate that reached a verdict again on
the same images, batched at each profile batch size, and judges each batching with the candidate's own gate
against the same reference outputs, on the first ``verify.batch_check_samples`` images (64: a batch-dependent
output differs on every image, so a few suffice, and batch 1 over verify's 1,000 images would cost minutes). A batch size where the candidate fails fails the candidate, and the reason
names it. A static artifact (``export.dynamic_batch=false``) or a batch the runtime says it cannot take is skipped
with the reason.

verify calls :func:`verify_batch_sizes` once its candidates are judged; the rows land in verify.json as each
candidate's ``batch_sizes``.
"""

from __future__ import annotations

import logging

import numpy as np

from pipeline import gate as criteria

log = logging.getLogger("pipeline")

BATCH_HINT = ("not a precision fault (the FP32 fallback cannot fix it): the same images give other outputs at "
              "another batch size; look for a statistic over the batch (BatchNorm in train mode) or rebuild with "
              "build.opt_batch at the batch you serve")
AFTER_FALLBACK = ("checked when verify re-runs on the graph the fallback wrote (the stage runner re-runs export, "
                  "build and verify after a replacement)")
# A second activation of the TensorRT runner at another shape binds an input buffer that tests/fake_tensorrt.py
# reports freed while the context still holds it (a use-after-free on a real GPU): until runners.TensorrtRunner
# keeps its input alive for the context, engines are not re-run here, and the row says so.
TENSORRT_NOT_YET = ("not run: a TensorRT engine is not yet re-run at other batch sizes (its runner must first keep "
                    "each input buffer alive for the execution context)")
RECHECKED = ("passed", "inconclusive")  # failed, skipped, error, crashed: nothing more to learn at other sizes


def served_batches(cfg) -> dict[int, list[str]]:
    """Each batch size of the build profile, with the keys that name it (min and opt may coincide)."""
    sizes: dict[int, list[str]] = {}
    for key in ("min_batch", "opt_batch", "max_batch"):
        sizes.setdefault(getattr(cfg.build, key), []).append(f"build.{key}")
    return dict(sorted(sizes.items()))


def rebatch(batches: list[dict], name: str, size: int) -> list[dict]:
    """The same rows (images or outputs), in the same order, cut into batches of ``size`` (the last may be short)."""
    rows = np.concatenate([b[name] for b in batches])
    return [{name: rows[i : i + size]} for i in range(0, len(rows), size)]


def _infer_all(runner, feeds: list[dict]) -> list[dict]:
    """Every feed through an active runner; outputs copied (a runner may reuse its buffers)."""
    outputs = []
    for feed in feeds:
        out = runner.infer(feed)
        outputs.append({k: np.array(v.detach().cpu().numpy() if hasattr(v, "detach") else v, copy=True)
                        for k, v in out.items()})
    return outputs


def _first(batches: list[dict], name: str, count: int) -> list[dict]:
    """The first ``count`` rows of ``batches``, as one batch."""
    return [{name: np.concatenate([b[name] for b in batches])[:count]}]


def _at_batch(runner, evidence, gate: dict, size: int, keys: list[str], count: int) -> dict:
    """One batch size of one candidate on the first ``count`` images: skipped (the runtime cannot take it), failed
    (it cannot run a batch it claims to serve), or the gate's verdict."""
    row = {"batch_size": size, "profile": keys}
    reason = runner.batch_reason(size)
    if reason:
        return {**row, "status": "skipped", "reason": reason}
    input_name = next(iter(evidence.feeds[0]))
    feeds = rebatch(_first(evidence.feeds, input_name, count), input_name, size)
    try:
        outputs = _infer_all(runner, feeds)
    except Exception as exc:  # a batch the artifact claims to serve and cannot run: the candidate fails there
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return {**row, "status": "failed", "reason": f"cannot run at batch {size}: {type(exc).__name__}: {text}"}
    reference = rebatch(_first(evidence.reference, evidence.output_name, count), evidence.output_name, size)
    labels = evidence.labels[:count]
    judged = criteria.judge(outputs, reference, labels, gate, evidence.output_name, evidence.confidence)
    tensor, task = judged["tensor_check"], judged["task_check"]
    return {**row, "status": judged["status"], "images": len(labels), "batches": len(feeds), "max_abs_error": tensor["max_abs_error"],
            "scaled_error": tensor.get("scaled_error_quantile"), "top1_agreement": task["top1_agreement"],
            "tensor_passed": tensor["passed"], "task_status": task["status"]}


def check_candidate(chk, ctx, evidence, gate: dict, sizes: dict[int, list[str]], main_size: int) -> list[dict]:
    """The rows of one candidate, one per served batch size; ``verify.batch_size`` is the main check's row."""
    if ctx.cfg.export.dynamic_batch is False and chk.artifact is not None:
        why = "static batch (export.dynamic_batch=false): the artifact serves one batch size"
        return [{"batch_size": s, "profile": k, "status": "skipped", "reason": why} for s, k in sizes.items()]
    rows = {s: {"batch_size": s, "profile": k, "status": chk.status, "reason": "verify.batch_size: the main check"}
            for s, k in sizes.items() if s == main_size}
    todo = {s: k for s, k in sizes.items() if s != main_size}
    if todo and chk.backend.runtime == "TensorRT":  # see TENSORRT_NOT_YET
        rows.update({s: {"batch_size": s, "profile": k, "status": "skipped", "reason": TENSORRT_NOT_YET}
                     for s, k in todo.items()})
    elif todo:
        runner = chk.backend.runner(ctx)
        with runner:
            count = ctx.cfg.verify.batch_check_samples
            rows.update({s: _at_batch(runner, evidence, gate, s, k, count) for s, k in todo.items()})
    return [rows[s] for s in sorted(rows)]


def describe(rows: list[dict]) -> str:
    """The failing batch sizes, in one phrase: "differs at batch 1 (build.min_batch): top-1 agreement 62.5%, ..."."""
    parts = []
    for r in rows:
        if "reason" in r and "top1_agreement" not in r:
            parts.append(f"batch {r['batch_size']} ({', '.join(r['profile'])}): {r['reason']}")
            continue
        error = f"scaled error {r['scaled_error']:.3g}" if r.get("scaled_error") is not None else \
            f"max abs error {r['max_abs_error']:.3g}"
        parts.append(f"batch {r['batch_size']} ({', '.join(r['profile'])}): {error}, top-1 agreement "
                     f"{100 * r['top1_agreement']:.1f}%")
    return "the output depends on the batch size: fails at " + "; ".join(parts)


def verify_batch_sizes(cfg, ctx, checks, evidence, gate_for) -> None:
    """verify's hook: every candidate that passed (or was inconclusive) at ``verify.batch_size`` is judged again at
    each served batch size; one failing batch size fails the candidate and says which."""
    sizes = served_batches(cfg)
    if not cfg.verify.batch_check_samples:
        return
    for chk in checks:
        if chk.status not in RECHECKED:
            continue
        if chk.result.get("after_fallback"):  # ctx still holds the graph the fallback replaced
            chk.result["batch_sizes"] = [{"status": "skipped", "reason": AFTER_FALLBACK}]
            continue
        try:
            rows = check_candidate(chk, ctx, evidence, gate_for(cfg, chk.name, chk.precision), sizes,
                                   cfg.verify.batch_size)
        except Exception as exc:  # the runner that ran a moment ago will not start again: say so, keep the verdict
            log.warning("verify: %s: the batch-size check could not run: %s", chk.name, exc)
            chk.result["batch_sizes"] = [{"status": "error", "reason": str(exc).splitlines()[0] if str(exc) else ""}]
            continue
        chk.result["batch_sizes"] = rows
        failing = [r for r in rows if r["status"] == "failed"]
        log.info("verify: %-17s batch sizes %s", chk.name,
                 ", ".join(f"{r['batch_size']}: {r['status']}" for r in rows))
        if failing:
            chk.result.update(status="failed", passed=False, reason=describe(failing), hint=BATCH_HINT)
            log.warning("verify: %s: %s", chk.name, describe(failing))
