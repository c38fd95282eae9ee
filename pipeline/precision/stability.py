"""The calibration stability certificate's decisions (docs/verify.md, "Calibration stability"): pure and typed.

An INT8 graph's activation ranges come from one draw of calibration images. The certificate recalibrates on K draws
(draw 0 is the one deployed: export's own calibration images; the others disjoint from it and from each other where
the training split holds them, else bootstrap draws), judges each draw's graph by the gate on the verdict images, and
reports how much each quantizer's scale and each gate statistic moves across the draws, and how many draws pass.
``verify.int8.min_pass_share`` fails an artifact whose pass is a lucky draw. The runs themselves:
:mod:`pipeline.evaluation.certificate`.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from pipeline.core.status import Status

DISJOINT, BOOTSTRAP = "disjoint", "bootstrap"
STABLE, UNSTABLE, LUCKY, FAILED = Status.CERTIFIED, Status.UNSTABLE, Status.LUCKY, Status.FAILED


@dataclass(frozen=True)
class Draws:
    """The K draws of training-split indices (draw 0: the deployed calibration images) and how they were drawn."""

    indices: tuple[tuple[int, ...], ...]
    sampling: str  # DISJOINT or BOOTSTRAP (the one used)
    note: str = ""  # why the sampling asked for was not used


def draw_indices(n_train: int, deployed: Sequence[int], k: int, size: int, sampling: str, seed: int) -> Draws:
    """Draw 0 is ``deployed``; draws 1..k-1 hold ``size`` training indices each: disjoint from draw 0 and from each
    other (``sampling`` disjoint) where the split holds ``(k - 1) * size`` images besides draw 0's, else (and for
    ``sampling`` bootstrap) drawn with replacement from the whole split. Deterministic in ``seed``."""
    if k < 1 or size < 1 or n_train < 1:
        raise ValueError(f"need k >= 1, size >= 1 and a training split (k={k}, size={size}, n_train={n_train})")
    rng = random.Random(seed)
    first = tuple(deployed)
    rest = [i for i in range(n_train) if i not in set(first)]
    note = ""
    if sampling == DISJOINT and len(rest) >= (k - 1) * size:
        rng.shuffle(rest)
        others = [tuple(sorted(rest[d * size:(d + 1) * size])) for d in range(k - 1)]
        return Draws((first, *others), DISJOINT)
    if sampling == DISJOINT:
        note = (f"the training split holds {len(rest)} images besides the deployed draw's: too few for {k - 1} "
                f"disjoint draws of {size}; bootstrap draws instead")
    others = [tuple(sorted(rng.choices(range(n_train), k=size))) for _ in range(k - 1)]
    return Draws((first, *others), BOOTSTRAP, note)


@dataclass(frozen=True)
class Spread:
    """One statistic across the draws."""

    low: float
    high: float
    median: float

    @property
    def width(self) -> float:
        return self.high - self.low

    @property
    def relative(self) -> float:
        """The width over the median's magnitude (0 where every draw agrees; inf where the median is 0 and they do
        not)."""
        if self.width == 0:
            return 0.0
        return self.width / abs(self.median) if self.median else math.inf

    def to_json(self) -> dict:
        return {"min": self.low, "max": self.high, "median": self.median, "width": self.width,
                "relative": self.relative if math.isfinite(self.relative) else None}


def spread_of(values: Sequence[float]) -> Spread | None:
    """The spread of the finite ``values`` (None: none is finite)."""
    finite = [float(v) for v in values if v is not None and math.isfinite(v)]
    if not finite:
        return None
    return Spread(min(finite), max(finite), statistics.median(finite))


def scale_spreads(scales: Sequence[Mapping[str, float]]) -> dict[str, Spread]:
    """Each quantizer's scale across the draws (a quantizer missing from a draw's graph is left out of that draw)."""
    names = sorted({name for draw in scales for name in draw})
    out = {}
    for name in names:
        spread = spread_of([draw[name] for draw in scales if name in draw])
        if spread is not None:
            out[name] = spread
    return out


@dataclass(frozen=True)
class Certificate:
    """The certificate's verdict: how many of the K draws pass, the deployed one's status, the policy's outcome."""

    draws: int
    passing: int
    deployed: int  # the index of the deployed draw (0)
    deployed_passed: bool
    min_pass_share: float | None
    status: str  # STABLE (every draw passes), UNSTABLE (some fail, the policy allows it), LUCKY (policy fails), FAILED
    reasons: tuple[str, ...] = field(default=())

    @property
    def share(self) -> float:
        return self.passing / self.draws if self.draws else 0.0

    @property
    def fails_gate(self) -> bool:
        """Whether the policy fails the artifact (only ``verify.int8.min_pass_share`` can; a failing deployed draw is
        the gate's own failure already)."""
        return self.status == LUCKY

    def line(self) -> str:
        policy = f" (verify.int8.min_pass_share {self.min_pass_share:g})" if self.min_pass_share is not None else ""
        return (f"draw {self.deployed} deployed ({Status.PASSED if self.deployed_passed else Status.FAILED}); "
                f"{self.passing} of "
                f"{self.draws} calibration draws pass ({100 * self.share:.0f}%){policy}: {self.status}")

    def to_json(self) -> dict:
        return {"draws": self.draws, "passing": self.passing, "pass_share": self.share, "deployed_draw": self.deployed,
                "deployed_passed": self.deployed_passed, "min_pass_share": self.min_pass_share,
                "status": self.status, "fails_gate": self.fails_gate, "reasons": list(self.reasons),
                "line": self.line()}


def draw_passes(status: str, inconclusive: str = "pass") -> bool:
    """A draw passes when its gate passed, or was inconclusive under ``verify.inconclusive: pass``."""
    return status == Status.PASSED or (status == Status.INCONCLUSIVE and inconclusive == "pass")


def certify(statuses: Sequence[str], min_pass_share: float | None, inconclusive: str = "pass",
            deployed: int = 0) -> Certificate:
    """The verdict over the draws' gate statuses (``statuses[deployed]`` is the deployed draw's)."""
    if not statuses or not 0 <= deployed < len(statuses):
        raise ValueError("the certificate needs the deployed draw among at least one draw")
    passes = [draw_passes(s, inconclusive) for s in statuses]
    passing = sum(passes)
    share = passing / len(statuses)
    reasons = []
    if not passes[deployed]:
        status = FAILED
        reasons.append(f"the deployed draw fails the gate ({statuses[deployed]})")
    elif min_pass_share is not None and share < min_pass_share:
        status = LUCKY
        reasons.append(f"{passing} of {len(statuses)} draws pass ({100 * share:.0f}%), below "
                       f"verify.int8.min_pass_share {min_pass_share:g}: the deployed draw's pass is a lucky one")
    elif passing < len(statuses):
        status = UNSTABLE
        reasons.append(f"{len(statuses) - passing} of {len(statuses)} draws fail the gate")
    else:
        status = STABLE
    return Certificate(len(statuses), passing, deployed, passes[deployed], min_pass_share, status, tuple(reasons))
