"""Model registry: ``@register_model`` on a builder, ``create_model(name)`` to build one.

Every registered model carries a :class:`ModelSpec` (input size, class count,
normalisation, tensor names) that the pipeline reads instead of guessing, and a
:class:`Recipe`: the training defaults it trains with (``get_recipe(name)``). A model
that is not registered can still be used: ``create_model("pkg.module:factory")`` or
``create_model("path/to/file.py:factory")`` imports the factory and takes the spec
from keyword overrides or from attributes the factory sets on the module it returns.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import inspect
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class ModelSpec:
    """What the pipeline needs to know about a model besides its weights."""

    name: str
    input_size: tuple[int, int, int]  # channels, height, width
    num_classes: int
    mean: tuple[float, ...] = IMAGENET_MEAN
    std: tuple[float, ...] = IMAGENET_STD
    input_name: str = "input"
    output_name: str = "logits"
    # True when the architecture bakes the image size into its parameters (ViT position embeddings).
    fixed_input_size: bool = False
    description: str = ""
    # What the model does (pipeline.core.tasks): "classification" (logits) or "detection" (raw head + detections).
    task: str = "classification"

    def with_overrides(self, **overrides) -> "ModelSpec":
        return dataclasses.replace(self, **{k: v for k, v in overrides.items() if v is not None})

    def to_dict(self) -> dict:
        """The spec as the model card holds it; a classifier's card has no ``task`` key (it is the default)."""
        d = dataclasses.asdict(self)
        if d["task"] == "classification":
            del d["task"]
        return d


# The train.* config keys a recipe sets (pipeline/config.py puts them between the defaults and the user's config).
RECIPE_KEYS = ("optimizer", "lr", "momentum", "weight_decay", "warmup_epochs", "epochs", "bn_momentum")


@dataclass(frozen=True)
class Recipe:
    """The training defaults of a registered model: what it learns with on the embedded data set at the default
    size, measured (docs/models-and-data.md). A user's config file and ``key=value`` overrides still win."""

    optimizer: str  # "sgd" or "adamw"
    lr: float  # peak learning rate
    momentum: float  # SGD momentum (adamw ignores it)
    weight_decay: float  # on weights, not on norm scales and biases
    warmup_epochs: float  # the schedule: linear warm-up over these epochs, then cosine decay to zero
    epochs: int
    bn_momentum: float | None  # BatchNorm momentum while training; None: the layers' own
    min_image_size: int  # the smallest sensible square input (train warns below it); not a config key
    image_size: int | None = None  # data.image_size the model trains at by default (a detector's); None: the config's
    batch_size: int | None = None  # data.batch_size it trains with by default (a detector's); None: the config's

    def train_keys(self) -> dict:
        """The recipe as ``train.*`` config values."""
        return {key: getattr(self, key) for key in RECIPE_KEYS}


class UnknownModelError(LookupError):
    """Raised for a model name that is neither registered nor an importable ``module:factory``."""


@dataclass
class _Entry:
    builder: Callable
    spec: ModelSpec
    recipe: Recipe


_REGISTRY: dict[str, _Entry] = {}


def register_model(
    *,
    recipe: Recipe,
    input_size: tuple[int, int, int] = (3, 224, 224),
    num_classes: int = 1000,
    mean: tuple[float, ...] = IMAGENET_MEAN,
    std: tuple[float, ...] = IMAGENET_STD,
    fixed_input_size: bool = False,
    task: str = "classification",
):
    """Register ``builder(num_classes=..., image_size=...) -> nn.Module`` under its function name, with the
    ``recipe`` it trains with."""

    def decorator(builder: Callable) -> Callable:
        name = builder.__name__
        if name in _REGISTRY:
            raise ValueError(f"model {name!r} is registered twice")
        doc = (builder.__doc__ or "").strip().splitlines()
        spec = ModelSpec(
            name=name,
            input_size=tuple(input_size),
            num_classes=num_classes,
            mean=tuple(mean),
            std=tuple(std),
            fixed_input_size=fixed_input_size,
            description=doc[0] if doc else "",
            task=task,
            **({"output_name": "head"} if task == "detection" else {}),  # a detector's raw head (pipeline.core.tasks)
        )
        _REGISTRY[name] = _Entry(builder=builder, spec=spec, recipe=recipe)
        return builder

    return decorator


