"""benchmark.json's rows as types (:mod:`pipeline.core.benchmark_rows`): made where benchmark measures, written by
one serialiser in the shape earlier releases wrote, read back once, and read by attribute everywhere else. The AST
check here covers verify.json's candidate rows too (:mod:`pipeline.core.verify_rows`, tests/test_verify_rows.py)."""

from __future__ import annotations

import ast
import json
import shutil
from pathlib import Path

import pytest

from conftest import ROOT, benchmark_row
from pipeline.core import benchmark_rows
from pipeline.core.benchmark_rows import BenchmarkRow, SkippedRow, TrtexecCheck
from pipeline.core.errors import InputError
from pipeline.core.timings import TimingKind

PACKAGE = ROOT / "pipeline"
RELEASE = ROOT / "tests" / "data" / "release_0.1.0" / "run" / "benchmark.json"
# The serialisers: the only modules that may read a row by its key.
HOMES = {PACKAGE / "core" / "benchmark_rows.py", PACKAGE / "core" / "verify_rows.py"}
ROW_TYPES = {"BenchmarkRow", "SkippedRow", "Rows", "Profile", "ProfileSummary", "Roofline", "RooflineRow",
             "CrossCheck", "CrossCheckRow", "TrtexecCheck", "CandidateRow", "VerifyReport"}
ROW_SOURCES = {"rows_of", "candidates_of"}  # calls that return typed rows (benchmark_rows.read, verify_rows.read too)
ROW_MODULES = {"benchmark_rows", "verify_rows"}


# --------------------------------------------------------------------------- the AST check


def _names_a_row_type(node: ast.AST | None) -> bool:
    return node is not None and any(
        (isinstance(n, ast.Name) and n.id in ROW_TYPES) or (isinstance(n, ast.Attribute) and n.attr in ROW_TYPES)
        for n in ast.walk(node))


def _row_functions(tree: ast.AST) -> set[str]:
    """The functions of a module whose return annotation names a row type (a call to one gives rows)."""
    return {fn.name for fn in ast.walk(tree) if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
            and _names_a_row_type(fn.returns)}


def _gives_rows(node: ast.AST, rows: set[str], makers: set[str] = frozenset()) -> bool:
    """Whether ``node``'s value is a row or holds rows: a name known to, an item or slice of one, its typed lists
    (``.results``), a comprehension of rows, ``min``/``sorted``/``next``... of rows, a copy of one, or a call of a
    function typed to return rows (``makers``, :data:`ROW_SOURCES`, ``benchmark_rows.read``)."""
    def go(n: ast.AST) -> bool:
        return _gives_rows(n, rows, makers)

    if isinstance(node, ast.Name):
        return node.id in rows
    if isinstance(node, ast.Subscript):
        return go(node.value)
    if isinstance(node, ast.Attribute):
        return node.attr in ("results", "skipped", "profiles", "summary", "roofline", "rows", "candidates") \
            and go(node.value)
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
        if isinstance(f, ast.Name):
            return f.id in ROW_SOURCES | makers or (
                f.id in ("min", "max", "sorted", "next", "list", "tuple", "reversed") and any(go(a) for a in node.args))
        if isinstance(f, ast.Attribute):
            return (f.attr in ROW_SOURCES | makers or (f.attr == "model_copy" and go(f.value))
                    or (f.attr in ("items", "values") and go(f.value))
                    or (f.attr == "read" and isinstance(f.value, ast.Name) and f.value.id in ROW_MODULES))
    return False


def _bound(target: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}


def _row_names(fn: ast.AST, makers: set[str] = frozenset()) -> set[str]:
    """The names that hold a benchmark row (or rows) in a function: its parameters typed with a row type, names
    annotated so, and what is bound from them (loops, comprehensions, assignments, a ``key=lambda`` over them),
    followed until nothing new is found."""
    args = fn.args
    rows = {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs] if _names_a_row_type(a.annotation)}
    while True:
        before = len(rows)
        for node in ast.walk(fn):
            if isinstance(node, ast.AnnAssign) and _names_a_row_type(node.annotation):
                rows |= _bound(node.target)
            elif isinstance(node, (ast.For, ast.comprehension)) and _gives_rows(node.iter, rows, makers):
                rows |= _bound(node.target)
            elif isinstance(node, ast.Assign) and _gives_rows(node.value, rows, makers):
                rows |= {n for t in node.targets if isinstance(t, (ast.Name, ast.Tuple)) for n in _bound(t)}
            elif isinstance(node, ast.Call) and any(_gives_rows(a, rows, makers) for a in node.args):
                rows |= {a.arg for k in node.keywords if isinstance(k.value, ast.Lambda) for a in k.value.args.args}
        if len(rows) == before:
            return rows


