"""tune's payload as types: :class:`TuneResult` (what ``tune.json``/``tune.<precision>.json`` holds) and its parts:
each judged mix (:class:`MixRow`, the chosen one a :class:`ChosenRow`), the gate's numbers (:class:`GateNumbers`), a
time ratio with its interval (:class:`RatioRow`), the sensitivity ranking (:class:`SensitivityRow`), the sanity rules
on the rounds (:class:`Sanity`, :class:`SanityCheck`), the held-out confirmation (:class:`HeldOutConfirmation`) and
PTQ/QAT side by side (:class:`Ladder`, :class:`Rung`).

tune makes them where it decides (:mod:`pipeline.tune`, :func:`pipeline.reports.tune_report.payload`), and each
type's ``to_json`` is the one serialiser of its part: the keys of earlier releases, in their order. Every reader
(tune's own speed gate and summary, tune.md, the report's tune section) gets the file back through :func:`read` or
:func:`result_of` (a payload already read), typed and bounded here once: a damaged file is one
:class:`~pipeline.core.errors.InputError`. A mix's gate result keeps every other key it was judged with (the
candidates' statuses, the greedy fallback's rounds, the confirmation, QAT's details) as it was written; the
certificate (``stability``) is :mod:`pipeline.evaluation.certificate`'s record
(:class:`~pipeline.core.stability_record.StabilityCertificate`), laid out by
:func:`pipeline.reports.tables.stability_sections`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, StringConstraints, field_validator

from pipeline.core import schema
from pipeline.core.images_record import VerdictImages
from pipeline.core.speed_claims import Ratio
from pipeline.core.stability_record import StabilityCertificate

SCHEMA = "pipeline.tune/2"
MAX_ROWS = 4096  # mixes, layers, sanity pairs: a network of thousands of layers is not what tune searches
Text = Annotated[str, StringConstraints(max_length=1 << 16)]
Number = int | float  # as measured: an int stays an int in the file
Texts = Annotated[list[Text], Field(max_length=1 << 16)]  # node names, roles, reasons


def _rows(kind):
    return Annotated[list[kind], Field(max_length=MAX_ROWS)]


class GateNumbers(schema.Open):
    """The gate's verdict on one mix and the numbers tune's tables show
    (:func:`pipeline.precision.sensitivity.summary`); a mix's full-gate result keeps its other keys (its candidates'
    statuses, ``greedy_rounds``, ``confirmed``, ``qat``) after these, as they were written."""

    status: Text | None = None
    scaled_error: Number | None = None
    max_abs_error: Number | None = None
    quantile_abs_error: Number | None = None
    top1_agreement: Number | None = None
    accuracy_drop: Number | None = None
    mean_kl: Number | None = None

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(exclude_unset=True)


class RatioRow(schema.Open):
    """A time ratio as the file holds it (:meth:`pipeline.core.speed_claims.Ratio.to_json`)."""

    estimate: Number
    low: Number
    high: Number
    rounds: int
    confidence: Number | None = None

    @classmethod
    def of(cls, r: Ratio) -> RatioRow:
        return cls(**r.to_json())

    def ratio(self) -> Ratio:
        return Ratio(self.estimate, self.low, self.high, self.rounds)

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(exclude_unset=True)


class MixRow(schema.Open):
    """One judged mix as tune.json lists it: what it raises, how it was found, the gate's result, its latency per batch
    (keys are batch sizes as text) and its time over FP32's in the same rounds, the layers the target did not run in
    the low precision, and whether it was chosen or on the Pareto front."""

    origin: Text = ""
    calibration: Text = ""
    high: Texts = []
    fp32: Texts = []
    layers_raised: int = 0
    result: GateNumbers = GateNumbers()
    latency_ms: dict[str, Number] = {}
    time_vs_fp32: dict[str, RatioRow] = {}
    runtime_not_low: Texts = []
    chosen: bool = False
    pareto: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"origin": self.origin, "calibration": self.calibration, "high": list(self.high),
                "fp32": list(self.fp32), "layers_raised": self.layers_raised, "result": self.result.to_json(),
                "latency_ms": dict(self.latency_ms),
                "time_vs_fp32": {b: r.to_json() for b, r in self.time_vs_fp32.items()},
                "runtime_not_low": list(self.runtime_not_low), "chosen": self.chosen, "pareto": self.pareto}


class ChosenRow(MixRow):
    """The chosen mix: its row, why it was chosen, and the precision the target ran each of its layers in."""

    why: Text = ""
    runtime: dict[str, Text] = {}

    def to_json(self) -> dict[str, Any]:
        return {**super().to_json(), "why": self.why, "runtime": dict(self.runtime)}


class SensitivityRow(schema.Open):
    """One layer's sensitivity: the gate's numbers with only it low (``alone``) and with all but it low."""

    layer: Text
    op_type: Text = ""
    score: Number = 0.0
    alone: GateNumbers = GateNumbers()
    all_but: GateNumbers = GateNumbers()

    def to_json(self) -> dict[str, Any]:
        return {"layer": self.layer, "op_type": self.op_type, "score": self.score, "alone": self.alone.to_json(),
                "all_but": self.all_but.to_json()}


class SanityCheck(schema.Open):
    """One pair of timings that must agree (:func:`pipeline.tune.speed_sanity`): checked or why not, and the ratios."""

    pair: Annotated[list[Text], Field(max_length=2)]
    checked: bool = True
    sane: bool = True
    ratios: dict[str, RatioRow] = {}
    text: Text = ""

    def to_json(self) -> dict[str, Any]:
        return {"pair": list(self.pair), "checked": self.checked, "sane": self.sane,
                "ratios": {b: r.to_json() for b, r in self.ratios.items()}, "text": self.text}


class Sanity(schema.Open):
    """The sanity rules on the last set of interleaved rounds, and how many sets were timed."""

    checks: _rows(SanityCheck) = []
    trustworthy: bool = True
    attempts: int = 1

    def failed(self) -> list[SanityCheck]:
        return [c for c in self.checks if not c.sane]

    def to_json(self) -> dict[str, Any]:
        return {"checks": [c.to_json() for c in self.checks], "trustworthy": self.trustworthy,
                "attempts": self.attempts}


class HeldOutConfirmation(schema.Open):
    """The chosen mix judged by the full gate on the verdict images (:func:`pipeline.tune.held_out_confirmation`),
    beside the search's verdict and numbers; or why it did not run."""

    ran: bool
    why_not: Text | None = None
    status: Text | None = None
    search_status: Text | None = None
    agrees: bool = True
    images: int = 0
    search_images: int = 0
    held_out: VerdictImages | None = None
    candidates: dict[str, Text] = {}
    search: GateNumbers = GateNumbers()
    scaled_error: Number | None = None  # the held-out numbers (the search's are in ``search``)
    top1_agreement: Number | None = None
    accuracy_drop: Number | None = None

    def to_json(self) -> dict[str, Any]:
        if not self.ran:
            return {"ran": False, "why_not": self.why_not}
        return {"ran": True, "status": self.status, "search_status": self.search_status, "agrees": self.agrees,
                "images": self.images, "search_images": self.search_images,
                "held_out": self.held_out.to_json() if self.held_out else None, "candidates": dict(self.candidates),
                "search": self.search.to_json(), "scaled_error": self.scaled_error,
                "top1_agreement": self.top1_agreement, "accuracy_drop": self.accuracy_drop}


