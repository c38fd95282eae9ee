"""deploy.json as types (:mod:`pipeline.core.deploy_result`): made where deploy decides, written by one serialiser in
the shape earlier releases wrote, read back once (bounded, one line on damage), and read by attribute everywhere
else: the AST check here fails on a ``["key"]`` or ``.get("key")`` on a deploy result outside its module."""

from __future__ import annotations

import ast
import copy
import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import ROOT, cli
from pipeline.core import deploy_result
from pipeline.core.deploy_result import DeployResult, ServedCheck, ServedModel, ServerInfo
from pipeline.core.errors import InputError

PACKAGE = ROOT / "pipeline"
HOME = PACKAGE / "core" / "deploy_result.py"  # the serialiser: the only module that may read a part by its key
TYPES = {"DeployResult", "ModelEntry", "TensorEntry", "Refusal", "Compatibility", "Serve", "ServedModel",
         "ServedCheck", "ServerInfo", "ServedTiming", "ServedTimingMethod", "TritonSidecar", "FilesManifest"}
SOURCES = {"check_model", "serve_and_check", "_model_entry"}  # calls that return a part (and deploy_result.of/read)
PARTS = {"models", "refused", "compatibility", "serve", "server", "method", "timings", "checks", "inputs", "outputs",
         "tensors", "in_process"}  # a part's attributes that hold parts


# --------------------------------------------------------------------------- the AST check


@dataclass(frozen=True)
class Names:
    """What a module calls the deploy result's types and its module (only what it imports from
    pipeline/core/deploy_result.py: a ``Timing`` or an ``of`` of another module is not one), and its functions typed
    to return a part."""

    types: frozenset[str]
    modules: frozenset[str]
    makers: frozenset[str] = frozenset()

    def a_type(self, node: ast.AST | None) -> bool:
        return node is not None and any(
            (isinstance(n, ast.Name) and n.id in self.types)
            or (isinstance(n, ast.Attribute) and n.attr in TYPES and isinstance(n.value, ast.Name)
                and n.value.id in self.modules) for n in ast.walk(node))

    def a_source(self, f: ast.AST) -> bool:
        """A call of ``f`` gives a part: a type's constructor, the reader, or a function known to make one."""
        if isinstance(f, ast.Name):
            return f.id in self.types | self.makers | SOURCES
        return isinstance(f, ast.Attribute) and (
            f.attr in SOURCES | self.makers
            or (isinstance(f.value, ast.Name) and f.value.id in self.modules and f.attr in TYPES | {"of", "read"}))


def names_of(tree: ast.AST) -> Names:
    types, modules = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "pipeline.core.deploy_result":
            types |= {a.asname or a.name for a in node.names if a.name in TYPES}
        elif isinstance(node, ast.ImportFrom) and node.module == "pipeline.core":
            modules |= {a.asname or a.name for a in node.names if a.name == "deploy_result"}
    names = Names(frozenset(types), frozenset(modules))
    makers = {fn.name for fn in ast.walk(tree) if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
              and names.a_type(fn.returns)}
    return Names(names.types, names.modules, frozenset(makers))


def _gives_parts(node: ast.AST, parts: set[str], names: Names) -> bool:
    """Whether ``node``'s value is a part or holds parts: a name known to, an item of one, a part's part, a
    comprehension or ``next``/``sorted``... of parts, or a call that makes one."""
    def go(n: ast.AST) -> bool:
        return _gives_parts(n, parts, names)

    if isinstance(node, ast.Name):
        return node.id in parts
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
    if isinstance(node, ast.BinOp):
        return go(node.left) or go(node.right)
    if isinstance(node, ast.BoolOp):
        return any(go(v) for v in node.values)
    if isinstance(node, ast.Call):
        f = node.func
        return names.a_source(f) or (isinstance(f, ast.Name) and f.id in ("min", "max", "sorted", "next", "list",
                                                                          "tuple") and any(go(a) for a in node.args))
    return False


