"""OpenVINO: the IR build writes (with sidecars), refused when it changed, the openvino_* backends in verify and
benchmark (latency and async throughput rows), benchmark_app beside them, and the doctor's CPU lines.

These run the real OpenVINO runtime on this CPU. What depends on bf16 units asserts what the detected CPU
implies (``openvino_ir.bf16_reason()``), so the tests hold on an AMX machine and on an AVX2-only one.
"""

from __future__ import annotations

import json
import re
import stat
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import BF16_ON, FAULTS, TINY, benchmark_row, cli
from pipeline import benchmark, config, doctor
from pipeline.core import artifacts
from pipeline.core.benchmark_rows import rows_of
from pipeline.core.errors import InputError, UsageError
from pipeline.core.run import RunDir, sha256_file
from pipeline.core.timings import TimingKind
from pipeline.reports import verify_report
from pipeline.runtime import backends
from pipeline.runtime.backends import Context
from pipeline.runtime.builders import openvino_ir
from pipeline.runtime.runners import CPU_WALL_CLOCK
from pipeline.runtime.speed import benchmark_app

AVX2_ONLY = "sse4_2 avx avx2 fma"


def manifest(run: Path) -> dict:
    return json.loads((run / artifacts.MANIFEST).read_text())


def candidate(run: Path, name: str) -> dict:
    return next(c for c in json.loads((run / artifacts.VERIFY_JSON).read_text())["candidates"] if c["name"] == name)


# --------------------------------------------------------------------------- build: IR and sidecars


def test_build_writes_the_ir_with_sidecars_and_records_it(tiny_run):
    recorded = manifest(tiny_run)["stages"]["build"]["artifacts"]
    for precision, hint in (("fp32", "f32"), ("bf16", "bf16")):
        sidecar = json.loads((tiny_run / openvino_ir.sidecar_name(precision)).read_text())
        assert sidecar["onnx"] == artifacts.FP32_ONNX
        assert sidecar["onnx_sha256"] == sha256_file(tiny_run / artifacts.FP32_ONNX)
        for part in ("xml", "bin"):
            name = f"openvino/{precision}.{part}"
            assert sidecar[f"{part}_sha256"] == sha256_file(tiny_run / name) == recorded[name]["sha256"]
        assert sidecar["hint"] == hint and sidecar["compress_to_fp16"] is False
        assert sidecar["openvino"] and sidecar["checked_on"]["cpu"]
        assert openvino_ir.sidecar_name(precision) in recorded
    assert not (tiny_run / "openvino" / "int8.xml").exists()  # this run has no model.int8.onnx


def test_verify_runs_the_ir_on_this_cpu(tiny_run):
    fp32 = candidate(tiny_run, "openvino_fp32")
    assert fp32["status"] == "passed" and fp32["artifact"] == "openvino/fp32.xml"
    assert fp32["artifact_sha256"] == verify_report.artifact_sha256(RunDir(tiny_run, create=False), fp32["artifact"])
    assert fp32["artifact_sha256"] != sha256_file(tiny_run / "openvino/fp32.xml")  # the .bin is in it too
    assert "not an emulation" in fp32["label"]
    bf16, reason = candidate(tiny_run, "openvino_bf16"), openvino_ir.bf16_reason()
    assert (bf16["status"], bf16["reason"]) == (("skipped", reason) if reason else ("passed", None))
    assert bf16["tolerance"]["atol"] == config.resolve().verify.bf16.atol  # its own gate section


def test_a_new_ir_bin_behind_the_same_xml_is_not_verified(clone_run):
    """The .xml names its .bin but not its contents (new weights or INT8 scales leave it byte-identical), so a
    verdict covers both files: benchmark must not show "passed" for weights verify never ran."""
    run = clone_run()
    assert verify_report.read_verdicts(RunDir(run, create=False))["openvino_fp32"] == "passed"
    weights = run / "openvino/fp32.bin"
    weights.write_bytes(weights.read_bytes()[:-4] + b"\0\0\0\0")
    assert verify_report.read_verdicts(RunDir(run, create=False))["openvino_fp32"] == verify_report.NOT_VERIFIED


# --------------------------------------------------------------------------- refused before it is loaded


@pytest.mark.parametrize("part", ["xml", "bin"])
def test_tampered_ir_is_refused_with_exit_2(clone_run, capsys, part):
    run = clone_run()
    path = run / f"openvino/fp32.{part}"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(InputError, match="does not match its sidecar"):
        openvino_ir.load(RunDir(run, create=False), "fp32")
    assert cli("verify", "--run-dir", run) == 2
    err = capsys.readouterr().err
    assert "openvino/fp32" in err and "refusing to load it" in err and "Traceback" not in err


