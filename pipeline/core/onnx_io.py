"""Reading ONNX files safely, and small graph queries shared by export, verify and build."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import onnx

from pipeline.core import tasks
from pipeline.core.errors import InputError, first_line

if TYPE_CHECKING:  # annotations only
    from pipeline.core.model_card import CardSpec


def _read(path: Path, what: str = "ONNX model", producer: str = "export") -> onnx.ModelProto:
    """The model's protobuf only (external data not read yet)."""
    try:
        return onnx.load(str(path), load_external_data=False)
    except Exception as exc:
        first = first_line(exc)
        raise InputError(f"{path}: {what} is truncated or corrupt ({type(exc).__name__}: {first[:200]}); "
                         f"re-run {producer}") from None


def _external_tensors(model: onnx.ModelProto):
    return [t for t in onnx.external_data_helper._get_all_tensors(model)
            if t.data_location == onnx.TensorProto.EXTERNAL]


def _attribute_tensors(attr: onnx.AttributeProto) -> Iterator[onnx.TensorProto]:
    if attr.HasField("t"):
        yield attr.t
    yield from attr.tensors
    sparse = ([attr.sparse_tensor] if attr.HasField("sparse_tensor") else []) + list(attr.sparse_tensors)
    for tensor in sparse:
        yield from (tensor.values, tensor.indices)
    for graph in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
        yield from _graph_tensors(graph)


def _graph_tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield from (sparse.values, sparse.indices)
    for node in graph.node:
        for attr in node.attribute:
            yield from _attribute_tensors(attr)


def all_tensors(model: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    """Every tensor a runtime may read: initializers, sparse initializers (values and indices), and the
    tensors in node attributes, in subgraphs (If/Loop/Scan bodies) and in model-local functions.

    ``onnx.external_data_helper`` walks initializers and attributes only; ONNX Runtime also reads a sparse
    initializer's external data, so the location check must see all of them.
    """
    yield from _graph_tensors(model.graph)
    for function in model.functions:
        for node in function.node:
            for attr in node.attribute:
                yield from _attribute_tensors(attr)


def _check_locations(model: onnx.ModelProto, path: Path) -> None:
    base = path.parent.resolve()
    for tensor in all_tensors(model):
        if tensor.data_location != onnx.TensorProto.EXTERNAL and not tensor.external_data:
            continue
        info = {entry.key: entry.value for entry in tensor.external_data}
        location = info.get("location", "")
        target = Path(location)
        if not location or "\0" in location or target.is_absolute() or ".." in target.parts:
            raise InputError(f"{path}: tensor {tensor.name!r} points to external data {location!r} outside the "
                             "model's folder; refusing to load it")
        resolved = (base / target).resolve()
        if os.path.commonpath([base, resolved]) != str(base):
            raise InputError(f"{path}: external data {location!r} of tensor {tensor.name!r} resolves to {resolved}, "
                             "outside the model's folder (a symlink?); refusing to load it")


def check_external_data(path: str | Path) -> None:
    """Refuse external-data locations that resolve outside the model's folder (``..``, absolute, symlinks)."""
    path = Path(path)
    _check_locations(_read(path), path)


def load(path: str | Path, what: str = "ONNX model", producer: str = "export") -> onnx.ModelProto:
    """Load a model after the external-data check; a corrupt file becomes one clear InputError.

    The file is parsed once: the protobuf first, then (after the check) its external data.
    """
    path = Path(path)
    model = _read(path, what, producer)
    _check_locations(model, path)
    if _external_tensors(model):
        try:
            onnx.external_data_helper.load_external_data_for_model(model, str(path.parent))
        except Exception as exc:
            first = first_line(exc)
            raise InputError(f"{path}: external data of the {what} is missing or unreadable "
                             f"({type(exc).__name__}: {first[:200]}); re-run {producer}") from None
    return model


def check(path: str | Path, producer: str = "export") -> None:
    """``onnx.checker.check_model(path, full_check=True)`` as one clear error."""
    try:
        onnx.checker.check_model(str(path), full_check=True)
    except Exception as exc:
        first = first_line(exc) or type(exc).__name__
        raise InputError(f"{path} fails the ONNX checker: {first}; re-run {producer}") from None


def io_names(model: onnx.ModelProto) -> tuple[list[str], list[str]]:
    initializers = {t.name for t in model.graph.initializer}
    inputs = [i.name for i in model.graph.input if i.name not in initializers]
    return inputs, [o.name for o in model.graph.output]


def _shape(values, name: str) -> list[int | str | None]:
    for value in values:
        if value.name == name:
            dims = value.type.tensor_type.shape.dim
            return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in dims]
    raise KeyError(name)


