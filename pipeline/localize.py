"""Layer-by-layer localisation of an FP16 precision failure, and the choice of nodes to move to FP32.

Both graphs keep the FP32 export's tensor names (AutoCast only inserts Casts), so after marking
every tensor as an output, the FP32 model and the candidate can be compared tensor by tensor.
The candidate is the FP16 graph's faithful emulation on ONNX Runtime (any machine) or, on a
GPU, the TensorRT engine built with every tensor marked (which can change fusions; Polygraphy's
own accuracy guide warns of that).
"""

from __future__ import annotations

import logging
from collections import OrderedDict

import numpy as np
import onnx

from pipeline import fp16, onnx_io
from pipeline.runners import collect, onnxrt_runner

log = logging.getLogger("pipeline")

EPS = 2.220446049250313e-16  # Polygraphy's epsilon for zero reference values


# Polygraphy's SimpleCompareFunc defaults, for an output that a per-output tolerance dict does not name.
DEFAULT_ATOL = DEFAULT_RTOL = 1e-5


def scalar_tolerance(value, default: float) -> float:
    """Intermediate tensors have no per-output entry: use the default ('') or the tightest value."""
    if isinstance(value, dict):
        return float(value.get("", min(value.values(), default=default)))
    return float(value if value is not None else default)


def output_tolerance(value, output_name: str, default: float) -> float:
    """The tolerance Polygraphy applies to ``output_name``: its own entry, else '' , else ``default``."""
    if isinstance(value, dict):
        return float(value.get(output_name, value.get("", default)))
    return float(value if value is not None else default)


def tensor_errors(ref: np.ndarray, cand: np.ndarray, atol: float, rtol: float, quantile: float | None = None) -> dict:
    """Polygraphy's elementwise rule: an element fails when abs > atol AND rel > rtol (NaN fails).

    With ``quantile``, also the mean, median and that quantile of the finite absolute and
    relative errors (NaN when none is finite), as the gate reports them.
    """
    ref64, cand64 = ref.astype(np.float64), cand.astype(np.float64)
    with np.errstate(all="ignore"):
        absdiff = np.abs(cand64 - ref64)
        denom = np.abs(ref64)
        denom[denom == 0] = EPS
        reldiff = absdiff / denom
    bad = (np.isnan(absdiff) | (absdiff > atol)) & (np.isnan(reldiff) | (reldiff > rtol))
    finite_ref = ref64[np.isfinite(ref64)]
    absmax = float(np.abs(finite_ref).max()) if finite_ref.size else 0.0
    errors = {
        "max_abs_error": float(np.nanmax(absdiff)) if np.isfinite(absdiff).any() else float("inf"),
        "max_rel_error": float(np.nanmax(reldiff)) if np.isfinite(reldiff).any() else float("inf"),
        "mismatch_fraction": float(bad.mean()) if bad.size else 0.0,
        "nonfinite": int((~np.isfinite(cand64)).sum()),
        "fp32_min": float(finite_ref.min()) if finite_ref.size else None,
        "fp32_max": float(finite_ref.max()) if finite_ref.size else None,
        "scaled_error": float(np.nanmax(absdiff) / max(absmax, 1e-12)) if np.isfinite(absdiff).any() else float("inf"),
        "exceeds": bool(bad.any()),
    }
    if quantile is not None:
        for kind, diff in (("abs", absdiff), ("rel", reldiff)):
            finite = diff[np.isfinite(diff)]
            for stat, fn in (("mean", np.mean), ("median", np.median), ("quantile", np.quantile)):
                value = (fn(finite, quantile) if stat == "quantile" else fn(finite)) if finite.size else np.nan
                errors[f"{stat}_{kind}_error"] = float(value)
    return errors


def _marked_outputs(model: onnx.ModelProto, feed: dict, name: str) -> OrderedDict:
    marked = onnx_io.mark_all_outputs(model)
    return collect(onnxrt_runner(marked.SerializeToString(), name=name), [feed])[0]


def compare_layers(fp32_model: onnx.ModelProto, ref: dict, cand: dict, atol: float, rtol: float, top: int) -> dict:
    """Walk the FP32 graph in topological order; report the first node over tolerance and the worst nodes."""
    rows = []
    first = None
    for node in fp32_model.graph.node:
        if node.op_type == "Constant":
            continue
        for out in node.output:
            if out not in ref or out not in cand:
                continue
            r, c = np.asarray(ref[out]), np.asarray(cand[out])
            if r.dtype.kind != "f" or r.shape != c.shape or r.size == 0:
                continue
            row = {"name": node.name, "op_type": node.op_type, "tensor": out, **tensor_errors(r, c, atol, rtol)}
            rows.append(row)
            if first is None and row["exceeds"]:
                first = row
            break  # one row per node: its first float output
    worst = sorted(rows, key=lambda r: (r["nonfinite"] > 0, r["scaled_error"]), reverse=True)[:top]
    return {"first_divergent": first, "worst": worst, "compared_nodes": len(rows),
            "tolerance": {"atol": atol, "rtol": rtol, "rule": "elementwise: abs > atol and rel > rtol"}}


