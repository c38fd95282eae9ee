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


@pytest.mark.network
def test_pip_resolves_the_declared_gpu_stack_to_cuda13():
    if os.environ.get("PIPELINE_PIP_CHECK") != "1":
        pytest.skip("set PIPELINE_PIP_CHECK=1 (a separate step of .ci/run) to ask the package index (~45 s)")
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_stack_check.py")], capture_output=True,
                            text=True, timeout=420)
    out = result.stdout
    if out.startswith("skipped:"):
        pytest.skip(out.strip())
    assert result.returncode == 0, out + result.stderr
    lines = out.splitlines()
    assert any(line.strip().startswith("torch ") and ": CUDA 13 (" in line for line in lines), out
    assert any(line.strip().startswith("onnxruntime-gpu ") and ": CUDA 13 (" in line for line in lines), out
    assert any(line.strip().startswith("tensorrt ") and "(tensorrt_cu13==" in line for line in lines), out
    assert "stopped at tensorrt_cu13_libs" in out or "resolved with its dependencies" in out, out


def test_offline_is_a_skip_with_its_reason(monkeypatch, capsys):
    monkeypatch.setenv("https_proxy", "http://127.0.0.1:9")  # nothing listens there: the index is unreachable
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")
    assert check.main() == 0
    assert capsys.readouterr().out.startswith("skipped: the package index https://pypi.org/simple/ is unreachable")
