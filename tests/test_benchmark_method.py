"""benchmark.json's method, environment and row choice typed (issue 47): :class:`BenchmarkMethod`,
:class:`BenchmarkEnvironment` and :class:`RowChoice` (pipeline.core.benchmark_rows) are made by benchmark, written by
their own ``to_json`` in the old shape, read back typed through ``facts_of`` (a :class:`Facts`); no reader of the
payload reads them by key."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from conftest import ROOT
from pipeline.core import benchmark_rows
from pipeline.core.benchmark_rows import BenchmarkEnvironment, BenchmarkMethod, RowChoice
from pipeline.core.errors import InputError

PACKAGE = ROOT / "pipeline"
RELEASE = ROOT / "tests" / "data" / "release_0.1.0" / "run" / "benchmark.json"
HOME = PACKAGE / "core" / "benchmark_rows.py"
KEYS = ({"method", "environment", "rows"} | set(BenchmarkMethod.model_fields) | set(BenchmarkEnvironment.model_fields)
        | set(RowChoice.model_fields))


def _reads_the_payload(fn: ast.AST) -> bool:
    """A function that reads a benchmark payload: it types it (``rows_of``, ``facts_of``, ``benchmark_rows.read``)."""
    return any(isinstance(n, ast.Call) and (
        (isinstance(n.func, ast.Name) and n.func.id in ("rows_of", "facts_of"))
        or (isinstance(n.func, ast.Attribute) and n.func.attr in ("rows_of", "facts_of", "read")
            and isinstance(n.func.value, ast.Name) and n.func.value.id == "benchmark_rows")) for n in ast.walk(fn))


def method_key_reads(path: Path) -> list[str]:
    """In each function of ``path`` that reads a benchmark payload, ``x["key"]`` / ``x.get("key")`` with a key of
    the payload's method, environment or row choice."""
    hits = []
    for fn in ast.walk(ast.parse(path.read_text())):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) or not _reads_the_payload(fn):
            continue
        for node in ast.walk(fn):
            key = None
            if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
                key = node.slice.value
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
                  and node.args and isinstance(node.args[0], ast.Constant)):
                key = node.args[0].value
            if key in KEYS:
                hits.append(f"{path.relative_to(path.parents[1])}:{node.lineno}: {ast.unparse(node)}")
    return sorted(set(hits))


def test_no_benchmark_method_or_environment_is_read_by_its_key():
    files = [p for p in sorted(PACKAGE.rglob("*.py")) if p != HOME]
    assert [hit for p in files for hit in method_key_reads(p)] == []


def test_the_method_check_finds_a_key_read(tmp_path):
    path = tmp_path / "pkg" / "m.py"
    path.parent.mkdir()
    path.write_text("def a(payload):\n    typed = rows_of(payload)\n    return payload['method']['trials']\n"
                    "def b(path):\n    rows = benchmark_rows.read(path)\n    env = {}\n    return env.get('cpu')\n"
                    "def c(m):\n    return m['trials']\n"  # reads no benchmark payload: not followed
                    "def d(payload):\n    return rows_of(payload).method.trials, {'a': 1}['a']\n")
    assert method_key_reads(path) == ["pkg/m.py:3: payload['method']", "pkg/m.py:3: payload['method']['trials']",
                                      "pkg/m.py:7: env.get('cpu')"]


def test_the_check_covers_the_report_and_benchmark():
    """benchmark_section (the reader of the method and environment) types the payload: the check looks inside it."""
    tree = ast.parse((PACKAGE / "reports" / "tables.py").read_text())
    section = next(fn for fn in ast.walk(tree) if isinstance(fn, ast.FunctionDef) and fn.name == "benchmark_section")
    assert _reads_the_payload(section)


def test_release_0_1_0s_method_and_environment_read_back_and_written_the_same():
    payload = json.loads(RELEASE.read_text())
    typed = benchmark_rows.facts_of(payload)
    assert typed.method.to_json() == payload["method"] and list(typed.method.to_json()) == list(payload["method"])
    assert typed.environment.to_json() == payload["environment"]
    assert list(typed.environment.to_json()) == list(payload["environment"])
    assert typed.method.trials == 3 and typed.environment.threads == 1 and typed.environment.gpu is None
    assert typed.rows.throughput_batches == [2] and typed.rows.left_out == []


def test_what_benchmark_writes_of_the_environment_keeps_collects_keys_in_order():
    from pipeline.core import env

    facts = {**env.collect(), "gpu": {"name": "H100", "compute_capability": "9.0", "memory_gib": 79.1, "cuda": "12.8",
                                      "cudnn": 91000, "driver": None}}
    written = BenchmarkEnvironment(**facts, threads=2).to_json()
    assert written == {**facts, "threads": 2} and list(written) == [*facts, "threads"]
    assert BenchmarkMethod(warmup_s=1, trials=3).to_json() == {"warmup_s": 1, "trials": 3}  # 1 stays 1


@pytest.mark.parametrize("part, damage", [("method", {"trials": "three"}), ("environment", {"cpu_cores": "2"}),
                                          ("environment", {"gpu": "H100"}), ("rows", {"left_out": "torch_fp32"})])
def test_a_damaged_method_or_environment_is_one_input_error(part, damage):
    from pipeline.reports import tables

    payload = json.loads(RELEASE.read_text())
    payload[part] = {**payload[part], **damage}
    with pytest.raises(InputError, match="benchmark report"):
        tables.benchmark_section(payload)
