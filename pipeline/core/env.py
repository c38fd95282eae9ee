"""What machine and software a run used: recorded in the manifest and in benchmark results."""

from __future__ import annotations

import ctypes.util
import functools
import glob
import importlib.metadata
import importlib.util
import os
import platform
import site
import subprocess
import sys


def package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def onnxruntime_conflict() -> str | None:
    """Both ONNX Runtime distributions installed overwrite each other's files: say so."""
    both = [name for name in ("onnxruntime", "onnxruntime-gpu") if package_version(name)]
    if len(both) == 2:
        return ("both onnxruntime and onnxruntime-gpu are installed; they overwrite each other's files. "
                "Keep one: pip uninstall onnxruntime onnxruntime-gpu, then "
                "pip install --force-reinstall 'onnxruntime-gpu>=1.31' (the project's declared one on Linux x86-64)")
    return None


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# Test hook: a space-separated flag list that replaces /proc/cpuinfo's (e.g. "avx2 fma", or
# "avx512f amx_bf16 avx512_bf16"), so both sides of every CPU-dependent decision can be tested on any
# machine. Whatever it simulates is named in the log and recorded in the manifest, never silent.
CPU_FLAGS_ENV = "PIPELINE_CPU_FLAGS"

# The one table of the CPU features the pipeline decides on (and records, and shows in doctor).
BF16_FLAGS = frozenset({"amx_bf16", "avx512_bf16"})  # bf16 matrix math in hardware
INT8_DOT_FLAGS = frozenset({"avx512_vnni", "avx_vnni", "amx_int8"})  # int8 dot products without saturation
ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8")


def cpu_flags_simulated() -> str | None:
    """The flags given by ``PIPELINE_CPU_FLAGS`` (the test hook), or None when the real CPU is read."""
    return os.environ.get(CPU_FLAGS_ENV)


def cpu_flags() -> set[str]:
    simulated = cpu_flags_simulated()
    if simulated is not None:
        return set(simulated.replace(",", " ").split())
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cpu_has_native_bf16() -> bool:
    """True where bf16 matrix math runs in hardware (AMX or AVX512-BF16), so bf16 autocast pays off."""
    return bool(cpu_flags() & BF16_FLAGS)


def cpu_has_int8_dot_product() -> bool:
    """True where int8 dot products run without 16-bit saturation (VNNI or AMX): ONNX Runtime's u8s8 int8
    kernels on AVX2 or AVX-512 without VNNI can saturate (its quantization docs' reduce_range note)."""
    return bool(cpu_flags() & INT8_DOT_FLAGS)


