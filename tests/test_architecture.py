"""The layout is the architecture: read from the imports (AST, every import including lazy ones), not from the docs.

Layers, lowest first: ``core`` < ``precision`` (and ``training``) < ``runtime`` < ``reports`` < ``evaluation`` < the
stage modules and the orchestration (``cli``, ``stages``, ``config``, ``doctor``, ``bench_train``). A module imports
only its own layer or lower ones; there is no import cycle; a stage module never imports another stage module;
no status string is written outside :mod:`pipeline.core.status`; and no backend's name is written outside the
backend table (:data:`BACKEND_NAME_HOMES` lists the exceptions and why).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from pipeline.core.status import Status

ROOT = Path(__file__).resolve().parents[1] / "pipeline"
LAYERS = {"core": 0, "precision": 1, "training": 1, "runtime": 2, "reports": 3, "evaluation": 4}
TOP = 5  # stage modules and orchestration
STAGE_MODULES = {"train", "export", "build", "tune", "verify", "benchmark", "compare", "report"}


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, root: Path = ROOT) -> set[str]:
    """Every ``pipeline`` module ``path`` imports, at top level or inside a function."""
    known = {module_name(p, root) for p in root.rglob("*.py")}
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("pipeline"):
            names = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in known else node.module
                     for a in node.names]
        found.update(n for n in names if n.startswith("pipeline") and n in known and n != "pipeline")
    return found


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    return {module_name(p, root): imports_of(p, root) for p in root.rglob("*.py")}


def layer(module: str) -> int:
    parts = module.split(".")
    return LAYERS.get(parts[1], TOP) if len(parts) > 1 else TOP


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component of more than one module (Tarjan), as sorted lists."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{m} -> {d}" for m, deps in graph.items() for d in deps if layer(d) > layer(m))


def stage_imports(graph: dict[str, set[str]]) -> list[str]:
    stages = {f"pipeline.{s}" for s in STAGE_MODULES}
    return sorted(f"{m} -> {d}" for m in stages & set(graph) for d in graph[m] if d in stages and d != m)


def test_no_import_cycle():
    assert cycles(import_graph()) == []


def test_every_module_imports_only_its_layer_or_lower_ones():
    graph = import_graph()
    assert {m.split(".")[1] for m in graph if m.count(".") >= 2} <= set(LAYERS), "a package without a layer"
    assert layer_violations(graph) == []


def test_no_stage_module_imports_another():
    assert stage_imports(import_graph()) == []


def test_the_checks_fail_on_the_shapes_they_forbid(tmp_path):
    """A cycle, a core module importing a stage, and a stage importing a stage: each is found."""
    pkg = tmp_path / "pipeline"
    (pkg / "core").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "core" / "__init__.py").write_text("")
    (pkg / "core" / "run.py").write_text("def f():\n    from pipeline import verify\n")  # lazy: still an import
    (pkg / "verify.py").write_text("from pipeline import export\n")
    (pkg / "export.py").write_text("from pipeline.core import run\nimport pipeline.verify\n")
    graph = import_graph(pkg)
    assert cycles(graph) == [["pipeline.core.run", "pipeline.export", "pipeline.verify"]]
    assert layer_violations(graph) == ["pipeline.core.run -> pipeline.verify"]
    assert stage_imports(graph) == ["pipeline.export -> pipeline.verify", "pipeline.verify -> pipeline.export"]


# --------------------------------------------------------------------------- statuses


def _field_names(tree: ast.AST) -> set[int]:
    """ids of the constants used as field names (dict keys, subscripts, ``.get("skipped")``), not as values."""
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            ids.update(id(k) for k in node.keys if k is not None)
        elif isinstance(node, ast.Subscript):
            ids.add(id(node.slice))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in ("get", "pop", "setdefault") and node.args):
            ids.add(id(node.args[0]))
        elif isinstance(node, ast.Compare) and isinstance(node.ops[0], (ast.In, ast.NotIn)):
            ids.add(id(node.left))  # "error" in row
    return ids


def status_literals(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    # "error" is also a JUnit element and a message key: a literal "error" is checked by eye, not here.
    fields, values = _field_names(tree), {str(s) for s in Status} - {"error"}
    return [f"{path.name}:{n.lineno}: {n.value!r}" for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and n.value in values and id(n) not in fields]


def test_no_status_string_outside_the_enum():
    found = [hit for p in sorted(ROOT.rglob("*.py")) if p.name != "status.py" for hit in status_literals(p)]
    assert found == []


def test_the_status_check_finds_a_literal_and_leaves_field_names(tmp_path):
    path = tmp_path / "m.py"
    path.write_text('x = {"skipped": 1}\ny = x["passed"]\nz = x.get("failed")\nw = "error" in x\nok = v == "passed"\n')
    assert status_literals(path) == ["m.py:5: 'passed'"]


@pytest.mark.parametrize("status", list(Status))
def test_a_status_is_its_json_string(status):
    import json

    assert json.dumps({"s": status}) == json.dumps({"s": str(status)}) and status == str(status)


# --------------------------------------------------------------------------- one precision protocol (issue 32)

# The precision plugs and the graph modules they are made of: the only places that may name a precision.
PLUG_MODULES = {"plugs.py", "fp16.py", "int8.py"}


def precision_branches(path: Path) -> list[str]:
    """Comparisons of something named "...precision..." with a lower precision's name (``precision == "int8"``,
    ``graph.precision in ("fp16", "int8")``): a branch that a precision's plug should carry as data."""
    from pipeline.precision import PRECISIONS

    def names(node) -> set[str]:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return {node.value} & set(PRECISIONS)
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return {v for e in node.elts for v in names(e)}
        return set()

    hits = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(names(s) for s in sides) and any("precision" in ast.unparse(s) for s in sides if not names(s)):
                hits.append(f"{path.parent.name}/{path.name}:{node.lineno}: {ast.unparse(node)}")
    return hits