def test_ir_of_another_onnx_file_is_refused(clone_run):
    run = clone_run()
    path = run / openvino_ir.sidecar_name("fp32")
    sidecar = json.loads(path.read_text())
    path.write_text(json.dumps({**sidecar, "onnx_sha256": "0" * 64}))
    with pytest.raises(InputError, match="converted from another model.onnx"):
        openvino_ir.load(RunDir(run, create=False), "fp32")


def test_an_ir_with_a_matching_sidecar_but_not_recorded_by_build_is_refused(clone_run):
    run = clone_run()
    (run / "openvino/fp32.xml").write_bytes((run / "openvino/bf16.xml").read_bytes())  # another IR, same weights
    path = run / openvino_ir.sidecar_name("fp32")
    sidecar = json.loads(path.read_text())
    path.write_text(json.dumps({**sidecar, "xml_sha256": sha256_file(run / "openvino/fp32.xml")}))
    with pytest.raises(InputError, match="not the IR the build stage recorded"):
        openvino_ir.load(RunDir(run, create=False), "fp32")


def test_missing_sidecar_and_symlinked_folder_are_refused(clone_run, tmp_path):
    run = clone_run()
    (run / openvino_ir.sidecar_name("bf16")).unlink()
    with pytest.raises(InputError, match="has no sidecar"):
        openvino_ir.load(RunDir(run, create=False), "bf16")
    elsewhere = tmp_path / "elsewhere"
    (run / "openvino").rename(elsewhere)
    (run / "openvino").symlink_to(elsewhere)
    with pytest.raises(UsageError, match="openvino: it is a symbolic link"):  # the run directory's one check
        openvino_ir.load(RunDir(run, create=False), "fp32")


# --------------------------------------------------------------------------- availability


def _ctx(run: Path, *overrides: str) -> Context:
    cfg = config.resolve(overrides=["model.name=tiny_cnn", *TINY, *overrides])
    return Context(cfg, RunDir(run, create=False), "verify", {})


def test_bf16_is_skipped_with_the_reason_on_an_avx2_cpu(clone_run, monkeypatch):
    monkeypatch.setenv("PIPELINE_CPU_FLAGS", AVX2_ONLY)
    run = clone_run()
    reason = backends.by_name("openvino_bf16").unavailable(_ctx(run))
    assert "no bf16 units" in reason and "PIPELINE_CPU_FLAGS" in reason
    assert cli("verify", "--run-dir", run) == 0  # skipped, never run as FP32 under a bf16 label
    row = candidate(run, "openvino_bf16")
    assert row["status"] == "skipped" and row["reason"] == reason


def test_bf16_also_needs_openvinos_own_bf16_capability(tmp_path, monkeypatch):
    monkeypatch.setenv("PIPELINE_CPU_FLAGS", "avx2 avx512f avx512_bf16 amx_bf16")
    monkeypatch.setattr(openvino_ir, "cpu_capabilities", lambda: ["FP32", "INT8"])
    assert "does not list BF16" in openvino_ir.bf16_reason()


def test_int8_without_the_q_dq_model(clone_run):
    run = clone_run()
    int8 = backends.by_name("openvino_int8").unavailable
    assert int8(_ctx(run, "export.int8.enabled=false")) == backends.disabled("int8")
    with pytest.raises(InputError, match="run `python -m pipeline export"):  # INT8 on, and no file: not a skip
        int8(_ctx(run, "export.int8.enabled=true"))


def test_a_bf16_hint_that_reaches_no_kernel_is_refused(tiny_run):
    import openvino as ov

    from pipeline.runtime.runners import check_runs_in

    core = ov.Core()
    model = core.read_model(str(tiny_run / "openvino/fp32.xml"))
    with pytest.raises(RuntimeError, match="no layer runs in bf16"):
        check_runs_in(core.compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"}), "bf16")
    if not openvino_ir.bf16_reason():
        check_runs_in(core.compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "bf16"}), "bf16")


# --------------------------------------------------------------------------- a planted BF16 fault


