"""The one schema layer for everything the tool reads back from outside a running stage.

A run directory, a baseline bundle, a fallback file a user edited, a report a later stage reads: all of it is
untrusted. Each such file is read here, once, in the same way:

* **no links, regular files only**: opened through :func:`pipeline.core.run.open_confined` (``O_NOFOLLOW``);
* **bounded**: a size cap per file, checked before anything is parsed; an ``.npz`` member's shape and dtype are
  read from its header, and only the named members are loaded, each under its own cap;
* **typed**: a pydantic model (strict types, ranges, lengths) validates what was parsed;
* **one line on failure**: an :class:`~pipeline.core.errors.InputError` (exit 2) naming the file, the first
  problem and how many more there are. Text taken from the file is shown through :func:`printable`, so an escape
  sequence or a newline in a file cannot reach the terminal or break a Markdown table.

pydantic is imported here only, and lazily by callers that need it (``--help`` stays light).
"""

from __future__ import annotations

import io
import json
import os
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from pydantic import BaseModel, ConfigDict, ValidationError

from pipeline.core.errors import InputError
from pipeline.core.run import open_confined

MiB = 1 << 20
JSON_LIMIT = 16 * MiB  # a report, a bundle's metadata or a fallback file is kilobytes; anything this large is not one
TEXT_LIMIT = 200  # characters of a file's own text shown in one message or table cell

Model = TypeVar("Model", bound=BaseModel)


class Strict(BaseModel):
    """A record read from a file: strict types (no "3" for 3), unknown keys refused."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class Open(BaseModel):
    """A record read from a file whose other keys are kept but not read (a report with more in it)."""

    model_config = ConfigDict(strict=True, extra="allow", frozen=True)


# --------------------------------------------------------------------------- text from a file


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def printable(value: Any, limit: int = TEXT_LIMIT) -> str:
    """``value`` as one line of plain text: control characters (ANSI escapes, newlines, tabs) shown as ``?``,
    Markdown's ``|`` escaped, cut to ``limit`` characters with an ellipsis."""
    text = _CONTROL.sub("?", str(value)).replace("|", "\\|")
    return text if len(text) <= limit else text[: limit - 1] + "…"


# --------------------------------------------------------------------------- errors


def _where(error: dict) -> str:
    return ".".join(str(part) for part in error["loc"]) or "(top level)"


def problem(exc: ValidationError) -> str:
    """The first problem of a validation error, and how many more there are, in one phrase."""
    errors = exc.errors()
    first = errors[0]
    more = f" (and {len(errors) - 1} more problem(s))" if len(errors) > 1 else ""
    message = first["msg"][:1].lower() + first["msg"][1:]
    return f"{printable(_where(first), 80)}: {printable(message, 120)} (got {printable(repr(first.get('input')), 60)})" \
           f"{more}"


def validate(data: Any, model: type[Model], where: str | Path, what: str) -> Model:
    """``data`` as ``model``, or one :class:`InputError` naming ``where`` and ``what`` it should have been."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise InputError(f"{where}: not a valid {what}: {problem(exc)}") from None


# --------------------------------------------------------------------------- reading


def read_bytes(path: str | Path, what: str, limit: int) -> bytes:
    """The bytes of ``path`` (never through a link, a regular file only), refused above ``limit`` bytes."""
    with open_confined(path) as f:
        size = os.fstat(f.fileno()).st_size
        if size > limit:
            raise InputError(f"{path}: {what} is {size:,} bytes, more than the {limit:,} such a file can be; "
                             "refusing to read it")
        return f.read(limit + 1)


def read_json(path: str | Path, model: type[Model], what: str, *, limit: int = JSON_LIMIT) -> Model:
    """A JSON file read through :func:`read_bytes` and validated as ``model``; anything else is exit 2, one line."""
    raw = read_bytes(path, what, limit)
    try:
        data = json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise InputError(f"{path}: {what} is not valid JSON ({printable(exc, 120)})") from None
    return validate(data, model, path, what)


def _no_constant(name: str) -> float:
    """JSON has no NaN or Infinity; Python's json module accepts them unless told not to."""
    raise ValueError(f"{name} is not a JSON value")


# --------------------------------------------------------------------------- .npz files


@dataclass(frozen=True)
class ArraySpec:
    """What one member of an ``.npz`` must be: its dtype kind(s) (``"f"``, ``"i"``, ``"U"``: NumPy's
    ``dtype.kind``), its number of dimensions and at most how many elements."""

    kinds: str
    ndim: int
    max_elements: int


def read_npz(path: str | Path, specs: dict[str, ArraySpec], what: str, *, limit: int = 256 * MiB,
             optional: tuple[str, ...] = ()) -> dict[str, np.ndarray]:
    """The members ``specs`` names (and no other) of an ``.npz`` file, each checked against its :class:`ArraySpec`
    from its header before it is loaded; a member in ``optional`` may be absent. No pickles, no links, bounded."""
    raw = read_bytes(path, what, limit)
    try:
        with zipfile.ZipFile(io.BytesIO(raw)) as archive:
            members = {name.removesuffix(".npy"): name for name in archive.namelist()}
            missing = [k for k in specs if k not in members and k not in optional]
            if missing:
                raise InputError(f"{path}: {what} lacks {', '.join(printable(m, 60) for m in missing[:5])}")
            return {key: _member(archive, members[key], spec, path, what, key)
                    for key, spec in specs.items() if key in members}
    except InputError:
        raise
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as exc:
        raise InputError(f"{path}: {what} is not a readable .npz file ({printable(exc, 120)})") from None


def _member(archive: zipfile.ZipFile, member: str, spec: ArraySpec, path, what: str, key: str) -> np.ndarray:
    from numpy.lib import format as npy

    info = archive.getinfo(member)
    with archive.open(info) as f:
        where = f"{path}: {what}: {printable(key, 60)}"
        version = npy.read_magic(f)
        if version not in ((1, 0), (2, 0)):
            raise InputError(f"{where}: .npy format {version} is not one NumPy writes for plain arrays")
        header = npy.read_array_header_1_0 if version == (1, 0) else npy.read_array_header_2_0
        shape, _, dtype = header(f)  # the header only: no data read yet
        if dtype.hasobject or dtype.kind not in spec.kinds:
            raise InputError(f"{where} has dtype {dtype}, expected kind {spec.kinds!r}")
        if len(shape) != spec.ndim:
            raise InputError(f"{where} has shape {shape}, expected {spec.ndim} dimension(s)")
        if int(np.prod(shape, dtype=np.int64)) > spec.max_elements:
            raise InputError(f"{where} has {int(np.prod(shape, dtype=np.int64)):,} elements, more than "
                             f"{spec.max_elements:,}")
    with archive.open(info) as f:
        return npy.read_array(f, allow_pickle=False)
