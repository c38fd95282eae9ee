"""Issue 47's typed records beyond the result rows: the doctor's :class:`~pipeline.doctor.MachineFacts`, the model
card (:class:`~pipeline.core.model_card.ModelCard`) and the manifest's stage entries
(:class:`~pipeline.core.manifest.StageEntry`) and the isolated child's messages
(:mod:`pipeline.runtime.isolate_messages`). Each is made
by the code that knows it and read by attribute everywhere else: a ``["key"]`` subscript or ``.get("key")`` on one,
outside the module that serialises it, is what this AST check finds."""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import ROOT

PACKAGE = ROOT / "pipeline"
# Each type and the module allowed to read it by key (its serialiser).
TYPES = {
    "MachineFacts": "doctor.py", "Gpu": "doctor.py", "Driver": "doctor.py", "OnnxRuntime": "doctor.py",
    "Threads": "doctor.py", "Cpu": "doctor.py",
    "StageEntry": "core/manifest.py", "Artifact": "core/manifest.py",
    "ModelCard": "core/model_card.py", "CardSpec": "core/model_card.py",
    **{name: "runtime/isolate_messages.py" for name in ("Job", "BackendRef", "Request", "Message", "Answer",
                                                        "RemoteError")},
    **{name: "training/records.py" for name in ("EpochRecord", "PreciseBnDetails", "TrainResult", "QatTrainResult",
                                                "RunLine", "StepLine", "EpochLine", "MetricsLine")},
    "PrecisionRun": "bench_train.py", "TrainBench": "bench_train.py",
    "Checkpoint": "training/checkpoint.py", "RngState": "training/rng.py", "NumpyRng": "training/rng.py",
}
# Calls that return one of the types (besides a function annotated to return one, and the types themselves), as
# ``module.function``; a bare call matches the function's name.
MAKERS = {"doctor.gather", "doctor.onnxruntime_facts", "doctor.nvml_driver",
          "stage_entry", "stages.run_stage", "manifest.entries",
          "modeling.read_card", "modeling.load_trained", "model_card.read",
          "read_metrics", "read_lines", "trainer.train", "bench_train.run", "load_checkpoint", "rng_state"}


def _maker(f: ast.AST, makers: set[str]) -> bool:
    if isinstance(f, ast.Name):
        return f.id in makers or any(m.endswith("." + f.id) for m in makers)
    return isinstance(f, ast.Attribute) and (
        f.attr in TYPES or f.attr in makers  # a function of the module typed to return one
        or (isinstance(f.value, ast.Name) and f"{f.value.id}.{f.attr}" in makers) or _names_a_type(f.value))


def _names_a_type(node: ast.AST | None) -> bool:
    return node is not None and any(
        (isinstance(n, ast.Name) and n.id in TYPES) or (isinstance(n, ast.Attribute) and n.attr in TYPES)
        or (isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value in TYPES)
        for n in ast.walk(node))


def _typed(node: ast.AST, names: set[str], makers: set[str]) -> bool:
    """Whether ``node``'s value is (or holds) a typed record: a name that holds one, an attribute, item or copy of
    one, or a call of a maker (a function typed to return one, a type's constructor or classmethod)."""
    if isinstance(node, ast.Name):
        return node.id in names
    if isinstance(node, (ast.Attribute, ast.Subscript)):
        return _typed(node.value, names, makers)
    if isinstance(node, ast.IfExp):
        return _typed(node.body, names, makers) or _typed(node.orelse, names, makers)
    if isinstance(node, ast.BoolOp):
        return any(_typed(v, names, makers) for v in node.values)
    if isinstance(node, (ast.ListComp, ast.GeneratorExp)):
        return _typed(node.elt, names, makers)
    if isinstance(node, ast.Call):
        f = node.func
        name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
        return (_maker(f, makers) or (isinstance(f, ast.Name) and f.id in TYPES)
                or (name == "replace" and any(_typed(a, names, makers) for a in node.args[:1]))
                or (name in ("values", "items", "get") and _typed(f.value, names, makers))
                or (name in ("next", "min", "max", "sorted", "list", "tuple")
                    and any(_typed(a, names, makers) for a in node.args)))
    return False


def _typed_names(fn: ast.AST, makers: set[str]) -> set[str]:
    """The names of a function that hold a typed record: typed parameters and annotations, and what is bound from
    them (assignments, loops, comprehensions), followed until nothing new is found."""
    args = fn.args
    names = {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs] if _names_a_type(a.annotation)}
    while True:
        before = len(names)
        for node in ast.walk(fn):
            if isinstance(node, ast.AnnAssign) and _names_a_type(node.annotation):
                names |= {n.id for n in ast.walk(node.target) if isinstance(n, ast.Name)}
            elif isinstance(node, ast.Assign) and _typed(node.value, names, makers):
                names |= {n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name)}
            elif isinstance(node, (ast.For, ast.comprehension)) and _typed(node.iter, names, makers):
                names |= {n.id for n in ast.walk(node.target) if isinstance(n, ast.Name)}
            elif isinstance(node, ast.NamedExpr) and _typed(node.value, names, makers):
                names.add(node.target.id)
        if len(names) == before:
            return names


