"""Localisation's record typed (issue 47): :class:`~pipeline.core.check_results.Localization` and its
:class:`~pipeline.core.check_results.NodeError` rows are made where the graphs are compared
(:mod:`pipeline.runtime.localize`), written once by their own serialiser in verify.json's old shape, and read back
typed and bounded (:func:`pipeline.core.verify_rows.localization_of`); no module reads them by key."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

from conftest import ROOT
from pipeline.core import verify_rows
from pipeline.core.check_results import Localization, NodeError
from pipeline.core.errors import InputError
from pipeline.precision import gate as criteria
from pipeline.reports import verify_report

PACKAGE = ROOT / "pipeline"
HOMES = {PACKAGE / "core" / "check_results.py", PACKAGE / "core" / "verify_rows.py"}
# Keys only a localisation has (its rows' "name" and "worst" are too common a word to own), and verify.json's keys
# of the sections that hold it.
KEYS = {"first_divergent", "compared_nodes", "fp32_min", "fp32_max", "localization"}


def _is_localization_key(key: object) -> bool:
    return isinstance(key, str) and (key in KEYS or key.endswith("_localization"))


def localization_key_reads(path: Path) -> list[str]:
    """``x["key"]`` and ``x.get("key")`` with a localisation's key, anywhere in ``path``."""
    hits = []
    for node in ast.walk(ast.parse(path.read_text())):
        key = None
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            key = node.slice.value
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
              and node.args and isinstance(node.args[0], ast.Constant)):
            key = node.args[0].value
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
                    "def d(loc):\n    return loc.first_divergent.name, {'a': 1}['a']\n")
    assert localization_key_reads(path) == [
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
    written = verify_report._clean({"int8_localization": loc})
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
