"""verify's conformance checks (pipeline/evaluation/conformance.py): row independence and the precision manifest,
end to end on a tiny run, with planted backends (tests/conformance_backends.py) that each check must catch."""

import json

import pytest

import conformance_backends
from conftest import cli
from pipeline.runtime import backends


def _candidate(run, name):
    verify = json.loads((run / "verify.json").read_text())
    return next(c for c in verify["candidates"] if c["name"] == name)


def _error_line(err: str) -> str:
    return next(x for x in err.splitlines() if x.startswith("error: verify:"))


def test_every_candidate_that_ran_has_a_conformance_section(tiny_run):
    verify = json.loads((tiny_run / "verify.json").read_text())
    ran = [c for c in verify["candidates"] if c["status"] == "passed"]
    assert {c["name"] for c in ran} >= {"onnxrt_fp32", "fp16_emulation"}
    for c in ran:
        rows, precision = c["conformance"]["rows"], c["conformance"]["precision"]
        assert rows["status"] == "passed" and rows["base"] == "alone"
        assert {a["arrangement"] for a in rows["arrangements"]} == {"batch", "reversed", "companions"}
        assert all(a["batch_size"] == 20 for a in rows["arrangements"])  # the tiny run's 20 images, one full batch
        assert precision["matrix_layers"] > 0 and abs(sum(precision["shares"].values()) - 1) < 1e-9
    skipped = [c for c in verify["candidates"] if c["status"] == "skipped"]
    assert skipped and all(c["conformance"]["status"] == "skipped" for c in skipped)  # TensorRT, CUDA: not here
    fp16 = _candidate(tiny_run, "fp16_emulation")["conformance"]["precision"]
    assert fp16["claimed"] == "fp16" and fp16["status"] == "passed" and fp16["shares"] == {"fp16": 1.0}
    ort = _candidate(tiny_run, "onnxrt_fp32")["conformance"]["precision"]
    assert ort["claimed"] is None and ort["shares"] == {"fp32": 1.0} and ort["source"] == "runtime"
    assert all(layer["kernel"] == "CPUExecutionProvider" for layer in ort["layers"])


def test_a_backend_whose_rows_depend_on_their_neighbours_fails_and_names_the_slot(clone_run, monkeypatch, capsys):
    monkeypatch.setattr(backends, "TABLE", conformance_backends.planted("onnxrt_fp32"))
    monkeypatch.setenv("PLANTED_MIX", "0.002")  # small enough that the output checks against the reference pass
    run = clone_run()
    assert cli("verify", "--run-dir", run) == 1
    line = _error_line(capsys.readouterr().err)
    assert "row independence: image" in line and "in slot" in line and "of a batch of 20" in line
    ort = _candidate(run, "onnxrt_fp32")
    assert ort["status"] == "failed" and ort["tensor_check"]["passed"]  # the output check alone would pass it
    rows = ort["conformance"]["rows"]
    assert rows["status"] == "failed"
    assert max(a["deviation"] for a in rows["arrangements"]) > rows["tolerance"]
    assert "--auto-fallback" not in line  # not a precision fault


def test_an_fp16_label_over_fp32_kernels_fails(clone_run, monkeypatch, capsys):
    """ONNX Runtime's CPU provider runs model.fp16.onnx's convolutions in FP32: an entry that claimed FP16 for it
    (and gated) would publish FP32 numbers as FP16 ones."""
    import dataclasses

    claiming = dataclasses.replace(backends.by_name("onnxrt_fp16_cpu"), claims_precision=True, gates=True)
    monkeypatch.setattr(backends, "TABLE", [claiming if b.name == claiming.name else b for b in backends.TABLE])
    run = clone_run()
    assert cli("verify", "--run-dir", run) == 1
    line = _error_line(capsys.readouterr().err)
    assert "onnxrt_fp16_cpu" in line and "claims fp16 but runs 0% of its matrix layers in fp16" in line
    precision = _candidate(run, "onnxrt_fp16_cpu")["conformance"]["precision"]
    assert precision["status"] == "failed" and precision["shares"] == {"fp32": 1.0}


@pytest.fixture
def int8_run(clone_run):
    run = clone_run()
    assert cli("export", "--run-dir", run, "export.int8.enabled=true", "export.int8.calibration_samples=16") == 0
    return run


def test_an_int8_label_over_fp32_kernels_fails(int8_run, monkeypatch, capsys):
    """The Q/DQ graph executed by ONNX Runtime with its optimisations off computes every convolution in FP32 on
    dequantized values: as a deployment claiming INT8 (its runtime's account, not its graph's), it fails."""
    import dataclasses

    deployed = dataclasses.replace(backends.by_name("int8_exact"), deploys=True)
    monkeypatch.setattr(backends, "TABLE", [deployed if b.name == deployed.name else b for b in backends.TABLE])
    assert cli("verify", "--run-dir", int8_run, "export.int8.enabled=true") == 1
    line = _error_line(capsys.readouterr().err)
    assert "int8_exact" in line and "claims int8 but runs 0% of its matrix layers in int8" in line
    precision = _candidate(int8_run, "int8_exact")["conformance"]["precision"]
    assert precision["status"] == "failed" and precision["graph_share"] > 0


def test_the_exact_int8_execution_passes_on_its_graphs_decisions(int8_run):
    assert cli("verify", "--run-dir", int8_run, "export.int8.enabled=true") == 0
    precision = _candidate(int8_run, "int8_exact")["conformance"]["precision"]
    assert precision["status"] == "passed" and precision["source"].startswith("graph")
    assert precision["shares"].get("int8", 0) == precision["graph_share"] > 0


def test_conformance_off_writes_no_section(clone_run):
    run = clone_run()
    assert cli("verify", "--run-dir", run, "verify.conformance=false") == 0
    assert "conformance" not in _candidate(run, "onnxrt_fp32")
