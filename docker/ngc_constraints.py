"""The pip constraints the GPU image installs the project under: NGC's own, minus deliberate overrides.

    python ngc_constraints.py PYPROJECT NGC_CONSTRAINTS OUT_CONSTRAINTS OUT_OVERRIDES

NGC PyTorch images from 25.03 pin every bundled Python package in ``/etc/pip/constraint.txt`` (their
``PIP_CONSTRAINT``). The project needs some packages at other versions than the image bundles (``onnx~=1.21.0``,
the onnx ModelOpt 0.47 is tested with, where the image may pin an older onnx): under the image's constraints
``pip install ".[gpu,deploy]"`` would fail to resolve. This script keeps every NGC pin that the project's requirements
(its dependencies, the ``gpu`` and ``deploy`` extras) accept and drops, by name, the pins they reject; the
dropped lines go to OUT_OVERRIDES, which the image keeps and the build log prints. Packages that carry the image's
CUDA stack (torch, TensorRT, the CUDA Python bindings) are never overridden: a project requirement that rejects
their bundled version fails the build (exit 1) instead of pulling a PyPI build of another CUDA.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import tomllib

try:
    from packaging.requirements import InvalidRequirement, Requirement
except ImportError:  # pip always carries it
    from pip._vendor.packaging.requirements import InvalidRequirement, Requirement

NEVER_OVERRIDDEN = {"torch", "tensorrt", "tensorrt-cu13", "tensorrt-cu12", "cuda-python", "cuda-bindings"}
EXTRAS = ("gpu", "deploy")  # what docker/Dockerfile.gpu installs: ".[gpu,deploy]"
LINUX = {"platform_system": "Linux", "sys_platform": "linux", "platform_machine": "x86_64"}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def project_requirements(pyproject: Path) -> dict[str, Requirement]:
    """The project's requirements that apply in the image (Linux x86-64, with the gpu and deploy extras), by name."""
    project = tomllib.loads(pyproject.read_text())["project"]
    wanted = {}
    lines = [(line, "gpu") for line in project["dependencies"]]
    lines += [(line, extra) for extra in EXTRAS for line in project["optional-dependencies"][extra]]
    for line, extra in lines:
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate({**LINUX, "extra": extra}):
            wanted[canonical(req.name)] = req
    return wanted


def reconcile(ngc_lines: list[str], wanted: dict[str, Requirement]) -> tuple[list[str], list[str], list[str]]:
    """(kept lines, overridden lines with the reason, errors): an NGC pin that the project rejects is dropped,
    unless it is one of :data:`NEVER_OVERRIDDEN`."""
    kept, overridden, errors = [], [], []
    for line in ngc_lines:
        text = line.split("#", 1)[0].strip()
        try:
            pin = Requirement(text) if text else None
        except InvalidRequirement:
            pin = None
        req = wanted.get(canonical(pin.name)) if pin is not None else None
        versions = [s.version for s in pin.specifier if s.operator in ("==", "===")] if pin is not None else []
        if req is None or not versions or req.specifier.contains(versions[0], prereleases=True):
            kept.append(line)
            continue
        reason = f"{text}  # the project requires {req}"
        (errors if canonical(pin.name) in NEVER_OVERRIDDEN else overridden).append(reason)
    return kept, overridden, errors


def main(argv: list[str]) -> int:
    pyproject, ngc, out, overrides = map(Path, argv)
    ngc_lines = ngc.read_text().splitlines() if ngc.is_file() else []
    kept, overridden, errors = reconcile(ngc_lines, project_requirements(pyproject))
    for error in errors:
        print(f"error: the image's bundled package would be replaced: {error}", file=sys.stderr)
    if errors:
        return 1
    out.write_text("\n".join(kept) + "\n")
    overrides.write_text("".join(f"{line}\n" for line in overridden))
    print(f"{ngc}: {len(kept)} pins kept, {len(overridden)} deliberately overridden:", *overridden, sep="\n  ")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
