"""A precision mix on the deployment CPU: the graph as build converts it, compiled by OpenVINO's CPU plugin,
timed with the benchmark's method, and the precision each matrix layer really runs in (the runtime model)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import onnx

from pipeline.precision.int8 import MATRIX_OPS


@contextmanager
def openvino_session(model: onnx.ModelProto, images: np.ndarray, batches: list[int], threads: int | None, *,
                     int8_graph: bool) -> Iterator[Session]:
    """The mix as build converts it (an INT8 graph with its FP16 regions upcast, ``int8.with_fp32_regions``),
    compiled by OpenVINO's CPU plugin per batch (f32 hint, LATENCY, one synchronous request with its input set
    once, as benchmark's ``openvino_*`` rows and benchmark_app's ``-hint latency``): a timer per batch (one
    inference, ms) and the precision the CPU plugin runs each matrix layer in. Open while timed, so that several
    mixes can be timed in interleaved rounds (:mod:`pipeline.runtime.speed.interleave`)."""
    import openvino as ov

    from pipeline.precision.int8 import with_fp32_regions
    from pipeline.runtime.runners import OpenVINORunner, cpu_timer

    xml, weights = _ir_bytes(with_fp32_regions(model) if int8_graph else model)
    sidecar = {"hint": "f32", "precision": "int8" if int8_graph else "fp32", "openvino": ov.__version__,
               "xml": "a tune candidate"}
    runner = OpenVINORunner(xml, weights, sidecar, name="tune", input_name=model.graph.input[0].name,
                            output_name=model.graph.output[0].name, threads=threads)
    with runner:
        timers = {}
        for batch in batches:
            x = np.ascontiguousarray(np.resize(images, (batch, *images.shape[1:])), dtype=np.float32)
            request = runner._request(batch)
            request.set_input_tensor(ov.Tensor(x, shared_memory=True))
            timers[batch] = cpu_timer(request.infer)
        compiled = runner._compile(batches[0])
        yield Session(timers, runtime_precisions(compiled, model), kernels(compiled))


@dataclass(frozen=True)
class Session:
    """An open, timeable mix: ``timers[batch]`` runs one inference and returns its latency (ms); ``runtime``: what
    the target runs each matrix layer in."""

    timers: dict[int, Callable[[], float]]
    runtime: dict[str, str]
    kernels: tuple | None = None  # what the target compiled it to (None: not known), to tell twins apart


def kernels(compiled) -> tuple:
    """The CPU plugin's compiled graph as a sorted multiset of (layer type, runtime precision, kernel) over its
    executed nodes (constants left out): equal for two IRs that run the same kernels, whatever their scales."""
    from collections import Counter

    seen = Counter()
    for op in compiled.get_runtime_model().get_ops():
        info = op.get_rt_info()
        kind = info["layerType"].astype(str) if "layerType" in info else op.get_type_name()
        if kind != "Const":
            seen[(kind, *(info[k].astype(str) if k in info else "" for k in ("runtimePrecision", "primitiveType")))] \
                += 1
    return tuple(sorted(seen.items()))


def timed_alone(session: Session, method) -> dict:
    """One session timed alone with the benchmark's method (:func:`pipeline.runtime.runners.measure`): the median
    of the timed runs per batch, their 10th and 90th percentiles, and the runtime precisions."""
    from pipeline.runtime.runners import measure

    latency, spread = {}, {}
    for batch, run_once in session.timers.items():
        samples = measure(run_once, method)["samples"]
        latency[batch] = float(np.median(samples))
        spread[batch] = [float(np.percentile(samples, 10)), float(np.percentile(samples, 90))]
    return {"latency_ms": latency, "p10_p90_ms": spread, "runtime": session.runtime}


def openvino_timing(model: onnx.ModelProto, images: np.ndarray, batches: list[int], method, threads: int | None, *,
                    int8_graph: bool) -> dict:
    """:func:`openvino_session` timed alone (:func:`timed_alone`)."""
    with openvino_session(model, images, batches, threads, int8_graph=int8_graph) as session:
        return timed_alone(session, method)


def _ir_bytes(model: onnx.ModelProto) -> tuple[bytes, bytes]:
    import tempfile
    from pathlib import Path

    import openvino as ov

    with tempfile.TemporaryDirectory(prefix=".tune-ir.") as tmp:
        onnx.save(model, f"{tmp}/m.onnx")
        ov.save_model(ov.convert_model(f"{tmp}/m.onnx"), f"{tmp}/m.xml", compress_to_fp16=False)
        return Path(f"{tmp}/m.xml").read_bytes(), Path(f"{tmp}/m.bin").read_bytes()


def runtime_precisions(compiled, model: onnx.ModelProto) -> dict[str, str]:
    """``{matrix layer: precision}`` from the CPU plugin's runtime model (each executed node's ``runtimePrecision``
    and the original layers it fused, ``originalLayersNames``); a layer is matched by its node or output name."""
    executed = {}
    for op in compiled.get_runtime_model().get_ops():
        info = op.get_rt_info()
        if "runtimePrecision" not in info or "originalLayersNames" not in info:
            continue
        precision = info["runtimePrecision"].astype(str).lower()
        for name in info["originalLayersNames"].astype(str).split(","):
            executed.setdefault(name.strip(), precision)
    casts = {n.input[0]: n.output[0] for n in model.graph.node if n.op_type == "Cast"}  # fused into the layer
    out = {}
    for node in model.graph.node:
        if node.op_type in MATRIX_OPS:
            names = (node.name, *node.output, *(casts[o] for o in node.output if o in casts))
            hit = next((executed[k] for k in names if k in executed), None)
            hit = hit or next((p for k, p in executed.items() if k.startswith(f"{node.name}/")), None)
            out[node.name] = hit or "unknown"
    return out


# How each runtime names a precision a layer ran in: OpenVINO's runtimePrecision ("i8", "f16", "f32") and
# TensorRT's engine inspector, as pipeline.runtime.speed.tensorrt_speed reports it ("int8", "fp16", "fp32").
RUNTIME_NAMES = {"int8": ("i8", "u8", "int8"), "fp16": ("f16", "fp16")}


def layers_not_in(runtime: dict[str, str], precision: str) -> list[str]:
    """The matrix layers the target did not run in ``precision`` (``int8``, ``fp16``)."""
    return [name for name, ran in runtime.items() if ran not in RUNTIME_NAMES[precision]]