def _part_names(fn: ast.AST, names: Names) -> set[str]:
    """The names that hold a part in a function: parameters and names annotated with a type, and what is bound
    from them (loops, comprehensions, assignments), followed until nothing new is found."""
    args = fn.args
    parts = {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs] if names.a_type(a.annotation)}
    while True:
        before = len(parts)
        for node in ast.walk(fn):
            if isinstance(node, ast.AnnAssign) and names.a_type(node.annotation):
                parts |= {n.id for n in ast.walk(node.target) if isinstance(n, ast.Name)}
            elif isinstance(node, (ast.For, ast.comprehension)) and _gives_parts(node.iter, parts, names):
                parts |= {n.id for n in ast.walk(node.target) if isinstance(n, ast.Name)}
            elif isinstance(node, ast.Assign) and _gives_parts(node.value, parts, names):
                parts |= {n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        if len(parts) == before:
            return parts


def key_reads(path: Path) -> list[str]:
    """``part["key"]`` and ``part.get("key")`` on a value that is or holds a deploy result's part, in every
    function of ``path``."""
    tree = ast.parse(path.read_text())
    names = names_of(tree)
    hits = set()
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        parts = _part_names(fn, names)
        for node in ast.walk(fn):
            on, key = None, None
            if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
                on, key = node.value, node.slice.value
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
                  and node.args and isinstance(node.args[0], ast.Constant)):
                on, key = node.func.value, node.args[0].value
            if isinstance(key, str) and on is not None and _gives_parts(on, parts, names):
                hits.add(f"{path.relative_to(path.parents[1])}:{node.lineno}: {ast.unparse(node)}")
    return sorted(hits)


def test_no_deploy_result_is_read_by_its_key_outside_its_serialiser():
    """Scope: every function in pipeline/ that holds a part of deploy.json (a parameter or annotation names its type,
    or it calls what makes one), and what it binds from them."""
    files = [p for p in sorted(PACKAGE.rglob("*.py")) if p != HOME]
    assert [hit for p in files for hit in key_reads(p)] == []


def test_the_check_finds_a_key_read_and_follows_the_parts(tmp_path):
    path = tmp_path / "pkg" / "m.py"
    path.parent.mkdir()
    path.write_text(
        "from pipeline.core import deploy_result\n"
        "from pipeline.core.deploy_result import DeployResult, Serve\n"
        "def a(result: DeployResult):\n    return result['models']\n"
        "def b(payload: dict):\n    r = deploy_result.of(payload)\n    return [m.get('name') for m in r.models]\n"
        "def c(serve: Serve):\n    for m in serve.models:\n        for c in m.checks:\n            c['status']\n"
        "def d(payload: dict):\n    return [m['name'] for m in payload['models']]\n"  # a raw dict: not followed
        "def e(cfg, model):\n    r = served.check_model(model)\n    return r['verdict'], r.serve.timings[0]['where']\n"
        "def f(serve: Serve):\n    return serve.in_process.p50_ms, {'a': 1}['a']\n"
        "def g(row: deploy_result.ServedTiming):\n    return row['p50_ms']\n"
        "def h(payload: dict, t: Timing):\n    return tasks.of(payload)['x'], t['y']\n")  # another module's: not ours
    assert key_reads(path) == ["pkg/m.py:11: c['status']", "pkg/m.py:16: r.serve.timings[0]['where']",
                               "pkg/m.py:16: r['verdict']", "pkg/m.py:20: row['p50_ms']",
                               "pkg/m.py:4: result['models']", "pkg/m.py:7: m.get('name')"]


def test_the_check_covers_the_modules_that_hold_deploy_results():
    """deploy, served and the report type what they make and read: the check sees parts in each (it would find
    nothing to follow in a module that went back to dicts)."""
    for name in ("deploy.py", "evaluation/served.py", "reports/deploy_report.py"):
        tree = ast.parse((PACKAGE / name).read_text())
        typed = [fn.name for fn in ast.walk(tree)
                 if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and _part_names(fn, names_of(tree))]
        assert typed, name


