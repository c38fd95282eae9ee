"""Localisation's and the fallback's records typed (issue 47): :class:`~pipeline.core.check_results.Localization`
and its :class:`~pipeline.core.check_results.NodeError` rows are made where the graphs are compared
(:mod:`pipeline.runtime.profiling.localize`), :class:`~pipeline.core.fallback_result.FallbackResult` by
:func:`pipeline.precision.fallback.run`; each is written once by its own serialiser in verify.json's old shape and read
back typed and bounded (:func:`pipeline.core.verify_rows.localization_of`, ``fallback_of``); no module reads them by
key."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

from conftest import ROOT
from pipeline.core import fallback_result, verify_rows
from pipeline.core.check_results import Localization, NodeError
from pipeline.core.errors import InputError
from pipeline.core.fallback_result import FallbackResult, RaisedNodes
from pipeline.precision import gate as criteria

PACKAGE = ROOT / "pipeline"
HOMES = {PACKAGE / "core" / name for name in ("check_results.py", "verify_rows.py", "fallback_result.py")}
# Keys only a localisation or a fallback has (a localisation row's "name", "worst", a round's "iterations" are too
# common a word to own), and verify.json's keys of the sections that hold them; an f-string key by how it ends.
KEYS = {"first_divergent", "compared_nodes", "fp32_min", "fp32_max", "localization", "fallback", "raised",
        "out_of_low", "moved_to_fp32", "kept_in_fp32", "earlier_run", "replaced"}
ENDS = ("_localization", "_fallback", "_fraction_before", "_fraction_after")


def _key(node: ast.AST) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):  # f"{p}_fraction_before": its text parts
        return "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
    return None


def _is_localization_key(key: str | None) -> bool:
    return key is not None and (key in KEYS or key.endswith(ENDS) or key.startswith("excluded_from_"))


def localization_key_reads(path: Path) -> list[str]:
    """``x["key"]`` and ``x.get("key")`` with a localisation's or a fallback's key, anywhere in ``path``."""
    hits = []
    for node in ast.walk(ast.parse(path.read_text())):
        key = None
        if isinstance(node, ast.Subscript):
            key = _key(node.slice)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
              and node.args):
            key = _key(node.args[0])
        if _is_localization_key(key):
            hits.append(f"{path.relative_to(path.parents[1])}:{node.lineno}: {ast.unparse(node)}")
    return sorted(hits)


def test_no_localization_is_read_by_its_key_outside_its_serialiser():
    files = [p for p in sorted(PACKAGE.rglob("*.py")) if p not in HOMES]
    assert [hit for p in files for hit in localization_key_reads(p)] == []


def test_the_localization_check_finds_a_key_read(tmp_path):
    path = tmp_path / "pkg" / "m.py"
    path.parent.mkdir()
    path.write_text("def a(loc):\n    return loc['first_divergent']['name']\n"
                    "def b(payload):\n    return payload.get('int8_localization'), payload.get('localization')\n"
                    "def c(row):\n    return row['fp32_max'], row.get('compared_nodes'), row['name']\n"
                    "def d(loc):\n    return loc.first_divergent.name, {'a': 1}['a']\n"
                    "def e(fb, p):\n"
                    "    return fb['raised']['fp32'], fb[f'{p}_fraction_after'], fb.get('int8_fallback')\n"
                    "def f(fb, p):\n    return fb.get(f'excluded_from_{p}', fb.get('moved_to_fp32')), fb.passed\n")
    assert localization_key_reads(path) == [
        "pkg/m.py:10: fb.get('int8_fallback')", "pkg/m.py:10: fb['raised']", "pkg/m.py:10: fb[f'{p}_fraction_after']",
        "pkg/m.py:12: fb.get('moved_to_fp32')", "pkg/m.py:12: fb.get(f'excluded_from_{p}', fb.get('moved_to_fp32'))",
        "pkg/m.py:2: loc['first_divergent']", "pkg/m.py:4: payload.get('int8_localization')",
        "pkg/m.py:4: payload.get('localization')", "pkg/m.py:6: row.get('compared_nodes')",
        "pkg/m.py:6: row['fp32_max']"]


def _row(name: str, rule: criteria.TensorRule) -> NodeError:
    ref = np.linspace(-1, 1, 16).reshape(2, 8)
    return NodeError(name=name, op_type="Add", tensor=f"{name}:0", **rule.errors(ref, ref + 0.3))


@pytest.mark.parametrize("criterion", ["scaled", "absolute"])
def test_a_localization_is_written_in_the_old_shape(criterion):
    rule = criteria.TensorRule(criterion, 0.1, 1e-3, 1e-3)
    row = _row("/Add", rule)
    stats = rule.errors(np.linspace(-1, 1, 16).reshape(2, 8), np.linspace(-1, 1, 16).reshape(2, 8) + 0.3)
    assert row.to_json() == {"name": "/Add", "op_type": "Add", "tensor": "/Add:0", **stats}
    assert list(row.to_json()) == ["name", "op_type", "tensor", *stats]
    loc = Localization(first_divergent=row, worst=[row], compared_nodes=3, tolerance=rule.describe()) \
        .with_method("m").model_copy(update={"candidate": "fp16_emulation"})
    assert loc.to_json() == {"first_divergent": row.to_json(), "worst": [row.to_json()], "compared_nodes": 3,
                             "tolerance": rule.describe(), "method": "m", "candidate": "fp16_emulation"}
    assert list(loc.to_json()) == ["first_divergent", "worst", "compared_nodes", "tolerance", "method", "candidate"]
    none = Localization(first_divergent=None, worst=[], compared_nodes=0, tolerance=rule.describe())
    assert none.to_json() == {"first_divergent": None, "worst": [], "compared_nodes": 0, "tolerance": rule.describe()}


def test_verify_json_holds_it_and_reads_it_back_typed():
    rule = criteria.TensorRule("scaled", 0.1, 0.0, 0.0)
    row = _row("/Add", rule).model_copy(update={"scaled_error": float("inf")})
    loc = Localization(first_divergent=row, worst=[row], compared_nodes=1, tolerance=rule.describe(), method="m")
    written = verify_rows.clean({"int8_localization": loc})
    assert written["int8_localization"]["worst"][0]["scaled_error"] == "inf"  # JSON has no inf
    back = verify_rows.localization_of(written, "int8_localization")
    assert back.first_divergent.name == "/Add" and back.worst[0].scaled_error == "inf"
    assert back.to_json() == written["int8_localization"]
    assert verify_rows.localization_of(written, "localization") is None  # did not run
    assert verify_rows.localization_of({"localization": None}, "localization") is None  # today's "did not run"


@pytest.mark.parametrize("damage", [{"first_divergent": "/Add"}, {"worst": {"name": "/Add"}},
                                    {"worst": [{"op_type": "Add"}]}, {"compared_nodes": "3"}])
def test_a_damaged_localization_is_one_input_error(damage):
    from pipeline.reports import tables

    payload = {"passed": False, "model": "m", "inputs": {"samples": 1, "source": "s"}, "candidates": [],
               "localization": {"method": "m", "first_divergent": None, "worst": [], **damage}}
    with pytest.raises(InputError, match="localisation"):
        tables.verify_sections(payload)


def _fallback(**kw) -> FallbackResult:
    return FallbackResult(passed=True, precision="int8", raised=RaisedNodes(out_of_low=["/a"], fp32=["/b"]),
                          iterations=[{"iteration": 1, "moved": ["/a"], "int8_fraction": 0.9}], fraction_before=1.0,
                          fraction_after=0.9, budget=3, replaced=["model.int8.onnx"], **kw)


def test_a_fallback_is_written_in_the_old_shape():
    fb = _fallback()
    today = {"passed": True, "precision": "int8", "raised": {"out_of_low": ["/a"], "fp32": ["/b"]},
             "iterations": [{"iteration": 1, "moved": ["/a"], "int8_fraction": 0.9}], "int8_fraction_before": 1.0,
             "int8_fraction_after": 0.9, "budget": 3, "replaced": ["model.int8.onnx"]}
    assert fb.to_json() == today and list(fb.to_json()) == list(today)
    excluded = fb.with_legacy("excluded").to_json()
    assert list(excluded) == [*today, "excluded_from_int8", "kept_in_fp32"]
    assert excluded["excluded_from_int8"] == ["/a"] and excluded["kept_in_fp32"] == ["/b"]
    assert fb.with_legacy("moved").to_json() == {**today, "moved_to_fp32": ["/b"]}
    carried = fb.with_legacy("moved").carried().to_json()
    assert carried == {**today, "replaced": [], "moved_to_fp32": ["/b"], "earlier_run": True}
    assert list(carried)[-2:] == ["moved_to_fp32", "earlier_run"]
    for written in (today, excluded, carried):  # read back, written again: the same
        assert fallback_result.from_json(written, "int8").to_json() == written


def test_pipeline_verify_2s_fallback_is_still_read():
    old = {"passed": True, "iterations": [{}, {}], "moved_to_fp32": ["/Sub", "/Add"], "fp16_fraction_before": 1.0,
           "fp16_fraction_after": 0.8}
    fb = verify_rows.fallback_of({"fallback": old}, "fallback", "fp16")
    assert fb.raised.fp32 == ["/Sub", "/Add"] and fb.raised.out_of_low == [] and fb.legacy == "moved"
    assert (fb.fraction_before, fb.fraction_after, len(fb.iterations)) == (1.0, 0.8, 2)
    int8 = fallback_result.from_json({"passed": False, "excluded_from_int8": ["/c"], "kept_in_fp32": []}, "int8")
    assert int8.raised.out_of_low == ["/c"] and int8.legacy == "excluded" and not int8.passed
    assert verify_rows.fallback_of({"fallback": None}, "fallback", "fp16") is None  # did not run


@pytest.mark.parametrize("damage", [{"passed": "yes"}, {"raised": ["/a"]}, {"raised": {"fp32": "/a"}},
                                    {"iterations": {}}, {"fp16_fraction_before": "most"}])
def test_a_damaged_fallback_is_one_input_error(damage):
    from pipeline.reports import tables

    payload = {"passed": False, "model": "m", "inputs": {"samples": 1, "source": "s"}, "candidates": [],
               "fallback": {"passed": True, "iterations": [], **damage}}
    with pytest.raises(InputError, match="fallback"):
        tables.verify_sections(payload)
