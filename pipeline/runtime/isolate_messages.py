"""What the parent and an isolated child (:mod:`pipeline.runtime.isolate`) say to each other, as types: the
:class:`Job` the parent writes before the child starts, each :class:`Request` (one JSON line on the child's stdin),
and each :class:`Message` back (one JSON line on its stdout: a ``phase`` it is entering, its :class:`Answer`, or the
:class:`RemoteError` it raised). Each is written by its ``to_json`` and read back by its ``of``, here only: the two
ends never read each other's keys. The child is this package's own code, started by the parent, so the lines are
trusted; a line of another shape is a bug, and raises.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from pipeline.runtime.runners import TimingMethod

STOP, INFER, INFER_EACH, LAYERS, BATCH_REASON, TIME = "stop", "infer", "infer_each", "layers", "batch_reason", "time"


def _set(record) -> dict[str, Any]:
    """A record's fields that are set (not None), in their order: the keys its JSON line carries."""
    return {f.name: getattr(record, f.name) for f in fields(record) if getattr(record, f.name) is not None}


@dataclass(frozen=True)
class Request:
    """One request to the child: the operation and what it needs (the arrays travel in ``in.npz``)."""

    op: str
    call: int | None = None  # infer, infer_each: the number of the (first) batch, for its phases
    feeds: int | None = None  # infer_each: how many feeds in.npz holds
    batch: int | None = None  # batch_reason
    method: TimingMethod | None = None  # time

    def to_json(self) -> dict[str, Any]:
        out = _set(self)
        if self.method is not None:
            out["method"] = asdict(self.method)
        return out

    @classmethod
    def of(cls, data: dict) -> Request:
        method = data.get("method")
        return cls(**{**data, "method": TimingMethod(**method) if method is not None else None})


@dataclass(frozen=True)
class RemoteError:
    """An exception the child raised: its type's name, its one line, and its errno (a full disk) if it had one."""

    type: str
    message: str
    errno: int | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def of(cls, data: dict) -> RemoteError:
        return cls(**data)


@dataclass(frozen=True)
class Answer:
    """What the child answers: to its start (``note``, ``precision``, ``workaround``), to a request
    (``inference_time``, ``reason``, ``layers``, ``timings``) or to ``stop`` (``torch_imported``)."""

    note: str | None = None
    precision: str | None = None
    workaround: str | None = None
    inference_time: float | None = None
    reason: str | None = None  # batch_reason: why the artifact cannot run that batch size (None: it can)
    layers: list[dict] | None = None
    timings: list[list] | None = None  # [kind, label, measurement] per timing
    torch_imported: bool | None = None

    def to_json(self) -> dict[str, Any]:
        return _set(self)

    @classmethod
    def of(cls, data: dict) -> Answer:
        return cls(**data)


@dataclass(frozen=True)
class Message:
    """One line from the child: exactly one of a phase it enters, its answer, or its error."""

    phase: str | None = None
    ok: Answer | None = None
    error: RemoteError | None = None

    def to_json(self) -> dict[str, Any]:
        if self.phase is not None:
            return {"phase": self.phase}
        if self.error is not None:
            return {"error": self.error.to_json()}
        return {"ok": (self.ok or Answer()).to_json()}

    @classmethod
    def of(cls, data: dict) -> Message:
        if "phase" in data:
            return cls(phase=data["phase"])
        if "error" in data:
            return cls(error=RemoteError.of(data["error"]))
        return cls(ok=Answer.of(data["ok"]))


@dataclass(frozen=True)
class BackendRef:
    """Where the child finds the backend: its table name, the module of its ``make``, and that module's file."""

    name: str
    module: str
    file: str | None = None


@dataclass(frozen=True)
class Job:
    """What the child needs to make the runner: written to ``job.json`` before it starts."""

    backend: BackendRef
    run_dir: str
    stage: str
    spec: dict[str, Any]  # the model card's spec (pipeline.runtime.backends.Context.spec)
    threads: int | None
    gpu: bool
    config: dict[str, Any]  # the validated config, as plain JSON
    under_test: dict[str, str]  # precision -> the file of the graph under test, in the exchange folder

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def of(cls, data: dict) -> Job:
        return cls(**{**data, "backend": BackendRef(**data["backend"])})