class Rung(schema.Open):
    """One rung of PTQ/QAT side by side (:func:`pipeline.reports.tune_report.ladder`), or why it did not run."""

    rung: Text
    ran: bool
    why_not: Text | None = None
    origin: Text = ""
    calibration: Text = ""
    int8_layers: int | None = None
    layers: int = 0
    status: Text | None = None
    scaled_error: Number | None = None
    top1_agreement: Number | None = None
    accuracy_drop: Number | None = None
    latency_ms: dict[str, Number] = {}

    def to_json(self) -> dict[str, Any]:
        if not self.ran:
            return {"rung": self.rung, "ran": False, "why_not": self.why_not}
        return {"rung": self.rung, "ran": True, "origin": self.origin, "calibration": self.calibration,
                "int8_layers": self.int8_layers, "layers": self.layers, "status": self.status,
                "scaled_error": self.scaled_error, "top1_agreement": self.top1_agreement,
                "accuracy_drop": self.accuracy_drop, "latency_ms": dict(self.latency_ms)}


class Ladder(schema.Open):
    """PTQ with every layer low, the best PTQ mix and QAT, and why QAT ran or not (``tune.qat``)."""

    qat_ran: bool
    qat_why: Text = ""
    rungs: Annotated[list[Rung], Field(max_length=3)] = []

    def to_json(self) -> dict[str, Any]:
        return {"qat_ran": self.qat_ran, "qat_why": self.qat_why, "rungs": [r.to_json() for r in self.rungs]}


class Samples(schema.Open):
    sensitivity: int  # images the sensitivity is measured on
    gate: int  # images every mix is judged on


