"""verify.json's ``images`` as types: :class:`ImagesRecord` (which images the verdict is on, whether they are held out
from calibration and tune's search, and how the validation split was cut) and its parts: :class:`ImageSetRecord` (a
:class:`pipeline.core.roles.ImageSet` as recorded), :class:`VerdictImages` (a :class:`pipeline.core.roles.HeldOut` as
recorded; tune.json's held-out confirmation holds one too) and :class:`ValidationSplit`.

verify makes the record where it judges the images held out (:func:`pipeline.verify.held_out_section`) and writes it
through :meth:`ImagesRecord.to_json`, the one serialiser: the keys of earlier releases, in their order. verify.json is
read back through :mod:`pipeline.core.verify_rows`, typed and bounded once; the report
(:func:`pipeline.reports.tables.verify_sections`) lays it out by attribute.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, StringConstraints

from pipeline.core import schema
from pipeline.core.check_results import Measured

MAX_IMAGES = 1 << 20  # verify's images: thousands at most
Text = Annotated[str, StringConstraints(max_length=1 << 16)]
Word = Annotated[str, StringConstraints(max_length=200)]
Texts = Annotated[list[Text], Field(max_length=1 << 16)]  # roles and reasons


class ImageSetRecord(Measured):
    """The images of one role as recorded (:meth:`pipeline.core.roles.ImageSet.to_json`)."""

    role: Word
    split: Word
    count: int | None = None
    indices: Annotated[list[Annotated[int, Field(ge=0)]], Field(max_length=MAX_IMAGES)] = []
    sha256_16: Annotated[list[Annotated[str, StringConstraints(max_length=64)]], Field(max_length=MAX_IMAGES)] = []


class VerdictImages(schema.Open):
    """Whether the verdict images are held out (:meth:`pipeline.core.roles.HeldOut.to_json`)."""

    status: Text
    held_out: bool
    reasons: Texts = []
    overlaps: dict[str, int] = {}
    checked: Texts = []
    not_run: Texts = []
    line: Text = ""

    def to_json(self) -> dict[str, Any]:
        return self.model_dump()


class ValidationSplit(Measured):
    """The validation split's cut into tune's search part and the verdict's (:mod:`pipeline.core.roles`)."""

    cut: bool = False  # False: too small to cut, both use the same images
    search_part: int | None = None
    verdict_part: int | None = None
    reason: Text = ""


class ImagesRecord(Measured):
    """Which images verify's verdict is on, whether they are held out, and the validation split's cut (each None
    where the file does not hold it)."""

    verdict: ImageSetRecord | None = None
    held_out: VerdictImages | None = None
    validation_split: ValidationSplit | None = None

    def to_json(self) -> dict[str, Any]:
        parts = {"verdict": self.verdict, "held_out": self.held_out, "validation_split": self.validation_split}
        return {k: None if v is None else v.to_json() for k, v in parts.items() if k in self.model_fields_set}