def test_bf16_sensitive_fault_fails_openvino_bf16_and_the_fallback_says_why(tmp_path, capsys):
    run = tmp_path / "run"
    code = cli("all", "--model", f"{FAULTS}:shifted_classifier", "--run-dir", run, *TINY, BF16_ON,
               "export.fp16.enabled=false")
    assert candidate(run, "openvino_fp32")["status"] == "passed"  # the fault is BF16's, not the export's
    # The BF16 graph carries the fault too, and its emulation catches it on any CPU, with bf16 units or without
    assert code == 1 and candidate(run, "bf16_emulation")["status"] == "failed"
    reason = openvino_ir.bf16_reason()
    if reason:
        assert candidate(run, "openvino_bf16")["status"] == "skipped"
        return
    row = candidate(run, "openvino_bf16")
    assert row["status"] == "failed", row
    assert row["tensor_check"]["max_abs_error"] > row["tolerance"]["atol"]
    assert cli("verify", "--run-dir", run, "--auto-fallback") == 1
    row = candidate(run, "openvino_bf16")
    assert row["status"] == "failed" and row["hint"] == backends.by_name("openvino_bf16").no_fallback_hint
    assert "openvino_bf16" in capsys.readouterr().err


# --------------------------------------------------------------------------- benchmark


FAKE_BENCHMARK_APP = """#!{python}
import json, sys
from pathlib import Path
args = sys.argv[1:]
opt = {{args[i]: args[i + 1] if i + 1 < len(args) and not args[i + 1].startswith("-") else "" for i in range(len(args))
       if args[i].startswith("-")}}
with open({log!r}, "a") as f:
    f.write(json.dumps({{"args": args, "config": json.loads(Path(opt["-load_config"]).read_text())}}) + "\\n")
latency = opt["-hint"] == "latency"
report = {{"configuration_setup": {{"API": "sync" if latency else "async",
                                   "number of parallel infer requests": "1" if latency else "2"}},
          "execution_results": {{"latency (ms)": "1000.0", "avg latency": "1000.0", "throughput": "1000000.0",
                                "total number of iterations": "99"}}}}
Path(opt["-report_folder"], "benchmark_report.json").write_text(json.dumps(report))
"""


def test_benchmark_openvino_rows_throughput_ratios_and_benchmark_app(clone_run, tmp_path, monkeypatch):
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls.jsonl"
    bin_dir.mkdir()
    fake = bin_dir / "benchmark_app"
    fake.write_text(FAKE_BENCHMARK_APP.format(python=sys.executable, log=str(calls)))
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}:{Path(sys.executable).parent}:/usr/bin:/bin")
    run = clone_run()
    assert cli("benchmark", "--run-dir", run, "benchmark.backends=[torch_fp32,openvino_fp32]",
               "benchmark.batch_sizes=[1,2]", "benchmark.benchmark_app_s=1", "benchmark.benchmark_app_rows=all") == 0
    payload = json.loads((run / artifacts.BENCHMARK_JSON).read_text())
    rows = [r for r in payload["results"] if r["backend"] == "openvino_fp32"]
    # the async-throughput row at the largest batch only: the one batch whose images/s the summary names
    assert {(r["batch_size"], r["timing_kind"]) for r in rows} == \
        {(1, "cpu_call"), (2, "cpu_call"), (2, "async_throughput")}
    assert {r["timing"].split(":")[0] for r in rows} == {CPU_WALL_CLOCK.label, "throughput"}
    assert "Async-throughput rows (OpenVINO) at batch 2 only" in (run / artifacts.BENCHMARK_MD).read_text()
    eager = {r["batch_size"]: r["throughput_per_s"] for r in payload["results"] if r["backend"] == "torch_fp32"}
    for r in rows:
        assert r["vs_eager"] == pytest.approx(r["throughput_per_s"] / eager[r["batch_size"]])
        assert r["verify"] == "passed" and "not an emulation" in r["note"]
    side = payload["benchmark_app"]
    assert len(side["rows"]) == 3 and all(r["flagged"] for r in side["rows"])  # the fake's numbers are far off
    assert all(r["agreement"] == "far apart" and r["rounds"] == benchmark_app.ROUNDS for r in side["rows"])
    assert all(len(r["ours_per_round"]) == len(r["benchmark_app_per_round"]) == benchmark_app.ROUNDS
               for r in side["rows"])
    best, top = benchmark.headline_rows(rows_of(payload).results)["cpu"]  # timed alone: torch_fp32 may win under load
    doubted = manifest(run)["stages"]["benchmark"]["details"]["headline"].count("(in doubt: benchmark_app far apart")
    assert doubted == sum(r.backend == "openvino_fp32" for r in (best, top))
    logged = [json.loads(line) for line in calls.read_text().splitlines()]
    assert {tuple(c["args"][c["args"].index("-shape") + 1:][:1]) for c in logged} == {("[1,3,16,16]",),
                                                                                      ("[2,3,16,16]",)}
    assert all(c["args"][c["args"].index("-m") + 1] == str(run / "openvino/fp32.xml") for c in logged)
    assert all(c["config"]["CPU"]["INFERENCE_PRECISION_HINT"] == "f32" for c in logged)
    assert "benchmark_app beside ours" in (run / artifacts.BENCHMARK_MD).read_text()
    headline = manifest(run)["stages"]["benchmark"]["details"]["headline"]
    # a winner, or the tie the interleaved rounds found (the two rows may well time alike on a 16x16 model)
    assert re.match(r"cpu: (tied for )?fastest that passed the gate.* at batch 1: ", headline), headline
    # The comparison is a section of the report tables, so the run's report carries it as benchmark.md does.
    assert cli("report", "--run-dir", run) == 0
    for name in (artifacts.REPORT_MD, artifacts.REPORT_HTML):
        text = (run / name).read_text()
        assert "benchmark_app beside ours" in text and "far apart" in text, name


