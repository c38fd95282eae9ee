"""The configuration as the orchestration loads it: YAML file plus ``key=value`` overrides, validated before any work
starts, and checked against the backend table.

The schema (every section, key, type, default, range and meaning; ``python -m pipeline config`` prints it) is
:mod:`pipeline.core.config_schema`, in the bottom layer, so that every layer can take ``cfg: Config``. What depends on
the backend table lives here: the names ``verify.candidates.<name>``, ``verify.gate`` and ``benchmark.backends`` may
hold, and their defaults (:class:`TableConfig`). Problems are collected and reported together as a
:class:`~pipeline.core.errors.ConfigError` (exit code 2).
"""

from __future__ import annotations

import difflib
import logging
import reprlib
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, Field, ValidationError, create_model, field_validator

from pipeline.core.config_schema import (  # noqa: F401  (re-exported: callers use pipeline.config.<name>)
    FLOAT32_TINY,
    MAX_CHILD_WAIT_S,
    MAX_CONFIG_BYTES,
    MAX_ITERATIONS,
    MAX_TIMING_S,
    MAX_TRIALS,
    MAX_YAML_DEPTH,
    SEED_LIMIT,
    BenchmarkConfig,
    BF16Config,
    BF16Gate,
    BuildConfig,
    CandidateConfig,
    CompareConfig,
    Config,
    Criterion,
    DataConfig,
    DeployConfig,
    ErrorStat,
    ExportConfig,
    FP16Config,
    FP16Gate,
    FP32Gate,
    INT8Config,
    INT8Gate,
    IsolateConfig,
    ModelConfig,
    PreciseBNConfig,
    Section,
    Tolerance,
    TrainConfig,
    TuneConfig,
    VerifyConfig,
    _Dumper,
    _Loader,
    apply_overrides,
    deep_merge,
    dump_yaml,
    load_yaml_file,
    parse_override,
    parse_yaml,
)
from pipeline.core.errors import ConfigError
from pipeline.runtime import backends as backend_table

# --------------------------------------------------------------------------- the backend table's names

# One section per verify candidate of the backend table, so a new backend needs no edit here.
CandidatesConfig = create_model(
    "CandidatesConfig", __base__=Section,
    **{b.verify_name: (CandidateConfig, CandidateConfig()) for b in backend_table.candidates()},
)


CandidateName = Literal[tuple(b.verify_name for b in backend_table.candidates())]


_TableVerifyConfig = create_model(
    "VerifyConfig", __base__=VerifyConfig,
    gate=(Union[Literal["auto"], list[CandidateName]], VerifyConfig.model_fields["gate"]),
    candidates=(CandidatesConfig, CandidatesConfig()),
)


BenchBackend = Literal[tuple(b.name for b in backend_table.TABLE if b.benchmark != "no")]  # as the table names them


def _renamed(cls, names):
    """An old backend name (``onnxrt_fp16``, now ``onnxrt_fp16_cpu`` as verify names it) still works, and says so."""
    if not isinstance(names, list):
        return names
    old = [n for n in names if isinstance(n, str) and n in backend_table.RENAMED]
    for name in old:
        logging.getLogger("pipeline").warning("config: benchmark.backends: %s is now %s (the old name still works)",
                                              name, backend_table.RENAMED[name])
    return [backend_table.RENAMED.get(n, n) if isinstance(n, str) else n for n in names]


TableBenchmarkConfig = create_model(
    "BenchmarkConfig", __base__=BenchmarkConfig,
    __validators__={"_renamed": field_validator("backends", mode="before")(classmethod(_renamed))},
    backends=(Optional[list[BenchBackend]], Field(None, description="backends to time, as listed (each is skipped "
                                                  "with a reason where it cannot run); null: the table's defaults ("
                                                  + ", ".join(backend_table.default_timed()) + "), narrowed by "
                                                  "benchmark.rows")),
)

