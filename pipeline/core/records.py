"""What the stages hand each other through the manifest, typed: one record per stage's ``details``.

A stage writes its details as a plain dict (``record.details.update(...)``); every other module reads them back
only through these records, parsed here once. The manifest is untrusted input (a file a user may edit), so a
value of the wrong type is one :class:`~pipeline.core.errors.InputError` naming the stage and the key, never a
traceback; a key that is absent reads as its default (``None``, empty). Keys no reader uses are kept, not read.

``RunDir.record(Kind)`` (and ``train_record()``, ``export_record()``, ...) returns a stage's record, or None when
the stage has no entry or recorded no details; :func:`from_manifest` does the same for a manifest dict (the report).
"""

from __future__ import annotations

from typing import Any, ClassVar, Self, TypeVar

from pydantic import Field, ValidationError

from pipeline.core import schema
from pipeline.core.artifacts import MANIFEST
from pipeline.core.errors import InputError

Record = TypeVar("Record", bound="StageDetails")


class StageDetails(schema.Open):
    """The details one stage recorded; ``STAGE`` names the stage whose manifest entry holds them."""

    STAGE: ClassVar[str] = ""

    # Upstream artifacts the stage replaced (verify --auto-fallback): the runner re-runs what makes and reads them.
    replaced_artifacts: list[str] = Field(default_factory=list)

    @classmethod
    def parse(cls, details: Any, where: str = MANIFEST) -> Self:
        """``details`` (the manifest's ``stages.<STAGE>.details``) as this record, or one :class:`InputError`."""
        return _validated(cls, details, where, f"stages.{cls.STAGE}.details")


def _validated(kind: type[schema.Open], data: Any, where: str, key: str):
    if not isinstance(data, dict):
        raise InputError(f"{where} is damaged: {key} is not an object (got {schema.printable(type(data).__name__)}); "
                         "restore it or re-run the stage that wrote it")
    try:
        return kind.model_validate(data)
    except ValidationError as exc:
        raise InputError(f"{where} is damaged: {key}.{schema.problem(exc)}; restore it or re-run the stage that "
                         "wrote it") from None


def from_entry(kind: type[Record], entry: Any, where: str = MANIFEST) -> Record | None:
    """The record of a manifest stage entry (typed, :meth:`pipeline.core.run.RunDir.stage_entry`; or a dict as
    read); None when there is no entry or it recorded no details."""
    from pipeline.core.manifest import StageEntry

    details = entry.details if isinstance(entry, StageEntry) else entry.get("details") if isinstance(entry, dict) \
        else None
    if details is None or details == {}:
        return None
    return kind.parse(details, where)


def from_manifest(kind: type[Record], manifest: Any, where: str = MANIFEST) -> Record | None:
    """The record of ``kind``'s stage in a manifest dict; None where that stage has no entry or no details."""
    stages = manifest.get("stages") if isinstance(manifest, dict) else None
    return from_entry(kind, stages.get(kind.STAGE) if isinstance(stages, dict) else None, where)


# --------------------------------------------------------------------------- train


class Learning(schema.Open):
    """Train's learning check: whether the model learned, and its one line."""

    learned: bool | None = None
    line: str | None = None
    task: str | None = None  # "detection": the check compared mAP with an untrained model's (absent: a classifier)


class PreciseBN(schema.Open):
    batches: int | None = None
    best_epoch_val_acc_before: float | None = None
    best_epoch_val_acc_after: float | None = None


class Epoch(schema.Open):
    """One row of train's history."""

    epoch: int
    val_loss: float
    val_acc: float


class TrainRecord(StageDetails):
    STAGE: ClassVar[str] = "train"

    device: str | None = None
    amp: str | None = None
    amp_note: str | None = None
    epochs: int | None = None
    steps: int | None = None
    skipped_steps: int | None = None
    best_val_acc: float | None = None
    images_per_s: float | None = None
    history: list[Epoch] = Field(default_factory=list)
    precise_bn: PreciseBN | None = None
    learning: Learning | None = None


# --------------------------------------------------------------------------- export


class NodeNote(schema.Open):
    """A node that did not take the graph's precision, and why."""

    name: str
    op_type: str
    reason: str
    precision: str | None = None  # INT8's unquantized nodes: the precision they run in


