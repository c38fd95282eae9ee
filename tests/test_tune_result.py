"""tune's payload as types (:mod:`pipeline.precision.tune_result`): made where tune decides, written by one serialiser
in the shape earlier releases wrote (key for key, in order), read back once, typed and bounded, and read by attribute
everywhere else (an AST check, with its self-test)."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from conftest import ROOT
from pipeline.core.errors import InputError
from pipeline.precision import tune_result

PACKAGE = ROOT / "pipeline"
HOME = PACKAGE / "precision" / "tune_result.py"  # the serialiser: the only module that may read a part by its key
WRITTEN = ROOT / "tests" / "data" / "tune.json"  # written by tune before its payload was typed (issue 47)
TYPES = {"TuneResult", "MixRow", "ChosenRow", "GateNumbers", "RatioRow", "SensitivityRow", "Sanity", "SanityCheck",
         "VerdictImages", "HeldOutConfirmation", "Rung", "Ladder", "Samples", "Timing", "Fp32"}
SOURCES = {"result_of", "speed_sanity", "held_out_confirmation", "with_held_out"}  # calls that return typed parts
PARTS = {"chosen", "candidates", "greedy", "sensitivity", "all_low", "result", "alone", "all_but", "search",
         "held_out", "held_out_confirmation", "sanity", "checks", "ratios", "time_vs_fp32",
         "speedup_interval_vs_fp32", "ladder", "rungs", "samples", "timing", "fp32"}  # typed attributes of a part


# What every tune.json holds (a test of one rule overrides what it is about).
MINIMAL = {"model": "m", "raised": "out of INT8", "target": "OpenVINO CPU", "speed_not_measured": None, "cpu": "cpu",
           "batches": [1, 8], "samples": {"sensitivity": 4, "gate": 8}, "timing": {"statistic": "interleaved"},
           "fp32": {"latency_ms": {}}, "sensitivity": {}, "candidates": [], "chosen": None, "speedup_vs_fp32": {},
           "seconds": {}, "summary": ""}


def made(**fields) -> tune_result.TuneResult:
    """A tune result with ``fields`` and otherwise :data:`MINIMAL`, read as the report reads tune.json."""
    return tune_result.result_of({**MINIMAL, **fields})


# --------------------------------------------------------------------------- the AST check


def _names_a_type(node: ast.AST | None) -> bool:
    return node is not None and any((isinstance(n, ast.Name) and n.id in TYPES)
                                    or (isinstance(n, ast.Attribute) and n.attr in TYPES) for n in ast.walk(node))


def _typed_functions(tree: ast.AST) -> set[str]:
    return {fn.name for fn in ast.walk(tree) if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
            and _names_a_type(fn.returns)}


def _gives_parts(node: ast.AST, names: set[str], makers: set[str]) -> bool:
    """Whether ``node``'s value is a typed part or holds parts: a name known to, an item of one, a typed attribute
    of one, a comprehension or ``next``/``min``... of parts, or a call of a function typed to return one."""
    def go(n: ast.AST) -> bool:
        return _gives_parts(n, names, makers)

    if isinstance(node, ast.Name):
        return node.id in names
    if isinstance(node, ast.Subscript):
        return go(node.value)
    if isinstance(node, ast.Attribute):
        return node.attr in PARTS and go(node.value)
    if isinstance(node, (ast.Tuple, ast.List)):
        return any(go(e) for e in node.elts)
    if isinstance(node, (ast.ListComp, ast.GeneratorExp, ast.SetComp)):
        return go(node.elt)
    if isinstance(node, ast.IfExp):
        return go(node.body) or go(node.orelse)
    if isinstance(node, ast.BoolOp):
        return any(go(v) for v in node.values)
    if isinstance(node, ast.Call):
        f = node.func
        called = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
        if called in SOURCES | makers or (isinstance(f, ast.Attribute) and f.attr in TYPES):
            return True
        if isinstance(f, ast.Attribute) and f.attr in ("items", "values", "model_copy", "failed"):
            return go(f.value)
        return called in ("min", "max", "sorted", "next", "list", "tuple", "reversed") and any(go(a) for a in node.args)
    return False


def _part_names(fn: ast.AST, makers: set[str]) -> set[str]:
    args = fn.args
    names = {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs] if _names_a_type(a.annotation)}
    while True:
        before = len(names)
        for node in ast.walk(fn):
            if isinstance(node, ast.AnnAssign) and _names_a_type(node.annotation):
                names |= {n.id for n in ast.walk(node.target) if isinstance(n, ast.Name)}
            elif isinstance(node, (ast.For, ast.comprehension)) and _gives_parts(node.iter, names, makers):
                names |= {n.id for n in ast.walk(node.target) if isinstance(n, ast.Name)}
            elif isinstance(node, ast.Assign) and _gives_parts(node.value, names, makers):
                names |= {n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        if len(names) == before:
            return names


def key_reads(path: Path) -> list[str]:
    """``part["key"]`` and ``part.get("key")`` on a name that holds a part of a tune result, in every function."""
    hits = []
    tree = ast.parse(path.read_text())
    makers = _typed_functions(tree)
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        names = _part_names(fn, makers)
        for node in ast.walk(fn):
            on, key = None, None
            if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
                on, key = node.value, node.slice.value
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
                  and node.args and isinstance(node.args[0], ast.Constant)):
                on, key = node.func.value, node.args[0].value
            if isinstance(key, str) and isinstance(on, ast.Name) and on.id in names:
                hits.append(f"{path.relative_to(path.parents[1])}:{node.lineno}: {ast.unparse(node)}")
    return sorted(set(hits))


def test_no_part_of_a_tune_result_is_read_by_its_key_outside_its_serialiser():
    files = [p for p in sorted(PACKAGE.rglob("*.py")) if p != HOME]
    assert [hit for p in files for hit in key_reads(p)] == []


def test_the_check_finds_a_key_read_and_follows_the_parts(tmp_path):
    path = tmp_path / "pkg" / "m.py"
    path.parent.mkdir()
    path.write_text(
        "def a(p: TuneResult):\n    return p['summary']\n"
        "def b(p: TuneResult):\n    return [c.get('origin') for c in p.candidates]\n"
        "def c(payload: dict):\n    held = result_of(payload).held_out_confirmation\n    held['ran']\n"
        "def d(p: TuneResult):\n    for r in p.ladder.rungs:\n        r['why_not']\n"
        "def e(p: dict):\n    return p['summary']\n"  # a dict: not followed
        "def f(p: TuneResult):\n    return p.chosen.why, p.seconds.get('total'), {'a': 1}['a']\n")
    assert key_reads(path) == ["pkg/m.py:10: r['why_not']", "pkg/m.py:2: p['summary']",
                               "pkg/m.py:4: c.get('origin')", "pkg/m.py:7: held['ran']"]


def test_the_check_covers_the_readers_it_claims_to():
    """tune and its report type the payload: the check sees parts in each (none to follow in a module of dicts)."""
    for name, least in (("tune.py", 3), ("reports/tune_report.py", 10)):
        tree = ast.parse((PACKAGE / name).read_text())
        typed = [fn.name for fn in ast.walk(tree)
                 if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and _part_names(fn, _typed_functions(tree))]
        assert len(typed) >= least, name


# --------------------------------------------------------------------------- the file: its shape and its reader


def test_a_tune_json_written_before_the_types_is_read_and_written_back_byte_for_byte():
    """The serialisers write every key of the file tune wrote before its payload was typed, in the same order, with
    the same values (an int stays an int): the file's text is the same."""
    text = WRITTEN.read_text()
    result = tune_result.read(WRITTEN)
    assert json.dumps(result.to_json(), indent=2) + "\n" == text
    assert result.chosen is not None and result.chosen.result.status == "passed"
    assert result.greedy is not None and result.greedy.origin == "greedy fallback"
    assert result.held_out_confirmation is not None and result.held_out_confirmation.ran
    assert result.ladder is not None and [r.rung for r in result.ladder.rungs][-1] == "QAT"


