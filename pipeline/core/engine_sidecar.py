"""A TensorRT engine's sidecar as a type: :class:`EngineSidecar` (with its :class:`Platform`, :class:`ProfileShapes`
and :class:`BuildFlags`), made by the build stage where it builds the engine (:func:`pipeline.build.build_engine`),
written once by :meth:`EngineSidecar.to_json` in the shape earlier releases wrote (``model.fp16.engine.json``: the
same keys, in the same order, the platform's three keys at the top level), and read back by :func:`read` only: the
sidecar is a file in a run directory a user may edit, so it is typed and bounded here, once, and a damaged one is one
:class:`~pipeline.core.errors.InputError` ending in how to rebuild. Every reader (the engine loader's checks, the
TensorRT runner's profile, trtexec's version check, build's stale-engine check, deploy) reads attributes.

``precision`` is the build's prose (``"fp16 (strongly typed from model.fp16.onnx: 3 nodes fp16, ...)"``), for people
only: :attr:`EngineSidecar.precision_label`. The precision an engine is built in is its target's
(:func:`pipeline.runtime.builders.tensorrt_engine.target_of` of its ``engine`` name), never parsed from the prose.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import ConfigDict, Field, StringConstraints, model_validator

from pipeline.core import schema
from pipeline.core.errors import InputError

SCHEMA = "pipeline.engine/1"
PLATFORM_KEYS = ("tensorrt", "gpu", "compute_capability")  # written at the sidecar's top level
SUMMARY = ("engine", "precision", "onnx", "profile", "flags", "timing_cache", "log", "build_seconds")  # build record
MAX_DIMS = 16
MAX_BYTES = 1 << 40

Name = Annotated[str, StringConstraints(max_length=255)]  # a file name, a version, a GPU's name
Text = Annotated[str, StringConstraints(max_length=4096)]
Sha256 = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
Dim = Annotated[int, Field(ge=0, le=1 << 31)]
Shape = Annotated[list[Dim], Field(min_length=1, max_length=MAX_DIMS)]


class Platform(schema.Open):
    """What an engine is bound to: TensorRT version, GPU and compute capability (None where not known)."""

    tensorrt: Name | None = None
    gpu: Name | None = None
    compute_capability: Name | None = None

    def to_json(self) -> dict[str, Any]:
        return self.model_dump()


class ProfileShapes(schema.Open):
    """The engine's one optimization profile: its input's name and the min/opt/max shapes (batch first)."""

    input: Name
    min: Shape
    opt: Shape
    max: Shape


class BuildFlags(schema.Open):
    """How the builder was configured: strongly typed, no precision flag, TF32 and the optimization level."""

    strongly_typed: bool
    precision_flags: Annotated[list[Name], Field(max_length=16)]
    tf32: bool
    builder_optimization_level: Annotated[int, Field(ge=0, le=5)]


class EngineSidecar(schema.Open):
    """One engine's sidecar (``model.<precision>.engine.json``). A sidecar names its schema, its author, its engine
    and that engine's sha256; the rest is recorded by every build of this tool but not required to load an engine."""

    model_config = ConfigDict(populate_by_name=True)

    schema_id: str = Field(alias="schema")
    built_by: Name
    engine: Name
    sha256: Sha256
    size: Annotated[int, Field(ge=0, le=MAX_BYTES)] | None = Field(default=None, alias="bytes")
    onnx: Name | None = None
    onnx_sha256: Sha256 | None = None
    precision_label: Text | None = Field(default=None, alias="precision")  # the build's prose, for people
    platform: Platform = Platform()
    profile: ProfileShapes | None = None
    flags: BuildFlags | None = None
    timing_cache: Text | None = None
    log: Text | None = None
    build_seconds: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = None
    built_at: Name | None = None

    @model_validator(mode="before")
    @classmethod
    def _platform_at_top_level(cls, data: Any) -> Any:
        """The file keeps the platform's keys at its top level (as release 0.1.0 wrote them); the type nests them."""
        if isinstance(data, dict) and "platform" not in data:
            data = dict(data)
            data["platform"] = {key: data.pop(key) for key in PLATFORM_KEYS if key in data}
        return data

    def to_json(self) -> dict[str, Any]:
        """The sidecar as the build writes it: the keys of earlier releases, in their order."""
        out: dict[str, Any] = {}
        for key, value in self.model_dump(by_alias=True, exclude_unset=True).items():
            if key == "platform":
                out.update(value)
            else:
                out[key] = value
        return out

    def summary(self) -> dict[str, Any]:
        """The build record's ``engines`` entry of this engine (manifest ``stages.build.details``)."""
        written = self.to_json()
        return {key: written[key] for key in SUMMARY}


def from_json(payload: Any, where: str | Path) -> EngineSidecar:
    """A sidecar payload already read, typed and bounded (one :class:`InputError` when damaged)."""
    return schema.validate(payload, EngineSidecar, where, "engine sidecar")


def read(path: Path, engine: str, *, rebuild: str, why: str = "") -> EngineSidecar:
    """The sidecar at ``path`` of the engine file ``engine``: present, this tool's (schema, author), and typed;
    otherwise one :class:`InputError` ending in ``rebuild``. The engine's hash and platform are the caller's checks."""
    from pipeline.core.run import read_sidecar

    payload = read_sidecar(path, engine, what="engine", schema=SCHEMA, author_key="built_by", rebuild=rebuild, why=why)
    try:
        return from_json(payload, path.name)
    except InputError as exc:
        raise InputError(f"{exc}; refusing to load {engine}; {rebuild}") from None
