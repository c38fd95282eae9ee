"""Speed claims under noise: per-round ratios, their intervals, and the decisions drawn from them.

Randomized multiple interleaved trials (Abedi & Brecht, "Conducting repeatable experiments in highly variable
cloud computing environments", ICPE 2017): the rivals run in rounds, every rival once per round in an order
shuffled each round (:func:`round_orders`), so a machine whose speed drifts slows every rival of a round alike.
Each round gives one latency per rival; two rivals' per-round latencies give per-round ratios, and the geometric
mean of those with a Student-t interval of the mean log-ratio (:func:`ratio`) is the claim: ``0.53 [0.50, 0.57]``.

The decisions (pure, typed; tested with Hypothesis in tests/test_speed_claims.py):

* :func:`verdict`: a time ratio (candidate over rival; below 1: the candidate takes less time) is "faster" or
  "slower" when its whole interval lies on one side of 1, "same speed" when its whole interval lies within
  ``same_speed`` of 1 (``[1/(1+s), 1+s]``), and "undecided" when it holds 1 but is wider than that band: the noise
  is larger than the difference that matters.
* :func:`choose`: of several rivals, those no other beats (:func:`beats`: faster at some batch and faster or the
  same at every other) are the tie; of the tie, the rival with the most layers in the lower precision wins.
* :func:`sane`: two rivals that compile to the same kernels must not be found faster or slower than each other;
  when they are, the timings are not trustworthy and the honest answer is "undecided".
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)

CONFIDENCE = 0.95
MIN_ROUNDS = 3  # fewer per-round ratios give no interval worth the name (the t quantile at 1 degree is 12.7)


class Speed(str, Enum):
    FASTER = "faster"
    SAME = "same speed"
    SLOWER = "slower"
    UNDECIDED = "undecided"


@dataclass(frozen=True)
class Ratio:
    """A time ratio (candidate's latency over the rival's, per round): its geometric mean over ``rounds`` rounds and
    the ``confidence`` interval ``[low, high]``; ``low = 0, high = inf`` when there were too few rounds."""

    estimate: float
    low: float
    high: float
    rounds: int

    def inverse(self) -> Ratio:
        """The rival over the candidate: a time ratio turned into a speed-up (``x2.08 [1.95, 2.21]``)."""
        return Ratio(_inv(self.estimate), _inv(self.high), _inv(self.low), self.rounds)

    def text(self, digits: int = 2) -> str:
        return f"{self.estimate:.{digits}f} [{self.low:.{digits}f}, {self.high:.{digits}f}]"

    def to_json(self) -> dict:
        return {"estimate": self.estimate, "low": self.low, "high": self.high, "rounds": self.rounds,
                "confidence": CONFIDENCE}


def _inv(x: float) -> float:
    return math.inf if x == 0 else 0.0 if math.isinf(x) else 1.0 / x


UNKNOWN = Ratio(math.nan, 0.0, math.inf, 0)


def ratio(candidate_ms: Sequence[float], rival_ms: Sequence[float], confidence: float = CONFIDENCE) -> Ratio:
    """The per-round time ratios ``candidate_ms[i] / rival_ms[i]`` (latencies of the same round), summarised: their
    geometric mean and the Student-t interval of the mean log-ratio, taken back to a ratio. A round where either
    latency is not a positive finite number is left out."""
    from scipy.stats import t as student_t

    logs = [math.log(a / b) for a, b in zip(candidate_ms, rival_ms, strict=True)
            if 0 < a < math.inf and 0 < b < math.inf]
    n = len(logs)
    if n == 0:
        return UNKNOWN
    mean = math.fsum(logs) / n
    if n < MIN_ROUNDS:
        return Ratio(math.exp(mean), 0.0, math.inf, n)
    sd = math.sqrt(math.fsum((x - mean) ** 2 for x in logs) / (n - 1))
    half = float(student_t.ppf(0.5 + confidence / 2, n - 1)) * sd / math.sqrt(n)
    return Ratio(math.exp(mean), math.exp(mean - half), math.exp(mean + half), n)


def verdict(r: Ratio, same_speed: float) -> Speed:
    """What a time ratio's interval allows one to claim (see the module's docstring); ``same_speed >= 0``."""
    band_low, band_high = 1.0 / (1.0 + same_speed), 1.0 + same_speed
    if not r.rounds or math.isnan(r.estimate):
        return Speed.UNDECIDED
    if band_low <= r.low and r.high <= band_high:
        return Speed.SAME
    if r.high < 1.0:
        return Speed.FASTER
    if r.low > 1.0:
        return Speed.SLOWER
    return Speed.UNDECIDED


def beats(ratios: Mapping[int, Ratio], same_speed: float) -> bool:
    """Whether a candidate beats a rival, given its time ratio to the rival at each timed batch: faster at one
    batch at least, and faster or the same speed at every other (undecided or slower anywhere: it does not)."""
    said = [verdict(r, same_speed) for r in ratios.values()]
    return bool(said) and Speed.FASTER in said and all(s in (Speed.FASTER, Speed.SAME) for s in said)


@dataclass(frozen=True)
class Choice(Generic[K]):
    """:func:`choose`'s answer: the ``pick`` (None: nothing to choose from, or every rival beaten by another, which
    only inconsistent timings do), the ``tie`` it was picked from (no rival beats any of them) and, for every rival
    left out, one that beats it."""

    pick: K | None
    tie: tuple[K, ...]
    beaten_by: dict = field(default_factory=dict)


def choose(rivals: Sequence[K], time_ratio: Callable[[K, K], Mapping[int, Ratio]], lower_layers: Mapping[K, int],
           same_speed: float) -> Choice[K]:
    """The fastest of ``rivals`` as far as the noise allows: those no other rival beats (:func:`beats`, on
    ``time_ratio(a, b)``: a's latency over b's per batch) are the tie; of the tie, the one with the most layers in
    the lower precision (``lower_layers``), then the one earliest in ``rivals``. A tie of one is a clear winner."""
    beaten_by = {}
    for c in rivals:
        winner = next((d for d in rivals if d != c and beats(time_ratio(d, c), same_speed)), None)
        if winner is not None:
            beaten_by[c] = winner
    tie = tuple(c for c in rivals if c not in beaten_by)
    if not tie:
        return Choice(None, (), beaten_by)
    order = {c: i for i, c in enumerate(rivals)}
    pick = min(tie, key=lambda c: (-lower_layers.get(c, 0), order[c]))
    return Choice(pick, tie, beaten_by)


def sane(ratios: Mapping[int, Ratio], same_speed: float) -> bool:
    """Whether two rivals that compile to the same kernels timed alike: at no batch is one found faster or slower
    than the other (same speed, or undecided: the noise is wide, but it did not invent a difference)."""
    return all(verdict(r, same_speed) in (Speed.SAME, Speed.UNDECIDED) for r in ratios.values())


def round_orders(rivals: int, rounds: int, seed: int) -> list[list[int]]:
    """The order the rivals run in, each round: every rival once, shuffled each round (seeded: reproducible)."""
    rng = random.Random(seed)
    orders = []
    for _ in range(rounds):
        order = list(range(rivals))
        rng.shuffle(order)
        orders.append(order)
    return orders


def speedup_text(r: Ratio) -> str:
    """A speed-up with its interval: ``x2.08 [1.95, 2.21]`` (from the time ratio of the faster over the slower)."""
    s = r.inverse()
    return f"x{s.estimate:.2f} [{s.low:.2f}, {s.high:.2f}]" if s.rounds else "x? (not timed in rounds)"