def test_a_payload_is_written_in_the_order_it_was_made():
    untimed = made(sanity={}, candidates=[{"origin": "top-1", "result": {
        "status": "passed", "candidates": {"int8_exact": "passed"}, "greedy_rounds": 0}}])
    out = untimed.to_json()
    assert out["sanity"] == {} and untimed.sanity is None
    assert list(out["candidates"][0]["result"]) == ["status", "candidates", "greedy_rounds"]
    assert "held_out_confirmation" not in out and "ladder" not in out and "stability" not in out


@pytest.mark.parametrize("damage", [{"candidates": "all of them"}, {"batches": [1, "8"]}, {"summary": None},
                                    {"chosen": {"runtime": {"/a/Conv": 8}}}, {"sanity": {"checks": [{"pair": 1}]}},
                                    {"candidates": [{"origin": "x"}] * (tune_result.MAX_ROWS + 1)}])
def test_a_damaged_tune_json_is_one_input_error(tmp_path, damage):
    """A wrong type, a list too long or a key the report reads missing: one line, exit 2 (never a blank report)."""
    path = tmp_path / "tune.json"
    path.write_text(json.dumps({**json.loads(WRITTEN.read_text()), **damage}))
    with pytest.raises(InputError, match="tune.json: not a valid tune report"):
        tune_result.read(path)


@pytest.mark.parametrize("key", ["summary", "candidates", "chosen", "timing", "batches"])
def test_a_tune_json_without_a_key_the_report_reads_is_one_input_error(tmp_path, key):
    payload = json.loads(WRITTEN.read_text())
    del payload[key]
    path = tmp_path / "tune.json"
    path.write_text(json.dumps(payload))
    with pytest.raises(InputError, match=f"{key}: field required"):
        tune_result.read(path)
