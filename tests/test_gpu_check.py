"""scripts/gpu_timing_check.py on the virtual CUDA device (tests/virtual_cuda.py, tests/fake_tensorrt.py) with a
stand-in trtexec (tests/fake_trtexec.py): both engines, batch 1 and 8, with and without CUDA graphs, the inspector's
JSON, and the exit code. On a GPU it measures the real ones; here every rule and every path runs, and a timer that
brackets the launch or an inspector whose layers say no data type fail it (the tolerances themselves:
tests/test_gpu_check_rules.py)."""

from __future__ import annotations

import json
import sys

import pytest

import fake_tensorrt
from conftest import BF16_ON, ROOT, cli
from pipeline.runtime import runners
from test_tensorrt_contract import built, built_run, fake_trt  # noqa: F401  (fixtures)
from test_trtexec import fake_trtexec  # noqa: F401  (fixture)


@pytest.fixture
def check(monkeypatch):
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import gpu_timing_check
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    monkeypatch.setattr(gpu_timing_check, "TINY_METHOD", {"warmup_s": 0, "min_iterations": 3, "min_duration_s": 0,
                                                          "trials": 1, "cv_warn": 0.025})  # virtual time: exact
    monkeypatch.setattr(gpu_timing_check, "REPLAYS", 10)  # K; the fake engine's kernels run ONNX Runtime
    monkeypatch.setattr(gpu_timing_check, "libcudart_section", lambda: {"note": "a child importing torch: seconds"})
    monkeypatch.setattr(gpu_timing_check, "torch_section", lambda: {"note": "not run: PyTorch's own CUDA kernels are "
                                                                            "not modelled", "checks": []})
    return gpu_timing_check


@pytest.fixture
def both_engines(built_run, fake_trt):  # noqa: F811
    # All three engines (TINY has INT8 and BF16 off)
    assert cli("export", "--run-dir", built_run, "export.int8.enabled=true", BF16_ON) == 0
    built(built_run, fake_trt, "export.int8.enabled=true", BF16_ON)
    assert (built_run / "model.int8.engine").is_file()
    return built_run


def statuses(report: dict) -> dict:
    return {c["name"]: c["status"] for c in report["checks"]}


@pytest.mark.parametrize("fake_trt", ["11"], indirect=True)  # TensorRT 11.1's engines, trtexec 11.1
def test_gpu_check_on_the_virtual_device(both_engines, fake_trt, fake_trtexec, check, monkeypatch, tmp_path):  # noqa: F811
    """Every TensorRT question for both engines at batch 1 and 8 passes (exit 0) and dumps each inspector's JSON;
    the defects it is for fail it (exit 1): a timer that brackets the launch (events on an idle stream), and an
    inspector JSON without data types (every matrix layer unknown); without trtexec its checks are skipped
    (exit 3)."""
    monkeypatch.setenv("FAKE_TRTEXEC_VERSION", "11")  # --noCudaGraph for the rows without graphs
    monkeypatch.setenv("FAKE_TRTEXEC_COMPUTE_MS", "virtual")
    prefix = tmp_path / "out" / "gpu_check"
    fake_tensorrt.fresh_process(monkeypatch)  # the script is a process of its own: nothing exposed libcudart yet
    assert check.main([str(both_engines), "--out", str(prefix)]) == 0
    assert fake_trt.violations == [] and fake_trt.libcudart == fake_tensorrt.pip_cuda13_site() + \
        "/nvidia/cu13/lib/libcudart.so.13"
    report = json.loads(prefix.with_suffix(".json").read_text())
    names = statuses(report)
    assert set(names.values()) == {"passed"}, report["checks"]
    for precision in ("fp16", "bf16", "int8"):
        for batch in (1, 8):
            for mode in ("no graphs, the default", "CUDA graphs"):
                where = f"TensorRT {precision} b={batch} ({mode})"
                assert {f"{where}: benchmark timer vs events around 10 launches",
                        f"{where}: benchmark timer vs trtexec computeMs"} <= set(names)
        inspected = report["tensorrt"][precision]["inspector"]
        assert inspected["unknown"] == 0 and inspected["matrix_layers"] > 0
        assert json.loads((tmp_path / "out" / f"gpu_check.inspector.{precision}.json").read_text())["Layers"]
    assert report["tensorrt"]["int8"]["inspector"]["precisions"].get("int8", 0) > 0
    calls = fake_trtexec()
    assert sum("--noCudaGraph" in c for c in calls) == len(calls) // 2 == 6  # 3 precisions x batch 1, 8

    real_timer = runners.QueuedAheadTimer.__call__

    def idle_stream(self):  # the defect: the start event on an idle stream, the launch inside the pair
        import torch

        with torch.cuda.stream(self.stream):
            self.start.record(self.stream)
            self.launch()
            self.end.record(self.stream)
        self.end.synchronize()
        return self.start.elapsed_time(self.end)

    monkeypatch.setattr(runners.QueuedAheadTimer, "__call__", idle_stream)
    monkeypatch.setattr("pipeline.runtime.speed.trtexec.find", lambda: None)  # trtexec's runs done: the rest is quicker
    assert check.main([str(both_engines), "--out", str(prefix)]) == 1
    failed = {n for n, s in statuses(json.loads(prefix.with_suffix(".json").read_text())).items() if s == "failed"}
    assert failed and all("benchmark timer vs" in n for n in failed)
    assert any("events around 10 launches" in n for n in failed)
    monkeypatch.setattr(runners.QueuedAheadTimer, "__call__", real_timer)

    monkeypatch.setattr(check, "inspector_section", _unreadable(check.inspector_section))
    assert check.main([str(both_engines), "--out", str(prefix)]) == 1
    report = json.loads(prefix.with_suffix(".json").read_text())
    failed = {n for n, s in statuses(report).items() if s == "failed"}
    assert failed == {f"TensorRT {p}: inspector reads every matrix layer" for p in ("fp16", "bf16", "int8")}
    assert all(c["detail"] == "not run: trtexec is not on PATH" for c in report["checks"]
               if c["status"] == "skipped")
    monkeypatch.setattr(check, "inspector_section", _unreadable.original)
    assert check.main([str(both_engines), "--out", str(prefix)]) == 3  # trtexec missing: not every check ran


