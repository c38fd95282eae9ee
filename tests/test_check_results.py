"""The gate's own numbers as types (:mod:`pipeline.core.check_results`): made by the gate where it measures, written
by one serialiser each in the shape earlier releases wrote, read back typed through verify.json's rows, and read by
attribute everywhere else. The AST check here fails on a ``["key"]`` or ``.get("key")`` on one of them outside its
serialiser."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from conftest import ROOT
from pipeline.core import verify_rows
from pipeline.core.check_results import (
    BatchSizeRow,
    Bound,
    ClaimCheck,
    Judgement,
    RowsCheck,
    TaskCheck,
    TensorCheck,
)
from pipeline.core.errors import InputError

PACKAGE = ROOT / "pipeline"
RELEASE = ROOT / "tests" / "data" / "release_0.1.0" / "run" / "verify.json"
HOME = PACKAGE / "core" / "check_results.py"  # the serialisers: the only module that may read one by its key
TYPES = {"TensorCheck", "TaskCheck", "Bound", "Judgement", "BatchSizeRow", "Arrangement", "RowsCheck", "ClaimCheck",
         "Conformance", "CandidateResult"}
# What holds one: these attributes of a check, a row or a judgement, and these calls (the gate's makers).
ATTRIBUTES = {"tensor_check", "task_check", "agreement", "drop", "judgement", "conformance", "rows", "precision",
              "worst", "batch_sizes", "arrangements"}
MAKERS = {"judge", "compare", "tensor_check", "scaled_check", "absolute_check", "task_check", "agreement_check",
          "accuracy_drop_check", "map_drop_check", "matched_check", "row_result", "precision_result",
          "candidate_rows", "BatchSizeRow", "RowsCheck", "ClaimCheck", "Conformance", "CandidateResult", "crashed"}


# --------------------------------------------------------------------------- the AST check


def _names_a_type(node: ast.AST | None) -> bool:
    return node is not None and any(
        (isinstance(n, ast.Name) and n.id in TYPES) or (isinstance(n, ast.Attribute) and n.attr in TYPES)
        for n in ast.walk(node))


def _gives_check(node: ast.AST, held: set[str]) -> bool:
    """Whether ``node``'s value is one of the types: a name that holds one, an attribute that is one, a maker's call,
    or either side of a conditional or ``and``/``or``."""
    if isinstance(node, ast.Name):
        return node.id in held
    if isinstance(node, ast.Attribute):
        return node.attr in ATTRIBUTES
    if isinstance(node, ast.Call):
        f = node.func
        name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
        return name in MAKERS or (name == "model_copy" and _gives_check(f.value, held))
    if isinstance(node, ast.IfExp):
        return _gives_check(node.body, held) or _gives_check(node.orelse, held)
    if isinstance(node, ast.BoolOp):
        return any(_gives_check(v, held) for v in node.values)
    return False


def _held(fn: ast.AST) -> set[str]:
    """The names that hold one in a function: typed parameters and annotations, and what is assigned from one
    (``t, k = j.tensor_check, j.task_check`` binds both), followed until nothing new is found."""
    args = fn.args
    held = {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs] if _names_a_type(a.annotation)}
    while True:
        before = len(held)
        for node in ast.walk(fn):
            if isinstance(node, ast.AnnAssign) and _names_a_type(node.annotation) and isinstance(node.target, ast.Name):
                held.add(node.target.id)
            elif isinstance(node, (ast.For, ast.comprehension)) and _gives_check(node.iter, held):
                held |= {n.id for n in ast.walk(node.target) if isinstance(n, ast.Name)}
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    both = isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple)
                    pairs = zip(target.elts, node.value.elts, strict=False) if both else [(target, node.value)]
                    held |= {t.id for t, v in pairs if isinstance(t, ast.Name) and _gives_check(v, held)}
        if len(held) == before:
            return held


def check_key_reads(path: Path) -> list[str]:
    """``x["key"]`` and ``x.get("key")`` where ``x`` is a tensor check, task check, bound or judgement."""
    hits = []
    for fn in ast.walk(ast.parse(path.read_text())):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        held = _held(fn)
        for node in ast.walk(fn):
            on, key = None, None
            if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
                on, key = node.value, node.slice.value
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
                  and node.args and isinstance(node.args[0], ast.Constant)):
                on, key = node.func.value, node.args[0].value
            if isinstance(key, str) and _gives_check(on, held):
                hits.append(f"{path.relative_to(path.parents[1])}:{node.lineno}: {ast.unparse(node)}")
    return sorted(set(hits))


def test_no_tensor_or_task_check_is_read_by_its_key_outside_its_serialiser():
    files = [p for p in sorted(PACKAGE.rglob("*.py")) if p != HOME]
    assert [hit for p in files for hit in check_key_reads(p)] == []


def test_the_check_finds_a_key_read_on_a_check_and_leaves_dicts(tmp_path):
    path = tmp_path / "pkg" / "m.py"
    path.parent.mkdir()
    path.write_text(
        "def a(t: TensorCheck):\n    return t['passed']\n"
        "def b(chk):\n    return chk.tensor_check.get('scale')\n"
        "def c(x):\n    result = criteria.judge(x)\n    return result['status']\n"
        "def d(row):\n    t, n = row.tensor_check, row.name\n    return t['criterion'], n['first']\n"
        "def e(k: TaskCheck):\n    a = k.agreement\n    return a['value'], k.agreement.value\n"
        "def f(payload: dict):\n    return payload['tensor_check'], {'a': 1}['a']\n"  # a raw dict: not followed
        "def g(c):\n    return [r['status'] for r in c.batch_sizes or []]\n")
    assert check_key_reads(path) == ["pkg/m.py:10: t['criterion']", "pkg/m.py:13: a['value']",
                                     "pkg/m.py:17: r['status']", "pkg/m.py:2: t['passed']",
                                     "pkg/m.py:4: chk.tensor_check.get('scale')", "pkg/m.py:7: result['status']"]


def test_the_check_covers_the_readers_it_claims_to():
    """The modules that read the gate's numbers hold them typed: the check sees one in each."""
    for name in ("reports/verify_report.py", "reports/tables.py", "evaluation/batching.py",
                 "evaluation/candidates.py", "evaluation/served.py", "precision/sensitivity.py"):
        tree = ast.parse((PACKAGE / name).read_text())
        fns = [fn for fn in ast.walk(tree) if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))]
        assert any(_held(fn) or any(isinstance(n, ast.Attribute) and n.attr in ATTRIBUTES for n in ast.walk(fn))
                   for fn in fns), name


