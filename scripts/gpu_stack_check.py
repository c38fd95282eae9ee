#!/usr/bin/env python3
"""Is the declared GPU stack one CUDA major? Ask pip, without installing anything or needing a GPU.

    python scripts/gpu_stack_check.py        (about 30-45 s; needs the public package index)

Resolves the GPU install's packages as a Linux x86-64 user gets them from the public index
(``pip --isolated install --dry-run --ignore-installed --report -``: this machine's pip config, local
wheels and constraints are ignored) and reads each wheel's requirements from the report:

* torch's CUDA build and ``onnxruntime-gpu``: the CUDA major of their ``nvidia-*-cuNN``, ``cuda-toolkit``
  and ``nvidia-cuda-runtime`` requirements;
* ``tensorrt``: the ``tensorrt_cuNN`` package it resolves to.

Then it resolves ``tensorrt`` with its dependencies, which stops at ``tensorrt_cuNN_libs``: that package's
metadata step downloads the real wheel from NVIDIA's own index (pypi.nvidia.com), which the check does
not need to reach; it says where it stopped.

Exit codes: 0 every part is CUDA ``EXPECTED`` (or the index is unreachable: "skipped: <reason>"),
1 a part resolves to another CUDA major, 2 pip failed otherwise.
"""

from __future__ import annotations

import importlib.metadata
import json
import re
import subprocess
import sys
import urllib.request

from packaging.requirements import Requirement

EXPECTED = 13
INDEX = "https://pypi.org/simple/"
LINUX = {"platform_system": "Linux", "sys_platform": "linux", "platform_machine": "x86_64", "os_name": "posix"}
# Packages whose own version is the CUDA version (cuda-toolkit==13.0.3, nvidia-cuda-runtime~=13.0); the
# libraries' versions (cufft 12, curand 10, cudnn 9) are not, so only a -cuNN suffix names their CUDA.
VERSIONED_AS_CUDA = {"cuda-toolkit", "cuda-bindings", "nvidia-cuda-runtime", "nvidia-cuda-nvrtc",
                     "nvidia-cuda-cupti", "nvidia-nvjitlink"}


def declared() -> list[str]:
    """The GPU install's packages as the installed project declares them: torch, onnxruntime-gpu, the gpu extra."""
    wanted = []
    for requirement in map(Requirement, importlib.metadata.requires("pipeline") or []):
        gpu_extra = requirement.marker is not None and requirement.marker.evaluate({**LINUX, "extra": "gpu"}) \
            and not requirement.marker.evaluate({**LINUX, "extra": ""})
        if requirement.name in ("torch", "onnxruntime-gpu") or gpu_extra:
            wanted.append(f"{requirement.name}{requirement.specifier}")
    return wanted


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


def judge(install: list[dict]) -> tuple[list[str], list[str]]:
    """Lines saying what each package resolved to, and the problems (another CUDA major, no CUDA at all)."""
    lines, problems = [], []
    for item in install:
        meta = item["metadata"]
        name, version = meta["name"], meta["version"]
        cuda = cuda_requirements(meta.get("requires_dist") or [])
        majors = sorted(set(cuda.values()))
        lines.append(f"{name} {version}: CUDA {', '.join(map(str, majors)) or 'none'} "
                     f"({', '.join(cuda) or 'no CUDA requirement'}) from {item['download_info']['url']}")
        if majors != [EXPECTED]:
            problems.append(f"{name} {version} resolves to CUDA {majors or 'none'}, not CUDA {EXPECTED}: "
                            f"{', '.join(cuda) or 'a build without CUDA'}")
    return lines, problems


def pip_dry_run(*requirements: str, deps: bool, timeout: int) -> subprocess.CompletedProcess:
    """Without dependencies: the JSON report on stdout. With them: pip's log, to see how far it got."""
    report = [] if deps else ["--quiet", "--report", "-", "--no-deps"]
    command = [sys.executable, "-m", "pip", "--isolated", "install", "--dry-run", "--ignore-installed",
               "--disable-pip-version-check", *report, *requirements]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout)


def index_reachable(timeout: float = 10) -> str:
    """"" when the public index answers, else why not."""
    try:
        with urllib.request.urlopen(INDEX + "pip/", timeout=timeout) as response:
            response.read(1)
        return ""
    except OSError as exc:
        return f"the package index {INDEX} is unreachable ({getattr(exc, 'reason', exc)})"


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


def main() -> int:
    unreachable = index_reachable()
    if unreachable:
        print(f"skipped: {unreachable}")
        return 0
    requirements = declared()
    print("resolving (Linux x86-64, public index):", " ".join(requirements))
    result = pip_dry_run(*requirements, deps=False, timeout=180)
    if result.returncode != 0:
        print("pip failed:", (result.stderr.strip().splitlines() or ["?"])[-1])
        return 2
    lines, problems = judge(json.loads(result.stdout)["install"])
    for line in lines:
        print(" ", line)
    trt = next((r for r in requirements if Requirement(r).name == "tensorrt"), None)
    if trt:
        print(" ", tensorrt_chain(trt, timeout=180))
    for problem in problems:
        print("MISMATCH", problem)
    print(f"stack: one CUDA major (CUDA {EXPECTED})" if not problems else f"stack: {len(problems)} mismatch(es)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
