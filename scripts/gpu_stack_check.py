#!/usr/bin/env python3
"""Is each declared GPU route one CUDA major with one TensorRT? Ask pip, without installing anything or a GPU.

    python scripts/gpu_stack_check.py [--route cuda13|cuda12|both]   (about 40 s a route; needs the index)

Python 3.11+ (it reads pyproject.toml with tomllib) with ``packaging``; the project need not be installed.

The two routes (docs/export-and-build.md): CUDA 13, ``pip install torch && pip install -e ".[gpu]"``; CUDA 12,
``pip install torch --index-url https://download.pytorch.org/whl/cu126 && pip install -e ".[gpu-cu12]"`` (torch
is then resolved from that index).

Resolves the GPU install's packages as a Linux x86-64 user gets them from the public index
(``pip --isolated install --dry-run --ignore-installed --report -``: this machine's pip config, local
wheels and constraints are ignored) and reads each wheel's requirements from the report:

* torch's CUDA build and ``onnxruntime-gpu``: the CUDA major of their ``nvidia-*-cuNN``, ``cuda-toolkit``
  and ``nvidia-cuda-runtime`` requirements;
* ``tensorrt``: the ``tensorrt_cuNN`` package it resolves to.

Then it resolves ``tensorrt`` with its dependencies, which stops at ``tensorrt_cuNN_libs``: that package's
metadata step downloads the real wheel from NVIDIA's own index (pypi.nvidia.com), which the check does
not need to reach; it says where it stopped.

Exit codes: 0 every part of every route checked is its route's CUDA major and there is one TensorRT build
(or the index is unreachable: "skipped: <reason>"), 1 a part resolves to another CUDA major or a route has two
TensorRT builds, 2 pip failed otherwise.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import tomllib
from packaging.requirements import Requirement

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
EXPECTED = 13
INDEX = "https://pypi.org/simple/"
# route -> (the project's extra, its CUDA major, the index torch comes from; None: the public index)
ROUTES = {"cuda13": ("gpu", 13, None), "cuda12": ("gpu-cu12", 12, "https://download.pytorch.org/whl/cu126")}
LINUX = {"platform_system": "Linux", "sys_platform": "linux", "platform_machine": "x86_64", "os_name": "posix"}
# Packages whose own version is the CUDA version (cuda-toolkit==13.0.3, nvidia-cuda-runtime~=13.0); the
# libraries' versions (cufft 12, curand 10, cudnn 9) are not, so only a -cuNN suffix names their CUDA.
VERSIONED_AS_CUDA = {"cuda-toolkit", "cuda-bindings", "nvidia-cuda-runtime", "nvidia-cuda-nvrtc",
                     "nvidia-cuda-cupti", "nvidia-nvjitlink"}


def declared(extra: str = "gpu") -> list[str]:
    """A route's packages as pyproject.toml declares them (the project need not be installed): torch,
    onnxruntime-gpu and the route's extra (whose own requirement of a package replaces the base one: the CUDA 12
    route's onnxruntime-gpu), each where its marker holds on Linux x86-64."""
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    base = [r for r in map(Requirement, project["dependencies"]) if r.name in ("torch", "onnxruntime-gpu")]
    wanted: dict[str, str] = {}
    for requirement in [*base, *map(Requirement, project["optional-dependencies"][extra])]:
        if requirement.marker is None or requirement.marker.evaluate({**LINUX, "extra": extra}):
            wanted[requirement.name] = f"{requirement.name}{requirement.specifier}"
    return list(wanted.values())


def tensorrt_builds(install: list[dict]) -> list[int]:
    """The CUDA majors of the TensorRT builds an install brings (``tensorrt`` -> its ``tensorrt_cuNN``)."""
    majors = set()
    for item in install:
        name = re.sub(r"[-_.]+", "-", item["metadata"]["name"].lower())
        if name == "tensorrt" or re.fullmatch(r"tensorrt-cu\d+", name):
            majors |= set(cuda_requirements(item["metadata"].get("requires_dist") or []).values())
    return sorted(majors)


def cuda_major(requirement: str) -> int | None:
    """The CUDA major a requirement pins on Linux x86-64 (any extra), or None when it names none."""
    req = Requirement(requirement)
    if req.marker and not any(req.marker.evaluate({**LINUX, "extra": e}) for e in ("", *(_extras(req)))):
        return None
    name = re.sub(r"[-_.]+", "-", req.name.lower())
    suffix = re.search(r"-cu(\d+)(-|$)", name)
    if suffix:
        return int(suffix.group(1))
    if name in VERSIONED_AS_CUDA:  # the lower bound: ==13.0.3, ~=13.0, >=13.0.3 (not <14)
        lower = [spec.version for spec in req.specifier if spec.operator in ("==", "~=", ">=", "===")]
        match = re.match(r"\d+", lower[0]) if lower else None
        return int(match.group()) if match else None
    return None


def _extras(req: Requirement) -> list[str]:
    return re.findall(r'extra\s*==\s*"([^"]+)"', str(req.marker))


def cuda_requirements(requires_dist: list[str]) -> dict[str, int]:
    """Each requirement that names a CUDA major, with that major."""
    found = {}
    for requirement in requires_dist:
        major = cuda_major(requirement)
        if major is not None:
            found[requirement.split(";")[0].strip()] = major
    return found


