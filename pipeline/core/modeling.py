"""Building the configured model, loading weights safely, and the ``model.json`` model card."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from pipeline.core import model_card, tasks
from pipeline.core.artifacts import MODEL_CARD, WEIGHTS
from pipeline.core.errors import InputError, UsageError, first_line
from pipeline.core.model_card import ModelCard
from pipeline.core.registry import models
from pipeline.core.run import RunDir, write_json

if TYPE_CHECKING:  # annotations only
    from pipeline.core.config_schema import Config


def resolve_spec(cfg: Config) -> models.ModelSpec:
    """The spec ``model.name`` declares: its input size and normalisation, which the data is loaded with.

    A user factory declares them on the module it returns, so it is called once here to read them; the same
    declarations then reach the model card through :func:`build`, and every later stage reads the card.
    """
    name = cfg.model.name
    if models.is_import_path(name):
        _, spec = _create(cfg, num_classes=cfg.model.num_classes, size=cfg.data.image_size)
        return spec
    try:
        return models.get_spec(name)
    except models.UnknownModelError as exc:
        raise UsageError(str(exc)) from None


def _create(cfg: Config, *, num_classes: int | None, size: int | None) -> tuple[nn.Module, models.ModelSpec]:
    try:
        return models.create_model(cfg.model.name, num_classes=num_classes, image_size=size)
    except (models.UnknownModelError, models.InvalidModelError) as exc:
        raise UsageError(str(exc)) from None


def _another_model(run_dir, model: str | None, cfg: Config) -> str:
    return (f"{run_dir} holds a trained {model!r}, but the config asks for {cfg.model.name!r}; "
            "re-run train or use another --run-dir")


def check_card_first(cfg: Config, run_dir) -> None:
    """Before :func:`check_model_name` imports a user's model file: a stage that reads the trained model refuses
    a run whose model card names another model (a ``model.name`` in a run's config.yaml that points at a Python
    file is then never imported and run). A missing or unreadable card is left to :func:`read_card`."""
    path = Path(run_dir) / MODEL_CARD
    if path.is_symlink() or not path.is_file():
        return
    trained = model_card.model_name(path)
    if trained is not model_card.NOT_A_CARD and trained != cfg.model.name:
        raise InputError(_another_model(run_dir, trained, cfg))


def check_model_name(cfg: Config) -> None:
    """Fail early (exit 2) on an unknown model or a user factory that cannot be imported."""
    try:
        if models.is_import_path(cfg.model.name):
            models.load_factory(cfg.model.name)
        else:
            models.get_spec(cfg.model.name)
    except models.UnknownModelError as exc:
        raise UsageError(str(exc)) from None


def image_size(cfg: Config, spec: models.ModelSpec) -> int:
    return cfg.data.image_size or spec.input_size[1]


def normalisation(cfg: Config, spec: models.ModelSpec) -> tuple[tuple[float, ...], tuple[float, ...]]:
    mean = tuple(cfg.model.mean) if cfg.model.mean else spec.mean
    std = tuple(cfg.model.std) if cfg.model.std else spec.std
    if len(mean) != len(std):
        raise UsageError(f"model.mean has {len(mean)} values but model.std has {len(std)}")
    return mean, std


def build(cfg: Config, num_classes: int, size: int) -> tuple[nn.Module, models.ModelSpec]:
    """Instantiate the model for ``num_classes`` at ``size`` and check its output shape once."""
    module, spec = _create(cfg, num_classes=num_classes, size=size)
    mean, std = normalisation(cfg, spec)
    spec = spec.with_overrides(mean=mean, std=std, num_classes=num_classes, input_size=(len(mean), size, size))
    problem = model_card._problem(spec.to_dict())
    if problem:
        raise UsageError(f"model {cfg.model.name!r}: {problem}")
    module.eval()
    with torch.no_grad():
        try:
            out = module(torch.zeros(2, len(mean), size, size))
        except Exception as exc:
            raise UsageError(f"model {cfg.model.name!r} cannot run on {len(mean)}x{size}x{size} images: "
                             f"{type(exc).__name__}: {exc}") from None
    task = tasks.of(spec)
    if task.name != tasks.CLASSIFICATION:
        problem = tasks.output_problem(task, out, 2, num_classes)
        if problem:
            raise UsageError(f"model {cfg.model.name!r}: {problem}")
        return module, spec
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != (2, num_classes):
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise UsageError(
            f"model {cfg.model.name!r} returns {shape} for a batch of 2, but the data set has {num_classes} classes; "
            "its factory should accept num_classes (or set model.num_classes to match the data)"
        )
    return module, spec


def classifier_head(module: nn.Module) -> nn.Linear | None:
    last = None
    for m in module.modules():
        if isinstance(m, nn.Linear):
            last = m
    return last


def load_state_dict_file(path: str | Path) -> dict[str, torch.Tensor]:
    """Load weights from ``.safetensors`` or from a ``.pt``/``.pth`` with ``weights_only=True`` (never full pickle)."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise InputError(f"weights file {path} does not exist")
    if path.suffix == ".safetensors":
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            return load_file(str(path))
        except (SafetensorError, OSError, ValueError) as exc:
            raise InputError(f"{path} is not a readable safetensors file: {exc}") from None
    state = safe_torch_load(path, what="weights file")
    if isinstance(state, dict) and isinstance(state.get("model"), dict):
        state = state["model"]  # a pipeline checkpoint
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise InputError(f"{path} does not hold a state dict (a mapping of names to tensors)")
    return state