def input_shape(model: onnx.ModelProto, name: str) -> list[int | str | None]:
    return _shape(model.graph.input, name)


def output_shape(model: onnx.ModelProto, name: str) -> list[int | str | None]:
    return _shape(model.graph.output, name)


def check_matches_spec(model: onnx.ModelProto, path: Path, spec: CardSpec) -> None:
    """The ONNX file's input and output must be what the model card says (names; input channels, height and
    width; output ``[batch, num_classes]``), else one InputError ending "re-run export"."""
    inputs, outputs = io_names(model)
    if inputs != [spec.input_name]:
        raise InputError(f"{path} has inputs {inputs}, but the model card expects [{spec.input_name!r}]; "
                         "re-run export")
    shape = input_shape(model, spec.input_name)
    expected = list(spec.input_size)
    if len(shape) != 4 or [d for d in shape[1:]] != expected:
        raise InputError(f"{path} input {spec.input_name!r} has shape {shape}, but the model expects "
                         f"[batch, {', '.join(map(str, expected))}]; re-run export")
    task = tasks.of(spec)
    wanted = [spec.output_name, *task.extra_outputs]
    if outputs != wanted:
        raise InputError(f"{path} has outputs {outputs}, but the model card expects {wanted}; "
                         "re-run export")
    if task.name != tasks.CLASSIFICATION:  # a detector's head: [batch, classes + 4, h, w]
        out = output_shape(model, spec.output_name)
        if out and (len(out) != 4 or (isinstance(out[1], int) and out[1] != spec.num_classes + 4)):
            raise InputError(f"{path} output {spec.output_name!r} has shape {out}, but the model card expects "
                             f"[batch, {spec.num_classes} + 4, height, width]; re-run export")
        return
    # Checked here, before anything runs: a graph from another run (other classes) otherwise ends in a
    # NumPy broadcast error deep inside the comparison.
    out = output_shape(model, spec.output_name)
    classes = spec.num_classes
    if out and (len(out) != 2 or (isinstance(out[1], int) and out[1] != classes)):  # []: no static shape
        raise InputError(f"{path} output {spec.output_name!r} has shape {out}, but the model card expects "
                         f"[batch, {classes}] (logits for {classes} classes); the file is from another model or "
                         "run: re-run export")


def mark_all_outputs(model: onnx.ModelProto) -> onnx.ModelProto:
    """Every tensor a node produces becomes a graph output, for layer-by-layer comparison."""
    from polygraphy import constants
    from polygraphy.backend.onnx import ModifyOutputs

    return ModifyOutputs(model, outputs=constants.MARK_ALL, copy=True)()


def mark_outputs(model: onnx.ModelProto, names: list[str]) -> onnx.ModelProto:
    """Those of ``names`` that a node of ``model`` produces become its graph outputs (the rest are not in it)."""
    from polygraphy.backend.onnx import ModifyOutputs

    produced = {out for node in model.graph.node if node.op_type != "Constant" for out in node.output}
    return ModifyOutputs(model, outputs=[n for n in dict.fromkeys(names) if n in produced], copy=True)()
