"""The declared GPU stack is one CUDA major: scripts/gpu_stack_check.py asks pip (no GPU, nothing installed).

The judging runs here on wheel metadata recorded from the index; the resolution itself needs the public
package index and takes about 45 s, so it runs only with PIPELINE_PIP_CHECK=1 (a separate step of
.ci/run) and skips, with the reason, where the index is unreachable.
"""

import os
import subprocess
import sys

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "scripts"))
import gpu_stack_check as check  # noqa: E402

# requires_dist as the index's reports gave them (Linux x86-64, checked on the index).
TORCH_2_13 = ['cuda-toolkit[cublas,cudart,cufft,cufile,cupti,curand,cusolver,cusparse,nvjitlink,nvrtc,nvtx]==13.0.3; '
              'platform_system == "Linux"', 'cuda-bindings<14,>=13.0.3; platform_system == "Linux" and '
              'python_version < "3.15"', 'nvidia-cudnn-cu13==9.20.0.48; platform_system == "Linux"',
              'nvidia-nccl-cu13==2.29.7; platform_system == "Linux"', "filelock", "sympy>=1.13.3"]
ORT_1_31 = ["flatbuffers", "numpy>=1.21.6", 'nvidia-cuda-nvrtc~=13.0; extra == "cuda"',
            'nvidia-cuda-runtime~=13.0; extra == "cuda"', 'nvidia-cufft~=12.0; extra == "cuda"',
            'nvidia-curand~=10.0; extra == "cuda"', 'nvidia-cudnn-cu13~=9.0; extra == "cudnn"']
ORT_1_24 = ["flatbuffers", 'nvidia-cuda-nvrtc-cu12~=12.0; extra == "cuda"', 'nvidia-cuda-runtime-cu12~=12.0; '
            'extra == "cuda"', 'nvidia-cufft-cu12~=11.0; extra == "cuda"', 'nvidia-cudnn-cu12~=9.0; extra == "cudnn"']


def wheel(name, version, requires):
    return {"metadata": {"name": name, "version": version, "requires_dist": requires},
            "download_info": {"url": f"https://files.example/{name}-{version}.whl"}}


def test_a_cuda13_stack_is_one_major():
    lines, problems = check.judge([wheel("torch", "2.13.0", TORCH_2_13), wheel("onnxruntime-gpu", "1.31.1", ORT_1_31),
                                   wheel("tensorrt", "11.4.0.106", ["tensorrt_cu13==11.4.0.106"])])
    assert problems == []
    assert lines[0].startswith("torch 2.13.0: CUDA 13 (cuda-toolkit[")
    assert "nvidia-cuda-runtime~=13.0" in lines[1] and "nvidia-cufft" not in lines[1]  # cufft 12 is not CUDA 12
    assert lines[2].startswith("tensorrt 11.4.0.106: CUDA 13 (tensorrt_cu13==11.4.0.106)")


@pytest.mark.parametrize("item, says", [
    (wheel("onnxruntime-gpu", "1.24.4", ORT_1_24), "onnxruntime-gpu 1.24.4 resolves to CUDA [12], not CUDA 13"),
    (wheel("tensorrt", "11.4.0.106", ["tensorrt_cu12==11.4.0.106"]), "tensorrt 11.4.0.106 resolves to CUDA [12]"),
    (wheel("torch", "2.13.0+cpu", ["filelock"]), "torch 2.13.0+cpu resolves to CUDA none, not CUDA 13"),
])
def test_another_cuda_major_is_a_mismatch(item, says):
    _, problems = check.judge([wheel("torch", "2.13.0", TORCH_2_13), item])
    assert len(problems) == 1 and problems[0].startswith(says)


def test_the_check_resolves_what_the_project_declares():
    names = [r.split(">")[0].split("=")[0] for r in check.declared()]
    assert names == ["torch", "onnxruntime-gpu", "tensorrt"]


def test_a_requirement_whose_marker_excludes_linux_x86_64_is_not_resolved(tmp_path, monkeypatch):
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text("""[project]
dependencies = ["torch>=2.8; platform_machine == 'aarch64'", "torch>=2.9; platform_machine == 'x86_64'", "numpy"]
[project.optional-dependencies]
gpu = ["tensorrt>=10.12", "tensorrt-windows>=10; platform_system == 'Windows'"]
""")
    monkeypatch.setattr(check, "PYPROJECT", pyproject)
    assert check.declared() == ["torch>=2.9", "tensorrt>=10.12"]


def test_the_cuda12_route_declares_one_tensorrt_and_a_cuda12_onnxruntime():
    route = check.declared("gpu-cu12")
    assert [r.split(">")[0].split("<")[0].split("=")[0] for r in route] == ["torch", "onnxruntime-gpu", "tensorrt-cu12"]
    assert "<1.25" in route[1]  # 1.24.x: the CUDA 12 build


# The shape of torch's cu126 wheels' requires_dist (download.pytorch.org/whl/cu126) and of tensorrt-cu12 11.4's.
TORCH_CU126 = ['nvidia-cuda-runtime-cu12==12.6.77; platform_system == "Linux"',
               'nvidia-cudnn-cu12==9.10.2.21; platform_system == "Linux"', "filelock"]
TRT_CU12 = ["tensorrt_cu12_libs==11.4.0.106", "tensorrt_cu12_bindings==11.4.0.106"]


def test_a_cuda12_route_is_one_major_and_one_tensorrt():
    lines, problems = check.judge([wheel("torch", "2.8.0+cu126", TORCH_CU126), wheel("onnxruntime-gpu", "1.24.4",
                                   ORT_1_24), wheel("tensorrt-cu12", "11.4.0.106", TRT_CU12)], expected=12)
    assert problems == [] and lines[2].startswith("tensorrt-cu12 11.4.0.106: CUDA 12 (tensorrt_cu12_libs")