# The schema with the table's names and defaults: what :func:`validate` checks a config against (one problem per
# unknown candidate, gate or backend name, as any other key), what :func:`describe` lists. A subclass of Config.
TableConfig = create_model(
    "Config", __base__=Config,
    verify=(_TableVerifyConfig, _TableVerifyConfig()),
    benchmark=(TableBenchmarkConfig, TableBenchmarkConfig()),
)


# --------------------------------------------------------------------------- validation

_short_repr = reprlib.Repr()  # bounded work and length, even for a YAML alias bomb
_short_repr.maxstring = _short_repr.maxother = 50
_short_repr.maxlist = _short_repr.maxdict = 4
_short_repr.maxlevel = 2


def _known_keys(model: type[BaseModel], loc: tuple) -> list[str]:
    for part in loc:
        field = model.model_fields.get(part) if isinstance(part, str) else None
        annotation = getattr(field, "annotation", None)
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            model = annotation
        else:
            break
    return list(model.model_fields)


class _Items(tuple):
    """List indices that share one problem, shown as ``key[0, 2]``."""


def _union_member(part: Any) -> bool:
    return isinstance(part, str) and ("[" in part or part in {"float", "int", "str"})


def _union_at(err: dict) -> tuple | None:
    loc = tuple(err["loc"])
    return next((loc[:i] for i, part in enumerate(loc) if _union_member(part)), None)


def _relevant_errors(errors: list[dict]) -> list[dict]:
    """One error per problem. A union reports each member's error: keep the member the value was
    meant for ("a finite number" over "a valid dictionary"), or the first when none fits. List
    items with the same problem become one error."""
    specific = {_union_at(e) for e in errors if not e["type"].endswith("_type")}
    merged: dict[tuple, dict] = {}
    for err in errors:
        union = _union_at(err)
        if union is not None and err["type"].endswith("_type"):
            if union in specific or (union, "_type") in merged:
                continue
            merged[(union, "_type")] = err
            continue
        loc = tuple(err["loc"])
        if loc and isinstance(loc[-1], int):
            key = (loc[:-1], err["type"])
            if key in merged:
                first = merged[key]
                first["loc"] = first["loc"][:-1] + (_Items(first["loc"][-1] + (loc[-1],)),)
                continue
            err = {**err, "loc": loc[:-1] + (_Items((loc[-1],)),)}
        else:
            key = (loc, err["type"], len(merged))
        merged[key] = err
    return list(merged.values())


def _dotted(loc: tuple) -> str:
    text = ""
    for part in loc:
        if isinstance(part, _Items):
            text += f"[{', '.join(map(str, part))}]"
        else:
            text += ("." if text else "") + (str(part) if part != "" else "''")
    return text


def _format_error(err: dict) -> str:
    if err["type"] == "extra_forbidden":  # the user's own key: keep its path exactly
        loc = tuple(err["loc"])
    else:  # union members add their type name to the location; drop those parts
        loc = tuple(p for p in err["loc"] if not _union_member(p))
    where = _dotted(loc) or "config"
    if err["type"] == "extra_forbidden":
        siblings = _known_keys(TableConfig, loc[:-1])
        close = difflib.get_close_matches(str(loc[-1]), siblings, n=1)
        hint = f" (did you mean {'.'.join(map(str, loc[:-1] + (close[0],)))}?)" if close else ""
        return f"{where}: unknown key{hint}"
    if err["type"] == "invalid_key":
        return f"{where}: keys must be strings"
    msg = err["msg"]
    if msg.startswith("Value error, "):  # from a model validator: located at its section
        text = msg[len("Value error, "):]
        return text if where == "config" or text.startswith(where) else f"{where}: {text}"
    value = _short_repr.repr(err.get("input"))
    return f"{where}: {msg[0].lower() + msg[1:]} (got {value})"


