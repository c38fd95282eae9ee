"""Per-layer precision sensitivity, the search for the mix to keep in higher precision, and its Pareto front.

A library for ``python -m pipeline tune`` (:mod:`pipeline.tune`); it runs no stage and reads no run directory.

* **Mixes by graph surgery.** :func:`unquantize` takes the run's fully quantized Q/DQ graph and lets the named
  layers read their inputs unquantized (the activation before its QuantizeLinear, the weight from the FP32
  graph in the Q/DQ graph's high-precision type): what ModelOpt's ``nodes_to_exclude`` gives, without
  re-calibrating, so every mix of one calibration shares the same scales and costs no quantization run.
* **Sensitivity.** For each quantized matrix layer: the graph with only that layer in INT8, and the graph
  with every layer in INT8 but that one, each judged by the gate's own criteria (:func:`pipeline.gate.judge`)
  plus the mean KL divergence of the softmax. A layer's score is the error it causes alone plus the error the
  all-INT8 graph loses when only that layer is raised (both in the gate's scale-free units), so a layer that is
  harmless alone but whose rounding the rest amplifies still ranks high.
* **Search.** The k highest-ranked layers kept out of INT8, for increasing k: bisection on k for the smallest
  passing k (pass/fail is monotone in k when the ranking is right), then its neighbours confirmed; the caller
  adds the greedy fallback's answer and the two extremes.
* **Pareto front and choice** over (accuracy drop, latency): :func:`pareto`, :func:`choose`; a re-run keeps the
  previous choice unless the new one is better beyond the noise: :func:`keep_or_replace`.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import onnx
from onnx import numpy_helper

from pipeline.core import speed_claims
from pipeline.core.check_results import Judgement
from pipeline.core.speed_claims import Ratio
from pipeline.precision import gate as criteria
from pipeline.precision.int8 import DQ, Q
from pipeline.precision.tune_result import GateNumbers

log = logging.getLogger("pipeline")


# --------------------------------------------------------------------------- mixes by graph surgery


# Ops that compute no new value (they move, select or compare what their FP16 input already holds): raising one
# to FP32 cannot change a result, so FP16 tuning does not spend a measurement on them.
ROUNDING_FREE = frozenset({"Relu", "MaxPool", "Flatten", "Reshape", "Transpose", "Concat", "Identity", "Squeeze",
                           "Unsqueeze", "Gather", "Slice", "Split", "Shape", "Expand", "Tile", "Pad", "Cast"})


def low_layers(fp32_model: onnx.ModelProto, precisions: dict, plug) -> list[str]:
    """The units tune raises, in graph order: the nodes the graph computes in ``plug``'s precision that its plug
    counts as units (``plug.is_unit``). ``precisions`` is the graph's ``{node: (op, precision)}``. INT8: the matrix
    layers (Conv, Gemm, MatMul), the only ops ModelOpt quantizes. A low float type: every node that rounds (not
    :data:`ROUNDING_FREE`): a fault can sit in an Add as well as in a layer (``(x + 384) - 384``), and a graph AutoCast
    converts whole is one low region, which would rank nothing."""
    return [n.name for n in fp32_model.graph.node
            if plug.is_unit(n) and precisions.get(n.name, ("", ""))[1] == plug.name]


def unquantize(int8_model: onnx.ModelProto, fp32_model: onnx.ModelProto, names) -> onnx.ModelProto:
    """The Q/DQ graph with the layers ``names`` reading unquantized inputs: an activation from before its
    QuantizeLinear, a weight from the FP32 graph cast to the dequantized type (FP16 in ModelOpt's graphs).
    Quantize/dequantize nodes nothing reads any more are removed."""
    out = onnx.ModelProto()
    out.CopyFrom(int8_model)
    graph = out.graph
    producer = {o: n for n in graph.node for o in n.output}
    fp32_nodes = {n.name: n for n in fp32_model.graph.node}
    fp32_inits = {t.name: t for t in fp32_model.graph.initializer}
    inits = {t.name: t for t in graph.initializer}
    names = set(names)
    for node in graph.node:
        if node.name not in names:
            continue
        for i, tensor in enumerate(node.input):
            dq = producer.get(tensor)
            if dq is None or dq.op_type != DQ:
                continue
            node.input[i] = _unquantized_source(dq, i, node, producer, inits, fp32_nodes, fp32_inits, graph)
    _prune(graph)
    return out


def _unquantized_source(dq, i: int, node, producer, inits, fp32_nodes, fp32_inits, graph) -> str:
    """The tensor ``node``'s input ``i`` reads instead of ``dq``'s output."""
    source = producer.get(dq.input[0])
    if source is not None and source.op_type == Q:  # an activation: the value before quantization
        return source.input[0]
    original = fp32_nodes[node.name].input[i]  # a weight: the FP32 graph's own, in the dequantized type
    if original not in fp32_inits:
        raise ValueError(f"{node.name}: input {i} is neither a quantized activation nor an initializer")
    scale = inits.get(dq.input[1])
    dtype = onnx.helper.tensor_dtype_to_np_dtype(scale.data_type) if scale is not None else np.float32
    name = f"{original}__unquantized"
    if name not in inits:
        inits[name] = numpy_helper.from_array(numpy_helper.to_array(fp32_inits[original]).astype(dtype), name)
        graph.initializer.append(inits[name])
    return name


def _prune(graph: onnx.GraphProto) -> None:
    """Remove Q/DQ nodes whose outputs nothing reads, then initializers nothing reads."""
    while True:
        read = {i for n in graph.node for i in n.input} | {o.name for o in graph.output}
        dead = [n for n in graph.node if n.op_type in (Q, DQ) and not any(o in read for o in n.output)]
        if not dead:
            break
        for node in dead:
            graph.node.remove(node)
    read = {i for n in graph.node for i in n.input}
    for init in [t for t in graph.initializer if t.name not in read]:
        graph.initializer.remove(init)


# --------------------------------------------------------------------------- one mix, judged


def metrics(outputs: list[dict], reference: list[dict], labels: np.ndarray, gate: dict, output_name: str,
            confidence: float) -> GateNumbers:
    """The gate's verdict on one set of outputs (:func:`pipeline.gate.judge`), with the numbers a table shows."""
    return GateNumbers.model_validate(summary(criteria.judge(outputs, reference, labels, gate, output_name,
                                                             confidence)))


def summary(result: Judgement) -> dict:
    """The numbers of one judged candidate (a :func:`pipeline.gate.judge` result) that tune's tables show."""
    tensor, task = result.tensor_check, result.task_check
    scaled = tensor.scaled_error if tensor.scaled_error_quantile is None else tensor.scaled_error_quantile
    return {"status": result.status, "scaled_error": scaled, "max_abs_error": tensor.max_abs_error,
            "quantile_abs_error": tensor.quantile_abs_error, "top1_agreement": task.top1_agreement,
            "accuracy_drop": task.accuracy_drop, "mean_kl": tensor.mean_kl}


# --------------------------------------------------------------------------- sensitivity


@dataclass
class Sensitivity:
    layer: str
    op_type: str
    alone: GateNumbers  # only this layer in INT8
    all_but: GateNumbers  # every layer in INT8 but this one
    score: float = 0.0


def score(alone: GateNumbers, all_but: GateNumbers, all_low: GateNumbers) -> float:
    """The error the layer causes alone plus what raising it alone recovers from the all-INT8 graph (scaled units;
    a non-finite error counts as very large)."""
    def finite(x) -> float:
        return 1e9 if x is None or not np.isfinite(x) else float(x)

    return finite(alone.scaled_error) + max(0.0, finite(all_low.scaled_error) - finite(all_but.scaled_error))


def measure(layers: list[str], op_types: dict, evaluate: Callable[[set], GateNumbers],
            all_low: GateNumbers) -> list[Sensitivity]:
    """Each layer's sensitivity, ranked (most sensitive first; ties in graph order). ``evaluate(high)`` judges
    the mix with the layers ``high`` out of INT8."""
    rows = []
    everything = set(layers)
    for layer in layers:
        alone = evaluate(everything - {layer})
        all_but = evaluate({layer})
        rows.append(Sensitivity(layer, op_types.get(layer, ""), alone, all_but, score(alone, all_but, all_low)))
    order = {name: i for i, name in enumerate(layers)}
    return sorted(rows, key=lambda r: (-r.score, order[r.layer]))


# --------------------------------------------------------------------------- search


@dataclass(frozen=True)
class Confirmation:
    """The full gate on the graph export will make of a mix (tune confirms the pick on it): passed or failed, and
    each candidate's status."""

    status: str
    candidates: object  # the round's results: {candidate: status}

    def to_json(self) -> dict:
        return {"status": self.status, "candidates": self.candidates}


@dataclass(frozen=True)
class GreedyRun:
    """How the greedy fallback (``verify --auto-fallback``'s loop) reached its mix: whether its loop passed (None: the
    all-low graph passed, so it did not run) and the rounds it took."""

    passed: bool | None
    rounds: int

    def to_json(self) -> dict:
        return {**({} if self.passed is None else {"greedy_passed": self.passed}), "greedy_rounds": self.rounds}


QAT_FACTS = ("epochs", "seconds_per_epoch", "best_val_acc", "int8_layers", "source", "simulated")


@dataclass(frozen=True)
class QatRun:
    """What QAT's fine-tuning reports of the mix it made (tune's third rung)."""

    epochs: int
    seconds_per_epoch: float
    best_val_acc: float
    int8_layers: int
    source: dict  # the checkpoint export rebuilds the graph from
    simulated: object

    def to_json(self) -> dict:
        return {"qat": {k: getattr(self, k) for k in QAT_FACTS}, "int8_layers": self.int8_layers}


@dataclass
class Candidate:
    """One mix: the layers kept out of INT8, how it was found, its gate result and timings."""

    high: list[str]
    origin: str  # "all INT8" (or "all FP16"), "top-3", "greedy fallback", "all high", "previous choice"
    result: dict = field(default_factory=dict)  # metrics(...) of the full gate
    latency_ms: dict = field(default_factory=dict)  # {batch: median ms}
    calibration: str = ""
    fp32: list[str] = field(default_factory=list)  # nodes kept in FP32 (the FP16 fallback's; greedy's own)
    runtime: dict = field(default_factory=dict)  # what the target ran each matrix layer in
    round: object = field(default=None, repr=False, compare=False)  # the full gate's round (its failing check)
    rounds: dict = field(default_factory=dict, repr=False)  # {batch: [ms per interleaved round]}
    session: int = 0  # which set of interleaved rounds timed it (0: none; only rounds of one session pair up)
    kernels: tuple | None = field(default=None, repr=False)  # what the target compiled it to (None: not known)
    greedy: GreedyRun | None = None  # the greedy fallback's answer: how its loop went
    confirmed: Confirmation | None = None  # the gate on the graph export makes of it (tune's pick)
    qat: QatRun | None = None  # QAT's mix: its fine-tuning

    def result_json(self) -> dict:
        """The gate's result as tune.json holds it: with how the greedy fallback went, the confirmation and QAT's
        facts after it, where the mix has them."""
        return {**self.result, **(self.greedy.to_json() if self.greedy else {}),
                **({"confirmed": self.confirmed.to_json()} if self.confirmed else {}),
                **(self.qat.to_json() if self.qat else {})}

    @property
    def passed(self) -> bool:
        return self.result.get("status") == criteria.PASSED

    def key(self) -> tuple:
        """The mix itself: its calibration, the layers it raises and the nodes it keeps in FP32."""
        return self.calibration, tuple(sorted(self.high)), tuple(sorted(self.fp32))


@dataclass
class MethodRun:
    """One calibration method's search (tune): the units it can raise (graph order), the gate's quick metrics of the
    graph with every unit low, the sensitivity ranking, every mix judged (a rung or the previous choice appended
    later) and the all-low graph (an ``onnx.ModelProto``) the mixes are made from."""

    method: str
    layers: list[str]
    all_low: GateNumbers  # the quick metrics of the graph with every unit low
    ranked: list[Sensitivity]
    candidates: list[Candidate]
    graph: object = field(repr=False)


def search(ranked: list[str], judge: Callable[[list[str], str], Candidate],
           lowest: str = "all INT8") -> list[Candidate]:
    """Keep the top k of ``ranked`` out of INT8: bisect for the smallest passing k (the invariant keeps k - 1 judged
    and failing), then judge k + 1 too, so the front has both neighbours. ``judge(high, origin)`` judges a mix under
    the full gate. Returns every candidate judged, k = 0 and k = len(ranked) included."""
    judged: dict[int, Candidate] = {}

    def at(k: int) -> Candidate:
        if k not in judged:
            judged[k] = judge(ranked[:k], lowest if k == 0 else "all high" if k == len(ranked) else f"top-{k}")
        return judged[k]

    low, high = 0, len(ranked)
    at(high)  # both extremes are always candidates (the Pareto front's ends)
    if at(low).passed or not at(high).passed:
        return [judged[k] for k in sorted(judged)]
    while high - low > 1:  # invariant: at(low) fails, at(high) passes
        mid = (low + high) // 2
        low, high = (low, mid) if at(mid).passed else (mid, high)
    if high < len(ranked):  # its neighbour below is `low`, judged and failing; the one above is judged too
        at(high + 1)
    return [judged[k] for k in sorted(judged)]


# --------------------------------------------------------------------------- Pareto front and choice


def pareto(candidates: list[Candidate], batch: int) -> list[Candidate]:
    """The candidates no other beats on both accuracy drop and latency at ``batch`` (timed ones only)."""
    timed = [c for c in candidates if batch in c.latency_ms]

    def point(c: Candidate) -> tuple[float, float]:
        return c.result["accuracy_drop"], c.latency_ms[batch]

    def dominated(c: Candidate) -> bool:
        return any(point(o)[0] <= point(c)[0] and point(o)[1] <= point(c)[1] and point(o) != point(c) for o in timed)

    return sorted((c for c in timed if not dominated(c)), key=lambda c: c.latency_ms[batch])


def time_ratio(a: Candidate, b: Candidate, batches: list[int]) -> dict[int, Ratio]:
    """``a``'s latency over ``b``'s at each of ``batches``: from their per-round latencies where both were timed in
    the same interleaved rounds (a ratio with its interval), else from their medians alone (a point: no interval,
    what a caller that timed each mix alone has; only tests and old reports do)."""
    out = {}
    for batch in batches:
        ra, rb = a.rounds.get(batch), b.rounds.get(batch)
        if a.session and a.session == b.session and ra and rb and len(ra) == len(rb):
            out[batch] = speed_claims.ratio(ra, rb)
        else:
            x = a.latency_ms[batch] / b.latency_ms[batch]
            out[batch] = speed_claims.Ratio(x, x, x, 1)
    return out


def choose(candidates: list[Candidate], batches: list[int], same_speed: float = 0.05) -> Candidate | None:
    """The fastest passing mix as far as the noise allows (:func:`pipeline.core.speed_claims.choose`): the
    passing mixes timed at every one of ``batches`` that no other beats (faster beyond the interval at one batch,
    faster or the same speed within ``same_speed`` at every other: :func:`time_ratio`) are the tie; of the tie, the
    one with the fewest layers out of the low precision, then the smallest error (measured on fixed images: the
    same in every run), then the fastest median (summed over ``batches``, each relative to the fastest there; the
    last resort, where the noise may decide). Nothing timed (``batches`` empty): every mix ties."""
    passing = [c for c in candidates if c.passed and all(b in c.latency_ms for b in batches)]
    if not passing:
        return None
    best = {b: min(c.latency_ms[b] for c in passing) for b in batches}

    def cost(c: Candidate) -> float:
        return sum(c.latency_ms[b] / best[b] for b in batches)

    ordered = sorted(passing, key=lambda c: (c.result.get("scaled_error") or 0.0, cost(c)))
    lower = {id(c): -len(c.high) for c in ordered}
    keyed = {id(c): c for c in ordered}
    picked = speed_claims.choose([id(c) for c in ordered], lambda x, y: time_ratio(keyed[x], keyed[y], batches),
                                 lower, same_speed).pick
    return None if picked is None else keyed[picked]


def confirmed(candidates: list[Candidate], batches: list[int], same_speed: float,
              confirm: Callable[[Candidate], bool],
              incumbent: Candidate | None = None) -> tuple[Candidate | None, int, Candidate | None]:
    """The mix tune writes: the first pick whose ``confirm`` (the gate on the graph export will really make) passes,
    each pick the :func:`choose` of what is left, or the ``incumbent`` (the fallback file's mix) where
    :func:`keep_or_replace` keeps it; a pick that fails its confirmation gives way to the next best (an incumbent
    that fails is not kept). Returns the pick (None: none confirmed), how many were tried, and the last
    :func:`choose` answer (to say what was not taken when the incumbent stays)."""
    tried: list[Candidate] = []
    while True:
        fastest = choose([c for c in candidates if all(c is not x for x in tried)], batches, same_speed)
        pick = keep_or_replace(incumbent, fastest, batches, same_speed)
        if pick is None:
            return None, len(tried), fastest
        tried.append(pick)
        if confirm(pick):
            return pick, len(tried), fastest
        if pick is incumbent:
            incumbent = None  # its real graph fails: nothing to keep


def speedups(fp32_ms: dict[int, float], chosen_ms: dict[int, float]) -> dict[int, float]:
    """The chosen mix's speed-up over the FP32 deployment on the same target, per batch both were timed at:
    FP32's latency over the mix's (2.0: the mix takes half the time)."""
    return {b: fp32_ms[b] / chosen_ms[b] for b in sorted(set(fp32_ms) & set(chosen_ms))}


def too_slow(speedup: dict[int, float], min_speedup: float | None) -> dict[int, float]:
    """The batches where the speed-up is below ``tune.min_speedup`` (the speed gate fails on any); none when the
    gate is off (``min_speedup`` None or 0) or nothing was timed."""
    if not min_speedup:
        return {}
    return {b: s for b, s in speedup.items() if not s >= min_speedup}  # NaN is too slow


def keep_or_replace(incumbent: Candidate | None, pick: Candidate | None, batches: list[int],
                    same_speed: float = 0.05) -> Candidate | None:
    """The mix a re-run of tune keeps: the ``incumbent`` (the mix the fallback file holds now, judged and timed in
    this run like every other) or the ``pick`` (this run's :func:`choose`). Latencies are positive milliseconds.

    The incumbent stays unless it no longer passes (or, where speed is measured, was not timed at every batch in
    ``batches``), or the pick beats it beyond the measured noise (:func:`pipeline.core.speed_claims.beats` on
    :func:`time_ratio`: faster beyond its interval at a batch and faster or the same speed within ``same_speed`` at
    every other). With nothing timed (``batches`` empty) the only measure free of noise decides: a pick that raises
    fewer layers. A pick that does not pass never replaces anything. So timing noise alone never flips a choice,
    nor re-runs what follows it."""
    def usable(c: Candidate | None) -> bool:
        return c is not None and c.passed and all(b in c.latency_ms for b in batches)

    if not usable(incumbent):
        return pick if usable(pick) else None
    if not usable(pick) or pick is incumbent:
        return incumbent
    if not batches:
        return pick if len(pick.high) < len(incumbent.high) else incumbent
    return pick if speed_claims.beats(time_ratio(pick, incumbent, batches), same_speed) else incumbent


def timed(fn: Callable, *args):
    """``fn(*args)`` and the seconds it took."""
    start = time.perf_counter()
    value = fn(*args)
    return value, time.perf_counter() - start