class Timing(schema.Open):
    """How every mix was timed (tune's settings) and the statistic, in words."""

    warmup_s: Number = 0
    min_duration_s: Number = 0
    trials: int = 0
    min_iterations: int = 0
    rounds: int = 0
    statistic: Text


class Fp32(schema.Open):
    latency_ms: dict[str, Number]  # the FP32 deployment, timed in the same rounds


class TuneResult(schema.Open):
    """Everything one tune measured, and the choice: tune.json (INT8) or tune.<precision>.json."""

    schema_: Text = Field(SCHEMA, alias="schema")
    model: Text
    precision: Text = "int8"
    raised: Text  # how the plug says a layer is raised ("out of INT8")
    target: Text
    speed_not_measured: Text | None  # why not (None: measured)
    cpu: Text
    int8_dot_product: bool = True
    cpu_flags_simulated: Text | None = None
    batches: Annotated[list[int], Field(max_length=64)]
    samples: Samples
    timing: Timing
    fp32: Fp32
    sensitivity: dict[str, _rows(SensitivityRow)]
    all_low: dict[str, GateNumbers] = {}
    candidates: _rows(MixRow)
    chosen: ChosenRow | None  # None: no mix passed
    speedup_vs_fp32: dict[str, Number]
    speedup_interval_vs_fp32: dict[str, RatioRow] = {}
    no_speedup_claimed: Text = ""
    same_speed: Number = 0.05
    sanity: Sanity | None = None  # None: nothing timed (the file holds {})
    undecided: Text = ""
    seconds: dict[str, Number]
    greedy: MixRow | None = None
    summary: Text
    held_out_confirmation: HeldOutConfirmation | None = None
    stability: StabilityCertificate | None = None  # pipeline.evaluation.certificate's record
    ladder: Ladder | None = None

    model_config = {**schema.Open.model_config, "populate_by_name": True}

    @field_validator("sanity", mode="before")
    @classmethod
    def _untimed(cls, value: Any) -> Any:
        return None if value == {} else value

    def interval(self, batch: str) -> Ratio:
        """The chosen mix's speed-up over FP32 at ``batch`` with its interval (a point where the file has none)."""
        got = self.speedup_interval_vs_fp32.get(batch)
        if got is not None:
            return got.ratio()
        x = self.speedup_vs_fp32[batch]
        return Ratio(x, x, x, 1)

    def to_json(self) -> dict[str, Any]:
        out = {"schema": self.schema_, "model": self.model, "precision": self.precision, "raised": self.raised,
               "target": self.target, "speed_not_measured": self.speed_not_measured, "cpu": self.cpu,
               "int8_dot_product": self.int8_dot_product, "cpu_flags_simulated": self.cpu_flags_simulated,
               "batches": list(self.batches), "samples": self.samples.model_dump(),
               "timing": self.timing.model_dump(), "fp32": self.fp32.model_dump(),
               "sensitivity": {m: [r.to_json() for r in rows] for m, rows in self.sensitivity.items()},
               "all_low": {m: n.to_json() for m, n in self.all_low.items()},
               "candidates": [c.to_json() for c in self.candidates],
               "chosen": self.chosen.to_json() if self.chosen else None,
               "speedup_vs_fp32": dict(self.speedup_vs_fp32),
               "speedup_interval_vs_fp32": {b: r.to_json() for b, r in self.speedup_interval_vs_fp32.items()},
               "no_speedup_claimed": self.no_speedup_claimed, "same_speed": self.same_speed,
               "sanity": self.sanity.to_json() if self.sanity else {}, "undecided": self.undecided,
               "seconds": dict(self.seconds), "greedy": self.greedy.to_json() if self.greedy else None,
               "summary": self.summary}
        held, cert, ladder = self.held_out_confirmation, self.stability, self.ladder
        tail = {"held_out_confirmation": held.to_json() if held is not None else None,
                "stability": cert.to_json() if cert is not None else None,
                "ladder": ladder.to_json() if ladder is not None else None}  # each only where tune made it
        return {**out, **{k: v for k, v in tail.items() if v is not None}}


def result_of(payload: Any, where: str | Path = "tune.json") -> TuneResult:
    """The typed result of a tune payload already read (the report's)."""
    return schema.validate(payload, TuneResult, where, "tune report")


def read(path: str | Path) -> TuneResult:
    """tune.json at ``path``, typed and bounded (one :class:`~pipeline.core.errors.InputError` when damaged)."""
    return schema.read_json(path, TuneResult, "tune report")
