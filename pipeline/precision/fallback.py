"""One automatic fallback for every precision a graph carries.

A lower-precision graph gives each node of the FP32 graph a precision on the ladder ``int8 < fp16 < fp32``
(``model.fp16.onnx``: fp16 or fp32; ``model.int8.onnx``: int8, fp16 in the regions ModelOpt leaves
unquantized, or fp32). When a gating candidate fails, localisation names the first node over tolerance;
the fallback raises it one step (int8 -> fp16: left unquantized; fp16 -> fp32: kept in FP32) or, when it
already computes in FP32, raises its nearest lower-precision producers (its error comes from their
rounding). The graph is then remade with every raise so far, re-checked, and the loop repeats until the
candidates that run the graph pass or ``verify.fallback_iterations`` runs out. A passing graph replaces
the run's file and the raises go to its fallback file, which every later export applies.

The FP16 graph's raises to FP32 also apply to the INT8 graph's FP16 regions (the nodes are the same), so
what the FP16 fallback found carries over (:func:`read`).

The same loop serves every precision; its plug (:mod:`pipeline.precision.plugs`) says how a graph is read and
summarised. How a graph is remade (export's conversion), re-checked and localised is the caller's (verify's):
this module imports no stage.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Callable, Literal, Protocol

import onnx
from pydantic import Field, StringConstraints

from pipeline.core import schema
from pipeline.core.artifacts import QAT_BEST_CHECKPOINT, QAT_CHECKPOINT, fallback_file
from pipeline.core.check_results import Localization, NodeError
from pipeline.core.errors import InputError
from pipeline.core.fallback_result import FallbackResult, RaisedNodes
from pipeline.core.run import RunDir, write_json
from pipeline.precision import CALIBRATION_METHODS

if TYPE_CHECKING:  # annotations only
    from pipeline.core.config_schema import Config

log = logging.getLogger("pipeline")

@dataclass
class Raised:
    """What the fallback keeps in higher precision: nodes left out of the lowest precision (one step up its ladder:
    INT8's layers into the FP16 regions), and nodes kept in FP32."""

    out_of_low: list[str] = field(default_factory=list)
    fp32: list[str] = field(default_factory=list)

    def add(self, moves: dict[str, str]) -> None:
        for name, precision in moves.items():
            target = self.fp32 if precision == "fp32" else self.out_of_low
            if name not in target:
                target.append(name)


class Plug(Protocol):
    """What the fallback reads of a precision plug (:class:`pipeline.precision.plugs.Precision`)."""

    name: str
    label: str
    ladder: tuple[str, ...]
    graph: str
    candidate_file: str
    fallback_file: str
    fallback_schema: type
    reads_fp32_from: tuple[str, ...]

    def node_precisions(self, fp32_model: onnx.ModelProto, model: onnx.ModelProto) -> dict: ...
    def fraction(self, precisions: dict) -> float: ...
    def raised_from(self, payload) -> Raised: ...
    def fallback_payload(self, raised: Raised, method: str | None, note: str) -> dict: ...


# --------------------------------------------------------------------------- the fallback files

# What a fallback file (written by verify --auto-fallback or tune, or by hand) may hold. Its names are node names of
# model.onnx: a graph of this tool's scale has hundreds to a few thousand, each a path of a few dozen characters.
MAX_NODES = 50_000  # names in one list
MAX_NAME = 1_000  # characters in one name
MAX_NOTE = 2_000  # characters of the free-text ``note``
FILE_LIMIT = 4 * schema.MiB  # bytes of the file, checked before it is parsed
SHOWN = 5  # unknown names a message lists (then their count)

NodeName = Annotated[str, StringConstraints(min_length=1, max_length=MAX_NAME)]
NodeNames = Annotated[list[NodeName], Field(max_length=MAX_NODES)]
Note = Annotated[str, StringConstraints(max_length=MAX_NOTE)]


class FloatFallbackFile(schema.Strict):
    """``fp16_fallback.json``, ``bf16_fallback.json``: the nodes kept in FP32. ``note`` is free text for people (the
    writers explain the file there); any other key is refused, so a misspelt one (``node``) is said, not silently
    ignored."""

    nodes: NodeNames
    note: Note = ""


class QATSource(schema.Strict):
    """Where a QAT graph comes from (``python -m pipeline qat``, or tune's third rung): export rebuilds
    ``model.int8.onnx`` from ``checkpoint`` (no training), refusing one made from other trained weights."""

    epochs: int = Field(ge=1)
    checkpoint: Literal[QAT_BEST_CHECKPOINT, QAT_CHECKPOINT]  # qat's own: train's checkpoint has no quantizer state
    source_weights_sha256: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
    checkpoint_sha256: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
    data: Note = ""


class Int8FallbackFile(schema.Strict):
    """``int8_fallback.json``: the nodes left out of INT8, the nodes kept in FP32, and tune's calibration method
    (one the config's ``export.int8.calibration_method`` allows); ``method: qat`` with its :class:`QATSource` when
    the INT8 graph is QAT's."""

    nodes: NodeNames
    fp32_nodes: NodeNames = Field(default_factory=list)
    calibration_method: Literal[CALIBRATION_METHODS] | None = None
    method: Literal["ptq", "qat"] = "ptq"
    qat: QATSource | None = None
    note: Note = ""


def read(run_dir: RunDir, plug: Plug, fp32_model: onnx.ModelProto | None = None) -> Raised:
    """The raises kept for ``plug``'s graph, and the FP32 nodes of the plugs it also reads (the INT8 graph keeps in
    FP32 what the FP16 fallback moved there: its regions are FP16). With ``fp32_model`` (the graph the names refer
    to), a name that is none of its nodes is an :class:`InputError`."""
    own = _read_file(run_dir, plug.fallback_file, plug.fallback_schema, f"{plug.label} fallback list", fp32_model)
    raised = plug.raised_from(own) if own is not None else Raised()
    raised.fp32 = list(dict.fromkeys([*raised.fp32, *inherited_fp32(run_dir, plug, fp32_model)]))
    return raised


def inherited_fp32(run_dir: RunDir, plug: Plug, fp32_model: onnx.ModelProto | None = None) -> list[str]:
    """The nodes the fallbacks of the precisions ``plug`` reads (``reads_fp32_from``) keep in FP32."""
    nodes: list[str] = []
    for other in plug.reads_fp32_from:
        moved = _read_file(run_dir, fallback_file(other), FloatFallbackFile, f"{other.upper()} fallback list",
                           fp32_model)
        nodes += moved.nodes if moved else []
    return list(dict.fromkeys(nodes))


def _read_file(run_dir: RunDir, name: str, model: type, what: str, fp32_model: onnx.ModelProto | None = None):
    """The fallback file ``name`` as its schema ``model`` (None when there is none), its names checked against
    ``fp32_model`` when given; anything malformed is exit 2 in one line (:func:`pipeline.core.schema.read_json`)."""
    path = run_dir.file(name)
    if not path.exists() and not path.is_symlink():
        return None
    data = schema.read_json(path, model, what, limit=FILE_LIMIT)
    if fp32_model is not None:
        check_names(data, fp32_model, path)
    return data


def check_names(data: FloatFallbackFile | Int8FallbackFile, fp32_model: onnx.ModelProto, path) -> None:
    """Every name of the file is a node of ``fp32_model``, or one :class:`InputError` naming the first few."""
    known = {node.name for node in fp32_model.graph.node}
    for key in ("nodes", "fp32_nodes"):
        unknown = list(dict.fromkeys(n for n in getattr(data, key, ()) if n not in known))
        if unknown:
            shown = ", ".join(schema.printable(n, 80) for n in unknown[:SHOWN])
            more = f" and {len(unknown) - SHOWN} more" if len(unknown) > SHOWN else ""
            raise InputError(f"{path}: {len(unknown)} name(s) in {key!r} are not nodes of the FP32 graph "
                             f"(model.onnx): {shown}{more}; remove them, or delete the file if it is from another "
                             "model (verify --auto-fallback and tune write it again)")


def calibration_method(run_dir: RunDir, plug: Plug) -> str | None:
    """The calibration method ``python -m pipeline tune`` chose for ``plug`` (its fallback file), if it chose one."""
    own = _read_file(run_dir, plug.fallback_file, plug.fallback_schema, f"{plug.label} fallback list")
    return getattr(own, "calibration_method", None)


def qat_source(run_dir: RunDir, plug: Plug) -> QATSource | None:
    """The QAT source ``plug``'s fallback file names (``method: qat``), else None."""
    own = _read_file(run_dir, plug.fallback_file, plug.fallback_schema, f"{plug.label} fallback list")
    if getattr(own, "method", "ptq") != "qat":
        return None
    if own.qat is None:
        raise InputError(f"{run_dir.file(plug.fallback_file)} says method: qat without its qat source; run "
                         "python -m pipeline qat again")
    return own.qat


def write(run_dir: RunDir, plug: Plug, raised: Raised) -> None:
    """The fallback file of ``plug`` with ``raised``; tune's calibration method stays (the graph was made with it)."""
    note = (f"kept higher by verify --auto-fallback: nodes one step up the {' < '.join(plug.ladder)} ladder"
            + (", fp32_nodes in FP32 (the FP16 fallback's nodes are kept in FP32 here too)"
               if plug.reads_fp32_from else ""))
    write_json(run_dir.file(plug.fallback_file), plug.fallback_payload(raised, calibration_method(run_dir, plug), note))


# --------------------------------------------------------------------------- which nodes move


def next_moves(node_name: str, fp32_model: onnx.ModelProto, precisions: dict,
               ladder: tuple[str, ...]) -> dict[str, str]:
    """``{node: precision it moves to}``: the divergent node one step up ``ladder`` (lowest first, ending in
    "fp32") when it computes below FP32; else the nearest producers upstream of it that do (breadth first, the first
    level that has any)."""
    def raised(name: str) -> str | None:
        current = precisions.get(name, ("", "fp32"))[1]
        return ladder[ladder.index(current) + 1] if current in ladder[:-1] else None

    if raised(node_name):
        return {node_name: raised(node_name)}
    producers = {out: node for node in fp32_model.graph.node for out in node.output}
    by_name = {n.name: n for n in fp32_model.graph.node}
    frontier, seen, found = [node_name], set(), {}
    while frontier and not found:
        next_frontier = []
        for name in frontier:
            for tensor in getattr(by_name.get(name), "input", ()):
                producer = producers.get(tensor)
                if producer is None or producer.name in seen:
                    continue
                seen.add(producer.name)
                if raised(producer.name):
                    found[producer.name] = raised(producer.name)
                else:
                    next_frontier.append(producer.name)
        frontier = next_frontier
    return found


# --------------------------------------------------------------------------- the loop


@dataclass
class Round:
    """What one round re-checked: each candidate's status, and the first failing one (None when none failed)."""

    results: dict[str, str]
    passed: bool
    failing: object = None  # the caller's failing check, handed back to ``localize``
    note: str = ""
    checks: list = field(default_factory=list)  # the caller's re-checked candidates


def run(plug: Plug, cfg: Config, run_dir: RunDir, fp32_model: onnx.ModelProto, model: onnx.ModelProto,
        localization: Localization | None, *, remake: Callable[[Raised, str], dict],
        recheck: Callable[[onnx.ModelProto], Round], localize: Callable[[onnx.ModelProto, object], Localization]
        ) -> FallbackResult:
    """Raise, remake, re-check; repeat. ``remake(raised, out_name)`` writes the graph with those raises (export's
    conversion, returning its precision report); ``recheck(graph)`` judges it with the candidates that run it;
    ``localize(graph, failing)`` names the next divergent node. Replaces ``plug.graph`` only when it passes."""
    raised = read(run_dir, plug, fp32_model)
    before = plug.fraction(plug.node_precisions(fp32_model, model))
    candidate_path = run_dir.file(plug.candidate_file)
    fraction = f"{plug.name}_fraction"
    iterations, current, loc, passed = [], model, localization, False
    try:
        for i in range(cfg.verify.fallback_iterations):
            first = loc.first_divergent if loc else None
            moves = next_moves(first.name, fp32_model, plug.node_precisions(fp32_model, current),
                               plug.ladder) if first else {}
            if not moves:
                iterations.append({"iteration": i + 1, "moved": [], "note": _nothing_to_move(first)})
                break
            raised.add(moves)
            report = remake(raised, plug.candidate_file)
            current = onnx.load(str(candidate_path))
            checked = recheck(current)
            passed = checked.passed
            iterations.append({"iteration": i + 1, "moved": list(moves), "to": moves, "divergent_node": first.name,
                               fraction: report[fraction], "passed": passed, "results": checked.results,
                               **({"note": checked.note} if checked.note else {})})
            log.info("verify: %s fallback %d: %s -> %s fraction %.1f%%, %s", plug.label, i + 1,
                     ", ".join(f"{n} to {p}" for n, p in moves.items()), plug.label, 100 * report[fraction],
                     "passes" if passed else "still fails")
            if passed:
                os.replace(candidate_path, run_dir.file(plug.graph))
                write(run_dir, plug, raised)
                break
            if checked.failing is None:
                break
            loc = localize(current, checked.failing)
    finally:
        candidate_path.unlink(missing_ok=True)
    after = plug.fraction(plug.node_precisions(fp32_model, current)) if passed else before
    return FallbackResult(passed=passed, precision=plug.name,
                          raised=RaisedNodes(out_of_low=list(raised.out_of_low), fp32=list(raised.fp32)),
                          iterations=iterations, fraction_before=before, fraction_after=after,
                          budget=cfg.verify.fallback_iterations, replaced=[plug.graph] if passed else [])


def _nothing_to_move(first: NodeError | None) -> str:
    return f"nothing left to move for {first.name}" if first else "no node over tolerance to move"