def memory_bytes() -> int | None:
    """The machine's physical memory (None where the OS does not say): what bounds a benchmark batch."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


# Where pip's CUDA runtime wheels put libcudart: CUDA 13 (nvidia-cuda-runtime 13.x) under nvidia/cu13/lib,
# CUDA 12 (nvidia-cuda-runtime-cu12) under nvidia/cuda_runtime/lib. Polygraphy's CUDA wrapper searches only
# LD_LIBRARY_PATH, /usr/local/cuda/lib64, /usr/lib, /lib and nvidia/cuda_runtime/lib.
CUDART_WHEEL_DIRS = (os.path.join("nvidia", "cu13", "lib"), os.path.join("nvidia", "cuda_runtime", "lib"))


def _python_roots() -> list[str]:
    """site-packages folders and sys.path entries, and where the ``nvidia`` namespace package really lives."""
    roots = [*site.getsitepackages(), site.getusersitepackages(), *sys.path]
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        spec = None
    roots += [os.path.dirname(loc) for loc in (spec.submodule_search_locations or [])] if spec else []
    return list(dict.fromkeys(r for r in roots if r and os.path.isdir(r)))


def libcudart_search_dirs() -> list[str]:
    """Where :func:`find_libcudart` looks, in order: LD_LIBRARY_PATH (the user's choice), the pip runtime
    wheels (CUDA 13, then 12), then the CUDA toolkit."""
    dirs = [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if d]
    dirs += [os.path.join(root, sub) for sub in CUDART_WHEEL_DIRS for root in _python_roots()]
    dirs += ["/usr/local/cuda/lib64", *sorted(glob.glob("/usr/local/cuda/targets/*/lib"))]
    return list(dict.fromkeys(dirs))


def find_libcudart() -> str | None:
    """The CUDA runtime library's path (or its name, when only the system loader knows it); None when absent."""
    for folder in libcudart_search_dirs():
        found = sorted(glob.glob(os.path.join(folder, "libcudart.so*")))
        if found:
            return found[0]
    return ctypes.util.find_library("cudart")


def expose_libcudart() -> str | None:
    """Put the folder of :func:`find_libcudart`'s library first on LD_LIBRARY_PATH, where Polygraphy's CUDA wrapper
    (``polygraphy.cuda``, used by ``TrtRunner``) looks when it is first used; child processes inherit it.

    Call before the first TensorRT runner is made. Returns the library found, or None.
    """
    path = find_libcudart()
    if path and os.path.isabs(path):
        folder = os.path.dirname(path)
        current = [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if d]
        if folder not in current:
            os.environ["LD_LIBRARY_PATH"] = os.pathsep.join([folder, *current])
    return path


@functools.lru_cache(maxsize=1)
def tensorrt_status() -> tuple[object | None, str]:
    """``(tensorrt_module, "")`` or ``(None, reason)``. Imports TensorRT only when asked."""
    try:
        import tensorrt  # noqa: F401
    except ImportError as exc:
        return None, f"TensorRT is not installed ({exc}); install the project's 'gpu' extra on a CUDA machine"
    except Exception as exc:  # a broken install (missing libnvinfer, ...)
        return None, f"TensorRT failed to import: {type(exc).__name__}: {exc}"
    if not getattr(tensorrt, "__version__", None):  # e.g. tensorrt-stubs' tensorrt/__init__.pyi: a namespace only
        where = list(getattr(tensorrt, "__path__", None) or []) or getattr(tensorrt, "__file__", None)
        return None, (f"TensorRT is not installed: tensorrt is importable but has no __version__ (type stubs only?) "
                      f"from {where}; install the project's 'gpu' extra on a CUDA machine")
    return tensorrt, ""


def cuda_status() -> tuple[bool, str]:
    import torch

    if not torch.cuda.is_available():
        if torch.version.cuda is None:
            return False, f"no CUDA GPU: this torch build ({torch.__version__}) is CPU-only"
        return False, "no CUDA GPU visible (torch.cuda.is_available() is False)"
    return True, ""


def gpu_info() -> dict | None:
    import torch

    if not torch.cuda.is_available():
        return None
    index = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    info = {
        "name": props.name,
        "compute_capability": f"{props.major}.{props.minor}",
        "memory_gib": round(props.total_memory / 2**30, 1),
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
    }
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader", f"--id={index}"],
            capture_output=True, text=True, timeout=10, check=True,
        )
        info["driver"] = out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        info["driver"] = None
    return info


def collect() -> dict:
    """The environment of this process. Imports torch; TensorRT only if it is installed."""
    import torch

    trt, _ = tensorrt_status()
    try:
        import onnxruntime

        ort_providers = onnxruntime.get_available_providers()
    except ImportError:
        ort_providers = []
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": cpu_model(),
        "cpu_cores": usable_cores(),
        "cpu_native_bf16": cpu_has_native_bf16(),
        **({"cpu_flags_simulated": cpu_flags_simulated()} if cpu_flags_simulated() is not None else {}),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "onnx": package_version("onnx"),
        "onnxruntime": package_version("onnxruntime") or package_version("onnxruntime-gpu"),
        "onnxruntime_providers": ort_providers,
        "polygraphy": package_version("polygraphy"),
        "modelopt": package_version("nvidia-modelopt"),
        "tensorrt": getattr(trt, "__version__", None),
        "openvino": package_version("openvino"),
        "gpu": gpu_info(),
    }