def test_two_tensorrt_builds_in_one_install_are_a_problem():
    """The old CUDA 12 command, `pip install -e ".[gpu]" "tensorrt-cu12>=10.12"`: tensorrt (-> tensorrt_cu13) beside
    tensorrt-cu12."""
    install = [wheel("torch", "2.8.0+cu126", TORCH_CU126),
               wheel("tensorrt", "11.4.0.106", ["tensorrt_cu13==11.4.0.106"]),
               wheel("tensorrt-cu12", "11.4.0.106", TRT_CU12)]
    assert check.tensorrt_builds(install) == [12, 13]
    _, problems = check.judge(install, expected=12)
    assert problems[-1].startswith("2 TensorRT builds in one install (CUDA 12, 13)")


def test_both_routes_are_checked_each_against_its_own_cuda_major(monkeypatch, capsys):
    """main() offline, pip's answers replaced by recorded reports: torch of the CUDA 12 route from its own index."""
    import json
    from types import SimpleNamespace

    reports = {"torch": wheel("torch", "2.13.0", TORCH_2_13), "onnxruntime-gpu": wheel("onnxruntime-gpu", "1.31.1",
               ORT_1_31), "tensorrt": wheel("tensorrt", "11.4.0.106", ["tensorrt_cu13==11.4.0.106"]),
               "tensorrt-cu12": wheel("tensorrt-cu12", "11.4.0.106", TRT_CU12)}
    asked = []

    def dry_run(*requirements, deps, timeout, index=None):
        asked.append((requirements, index))
        if deps:
            return SimpleNamespace(returncode=0, stdout="Would install tensorrt", stderr="")
        items = []
        for r in requirements:
            name = check.Requirement(r).name
            if name == "torch" and index:
                items.append(wheel("torch", "2.8.0+cu126", TORCH_CU126))
            elif name == "onnxruntime-gpu" and "<1.25" in r:
                items.append(wheel("onnxruntime-gpu", "1.24.4", ORT_1_24))
            else:
                items.append(reports[name])
        return SimpleNamespace(returncode=0, stdout=json.dumps({"install": items}), stderr="")

    monkeypatch.setattr(check, "pip_dry_run", dry_run)
    monkeypatch.setattr(check, "index_reachable", lambda *a, **k: "")
    assert check.main([]) == 0
    out = capsys.readouterr().out
    assert "stack cuda13: one CUDA major (CUDA 13), one TensorRT" in out
    assert "stack cuda12: one CUDA major (CUDA 12), one TensorRT" in out
    assert (("torch>=2.8",), "https://download.pytorch.org/whl/cu126") in asked
    asked.clear()  # PyTorch's index unreachable: the rest of the route is still judged, torch is said skipped
    monkeypatch.setattr(check, "index_reachable", lambda index=check.INDEX, **k: "" if index == check.INDEX else "down")
    assert check.main(["--route", "cuda12"]) == 0
    out = capsys.readouterr().out
    assert "route cuda12: torch skipped: down" in out and "stack cuda12: one CUDA major (CUDA 12)" in out
    assert all("torch>=2.8" not in requirements for requirements, _ in asked)


@pytest.mark.network
def test_pip_resolves_the_declared_gpu_stack_to_cuda13():
    if os.environ.get("PIPELINE_PIP_CHECK") != "1":
        pytest.skip("set PIPELINE_PIP_CHECK=1 (a separate step of .ci/run) to ask the package index (~45 s)")
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_stack_check.py"), "--route", "cuda13"],
                            capture_output=True, text=True, timeout=420)
    out = result.stdout
    if out.startswith("skipped:"):
        pytest.skip(out.strip())
    assert result.returncode == 0, out + result.stderr
    lines = out.splitlines()
    assert any(line.strip().startswith("torch ") and ": CUDA 13 (" in line for line in lines), out
    assert any(line.strip().startswith("onnxruntime-gpu ") and ": CUDA 13 (" in line for line in lines), out
    assert any(line.strip().startswith("tensorrt ") and "(tensorrt_cu13==" in line for line in lines), out
    assert "stopped at tensorrt_cu13_libs" in out or "resolved with its dependencies" in out, out


@pytest.mark.network
def test_pip_resolves_the_cuda12_route_to_cuda12_with_one_tensorrt():
    if os.environ.get("PIPELINE_PIP_CHECK") != "1":
        pytest.skip("set PIPELINE_PIP_CHECK=1 (a separate step of .ci/run) to ask the package index (~30 s)")
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_stack_check.py"), "--route", "cuda12"],
                            capture_output=True, text=True, timeout=420)
    out = result.stdout
    if out.startswith("skipped:"):
        pytest.skip(out.strip())
    assert result.returncode == 0, out + result.stderr
    lines = [line.strip() for line in out.splitlines()]
    assert any(line.startswith("onnxruntime-gpu 1.24.") and ": CUDA 12 (" in line for line in lines), out
    assert any(line.startswith("tensorrt_cu12 ") and ": CUDA 12 (" in line for line in lines), out
    assert not any(line.startswith("tensorrt ") and ": CUDA" in line for line in lines), out  # one build
    assert any(line.startswith("torch ") and ": CUDA 12 (" in line for line in lines) or "torch skipped" in out, out
    assert "stack cuda12: one CUDA major (CUDA 12), one TensorRT" in out, out


def test_offline_is_a_skip_with_its_reason(monkeypatch, capsys):
    monkeypatch.setenv("https_proxy", "http://127.0.0.1:9")  # nothing listens there: the index is unreachable
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")
    assert check.main() == 0
    assert capsys.readouterr().out.startswith("skipped: the package index https://pypi.org/simple/ is unreachable")
