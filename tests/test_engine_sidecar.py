"""A TensorRT engine's sidecar as a type (:mod:`pipeline.core.engine_sidecar`): made by build, written by one
serialiser in the shape earlier releases wrote, read back once (typed, bounded), read by attribute everywhere else."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from conftest import ROOT
from pipeline.core import engine_sidecar
from pipeline.core.engine_sidecar import BuildFlags, EngineSidecar, Platform, ProfileShapes
from pipeline.core.errors import InputError

PACKAGE = ROOT / "pipeline"
HOME = PACKAGE / "core" / "engine_sidecar.py"  # the only module that reads a sidecar by its keys
SOURCES = {"load_engine_bytes", "check_sidecar", "build_engine", "from_json", "read", "EngineSidecar"}  # give one
MODULES = {"tensorrt_engine", "engine_sidecar", "sidecars", "build"}  # where they are called from (module.source)
# The keys of a sidecar as build has written it since release 0.1.0, in their order.
KEYS = ["schema", "built_by", "engine", "sha256", "bytes", "onnx", "onnx_sha256", "precision", "tensorrt", "gpu",
        "compute_capability", "profile", "flags", "timing_cache", "log", "build_seconds", "built_at"]


def made() -> EngineSidecar:
    return EngineSidecar(
        schema_id=engine_sidecar.SCHEMA, built_by="pipeline 0.1.0", engine="model.fp16.engine", sha256="a" * 64,
        size=10, onnx="model.fp16.onnx", onnx_sha256="b" * 64, precision_label="fp16 (strongly typed from ...)",
        platform=Platform(tensorrt="11.4.0", gpu="NVIDIA H200", compute_capability="9.0"),
        profile=ProfileShapes(input="x", min=[1, 3], opt=[8, 3], max=[32, 3]),
        flags=BuildFlags(strongly_typed=True, precision_flags=[], tf32=False, builder_optimization_level=3),
        timing_cache="/runs/trt_timing.cache", log="logs/build.fp16.log", build_seconds=1.25,
        built_at="2026-01-01T00:00:00Z")


def test_written_in_the_shape_of_earlier_releases_and_read_back(tmp_path):
    written = made().to_json()
    assert list(written) == KEYS and written["tensorrt"] == "11.4.0" and written["bytes"] == 10
    assert written["profile"] == {"input": "x", "min": [1, 3], "opt": [8, 3], "max": [32, 3]}
    path = tmp_path / "model.fp16.engine.json"
    path.write_text(json.dumps(written))
    back = engine_sidecar.read(path, "model.fp16.engine", rebuild="rebuild it")
    assert back == made() and back.to_json() == written
    assert list(made().summary()) == ["engine", "precision", "onnx", "profile", "flags", "timing_cache", "log",
                                      "build_seconds"]


@pytest.mark.parametrize("change, fragment", [
    ({"sha256": "not a hash"}, "sha256"),
    ({"gpu": 7}, "platform.gpu"),
    ({"profile": {"input": "x", "min": "1"}}, "profile"),
    ({"bytes": -1}, "bytes"),
    ({"flags": []}, "flags"),
])
def test_a_damaged_sidecar_is_one_line_ending_in_how_to_rebuild(tmp_path, change, fragment):
    path = tmp_path / "model.fp16.engine.json"
    path.write_text(json.dumps({**made().to_json(), **change}))
    with pytest.raises(InputError, match="refusing to load model.fp16.engine; rebuild it$") as err:
        engine_sidecar.read(path, "model.fp16.engine", rebuild="rebuild it")
    assert fragment in str(err.value) and "\n" not in str(err.value)


# --------------------------------------------------------------------------- the AST check


def _makers(tree: ast.AST) -> set[str]:
    """The module's own functions typed to return a sidecar (tensorrt_engine's ``check_sidecar``, not openvino_ir's)."""
    return {fn.name for fn in ast.walk(tree) if isinstance(fn, ast.FunctionDef) and fn.returns is not None
            and "EngineSidecar" in ast.unparse(fn.returns)} | {"EngineSidecar"}


def _gives_sidecar(node: ast.AST, makers: set[str]) -> bool:
    """A call that gives a sidecar: ``tensorrt_engine.load_engine_bytes(...)``, ``engine_sidecar.read(...)``, one of
    the module's own makers."""
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    if isinstance(func, ast.Attribute):
        return func.attr in SOURCES and isinstance(func.value, ast.Name) and func.value.id in MODULES
    return isinstance(func, ast.Name) and func.id in makers


