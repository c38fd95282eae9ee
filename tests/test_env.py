"""The environment the pipeline records, and the install rules it relies on."""

import dataclasses
import os
import sys

import pytest

from pipeline.core import env


@pytest.fixture
def fresh_tensorrt_status():
    env.tensorrt_status.cache_clear()
    yield
    env.tensorrt_status.cache_clear()


def test_exactly_one_onnxruntime_distribution():
    """onnxruntime and onnxruntime-gpu overwrite each other's files; the install must bring one."""
    assert env.onnxruntime_conflict() is None
    assert env.package_version("onnxruntime") or env.package_version("onnxruntime-gpu")


def test_both_onnxruntime_distributions_are_named_with_the_fix(monkeypatch):
    installed = {"onnxruntime": "1.22.0", "onnxruntime-gpu": "1.22.0"}
    monkeypatch.setattr(env, "package_version", installed.get)
    message = env.onnxruntime_conflict()
    assert "both onnxruntime and onnxruntime-gpu are installed" in message and "pip uninstall" in message
    del installed["onnxruntime"]
    assert env.onnxruntime_conflict() is None


@pytest.mark.parametrize("flags, native", [
    ({"fpu", "avx2", "amx_bf16", "amx_tile"}, True),  # Sapphire Rapids
    ({"fpu", "avx512f", "avx512_bf16"}, True),  # Cooper Lake, Zen 4
    ({"fpu", "avx2", "avx512f"}, False),  # bf16 emulated: autocast would slow training down
    (set(), False),  # no /proc/cpuinfo
])
def test_native_bf16_follows_the_cpu_flags(monkeypatch, flags, native):
    monkeypatch.setattr(env, "cpu_flags", lambda: flags)
    assert env.cpu_has_native_bf16() is native
    assert env.collect()["cpu_native_bf16"] is native


def test_collect_records_the_libraries_this_process_uses():
    import torch

    info = env.collect()
    assert info["torch"] == torch.__version__ and info["torch_threads"] == torch.get_num_threads()
    assert "CPUExecutionProvider" in info["onnxruntime_providers"]
    assert info["cpu_cores"] == env.usable_cores() >= 1
    assert (info["gpu"] is None) is (not torch.cuda.is_available())


def test_usable_cores_are_the_ones_this_process_may_run_on(monkeypatch):
    monkeypatch.setattr(env.os, "sched_getaffinity", lambda pid: {2, 3}, raising=False)
    assert env.usable_cores() == 2


def test_missing_tensorrt_is_a_reason_with_the_install_hint(monkeypatch, fresh_tensorrt_status):
    monkeypatch.setitem(sys.modules, "tensorrt", None)  # import tensorrt -> ImportError
    trt, reason = env.tensorrt_status()
    assert trt is None and reason.startswith("TensorRT is not installed") and "'gpu' extra" in reason


def test_broken_tensorrt_install_is_a_reason_not_a_crash(monkeypatch, tmp_path, fresh_tensorrt_status):
    (tmp_path / "tensorrt.py").write_text("raise OSError('libnvinfer.so.10: cannot open shared object file')\n")
    monkeypatch.delitem(sys.modules, "tensorrt", raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    trt, reason = env.tensorrt_status()
    assert trt is None and reason == ("TensorRT failed to import: OSError: libnvinfer.so.10: "
                                      "cannot open shared object file")


def test_tensorrt_type_stubs_alone_count_as_not_installed(monkeypatch, tmp_path, fresh_tensorrt_status):
    """tensorrt-stubs puts tensorrt/__init__.pyi in site-packages: `import tensorrt` then succeeds as an empty
    namespace package with no __version__, which must not pass for an installed TensorRT."""
    (tmp_path / "tensorrt").mkdir()
    (tmp_path / "tensorrt" / "__init__.pyi").write_text("from tensorrt_bindings import tensorrt\n")
    monkeypatch.setitem(sys.modules, "tensorrt", None)  # so that teardown removes the namespace package again
    del sys.modules["tensorrt"]
    monkeypatch.syspath_prepend(str(tmp_path))
    import tensorrt  # the namespace package really imports

    assert not hasattr(tensorrt, "__version__")
    trt, reason = env.tensorrt_status()
    assert trt is None and reason.startswith("TensorRT is not installed")
    assert "tensorrt is importable but has no __version__ (type stubs only?)" in reason and str(tmp_path) in reason
    assert env.collect()["tensorrt"] is None


# --------------------------------------------------------------------------- libcudart for Polygraphy


@pytest.fixture
def cu13_wheel(tmp_path, monkeypatch):
    """A site-packages folder laid out as the CUDA 13 runtime wheel installs it, first on sys.path."""
    site_packages = tmp_path / "site-packages"
    lib = site_packages / "nvidia" / "cu13" / "lib"
    lib.mkdir(parents=True)
    (lib / "libcudart.so.13").write_bytes(b"\x7fELF not really")
    monkeypatch.setattr(sys, "path", [str(site_packages), *sys.path])
    monkeypatch.setenv("LD_LIBRARY_PATH", "/opt/elsewhere")
    return lib / "libcudart.so.13"


def test_libcudart_of_the_cuda13_runtime_wheel_is_found(cu13_wheel):
    assert env.find_libcudart() == str(cu13_wheel)
    assert str(cu13_wheel.parent) in env.libcudart_search_dirs()


def test_cuda12_wheel_layout_is_found_too(tmp_path, monkeypatch):
    lib = tmp_path / "sp" / "nvidia" / "cuda_runtime" / "lib"
    lib.mkdir(parents=True)
    (lib / "libcudart.so.12").write_bytes(b"")
    monkeypatch.setattr(sys, "path", [str(tmp_path / "sp"), *sys.path])
    monkeypatch.delenv("LD_LIBRARY_PATH", raising=False)
    assert env.find_libcudart() == str(lib / "libcudart.so.12")


def test_polygraphy_cuda_wrapper_finds_the_exposed_libcudart(cu13_wheel):
    """Polygraphy's own search (what ``Cuda()`` loads from) does not look in nvidia/cu13/lib; after
    ``expose_libcudart`` it finds the wheel's library first. Nothing is loaded: this machine has no GPU."""
    from polygraphy.cuda import cuda as pg_cuda
    from polygraphy.util import util as pg_util

    before = pg_util.find_in_dirs("libcudart.so*", pg_cuda._find_cuda_lib_dirs())
    assert str(cu13_wheel) not in before
    assert env.expose_libcudart() == str(cu13_wheel)
    assert os.environ["LD_LIBRARY_PATH"] == f"{cu13_wheel.parent}{os.pathsep}/opt/elsewhere"
    assert pg_util.find_in_dirs("libcudart.so*", pg_cuda._find_cuda_lib_dirs())[0] == str(cu13_wheel)
    env.expose_libcudart()  # idempotent
    assert os.environ["LD_LIBRARY_PATH"].count(str(cu13_wheel.parent)) == 1


def test_doctor_shows_where_libcudart_was_found(cu13_wheel, capsys):
    from conftest import cli

    assert cli("doctor") == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("libcudart"))
    assert line.split(None, 1)[1] == f"found at {cu13_wheel}"


def test_doctor_says_what_it_searched_when_libcudart_is_absent(monkeypatch):
    from pipeline import doctor

    facts = dataclasses.replace(doctor.gather(), libcudart=None)
    line = next(line for line in doctor.lines(facts) if line.startswith("libcudart"))
    assert line.split(None, 1)[1].startswith("not found: searched LD_LIBRARY_PATH, site-packages nvidia/cu13/lib")
