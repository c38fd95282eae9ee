"""The precision gate must not be a rubber stamp: it fails planted faults, names where they
appear, fixes FP16 ones with --auto-fallback, and passes sound models with default tolerances."""

import json
import os
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import jsonschema
import numpy as np
import pytest

from conftest import BF16_ON, FAULTS, ROOT, TINY, cli, listed
from pipeline import config, verify
from pipeline.core import artifacts, engine_sidecar
from pipeline.evaluation import candidates
from pipeline.reports import verify_report
from pipeline.runtime.builders import tensorrt_engine

SCHEMA = json.loads((ROOT / "docs" / "verify.schema.json").read_text())


def statuses(run: Path) -> dict:
    report = json.loads((run / "verify.json").read_text())
    jsonschema.validate(report, SCHEMA)
    return {c["name"]: c["status"] for c in report["candidates"]}


def report(run: Path) -> dict:
    return json.loads((run / "verify.json").read_text())


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Train and export each planted-fault model once; tests work on copies."""
    runs = {}

    def get(factory: str, *extra: str) -> Path:
        if factory not in runs:
            run = tmp_path_factory.mktemp(factory) / "run"
            assert cli("train", "--model", f"{FAULTS}:{factory}", "--run-dir", run, *TINY, *extra) == 0
            assert cli("export", "--run-dir", run) == 0
            runs[factory] = run
        return runs[factory]

    return get


def copy(run: Path, tmp_path: Path) -> Path:
    target = tmp_path / run.parent.name
    shutil.copytree(run, target)
    return target


# --------------------------------------------------------------------------- sound models


def test_tiny_model_passes_with_defaults(tiny_run):
    s = statuses(tiny_run)
    assert s["onnxrt_fp32"] == "passed"
    assert s["fp16_emulation"] == "passed"
    assert s["onnxrt_fp16_cpu"] == "passed"
    assert report(tiny_run)["passed"] is True


@pytest.mark.slow
def test_resnet18_passes_with_defaults(tmp_path):
    """ResNet-18 through every stage (tests/test_registry_pipeline.py leaves it to this test), the gate at its
    defaults; benchmark small (its defaults: tests/test_benchmark.py)."""
    run = tmp_path / "r18"
    args = ["data.samples_per_class=40", "data.image_size=32", "train.epochs=2", "verify.samples=80",
            "export.int8.enabled=false"]  # FP16 here; INT8 on sound models: tests/test_int8.py
    assert cli("train", "--model", "resnet18", "--run-dir", run, *args) == 0
    assert cli("export", "--run-dir", run) == 0
    assert cli("build", "--run-dir", run) == 0
    assert cli("verify", "--run-dir", run) == 0
    s = statuses(run)
    assert s["onnxrt_fp32"] == s["fp16_emulation"] == s["onnxrt_fp16_cpu"] == s["openvino_fp32"] == "passed"
    emu = next(c for c in report(run)["candidates"] if c["name"] == "fp16_emulation")
    assert emu["tensor_check"]["max_abs_error"] > 0  # FP16 rounding is really there
    assert emu["task_check"]["top1_agreement"] >= 0.99
    assert cli("benchmark", "--run-dir", run, "benchmark.batch_sizes=[1]", "benchmark.max_row_s=0.2",
               "benchmark.backends=[torch_fp32,onnxrt_fp32,openvino_fp32]", "benchmark.benchmark_app_s=0") == 0
    rows = json.loads((run / "benchmark.json").read_text())["results"]
    assert {r["backend"] for r in rows} == {"torch_fp32", "onnxrt_fp32", "openvino_fp32"}


# --------------------------------------------------------------------------- planted faults


def test_cancellation_fails_is_localised_and_fixed_by_fallback(trained, tmp_path, capsys):
    run = copy(trained("cancellation"), tmp_path)
    original = (run / "model.fp16.onnx").read_bytes()
    assert cli("verify", "--run-dir", run) == 1
    err = capsys.readouterr().err
    # The first node over the scaled rule is /Add: its output (f + 384) is where FP16 rounding (steps of 0.25)
    # wipes out f, while its magnitude (~384) hides that from any relative rule.
    assert "fp16_emulation" in err and "/Add" in err and "--auto-fallback" in err
    s = statuses(run)
    assert s["fp16_emulation"] == "failed"
    assert s["onnxrt_fp32"] == "passed"  # the export is fine: the fault is FP16-only
    # Values stay inside FP16's range, so ONNX Runtime CPU (which computes the region in FP32) misses it.
    assert s["onnxrt_fp16_cpu"] == "passed"
    loc = report(run)["localization"]
    assert loc["first_divergent"]["name"] == "/Add"
    assert loc["first_divergent"]["fp32_max"] < 400  # no range rule could have seen this
    assert (run / "model.fp16.onnx").read_bytes() == original  # a failing gate replaces nothing

    assert cli("verify", "--run-dir", run, "--auto-fallback") == 0
    fb = report(run)["fallback"]
    assert fb["passed"] is True
    assert set(fb["moved_to_fp32"]) == {"/Sub", "/Add"} and len(fb["moved_to_fp32"]) <= 3
    assert fb["fp16_fraction_after"] < fb["fp16_fraction_before"]
    assert statuses(run)["fp16_emulation"] == "passed"
    assert (run / "model.fp16.onnx").read_bytes() != original
    assert json.loads((run / "fp16_fallback.json").read_text())["nodes"] == fb["moved_to_fp32"]
    # The export stage's record follows the replaced file, and a re-export keeps the moved nodes.
    manifest = json.loads((run / "manifest.json").read_text())
    fp32_nodes = {n["name"] for n in manifest["stages"]["export"]["details"]["fp16"]["fp32_nodes"]}
    assert {"/Sub", "/Add"} <= fp32_nodes
    assert cli("export", "--run-dir", run) == 0
    assert cli("verify", "--run-dir", run) == 0


def test_fallback_budget_exhausted_replaces_nothing(trained, tmp_path):
    run = copy(trained("cancellation"), tmp_path)
    original = (run / "model.fp16.onnx").read_bytes()
    assert cli("verify", "--run-dir", run, "--auto-fallback", "verify.fallback_iterations=1") == 1
    fb = report(run)["fallback"]
    assert fb["passed"] is False and fb["moved_to_fp32"] == ["/Add"]
    assert (run / "model.fp16.onnx").read_bytes() == original
    assert not (run / "fp16_fallback.json").exists()
    assert not (run / artifacts.fallback_candidate_file("fp16")).exists()


def test_overflow_is_absorbed_by_calibrated_conversion(trained, tmp_path):
    run = copy(trained("overflow"), tmp_path)
    assert cli("verify", "--run-dir", run) == 0
    assert statuses(run)["fp16_emulation"] == "passed"


def test_overflow_without_range_rule_fails_and_names_the_node(trained, tmp_path, capsys):
    run = copy(trained("overflow"), tmp_path)
    assert cli("export", "--run-dir", run, "export.fp16.range_rule=false") == 0
    assert cli("verify", "--run-dir", run) == 1
    assert "/Mul" in capsys.readouterr().err
    emu = next(c for c in report(run)["candidates"] if c["name"] == "fp16_emulation")
    assert emu["status"] == "failed" and emu["tensor_check"]["nonfinite"] > 0
    first = report(run)["localization"]["first_divergent"]
    assert first["name"] == "/Mul" and first["nonfinite"] > 0 and first["fp32_max"] > 65504


def test_bf16_holds_the_overflow_that_fp16_cannot(trained, tmp_path):
    """BF16 keeps FP32's exponent range: the x40000 region (80k-400k, over FP16's 65504) overflows FP16 without
    AutoCast's range rule, and the BF16 graph, converted whole, passes its gate (docs/verify.md: BF16)."""
    run = copy(trained("overflow"), tmp_path)
    assert cli("export", "--run-dir", run, "export.fp16.range_rule=false", BF16_ON) == 0
    precisions = json.loads((run / "manifest.json").read_text())["stages"]["export"]["details"]
    assert precisions["bf16"]["bf16_fraction"] == 1.0 and precisions["bf16"]["fp32_nodes_count"] == 0
    assert cli("verify", "--run-dir", run) == 1
    by_name = {c["name"]: c for c in report(run)["candidates"]}
    assert by_name["fp16_emulation"]["status"] == "failed" and by_name["fp16_emulation"]["tensor_check"]["nonfinite"]
    assert by_name["bf16_emulation"]["status"] in ("passed", "inconclusive")
    assert by_name["bf16_emulation"]["tensor_check"]["nonfinite"] == 0


