"""compare.json and baseline.json as types (:mod:`pipeline.core.compare_result`, :mod:`pipeline.core.bundle_schema`):
made where compare decides and where baseline writes, written by one serialiser in the shape earlier releases wrote,
read back by one bounded reader, and read by attribute everywhere else (the AST check here)."""

from __future__ import annotations

import ast
import json
import math
import shutil
from pathlib import Path

import pytest

from conftest import ROOT, cli
from pipeline.core import bundle_schema, compare_result
from pipeline.core.compare_result import CompareResult, DriftCheck
from pipeline.core.errors import InputError
from pipeline.core.run import RunDir
from pipeline.reports import compare_report

PACKAGE = ROOT / "pipeline"
RELEASE = ROOT / "tests" / "data" / "release_0.1.0"
# The serialisers: the only modules that may read compare's or the bundle's records by key.
HOMES = {PACKAGE / "core" / "compare_result.py", PACKAGE / "core" / "bundle_schema.py"}
TYPES = {"CompareResult", "ArtifactComparison", "ArtifactDrift", "Agreement", "AccuracyChange", "DriftCheck", "Flip",
         "ClassChange", "LatencyComparison", "LatencyCheck", "EnvChange", "BaselineRef", "Thresholds", "Meta",
         "Artifact", "LatencyRow", "BatchRow", "Environment", "Bundle"}
# A typed value's attributes that are typed values (or lists of them) too.
PARTS = {"artifacts", "latency", "meta", "environment", "baseline", "thresholds", "agreement", "accuracy", "drift",
         "flipped", "per_class", "batch_sizes"}
READERS = {"from_json", "read_meta"}  # calls that return a typed record (compare_result.read, bundles.read too)
READER_MODULES = {"compare_result", "bundles", "bundle_schema"}


# --------------------------------------------------------------------------- the AST check


def _names_a_type(node: ast.AST | None) -> bool:
    return node is not None and any((isinstance(n, ast.Name) and n.id in TYPES)
                                    or (isinstance(n, ast.Attribute) and n.attr in TYPES) for n in ast.walk(node))


def makers(files: list[Path]) -> set[str]:
    """Every function of the package whose return annotation names a record type: a call to one gives records."""
    return {fn.name for p in files for fn in ast.walk(ast.parse(p.read_text()))
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and _names_a_type(fn.returns)}


def _gives(node: ast.AST, typed: set[str], made: set[str]) -> bool:
    """Whether ``node``'s value is a record or holds records: a name known to, an item of one, its typed parts, a
    comprehension of them, or a call of a function typed to return them (or of a reader)."""
    def go(n: ast.AST) -> bool:
        return _gives(n, typed, made)

    if isinstance(node, ast.Name):
        return node.id in typed
    if isinstance(node, ast.Subscript):
        return go(node.value)
    if isinstance(node, ast.Attribute):
        return node.attr in PARTS and go(node.value)
    if isinstance(node, (ast.Tuple, ast.List)):
        return any(go(e) for e in node.elts)
    if isinstance(node, (ast.ListComp, ast.GeneratorExp)):
        return go(node.elt)
    if isinstance(node, (ast.IfExp, ast.BoolOp)):
        return any(go(v) for v in ([node.body, node.orelse] if isinstance(node, ast.IfExp) else node.values))
    if isinstance(node, ast.Call):
        f = node.func
        name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
        reader = (isinstance(f, ast.Attribute) and f.attr == "read" and isinstance(f.value, ast.Name)
                  and f.value.id in READER_MODULES)
        folds = name in ("next", "list", "sorted") and any(map(go, node.args))
        return name in made | READERS | TYPES or reader or folds
    return False