def validate(data: Any) -> Config:
    """``data`` checked against the schema and the backend table's names (:class:`TableConfig`), as the typed
    :class:`Config` every stage takes: ``verify.candidates`` holds every candidate of the table, in its order."""
    if not isinstance(data, dict):
        raise ConfigError([f"config: top level must be a mapping, got {type(data).__name__}"])
    try:
        checked = TableConfig.model_validate(data)
        return Config.model_validate(checked.model_dump())
    except ValidationError as exc:
        problems = []
        for err in _relevant_errors(exc.errors()):
            line = _format_error(err)
            if line not in problems:
                problems.append(line)
        raise ConfigError(problems) from None
    except (TypeError, ValueError, RecursionError) as exc:  # e.g. unhashable YAML keys
        raise ConfigError([f"config: {exc}"]) from None


# --------------------------------------------------------------------------- precedence


def recipe_layer(model_name: Any) -> dict:
    """The ``train.*`` values the card of registered model ``model_name`` carries (``models.Recipe``); {} for a user
    model and for an unknown name (which fails later, naming the known models)."""
    if not isinstance(model_name, str) or not model_name or ":" in model_name:
        return {}
    from pipeline.core.registry import models

    try:
        recipe = models.get_recipe(model_name)
    except models.UnknownModelError:
        return {}
    layer = {"train": recipe.train_keys()}
    data = {key: value for key in ("image_size", "batch_size") if (value := getattr(recipe, key)) is not None}
    if data:  # a detector's recipe names its input size and batch size too
        layer["data"] = data
    return layer


def _model_name(data: dict) -> Any:
    section = data.get("model")
    name = section.get("name") if isinstance(section, dict) else None
    return name if name is not None else ModelConfig.model_fields["name"].default


def _without_recipe(base: dict) -> dict:
    """A run directory's config.yaml (which holds every key) without the values its model's recipe, or the defaults,
    gave it: what the user chose there. Used when the model changes, so the new model's recipe applies."""
    from pipeline.core.registry import models

    train = base.get("train")
    if not isinstance(train, dict):
        return base
    given = {key: TrainConfig.model_fields[key].default for key in models.RECIPE_KEYS}
    layer = recipe_layer(_model_name(base))
    given.update(layer.get("train", {}))
    out = {**base, "train": {k: v for k, v in train.items() if not (k in given and v == given[k])}}
    data, recipe_data = base.get("data"), layer.get("data", {})  # a detector's recipe sets data keys too
    if isinstance(data, dict) and recipe_data:
        out["data"] = {k: v for k, v in data.items() if not (k in recipe_data and v == recipe_data[k])}
    return out


def _user_layers(base: dict, config_file: str | None, overrides: list[str]) -> tuple[dict, dict]:
    """The user's config over ``base``, merged, and the config file alone; every problem at once."""
    data, from_file, problems = dict(base), {}, []
    if config_file:
        try:
            from_file = load_yaml_file(config_file)
        except ConfigError as err:
            problems += err.problems
    try:
        data = apply_overrides(deep_merge(data, from_file), list(overrides))
    except ConfigError as err:
        problems += err.problems
    if problems:
        raise ConfigError(problems)
    return data, from_file


def _own_base(base: dict | None, config_file: str | None, overrides: list[str]) -> tuple[dict, Any]:
    """``base`` as it applies to the model the config resolves to (that model's name beside it)."""
    base = dict(base or {})
    model = _model_name(_user_layers(base, config_file, overrides)[0])
    if base and _model_name(base) != model:
        base = _without_recipe(base)
    return base, model


def resolve(base: dict | None = None, config_file: str | None = None, overrides: list[str] = ()) -> Config:
    """Defaults <- the model's recipe <- ``base`` (a run directory's saved config) <- YAML file <- overrides
    (docs/configuration.md#precedence). A ``base`` saved for another model keeps only what the user chose there."""
    base, model = _own_base(base, config_file, list(overrides))
    user, _ = _user_layers(base, config_file, list(overrides))
    return validate(deep_merge(recipe_layer(model), user))


