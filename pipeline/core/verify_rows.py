"""verify.json's candidate rows as types: :class:`CandidateRow` (one candidate's verdict, with the numbers it was
judged on) and :class:`VerifyReport` (what later stages read back of the file).

verify makes a row per candidate where it writes its report (:func:`pipeline.reports.verify_report.build_payload`),
and :meth:`CandidateRow.to_json` is the one serialiser of the ``candidates`` list: the keys of earlier releases, in
their order (``log``, ``log_tail``, ``workaround``, ``batch_sizes`` and ``conformance`` only where the candidate has
them). Every reader (the report's verify pages and JUnit, benchmark's verify column and accuracies through
:mod:`pipeline.reports.verify_report`'s readers, baseline) gets them back through :func:`candidates_of` (a payload
already read) or :func:`read` (the file): typed and bounded here, once. The gate's own numbers are their types
(:class:`~pipeline.core.check_results.TensorCheck`, :class:`~pipeline.core.check_results.TaskCheck`), each written by
its own serialiser; the report lays them out by attribute.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field, StringConstraints

from pipeline.core import artifacts, fallback_result, schema
from pipeline.core.check_results import BatchSizeRow, Conformance, Localization, Measured, TaskCheck, TensorCheck
from pipeline.core.fallback_result import FallbackResult
from pipeline.core.images_record import ImagesRecord
from pipeline.core.stability_record import StabilityCertificate
from pipeline.core.verdicts import JUDGED

if TYPE_CHECKING:
    from pipeline.core.checks import Check

MAX_CANDIDATES = 1000
OPTIONAL = ("log", "log_tail", "workaround", "batch_sizes", "conformance")  # written only where a candidate has them
Name = Annotated[str, StringConstraints(max_length=200)]
Sha256 = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
Text = Annotated[str, StringConstraints(max_length=1 << 16)]


def clean(value):
    """JSON has no NaN/Inf: write them as strings so the report stays valid JSON; a check's typed numbers through
    their own serialiser."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, Measured):
        return clean(value.to_json())
    if isinstance(value, dict):
        return {k: clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    return value


class CandidateRow(schema.Open):
    """One candidate of verify.json: what was judged (the artifact and its sha256, only where a verdict was reached),
    the verdict, why, and the numbers it rests on."""

    name: Name
    label: Text | None = None
    precision: Text | None = None
    artifact: Text | None = None
    artifact_sha256: Sha256 | None = None  # the file the verdict is tied to; None: no verdict reached
    required: bool = False
    status: Annotated[str, StringConstraints(max_length=40)]
    reason: Text | None = None
    hint: Text | None = None
    tolerance: dict[str, Any] | None = None
    tensor_check: TensorCheck | None = None
    task_check: TaskCheck | None = None
    after_fallback: bool = False
    gates: bool = True  # decides the exit code (verify.gate); False: reported only
    log: Text | None = None  # a child process's log
    log_tail: list[Text] | None = None  # a crashed child's last lines
    workaround: Text | None = None  # a runtime workaround applied
    batch_sizes: Annotated[list[BatchSizeRow], Field(max_length=64)] | None = None  # at each batch size it serves
    conformance: Conformance | None = None  # row independence and the precisions its layers ran in

    @classmethod
    def of(cls, c: Check, hashes: dict) -> CandidateRow:
        """The row of one judged candidate (``hashes``: the sha256 of each file verify read); validated leniently:
        the check's own values, NaN/Inf written as strings (:func:`clean`)."""
        r = c.result
        return cls.model_validate(clean({
            "reason": r.reason, "hint": r.hint, "tolerance": r.tolerance, "tensor_check": r.tensor_check,
            "task_check": r.task_check, "log": r.log, "log_tail": r.log_tail, "workaround": r.workaround,
            "batch_sizes": r.batch_sizes, "conformance": r.conformance, "name": c.name, "label": c.label,
            "precision": c.precision, "artifact": c.artifact,
            "artifact_sha256": hashes.get(c.artifact or artifacts.WEIGHTS) if c.status in JUDGED else None,
            "required": c.required, "status": c.status, "after_fallback": r.after_fallback, "gates": c.gates}),
            strict=False)

    def to_json(self) -> dict[str, Any]:
        """The row as verify.json holds it: the optional facts only where the candidate has them."""
        out = self.model_dump(exclude={k for k in OPTIONAL if getattr(self, k) is None})
        typed = {"tensor_check": self.tensor_check, "task_check": self.task_check, "conformance": self.conformance}
        written = {k: None if v is None else v.to_json() for k, v in typed.items() if k in out}
        rows = {"batch_sizes": [r.to_json() for r in self.batch_sizes]} if self.batch_sizes is not None else {}
        return {**out, **written, **rows}


class Reference(schema.Open):
    weights_sha256: Sha256 | None = None


class VerifyReport(schema.Open):
    """What later stages read back of verify.json (the rest is for people)."""

    candidates: Annotated[list[CandidateRow], Field(max_length=MAX_CANDIDATES)]
    reference: Reference = Reference()
    inconclusive_policy: Literal["pass", "fail"] | None = None
    images: ImagesRecord | None = None  # the verdict's images and whether they are held out
    stability: StabilityCertificate | None = None  # the calibration stability certificate, where it ran


def report_of(payload: Any, where: str | Path = "verify.json") -> VerifyReport:
    """What the report reads of a verify payload already read, typed and bounded once."""
    return schema.validate(payload, VerifyReport, where, "verify report")


def candidates_of(payload: Any, where: str | Path = "verify.json") -> list[CandidateRow]:
    """The typed candidate rows of a verify payload already read (verify's own before it writes, the report's)."""
    return report_of(payload, where).candidates


def localization_of(payload: Any, key: str, where: str | Path = "verify.json") -> Localization | None:
    """A precision's localisation section of a verify payload (``key``: ``localization``, ``int8_localization``, ...;
    :func:`pipeline.reports.tables.section_keys`), typed and bounded; None where it did not run."""
    section = payload.get(key) if isinstance(payload, dict) else None
    return schema.validate(section, Localization, f"{where}: {key}", "localisation") if section else None


def fallback_of(payload: Any, key: str, precision: str, where: str | Path = "verify.json") -> FallbackResult | None:
    """``precision``'s fallback section of a verify payload (``key``: ``fallback``, ``int8_fallback``, ...), typed and
    bounded; None where it did not run."""
    section = payload.get(key) if isinstance(payload, dict) else None
    return fallback_result.from_json(section, precision, f"{where}: {key}") if section else None


def read(path: str | Path) -> VerifyReport:
    """verify.json at ``path``, typed and bounded (one :class:`~pipeline.core.errors.InputError` when damaged)."""
    return schema.read_json(path, VerifyReport, "verify report")
