"""``python -m pipeline doctor``: the software stack, one line per part, and every mismatch with its fix.

The checks are pure functions of a :class:`MachineFacts` (:func:`gather` reads this machine), so tests can
feed them any stack, such as a CUDA 12 ONNX Runtime beside a CUDA 13 torch. ``all`` logs the problems
:func:`problems` finds before it starts. verify and benchmark decide availability per backend themselves
(the table's ``unavailable`` checks), so a runtime that cannot run here is "skipped: <reason>" there.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import io
import os
import platform
import re
from dataclasses import dataclass

from pipeline.core import deployment, env
from pipeline.core.errors import BackendUnavailable, first_line

# The ONNX Runtime GPU provider the tool runs (the onnxrt_cuda_* backends). onnxruntime-gpu also lists
# TensorrtExecutionProvider in every wheel, but it loads only beside the TensorRT major that wheel was built for
# (NVIDIA's migration guide: "ONNX Runtime 1.27+ supports TensorRT 11.x") and the tool never uses it: TensorRT runs
# through Polygraphy. It is listed in doctor's line, never load-tested, never a mismatch.
GPU_PROVIDERS = ("CUDAExecutionProvider",)
NOT_USED_PROVIDERS = ("TensorrtExecutionProvider",)
# What nvidia-modelopt 0.47's torch side imports beyond its own requirements (modelopt.torch.utils.dataset_utils:
# requests; modelopt.torch.opt.plugins.huggingface: huggingface_hub): the `qat` extra in pyproject.toml.
QAT_MODULES = ("requests", "huggingface_hub")


@dataclass(frozen=True)
class Driver:
    """The NVIDIA driver as NVML reports it: its version and the newest CUDA it runs ("12.8")."""

    version: str
    cuda: str


@dataclass(frozen=True)
class Gpu:
    """The GPU torch sees (:func:`pipeline.core.env.gpu_info`)."""

    name: str
    compute_capability: str
    driver: str | None = None  # nvidia-smi's driver version; None when it cannot be asked

    @classmethod
    def of(cls, info: dict | None) -> Gpu | None:
        """The GPU of :func:`pipeline.core.env.gpu_info`'s record (None: no GPU)."""
        if info is None:
            return None
        return cls(info["name"], info["compute_capability"], info.get("driver"))


@dataclass(frozen=True)
class OnnxRuntime:
    """ONNX Runtime's build and providers (``version`` None: not installed)."""

    version: str | None = None
    package: str = "onnxruntime"
    cuda: str | None = None  # the CUDA its GPU build was made for
    listed: tuple[str, ...] = ()  # the providers it lists
    loads: tuple[str, ...] = ()  # those that really load here
    conflict: str | None = None  # two ONNX Runtime packages installed side by side, with the fix


@dataclass(frozen=True)
class Threads:
    torch: int
    omp_num_threads: str | None  # OMP_NUM_THREADS; None: unset


@dataclass(frozen=True)
class Cpu:
    model: str
    cores: int
    isa: tuple[str, ...]  # the ISA flags the tool cares about (env.ISA_FLAGS)
    simulated: str | None = None  # PIPELINE_CPU_FLAGS when it stands in for the real flags


@dataclass(frozen=True)
class MachineFacts:
    """This machine's stack, as :func:`gather` reads it; the checks below are pure functions of it, so tests feed
    them any stack."""

    python: str
    torch: str
    torch_cuda: str | None  # torch's CUDA build; None: CPU-only
    gpu: Gpu | None  # None: no usable CUDA GPU, and gpu_reason says why
    gpu_reason: str
    onnxruntime: OnnxRuntime
    tensorrt: str | None  # None: not installed or not importable, and tensorrt_reason says why
    tensorrt_reason: str
    tensorrt_cuda: int | None  # the CUDA major of the one TensorRT build installed
    libcudart: str | None
    polygraphy: str | None
    modelopt: str | None
    openvino: str | None
    threads: Threads
    cpu: Cpu
    tensorrt_builds: tuple[int, ...] = ()  # the CUDA majors of every TensorRT build installed
    driver: Driver | None = None
    qat_missing: tuple[str, ...] | None = None  # the qat stage's imports that are missing; None: not looked
    openvino_capabilities: tuple[str, ...] = ()


