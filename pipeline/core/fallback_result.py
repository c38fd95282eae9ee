"""An automatic fallback's record as a type: :class:`FallbackResult` (what moved where, each round, the share left
low, and what it replaced), with the nodes it raised a :class:`RaisedNodes`.

:func:`pipeline.precision.fallback.run` makes it (verify's ``--auto-fallback``, tune's greedy rung); verify adds the
names earlier releases gave what moved (:meth:`FallbackResult.with_legacy`) and carries a previous run's passed one
(:meth:`FallbackResult.carried`). :meth:`FallbackResult.to_json` is its one serialiser, verify.json's
``fallback`` / ``<precision>_fallback`` section in the keys of earlier releases, in their order (the share's keys
named after the precision: ``int8_fraction_before``); :func:`from_json` its one reader, typed and bounded, that
still accepts pipeline.verify/2's sections (no ``raised``: ``excluded_from_<precision>``, ``kept_in_fp32`` or
``moved_to_fp32`` only).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, StringConstraints

from pipeline.core import schema
from pipeline.core.check_results import Measured, Number

MAX_NODES = 50_000  # names in one list (pipeline.precision.fallback's own limit)
MAX_ITERATIONS = 1_000
NodeName = Annotated[str, StringConstraints(max_length=1_000)]
NodeNames = Annotated[list[NodeName], Field(max_length=MAX_NODES)]
# verify.json's names for what moved beside ``raised`` (pipeline.verify/1 and /2): "excluded" (a ladder with a step
# between the precision and FP32: ``excluded_from_<precision>`` and ``kept_in_fp32``), "moved" (``moved_to_fp32``).
Legacy = Literal["excluded", "moved"]


class RaisedNodes(Measured):
    """The nodes a fallback keeps higher: out of the lowest precision (one step up its ladder), and in FP32."""

    out_of_low: NodeNames = []
    fp32: NodeNames = []

    def to_json(self) -> dict[str, Any]:
        return {"out_of_low": list(self.out_of_low), "fp32": list(self.fp32)}


class FallbackResult(Measured):
    """One precision's automatic fallback: whether the raised graph passed, the nodes raised, each round
    (:func:`pipeline.precision.fallback.run`'s own records, for people), the share of nodes in ``precision`` before
    and after, the rounds allowed, the artifacts it replaced; ``legacy``: the old names verify.json also gives what
    moved; ``earlier_run``: carried from the previous verify (its replacement still the file on disk)."""

    passed: bool
    precision: str = Field(max_length=40)
    raised: RaisedNodes = RaisedNodes()
    iterations: Annotated[list[dict[str, Any]], Field(max_length=MAX_ITERATIONS)] = []
    fraction_before: Number | None = None
    fraction_after: Number | None = None
    budget: int | None = None
    replaced: Annotated[list[NodeName], Field(max_length=100)] = []
    legacy: Legacy | None = None
    earlier_run: bool = False

    def with_legacy(self, legacy: Legacy) -> FallbackResult:
        return self.model_copy(update={"legacy": legacy})

    def carried(self) -> FallbackResult:
        """This (a previous verify's) fallback, carried into a later report: nothing replaced again."""
        return self.model_copy(update={"replaced": [], "earlier_run": True})

    def to_json(self) -> dict[str, Any]:
        """The section as verify.json holds it."""
        p, raised = self.precision, self.raised.to_json()
        out: dict[str, Any] = {
            "passed": self.passed, "precision": p, "raised": raised, "iterations": self.iterations,
            f"{p}_fraction_before": self.fraction_before, f"{p}_fraction_after": self.fraction_after,
            "budget": self.budget, "replaced": list(self.replaced)}
        if self.legacy == "excluded":
            out.update({f"excluded_from_{p}": raised["out_of_low"], "kept_in_fp32": raised["fp32"]})
        elif self.legacy == "moved":
            out["moved_to_fp32"] = raised["fp32"]
        return {**out, "earlier_run": True} if self.earlier_run else out


def from_json(section: Any, precision: str, where: str | Path = "verify.json") -> FallbackResult:
    """``precision``'s fallback section as written (today's, or pipeline.verify/2's without ``raised``), typed and
    bounded: one :class:`~pipeline.core.errors.InputError` when damaged."""
    if not isinstance(section, dict):
        return schema.validate(section, FallbackResult, where, "fallback")  # the error names what it should be
    excluded, kept, moved = f"excluded_from_{precision}", "kept_in_fp32", "moved_to_fp32"
    renamed = {"fraction_before": f"{precision}_fraction_before", "fraction_after": f"{precision}_fraction_after"}
    names = {field: renamed.get(field, field) for field in FallbackResult.model_fields if field != "legacy"}
    data = {field: section[key] for field, key in names.items() if key in section}
    data.setdefault("precision", precision)
    if "raised" not in data:  # pipeline.verify/2
        data["raised"] = {"out_of_low": section.get(excluded, []), "fp32": section.get(kept, section.get(moved, []))}
    if excluded in section or kept in section:
        data["legacy"] = "excluded"
    elif moved in section:
        data["legacy"] = "moved"
    return schema.validate(data, FallbackResult, where, "fallback")
