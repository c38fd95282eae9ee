"""The per-layer profile of each CPU artifact benchmark timed: where one inference's time goes, by the runtime's own
account (:mod:`pipeline.runtime.profiling.layer_account`, the same records verify's precision manifest reads).

:func:`summarise` is pure: a list of :class:`~pipeline.runtime.profiling.layer_account.Layer` records in, the profile
out (total, time by layer type and by the precision actually executed, the reorders, converts and Q/DQ left unfused
with their share, the slowest layers). :func:`collect` starts each backend once more after benchmark's timings
(in its child process, like the timings), runs one warmed-up profiled inference per batch size and summarises it.
"""

from __future__ import annotations

import logging

import numpy as np

from pipeline.core.benchmark_rows import BenchmarkRow, Profile
from pipeline.runtime.profiling.layer_account import Layer, matrix_shares

log = logging.getLogger("pipeline")

# Layers that move or re-type data without computing anything a fused kernel would not: left in the executed graph,
# they are time the runtime did not fuse away. By each runtime's layer type (ONNX Runtime's op names, OpenVINO's
# CPU plugin's layerType).
UNFUSED = {
    "reorder": frozenset({"Reorder", "Transpose", "ReorderInput", "ReorderOutput"}),
    "convert": frozenset({"Cast", "Convert"}),
    "quantize": frozenset({"QuantizeLinear", "DequantizeLinear", "FakeQuantize", "DynamicQuantizeLinear"}),
}
TOP = 10  # the slowest layers listed


def unfused_class(kind: str) -> str | None:
    """"reorder", "convert" or "quantize" for a layer type that only moves or re-types data; None otherwise."""
    return next((name for name, kinds in UNFUSED.items() if kind in kinds), None)


def _groups(layers: list[Layer], key, total: float) -> list[dict]:
    """Count and time of the layers per ``key(layer)``, slowest first, each with its share of ``total``."""
    groups: dict[str, dict] = {}
    for layer in layers:
        g = groups.setdefault(key(layer), {"count": 0, "time_us": 0.0})
        g["count"] += 1
        g["time_us"] += layer.time_us or 0.0
    return [{"name": name, **g, "time_us": round(g["time_us"], 3), "share": g["time_us"] / total if total else None}
            for name, g in sorted(groups.items(), key=lambda kv: (-kv[1]["time_us"], kv[0]))]


def summarise(layers: list[Layer], top: int = TOP) -> dict:
    """One inference's profile from its layers: ``total_us`` (the sum of the layers' times; None when the runtime
    timed none), ``by_kind``, ``by_precision`` and ``by_kind_precision`` (each group's count, time and share of the
    total), ``matrix_by_precision`` (the convolutions and matrix products only), ``unfused`` (reorders, converts and
    Q/DQ: count, time, share) with ``unfused_share``, ``matrix_shares`` (by count, as verify's manifest) and the
    ``slowest`` layers."""
    timed = [layer for layer in layers if layer.time_us is not None]
    total = sum(layer.time_us for layer in timed)
    unfused = [layer for layer in layers if unfused_class(layer.kind)]
    return {
        "layers": len(layers),
        "timed_layers": len(timed),
        "total_us": round(total, 3) if timed else None,
        "by_kind": _groups(layers, lambda x: x.kind, total),
        "by_precision": _groups(layers, lambda x: x.precision, total),
        "by_kind_precision": _groups(layers, lambda x: f"{x.kind} {x.precision}", total),
        "matrix_by_precision": _groups([x for x in layers if x.matrix], lambda x: x.precision, total),
        "unfused": _groups(unfused, lambda x: unfused_class(x.kind), total),
        "unfused_share": sum(x.time_us or 0.0 for x in unfused) / total if total else None,
        "matrix_shares": matrix_shares(layers),
        "slowest": [{**x.to_json(), "share": x.time_us / total if total else None}
                    for x in sorted(timed, key=lambda x: -x.time_us)[:top]],
    }


def _source(layers: list[Layer]) -> str:
    kernels = {x.kernel for x in layers}
    if kernels & {"CPUExecutionProvider", "CUDAExecutionProvider"}:
        return "ONNX Runtime profiler: per-node kernel time, provider, element type of the first input"
    if any(x.time_us is not None for x in layers):
        return "OpenVINO runtime model with PERF_COUNT: per-layer time, primitiveType, runtimePrecision"
    return "the runtime's account of its layers (no times)"


def profile_entry(backend: str, precision: str, batch: int, layers: list[dict]) -> Profile:
    """One benchmark.json ``profiles`` entry: the backend, the batch, where the numbers come from, the summary and
    every layer (validated leniently: the runtime's own numbers)."""
    records = [Layer(**layer) for layer in layers]
    return Profile.model_validate({"backend": backend, "precision": precision, "batch_size": batch,
                                   "source": _source(records), "summary": summarise(records),
                                   "layers": [x.to_json() for x in records]}, strict=False)


def _feed(ctx, images: np.ndarray, batch: int) -> dict:
    reps = -(-batch // len(images))
    return {ctx.spec.input_name: np.ascontiguousarray(np.concatenate([images] * reps)[:batch])}


def collect(ctx, results: list[BenchmarkRow], images: np.ndarray) -> list[Profile]:
    """The profile of each backend with CPU rows in ``results`` whose runtime gives an account of its layers, at the
    smallest and the largest batch it was timed at: started again after benchmark's timings (so profiling never
    perturbs them), in its child process where it runs native code. One that cannot start or profile is left out,
    with a log line."""
    from pipeline.runtime import backends, isolate

    profiles = []
    for name in dict.fromkeys(r.backend for r in results if r.device == "cpu"):
        rows = [r for r in results if r.backend == name and r.device == "cpu"]
        batches = sorted({min(r.batch_size for r in rows), max(r.batch_size for r in rows)})
        backend, runner = backends.by_name(name), None
        try:
            runner = isolate.runner_for(backend, ctx)
            if not hasattr(runner, "layers"):
                continue
            runner.activate()
            for batch in batches:
                layers = runner.layers(_feed(ctx, images, batch))
                if layers:
                    profiles.append(profile_entry(name, rows[0].precision, batch, layers))
        except Exception as exc:  # a profile is a diagnosis: one that fails does not end the stage
            log.warning("benchmark: no per-layer profile of %s: %s: %s", name, type(exc).__name__, exc)
        finally:
            if runner is not None and getattr(runner, "is_active", False):
                runner.deactivate()
    return profiles


def benchmark_keys(ctx, results: list[BenchmarkRow], images: np.ndarray, threads: int) -> dict:
    """benchmark.json's ``profiles`` (:func:`collect`) and ``roofline``
    (:func:`pipeline.runtime.profiling.roofline.section`
    over the run's FP32 ONNX graph, for ``threads`` cores; None without CPU rows or without model.onnx)."""
    from pipeline.core import artifacts, env
    from pipeline.runtime.profiling import roofline

    onnx_path = ctx.run_dir.file(artifacts.FP32_ONNX)
    cpu_rows = [r for r in results if r.device == "cpu"]
    roof = roofline.section(onnx_path, cpu_rows, min(threads, env.usable_cores()), env.cpu_flags()) \
        if cpu_rows and onnx_path.exists() else None
    return {"profiles": [p.to_json() for p in collect(ctx, cpu_rows, images)],
            "roofline": roof.to_json() if roof is not None else None}
