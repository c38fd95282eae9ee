"""``torch.onnx.export`` of a model into a checked ONNX file, stamped with the weights it comes from: what export
writes ``model.onnx`` with, and what qat exports its fine-tuned weights with before quantizing them alike."""

from __future__ import annotations

import importlib.util
import linecache
import logging
import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from pipeline.core import onnx_io, provenance
from pipeline.core.errors import CheckFailed, StageFailed, first_line
from pipeline.core.run import atomic_path

__all__ = ["export_onnx", "graph_may_differ"]

# What the tracer says when a tensor became a Python value or control flow was traced as a constant: the graph then
# holds the one path the example input took, and a branch the validation images never take is never checked.
GRAPH_MAY_DIFFER = ("might cause the trace to be incorrect", "registered as constants", "treated as a constant",
                    "might not generalize to other inputs")
ACCEPT_KEY = "export.accept_trace_warnings"


def _package_folders(*names: str) -> tuple[str, ...]:
    """The source folders of the packages named that are installed (found without importing them)."""
    specs = [importlib.util.find_spec(name) for name in names]
    return tuple(str(Path(folder)) + os.sep for spec in specs if spec and spec.submodule_search_locations
                 for folder in spec.submodule_search_locations)


# Libraries whose own shape checks the tracer warns about: torch's modules (nn.TransformerEncoder's fast-path checks)
# and ModelOpt's quantizers (an empty-input check that QAT's model carries, quantizers off or on). Not the model's code.
LIBRARY_SOURCES = _package_folders("torch", "modelopt")


def graph_may_differ(category: str, message: str, filename: str = "") -> bool:
    """Whether an exporter warning means the exported graph may compute something other than the model: a tracer
    warning of that kind raised in the model's own code (``filename``), not in a library's (:data:`LIBRARY_SOURCES`)."""
    return (category == "TracerWarning" and any(phrase in message for phrase in GRAPH_MAY_DIFFER)
            and not str(Path(filename)).startswith(LIBRARY_SOURCES))


@dataclass(frozen=True)
class ExporterWarning:
    """One warning of the exporter: ``Category: message (file:line: the line)``, and whether it means the graph may
    differ from the model (:func:`graph_may_differ`)."""

    text: str
    differs: bool


def _described(w: warnings.WarningMessage) -> ExporterWarning:
    line = linecache.getline(w.filename, w.lineno).strip()
    where = f"{w.filename}:{w.lineno}" + (f": {line}" if line else "")
    return ExporterWarning(f"{w.category.__name__}: {first_line(w.message)} ({where})",
                           graph_may_differ(w.category.__name__, str(w.message), w.filename))


def export_onnx(model: torch.nn.Module, example: torch.Tensor, path: Path, *, opset: int, exporter: str,
                input_name: str, output_name: str, dynamic_batch: bool, weights_sha256: str = "",
                extra_outputs: tuple[str, ...] = (), accept_trace_warnings: bool = False,
                output_dims: dict[str, tuple[int, ...]] | None = None) -> list[ExporterWarning]:
    """Export ``model`` to ``path`` (atomically, stamped with ``weights_sha256``); returns the exporter's warnings.
    ``extra_outputs``: the names of the model's outputs after the first (a detector's ``detections``).
    ``output_dims``: an output's dimensions after the batch that the model fixes by construction (a detector's
    ``detections``: ``(max_detections, 6)``), declared in the graph where the exporter left them symbolic.
    A warning that the graph may differ from the model (:func:`graph_may_differ`) fails the export (exit 1, naming
    the model's source line, nothing written) unless ``accept_trace_warnings``."""
    output_names = [output_name, *extra_outputs]
    with warnings.catch_warnings(record=True) as caught, atomic_path(path) as tmp:
        warnings.simplefilter("always")
        try:
            if exporter == "dynamo":
                # It warns once per torchvision op it cannot register; this tool uses none of them.
                logging.getLogger("torch.onnx._internal.exporter._registration").setLevel(logging.ERROR)
                dynamic = {"x": {0: torch.export.Dim("batch", min=1)}} if dynamic_batch else None
                program = torch.onnx.export(model, (example,), dynamo=True, opset_version=opset,
                                            input_names=[input_name], output_names=output_names,
                                            dynamic_shapes=_dynamic_shapes(model, dynamic), external_data=False,
                                            verbose=False)
                program.save(str(tmp))
            else:
                axes = {name: {0: "batch"} for name in (input_name, *output_names)} if dynamic_batch else None
                torch.onnx.export(model, (example,), str(tmp), dynamo=False, opset_version=opset,
                                  input_names=[input_name], output_names=output_names, dynamic_axes=axes,
                                  do_constant_folding=True)
        except Exception as exc:
            raise StageFailed(f"torch.onnx.export ({exporter}) failed: {type(exc).__name__}: "
                              f"{first_line(exc)}") from None
        differ = [w.text for w in map(_described, caught) if w.differs]
        if differ and not accept_trace_warnings:
            more = f" (and {len(differ) - 1} more)" if len(differ) > 1 else ""
            raise CheckFailed(f"the exported graph may differ from the model: {differ[0]}{more}; the trace keeps only "
                              "the path the example input took, and verify cannot see a branch its images never take: "
                              "write the data-dependent step with tensor operations (torch.where), or set "
                              f"{ACCEPT_KEY}=true to accept it")
        if output_dims:
            declare_output_dims(tmp, output_dims)
        if weights_sha256:
            provenance.stamp_file(tmp, weights_sha256)
        onnx_io.check(tmp)
    return [_described(w) for w in caught
            if issubclass(w.category, (torch.jit.TracerWarning, UserWarning)) and "deprecat" not in str(w.message)]


def declare_output_dims(path: Path, dims: dict[str, tuple[int, ...]]) -> None:
    """Write each named output's dimensions after the first into the graph at ``path`` (the first, the batch, is
    kept as exported); a dimension the graph already fixes must agree, else the export fails (exit 1)."""
    import onnx

    model = onnx.load(str(path))
    for value in model.graph.output:
        if value.name not in dims:
            continue
        shape = value.type.tensor_type.shape
        want = dims[value.name]
        if len(shape.dim) != len(want) + 1:
            raise CheckFailed(f"the exported output {value.name} has rank {len(shape.dim)}, the model returns rank "
                              f"{len(want) + 1}")
        for dim, size in zip(list(shape.dim)[1:], want, strict=True):
            if dim.HasField("dim_value") and dim.dim_value != size:
                raise CheckFailed(f"the exported output {value.name} declares {dim.dim_value} where the model "
                                  f"returns {size}")
            dim.Clear()
            dim.dim_value = int(size)
    onnx.save(model, str(path))


def _dynamic_shapes(model, dynamic):
    if dynamic is None:
        return None
    import inspect

    params = list(inspect.signature(model.forward).parameters)
    return {params[0]: dynamic["x"]}
