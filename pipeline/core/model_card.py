"""``model.json``, the model card, as a type: :class:`ModelCard` (what train learned and everything a deployment
needs to know) and its :class:`CardSpec` (the tensors' names, the input size and normalisation, the task).

train makes the card (:meth:`ModelCard.trained`) and writes it once (:meth:`ModelCard.to_json`, the shape of earlier
releases: ``model``, ``spec``, ``classes``, ``weights``, ``weights_epoch``, ``val_acc``, ``input``, ``output``, in that
order; the spec's ``task`` only on a detector's). Every later stage reads it back through :func:`read` (the one
reader: no links, a size cap, only the card's keys, the spec checked before it sizes a tensor; one
:class:`~pipeline.core.errors.InputError` when damaged) and by attribute from there: ``card.spec.input_size``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from pipeline.core import schema, tasks
from pipeline.core.errors import InputError

# Every top-level key of the model card train writes: a card with another is not this tool's.
CARD_KEYS = frozenset({"model", "spec", "classes", "weights", "weights_epoch", "val_acc", "input", "output"})


class CardSpec(schema.Open):
    """What the pipeline knows about the model besides its weights (the registry's ``ModelSpec``, as trained)."""

    model_config = schema.Open.model_config | {"strict": False}  # checked by _problem first: JSON lists as read

    name: str | None = None
    input_size: list[int]  # channels, height, width
    num_classes: int
    mean: list[float | int]  # as written: 0.5, or 0
    std: list[float | int]
    input_name: str
    output_name: str
    fixed_input_size: bool = False
    description: str = ""
    task: str = tasks.CLASSIFICATION  # written only on a detector's card

    @classmethod
    def of(cls, spec: Any) -> CardSpec:
        """The card's spec of a registry ``ModelSpec`` (the one train resolved, with the config's overrides)."""
        return cls.model_validate(spec.to_dict())

    @property
    def image_size(self) -> int:
        return self.input_size[1]

    def to_json(self) -> dict[str, Any]:
        """The spec as the card holds it (the keys it was made with; a classifier's has no ``task``)."""
        return self.model_dump(exclude_unset=True)


class ModelCard(schema.Open):
    """The run's model card: the model's name and spec, its classes, and what train chose for its weights."""

    model_config = schema.Open.model_config | {"strict": False}

    model: str | None = None  # the config's model.name it was trained as
    spec: CardSpec
    classes: list[str] | None = None  # the class names, in label order
    weights: str | None = None
    weights_epoch: int | None = None
    val_acc: float | None = None
    input: dict[str, Any] | None = None  # for people and deployments: the input tensor, its layout and normalisation
    output: dict[str, Any] | None = None

    @classmethod
    def trained(cls, model: str, spec: Any, classes: list[str], weights: str, epoch: int, val_acc: float) -> ModelCard:
        """The card train writes for the weights of ``epoch`` of the model ``spec`` (a registry ``ModelSpec``)."""
        card_spec = CardSpec.of(spec)
        return cls(model=model, spec=card_spec, classes=list(classes), weights=weights, weights_epoch=epoch,
                   val_acc=val_acc,
                   input={"name": card_spec.input_name, "shape": ["batch", *card_spec.input_size],
                          "dtype": "float32", "layout": "NCHW",
                          "normalisation": {"mean": list(card_spec.mean), "std": list(card_spec.std)}},
                   output={"name": card_spec.output_name, "shape": ["batch", card_spec.num_classes],
                           "meaning": "logits"})

    def to_json(self) -> dict[str, Any]:
        """The card as model.json holds it: the keys it was made (or read) with, in the order train writes them."""
        card = self.model_dump(exclude_unset=True)
        card["spec"] = self.spec.to_json()
        return card


def read(path: str | Path, *, raw: Any = None) -> ModelCard:
    """The model card at ``path`` (already read as ``raw``, or read here through the one JSON reader), typed and
    checked; one :class:`InputError` naming the file when it is not a card or its spec cannot size a tensor."""
    from pipeline.core.run import read_json

    card = read_json(path, "model card", keys=CARD_KEYS) if raw is None else raw
    if not isinstance(card, dict) or not isinstance(card.get("spec"), dict):
        raise InputError(f"{path} is not a pipeline model card; re-run train")
    problem = _problem(card["spec"])
    if problem:
        raise InputError(f"{path} is not a valid model card ({problem}); re-run train")
    try:
        return ModelCard.model_validate(card)
    except ValidationError as exc:
        raise InputError(f"{path} is not a valid model card ({schema.problem(exc)}); re-run train") from None


NOT_A_CARD = object()  # what model_name says of a file that is no card at all


def model_name(path: str | Path) -> Any:
    """The model the card at ``path`` names (None: none), read before the rest of the card is checked (a stage
    refuses another model's run before it imports a model file); :data:`NOT_A_CARD` when the file is no card."""
    from pipeline.core.run import read_json

    card = read_json(path, "model card", keys=CARD_KEYS)
    return card.get("model") if isinstance(card, dict) else NOT_A_CARD


def _problem(spec: dict) -> str | None:
    """What is wrong with a model card's spec (it sizes tensors, so it is checked before use), or None."""
    def count(v, lo, hi):
        return isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi

    size = spec.get("input_size")
    if not (isinstance(size, (list, tuple)) and len(size) == 3 and all(count(d, 1, 4096) for d in size)):
        return f"spec.input_size {size!r} is not [channels, height, width] of sizes 1..4096"
    if spec.get("task", "classification") not in tasks.TASKS:
        return f"spec.task {spec.get('task')!r} is not one of {sorted(tasks.TASKS)}"
    if not count(spec.get("num_classes"), 1, 1_000_000):
        return f"spec.num_classes {spec.get('num_classes')!r} is not a positive class count"
    for key in ("input_name", "output_name"):
        if not isinstance(spec.get(key), str) or not spec.get(key):
            return f"spec.{key} {spec.get(key)!r} is not a tensor name"
    if spec["input_name"] == spec["output_name"]:
        return f"spec.input_name and spec.output_name are both {spec['input_name']!r}"
    for key in ("mean", "std"):
        values = spec.get(key)
        if not (isinstance(values, (list, tuple)) and len(values) == size[0]
                and all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                        for v in values)):
            return f"spec.{key} {values!r} is not {size[0]} finite numbers"
        if key == "std" and min(values) <= 0:
            return f"spec.std {values!r} has a value <= 0"
    return None
