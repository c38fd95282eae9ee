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


# The run directory's one artifact folder: openvino/<file> (the OpenVINO IR, pipeline/runtime/builders/openvino_ir.py).
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

    def to_json(self) -> dict[str, Any]:
        return self.model_dump()


class StageEntry(_Open):
    """One stage's entry in the manifest: made by :class:`pipeline.core.run.StageRecord` while the stage runs (each
    change a new entry), written by :meth:`to_json`, read back by :meth:`of`. The fields are declared in the order
    the tool writes them, so the JSON keeps its key order; ``details`` is the stage's own record
    (:mod:`pipeline.core.records` types it)."""

    model_config = ConfigDict(extra="allow", strict=True, frozen=True)

    status: str
    started: str | None = None
    fingerprint: str | None = None
    artifacts: dict[ArtifactName, Artifact] = {}
    details: dict[str, Any] = {}
    run_id: str | None = None  # each execution's own id: downstream fingerprints name it
    require: list[str] = []  # the --require backends it checked
    config: dict[str, Any] | None = None  # the config sections it ran with (`all` names a change before re-training)
    reason: str | None = None  # why it was skipped
    error: str | None = None  # why it failed, one line
    exit_code: int | None = None
    ended: str | None = None
    duration_s: float | None = None

    @property
    def finished(self) -> bool:
        """Whether it records work that finished: it ended ok, or it failed its check (exit 1: a gate, such as
        verify's, that judged everything before it failed), so its details and reports are complete. Any other
        failure, or an interruption, leaves them partial."""
        return finished(self.status, self.exit_code)

    @property
    def ended_normally(self) -> bool:
        """ok, or skipped with what it did write (build writes the OpenVINO IR and skips the engines on a CPU)."""
        return self.status in (Status.OK, Status.SKIPPED)

    def to_json(self) -> dict[str, Any]:
        """The entry as manifest.json holds it: the keys it was given, in the order the tool writes them. ``details``
        is the stage's own dict (not a copy: a stage adds to it while it runs)."""
        out = {name: getattr(self, name) for name in type(self).model_fields if name in self.model_fields_set}
        if "artifacts" in out:
            out["artifacts"] = {name: info.to_json() for name, info in self.artifacts.items()}
        return {**out, **(self.model_extra or {})}

    @classmethod
    def of(cls, raw: Any, where: Any = "manifest.json") -> StageEntry | None:
        """A manifest's stage entry (None: the stage has no entry), typed; a damaged one is one
        :class:`InputError`."""
        if raw is None:
            return None
        try:
            return cls.model_validate(raw)
        except ValidationError as exc:
            raise InputError(f"{where} is damaged: {schema.problem(exc)}; "
                             "restore it or use another --run-dir (moving it away re-runs every stage)") from None


def entries(manifest: Any, where: Any = "manifest.json") -> dict[str, StageEntry]:
    """Every stage entry of a manifest dict (the run's, or one read from a file), typed."""
    stages = manifest.get("stages") if isinstance(manifest, dict) else None
    return {name: StageEntry.of(raw, where) for name, raw in (stages or {}).items()}


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


def finished(status: str | None, exit_code: int | None) -> bool:
    """Whether a stage that ended with ``status`` and ``exit_code`` finished its work (:attr:`StageEntry.finished`)."""
    return status == Status.OK or (status == Status.FAILED and exit_code == 1)


def validate(data: Any, path) -> None:
    """Raise :class:`InputError` (one line: the first problem and how many there are) unless ``data`` fits."""
    try:
        Manifest.model_validate(data)
    except ValidationError as exc:
        raise InputError(f"{path} is damaged: {schema.problem(exc)}; "
                         "restore it or use another --run-dir (moving it away re-runs every stage)") from None