def row_key_reads(path: Path) -> list[str]:
    """``row["key"]`` and ``row.get("key")`` on a name that holds a benchmark row, in every function of ``path``."""
    hits = []
    tree = ast.parse(path.read_text())
    makers = _row_functions(tree)
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        rows = _row_names(fn, makers)
        for node in ast.walk(fn):
            on, key = None, None
            if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
                on, key = node.value, node.slice.value
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
                  and node.args and isinstance(node.args[0], ast.Constant)):
                on, key = node.func.value, node.args[0].value
            if isinstance(key, str) and isinstance(on, ast.Name) and on.id in rows:
                hits.append(f"{path.relative_to(path.parents[1])}:{node.lineno}: {ast.unparse(node)}")
    return sorted(set(hits))


def test_no_benchmark_or_candidate_row_is_read_by_its_key_outside_its_serialiser():
    """Scope: every function in pipeline/ whose rows are typed (a parameter, an annotation or a typed read names
    BenchmarkRow, SkippedRow, Rows, CandidateRow or VerifyReport), and what it binds from them. A raw dict that
    never passed through the types is not followed: that is what the raw-read check below keeps out. The rows'
    nested check objects (a candidate's ``tensor_check``) are dicts the report lays out."""
    files = [p for p in sorted(PACKAGE.rglob("*.py")) if p not in HOMES]
    assert [hit for p in files for hit in row_key_reads(p)] == []


def test_the_row_check_finds_a_key_read_and_follows_the_rows(tmp_path):
    path = tmp_path / "pkg" / "m.py"
    path.parent.mkdir()
    path.write_text(
        "def a(row: BenchmarkRow):\n    return row['latency_ms']\n"
        "def b(results: list[BenchmarkRow]):\n    return [r.get('vs_eager') for r in results]\n"
        "def c(payload: dict):\n    typed = rows_of(payload)\n    for r in typed.results:\n        r['backend']\n"
        "def d(results: list[BenchmarkRow]):\n    best = min(results, key=lambda r: r['x'])\n    return best['y']\n"
        "def e(results: list[dict]):\n    return [r['backend'] for r in results]\n"  # a dict: not followed
        "def f(row: BenchmarkRow):\n    return row.latency_ms.p50, {'a': 1}['a']\n")
    assert row_key_reads(path) == ["pkg/m.py:10: r['x']", "pkg/m.py:11: best['y']", "pkg/m.py:2: row['latency_ms']",
                                   "pkg/m.py:4: r.get('vs_eager')", "pkg/m.py:8: r['backend']"]


def test_the_row_check_covers_the_readers_it_claims_to():
    """The modules that read benchmark rows type them: the check sees rows in each (it would find nothing to follow
    in a module that went back to dicts)."""
    readers = ["benchmark.py", "deploy.py", "baseline.py", "compare.py", "reports/tables.py",
               "reports/profile_report.py", "runtime/speed/trtexec.py", "runtime/speed/benchmark_app.py",
               "runtime/profiling/layer_profile.py", "runtime/profiling/roofline.py", "reports/verify_report.py"]
    for name in readers:
        tree = ast.parse((PACKAGE / name).read_text())
        typed = [fn.name for fn in ast.walk(tree)
                 if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and _row_names(fn, _row_functions(tree))]
        assert typed, name


def test_benchmark_json_is_read_only_through_its_rows():
    """No module but the serialisers opens benchmark.json's rows or verify.json's candidates as raw JSON: the report
    hands the payload to the section builders, which type its rows (:func:`rows_of`, ``candidates_of``); deploy,
    baseline and compare call ``benchmark_rows.read`` / ``verify_rows.read``."""
    raw = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path in HOMES:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant)
                    and node.slice.value in ("results", "skipped", "profiles", "roofline", "candidates")
                    and isinstance(node.value, ast.Name)
                    and node.value.id in ("payload", "report")):
                raw.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {ast.unparse(node)}")
    assert raw == []


# --------------------------------------------------------------------------- one serialiser, the old shape


def test_release_0_1_0_rows_read_and_write_back_in_the_same_shape():
    """A benchmark.json written by release 0.1.0 (no timing_kind) reads as typed rows, each kind from its label,
    and the serialiser writes every key it had back, with the same values, in the same order, adding only the kind."""
    payload = json.loads(RELEASE.read_text())
    rows = benchmark_rows.read(RELEASE)
    assert len(rows.results) == len(payload["results"]) > 0
    for old, row in zip(payload["results"], rows.results, strict=True):
        assert row.timing_kind is TimingKind.CPU_CALL or row.timing_kind in TimingKind
        written = json.loads(json.dumps(row.to_json()))
        assert {k: v for k, v in written.items() if k != "timing_kind"} == old
        assert [k for k in written if k != "timing_kind"] == list(old)
    assert benchmark_rows.to_json(rows.skipped) == payload["skipped"]
    assert [p.to_json() for p in rows.profiles] == payload["profiles"] and rows.profiles  # the per-layer profiles too
    assert rows.roofline is not None and rows.roofline.to_json() == payload["roofline"]  # and the roofline
    assert rows.benchmark_app is not None and rows.benchmark_app.to_json() == payload["benchmark_app"]