def test_export_fault_does_not_pass(trained, tmp_path, capsys):
    # export refuses it by default now (tests/test_export_trace.py): accepted here, so verify's own check is tested
    run = copy(trained("batch_branch", "export.accept_trace_warnings=true"), tmp_path)
    assert cli("verify", "--run-dir", run) == 1
    err = capsys.readouterr().err
    assert "FP32 export itself disagrees" in err
    assert statuses(run)["onnxrt_fp32"] == "failed"
    # the table's export check (Backend.checks_export) carries the hint, and no precision gate ran on a broken export
    by_name = {c["name"]: c for c in report(run)["candidates"]}
    assert by_name["onnxrt_fp32"]["hint"] == verify_report.EXPORT_BROKEN_HINT
    assert "localisation and fallback are skipped" in err
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["stages"]["export"]["details"]["exporter_warnings"]  # the tracer warned, and it was recorded


# --------------------------------------------------------------------------- semantics


def gate(**overrides):
    base = {"criterion": "absolute", "max_scaled_error": 0.05, "atol": 0.02, "rtol": 0.02,
            "check_error_stat": "elemwise", "error_quantile": 0.99, "min_top1_agreement": 0.99,
            "max_accuracy_drop": 0.01}
    return {**base, **overrides}


def outputs(*arrays):
    return [{"logits": np.asarray(a, np.float32)} for a in arrays]