# --------------------------------------------------------------------------- one serialiser, today's shape


TENSOR = {"name": "input", "dtype": "TYPE_FP32", "dims": [-1, 3, 32, 32]}
MODEL = {"name": "onnxrt_fp32", "candidate": "onnxrt_fp32", "verdict": "passed", "verdict_sha256": "a" * 64,
         "platform": None, "backend": "onnxruntime", "device": "cpu", "max_batch_size": 32,
         "preferred_batch_sizes": [8, 32], "parameters": {}, "gated_precision": "fp32",
         "runs_in": "the fp32 graph", "loads_in": "ONNX opset 18", "inputs": [TENSOR],
         "outputs": [{"name": "logits", "dtype": "TYPE_FP32", "dims": [-1, 10]}]}
TIMING = {"where": "in-process", "concurrency": 1, "requests": 100, "p50_ms": 0.5, "p90_ms": 0.6, "p95_ms": 0.7,
          "p99_ms": 0.9, "mean_ms": 0.55, "throughput_per_s": 2000.0, "windows": 3, "stable": True}
SERVE = {"server": {"triton": "2.50.0", "start_s": 3.25, "binary": "tritonserver"}, "cpu": "EPYC", "cores": 2,
         "images": 16, "reference": "the trained FP32 PyTorch model (verify's reference)",
         "models": [{"model": "onnxrt_fp32", "precision": "fp32", "served_precision": None,
                     "checks": [{"arrangement": "batch 1", "batch": 1, "concurrency": 1, "status": "passed",
                                 "scaled_error": 0.01, "top1_agreement": 1.0, "reason": ""},
                                {"arrangement": "batch 32", "batch": 32, "concurrency": 1, "status": "failed",
                                 "reason": "the request failed: boom"}],
                     "verdict": "failed", "reason": "batch 32: the request failed: boom"},
                    {"model": "tensorrt_fp16", "verdict": "skipped",
                     "reason": "not served on this machine: it needs a GPU"}],
         "verdict": "failed", "reason": "onnxrt_fp32: batch 32: the request failed: boom", "timed": None,
         "method": {"warmup_s": 0.5, "window_s": 1.0, "stability": 0.1, "max_trials": 10},
         "timings": [TIMING, {**TIMING, "where": "http", "p50_ms": 1.5}]}
PAYLOAD = {"schema": "pipeline.deploy/1", "created": "2026-01-01T00:00:00+00:00", "target": "triton",
           "repository": "/srv/repo", "models": [MODEL],
           "refused": [{"candidate": "tensorrt_fp16", "verdict": "skipped", "reason": "not built"},
                       {"candidate": "openvino_fp32", "verdict": None, "reason": "no verdict"}],
           "compatibility": {"tensorrt": None, "releases": "no TensorRT here", "target_release": None,
                             "source": "NVIDIA's matrix"},
           "serve": SERVE}


def _shape(value):
    """Keys in order, with every value's type: what a reader of the file sees."""
    if isinstance(value, dict):
        return [(k, _shape(v)) for k, v in value.items()]
    if isinstance(value, list):
        return [_shape(v) for v in value]
    return type(value).__name__


@pytest.mark.parametrize("payload", [PAYLOAD, {k: v for k, v in PAYLOAD.items() if k != "serve"}])
def test_deploy_json_reads_and_writes_back_in_the_same_shape(payload):
    """The keys each part was made with, in today's order: a check whose request failed has no numbers, a model not
    served here no precision or checks, a deploy without --serve no ``serve``."""
    written = deploy_result.of(payload).to_json()
    assert written == payload and _shape(written) == _shape(payload)
    assert json.dumps(written) == json.dumps(payload)