def _typed_names(fn: ast.AST, made: set[str]) -> set[str]:
    """The names that hold a record in a function: its parameters typed so, names annotated so, and what is bound
    from them (loops, comprehensions, assignments), followed until nothing new is found."""
    args = fn.args
    typed = {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs] if _names_a_type(a.annotation)}
    while True:
        before = len(typed)
        for node in ast.walk(fn):
            if isinstance(node, ast.AnnAssign) and _names_a_type(node.annotation):
                typed |= {n.id for n in ast.walk(node.target) if isinstance(n, ast.Name)}
            elif isinstance(node, (ast.For, ast.comprehension)) and _gives(node.iter, typed, made):
                typed |= {n.id for n in ast.walk(node.target) if isinstance(n, ast.Name)}
            elif isinstance(node, ast.Assign) and _gives(node.value, typed, made):
                typed |= {n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        if len(typed) == before:
            return typed


def key_reads(path: Path, made: set[str]) -> list[str]:
    """``x["key"]`` and ``x.get("key")`` on a name (or a typed part of one) that holds a record, in ``path``."""
    hits = []
    for fn in ast.walk(ast.parse(path.read_text())):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        typed = _typed_names(fn, made)
        for node in ast.walk(fn):
            on, key = None, None
            if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
                on, key = node.value, node.slice.value
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
                  and node.args and isinstance(node.args[0], ast.Constant)):
                on, key = node.func.value, node.args[0].value
            if isinstance(key, str) and on is not None and _gives(on, typed, made):
                hits.append(f"{path.relative_to(path.parents[1])}:{node.lineno}: {ast.unparse(node)}")
    return sorted(set(hits))


def test_no_compare_or_bundle_record_is_read_by_its_key_outside_its_serialiser():
    """Scope: every function in pipeline/ that holds compare's records or the bundle's (a parameter, an annotation,
    a typed function's result or a reader's names one), and what it binds from them. The model card inside the
    bundle (``meta.model_card``) and a run's own dicts (the card, the manifest) are not followed."""
    files = sorted(PACKAGE.rglob("*.py"))
    made = makers(files)
    assert [hit for p in files if p not in HOMES for hit in key_reads(p, made)] == []


def test_the_record_check_finds_a_key_read_and_follows_the_records(tmp_path):
    path = tmp_path / "pkg" / "m.py"
    path.parent.mkdir()
    path.write_text(
        "def a(result: CompareResult):\n    return result['passed']\n"
        "def b(result: CompareResult):\n    return [r.get('reason') for r in result.latency]\n"
        "def c(payload: dict):\n    typed = compare_result.from_json(payload)\n    return typed.baseline['path']\n"
        "def d(base):\n    meta = bundles.read(base).meta\n    return meta.artifacts[0]['name']\n"
        "def e(rows: list[dict]):\n    return [r['status'] for r in rows]\n"  # a dict: not followed
        "def f(x):\n    rows = drift_rows(x)\n    return rows[0]['ratio']\n"
        "def g(meta: Meta):\n    return meta.model_card['classes'], {'a': 1}['a']\n"  # the card is opaque here
        "def drift_rows(x) -> list[LatencyComparison]:\n    return x\n")
    assert key_reads(path, makers([path])) == [
        "pkg/m.py:10: meta.artifacts[0]['name']", "pkg/m.py:15: rows[0]['ratio']", "pkg/m.py:2: result['passed']",
        "pkg/m.py:4: r.get('reason')", "pkg/m.py:7: typed.baseline['path']"]


def test_the_record_check_sees_records_in_the_modules_that_read_them():
    """compare, its report, baseline and drift hold typed records: the check has something to follow in each (it
    would find nothing in a module that went back to dicts)."""
    files = sorted(PACKAGE.rglob("*.py"))
    made = makers(files)
    for name in ("compare.py", "baseline.py", "reports/compare_report.py", "evaluation/drift.py"):
        tree = ast.parse((PACKAGE / name).read_text())
        assert any(_typed_names(fn, made) for fn in ast.walk(tree)
                   if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))), name


# --------------------------------------------------------------------------- one serialiser, the old shape


@pytest.fixture(scope="module")
def compared(tmp_path_factory) -> Path:
    """The release 0.1.0 run compared with its own bundle (exit 0): its compare.json."""
    run = tmp_path_factory.mktemp("release") / "run"
    shutil.copytree(RELEASE / "run", run)
    assert cli("compare", "--run-dir", run, "--baseline", RELEASE / "bundle") == 0
    return run / "compare.json"


def test_compare_json_reads_back_and_writes_the_same_keys_values_and_order(compared):
    text = compared.read_text()
    result = compare_result.read(compared)
    assert result.passed and result.artifacts and result.latency
    assert json.dumps(json.loads(json.dumps(result.to_json(), default=str)), indent=2) + "\n" == text