def test_elementwise_and_rule():
    ref = outputs([[8.0, 0.5, 0.001]])
    labels = np.array([0])
    # 8.1: abs 0.1 > atol but rel 0.0125 <= rtol -> ok; 0.001 -> 0.005: rel 4 but abs 0.004 -> ok.
    ok = candidates.compare(outputs([[8.1, 0.5, 0.005]]), ref, labels, gate(), "logits")
    assert ok.tensor_check.passed
    # 0.5 -> 0.375: abs 0.125 and rel 0.25 both exceed -> fails.
    bad = candidates.compare(outputs([[8.0, 0.375, 0.001]]), ref, labels, gate(), "logits")
    assert not bad.tensor_check.passed and not bad.passed


def test_nan_or_inf_in_candidate_always_fails():
    ref = outputs([[1.0, 2.0]])
    for value in (np.nan, np.inf):
        result = candidates.compare(outputs([[1.0, value]]), ref, np.array([1]), gate(atol=1e9, rtol=1e9), "logits")
        assert not result.passed and result.tensor_check.nonfinite == 1


def test_statistics_and_per_output_tolerances():
    ref = outputs([[1.0, 1.0, 1.0, 1.0]])
    cand = outputs([[1.0, 1.0, 1.0, 1.5]])  # one large error, small mean
    labels = np.array([0])
    def passes(**rule) -> bool:
        return candidates.compare(cand, ref, labels, gate(**rule), "logits").tensor_check.passed

    assert not passes(check_error_stat="max", atol=0.1, rtol=0.1)
    assert passes(check_error_stat="mean", atol=0.2, rtol=0.2)
    assert passes(check_error_stat="median", atol=0.01, rtol=0.01)
    assert passes(atol={"": 0.01, "logits": 0.6}, rtol=0.01)


