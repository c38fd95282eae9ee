"""The TensorRT-facing modules type-check against TensorRT's published stubs, and use nothing TensorRT 11 removed.

``tensorrt-stubs`` (10.13, the newest published) requires the ``tensorrt`` wheel itself, which needs NVIDIA's
index, and its ``tensorrt/__init__.pyi`` would make ``import tensorrt`` succeed as an empty namespace package.
So it is installed apart, without dependencies (``.ci/run``: ``pip install --no-deps --target
.venv/typecheck-stubs tensorrt-stubs==10.13.0.35.1``), and this test points mypy at it.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT

TRT_MODULES = ["pipeline/build.py", "pipeline/runtime/tensorrt_engine.py", "pipeline/runtime/runners.py",
               "pipeline/runtime/tensorrt_speed.py", "pipeline/runtime/triton.py",
               "pipeline/runtime/tensorrt_inspection.py", "pipeline/runtime/tensorrt_calls.py",
               "pipeline/runtime/tensorrt_inspector.py", "pipeline/runtime/localize.py"]
STUBS = ROOT / ".venv" / "typecheck-stubs"
# Only TensorRT's stubs are followed; every other import is Any (numpy, torch, polygraphy, the rest of pipeline):
# the check is the TensorRT API, and following torch's and numpy's types took 40 s of the suite for nothing more.
MYPY_INI = """[mypy]
ignore_missing_imports = True
follow_imports = skip
[mypy-tensorrt,tensorrt.*,tensorrt_bindings,tensorrt_bindings.*]
follow_imports = normal
"""


def _mypy(tmp_path, modules: list[str]) -> str:
    """mypy's report on ``modules`` (paths from the repository root) against the published TensorRT stubs."""
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
    pyi.write_text(text)
    ini = tmp_path / "mypy.ini"
    ini.write_text(MYPY_INI)
    result = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(ini), "--no-incremental",
                             *modules], cwd=ROOT, capture_output=True, text=True,
                            env={"MYPYPATH": str(stubs), "PATH": "/usr/bin:/bin"})
    assert "error: Cannot find implementation or library stub for module named \"tensorrt\"" not in result.stdout
    return result.stdout


def test_tensorrt_modules_typecheck_against_tensorrt_stubs(tmp_path):
    # The stubs themselves carry errors (a variable named `bool` used as a type): only our modules' lines count.
    ours = [line for line in _mypy(tmp_path, TRT_MODULES).splitlines() if line.startswith("pipeline/")]
    assert not ours, "\n".join(ours)


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
    for path in sorted((ROOT / "pipeline").glob("*.py")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            code = re.sub(r"``[^`]*``", "", line)  # docs may name what is gone, in ``literals``
            for pattern in REMOVED_IN_TRT11:
                if re.search(pattern, code) and not line.lstrip().startswith("#"):
                    found.append(f"{path.name}:{n}: {line.strip()}")
    assert not found, "TensorRT 11 removed these:\n" + "\n".join(found)