def test_no_precision_is_named_in_a_branch_outside_its_plug():
    files = [p for p in sorted(ROOT.rglob("*.py")) if not (p.parent.name == "precision" and p.name in PLUG_MODULES)]
    assert [hit for p in files for hit in precision_branches(p)] == []


def test_the_precision_check_finds_a_branch_and_leaves_data(tmp_path):
    path = tmp_path / "m.py"
    path.write_text('a = plug.precision == "int8"\nb = precision in ("fp16", "bf16")\nc = {"int8": 1}["int8"]\n'
                    'd = hint == "bf16"\ne = x.precision == other\n')
    assert [h.split(": ", 1)[1] for h in precision_branches(path)] == ["plug.precision == 'int8'",
                                                                         "precision in ('fp16', 'bf16')"]


# --------------------------------------------------------------------------- one backend identity (issue 47)

# The modules that may write a backend's name as a literal, each with its reason; everything else reads the table's
# entries (a flag or a field of the entry, `backends.REFERENCE`, `by_name`).
BACKEND_NAME_HOMES = {
    "runtime/backends.py": "the backend table itself",
    "precision/plugs.py": "each plug names its faithful candidate (`faithful`): the precision layer sits below the "
                          "runtime's table, so it cannot read it; test_each_plugs_faithful_candidate_is_a_table_"
                          "emulation_of_its_graph holds the two together",
    "core/config_schema.py": "the default of deploy.serve_candidate: the schema is the bottom layer; deploy refuses a "
                             "serve_candidate it did not deploy",
}


def backend_names() -> set[str]:
    from pipeline.runtime import backends

    return {b.name for b in backends.TABLE} | {b.verify_name for b in backends.TABLE if b.verify_name} | \
        set(backends.RENAMED)


def backend_literals(path: Path, names: set[str]) -> list[str]:
    """Every string literal in ``path`` that is a backend's name (``"onnxrt_fp32"``), or an f-string that makes one
    from a family's prefix (``f"tensorrt_{p}"``)."""
    prefixes = {n.split("_", 1)[0] + "_" for n in names}
    hits = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and node.value in names:
            hits.append((node.lineno, repr(node.value)))
        elif isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant) and \
                node.values[0].value in prefixes:
            hits.append((node.lineno, ast.unparse(node)))
    return [f"{path.parent.name}/{path.name}:{line}: {text}" for line, text in sorted(hits)]


def test_no_backend_name_is_written_outside_the_backend_table():
    names = backend_names()
    files = [p for p in sorted(ROOT.rglob("*.py")) if p.relative_to(ROOT).as_posix() not in BACKEND_NAME_HOMES]
    assert [hit for p in files for hit in backend_literals(p, names)] == []
    assert all((ROOT / home).is_file() for home in BACKEND_NAME_HOMES)  # a moved module leaves no stale exemption


def test_the_backend_name_check_finds_a_literal_and_a_made_name(tmp_path):
    path = tmp_path / "m.py"
    path.write_text('a = c.name == "onnxrt_fp32"\nb = f"tensorrt_{p}"\nc = "onnxrt_fp32 is fine in prose"\n'
                    'd = f"{x}_fp32"\ne = "openvino"\n')
    assert [h.split(": ", 1)[1] for h in backend_literals(path, {"onnxrt_fp32", "tensorrt_fp16"})] == \
        ["'onnxrt_fp32'", "f'tensorrt_{p}'"]


def test_each_plugs_faithful_candidate_is_a_table_emulation_of_its_graph():
    from pipeline.precision import plugs
    from pipeline.runtime import backends

    for plug in plugs.PLUGS.values():
        entry = next(b for b in backends.TABLE if b.verify_name == plug.faithful)
        assert entry.graph == plug.name and not entry.deploys, plug.name