class GraphRecord(schema.Open):
    """What export recorded of one lower-precision graph: disabled (``reason``), skipped (no ModelOpt) or written,
    with its share of the nodes (``fraction``, ``nodes``: the manifest's ``<precision>_fraction`` and
    ``<precision>_nodes``) and the nodes left in a higher precision."""

    enabled: bool | None = None
    skipped: str | None = None
    reason: str | None = None
    fraction: float | None = None
    nodes: int | None = None
    fp32_nodes: list[NodeNote] = Field(default_factory=list)
    fp32_nodes_count: int | None = None
    converter: str | None = None
    # INT8's quantization
    fp16_nodes: int | None = None
    qdq_pairs: int | None = None
    quantizer: str | None = None
    calibration_method: str | None = None
    calibration_images: int | None = None
    seconds: float | None = None
    unquantized_reasons: dict[str, int] = Field(default_factory=dict)
    unquantized_nodes: list[NodeNote] = Field(default_factory=list)


class ExportRecord(StageDetails):
    STAGE: ClassVar[str] = "export"

    opset: int | None = None
    exporter: str | None = None
    accepted_trace_warnings: list[str] = Field(default_factory=list)  # export.accept_trace_warnings let these pass

    def graph(self, precision: str, where: str = MANIFEST) -> GraphRecord | None:
        """The record of the ``precision`` graph (``details.<precision>``); None when export said nothing of it."""
        said = (self.model_extra or {}).get(precision)
        if said is None:
            return None
        if isinstance(said, dict):
            said = {_graph_key(key, precision): value for key, value in said.items()}
        return _validated(GraphRecord, said, where, f"stages.export.details.{precision}")

    def skipped(self, precision: str) -> str | None:
        """Why export skipped the precision's graph (no ModelOpt); None when it did not."""
        graph = self.graph(precision)
        return graph.skipped if graph is not None else None


def _graph_key(key: str, precision: str) -> str:
    return {f"{precision}_fraction": "fraction", f"{precision}_nodes": "nodes"}.get(key, key)


# --------------------------------------------------------------------------- build


class IRRecord(schema.Open):
    """One OpenVINO IR build wrote, or the error that kept it from writing it."""

    error: str | None = None


class BuildRecord(StageDetails):
    STAGE: ClassVar[str] = "build"

    skipped: dict[str, str] = Field(default_factory=dict)  # precision -> why its engine was not built
    openvino: dict[str, IRRecord] = Field(default_factory=dict)  # precision -> the IR
    engines: dict[str, dict[str, Any]] = Field(default_factory=dict)  # precision -> its sidecar's summary


# --------------------------------------------------------------------------- verify


class VerifyRecord(StageDetails):
    STAGE: ClassVar[str] = "verify"

    passed: bool | None = None
    candidates: dict[str, str] = Field(default_factory=dict)  # candidate -> its status
    deployable: list[str] | None = None
    undecided: list[str] = Field(default_factory=list)
    reference_accuracy: float | None = None
    reference_learned: bool | None = None
    reference_task: str | None = None  # "detection": reference_accuracy is the reference's mAP@0.5:0.95
    held_out: str | None = None  # "held out" or "not held out" (pipeline.core.roles); None: verify before issue 48

    @property
    def judged_reference(self) -> bool:
        """Whether verify recorded the reference's own quality (it does once it reaches a verdict)."""
        return "reference_accuracy" in self.model_fields_set


# --------------------------------------------------------------------------- the later stages


class BenchmarkRecord(StageDetails):
    STAGE: ClassVar[str] = "benchmark"

    headline: str = ""


class TuneRecord(StageDetails):
    STAGE: ClassVar[str] = "tune"

    summary: str = ""


class QATRecord(StageDetails):
    """What qat did: the method, its epochs and data, the weights it started from, what it simulated, the graph."""

    STAGE: ClassVar[str] = "qat"

    method: str = "qat"
    epochs: int | None = None
    source_weights_sha256: str | None = None
    best_val_acc: float | None = None
    seconds_per_epoch: float | None = None
    int8_fraction: float | None = None
    int8_layers: int | None = None


class DeployRecord(StageDetails):
    STAGE: ClassVar[str] = "deploy"

    repository: str | None = None
    models: list[str] = Field(default_factory=list)
    refused: list[str] = Field(default_factory=list)
    served: str | None = None


class CompareRecord(StageDetails):
    STAGE: ClassVar[str] = "compare"

    artifacts: dict[str, str] = Field(default_factory=dict)  # artifact -> its status against the baseline
    latency_regressions: list[str] = Field(default_factory=list)
    environment: str | None = None


RECORDS: dict[str, type[StageDetails]] = {kind.STAGE: kind for kind in (
    TrainRecord, ExportRecord, BuildRecord, VerifyRecord, BenchmarkRecord, TuneRecord, QATRecord, DeployRecord,
    CompareRecord)}


def kind_of(stage: str) -> type[StageDetails]:
    """The record type of ``stage``'s details: its own, or the common part of every stage's for one without."""
    return RECORDS.get(stage, StageDetails)