def test_trtexec_of_another_release_is_not_run_with_both_versions(built_run, fake_trt, fake_trtexec, check,  # noqa: F811
                                                                   monkeypatch, tmp_path):
    """trtexec 10.14.1 beside an engine of TensorRT 10.13.0.35: its checks are skipped, "not run: trtexec is TensorRT
    10.14.1, the engine was built by TensorRT 10.13.0.35", not failed (exit 3: not every check ran)."""
    monkeypatch.setenv("FAKE_TRTEXEC_VERSION", "10.14.1")
    prefix = tmp_path / "out" / "gpu_check"
    assert check.main([str(built_run), "--out", str(prefix)]) == 3
    report = json.loads(prefix.with_suffix(".json").read_text())
    trtexec_checks = [c for c in report["checks"] if "trtexec" in c["name"]]
    assert len(trtexec_checks) == 4  # batch 1 and 8, with and without graphs
    assert {(c["status"], c["detail"]) for c in trtexec_checks} == {
        ("skipped", "not run: trtexec is TensorRT 10.14.1, the engine was built by TensorRT 10.13.0.35")}
    assert not any(c["status"] == "failed" for c in report["checks"])


def test_an_enqueue_bound_timing_is_inconclusive_not_passed(built_run, fake_trt, check, monkeypatch,  # noqa: F811
                                                            tmp_path):
    """The virtual device with a launch dearer than the kernels it launches (VIRTUAL_CUDA_LAUNCH_NS above LAYER_NS;
    here set on the module): the host sets the pace, the benchmark's timer and the events around K launches both
    measure it and agree. trtexec's enqueue-bound rule makes each such timing check "inconclusive: enqueue-bound"
    with both numbers, never "passed" (exit 3); the default costs pass (test_gpu_check_on_the_virtual_device)."""
    import virtual_cuda as vc

    monkeypatch.setattr(vc, "LAUNCH_NS", 10 * vc.LAYER_NS)
    monkeypatch.setattr("pipeline.runtime.speed.trtexec.find", lambda: None)
    prefix = tmp_path / "out" / "gpu_check"
    assert check.main([str(built_run), "--out", str(prefix)]) == 3
    report = json.loads(prefix.with_suffix(".json").read_text())
    timings = [c for c in report["checks"] if "events around" in c["name"]]
    assert len(timings) == 4 and all(c["status"] == "inconclusive" for c in timings), timings
    assert all(c["detail"].startswith("inconclusive: enqueue-bound (the host's enqueue") for c in timings)
    assert not any(c["status"] == "failed" for c in report["checks"])
    assert "inconclusive: enqueue-bound" in prefix.with_suffix(".md").read_text()


def _unreadable(section):
    """The inspector section over an engine whose JSON names no layer's type: every matrix layer unknown."""
    _unreadable.original = section

    def unreadable(engine, model, shapes, dump, precision):
        from pipeline.runtime.profiling import tensorrt_inspection

        real = tensorrt_inspection.engine_information

        def strip(engine, shapes):
            info = real(engine, shapes)
            for layer in info["Layers"]:
                for tensor in layer["Inputs"]:
                    tensor.pop("Format/Datatype", None)  # TensorRT 10's key
                    tensor.pop("DataType", None), tensor.pop("Format", None)  # TensorRT 11's
            return info

        tensorrt_inspection.engine_information = strip
        try:
            return section(engine, model, shapes, dump, precision)
        finally:
            tensorrt_inspection.engine_information = real

    return unreadable
