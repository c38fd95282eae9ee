"""The calibration stability certificate's record as types: :class:`StabilityCertificate` (verify.json's and
tune.json's ``stability``) and its parts: the verdict over the draws (:class:`CertificateOutcome`), one row per draw
(:class:`DrawRow`), a statistic's spread across the draws (:class:`SpreadRow`; the gate's three:
:class:`GateSpread`), the quantizer scales' spread of each kind (:class:`ScaleSpread`, :class:`KindSpread`) and one
quantizer's (:class:`QuantizerSpread`).

:func:`pipeline.evaluation.certificate.payload` makes them where the draws are judged (the decisions are
:mod:`pipeline.precision.stability`'s); each is written by its ``to_json``, the one serialiser: the keys of earlier
releases, in their order (tune's ``limit`` only where tune set it). verify.json is read back through
:mod:`pipeline.core.verify_rows`, tune.json through :mod:`pipeline.precision.tune_result`, typed and bounded once; the
report (:func:`pipeline.reports.tables.stability_sections`) and the plot
(:func:`pipeline.reports.stability_report.write_plot`) lay them out by attribute.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, StringConstraints

from pipeline.core.check_results import Measured, Number

MAX_DRAWS = 1000  # stability.draws: a handful; anything this long is not a certificate
MAX_QUANTIZERS = 100  # the ten most variable are written
Text = Annotated[str, StringConstraints(max_length=1 << 16)]
Word = Annotated[str, StringConstraints(max_length=200)]


class CertificateOutcome(Measured):
    """The verdict over the draws (:class:`pipeline.precision.stability.Certificate`): how many pass, the deployed
    draw's, the policy's outcome and its one line."""

    draws: int
    passing: int
    pass_share: Number
    deployed_draw: int
    deployed_passed: bool
    min_pass_share: Number | None
    status: Word
    fails_gate: bool
    reasons: Annotated[list[Text], Field(max_length=MAX_DRAWS)]
    line: Text


class DrawRow(Measured):
    """One calibration draw: its images, and the gate's status and numbers for its graph."""

    draw: int
    deployed: bool
    images: int
    split: Word
    status: Word
    scaled_error: Number | None = None
    top1_agreement: Number | None = None
    accuracy_drop: Number | None = None


class SpreadRow(Measured):
    """One statistic across the draws (:class:`pipeline.precision.stability.Spread`; ``relative`` None: infinite)."""

    min: Number
    max: Number
    median: Number
    width: Number
    relative: Number | None


class KindSpread(Measured):
    """The scales of one kind of quantizer (activation or weight) across the draws."""

    quantizers: int
    median_relative: Number | None
    max_relative: Number | None
    worst: Text | None  # the quantizer whose scale moves most (None: none of this kind)


class GateSpread(Measured):
    """The gate's statistics across the draws."""

    scaled_error: SpreadRow
    top1_agreement: SpreadRow
    accuracy_drop: SpreadRow


class ScaleSpread(Measured):
    """The quantizer scales across the draws, by kind."""

    activation: KindSpread | None = None
    weight: KindSpread | None = None


class QuantizerSpread(Measured):
    """One quantizer's scale across the draws."""

    tensor: Text
    kind: Word
    min: Number
    max: Number
    median: Number
    width: Number
    relative: Number | None


class StabilityCertificate(Measured):
    """The certificate: the verdict, how the draws were drawn, every draw's gate numbers, the spreads of the gate's
    statistics and of the quantizer scales, the most variable quantizers; tune adds the gate's ``limit``."""

    certificate: CertificateOutcome
    sampling: Word
    sampling_note: Text = ""
    draw_size: int
    verdict_images: int
    draws: Annotated[list[DrawRow], Field(max_length=MAX_DRAWS)]
    gate_spread: GateSpread
    scale_spread: ScaleSpread
    quantizers: Annotated[list[QuantizerSpread], Field(max_length=MAX_QUANTIZERS)]
    seconds: Number
    limit: Number | None = None  # tune's: the gate's max_scaled_error the plot draws (written only where set)

