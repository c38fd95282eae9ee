"""A baseline bundle's ``baseline.json`` as types (:mod:`pipeline.baseline` writes it, ``compare`` reads it).

A bundle comes from outside the run (a commit, a download, a hand edit), so every field compare reads is typed
and bounded here: strings by length (names by a pattern), lists by size, latencies positive and finite, the
accuracy a fraction, per-class keys the class list, artifact names and latency rows unique. Its
``predictions.npz`` is checked by :func:`pipeline.evaluation.predictions.read`, and tied to this file by its
sha256. The rows compare reads from this run's ``benchmark.json`` are
:class:`pipeline.core.benchmark_rows.BenchmarkRow`.

A latency row is keyed by its backend, batch size and timing kind (:class:`pipeline.core.timings.TimingKind`); its
``timing`` label is for people. Rows written before the kind was recorded (release 0.1.0: bundles and benchmark.json
without ``timing_kind``) get it from their label here, once (:func:`pipeline.core.timings.legacy_kind`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal, TypeVar

from pydantic import Field, PrivateAttr, StringConstraints, ValidationError, model_validator

from pipeline.core import schema
from pipeline.core.benchmark_rows import MAX_SAMPLES, BatchSize, Kind, Millis, kind_from_label
from pipeline.core.errors import InputError
from pipeline.core.schema import Open, Strict
from pipeline.core.status import Status

SCHEMA = "pipeline.baseline/2"
OLD_SCHEMAS = ("pipeline.baseline/1",)  # no image digests: refused, with how to write a new one
MAX_IMAGES = 100_000
MAX_CLASSES = 100_000
MAX_ARTIFACTS = 64
MAX_ROWS = 4096
Name = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.\-]{1,64}$")]  # a candidate or backend name
Text = Annotated[str, StringConstraints(max_length=256)]
Sha256 = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
Fraction = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]


class Environment(Strict):
    """The facts a comparison names when they change (:func:`pipeline.baseline.environment`)."""

    torch: Text | None
    onnxruntime: Text | None
    openvino: Text | None
    tensorrt: Text | None
    polygraphy: Text | None
    onnx: Text | None
    driver: Text | None
    gpu: Text | None
    cpu: Text | None
    cpu_isa: Text | None


class BatchRow(Open):
    """verify's row for one batch size an artifact serves; compare shows its size and verdict. The bundle keeps it
    as verify wrote it: :meth:`to_json` gives back its keys in the order it was made with."""

    batch_size: BatchSize | None = None
    status: Text
    _made_with: dict[str, Any] | None = PrivateAttr(default=None)

    @model_validator(mode="wrap")
    @classmethod
    def _keep(cls, data: Any, handler):
        row = handler(data)
        if isinstance(data, dict):
            row._made_with = dict(data)
        return row

    def to_json(self) -> dict[str, Any]:
        return dict(self._made_with) if self._made_with is not None else self.model_dump()


class Artifact(Strict):
    name: Name
    precision: Text
    artifact: Text | None
    artifact_sha256: Sha256 | None
    verdict: Literal[Status.PASSED, Status.INCONCLUSIVE]  # verify's, for the file then; inconclusive: where it counted
    accuracy: Fraction
    per_class_accuracy: dict[Text, Fraction | None]
    batch_sizes: Annotated[list[BatchRow], Field(max_length=64)] | None

    def to_json(self) -> dict[str, Any]:
        rows = None if self.batch_sizes is None else [r.to_json() for r in self.batch_sizes]
        return {**self.model_dump(), "batch_sizes": rows}  # verify's rows, as verify wrote them


class LatencyRow(Strict):
    backend: Name
    precision: Text | None
    device: Text | None
    batch_size: BatchSize
    timing: Text | None  # the label, for people
    timing_kind: Kind
    verify: Text | None
    samples_ms: Annotated[list[Millis], Field(min_length=1, max_length=MAX_SAMPLES)]

    _legacy = model_validator(mode="before")(kind_from_label)

    @property
    def key(self) -> tuple:
        return self.backend, self.batch_size, self.timing_kind


class Meta(Strict):
    """``baseline.json``: :func:`pipeline.baseline.write` makes it (:func:`made`), :meth:`to_json` writes it, and
    :func:`read_meta` reads it back."""

    schema_: Literal["pipeline.baseline/2"] = Field(alias="schema")
    created: Text
    run_dir: Annotated[str, StringConstraints(max_length=4096)]
    model: Annotated[str, StringConstraints(min_length=1, max_length=256)]
    classes: Annotated[list[Text], Field(min_length=2, max_length=MAX_CLASSES)]
    input_size: Annotated[list[Annotated[int, Field(ge=1, le=1 << 16)]], Field(min_length=1, max_length=4)]
    model_card: dict[str, Any]
    config: dict[str, Any] | None
    environment: Environment
    images: Annotated[int, Field(ge=1, le=MAX_IMAGES)]
    predictions_sha256: Sha256
    artifacts: Annotated[list[Artifact], Field(min_length=1, max_length=MAX_ARTIFACTS)]
    latency: Annotated[list[LatencyRow], Field(min_length=1, max_length=MAX_ROWS)]

    @model_validator(mode="after")
    def _consistent(self):
        if len(set(self.classes)) != len(self.classes):
            raise ValueError("classes: a class is named twice")
        names = [a.name for a in self.artifacts]
        if len(set(names)) != len(names):
            raise ValueError("artifacts: an artifact is listed twice")
        for a in self.artifacts:
            if list(a.per_class_accuracy) != self.classes:
                raise ValueError(f"artifacts: {a.name}: per_class_accuracy does not name the classes, in order")
        keys = [row.key for row in self.latency]
        if len(set(keys)) != len(keys):
            raise ValueError("latency: a (backend, batch size, timing kind) row is listed twice")
        return self

    def to_json(self) -> dict[str, Any]:
        """``baseline.json``'s payload: the one serialiser of the file (the keys and order of release 0.1.0)."""
        return {**self.model_dump(by_alias=True), "artifacts": [a.to_json() for a in self.artifacts]}


Made = TypeVar("Made")


def made(make: Callable[[], Made], where, what: str = "baseline bundle") -> Made:
    """``make()``, a record built by the code that writes it (the bundle, or the environment compare diffs); one that
    does not validate is one :class:`InputError` naming ``where`` and ``what`` (what compare would read back, checked
    before writing)."""
    try:
        return make()
    except ValidationError as exc:
        raise InputError(f"{where}: not a valid {what}: {schema.problem(exc)}") from None


class Tagged(Open):
    schema_: Text = Field(alias="schema")


def read_meta(path, rewrite: str) -> Meta:
    """``baseline.json`` at ``path`` (confined by the caller), validated; an older schema is refused, naming
    ``rewrite`` (the command that writes a new bundle)."""
    tagged = schema.read_json(path, Tagged, "baseline bundle")
    if tagged.schema_ in OLD_SCHEMAS:
        raise InputError(f"{path}: a {schema.printable(tagged.schema_)} bundle, which has no image digests; "
                         f"compare reads {SCHEMA} only: re-write the baseline with {rewrite}")
    if tagged.schema_ != SCHEMA:
        raise InputError(f"{path}: schema {schema.printable(repr(tagged.schema_), 80)}, expected {SCHEMA!r}")
    return schema.validate(tagged.model_dump(by_alias=True), Meta, path, "baseline bundle")