def test_a_measured_row_is_written_with_the_keys_benchmark_always_wrote():
    row = benchmark_row("onnxrt_fp32", 4, 2.0, samples_ms=[2.0, 2.1], accuracy=0.5, vs_eager=1.5)
    written = row.to_json()
    assert list(written) == ["backend", "precision", "device", "batch_size", "timing", "timing_kind", "latency_ms",
                             "throughput_per_s", "iterations", "trials", "stop", "first_run_ms", "cv_warning",
                             "cuda_graphs", "verify", "note", "workaround", "samples_ms", "accuracy", "deployable",
                             "vs_eager"]  # trtexec only where it ran beside the row
    checked = row.model_copy(update={"trtexec": TrtexecCheck(metric="computeMs", p50=1.0, flag=False)}).to_json()
    assert checked["trtexec"] == {"metric": "computeMs", "p50": 1.0, "flag": False}
    assert list(checked)[-2:] == ["trtexec", "vs_eager"]  # where benchmark always wrote it
    assert BenchmarkRow.model_validate(json.loads(json.dumps(written))) == row  # read back: the same row
    error = SkippedRow(backend="onnxrt_fp32", batch_size=4, timing="wall-clock", timing_kind=TimingKind.CPU_CALL,
                       reason="error: boom")
    assert error.to_json() == {"backend": "onnxrt_fp32", "batch_size": 4, "timing": "wall-clock",
                               "timing_kind": "cpu_call", "reason": "error: boom"}
    assert SkippedRow(backend="x", reason="why").to_json() == {"backend": "x", "reason": "why"}


def test_rewording_a_label_changes_no_key():
    row = benchmark_row("openvino_int8", 8, 1.0, timing="wall-clock, synchronous CPU call")
    reworded = row.model_copy(update={"timing": "the host's clock around one blocking call"})
    assert row.key == reworded.key == ("openvino_int8", 8, TimingKind.CPU_CALL)


@pytest.mark.parametrize("damage", [{"batch_size": 0}, {"batch_size": "4"}, {"samples_ms": [0.0]},
                                    {"backend": "../etc"}, {"timing_kind": "stopwatch"}, {"latency_ms": {"p50": 1}},
                                    {"timing": "stopwatch", "timing_kind": None}])
def test_a_damaged_row_is_one_input_error(tmp_path, damage):
    payload = json.loads(RELEASE.read_text())
    payload["results"][0] = {**payload["results"][0], **damage}
    path = tmp_path / "benchmark.json"
    path.write_text(json.dumps(payload))
    with pytest.raises(InputError, match="benchmark"):
        benchmark_rows.read(path)


def test_the_report_reads_release_0_1_0s_benchmark(tmp_path):
    """The report's benchmark section from a release 0.1.0 file: typed rows, every backend shown."""
    from pipeline.reports import tables

    shutil.copy(RELEASE, tmp_path / "benchmark.json")
    payload = json.loads((tmp_path / "benchmark.json").read_text())
    text = tables.markdown([tables.benchmark_section(payload)])
    assert all(r["backend"] in text for r in payload["results"])


def test_a_cross_check_row_is_written_with_the_keys_it_was_made_with():
    """benchmark_app's rows (interleaved, one run beside ours, an error) keep their keys and order through the type."""
    from pipeline.core.benchmark_rows import CrossCheckRow
    from pipeline.runtime.speed import benchmark_app

    row = benchmark_row("openvino_int8", 1, 0.3)
    def app_run(p50_ms: float) -> benchmark_app.AppRun:
        return benchmark_app.AppRun(p50_ms=p50_ms, mean_ms=p50_ms, throughput_per_s=1000 / p50_ms, iterations=10,
                                    requests=1, api="sync", command="benchmark_app -m model.xml")

    made = [benchmark_app.interleaved(row, "latency", lambda: app_run(0.31), lambda: 0.3, rounds=3),
            benchmark_app.compare(row, "latency", app_run(0.9)),
            benchmark_app.compare(row, "latency", benchmark_app.AppFailed("benchmark_app did not finish"))]
    for got in made:
        written = CrossCheckRow.model_validate(json.loads(json.dumps(got))).to_json()
        assert written == json.loads(json.dumps(got)) and list(written) == list(got)
    assert CrossCheckRow.model_validate(made[1]).said == "far apart"  # 0.3 ms against 0.9 ms: flagged
