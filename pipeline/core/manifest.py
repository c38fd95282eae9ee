"""The schema of ``manifest.json``, checked whenever a run directory is opened.

The manifest is read back to decide what to skip and which files to hash, so a hand-edited or damaged
one must fail as one clear input error (exit 2), not as an ``AttributeError`` deep inside a stage. Only
the fields the pipeline reads are typed; anything else (details, environment) is kept as it is.
Artifact names are plain file names (or a plain name in the ``openvino/`` folder): the manifest cannot
point the pipeline at a file outside the run directory. Imported lazily by :mod:`pipeline.core.run` (pydantic
stays out of ``--help``).
"""

from __future__ import annotations

from pathlib import PurePosixPath, PureWindowsPath
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, NonNegativeInt, ValidationError, constr

from pipeline.core import schema
from pipeline.core.artifacts import OPENVINO_DIR
from pipeline.core.errors import InputError
from pipeline.core.status import Status

Sha256 = constr(pattern=r"^[0-9a-f]{64}$")


# The run directory's one artifact folder: openvino/<file> (the OpenVINO IR, pipeline/runtime/openvino_ir.py).
STAGE_ORDER = ("train", "export", "build", "verify", "benchmark")  # the stages `all` runs, in order
ARTIFACT_FOLDERS = (OPENVINO_DIR,)


def _plain_file_name(name: str) -> str:
    folder, _, rest = name.partition("/")
    plain = rest if folder in ARTIFACT_FOLDERS else name
    if (not plain or "\0" in plain or plain in (".", "..") or PurePosixPath(plain).name != plain
            or PureWindowsPath(plain).name != plain):
        raise ValueError(f"artifact name {name!r} is not a plain file name in the run directory "
                         f"(or in its {', '.join(f'{f}/' for f in ARTIFACT_FOLDERS)} folder)")
    return name


def _top_level_name(name: str) -> str:
    if not name or "\0" in name or name in (".", "..") or PurePosixPath(name).name != name \
            or PureWindowsPath(name).name != name:
        raise ValueError(f"{name!r} is not a plain name in the run directory")
    return name


ArtifactName = Annotated[str, AfterValidator(_plain_file_name)]


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)


class Artifact(_Open):
    sha256: Sha256
    bytes: NonNegativeInt


class StageEntry(_Open):
    status: str
    fingerprint: str | None = None
    run_id: str | None = None
    require: list[str] = []
    artifacts: dict[ArtifactName, Artifact] = {}
    details: dict[str, Any] = {}
    reason: str | None = None
    error: str | None = None


class Manifest(BaseModel):
    """The top level: only the keys this tool writes (a file with another one is not its manifest)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    schema_: str = Field(alias="schema")
    created: str | None = None
    updated: str | None = None
    stages: dict[str, StageEntry]
    model: str | None = None
    environment: dict[str, Any] = {}
    files: list[Annotated[str, AfterValidator(_top_level_name)]] = []  # the ledger (pipeline.core.run.own)


def finished(entry: dict) -> bool:
    """Whether a stage's manifest entry records work that finished: it ended ok, or it failed its check (exit 1: a
    gate, such as verify's, that judged everything before it failed), so its details and reports are complete.
    Any other failure, or an interruption, leaves them partial."""
    status = entry.get("status")
    return status == Status.OK or (status == Status.FAILED and entry.get("exit_code") == 1)


def validate(data: Any, path) -> None:
    """Raise :class:`InputError` (one line: the first problem and how many there are) unless ``data`` fits."""
    try:
        Manifest.model_validate(data)
    except ValidationError as exc:
        raise InputError(f"{path} is damaged: {schema.problem(exc)}; "
                         "restore it or use another --run-dir (moving it away re-runs every stage)") from None