def localize_emulation(fp32_model: onnx.ModelProto, fp16_model: onnx.ModelProto, feed: dict, atol: float,
                       rtol: float, top: int) -> dict:
    """Compare ONNX Runtime on the FP32 graph with the fast FP16 emulation, tensor by tensor."""
    ref = _marked_outputs(fp32_model, feed, "fp32-layers")
    cand = _marked_outputs(fp16.emulation_model(fp16_model), feed, "fp16-emulation-layers")
    result = compare_layers(fp32_model, ref, cand, atol, rtol, top)
    result["method"] = "ONNX Runtime, FP32 graph vs FP16 emulation, every tensor marked as output"
    return result


def tensorrt_layers_engine(onnx_path, *, input_name: str, shapes: dict, build_cfg, timing_cache=None):
    """The localisation engine's loader: the engine's own network parser and builder config (``build.network_loader``,
    ``build.config_loader``: strongly typed, same profile, ``build.tf32``, ``build.optimization_level``, the
    engine's timing cache), with every tensor marked as a network output. Lazy: nothing touches TensorRT."""
    from polygraphy import constants
    from polygraphy.backend.trt import EngineFromNetwork, ModifyNetworkOutputs

    from pipeline import build

    network = ModifyNetworkOutputs(build.network_loader(onnx_path), outputs=constants.MARK_ALL)
    config = build.config_loader(input_name=input_name, shapes=shapes, build_cfg=build_cfg, timing_cache=timing_cache)
    return EngineFromNetwork(network, config=config)


def localize_tensorrt(fp32_model: onnx.ModelProto, fp16_path, feed: dict, atol: float, rtol: float, top: int,
                      input_name: str, shapes: dict, *, build_cfg, timing_cache=None) -> dict:
    """GPU: the FP16 engine rebuilt with every tensor marked as a network output, against FP32 ONNX Runtime.

    Built with the engine's configuration (:func:`tensorrt_layers_engine`), so it diagnoses the engine that failed.
    """
    from polygraphy.backend.trt import TrtRunner

    from pipeline import env

    engine = tensorrt_layers_engine(fp16_path, input_name=input_name, shapes=shapes, build_cfg=build_cfg,
                                    timing_cache=timing_cache)
    ref = _marked_outputs(fp32_model, feed, "fp32-layers")
    env.expose_libcudart()  # before Polygraphy's CUDA wrapper looks for it
    cand = collect(TrtRunner(engine, name="tensorrt-layers"), [feed])[0]
    result = compare_layers(fp32_model, ref, cand, atol, rtol, top)
    result["method"] = ("TensorRT engine rebuilt with the engine's build config and every tensor marked as output "
                        "(can change fusions) vs FP32 ONNX Runtime")
    return result


def nodes_to_move(node_name: str, fp32_model: onnx.ModelProto, fp16_model: onnx.ModelProto,
                  already: set[str]) -> list[str]:
    """The node to keep in FP32 next: the divergent node itself, or, if it already runs in FP32,
    the nearest FP16 nodes upstream of it (its error comes from inputs rounded to FP16)."""
    precisions = fp16.node_precisions(fp32_model, fp16_model)
    if precisions.get(node_name, ("", ""))[1] == "fp16" and node_name not in already:
        return [node_name]
    producers = {}
    for node in fp32_model.graph.node:
        for out in node.output:
            producers[out] = node
    by_name = {n.name: n for n in fp32_model.graph.node}
    frontier, seen, found = [node_name], set(), []
    while frontier and not found:
        next_frontier = []
        for name in frontier:
            node = by_name.get(name)
            if node is None:
                continue
            for tensor in node.input:
                producer = producers.get(tensor)
                if producer is None or producer.name in seen:
                    continue
                seen.add(producer.name)
                if precisions.get(producer.name, ("", ""))[1] == "fp16" and producer.name not in already:
                    found.append(producer.name)
                else:
                    next_frontier.append(producer.name)
        frontier = next_frontier
    return found