def test_the_parts_made_by_deploy_are_written_with_the_keys_it_always_wrote():
    """What served.py and deploy.py make (here by hand, as they do) comes out as earlier releases wrote it."""
    failed = ServedCheck(arrangement="batch 32", batch=32, concurrency=1, status="failed",
                         reason="the request failed: boom")
    assert list(failed.to_json()) == ["arrangement", "batch", "concurrency", "status", "reason"]
    passed = ServedCheck(arrangement="batch 1", batch=1, concurrency=1, status="passed", scaled_error=None,
                         top1_agreement=1.0, reason="")
    assert list(passed.to_json()) == ["arrangement", "batch", "concurrency", "status", "scaled_error",
                                      "top1_agreement", "reason"]
    gpu = ServedModel(model="tensorrt_fp16", verdict="skipped", reason="needs a GPU")
    assert list(gpu.to_json()) == ["model", "verdict", "reason"]
    assert list(ServerInfo(triton=None, binary="not started").to_json()) == ["triton", "binary"]
    assert list(ServerInfo(triton="2.50.0", start_s=1.0, binary="x").to_json()) == ["triton", "start_s", "binary"]
    plain = DeployResult.model_validate({k: v for k, v in PAYLOAD.items() if k != "serve"})
    assert "serve" not in plain.to_json() and list(plain.to_json()) == list(PAYLOAD)[:-1]


def test_a_deploy_json_from_before_runs_in_and_loads_in_still_reads():
    """deploy.json written before the models recorded their parameters, gated precision, runs_in and loads_in."""
    old = copy.deepcopy(PAYLOAD)
    for key in ("parameters", "gated_precision", "runs_in", "loads_in"):
        del old["models"][0][key]
    result = deploy_result.of(old)
    assert result.models[0].runs_in == "" and result.to_json() == old


@pytest.mark.parametrize("damage", [
    lambda p: p.pop("models"),
    lambda p: p["models"][0].update(max_batch_size="32"),
    lambda p: p["serve"]["timings"][0].pop("p50_ms"),
    lambda p: p["serve"]["models"][0]["checks"][0].update(status=["passed"]),
    lambda p: p.update(refused=[PAYLOAD["refused"][0]] * (deploy_result.MAX_MODELS + 1)),
    lambda p: p["models"][0].update(verdict_sha256="not a digest"),
])
def test_a_damaged_deploy_json_is_one_input_error(damage):
    payload = copy.deepcopy(PAYLOAD)
    damage(payload)
    with pytest.raises(InputError, match=r"^deploy\.json: not a valid deploy report: "):
        deploy_result.of(payload)


def _deployed(clone_run, tmp_path, payload: dict) -> Path:
    """A run that deploy wrote deploy.json into, that file then replaced by ``payload``."""
    run = clone_run()
    assert cli("deploy", "--run-dir", run, "--out", tmp_path / "repo") == 0
    (run / "deploy.json").write_text(json.dumps(payload))
    return run


def test_the_report_of_a_damaged_deploy_json_is_exit_2_in_one_line(clone_run, tmp_path, capsys):
    payload = copy.deepcopy(PAYLOAD)
    del payload["serve"]["method"]
    run = _deployed(clone_run, tmp_path, payload)
    capsys.readouterr()
    assert cli("report", "--run-dir", run) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "deploy.json" in err and "serve.method" in err and "Traceback" not in err


def test_the_report_lays_out_deploy_json_by_attribute(clone_run, tmp_path):
    from pipeline.reports import deploy_report, tables

    found = deploy_report.sections(PAYLOAD)
    texts = [[[c.text for c in row] for row in t.rows] for s in found for t in s.tables]
    assert texts[0] == [["onnxrt_fp32", "onnxruntime", "cpu", "32", "8, 32", "passed",
                         "input FP32 [-1, 3, 32, 32], logits FP32 [-1, 10]"]]
    assert texts[1] == [["openvino_fp32", "no verdict", "no verdict"]]  # the one verify skipped: a paragraph
    assert texts[3][1] == ["onnxrt_fp32", "batch 32", "-", "-", "failed", "the request failed: boom"]
    assert texts[4][1][:3] == ["Triton, HTTP client", "1", "1.5"] and texts[4][1][7] == "3.00x"
    assert "ready 3.2 s after start" in found[1].paragraphs[0] and "tensorrt_fp16." in found[0].paragraphs[2]
    run = _deployed(clone_run, tmp_path, PAYLOAD)
    assert cli("report", "--run-dir", run) == 0
    assert tables.markdown(found) in (run / "report.md").read_text()