def precision_section_lookups(path: Path) -> list[str]:
    """``getattr(cfg.export, precision)`` and ``getattr(cfg.verify, name, ...)``: a precision's config section
    picked by a name in hand, which core/precision_config.py does once for everyone."""
    hits = []
    for node in ast.walk(ast.parse(path.read_text())):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
                and len(node.args) >= 2 and isinstance(node.args[0], ast.Attribute)
                and node.args[0].attr in ("export", "verify") and not isinstance(node.args[1], ast.Constant)):
            hits.append((node.lineno, ast.unparse(node)))
    return [f"{path.parent.name}/{path.name}:{line}: {text}" for line, text in sorted(hits)]


def test_a_precisions_config_section_is_picked_in_one_place():
    files = [p for p in sorted(ROOT.rglob("*.py")) if p.relative_to(ROOT).as_posix() != "core/precision_config.py"]
    assert [hit for p in files for hit in precision_section_lookups(p)] == []


def test_the_section_lookup_check_finds_a_lookup_by_name(tmp_path):
    path = tmp_path / "m.py"
    path.write_text('a = getattr(cfg.export, precision).enabled\nb = getattr(ctx.cfg.verify, p, cfg.verify.fp32)\n'
                    'c = getattr(cfg.export, "fp16")\nd = getattr(cfg.build, key)\n')
    assert [h.split(": ", 1)[1] for h in precision_section_lookups(path)] == [
        "getattr(cfg.export, precision)", "getattr(ctx.cfg.verify, p, cfg.verify.fp32)"]


# --------------------------------------------------------------------------- stages as values (issue 47)


def stage_name_branches(path: Path, names: set[str]) -> list[str]:
    """``importlib``/``import_module`` (a stage reached by a string) and every comparison with a stage's name
    (``name == "verify"``, ``stage.name in ("benchmark", "compare")``, ``"tune" not in force``) in ``path``."""
    def named(node) -> bool:
        if isinstance(node, ast.Constant):
            return node.value in names
        return isinstance(node, (ast.Tuple, ast.List, ast.Set)) and any(named(e) for e in node.elts)

    hits = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Compare) and any(named(side) for side in (node.left, *node.comparators)):
            hits.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, (ast.Import, ast.ImportFrom)) and any("importlib" in (a.name or "") or
                                                                     a.name == "import_module" for a in node.names):
            hits.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Attribute) and node.attr == "import_module":
            hits.append((node.lineno, ast.unparse(node)))
    return [f"{path.name}:{line}: {text}" for line, text in sorted(hits)]


def test_stages_py_reaches_no_stage_by_string_and_branches_on_no_stage_name():
    """The stage table holds each stage's callable, precheck, fingerprint parts and how it joins `all`: stages.py
    never imports a stage module by name nor asks which stage it is handling."""
    from pipeline.stages import STAGES

    assert stage_name_branches(ROOT / "stages.py", set(STAGES)) == []


def test_the_stage_branch_check_finds_imports_by_string_and_name_comparisons(tmp_path):
    path = tmp_path / "m.py"
    path.write_text('import importlib\na = importlib.import_module("pipeline.verify")\nb = name == "verify"\n'
                    'c = stage.name in ("benchmark", "compare")\nd = "tune" not in force\ne = STAGES["tune"]\n'
                    'f = stage.name in force\n')
    assert [h.split(": ", 1)[1] for h in stage_name_branches(path, {"verify", "benchmark", "compare", "tune"})] == [
        "import importlib", "importlib.import_module", "name == 'verify'", "stage.name in ('benchmark', 'compare')",
        "'tune' not in force"]


# --------------------------------------------------------------------------- typed contracts (issue 32)


def config_parameters(path: Path) -> list[str]:
    """Every parameter named ``cfg`` in ``path`` whose annotation is not the config (``Config``, also quoted or
    qualified: ``config_schema.Config``): ``cfg`` always means the whole validated config; a section is named for
    it (``data_cfg: DataConfig``)."""
    hits = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
                if arg.arg != "cfg":
                    continue
                annotation = arg.annotation
                text = annotation.value if isinstance(annotation, ast.Constant) else (
                    ast.unparse(annotation) if annotation is not None else "")
                if not isinstance(text, str) or text.split(".")[-1] != "Config":
                    hits.append(f"{path.parent.name}/{path.name}:{arg.lineno}: {node.name}(cfg: {text or '-'})")
    return hits


def test_every_cfg_parameter_is_typed_as_the_config():
    assert [hit for p in sorted(ROOT.rglob("*.py")) for hit in config_parameters(p)] == []


