"""The TensorRT-facing modules type-check against TensorRT's published stubs, and use nothing TensorRT 11 removed.

``tensorrt-stubs`` (10.13, the newest published) requires the ``tensorrt`` wheel itself, which needs NVIDIA's
index, and its ``tensorrt/__init__.pyi`` would make ``import tensorrt`` succeed as an empty namespace package.
So it is installed apart, without dependencies (``.ci/run``: ``pip install --no-deps --target
.venv/typecheck-stubs tensorrt-stubs==10.13.0.35.1``), and this test points mypy at it. No stubs of TensorRT 11
are published: :func:`stubs_11` makes them from 10.13's and TensorRT 11.1's binding names (what 11 removed is gone
from them), and the modules type-check against both.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT

TRT_MODULES = ["pipeline/build.py", "pipeline/runtime/builders/tensorrt_engine.py", "pipeline/runtime/runners.py",
               "pipeline/runtime/speed/tensorrt_speed.py", "pipeline/runtime/serving/triton.py",
               "pipeline/runtime/profiling/tensorrt_inspection.py", "pipeline/runtime/tensorrt_calls.py",
               "pipeline/runtime/profiling/tensorrt_inspector.py", "pipeline/runtime/profiling/localize.py"]
STUBS = ROOT / ".venv" / "typecheck-stubs"
# Only TensorRT's stubs are followed; every other import is Any (numpy, torch, polygraphy, the rest of pipeline):
# the check is the TensorRT API, and following torch's and numpy's types took 40 s of the suite for nothing more.
MYPY_INI = """[mypy]
ignore_missing_imports = True
follow_imports = skip
[mypy-tensorrt,tensorrt.*,tensorrt_bindings,tensorrt_bindings.*]
follow_imports = normal
"""


def stubs_11(text: str) -> str:
    """TensorRT 11.1's stubs, made from the published 10.13 ones: every class or enum the 11.1 bindings define keeps
    only the members they define (tests/data/tensorrt_11_1_bindings.json, extracted from TensorRT 11.1's pybind11
    sources by scripts/tensorrt_binding_names.py; dunder methods kept); a class 11.1 does not define is dropped.
    What 11.1 added is not in them (its signatures are not published), so only what it removed is checked."""
    import ast

    import fake_tensorrt

    table = fake_tensorrt.bindings_11()
    kept = {**table["classes"], **table["enums"]}
    lines = text.splitlines(keepends=True)
    drop: list[tuple[int, int]] = []

    def span(node) -> tuple[int, int]:
        first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
        return first - 1, node.end_lineno

    for node in ast.parse(text).body:
        if not isinstance(node, ast.ClassDef):
            continue
        if node.name not in kept:
            drop.append(span(node))
            continue
        for member in node.body:
            name = (member.name if isinstance(member, (ast.FunctionDef, ast.AsyncFunctionDef)) else
                    member.target.id if isinstance(member, ast.AnnAssign) and isinstance(member.target, ast.Name)
                    else None)
            if name and not (name.startswith("__") and name.endswith("__")) and name not in kept[node.name]:
                drop.append(span(member))
    for start, end in sorted(drop, reverse=True):
        del lines[start:end]
    return "".join(lines)


def _mypy(tmp_path, modules: list[str], tensorrt: str = "10.13") -> str:
    """mypy's report on ``modules`` (paths from the repository root) against the published TensorRT stubs (10.13), or
    against :func:`stubs_11` made from them (``tensorrt="11.1"``)."""
    pytest.importorskip("mypy", reason="mypy is in the 'test' extra: pip install -e '.[test]'")
    if not (STUBS / "tensorrt_bindings" / "tensorrt.pyi").is_file():
        pytest.skip(f"tensorrt-stubs not installed in {STUBS} (.ci/run installs them: pip install --no-deps "
                    "--target .venv/typecheck-stubs tensorrt-stubs==10.13.0.35.1)")
    stubs = tmp_path / "stubs"
    shutil.copytree(STUBS, stubs, ignore=shutil.ignore_patterns("*.dist-info", "__pycache__"))
    pyi = stubs / "tensorrt_bindings" / "tensorrt.pyi"
    # The published 10.13 stubs name two parameters `in`, a Python keyword, which no checker can parse.
    # Both fixes are syntax only; no signature the pipeline uses is touched.
    text = re.sub(r"\bin: ", "in_: ", pyi.read_text())
    text = text.replace("power: Weights = None, channel_axis: int)", "power: Weights = None, channel_axis: int = ...)")
    pyi.write_text(stubs_11(text) if tensorrt == "11.1" else text)
    ini = tmp_path / "mypy.ini"
    ini.write_text(MYPY_INI)
    result = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(ini), "--no-incremental",
                             *modules], cwd=ROOT, capture_output=True, text=True,
                            env={"MYPYPATH": str(stubs), "PATH": "/usr/bin:/bin"})
    assert "error: Cannot find implementation or library stub for module named \"tensorrt\"" not in result.stdout
    return result.stdout


@pytest.mark.parametrize("tensorrt", ["10.13", "11.1"])
def test_tensorrt_modules_typecheck_against_tensorrt_stubs(tmp_path, tensorrt):
    # The stubs themselves carry errors (a variable named `bool` used as a type): only our modules' lines count.
    ours = [line for line in _mypy(tmp_path, TRT_MODULES, tensorrt).splitlines() if line.startswith("pipeline/")]
    assert not ours, "\n".join(ours)


def test_the_tensorrt_11_stubs_catch_what_11_removed(tmp_path):
    """Not vacuous: what TensorRT 11 removed (weak typing's flags, EXPLICIT_BATCH, platform_has_fast_fp16,
    set_output_type, the INT8 calibrators) type-checks against 10.13's stubs and fails against 11.1's."""
    scratch = tmp_path / "probe11.py"
    scratch.write_text("import tensorrt\n\n\ndef probe(builder: tensorrt.Builder, layer: tensorrt.ILayer,\n"
                       "          config: tensorrt.IBuilderConfig) -> None:\n"
                       "    config.set_flag(tensorrt.BuilderFlag.FP16)\n"
                       "    config.set_flag(tensorrt.BuilderFlag.OBEY_PRECISION_CONSTRAINTS)\n"
                       "    _ = tensorrt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH\n"
                       "    _ = builder.platform_has_fast_fp16\n"
                       "    layer.set_output_type(0, tensorrt.float16)\n"
                       "    _ = tensorrt.IInt8EntropyCalibrator2\n"
                       "    config.set_flag(tensorrt.BuilderFlag.TF32)\n")
    assert "probe11.py" not in _mypy(tmp_path / "10", [str(scratch)])
    report = _mypy(tmp_path / "11", [str(scratch)], "11.1")
    for gone in ('"FP16"', '"OBEY_PRECISION_CONSTRAINTS"', '"EXPLICIT_BATCH"', '"platform_has_fast_fp16"',
                 '"set_output_type"', '"IInt8EntropyCalibrator2"'):
        assert gone in report, (gone, report)
    assert '"TF32"' not in report  # kept in 11


def test_the_typecheck_catches_a_tensorrt_api_misuse(tmp_path):
    """The check is not vacuous: a misspelt enum member and a wrong argument type, in a module that reaches TensorRT
    through an import, are errors (a scratch module outside pipeline/: the code's fingerprint stays as it is)."""
    scratch = tmp_path / "probe.py"
    scratch.write_text("import tensorrt\n\n\ndef probe(builder: tensorrt.Builder) -> None:\n"
                       "    _ = tensorrt.ProfilingVerbosity.DETAILEDX\n"
                       "    builder.create_network(\"strongly typed\")\n")
    report = _mypy(tmp_path, [str(scratch)])
    assert 'has no attribute "DETAILEDX"' in report
    assert "create_network" in report and "incompatible type" in report


# Removed in TensorRT 11 (NVIDIA's 10.x -> 11.x migration guide): weak typing and implicit INT8.
REMOVED_IN_TRT11 = [r"BuilderFlag\.(FP16|BF16|INT8|FP8|INT4|FP4|"
                    r"OBEY_PRECISION_CONSTRAINTS|PREFER_PRECISION_CONSTRAINTS)",
                    r"\bIInt8\w*Calibrator", r"int8_calibrator", r"\.precision_is_set", r"\.set_output_type\(",
                    r"platform_has_fast_fp16", r"execute_async_v2", r"execute_v2", r"get_binding_\w+",
                    r"num_bindings", r"binding_is_input", r"set_binding_shape", r"\bfp16=True", r"\bint8=True"]


def test_no_tensorrt_api_that_tensorrt_11_removed():
    found = []
    for path in sorted((ROOT / "pipeline").rglob("*.py")):  # every package, runtime/ included
        for n, line in enumerate(path.read_text().splitlines(), 1):
            code = re.sub(r"``[^`]*``", "", line)  # docs may name what is gone, in ``literals``
            for pattern in REMOVED_IN_TRT11:
                if re.search(pattern, code) and not line.lstrip().startswith("#"):
                    found.append(f"{path.name}:{n}: {line.strip()}")
    assert not found, "TensorRT 11 removed these:\n" + "\n".join(found)


def test_the_binding_names_script_reads_pybind11_enums_classes_and_module_functions():
    """scripts/tensorrt_binding_names.py on a snippet written as pyCore.cpp is: each name under the enum or class
    opened before it."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import tensorrt_binding_names as names
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    snippet = '''
    py::enum_<BuilderFlag>(m, "BuilderFlag", py::arithmetic{}, BuilderFlagDoc::descr, py::module_local())
        .value("TF32", BuilderFlag::kTF32, BuilderFlagDoc::TF32)
        .value("STRIP_PLAN", BuilderFlag::kSTRIP_PLAN, BuilderFlagDoc::STRIP_PLAN);
    py::class_<IBuilderConfig, std::unique_ptr<IBuilderConfig, py::nodelete>>(m, "IBuilderConfig", doc)
        .def_property("builder_optimization_level", &get, &set)
        .def("set_flag", &IBuilderConfig::setFlag, "flag"_a);
    m.def("init_libnvinfer_plugins", &initLibNvInferPlugins, "logger"_a, "namespace"_a);
    '''
    table = {"enums": {}, "classes": {}, "module": []}
    names.names(snippet, table)
    assert table == {"enums": {"BuilderFlag": ["TF32", "STRIP_PLAN"]},
                     "classes": {"IBuilderConfig": ["builder_optimization_level", "set_flag"]},
                     "module": ["init_libnvinfer_plugins"]}


def test_the_fake_s_tensorrt_11_mode_has_exactly_11_1_s_flags(monkeypatch):
    import fake_tensorrt

    fake = fake_tensorrt.install(monkeypatch, version="11")
    table = fake_tensorrt.bindings_11()["enums"]
    import tensorrt

    assert tensorrt.__version__ == "11.1.0.106"
    assert list(tensorrt.BuilderFlag.__members__) == table["BuilderFlag"]
    assert set(tensorrt.NetworkDefinitionCreationFlag.__members__) == set(table["NetworkDefinitionCreationFlag"])
    for gone in ("FP16", "INT8", "BF16", "FP8", "INT4", "FP4", "OBEY_PRECISION_CONSTRAINTS",
                 "PREFER_PRECISION_CONSTRAINTS"):
        assert not hasattr(tensorrt.BuilderFlag, gone)
    assert not hasattr(tensorrt.NetworkDefinitionCreationFlag, "EXPLICIT_BATCH")
    assert fake.major == 11 and tensorrt.BuilderFlag.TF32 in {tensorrt.BuilderFlag.TF32}