def _row(backend, batch, p50, images, verify="passed", device="cpu", timing=CPU_WALL_CLOCK.label):
    kind = TimingKind.ASYNC_THROUGHPUT if timing.startswith("throughput") else TimingKind.CPU_CALL
    return benchmark_row(backend, batch, p50, images, verify=verify, device=device, timing=timing, timing_kind=kind,
                         deployable=verify == "passed")


def test_headline_names_the_fastest_passing_artifact_per_device_at_batch_1_and_the_largest():
    results = [
        _row("torch_fp32", 1, 10.0, 100, "reference"), _row("torch_fp32", 8, 40.0, 200, "reference"),
        _row("broken", 1, 0.1, 10000, "failed"), _row("broken", 8, 0.1, 80000, "failed"),
        _row("openvino_bf16", 1, 2.0, 500), _row("openvino_bf16", 1, 1.0, 1000, timing="throughput: 2 requests"),
        _row("openvino_bf16", 8, 8.0, 1000), _row("openvino_bf16", 8, 4.0, 2000, timing="throughput: 2 requests"),
        _row("tensorrt_fp16", 1, 0.5, 2000, device="cuda"), _row("tensorrt_fp16", 8, 1.0, 8000, device="cuda"),
    ]
    line = benchmark._headline(benchmark.add_ratios(results))
    cpu, cuda = line.split("; cuda: ")
    assert "batch 1: openvino_bf16 p50 2.000 ms (5.00x eager FP32 (no interval))" in cpu  # not the throughput row
    assert "batch 8: openvino_bf16 2000.0 images/s (async throughput) (10.00x eager FP32 (no interval))" in cpu
    assert "batch 1: tensorrt_fp16" in cuda and "batch 8: tensorrt_fp16 8000.0 images/s" in cuda


# --------------------------------------------------------------------------- doctor


def test_doctor_shows_openvino_and_the_cpus_bf16_and_int8_units():
    from pipeline.doctor import Cpu
    from test_doctor import stack

    amx = stack(openvino="2026.4.1", openvino_capabilities=("FP32", "BF16", "INT8"),
                cpu=Cpu(model="Xeon", cores=2, isa=("avx2", "avx512_bf16", "amx_bf16", "amx_int8", "avx512_vnni"),
                        simulated=None))
    lines = doctor.lines(amx)
    assert any(line.startswith("openvino     2026.4.1; CPU plugin capabilities FP32 BF16 INT8") for line in lines)
    assert "cpu bf16     native (amx_bf16 avx512_bf16); OpenVINO lists BF16" in lines
    assert "cpu int8     VNNI/AMX (amx_int8 avx512_vnni); OpenVINO lists INT8" in lines
    avx2 = stack(openvino="2026.4.1", openvino_capabilities=("FP32", "INT8"))
    bf16 = next(line for line in doctor.lines(avx2) if line.startswith("cpu bf16"))
    assert bf16.startswith("cpu bf16     none:") and "does not list BF16" in bf16


def test_doctor_command_prints_the_openvino_lines(capsys):
    assert cli("doctor") == 0
    out = capsys.readouterr().out.splitlines()
    assert any(line.startswith("openvino     ") and "capabilities" in line for line in out)
    assert any(line.startswith("cpu bf16") for line in out) and any(line.startswith("cpu int8") for line in out)