def list_models() -> list[str]:
    return sorted(_REGISTRY)


def is_import_path(name: str) -> bool:
    return ":" in name


def split_import_path(name: str) -> tuple[str, str]:
    """``"package.module:factory"`` or ``"path/to/file.py:factory"`` -> ``(module part, factory name)``.

    Raises :class:`UnknownModelError` when either part is empty.
    """
    module_part, _, attr = name.rpartition(":")
    if not module_part or not attr:
        raise UnknownModelError(f"model {name!r}: expected 'package.module:factory' or 'file.py:factory'")
    return module_part, attr


def import_path_source(name: str) -> Path | None:
    """The source file of a user model's module, found without importing it; None where it cannot be found."""
    try:
        module_part, _ = split_import_path(name)
    except UnknownModelError:
        return None
    if module_part.endswith(".py"):
        return Path(module_part).expanduser().resolve()
    try:
        spec = importlib.util.find_spec(module_part)
    except (ImportError, ValueError):
        return None
    return Path(spec.origin) if spec and spec.origin else None


def get_spec(name: str) -> ModelSpec:
    """The registered spec of ``name``; raises :class:`UnknownModelError` naming the known models."""
    try:
        return _REGISTRY[name].spec
    except KeyError:
        raise UnknownModelError(
            f"unknown model {name!r}; known models: {', '.join(list_models())} "
            "(or give your own as 'package.module:factory' or 'path/to/file.py:factory')"
        ) from None


def get_recipe(name: str) -> Recipe:
    """The training recipe of registered model ``name``; raises :class:`UnknownModelError` like :func:`get_spec`."""
    get_spec(name)
    return _REGISTRY[name].recipe


def create_model(name: str, *, num_classes: int | None = None, image_size: int | None = None):
    """Build a registered model, optionally with another class count or (for ViTs) image size.

    Returns ``(module, spec)`` where ``spec`` describes the module actually built.
    """
    if is_import_path(name):
        return _create_user_model(name, num_classes=num_classes, image_size=image_size)
    spec = get_spec(name)
    builder = _REGISTRY[name].builder
    num_classes = num_classes or spec.num_classes
    size = image_size or spec.input_size[1]
    module = builder(num_classes=num_classes, image_size=size)
    return module, spec.with_overrides(num_classes=num_classes, input_size=(spec.input_size[0], size, size))


def load_factory(path: str) -> Callable:
    """Import the factory a ``module:factory`` model name points at; :class:`UnknownModelError` says why it cannot."""
    module_part, attr = split_import_path(path)
    try:
        if module_part.endswith(".py"):
            file = Path(module_part).expanduser().resolve()
            if not file.is_file():
                raise UnknownModelError(f"model {path!r}: file {file} does not exist")
            mod_name = f"_pipeline_user_model_{file.stem}"
            spec = importlib.util.spec_from_file_location(mod_name, file)
            module = importlib.util.module_from_spec(spec)
            sys.modules[mod_name] = module  # dataclasses and pickling look modules up by name
            spec.loader.exec_module(module)
        else:
            if "" not in sys.path and str(Path.cwd()) not in sys.path:
                sys.path.insert(0, str(Path.cwd()))  # as `python -m` would: the working directory is importable
            module = importlib.import_module(module_part)
    except UnknownModelError:
        raise
    except Exception as exc:  # the user's module failed to import: say which and why
        raise UnknownModelError(f"model {path!r}: cannot import {module_part!r}: {type(exc).__name__}: {exc}") from exc
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise UnknownModelError(f"model {path!r}: {module_part!r} has no callable {attr!r}")
    return factory