def _sidecar_names(scope: ast.AST, makers: set[str]) -> set[str]:
    """Names bound to a sidecar in one function: assigned from a call that gives one (``data, sidecar =
    load_engine_bytes(...)``: its last name), or a parameter annotated ``EngineSidecar``."""
    names = set()
    for node in ast.walk(scope):
        if isinstance(node, ast.Assign) and _gives_sidecar(node.value, makers):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    names.add(target.id)
                elif isinstance(target, ast.Tuple) and isinstance(target.elts[-1], ast.Name):
                    names.add(target.elts[-1].id)
        elif isinstance(node, ast.arg) and node.annotation is not None and "EngineSidecar" in ast.unparse(
                node.annotation):
            names.add(node.arg)
    return names


def _root(node: ast.AST) -> ast.AST:
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node


def _is_sidecar(node: ast.AST, names: set[str], makers: set[str]) -> bool:
    root = _root(node)
    return (isinstance(root, ast.Name) and root.id in names) or _gives_sidecar(root, makers)


def _scopes(tree: ast.Module) -> list[ast.AST]:
    """Each function on its own (a name means a sidecar only where it was bound to one), and the module's top level."""
    functions = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    top = ast.Module(body=[n for n in tree.body if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                                       ast.ClassDef))], type_ignores=[])
    return [*functions, top]


def keyed_reads(source: str) -> list[str]:
    """Every ``x["key"]`` or ``x.get("key")`` on a sidecar (or anything in it) in ``source``."""
    tree = ast.parse(source)
    makers = _makers(tree)
    found = []
    for scope in _scopes(tree):
        names = _sidecar_names(scope, makers)
        for node in ast.walk(scope):
            if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) \
                    and isinstance(node.slice.value, str) and _is_sidecar(node.value, names, makers):
                found.append(ast.unparse(node))
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" \
                    and node.args and isinstance(node.args[0], ast.Constant) \
                    and _is_sidecar(node.func.value, names, makers):
                found.append(ast.unparse(node))
    return sorted(set(found))


def test_no_engine_sidecar_is_read_by_its_key_outside_its_serialiser():
    found = {f"{path.relative_to(ROOT)}: {read}" for path in PACKAGE.rglob("*.py") if path != HOME
             for read in keyed_reads(path.read_text())}
    assert not found, f"read these by attribute (pipeline/core/engine_sidecar.py): {sorted(found)}"


def test_the_ast_check_finds_keyed_reads_of_a_sidecar():
    assert keyed_reads("data, sidecar = tensorrt_engine.load_engine_bytes(run)\nsidecar['gpu']") == ["sidecar['gpu']"]
    assert keyed_reads("s = tensorrt_engine.check_sidecar(a, b, c, d)\ns.get('tensorrt')") == ["s.get('tensorrt')"]
    mine = "def check_sidecar(p) -> EngineSidecar: ...\ndef f():\n    s = check_sidecar(p)\n    return s['sha256']"
    assert keyed_reads(mine) == ["s['sha256']"]
    theirs = "def check_sidecar(p) -> dict: ...\ndef f():\n    s = check_sidecar(p)\n    return s['hint']"
    assert keyed_reads(theirs) == []  # openvino_ir's sidecar is another file
    two = "def f(sidecar: EngineSidecar):\n    return sidecar.profile\ndef g(sidecar: dict):\n    return sidecar['xml']"
    assert keyed_reads(two) == []  # a name is a sidecar in the function that bound it only
    assert keyed_reads("s = engine_sidecar.read(p, e, rebuild='r')\nlow = s.profile['min']") == ["s.profile['min']"]
    assert keyed_reads("def f(sidecar: EngineSidecar):\n    return sidecar['profile']") == ["sidecar['profile']"]
    assert keyed_reads("build.build_engine(cfg, run, t, p, spec, platform)['engine']") != []
    assert keyed_reads("s = sidecars.read(p, e, rebuild='r')\ns.platform.gpu\nother['gpu']") == []
    assert keyed_reads("spec = read_json(p, 'model card')['spec']\nspec['input_name']") == []


def test_the_release_sidecar_shape_is_what_build_writes():
    """Every sidecar a committed run holds reads back and is written again byte for byte in its keys."""
    for path in (ROOT / "tests" / "data").rglob("*.engine.json"):
        payload = json.loads(path.read_text())
        assert engine_sidecar.from_json(payload, path).to_json() == payload
    assert Path(HOME).is_file()