@dataclass(frozen=True)
class Problem:
    part: str  # "cuda", "tensorrt", "onnxruntime", ...
    message: str  # what is wrong and how to fix it, one line


def major(version: str | None) -> int | None:
    match = re.match(r"\s*(\d+)", version or "")
    return int(match.group(1)) if match else None


# --------------------------------------------------------------------------- facts


# The oldest Linux driver each CUDA major runs on (CUDA's release notes, table "CUDA Toolkit and Minimum
# Required Driver Version"; 12.x through minor-version compatibility).
DRIVER_MIN = {13: "580.65.06", 12: "525.60.13"}


def tensorrt_cuda_majors() -> list[int]:
    """The CUDA majors of the TensorRT builds installed, from their wheels' names (tensorrt_cu13,
    tensorrt-cu12-libs, ...): two entries mean two TensorRT builds side by side."""
    majors = set()
    for dist in importlib.metadata.distributions():
        match = re.fullmatch(r"tensorrt[-_]cu(\d+)([-_].*)?", (dist.metadata["Name"] or "").lower())
        if match:
            majors.add(int(match.group(1)))
    return sorted(majors)


def tensorrt_cuda_major() -> int | None:
    """The CUDA major TensorRT's wheels were built for; None when there is none (or more than one)."""
    majors = tensorrt_cuda_majors()
    return majors[0] if len(majors) == 1 else None


def nvml_driver() -> Driver | None:
    """The NVIDIA driver as NVML reports it (works where CUDA itself cannot start, e.g. a driver too old for
    torch's CUDA): ``Driver("570.86.15", "12.8")``; None without a driver or NVML."""
    try:
        import pynvml  # nvidia-ml-py, a dependency of torch's CUDA builds
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # no driver, or no NVIDIA GPU
        return None
    try:
        version = pynvml.nvmlSystemGetDriverVersion()
        cuda = int(pynvml.nvmlSystemGetCudaDriverVersion())  # 12080 for 12.8: the newest CUDA the driver runs
        return Driver(version.decode() if isinstance(version, bytes) else str(version),
                      f"{cuda // 1000}.{cuda % 1000 // 10}")
    except Exception:
        return None
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def driver_problem(facts: MachineFacts) -> str | None:
    """Why torch's CUDA cannot run on this driver (too old for its CUDA major), in one line; None otherwise."""
    driver, torch_major = facts.driver, major(facts.torch_cuda)
    if not driver or not torch_major or major(driver.cuda) is None or major(driver.cuda) >= torch_major:
        return None
    minimum = DRIVER_MIN.get(torch_major, "a newer one")
    return (f"the NVIDIA driver {driver.version} runs CUDA up to {driver.cuda}, but torch {facts.torch} "
            f"is a CUDA {facts.torch_cuda} build (driver >= {minimum}): update the driver, or take the CUDA "
            f"{major(driver.cuda)} route (docs/export-and-build.md)")


def find_libcudart() -> str | None:
    """The CUDA runtime library, as :func:`pipeline.core.env.find_libcudart` finds it for Polygraphy's TensorRT
    runner."""
    return env.find_libcudart()


@functools.lru_cache(maxsize=None)
def provider_loads(provider: str) -> tuple[bool, str]:
    """Whether ONNX Runtime really runs a one-node model on ``provider`` (listed is not loaded)."""
    try:
        import onnxruntime as ort
        from onnx import TensorProto, helper
    except ImportError as exc:
        return False, f"ONNX Runtime is not installed ({exc})"
    if provider not in ort.get_available_providers():
        return False, f"ONNX Runtime {ort.__version__} does not list {provider}"
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "probe",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = min(model.ir_version, 9)
    options = ort.SessionOptions()
    options.log_severity_level = 4  # the failure is reported below, in one line
    # ONNX Runtime prints a failed provider's errors (stdout and its own logger): the reason is returned instead.
    ort.set_default_logger_severity(4)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            session = ort.InferenceSession(model.SerializeToString(), options,
                                           providers=[provider, "CPUExecutionProvider"])
    except Exception as exc:  # a provider library that fails to load raises from the session
        return False, f"{provider} failed to load: {first_line(exc)[:200]}"
    finally:
        ort.set_default_logger_severity(2)  # ONNX Runtime's default: warnings
    if session.get_providers()[0] != provider:
        return False, (f"{provider} is listed but does not load (missing CUDA libraries?); "
                       "the session fell back to the CPU")
    return True, ""