def judge(install: list[dict], expected: int = EXPECTED) -> tuple[list[str], list[str]]:
    """Lines saying what each package resolved to, and the problems (another CUDA major, no CUDA at all, two
    TensorRT builds)."""
    lines, problems = [], []
    for item in install:
        meta = item["metadata"]
        name, version = meta["name"], meta["version"]
        cuda = cuda_requirements(meta.get("requires_dist") or [])
        majors = sorted(set(cuda.values()))
        lines.append(f"{name} {version}: CUDA {', '.join(map(str, majors)) or 'none'} "
                     f"({', '.join(cuda) or 'no CUDA requirement'}) from {item['download_info']['url']}")
        if majors != [expected]:
            problems.append(f"{name} {version} resolves to CUDA {majors or 'none'}, not CUDA {expected}: "
                            f"{', '.join(cuda) or 'a build without CUDA'}")
    builds = tensorrt_builds(install)
    if len(builds) > 1:
        problems.append(f"{len(builds)} TensorRT builds in one install (CUDA {', '.join(map(str, builds))}): "
                        "their bindings may share one top-level folder; one route, one TensorRT")
    return lines, problems


def pip_dry_run(*requirements: str, deps: bool, timeout: int, index: str | None = None) -> subprocess.CompletedProcess:
    """Without dependencies: the JSON report on stdout. With them: pip's log, to see how far it got."""
    report = [] if deps else ["--quiet", "--report", "-", "--no-deps"]
    command = [sys.executable, "-m", "pip", "--isolated", "install", "--dry-run", "--ignore-installed",
               "--disable-pip-version-check", *report, *(["--index-url", index] if index else []), *requirements]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout)


def index_reachable(timeout: float = 10, index: str = INDEX, project: str = "pip") -> str:
    """"" when the index answers, else why not."""
    try:
        with urllib.request.urlopen(index.rstrip("/") + f"/{project}/", timeout=timeout) as response:
            response.read(1)
        return ""
    except OSError as exc:
        return f"the package index {index} is unreachable ({getattr(exc, 'reason', exc)})"


def tensorrt_chain(requirement: str, timeout: int) -> str:
    """Resolve tensorrt with its dependencies and say where it stopped (the libs wheel's metadata step)."""
    result = pip_dry_run(requirement, deps=True, timeout=timeout)
    collected = re.findall(r"Collecting (\S+)", result.stdout + result.stderr)
    chain = " -> ".join(collected)
    if result.returncode == 0:
        would = re.findall(r"Would install (.*)", result.stdout)
        return f"tensorrt resolved with its dependencies: {would[-1] if would else chain}"
    libs = next((c for c in collected if "libs" in c), None)
    if libs and re.search(r"pypi\.nvidia\.com|urlopen|download_manual", result.stderr):
        return (f"tensorrt chain {chain}: stopped at {libs}'s metadata step, which downloads the real wheel from "
                f"NVIDIA's index (pypi.nvidia.com), not reachable from here; not an error")
    return f"tensorrt chain {chain}: pip failed: {(result.stderr.strip().splitlines() or ['?'])[-1]}"


def resolve(requirements: list[str], torch_index: str | None) -> list[dict] | str:
    """The no-deps report's items (torch from ``torch_index`` when given), or pip's last error line."""
    torch = [r for r in requirements if Requirement(r).name == "torch"]
    others = [r for r in requirements if Requirement(r).name != "torch"]
    groups = [(torch, torch_index), (others, None)] if torch_index else [(torch + others, None)]
    install = []
    for group, index in (g for g in groups if g[0]):
        result = pip_dry_run(*group, deps=False, timeout=180, index=index)
        if result.returncode != 0:
            return (result.stderr.strip().splitlines() or ["?"])[-1]
        install += json.loads(result.stdout)["install"]
    return install


def check_route(route: str) -> int:
    extra, expected, torch_index = ROUTES[route]
    requirements = declared(extra)
    unreachable = index_reachable(index=torch_index, project="torch") if torch_index else ""
    if unreachable:  # judge the rest; torch's CUDA build cannot be read from here
        print(f"route {route}: torch skipped: {unreachable}")
        requirements = [r for r in requirements if Requirement(r).name != "torch"]
    where = f"public index, torch from {torch_index}" if torch_index and not unreachable else "public index"
    print(f"route {route}: resolving (Linux x86-64, {where}):", " ".join(requirements))
    install = resolve(requirements, torch_index)
    if isinstance(install, str):
        print("pip failed:", install)
        return 2
    lines, problems = judge(install, expected)
    for line in lines:
        print(" ", line)
    trt = next((r for r in requirements if Requirement(r).name.startswith("tensorrt")), None)
    if trt:
        print(" ", tensorrt_chain(trt, timeout=180))
    for problem in problems:
        print("MISMATCH", problem)
    print(f"stack {route}: one CUDA major (CUDA {expected}), one TensorRT" if not problems
          else f"stack {route}: {len(problems)} mismatch(es)")
    return 1 if problems else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--route", choices=[*ROUTES, "both"], default="both")
    args = parser.parse_args([] if argv is None else argv)
    unreachable = index_reachable()
    if unreachable:
        print(f"skipped: {unreachable}")
        return 0
    codes = [check_route(route) for route in (ROUTES if args.route == "both" else [args.route])]
    return max(codes)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
