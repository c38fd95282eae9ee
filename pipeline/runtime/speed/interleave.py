"""Rivals timed in interleaved rounds (randomized multiple interleaved trials; the decisions drawn from the rounds
are :mod:`pipeline.core.speed_claims`).

Every rival is warmed up first (in a shuffled order). Then, each round, every rival runs one block of inferences,
in an order shuffled each round (:func:`pipeline.core.speed_claims.round_orders`); the block's median is the
rival's latency in that round. A busy spell of the machine lands in one or two rounds and slows every rival of
those rounds alike, so the per-round ratios keep their value where one long run per rival would not.

The time a rival gets is the method's own (``trials`` x ``min_duration_s`` and ``min_iterations`` runs, as
:func:`pipeline.runtime.runners.measure` spends), cut into :data:`ROUNDS` blocks.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from pipeline.core.errors import check_interrupt
from pipeline.core.speed_claims import round_orders

ROUNDS = 15  # per-round ratios per pair: a t interval on 14 degrees of freedom (quantile 2.14, against 1.96)
MIN_BLOCK_RUNS = 3  # a block's median of at least three runs: one preempted run does not make the round's latency


@dataclass(frozen=True)
class Rounds:
    """``per_round[i][r]``: rival i's latency (ms) in round r (its block's median); ``samples[i]``: every run of
    rival i, for its median and percentiles."""

    per_round: list[list[float]]
    samples: list[list[float]]

    def median(self, i: int) -> float:
        return float(np.median(self.samples[i]))


def time_rounds(timers: Sequence[Callable[[], float]], *, warmup_s: float, min_duration_s: float, trials: int,
                min_iterations: int, rounds: int = ROUNDS, seed: int = 0) -> Rounds:
    """Each of ``timers`` (one inference, its latency in ms) warmed up for ``warmup_s`` and then timed in
    ``rounds`` interleaved rounds; a block lasts ``trials * min_duration_s / rounds`` seconds and at least
    ``max(MIN_BLOCK_RUNS, min_iterations / rounds)`` runs."""
    block_s = trials * min_duration_s / rounds
    block_runs = max(MIN_BLOCK_RUNS, math.ceil(min_iterations / rounds))
    orders = round_orders(len(timers), rounds + 1, seed)
    for i in orders[0]:  # warm-up: the first run (lazy initialisation), then warmup_s
        timers[i]()
        end = time.perf_counter() + warmup_s
        while time.perf_counter() < end:
            timers[i]()
    per_round: list[list[float]] = [[] for _ in timers]
    samples: list[list[float]] = [[] for _ in timers]
    for order in orders[1:]:
        check_interrupt()
        for i in order:
            block = _block(timers[i], block_s, block_runs)
            per_round[i].append(float(np.median(block)))
            samples[i] += block
    return Rounds(per_round, samples)


def _block(run_once: Callable[[], float], seconds: float, runs: int) -> list[float]:
    block: list[float] = []
    t0 = time.perf_counter()
    while len(block) < runs or time.perf_counter() - t0 < seconds:
        block.append(run_once())
    return block