def key_reads(path: Path, home: str | None = None) -> list[str]:
    """``x["key"]`` and ``x.get("key")`` on a typed record in ``path`` (none are allowed outside its home)."""
    tree = ast.parse(path.read_text())
    makers = MAKERS | {fn.name for fn in ast.walk(tree)
                       if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and _names_a_type(fn.returns)}
    hits = set()
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        names = _typed_names(fn, makers)
        for node in ast.walk(fn):
            on, key = None, None
            if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
                on, key = node.value, node.slice.value
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
                  and node.args and isinstance(node.args[0], ast.Constant)):
                on, key = node.func.value, node.args[0].value
            if isinstance(key, str) and on is not None and _typed(on, names, makers):
                hits.add(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    return sorted(hits)


def test_no_typed_record_is_read_by_its_key_outside_its_serialiser():
    homes = {PACKAGE / home for home in TYPES.values()}
    assert [hit for p in sorted(PACKAGE.rglob("*.py")) for hit in key_reads(p)
            if p not in homes or not _in_serialiser(p, hit)] == []


def _in_serialiser(path: Path, hit: str) -> bool:
    """A home module may read its own types by key only in its readers (``from_json``/``read``/``of``)."""
    line = int(hit.split(":")[1])
    tree = ast.parse(path.read_text())
    return any(isinstance(fn, ast.FunctionDef) and fn.name in ("from_json", "read", "of", "_read")
               and fn.lineno <= line <= fn.end_lineno for fn in ast.walk(tree))


def test_the_check_finds_a_key_read_and_follows_the_records(tmp_path):
    path = tmp_path / "m.py"
    path.write_text(
        "def a(facts: MachineFacts):\n    return facts['torch']\n"
        "def b():\n    facts = gather()\n    ort = facts.onnxruntime\n    return ort.get('cuda')\n"
        "def c(facts: 'MachineFacts'):\n    return [p for p in facts.cpu['isa']]\n"
        "def d(raw: dict):\n    return raw['torch']\n"  # a dict that never was a record: not followed
        "def e(facts: MachineFacts):\n    return facts.gpu.name, {'a': 1}['a']\n"
        "def f(run):\n    entry = run.stage_entry('train')\n    return entry.get('status'), entry.status\n"
        "def g(manifest: dict):\n    return [e['ended'] for e in entries(manifest).values()]\n"
        "def h(cfg, run):\n    model, card = modeling.load_trained(cfg, run, 'x')\n    spec = card.spec\n"
        "    return card['classes'], spec['input_size'], card.spec.get('mean')\n")
    assert key_reads(path) == sorted(["m.py:2: facts['torch']", "m.py:6: ort.get('cuda')", "m.py:8: facts.cpu['isa']",
                                      "m.py:15: entry.get('status')", "m.py:17: e['ended']",
                                      "m.py:21: card['classes']", "m.py:21: spec['input_size']",
                                      "m.py:21: card.spec.get('mean')"])


def test_the_check_sees_the_records_in_the_modules_that_use_them():
    """Each reader types its records (the check would find nothing to follow in one that went back to dicts)."""
    for name in ("doctor.py", "stages.py", "core/run.py", "reports/tables.py", "cli.py", "core/data.py",
                 "core/modeling.py", "export.py", "verify.py", "benchmark.py", "tune.py", "build.py", "compare.py",
                 "baseline.py", "deploy.py", "evaluation/candidates.py", "training/qat_recipe.py",
                 "precision/convert.py", "core/onnx_io.py", "reports/verify_report.py", "runtime/isolate.py",
                 "training/trainer.py", "training/metrics.py", "bench_train.py",
                 "training/checkpoint.py"):
        tree = ast.parse((PACKAGE / name).read_text())
        makers = MAKERS | {fn.name for fn in ast.walk(tree) if isinstance(fn, ast.FunctionDef)
                           and _names_a_type(fn.returns)}
        assert any(_typed_names(fn, makers) for fn in ast.walk(tree) if isinstance(fn, ast.FunctionDef)), name


def test_the_check_finds_a_key_read_on_trainings_records(tmp_path):
    """Training's records (:mod:`pipeline.training.records`): the result, an epoch, metrics.jsonl's lines."""
    path = tmp_path / "t.py"
    path.write_text(
        "def a(result: TrainResult):\n    return result['history'], result.precise_bn.get('batches')\n"
        "def b(path):\n    return [line['event'] for line in metrics.read_metrics(path)]\n"
        "def c(trainer):\n    facts = trainer.train(resume=False, profile=False)\n    return facts['best_val_acc']\n"
        "def d(h: EpochRecord, raw: dict):\n    return h.get('val_acc'), raw['val_acc'], h.val_acc\n"
        "def e(cfg):\n    r = bench_train.run(cfg)\n    return r['results'], r.fp32['final_loss']\n"
        "def f(path):\n    return load_checkpoint(path)['model'], load_checkpoint(path).config.get('train')\n")
    assert key_reads(path) == sorted(["t.py:2: result['history']", "t.py:2: result.precise_bn.get('batches')",
                                      "t.py:4: line['event']", "t.py:7: facts['best_val_acc']",
                                      "t.py:9: h.get('val_acc')", "t.py:12: r['results']",
                                      "t.py:12: r.fp32['final_loss']", "t.py:14: load_checkpoint(path)['model']",
                                      "t.py:14: load_checkpoint(path).config.get('train')"])