# --------------------------------------------------------------------------- one serialiser, the old shape


def test_release_0_1_0_checks_read_typed_and_write_back_in_the_same_shape():
    payload = json.loads(RELEASE.read_text())
    for old, row in zip(payload["candidates"], verify_rows.read(RELEASE).candidates, strict=True):
        for key, typed in (("tensor_check", row.tensor_check), ("task_check", row.task_check)):
            if old.get(key) is None:
                assert typed is None
                continue
            assert isinstance(typed, (TensorCheck, TaskCheck))
            written = typed.to_json()
            assert written == old[key] and list(written) == list(old[key])
        if row.task_check is not None:
            assert isinstance(row.task_check.agreement, Bound) and row.task_check.agreement.status == "passed"
        assert json.dumps(json.loads(json.dumps(row.to_json()))) == json.dumps(old)  # every key, nested, in order
        assert all(isinstance(r, BatchSizeRow) for r in row.batch_sizes or [])
        if row.conformance is not None and row.conformance.rows is not None:
            assert isinstance(row.conformance.rows, RowsCheck) and isinstance(row.conformance.precision, ClaimCheck)


def test_an_absolute_check_and_a_detectors_task_check_keep_their_own_order():
    absolute = TensorCheck(passed=False, criterion="absolute", statistic="elemwise", batches=2, failed_batches=[1],
                           nonfinite=0, mismatch_fraction=0.25, max_abs_error=0.5)
    assert list(absolute.to_json()) == ["passed", "criterion", "statistic", "batches", "failed_batches", "nonfinite",
                                        "mismatch_fraction", "max_abs_error"]
    bound = Bound(status="passed", value=0.0, lower_bound=0.0, threshold=0.1, resamples=5, more_images=0)
    boxes = TaskCheck(status="passed", passed=True, task="detection", samples=3, confidence=0.95, matched_share=1.0,
                      map_drop=0.0, agreement=bound, drop=bound, top1_agreement=1.0, accuracy=0.5,
                      reference_accuracy=0.5, accuracy_drop=0.0, more_images=0)
    assert list(boxes.to_json()) == ["status", "passed", "task", "samples", "confidence", "matched_share", "map_drop",
                                     "agreement", "drop", "top1_agreement", "accuracy", "reference_accuracy",
                                     "accuracy_drop", "more_images"]
    assert list(bound.to_json()) == ["status", "value", "lower_bound", "threshold", "resamples", "more_images"]
    judged = Judgement(absolute, boxes, "failed")
    assert not judged.passed


@pytest.mark.parametrize("damage", [{"passed": "yes"}, {"criterion": 3}, {"failed_batches": "1"},
                                    {"scaled_error": "big"}])
def test_a_damaged_tensor_check_is_one_input_error(tmp_path, damage):
    payload = json.loads(RELEASE.read_text())
    first = payload["candidates"][0]
    payload["candidates"][0] = {**first, "tensor_check": {**first["tensor_check"], **damage}}
    path = tmp_path / "verify.json"
    path.write_text(json.dumps(payload))
    with pytest.raises(InputError, match="verify report"):
        verify_rows.read(path)
