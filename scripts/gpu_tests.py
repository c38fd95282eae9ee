#!/usr/bin/env python3
"""The GPU-marked tests, run by scripts/gpu_check.sh: ``pytest -q -m gpu``, or not run with the reason.

    python scripts/gpu_tests.py [--check] [PYTEST_ARGS...]

The documented GPU install (``pip install -e '.[gpu]'``) has no pytest: the suite's own tools (pytest, pytest-xdist
for the ``-n auto`` of pyproject's addopts, hypothesis and filelock for tests/conftest.py, ...) are the ``test``
extra. A pytest run without them fails at collection, for a reason unrelated to the GPU. So this script first reads
the ``test`` extra from pyproject.toml and asks which of its distributions are not installed (their markers
evaluated for this machine where ``packaging`` is importable, else every one counted). Exit codes: pytest's own when
it ran; 3 when it did not run because the test extra is incomplete (one line naming what is missing and the
install command); 2 for a bad pyproject.toml. ``--check``: decide and say, run nothing (0 when it would run).

Standard library only up to the decision: it runs in a venv that has nothing but the GPU stack.
"""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
NOT_RUN = 3
PYTEST_ARGS = ["-q", "-m", "gpu", "-p", "no:cacheprovider"]
INSTALL = "pip install -e '.[gpu,test]'"


def test_extra(pyproject: Path) -> list[str]:
    """The requirement strings of the ``test`` extra."""
    extras = tomllib.loads(pyproject.read_text())["project"]["optional-dependencies"]
    return list(extras["test"])


def applies(requirement: str) -> bool:
    """Whether a requirement's marker holds here (True when it has none, or when ``packaging`` is not importable)."""
    try:
        from packaging.requirements import Requirement
    except ImportError:
        return True
    marker = Requirement(requirement).marker
    return marker is None or marker.evaluate()


def distribution(requirement: str) -> str:
    """The distribution a requirement names (``tritonclient[grpc]>=2.50; ...`` -> ``tritonclient``)."""
    return re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement).group(1)


def installed(name: str) -> bool:
    try:
        importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def missing(requirements: list[str], is_installed=installed, holds=applies) -> list[str]:
    """The distributions of ``requirements`` that apply here and are not installed, in order."""
    return [distribution(r) for r in requirements if holds(r) and not is_installed(distribution(r))]


def reason(absent: list[str]) -> str:
    """One line: why the GPU-marked tests do not run (empty when they can)."""
    if not absent:
        return ""
    return (f"NOT RUN: GPU-marked tests: the test extra is not installed (missing {', '.join(absent)}); pytest would "
            f"fail at collection for a reason unrelated to the GPU: {INSTALL}")


def main(argv: list[str]) -> int:
    check_only = "--check" in argv
    args = [a for a in argv if a != "--check"]
    try:
        absent = missing(test_extra(ROOT / "pyproject.toml"))
    except (OSError, KeyError, tomllib.TOMLDecodeError, AttributeError) as exc:
        print(f"error: gpu_tests: cannot read the test extra from pyproject.toml: {type(exc).__name__}: {exc}",
              file=sys.stderr)
        return 2
    if absent:
        print(reason(absent))
        return NOT_RUN
    if check_only:
        print("the test extra is installed: the GPU-marked tests can run")
        return 0
    return subprocess.run([sys.executable, "-m", "pytest", *PYTEST_ARGS, *args], cwd=ROOT, check=False).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
