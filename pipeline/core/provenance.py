"""Which weights an exported graph was made from, written into the graph itself.

Export stamps every ONNX graph it writes (``model.onnx``, ``model.fp16.onnx``, ``model.int8.onnx`` and
verify's fallback candidates) with the sha256 of the ``model.safetensors`` it exported, as ONNX metadata
(``metadata_props``). A graph left by an export that failed or was interrupted then still names the old
weights, so a later stage refuses it (:func:`check_graph`) instead of judging a stale graph: an earlier
verify, or ``--auto-fallback``, once "fixed" such a graph by excluding nodes for ever.
"""

from __future__ import annotations

from pathlib import Path

import onnx

from pipeline.core.artifacts import WEIGHTS
from pipeline.core.errors import InputError

KEY = "pipeline.source_weights_sha256"


def stamp(model: onnx.ModelProto, weights_sha256: str) -> onnx.ModelProto:
    """Record ``weights_sha256`` in ``model`` (replacing an earlier stamp); returns ``model``."""
    kept = [p for p in model.metadata_props if p.key != KEY]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    model.metadata_props.add(key=KEY, value=weights_sha256)
    return model


def stamp_file(path: Path, weights_sha256: str) -> None:
    """Stamp the graph in ``path`` (a temporary file the caller then moves into place) in place."""
    onnx.save(stamp(onnx.load(str(path)), weights_sha256), str(path))


def source_weights(model: onnx.ModelProto) -> str | None:
    return next((p.value for p in model.metadata_props if p.key == KEY), None)


def check_graph(model: onnx.ModelProto, name: str, weights_sha256: str) -> None:
    """Raise :class:`InputError` (exit 2) unless ``model`` was exported from the weights ``weights_sha256``."""
    source = source_weights(model)
    if source and source == weights_sha256:  # an empty stamp (a graph made from an unstamped one) is no record
        return
    made = f"from other weights (sha256 {source[:12]}…)" if source else "without a record of its weights"
    raise InputError(f"{name} was exported {made}, not from the current {WEIGHTS} (sha256 {weights_sha256[:12]}…): "
                     "export did not finish; re-run export")


def check_graphs(weights_sha256: str, graphs: dict[str, onnx.ModelProto | None]) -> None:
    """:func:`check_graph` for each graph present (``None``: not exported, nothing to check)."""
    for name, model in graphs.items():
        if model is not None:
            check_graph(model, name, weights_sha256)
