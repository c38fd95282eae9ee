"""The one schema layer for everything the tool reads back from outside a running stage.

A run directory, a baseline bundle, a fallback file a user edited, a report a later stage reads: all of it is
untrusted. Each such file is read here, once, in the same way:

* **no links, regular files only**: opened through :func:`open_confined` (``O_NOFOLLOW``);
* **bounded**: a size cap per file, checked before anything is parsed; an ``.npz`` member's shape and dtype are
  read from its header, and only the named members are loaded, each under its own cap;
* **typed**: a pydantic model (strict types, ranges, lengths) validates what was parsed;
* **one line on failure**: an :class:`~pipeline.core.errors.InputError` (exit 2) naming the file, the first
  problem and how many more there are. Text taken from the file is shown through :func:`printable`, so an escape
  sequence or a newline in a file cannot reach the terminal or break a Markdown table.

pydantic is imported here only, and lazily by callers that need it (``--help`` stays light).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import json
import math
import os
import re
import stat
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from pipeline.core.errors import InputError, UsageError

if TYPE_CHECKING:  # numpy is imported where an .npz is read: `--help` stays light
    import numpy as np

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


# --------------------------------------------------------------------------- opening a file


NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)  # absent on Windows, which is not a supported platform


@contextlib.contextmanager
def open_confined(path: str | Path):
    """``path`` opened for reading in binary, never through a symbolic link, and only if it is a regular file."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UsageError(f"refusing to read {path}: it is a symbolic link; the run directory holds plain "
                             "files only: remove the link or use another --run-dir") from None
        raise InputError(f"cannot read {path}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UsageError(f"refusing to read {path}: not a regular file")
    with os.fdopen(fd, "rb") as f:
        yield f


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
    return f"{printable(_where(first), 80)}: {printable(message, 120)} " \
           f"(got {printable(repr(first.get('input')), 60)})" \
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


JSON_DEPTH = 64  # levels of nesting: every file this tool writes has fewer than 12


class _DuplicateKey(ValueError):
    pass


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict:
    """An object's pairs as a dict; a key given twice is refused (``json`` would keep the last one silently)."""
    data = dict(pairs)
    if len(data) != len(pairs):
        seen: set[str] = set()
        twice = next(key for key, _ in pairs if key in seen or seen.add(key))
        raise _DuplicateKey(f"the key {printable(repr(twice), 60)} is given twice")
    return data


def _depth(data: Any) -> int:
    """How deeply ``data`` nests (a scalar: 0), walked without recursion, stopping past :data:`JSON_DEPTH`."""
    deepest, stack = 0, [(data, 1)]
    while stack:
        value, level = stack.pop()
        if isinstance(value, (dict, list)):
            deepest = max(deepest, level)
            if level > JSON_DEPTH:
                break
            children = value.values() if isinstance(value, dict) else value
            stack.extend((child, level + 1) for child in children if isinstance(child, (dict, list)))
    return deepest


def parse_json(raw: bytes, path: str | Path, what: str, *, keys: frozenset[str] | None = None,
               says: str = "is not valid JSON") -> Any:
    """The one JSON parser of whatever the tool reads back: UTF-8, no NaN or Infinity, no key given twice in an
    object, at most :data:`JSON_DEPTH` levels deep; ``keys``: the only top-level keys allowed (a file this tool
    wrote). Anything else is one :class:`InputError` (exit 2)."""
    try:
        data = json.loads(raw.decode("utf-8"), parse_constant=_no_constant, object_pairs_hook=_unique_keys)
    except RecursionError:
        raise InputError(f"{path}: {what} nests deeper than the {JSON_DEPTH} levels such a file can have; refusing "
                         "to read it") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise InputError(f"{path}: {what} {says} ({printable(exc, 120)})") from None
    if _depth(data) > JSON_DEPTH:
        raise InputError(f"{path}: {what} nests deeper than the {JSON_DEPTH} levels such a file can have; refusing "
                         "to read it")
    if keys is not None and isinstance(data, dict) and not set(data) <= keys:
        unknown = sorted(set(data) - keys)
        raise InputError(f"{path}: {what} has a key this tool does not write ({printable(repr(unknown[0]), 60)}"
                         f"{f' and {len(unknown) - 1} more' if len(unknown) > 1 else ''}); restore it or re-run the "
                         "stage that wrote it")
    return data


def load_json(path: str | Path, what: str, *, limit: int = JSON_LIMIT, keys: frozenset[str] | None = None,
              says: str = "is not valid JSON") -> Any:
    """A JSON file read through :func:`read_bytes` (no links, at most ``limit`` bytes) and :func:`parse_json`."""
    return parse_json(read_bytes(path, what, limit), path, what, keys=keys, says=says)


def read_json(path: str | Path, model: type[Model], what: str, *, limit: int = JSON_LIMIT) -> Model:
    """A JSON file read through :func:`load_json` and validated as ``model``; anything else is exit 2, one line."""
    return validate(load_json(path, what, limit=limit), model, path, what)


def _no_constant(name: str) -> float:
    """JSON has no NaN or Infinity; Python's json module accepts them unless told not to."""
    raise ValueError(f"{name} is not a JSON value")


# --------------------------------------------------------------------------- .npz files


@dataclass(frozen=True)
class ArraySpec:
    """What one member of an ``.npz`` must be: its dtype kind(s) (``"f"``, ``"i"``, ``"U"``: NumPy's
    ``dtype.kind``), its number of dimensions, at most how many elements and at most how many bytes once loaded
    (a string's itemsize is 4 bytes a character, so a name array is bounded by this, not by its count)."""

    kinds: str
    ndim: int
    max_elements: int
    max_bytes: int = 64 * MiB


NPZ_MEMBERS = 4096  # members an .npz may list: its directory is parsed whole before any member is read


def read_npz(path: str | Path, specs: dict[str, ArraySpec], what: str, *, limit: int = 256 * MiB,
             optional: tuple[str, ...] = (), sha256: str | None = None) -> dict[str, np.ndarray]:
    """The members ``specs`` names (and no other) of an ``.npz`` file, each checked against its :class:`ArraySpec`
    from its header before it is loaded; a member in ``optional`` may be absent. No pickles, no links, bounded.
    ``sha256``: the bytes read must have this digest (the file another file describes), checked on the bytes
    that are then parsed, so the file cannot change in between."""
    raw = read_bytes(path, what, limit)
    if sha256 is not None and hashlib.sha256(raw).hexdigest() != sha256:
        raise InputError(f"{path}: {what} is not the file it is recorded as (its sha256 differs)")
    members = _member_count(raw)
    if members is not None and members > NPZ_MEMBERS:
        raise InputError(f"{path}: {what} lists {members:,} members, more than the {NPZ_MEMBERS:,} such a file can "
                         "have; refusing to read it")
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
        elements = math.prod(shape)  # Python integers: a header cannot overflow the count
        if elements > spec.max_elements:
            raise InputError(f"{where} has {elements:,} elements, more than {spec.max_elements:,}")
        if elements * dtype.itemsize > spec.max_bytes:
            raise InputError(f"{where} would take {elements * dtype.itemsize:,} bytes, more than "
                             f"{spec.max_bytes:,}")
    with archive.open(info) as f:
        return npy.read_array(f, allow_pickle=False)


def _member_count(raw: bytes) -> int | None:
    """The member count of a zip archive's end record (0xFFFF: a ZIP64 archive, more than any .npz of ours has);
    None when there is no end record (zipfile then says the file is not a zip)."""
    end = raw.rfind(b"PK\x05\x06", max(0, len(raw) - (1 << 16) - 22))
    if end < 0 or end + 22 > len(raw):
        return None
    return int.from_bytes(raw[end + 10:end + 12], "little")