def test_read_is_the_bounded_reader_of_the_file(tmp_path):
    path = tmp_path / "deploy.json"
    path.write_text(json.dumps(PAYLOAD))
    assert deploy_result.read(path).serve.in_process.p50_ms == 0.5
    path.write_text("[" * 100_000)
    with pytest.raises(InputError):
        deploy_result.read(path)


def test_the_runtime_records_convert_field_for_field():
    """deploy turns triton_serve's Measurement and PerfWindows into ServedTiming and ServedTimingMethod by their fields:
    the names agree, and the JSON is what asdict wrote before."""
    from dataclasses import asdict

    from pipeline.core.deploy_result import ServedTiming, ServedTimingMethod
    from pipeline.runtime.serving import triton_serve

    measured = triton_serve.Measurement("http", 2, 100, 0.5, 0.6, 0.7, 0.9, 0.55, 2000.0, 3, True)
    assert ServedTiming(**asdict(measured)).to_json() == asdict(measured)
    assert list(ServedTiming(**asdict(measured)).to_json()) == list(asdict(measured))
    assert ServedTimingMethod(**asdict(triton_serve.PerfWindows())).to_json() == asdict(triton_serve.PerfWindows())


def test_serve_with_timings_is_written_and_read_back(clone_run, tmp_path, monkeypatch):
    """deploy --serve through a front end that times (here a stand-in for Triton's): the timing rows and the started
    server are written as the serve extra's run writes them, read back and laid out."""
    pytest.importorskip("tritonclient.grpc", reason="tritonclient[grpc] (the deploy extra) is not installed")
    import contextlib

    from pipeline import deploy
    from pipeline.evaluation import served
    from pipeline.runtime.serving import triton_serve

    @contextlib.contextmanager
    def timing_front_end(stock, models, run_dir, log_file):
        with served.in_process(stock, models, run_dir, log_file) as (send, _, _):
            yield send, ServerInfo(triton="2.50.0", start_s=1.5, binary="a stand-in"), \
                lambda name, image, method, concurrency: [
                    triton_serve.Measurement(where, c, 10, 0.5 * c, 0.6, 0.7, 0.9, 0.55, 100.0, 3, True)
                    for where in ("in-process", "http") for c in concurrency]

    monkeypatch.setattr(triton_serve, "available", lambda: "")
    monkeypatch.setattr(deploy, "FRONT_END", timing_front_end)
    run = clone_run()
    assert cli("deploy", "--run-dir", run, "--out", tmp_path / "repo", "--serve", "deploy.concurrency=[1,2]") == 0
    written = json.loads((run / "deploy.json").read_text())
    serve = written["serve"]
    assert serve["server"] == {"triton": "2.50.0", "start_s": 1.5, "binary": "a stand-in"}
    assert list(serve["timings"][0]) == ["where", "concurrency", "requests", "p50_ms", "p90_ms", "p95_ms", "p99_ms",
                                         "mean_ms", "throughput_per_s", "windows", "stable"]
    assert [(t["where"], t["concurrency"]) for t in serve["timings"]] == \
        [("in-process", 1), ("in-process", 2), ("http", 1), ("http", 2)]
    assert serve["timed"] == "onnxrt_fp32" and list(serve["method"]) == ["warmup_s", "window_s", "stability",
                                                                          "max_trials"]
    assert deploy_result.read(run / "deploy.json").to_json() == written
    assert cli("report", "--run-dir", run) == 0
    assert "ready 1.5 s after start" in (run / "report.md").read_text()