class InvalidModelError(ValueError):
    """A user factory that fails, returns something other than an ``nn.Module``, or declares an unusable spec."""


def _create_user_model(path: str, *, num_classes: int | None, image_size: int | None):
    from torch import nn

    factory = load_factory(path)
    where = f"model {path!r}: factory {path.rpartition(':')[2]}"
    params = inspect.signature(factory).parameters
    kwargs = {}
    if num_classes is not None and "num_classes" in params:
        kwargs["num_classes"] = num_classes
    if image_size is not None and "image_size" in params:
        kwargs["image_size"] = image_size
    try:
        module = factory(**kwargs)
    except Exception as exc:  # the user's code failed: one line naming it, the traceback stays under --debug
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        raise InvalidModelError(f"{where}({', '.join(f'{k}={v}' for k, v in kwargs.items())}) raised "
                                f"{type(exc).__name__}: {first}") from exc
    if not isinstance(module, nn.Module):
        raise InvalidModelError(f"{where} returned {type(module).__name__}, not an nn.Module")

    def attr(name, default=None):
        return getattr(module, name, getattr(factory, name, default))

    declared = {name: attr(name) for name in ("input_size", "num_classes", "mean", "std", "input_name", "output_name")}
    problem = _declaration_problem(declared)
    if problem:
        raise InvalidModelError(f"{where} sets {problem}")
    input_size = declared["input_size"]
    if isinstance(input_size, int):
        input_size = (3, input_size, input_size)
    spec = ModelSpec(
        name=path,
        input_size=tuple(input_size) if input_size else (3, image_size or 224, image_size or 224),
        num_classes=int(declared["num_classes"]) if declared["num_classes"] else (num_classes or 0),
        mean=tuple(float(v) for v in declared["mean"] or IMAGENET_MEAN),
        std=tuple(float(v) for v in declared["std"] or IMAGENET_STD),
        input_name=declared["input_name"] or "input",
        output_name=declared["output_name"] or "logits",
        fixed_input_size=bool(attr("fixed_input_size", False)),
        description=(factory.__doc__ or "user model").strip().splitlines()[0],
        task=str(attr("task", "classification")),
    )
    return module, spec


def _declaration_problem(declared: dict) -> str | None:
    """What is wrong with the spec attributes a factory set (None: unset), or None if nothing is."""
    import math

    def count(v) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and v > 0

    size, channels = declared["input_size"], 3
    if size is not None:
        if not (count(size) or (isinstance(size, (tuple, list)) and len(size) == 3 and all(map(count, size)))):
            return f"input_size={size!r}: expected an int or (channels, height, width) of positive ints"
        channels = 3 if isinstance(size, int) else size[0]
    if declared["num_classes"] is not None and not count(declared["num_classes"]):
        return f"num_classes={declared['num_classes']!r}: expected a positive int"
    for key in ("mean", "std"):
        values = declared[key]
        if values is None:
            continue
        numbers = isinstance(values, (tuple, list)) and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values)
        if not numbers or len(values) != channels or (key == "std" and min(values) <= 0):
            return (f"{key}={values!r}: expected {channels} finite numbers (one per input channel)"
                    + (", all > 0" if key == "std" else ""))
    for key in ("input_name", "output_name"):
        if declared[key] is not None and not (isinstance(declared[key], str) and declared[key].strip()):
            return f"{key}={declared[key]!r}: expected a non-empty string (an ONNX tensor name)"
    names = (declared["input_name"] or "input", declared["output_name"] or "logits")
    if names[0] == names[1]:
        return f"input_name and output_name both to {names[0]!r}: the ONNX input and output need different names"
    return None


# Importing the architecture modules registers them.
from models import detector, mobilenet, resnet, tiny, vit  # noqa: E402,F401
