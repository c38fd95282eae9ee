"""``torch.onnx.export`` of a model into a checked ONNX file, stamped with the weights it comes from: what export
writes ``model.onnx`` with, and what qat exports its fine-tuned weights with before quantizing them alike."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import torch

from pipeline.core import onnx_io, provenance
from pipeline.core.errors import StageFailed, first_line
from pipeline.core.run import atomic_path

__all__ = ["export_onnx"]


def export_onnx(model: torch.nn.Module, example: torch.Tensor, path: Path, *, opset: int, exporter: str,
                input_name: str, output_name: str, dynamic_batch: bool, weights_sha256: str = "",
                extra_outputs: tuple[str, ...] = ()) -> list[str]:
    """Export ``model`` to ``path`` (atomically, stamped with ``weights_sha256``); returns the exporter's warnings.
    ``extra_outputs``: the names of the model's outputs after the first (a detector's ``detections``)."""
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
        if weights_sha256:
            provenance.stamp_file(tmp, weights_sha256)
        onnx_io.check(tmp)
    return [f"{w.category.__name__}: {w.message}" for w in caught
            if issubclass(w.category, (torch.jit.TracerWarning, UserWarning)) and "deprecat" not in str(w.message)]


def _dynamic_shapes(model, dynamic):
    if dynamic is None:
        return None
    import inspect

    params = list(inspect.signature(model.forward).parameters)
    return {params[0]: dynamic["x"]}