def onnxruntime_facts(gpu: bool) -> OnnxRuntime:
    """ONNX Runtime's build and providers; GPU providers are load-tested only where a GPU is visible."""
    try:
        import onnxruntime as ort
        from onnxruntime.capi import build_and_package_info as build_info
    except ImportError:
        return OnnxRuntime()
    listed = tuple(ort.get_available_providers())
    return OnnxRuntime(
        version=ort.__version__,
        package=getattr(build_info, "package_name", "onnxruntime"),
        cuda=getattr(build_info, "cuda_version", None) or None,
        listed=listed,
        loads=tuple(p for p in listed if p == "CPUExecutionProvider"
                    or (p not in NOT_USED_PROVIDERS and (gpu or p not in GPU_PROVIDERS) and provider_loads(p)[0])),
        conflict=env.onnxruntime_conflict(),
    )


def gather() -> MachineFacts:
    """This machine's stack. Imports torch and ONNX Runtime; TensorRT only if installed."""
    import torch

    trt, trt_reason = env.tensorrt_status()
    gpu_ok, gpu_reason = env.cuda_status()
    flags = env.cpu_flags()
    return MachineFacts(
        python=platform.python_version(),
        torch=torch.__version__,
        torch_cuda=torch.version.cuda,
        gpu=Gpu.of(env.gpu_info()) if gpu_ok else None,
        gpu_reason=gpu_reason,
        onnxruntime=onnxruntime_facts(gpu_ok),
        tensorrt=getattr(trt, "__version__", None),
        tensorrt_reason=trt_reason,
        tensorrt_cuda=tensorrt_cuda_major(),
        tensorrt_builds=tuple(tensorrt_cuda_majors()),
        driver=nvml_driver(),
        libcudart=find_libcudart(),
        polygraphy=env.package_version("polygraphy"),
        modelopt=env.package_version("nvidia-modelopt"),
        qat_missing=tuple(qat_missing()),
        openvino=env.package_version("openvino"),
        openvino_capabilities=tuple(_openvino_capabilities()),
        threads=Threads(torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS")),
        cpu=Cpu(env.cpu_model(), env.usable_cores(), tuple(f for f in env.ISA_FLAGS if f in flags),
                env.cpu_flags_simulated()),
    )


# --------------------------------------------------------------------------- checks


def cuda_mismatches(facts: MachineFacts) -> list[Problem]:
    """Parts built for another CUDA major than torch's, each with the fix. Empty when torch is CPU-only."""
    torch_major = major(facts.torch_cuda)
    problems = []
    ort = facts.onnxruntime
    if ort.conflict:
        problems.append(Problem("onnxruntime", ort.conflict))
    ort_major = major(ort.cuda)
    if torch_major and ort_major and ort_major != torch_major:
        fix = ("install onnxruntime-gpu>=1.31 or the CUDA 12 torch" if torch_major >= 13 else
               "install onnxruntime-gpu 1.24.x (a CUDA 12 build) or the CUDA 13 torch")
        problems.append(Problem("onnxruntime", f"{ort.package} {ort.version} is a CUDA {ort_major} "
                                               f"build; torch uses CUDA {facts.torch_cuda}: {fix}"))
    builds = facts.tensorrt_builds
    if len(builds) > 1:
        names = ", ".join(f"tensorrt_cu{b}" for b in builds)
        keep = torch_major if torch_major in builds else builds[-1]
        problems.append(Problem("tensorrt", f"{len(builds)} TensorRT builds are installed ({names}); their bindings "
                                            "may share one top-level folder: pip uninstall -y tensorrt "
                                            + " ".join(f"tensorrt-cu{b} tensorrt-cu{b}-libs tensorrt-cu{b}-bindings"
                                                       for b in builds)
                                            + f", then pip install \"tensorrt-cu{keep}>=10.12\" (one build)"))
    trt_major = facts.tensorrt_cuda
    if torch_major and trt_major and trt_major != torch_major:
        problems.append(Problem("tensorrt", f"TensorRT {facts.tensorrt} is built for CUDA {trt_major}; torch "
                                            f"uses CUDA {facts.torch_cuda}: install tensorrt-cu{torch_major} "
                                            f"or the CUDA {trt_major} torch"))
    return problems


def problems(facts: MachineFacts) -> list[Problem]:
    """Every mismatch on this stack: CUDA majors, providers that are listed but do not load, libcudart."""
    found = cuda_mismatches(facts)
    driver = driver_problem(facts)
    if driver and not facts.gpu:
        found.insert(0, Problem("driver", driver))
    ort = facts.onnxruntime
    if facts.gpu:
        for provider in (p for p in ort.listed if p in GPU_PROVIDERS and p not in ort.loads):
            found.append(Problem("onnxruntime", f"{provider} is listed but does not load on this GPU: "
                                                f"{provider_loads(provider)[1]}"))
    if facts.tensorrt and not facts.libcudart:
        found.append(Problem("tensorrt", "libcudart is not found (Polygraphy's TensorRT runner needs it): install "
                                         "the CUDA runtime wheel (nvidia-cuda-runtime) or add its lib folder to "
                                         "LD_LIBRARY_PATH"))
    return found


def requirement_problem(facts: MachineFacts, required: str) -> str | None:
    """Why ``--require cuda|tensorrt`` cannot be met here, in one line; None when it can."""
    if not facts.gpu:
        return f"--require {required}: {driver_problem(facts) or facts.gpu_reason or 'no CUDA GPU'}"
    if required == "tensorrt" and not facts.tensorrt:
        return f"--require tensorrt: {facts.tensorrt_reason}"
    blocking = [p for p in problems(facts) if required == "cuda" or p.part == "tensorrt"]
    if blocking:
        return f"--require {required}: {blocking[0].message}"
    return None


# --------------------------------------------------------------------------- report


def lines(facts: MachineFacts) -> list[str]:
    """The stack, one line per part."""
    gpu, cpu = facts.gpu, facts.cpu
    return [
        f"python       {facts.python}",
        f"torch        {facts.torch} ({'CUDA ' + facts.torch_cuda if facts.torch_cuda else 'CPU-only build'})",
        "gpu          " + (f"{gpu.name} (compute {gpu.compute_capability}), driver {gpu.driver or '?'}"
                           if gpu else f"none: {driver_problem(facts) or facts.gpu_reason}"),
        f"onnxruntime  {_onnxruntime_words(facts.onnxruntime)}",
        "tensorrt     " + (f"{facts.tensorrt} (CUDA {facts.tensorrt_cuda or '?'} build)" if facts.tensorrt
                           else f"none: {facts.tensorrt_reason}"),
        f"triton       {deployment.describe_releases(facts.tensorrt)} (deploy --target triton; docs/deploy.md)",
        f"triton-onnx  {_onnx_releases()}",
        "triton-ir    OpenVINO IRs: per model in deploy.json (`loads_in`: the IR's opsets against each release's "
        "OpenVINO; docs/deploy.md)",
        "libcudart    " + (f"found at {facts.libcudart}" if facts.libcudart else
                           "not found: searched LD_LIBRARY_PATH, site-packages nvidia/cu13/lib and "
                           "nvidia/cuda_runtime/lib, /usr/local/cuda"),
        f"polygraphy   {facts.polygraphy or 'not installed'}",
        f"modelopt     {facts.modelopt or 'not installed'}" + _qat_words(facts),
        f"openvino     {facts.openvino or 'not installed'}"
        + (f"; CPU plugin capabilities {' '.join(facts.openvino_capabilities) or 'unknown'}"
           if facts.openvino else ""),
        *cpu_precision_lines(facts),
        f"threads      torch {facts.threads.torch}, "
        f"OMP_NUM_THREADS={facts.threads.omp_num_threads or 'unset'}",
        f"cpu          {cpu.model}, {cpu.cores} cores; {' '.join(cpu.isa) or 'no AVX2'}"
        + (f" (simulated by {env.CPU_FLAGS_ENV})" if cpu.simulated is not None else ""),
        "pycuda       not needed (Polygraphy brings its own CUDA wrapper; TensorRT's samples use cuda-python)",
    ]


def _onnxruntime_words(ort: OnnxRuntime) -> str:
    """ONNX Runtime's line: its build, the providers it lists and those that load."""
    if not ort.version:
        return "not installed"
    return (f"{ort.package} {ort.version}" + (f" (CUDA {ort.cuda} build)" if ort.cuda else "")
            + f"; lists {', '.join(ort.listed)}; loads {', '.join(ort.loads)}"
            + "".join(f" ({p} not used: TensorRT runs through Polygraphy)"
                      for p in NOT_USED_PROVIDERS if p in ort.listed))


def _onnx_releases() -> str:
    """The Triton releases whose ONNX Runtime loads the graphs export writes by default (export.opset and the ONNX
    IR version that opset needs), from Triton's compatibility page and ONNX Runtime's (docs/deploy.md)."""
    from pipeline.core.config_schema import ExportConfig

    opset = ExportConfig().opset
    try:
        from onnx import helper

        ir_version = helper.find_min_ir_version_for([helper.make_opsetid("", opset)])
    except ImportError:
        return f"export.opset {opset}: onnx is not installed"
    return f"{deployment.describe_onnx_releases(opset, ir_version)} (export.opset default)"


def qat_missing() -> list[str]:
    """The modules ModelOpt's PyTorch quantization (the qat stage) imports that are not installed (found without
    importing them: ModelOpt's torch side takes seconds to import)."""
    import importlib.util

    return [m for m in QAT_MODULES if importlib.util.find_spec(m) is None]


def _qat_words(facts: MachineFacts) -> str:
    missing = facts.qat_missing
    if missing is None or not facts.modelopt:
        return ""
    if not missing:
        return "; PyTorch quantization (qat) importable"
    return f"; PyTorch quantization (qat) needs {', '.join(missing)}: pip install -e '.[qat]'"


def _openvino_capabilities() -> list[str]:
    from pipeline.runtime.builders import openvino_ir

    try:
        return openvino_ir.cpu_capabilities()
    except Exception:  # a broken OpenVINO install: the version line says what is installed
        return []


def cpu_precision_lines(facts: MachineFacts) -> list[str]:
    """The CPU's bf16 and int8 units, from its flags (``PIPELINE_CPU_FLAGS`` when simulated) and OpenVINO's view."""
    isa, caps = set(facts.cpu.isa), facts.openvino_capabilities
    ov = (lambda cap: f"; OpenVINO {'lists' if cap in caps else 'does not list'} {cap}") if facts.openvino \
        else (lambda cap: "")
    bf16 = sorted(isa & env.BF16_FLAGS)
    int8 = sorted(isa & env.INT8_DOT_FLAGS)
    return [
        "cpu bf16     " + (f"native ({' '.join(bf16)})" if bf16 else "none: no amx_bf16/avx512_bf16 (bf16 emulated, "
                                                                      "openvino_bf16 skipped)") + ov("BF16"),
        "cpu int8     " + (f"VNNI/AMX ({' '.join(int8)})" if int8 else "no VNNI/AMX (int8 without dot-product units)")
        + ov("INT8"),
    ]


def run(required: list[str] = ()) -> int:
    """Print the stack and its problems; 0 when coherent, ``BackendUnavailable`` (exit 3) for an unmet requirement."""
    facts = gather()
    for line in lines(facts):
        print(line)
    found = problems(facts)
    for problem in found:
        print(f"mismatch     {problem.part}: {problem.message}")
    for required_part in required:
        reason = requirement_problem(facts, required_part)
        if reason:
            raise BackendUnavailable(reason)
    print("stack        coherent" if not found else f"stack        {len(found)} mismatch(es), see above")
    return 0
