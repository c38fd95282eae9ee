"""The conformance checks' runs (:mod:`pipeline.evaluation.conformance` decides and words them): while a
candidate's runner is still active, the row arrangements through it and the runtime's own account of its layers;
and the account of the candidate's graph (an emulation's, and the share its graph puts in the claimed precision)."""

from __future__ import annotations

import numpy as np

from pipeline.core.errors import first_line
from pipeline.evaluation import conformance
from pipeline.runtime.runners import to_numpy


def run(runner, chk, ctx, row_plan: conformance.RowPlan | None) -> dict:
    """While the candidate's runner is active: the row arrangements and the runtime's account of its layers."""
    if row_plan is None:
        return {}
    static = ctx.cfg.export.dynamic_batch is False and chk.artifact is not None
    rows = safely("row-independence check", lambda: run_rows(runner, row_plan, static))
    emulated = not chk.backend.deploys
    layers = [] if emulated or not hasattr(runner, "layers") else \
        safely("runtime's account of its layers", lambda: {"layers": runner.layers(_account_feed(runner, row_plan,
                                                                                          static))})
    graph = safely("graph's account", lambda: graph_account(chk, ctx))
    return {"rows": rows, "layers": layers, "graph": graph}


def _account_feed(runner, row_plan: conformance.RowPlan, static: bool) -> dict:
    """One image where the artifact serves batch 1 (the precision each layer runs in, not its time), else the plan's
    full batch."""
    one = not static and not runner.batch_reason(1)
    return {row_plan.input_name: row_plan.images[:1] if one else row_plan.images}


def run_rows(runner, row_plan: conformance.RowPlan, static: bool) -> dict:
    """Each arrangement's outputs in image order, from the active runner: ``{arrangement: (rows, slots, size)}``,
    and ``"skipped"``: why an arrangement did not run (a batch size the artifact does not serve)."""
    out: dict = {"runs": {}, "skipped": {}}
    for name, batches in conformance.arrangements(row_plan.images, row_plan.hard).items():
        size = len(batches[0].images)
        reason = "static batch (export.dynamic_batch=false)" if static and size != len(row_plan.images) else \
            runner.batch_reason(size)
        if reason:
            out["skipped"][name] = reason
            continue
        # copied: a runner may hand back the same output buffer on every call
        outputs = [np.array(to_numpy(runner.infer({row_plan.input_name: b.array})[row_plan.output_name]))
                   for b in batches]
        outputs = [o.reshape(len(o), -1) for o in outputs]  # one row per image (a detector's head is 4-D)
        out["runs"][name] = conformance.gather(batches, outputs, len(row_plan.images))
    return out


def safely(what: str, call) -> dict:
    """A conformance run that raises: its own error row; the main check's verdict stands."""
    try:
        return call()
    except Exception as exc:
        return {"error": f"the {what} could not run: {type(exc).__name__}: {first_line(exc)}"}


def graph_account(chk, ctx) -> dict:
    """``share``: of the matrix layers the candidate's graph puts in its claimed precision (1.0 where the runtime,
    not a graph, sets the precision); ``layers``: the graph's (an emulation's account)."""
    from pipeline.core import onnx_io
    from pipeline.precision import plugs
    from pipeline.runtime.profiling import layer_account

    if chk.backend.graph is None or chk.backend.claims is None:
        return {"share": 1.0, "layers": []}
    plug = plugs.by_name(chk.backend.graph)
    fp32 = ctx._loaded.get("fp32_model")
    if fp32 is None:
        fp32 = ctx._loaded["fp32_model"] = onnx_io.load(ctx.fp32_path())
    layers = layer_account.graph_layers(plug.node_precisions(fp32, ctx.graph(plug.name)), "FP32 kernels, rounded")
    shares = layer_account.matrix_shares(layers)  # empty: no matrix layer at all, nothing to hold to a share
    return {"share": shares.get(chk.backend.claims, 0.0) if shares else None,
            "layers": [layer.to_json() for layer in layers]}