def test_the_config_parameter_check_finds_an_untyped_or_other_cfg(tmp_path):
    path = tmp_path / "m.py"
    path.write_text('def a(cfg): ...\ndef b(x, *, cfg: dict): ...\ndef c(cfg: Config): ...\n'
                    'def d(cfg: "Config"): ...\ndef e(cfg: config_schema.Config): ...\nf = lambda cfg: cfg\n'
                    'async def g(cfg: DataConfig): ...\n')
    assert [h.split(": ", 1)[1] for h in config_parameters(path)] == ["a(cfg: -)", "b(cfg: dict)", "g(cfg: DataConfig)"]


# ------------------------------------------------------------------------- typed records between the stages (issue 32)

CORE = ROOT / "core"


def details_reads(path: Path) -> list[str]:
    """Reads of a manifest entry's ``details`` dict: ``entry["details"]``, ``entry.get("details")``,
    ``"details" in entry``. A stage writes its own through ``record.details`` (an attribute, not a key); every
    other module reads another stage's through its record (:mod:`pipeline.core.records`)."""

    def is_details(node) -> bool:
        return isinstance(node, ast.Constant) and node.value == "details"

    hits = []
    for node in sorted(ast.walk(ast.parse(path.read_text())), key=lambda n: getattr(n, "lineno", 0)):
        read = ((isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and is_details(node.slice))
                or (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("get", "pop", "setdefault") and node.args and is_details(node.args[0]))
                or (isinstance(node, ast.Compare) and is_details(node.left)
                    and isinstance(node.ops[0], (ast.In, ast.NotIn))))
        if read:
            hits.append(f"{path.relative_to(path.parents[1])}:{node.lineno}: {ast.unparse(node)}")
    return hits


def test_no_module_outside_core_reads_a_details_dict():
    files = [p for p in sorted(ROOT.rglob("*.py")) if CORE not in p.parents]
    assert [hit for p in files for hit in details_reads(p)] == []


def test_the_details_check_finds_a_read_and_leaves_the_writes(tmp_path):
    path = tmp_path / "pkg" / "m.py"
    path.parent.mkdir()
    path.write_text('a = ((run.stage_entry("build") or {}).get("details") or {}).get("skipped")\n'
                    'b = entry["details"]["headline"]\n'
                    'c = "details" in entry\n'
                    'record.details.update({"skipped": {}})\n'
                    'record.details["learning"] = {}\n'
                    'entry["details"] = {}\n'
                    'd = record.details.get("said")\n')
    assert details_reads(path) == ['pkg/m.py:1: (run.stage_entry(\'build\') or {}).get(\'details\')',
                                   "pkg/m.py:2: entry['details']", "pkg/m.py:3: 'details' in entry"]


def test_the_verdict_types_sit_below_the_reports_that_print_them():
    """Check, Evidence, Verdict and JUDGED are the bottom layer's (issue 32): verify_report types its arguments with
    them without importing the evaluation above it."""
    from pipeline.core import checks, verdicts
    from pipeline.evaluation import candidates, predictions

    assert candidates.Check is checks.Check and candidates.Evidence is checks.Evidence
    assert candidates.Verdict is verdicts.Verdict and predictions.JUDGED is verdicts.JUDGED
    report = (ROOT / "reports" / "verify_report.py").read_text()
    assert "from pipeline.core.checks import Check" in report and "pipeline.evaluation" not in report


# --------------------------------------------------------------------------- string keys (issue 47)

KEYS_AT_D5A00C4 = 1389 + 389  # x["key"] subscripts and .get("key") calls in pipeline/ before results were typed
KEYS_CEILING = int(KEYS_AT_D5A00C4 * 0.30)  # issue 47: at least 70 % fewer


def string_key_reads(path: Path) -> int:
    """``x["key"]`` (read or written) and ``x.get("key")`` with a string literal, in one file."""
    count = 0
    for node in ast.walk(ast.parse(path.read_text())):
        literal = isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant)
        if literal and isinstance(node.slice.value, str):
            count += 1
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            count += 1
    return count


def test_string_keyed_reads_stay_at_least_70_percent_below_their_count_before_results_were_typed():
    """A ratchet: a new result passed around as a dict shows here before it spreads (the typed records and their
    own tests are in tests/test_*_result.py, test_check_results.py, test_typed_records.py, ...)."""
    total = sum(string_key_reads(p) for p in sorted(ROOT.rglob("*.py")))
    assert total <= KEYS_CEILING, f"{total} string-keyed reads in pipeline/ (ceiling {KEYS_CEILING})"


def test_the_key_count_sees_reads_writes_and_gets(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("d['a'] = 1\nx = d['b']\ny = d.get('c')\nz = d[k]\nw = d.get(k)\nv = d[0]\n")
    assert string_key_reads(path) == 3