def origins(base: dict | None = None, config_file: str | None = None, overrides: list[str] = ()) -> dict[str, str]:
    """Where each value that is not the default comes from (``python -m pipeline config`` prints it): dotted key ->
    the layer that set it last; a run directory's config.yaml counts only where it differs from what lies below."""
    overrides = list(overrides)
    base, model = _own_base(base, config_file, overrides)
    _, from_file = _user_layers(base, config_file, overrides)
    leaves = {key for key, _, _ in describe()}
    current = _flat(TableConfig().to_dict(), leaves)
    found: dict[str, str] = {}
    for name, layer in ((f"{model}'s recipe", recipe_layer(model)), ("the run directory's config.yaml", base),
                        (f"--config {config_file}", from_file),
                        ("--model / key=value", apply_overrides({}, overrides))):
        for key, value in _flat(layer, leaves).items():
            if name.startswith("the run directory") and current.get(key) == value:
                continue
            found[key], current[key] = name, value
    return found


def _flat(data: dict, leaves: set[str], prefix: str = "") -> dict:
    """A nested config as dotted keys down to its leaves (a per-output tolerance dict stays one value)."""
    flat = {}
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and dotted not in leaves:
            flat.update(_flat(value, leaves, dotted + "."))
        else:
            flat[dotted] = value
    return flat


def describe() -> list[tuple[str, Any, str]]:
    """``(key, default, description)`` for every leaf key, for the docs and ``pipeline config --keys``."""
    rows = []

    def walk(model: type[BaseModel], values: dict, prefix: str) -> None:
        for name, field in model.model_fields.items():
            annotation = field.annotation
            if isinstance(annotation, type) and issubclass(annotation, BaseModel):
                walk(annotation, values[name], f"{prefix}{name}.")
            else:
                rows.append((f"{prefix}{name}", values[name], field.description or ""))

    walk(TableConfig, TableConfig().to_dict(), "")
    return rows


# --------------------------------------------------------------------------- ranges that depend on the machine

THREADS_PER_CORE = 4  # benchmark.threads: more than this many per usable core only oversubscribes (and 100,000 crashed)
SYNTHETIC_SHARE = 4  # the synthetic set (float32 images) may take at most a quarter of the machine's memory


def machine_problems(cfg: Config, cores: int, memory: int | None) -> list[str]:
    """The settings this machine cannot honour, one line each (empty: none), checked before any work: threads
    against its ``cores``, the synthetic set's size against its ``memory`` in bytes (None: not known, not checked)."""
    problems = []
    threads = cfg.benchmark.threads
    if threads is not None and threads > THREADS_PER_CORE * cores:
        problems.append(f"benchmark.threads: {threads} is more than {THREADS_PER_CORE} per usable core of this machine "
                        f"({cores} cores: at most {THREADS_PER_CORE * cores})")
    if cfg.data.workers > THREADS_PER_CORE * cores:
        problems.append(f"data.workers: {cfg.data.workers} is more than {THREADS_PER_CORE} per usable core of this "
                        f"machine ({cores} cores: at most {THREADS_PER_CORE * cores})")
    if cfg.data.source == "synthetic" and memory:
        size = cfg.data.image_size or 224  # null: the model's own, at most a usual 224
        need = cfg.data.num_classes * cfg.data.samples_per_class * 3 * size * size * 4
        if need > memory // SYNTHETIC_SHARE:
            most = memory // SYNTHETIC_SHARE // (cfg.data.num_classes * 3 * size * size * 4)
            problems.append(f"data.samples_per_class: {cfg.data.num_classes} classes x {cfg.data.samples_per_class} "
                            f"synthetic images at {size}x{size} take {need / 2**30:.3g} GiB, more than a quarter of "
                            f"this machine's {memory / 2**30:.3g} GiB of memory (at most {most} per class here)")
    return problems


def check_machine(cfg: Config) -> None:
    """:func:`machine_problems` on this machine: one :class:`ConfigError` (exit 2) listing them, before any work."""
    from pipeline.core import env

    problems = machine_problems(cfg, env.usable_cores(), env.memory_bytes())
    if problems:
        raise ConfigError(problems)