def test_ir_weights_stay_fp32(tiny_run):
    """compress_to_fp16=False: the .bin holds the FP32 initializers (the precision is a runtime decision)."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(tiny_run / artifacts.FP32_ONNX))
    floats = sum(numpy_helper.to_array(t).nbytes for t in model.graph.initializer
                 if numpy_helper.to_array(t).dtype == np.float32)
    assert (tiny_run / "openvino/fp32.bin").stat().st_size >= floats


def test_without_a_build_the_ir_candidates_are_skipped_but_a_deleted_recorded_ir_is_an_error(clone_run):
    run = clone_run()
    (run / "openvino/fp32.xml").unlink()
    with pytest.raises(InputError, match="run `python -m pipeline build"):
        backends.by_name("openvino_fp32").unavailable(_ctx(run))
    rd = RunDir(run, create=False)
    del rd.manifest["stages"]["build"]  # a run that never built: nothing to deploy, nothing claimed
    rd.save_manifest()
    assert "the build stage has not written it" in backends.by_name("openvino_fp32").unavailable(_ctx(run))


def test_an_onnx_file_openvino_cannot_convert_costs_only_its_own_ir(clone_run, monkeypatch):
    """An ONNX file OpenVINO cannot convert (simulated with the error OpenVINO 2026.4.1 gives on ModelOpt's Q/DQ
    graph with FP16 regions, which build now avoids by upcasting them): build still writes the other IR, and
    the INT8 candidate says why it has none."""
    import openvino as ov

    from pipeline import stages

    run = clone_run()
    (run / artifacts.INT8_ONNX).write_bytes((run / artifacts.FP32_ONNX).read_bytes())
    real = ov.convert_model

    def convert(path, *args, **kwargs):
        if "int8" in Path(path).name:  # model.int8.onnx, or its FP32-region twin
            raise RuntimeError("Exception from src/core/src/pass/graph_rewrite.cpp:298:\n[Compress...] END\n"
                               "Tensor data with element type f32, is not representable as pointer to f16")
        return real(path, *args, **kwargs)

    monkeypatch.setattr(ov, "convert_model", convert)
    monkeypatch.setattr(backends.env, "cpu_has_int8_dot_product", lambda: True)  # the IR's reason, on any CPU
    cfg = config.resolve(overrides=["model.name=tiny_cnn", *TINY])
    stages.run_stage("build", cfg, RunDir(run, create=False))
    build = manifest(run)["stages"]["build"]
    assert "openvino/fp32.xml" in build["artifacts"] and "openvino/int8.xml" not in build["artifacts"]
    assert not (run / "openvino/int8.xml").exists()
    reason = backends.by_name("openvino_int8").unavailable(_ctx(run))
    assert "could not convert model.int8.onnx" in reason and "not representable as pointer to f16" in reason


def test_benchmark_app_checks_only_the_rows_the_summary_names_by_default(clone_run, tmp_path, monkeypatch):
    """Two benchmark_app runs (the rows the headline names), not two per OpenVINO row and batch (issue 21, §6)."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls.jsonl"
    bin_dir.mkdir()
    fake = bin_dir / "benchmark_app"
    fake.write_text(FAKE_BENCHMARK_APP.format(python=sys.executable, log=str(calls)))
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}:{Path(sys.executable).parent}:/usr/bin:/bin")
    run = clone_run()
    assert cli("benchmark", "--run-dir", run, "benchmark.backends=[openvino_fp32]", "benchmark.batch_sizes=[1,2]",
               "benchmark.benchmark_app_s=1") == 0
    payload = json.loads((run / artifacts.BENCHMARK_JSON).read_text())
    best, top = benchmark.headline_rows(rows_of(payload).results)["cpu"]
    checked = {(r["backend"], r["batch_size"], r["mode"]) for r in payload["benchmark_app"]["rows"]}
    # latency at 1 and 2, async throughput at 2 (the largest batch): three rows, two rows checked, each in
    # benchmark_app.ROUNDS interleaved rounds
    assert len(payload["results"]) == 3 and len(calls.read_text().splitlines()) == 2 * benchmark_app.ROUNDS
    mode = {row.timing_kind: benchmark_app.MODES[row.timing_kind] for row in (best, top)}
    assert checked == {(best.backend, 1, mode[best.timing_kind]), (top.backend, 2, mode[top.timing_kind])}