def test_the_release_bundle_meta_writes_back_byte_for_byte():
    """baseline.json of release 0.1.0, read as :class:`bundle_schema.Meta` and written by its ``to_json``: the same
    keys, values and order (verify's batch rows keep theirs), apart from the kind each row now records."""
    path = RELEASE / "bundle" / "baseline.json"
    old = json.loads(path.read_text())
    written = json.loads(json.dumps(bundle_schema.read_meta(path, "w").to_json(), default=str))
    for row in written["latency"]:
        assert row.pop("timing_kind")
    assert json.dumps(written) == json.dumps(old)


def test_a_row_and_an_artifact_keep_compare_json_order_in_each_case(compared):
    result = compare_result.read(compared)
    judged = next(r for r in result.latency if r.baseline_samples is not None)
    assert list(judged.to_json()) == ["backend", "batch_size", "timing", "timing_kind", "baseline_p50_ms", "ratio",
                                      "ci_low", "ci_high", "status", "threshold", "run_p50_ms", "baseline_samples",
                                      "run_samples"]
    assert list(judged.with_reason("slower").to_json())[-1] == "reason"
    artifact = result.artifacts[0]
    assert list(artifact.to_json()) == ["name", "verdict", "batch_sizes", "status", "agreement", "accuracy", "drift",
                                        "flipped", "per_class"]
    missing = artifact.missing(artifact.name, None, None, "not verified here")
    assert missing.to_json() == {"name": artifact.name, "verdict": None, "batch_sizes": None, "status": "missing",
                                 "reason": "not verified here"}


def test_an_infinite_drift_is_written_as_a_string_and_read_back_as_infinite(compared, tmp_path):
    """A NaN logit is the largest drift there is: compare.json holds it as "inf" (JSON has no infinity)."""
    result = compare_result.read(compared)
    worst = DriftCheck(status="failed", value=math.inf, quantile=0.99, threshold=0.05, p50=0.0, p90=1.0,
                       p99=math.inf, max=math.inf)
    artifacts = [result.artifacts[0].model_copy(update={"drift": worst}), *result.artifacts[1:]]
    run = RunDir(tmp_path)
    compare_report.write_all(run, result.model_copy(update={"artifacts": artifacts}))
    assert '"value": "inf"' in (tmp_path / "compare.json").read_text()
    back = compare_result.read(tmp_path / "compare.json").artifacts[0].drift
    assert back is not None and back.value == math.inf and back.p50 == 0.0


# --------------------------------------------------------------------------- the bounded reader


@pytest.mark.parametrize("edit,problem", [
    (lambda p: p.pop("passed"), "passed"),
    (lambda p: p["artifacts"][0].update(status="great"), "status"),
    (lambda p: p["latency"][0].update(ratio="fast"), "ratio"),
    (lambda p: p["latency"][0].update(timing_kind="sundial"), "timing_kind"),
    (lambda p: p.update(artifacts=p["artifacts"] * 20), "artifacts"),
    (lambda p: p["artifacts"][0].update(extra=1), "extra"),
    (lambda p: p.update(inconclusive_policy="maybe"), "inconclusive_policy"),
])
def test_a_damaged_compare_json_is_one_input_error(compared, tmp_path, edit, problem):
    payload = json.loads(compared.read_text())
    edit(payload)
    with pytest.raises(InputError, match=problem) as caught:
        compare_result.from_json(payload)
    assert "\n" not in str(caught.value)


def test_the_report_refuses_a_damaged_compare_json_with_exit_2(compared, capsys):
    run = compared.parent
    text = compared.read_text()
    try:
        payload = json.loads(text)
        payload["latency"][0]["status"] = "sluggish"
        compared.write_text(json.dumps(payload))
        capsys.readouterr()
        assert cli("report", "--run-dir", run) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "compare.json" in err[0] and "status" in err[0], err
    finally:
        compared.write_text(text)


def test_a_compare_result_is_immutable(compared):
    result: CompareResult = compare_result.read(compared)
    with pytest.raises(Exception, match="frozen"):
        result.passed = False  # type: ignore[misc]
