"""pipeline doctor: the stack's facts, mismatches with their fixes, and --require."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pipeline import doctor
from pipeline.doctor import Cpu, Driver, Gpu, MachineFacts, OnnxRuntime, Threads

# What `onnxruntime.get_available_providers()` returns for an onnxruntime-gpu wheel (1.24 and 1.31 alike): the
# TensorRT provider is compiled into every one of them and listed whether or not a matching TensorRT is installed.
REAL_GPU_WHEEL_PROVIDERS = ("TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider")


def stack(**changes) -> MachineFacts:
    """A coherent CUDA 13 GPU stack; ``changes`` replace parts of it."""
    facts = MachineFacts(
        python="3.12.3", torch="2.13.0+cu130", torch_cuda="13.0",
        gpu=Gpu(name="NVIDIA H200", compute_capability="9.0", driver="580.65"), gpu_reason="",
        onnxruntime=OnnxRuntime(version="1.31.0", package="onnxruntime-gpu", cuda="13.0",
                                # every onnxruntime-gpu wheel lists the TensorRT provider (TensorRT, CUDA, CPU),
                                # loadable or not
                                listed=REAL_GPU_WHEEL_PROVIDERS,
                                loads=("CUDAExecutionProvider", "CPUExecutionProvider"), conflict=None),
        tensorrt="11.1.0", tensorrt_reason="", tensorrt_cuda=13,
        libcudart="/x/nvidia/cu13/lib/libcudart.so.13",
        polygraphy="0.53.6", modelopt="0.47.0", openvino=None,
        threads=Threads(torch=8, omp_num_threads=None),
        cpu=Cpu(model="Test CPU", cores=8, isa=("avx2",), simulated=None),
    )
    return replace(facts, **changes)


def test_a_coherent_cuda13_stack_has_no_problems_and_meets_both_requirements():
    facts = stack()
    assert doctor.problems(facts) == []
    assert doctor.requirement_problem(facts, "cuda") is None
    assert doctor.requirement_problem(facts, "tensorrt") is None
    assert len(doctor.lines(facts)) == 17  # the cpu bf16 and int8 lines, the Triton release and ONNX/IR ones


def test_a_cuda12_onnxruntime_beside_a_cuda13_torch_is_named_with_the_fix():
    ort = replace(stack().onnxruntime, version="1.24.4", cuda="12.8")
    facts = stack(onnxruntime=ort)
    (problem,) = doctor.problems(facts)
    assert problem.message == ("onnxruntime-gpu 1.24.4 is a CUDA 12 build; torch uses CUDA 13.0: "
                               "install onnxruntime-gpu>=1.31 or the CUDA 12 torch")
    assert doctor.requirement_problem(facts, "cuda") == f"--require cuda: {problem.message}"
    assert doctor.requirement_problem(facts, "tensorrt") is None  # TensorRT itself is coherent


def test_tensorrt_for_another_cuda_major_and_a_missing_libcudart():
    facts = stack(tensorrt_cuda=12, libcudart=None)
    messages = [p.message for p in doctor.problems(facts)]
    assert any("TensorRT 11.1.0 is built for CUDA 12; torch uses CUDA 13.0: install tensorrt-cu13" in m
               for m in messages)
    assert any(m.startswith("libcudart is not found") for m in messages)
    assert doctor.requirement_problem(facts, "tensorrt").startswith("--require tensorrt: TensorRT 11.1.0 is built")


def test_a_listed_provider_that_does_not_load_on_a_gpu_is_a_problem(monkeypatch):
    monkeypatch.setattr(doctor, "provider_loads", lambda p: (False, "libcublasLt.so.13: cannot open"))
    ort = replace(stack().onnxruntime, loads=("CPUExecutionProvider",))
    (problem,) = doctor.problems(stack(onnxruntime=ort))
    assert "CUDAExecutionProvider is listed but does not load on this GPU: libcublasLt" in problem.message


def test_without_a_gpu_both_requirements_fail_with_the_reason():
    facts = stack(gpu=None, gpu_reason="no CUDA GPU: this torch build (2.13.0+cpu) is CPU-only", torch_cuda=None)
    assert doctor.problems(facts) == []
    assert doctor.requirement_problem(facts, "cuda") == \
        "--require cuda: no CUDA GPU: this torch build (2.13.0+cpu) is CPU-only"
    assert doctor.requirement_problem(facts, "tensorrt").startswith("--require tensorrt: no CUDA GPU")


def test_the_tensorrt_provider_that_does_not_load_is_no_mismatch_on_a_coherent_stack():
    """The gpu-cu12 stack: onnxruntime-gpu 1.24 (its TensorRT provider built for TensorRT 10) beside tensorrt-cu12
    11.4. The provider cannot load, the tool never uses it (TensorRT runs through Polygraphy): no mismatch, and
    --require cuda / tensorrt are met."""
    facts = stack(torch="2.13.0+cu128", torch_cuda="12.8", tensorrt="11.4.0", tensorrt_cuda=12,
                  onnxruntime=OnnxRuntime(version="1.24.4", package="onnxruntime-gpu", cuda="12.8",
                                          listed=REAL_GPU_WHEEL_PROVIDERS,
                                          loads=("CUDAExecutionProvider", "CPUExecutionProvider"), conflict=None))
    assert doctor.problems(facts) == []
    assert doctor.requirement_problem(facts, "cuda") is None
    assert "TensorrtExecutionProvider not used" in next(x for x in doctor.lines(facts) if x.startswith("onnxruntime"))


def test_doctor_never_load_tests_the_tensorrt_provider(monkeypatch):
    """onnxruntime_facts on a GPU asks only the CUDA provider to load; the TensorRT one is listed, never loaded
    (loading it beside another TensorRT major prints errors and can take seconds)."""
    import onnxruntime as ort

    tried = []
    monkeypatch.setattr(ort, "get_available_providers", lambda: list(REAL_GPU_WHEEL_PROVIDERS))
    monkeypatch.setattr(doctor, "provider_loads", lambda p: tried.append(p) or (p != "TensorrtExecutionProvider", ""))
    for gpu in (True, False):
        facts = doctor.onnxruntime_facts(gpu)
        assert "TensorrtExecutionProvider" in facts.listed and "TensorrtExecutionProvider" not in facts.loads
    assert tried == ["CUDAExecutionProvider"]


@pytest.mark.parametrize("version, expected", [("13.0", 13), ("12.8", 12), (None, None), ("", None)])
def test_major(version, expected):
    assert doctor.major(version) == expected


def test_gather_reads_this_machine():
    facts = doctor.gather()
    assert facts.python and facts.torch
    assert "CPUExecutionProvider" in facts.onnxruntime.loads
    assert doctor.provider_loads("CPUExecutionProvider") == (True, "")
    assert doctor.provider_loads("NoSuchExecutionProvider")[0] is False


def test_doctor_command_prints_the_stack_and_exits_0_here(capsys):
    from conftest import cli

    assert cli("doctor") == 0
    out = capsys.readouterr().out
    for part in ("python", "torch", "onnxruntime", "tensorrt", "libcudart", "polygraphy", "modelopt", "cpu"):
        assert any(line.startswith(part) for line in out.splitlines()), part


@pytest.mark.parametrize("required", ["cuda", "tensorrt"])
def test_doctor_require_exits_3_with_one_line_where_it_is_missing(capsys, monkeypatch, required):
    from conftest import cli

    monkeypatch.setattr(doctor.env, "cuda_status", lambda: (False, "no CUDA GPU: simulated"))
    assert cli("doctor", "--require", required) == 3
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert errors == [f"error: doctor: --require {required}: no CUDA GPU: simulated"]


def test_two_tensorrt_builds_are_a_mismatch_with_the_fix():
    facts = stack(tensorrt_cuda=None, tensorrt_builds=(12, 13))
    (problem,) = doctor.problems(facts)
    assert problem.part == "tensorrt" and problem.message.startswith("2 TensorRT builds are installed "
                                                                     "(tensorrt_cu12, tensorrt_cu13)")
    assert "pip uninstall -y tensorrt tensorrt-cu12 " in problem.message
    assert problem.message.endswith('then pip install "tensorrt-cu13>=10.12" (one build)')  # torch's CUDA 13
    assert doctor.requirement_problem(facts, "tensorrt") == f"--require tensorrt: {problem.message}"


def test_tensorrt_builds_are_read_from_every_installed_distribution(monkeypatch):
    from types import SimpleNamespace

    names = ["numpy", "tensorrt", "tensorrt_cu13", "tensorrt_cu13_libs", "tensorrt-cu12", "tensorrt_cu12_bindings"]
    monkeypatch.setattr(doctor.importlib.metadata, "distributions",
                        lambda: [SimpleNamespace(metadata={"Name": n}) for n in names])
    assert doctor.tensorrt_cuda_majors() == [12, 13]
    assert doctor.tensorrt_cuda_major() is None  # not one build: no single answer
    monkeypatch.setattr(doctor.importlib.metadata, "distributions",
                        lambda: [SimpleNamespace(metadata={"Name": n}) for n in names[:4]])
    assert doctor.tensorrt_cuda_majors() == [13] and doctor.tensorrt_cuda_major() == 13


def test_a_driver_older_than_torch_s_cuda_is_named_as_the_cause():
    facts = stack(gpu=None, gpu_reason="no CUDA GPU visible (torch.cuda.is_available() is False)",
                  driver=Driver(version="570.86.15", cuda="12.8"))
    message = ("the NVIDIA driver 570.86.15 runs CUDA up to 12.8, but torch 2.13.0+cu130 is a CUDA 13.0 build "
               "(driver >= 580.65.06): update the driver, or take the CUDA 12 route (docs/export-and-build.md)")
    assert doctor.problems(facts)[0] == doctor.Problem("driver", message)
    assert doctor.requirement_problem(facts, "cuda") == f"--require cuda: {message}"
    assert f"gpu          none: {message}" in doctor.lines(facts)
    new_enough = stack(gpu=None, gpu_reason="no CUDA GPU visible", driver=Driver(version="580.65.06", cuda="13.0"))
    assert doctor.requirement_problem(new_enough, "cuda") == "--require cuda: no CUDA GPU visible"


def test_nvml_driver_reads_nvml(monkeypatch):
    import sys
    from types import SimpleNamespace

    fake = SimpleNamespace(nvmlInit=lambda: None, nvmlShutdown=lambda: None,
                           nvmlSystemGetDriverVersion=lambda: "570.86.15", nvmlSystemGetCudaDriverVersion=lambda: 12080)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    assert doctor.nvml_driver() == Driver(version="570.86.15", cuda="12.8")

    def no_driver():
        raise RuntimeError("NVML Shared Library Not Found")

    monkeypatch.setitem(sys.modules, "pynvml", SimpleNamespace(nvmlInit=no_driver))
    assert doctor.nvml_driver() is None


def test_doctor_names_the_triton_release_of_the_tensorrt_here():
    """deploy --target triton: which NGC Triton container runs engines built with this TensorRT (issue 36)."""
    facts = replace(doctor.gather(), tensorrt="10.8.0.43")
    line = next(line for line in doctor.lines(facts) if line.startswith("triton"))
    assert "Triton release 25.02, 25.01" in line and "nvcr.io/nvidia/tritonserver:25.02-py3" in line
    assert "no TensorRT here" in next(x for x in doctor.lines(replace(facts, tensorrt=None)) if x.startswith("triton"))