def safe_torch_load(path: str | Path, what: str):
    """``torch.load(weights_only=True)``: tensors and plain containers only, never arbitrary objects."""
    import pickle

    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise InputError(_refusal(Path(path), what, str(exc))) from None
    except (RuntimeError, EOFError, OSError, ValueError, KeyError, AttributeError, IndexError, TypeError,
            MemoryError, OverflowError, UnicodeDecodeError) as exc:
        first = first_line(exc)
        raise InputError(f"{path}: {what} is truncated or corrupt ({type(exc).__name__}: {first[:200]})") from None


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_GLOBAL = re.compile(r"Unsupported global: GLOBAL (\S+)")


def _refusal(path: Path, what: str, text: str) -> str:
    """One line for torch's weights-only refusal, without its advice to retry with ``weights_only=False``."""
    text = _ANSI.sub("", text)
    found = _GLOBAL.search(text)
    if found:
        return (f"{path}: {what} refused: it references {found.group(1)}, which a weights-only file may not hold "
                "(a pickle that could run code); only tensors and plain containers are loaded, never arbitrary "
                "pickles")
    if "WeightsUnpickler error:" in text:
        reason = text.split("WeightsUnpickler error:", 1)[1].split("Check the documentation of torch.load")[0]
    else:  # never pass on torch's advice to retry with weights_only=False
        reason = next((line for line in text.splitlines() if line.strip() and "weights_only" not in line), "")
    reason = " ".join(reason.split())[:200] or "unreadable"
    return (f"{path}: {what} refused: not a weights-only PyTorch file ({reason}); it is corrupt, or a pickle "
            "with content other than tensors and plain containers, which is never loaded")


def load_init_weights(module: nn.Module, path: str) -> dict:
    """Load ``train.init_weights``; a classifier head of another size is replaced, anything else must fit.

    Every parameter and buffer except the classifier head must come from the file, and the file may hold
    nothing the model lacks except one other classifier head: a file that matches little or nothing would
    otherwise train from scratch while the run claims to start from it.
    """
    state = load_state_dict_file(path)
    own = module.state_dict()
    head = classifier_head(module)
    head_keys = {f"{name}.{p}" for name, m in module.named_modules() if m is head for p in ("weight", "bias")}
    replaced, mismatched = [], []
    for key in list(state):
        if key in own and tuple(state[key].shape) != tuple(own[key].shape):
            if key in head_keys:
                replaced.append(f"{key} {tuple(state[key].shape)} -> {tuple(own[key].shape)}")
                del state[key]
            else:
                mismatched.append(f"{key}: file {tuple(state[key].shape)}, model {tuple(own[key].shape)}")
    if mismatched:
        raise InputError(f"{path} does not fit model: " + "; ".join(mismatched[:5])
                         + (f" (and {len(mismatched) - 5} more)" if len(mismatched) > 5 else ""))
    _check_coverage(path, own, state, head_keys)
    result = module.load_state_dict(state, strict=False)
    missing = [k for k in result.missing_keys if k not in head_keys or not replaced]
    return {
        "path": str(path),
        "missing_keys": missing,
        "unexpected_keys": list(result.unexpected_keys),
        "replaced_head": replaced,
    }


def _check_coverage(path, own: dict, state: dict, head_keys: set[str]) -> None:
    """Refuse weights that leave model keys other than the head unset, or hold keys other than a head."""
    def listed(keys: list[str]) -> str:
        return ", ".join(keys[:5]) + (f" (and {len(keys) - 5} more)" if len(keys) > 5 else "")

    # BatchNorm fills in a missing num_batches_tracked itself (files saved before PyTorch 0.4.1 lack it).
    missing = [k for k in own if k not in state and k not in head_keys and not k.endswith("num_batches_tracked")]
    extra = [k for k in state if k not in own]
    if missing or (extra and not _another_head(state, extra, head_keys)):
        problems = []
        if missing:
            problems.append(f"{len(missing)} of the model's {len(own)} keys are not in the file: {listed(missing)}")
        if extra:
            problems.append(f"{len(extra)} keys of the file are not in the model: {listed(extra)}")
        raise InputError(f"train.init_weights {path} does not match the model: " + "; ".join(problems)
                         + f"; only the classifier head ({', '.join(sorted(head_keys)) or 'none found'}) may differ")


def _another_head(state: dict, extra: list[str], head_keys: set[str]) -> bool:
    """Whether the file's unmatched keys are one linear layer, a classifier head under another name, standing
    in for the model's head (which the file then lacks)."""
    prefixes = {k.rpartition(".")[0] for k in extra}
    if len(prefixes) != 1 or head_keys & set(state):
        return False
    prefix = prefixes.pop()
    weight = state.get(f"{prefix}.weight")
    return set(extra) <= {f"{prefix}.weight", f"{prefix}.bias"} and weight is not None and weight.ndim == 2


def write_card(run: RunDir, card: ModelCard) -> None:
    write_json(run.file(MODEL_CARD), card.to_json())


def read_card(run: RunDir, consumer: str) -> ModelCard:
    """The run's model card, typed and checked (:func:`pipeline.core.model_card.read`)."""
    return model_card.read(run.require(MODEL_CARD, "train", consumer))


def load_trained(cfg: Config, run: RunDir, consumer: str) -> tuple[nn.Module, ModelCard]:
    """The trained FP32 model (eval mode, CPU) and its model card."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    card = read_card(run, consumer)
    weights = run.require(WEIGHTS, "train", consumer)
    if card.model != cfg.model.name:
        raise InputError(_another_model(run.path, card.model, cfg))
    module, _ = build(cfg, card.spec.num_classes, card.spec.image_size)
    try:
        state = load_file(str(weights))
    except (SafetensorError, OSError, ValueError) as exc:
        raise InputError(f"{weights} is truncated or corrupt ({exc}); re-run train") from None
    try:
        module.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise InputError(f"{weights} does not match model {cfg.model.name!r}: {first_line(exc)}") from None
    return module.eval(), card