def test_task_check_top1_agreement_and_accuracy():
    ref = outputs([[2.0, 1.0], [1.0, 2.0], [2.0, 1.0], [1.0, 2.0]])
    cand = outputs([[1.0, 2.0], [1.0, 2.0], [2.0, 1.0], [1.0, 2.0]])  # first image flips
    labels = np.array([0, 1, 0, 1])
    result = candidates.compare(cand, ref, labels, gate(atol=10, rtol=10, min_top1_agreement=0.7,
                                                        max_accuracy_drop=0.3), "logits")
    task = result.task_check
    assert task.top1_agreement == 0.75 and task.reference_accuracy == 1.0 and task.accuracy == 0.75
    assert result.passed
    strict = candidates.compare(cand, ref, labels, gate(atol=10, rtol=10), "logits")
    assert strict.tensor_check.passed and not strict.passed  # both checks must pass


def test_candidate_tolerance_overrides_precision_default():
    cfg = config.resolve(overrides=["verify.candidates.fp16_emulation.atol=0.5",
                                    "verify.candidates.fp16_emulation.check_error_stat=mean"])
    g = candidates.gate_for(cfg, "fp16_emulation", "fp16")
    assert g["atol"] == 0.5 and g["check_error_stat"] == "mean" and g["rtol"] == cfg.verify.fp16.rtol
    assert candidates.gate_for(cfg, "onnxrt_fp16_cpu", "fp16")["atol"] == cfg.verify.fp16.atol
    assert candidates.gate_for(cfg, "onnxrt_fp32", "fp32")["atol"] == cfg.verify.fp32.atol


def test_tight_candidate_tolerance_fails_a_sound_model(clone_run):
    run = clone_run()
    assert cli("verify", "--run-dir", run, "verify.candidates.fp16_emulation.max_scaled_error=1e-9") == 1
    s = statuses(run)
    assert s["fp16_emulation"] == "failed" and s["onnxrt_fp32"] == "passed"


# --------------------------------------------------------------------------- reports and exit codes


def test_reports_validate(tiny_run):
    payload = report(tiny_run)
    jsonschema.validate(payload, SCHEMA)
    suite = ET.parse(tiny_run / "verify.junit.xml").getroot()
    assert suite.tag == "testsuite" and int(suite.get("tests")) == len(payload["candidates"])
    names = {case.get("name") for case in suite.iter("testcase")}
    assert names == {c["name"] for c in payload["candidates"]}
    md = (tiny_run / "verify.md").read_text()
    assert "| candidate |" in md and "fp16_emulation" in md


def test_failure_reports_carry_numbers_and_step_summary(trained, tmp_path, monkeypatch):
    run = copy(trained("cancellation"), tmp_path)
    summary = tmp_path / "summary.md"
    summary.write_text("# earlier step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    assert cli("verify", "--run-dir", run) == 1
    jsonschema.validate(report(run), SCHEMA)
    suite = ET.parse(run / "verify.junit.xml").getroot()
    assert int(suite.get("failures")) >= 1
    failure = next(case.find("failure") for case in suite.iter("testcase") if case.get("name") == "fp16_emulation")
    assert "max_abs_error=" in failure.get("message") and "atol=0.02" in failure.get("message")
    text = summary.read_text()
    assert text.startswith("# earlier step") and "Precision gate: FAILED" in text and "/Sub" in text


def test_required_backend_missing_exits_3(clone_run, capsys):

    if tensorrt_engine.availability()[0]:
        pytest.skip("TensorRT is available here")
    run = clone_run()
    assert cli("verify", "--run-dir", run, "--require", "tensorrt") == 3
    assert "tensorrt_fp16" in capsys.readouterr().err
    tr = next(c for c in report(run)["candidates"] if c["name"] == "tensorrt_fp16")
    assert tr["status"] == "skipped" and tr["required"] is True
    suite = ET.parse(run / "verify.junit.xml").getroot()
    case = next(c for c in suite.iter("testcase") if c.get("name") == "tensorrt_fp16")
    assert case.find("error") is not None


def test_candidate_crash_exits_4(clone_run, monkeypatch, capsys):
    run = clone_run()

    def broken(*args, **kwargs):
        raise RuntimeError("provider exploded")

    monkeypatch.setattr("pipeline.runtime.runners.faithful_runner", broken)
    monkeypatch.setattr("pipeline.runtime.backends.Backend.isolated", False)  # in this process, where the patch is
    assert cli("verify", "--run-dir", run) == 4
    err = capsys.readouterr().err
    assert "error: verify:" in err and "provider exploded" in err and "Traceback" not in err
    assert statuses(run)["fp16_emulation"] == "error"


def test_missing_export_exits_2_and_names_the_stage(clone_run, capsys):
    run = clone_run()
    os.remove(run / "model.onnx")
    assert cli("verify", "--run-dir", run) == 2
    assert "run `python -m pipeline export" in capsys.readouterr().err


def test_strict_emulation_mode(clone_run):
    run = clone_run()
    assert cli("verify", "--run-dir", run, "verify.emulation=strict", "verify.samples=16") == 0
    emu = next(c for c in report(run)["candidates"] if c["name"] == "fp16_emulation")
    assert emu["status"] == "passed" and "strict" in emu["label"]


# --------------------------------------------------------------------------- defects fixed with the backend table


def run_config(run: Path):
    import yaml

    return config.resolve(base=yaml.safe_load((run / "config.yaml").read_text()))


def test_mismatch_fraction_uses_the_per_output_tolerance():
    ref = outputs([[1.0, 1.0, 1.0, 1.0]])
    cand = outputs([[1.0, 1.0, 1.0, 1.5]])
    result = candidates.compare(cand, ref, np.array([0]), gate(atol={"": 0.01, "logits": 0.6}, rtol=0.01), "logits")
    assert result.tensor_check.passed
    assert result.tensor_check.mismatch_fraction == 0.0  # the element Polygraphy let pass is no mismatch
    strict = candidates.compare(cand, ref, np.array([0]), gate(atol={"": 0.6, "logits": 0.01}, rtol=0.01), "logits")
    assert not strict.tensor_check.passed and strict.tensor_check.mismatch_fraction == 0.25


def test_fallback_stops_cleanly_when_a_recheck_errors_but_none_fails(trained, tmp_path, monkeypatch, capsys):
    run = copy(trained("cancellation"), tmp_path)
    from pipeline.runtime import runners

    real, calls = runners.faithful_runner, []

    def first_call_only(plug, *args, **kwargs):  # the first FP16 check runs; the fallback's re-checks cannot start
        calls.append(plug.name)
        if calls.count("fp16") > 1 and plug.name == "fp16":
            raise RuntimeError("emulation unavailable")
        return real(plug, *args, **kwargs)

    monkeypatch.setattr("pipeline.runtime.runners.faithful_runner", first_call_only)
    monkeypatch.setattr("pipeline.runtime.backends.Backend.isolated", False)  # in this process, where the patch is
    assert cli("verify", "--run-dir", run, "--auto-fallback") == 1  # the gate failed; no StopIteration (exit 4)
    assert "StopIteration" not in capsys.readouterr().err
    fb = report(run)["fallback"]
    assert fb["passed"] is False and "emulation unavailable" in fb["iterations"][-1]["note"]


def fake_tensorrt(monkeypatch):
    from pipeline import build

    monkeypatch.setattr(tensorrt_engine, "availability", lambda: (True, ""))
    monkeypatch.setattr(build, "run", lambda cfg, run_dir, record: record.skip("no TensorRT in this test"))
    # Only the FP16 engine exists in these tests: the INT8 engine is skipped as build records it when export wrote
    # no model.int8.onnx.
    monkeypatch.setattr(tensorrt_engine, "skip_reason",
                        lambda cfg, run_dir, engine: "" if engine == tensorrt_engine.FP16_ENGINE
                        else "no INT8 engine in this test")
    monkeypatch.setattr("pipeline.runtime.backends.Backend.isolated", False)  # the fakes live in this process


def test_disabled_tensorrt_candidate_never_loads_the_engine(clone_run, monkeypatch):

    run = clone_run()
    fake_tensorrt(monkeypatch)
    (run / tensorrt_engine.FP16_ENGINE).write_bytes(b"an engine without a sidecar: loading it is refused")
    listed(run, tensorrt_engine.FP16_ENGINE)  # where build writes it
    assert cli("verify", "--run-dir", run, "verify.candidates.tensorrt_fp16.enabled=false") == 0
    trt = next(c for c in report(run)["candidates"] if c["name"] == "tensorrt_fp16")
    assert trt["status"] == "skipped" and trt["reason"] == "disabled (verify.candidates.tensorrt_fp16.enabled=false)"


def test_fallback_loads_the_engine_once_and_marks_it_stale(trained, tmp_path, monkeypatch):
    from pipeline.core.run import sha256_file

    run = copy(trained("cancellation"), tmp_path)
    fake_tensorrt(monkeypatch)
    (run / tensorrt_engine.FP16_ENGINE).write_bytes(b"engine")
    listed(run, tensorrt_engine.FP16_ENGINE)  # where build writes it
    sidecar = engine_sidecar.from_json({
        "schema": tensorrt_engine.SIDECAR_SCHEMA, "built_by": "pipeline test", "engine": tensorrt_engine.FP16_ENGINE,
        "sha256": sha256_file(run / tensorrt_engine.FP16_ENGINE), "onnx": "model.fp16.onnx",
        "onnx_sha256": sha256_file(run / "model.fp16.onnx"), "precision": "fp16",
        "profile": {"input": "input", "min": [1], "opt": [1], "max": [64]}}, "test")
    loads = []
    monkeypatch.setattr(tensorrt_engine, "load_engine_bytes",
                        lambda run_dir, platform=None, engine=None: loads.append(1) or (b"engine", sidecar))
    assert cli("verify", "--run-dir", run, "--auto-fallback") == 0
    assert len(loads) == 1  # not once per fallback round
    trt = next(c for c in report(run)["candidates"] if c["name"] == "tensorrt_fp16")
    assert trt["status"] == "skipped" and trt["after_fallback"] and "build re-runs" in trt["reason"]


def test_verify_reports_the_replacement_and_runs_no_other_stage(trained, tmp_path):
    from pipeline import stages
    from pipeline.core.run import RunDir

    run = copy(trained("cancellation"), tmp_path)
    assert cli("export", "--run-dir", run, BF16_ON) == 0  # TINY has BF16 off
    cfg, rd = run_config(run), RunDir(run)
    before = json.loads((run / "manifest.json").read_text())["stages"]
    with rd.stage("verify") as record:
        verify.run(cfg, rd, record, auto_fallback=True)
    after = json.loads((run / "manifest.json").read_text())["stages"]
    # (x + 384) - 384 fails FP16 and BF16 alike; each precision's fallback replaces its own graph
    assert after["verify"]["details"]["replaced_artifacts"] == ["model.fp16.onnx", "model.bf16.onnx"]
    assert after["export"] == before["export"] and after.get("build") == before.get("build")

    # The stage runner re-runs export and build; afterwards every stage is current.
    run = copy(trained("cancellation"), tmp_path / "runner")
    assert cli("export", "--run-dir", run, BF16_ON) == 0
    rd = RunDir(run)
    before = json.loads((run / "manifest.json").read_text())["stages"]
    stages.run_stage("verify", cfg, rd, auto_fallback=True)
    after = json.loads((run / "manifest.json").read_text())["stages"]
    assert after["export"]["run_id"] != before["export"]["run_id"]
    assert after["verify"]["details"]["fallbacks"]["fp16"]["passed"] is True
    for name in ("export", "build", "verify"):
        assert stages.up_to_date(stages.STAGES[name], cfg, rd)[0], name
