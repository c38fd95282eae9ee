"""The typed records the stages hand each other through the manifest (pipeline/core/records.py): what a stage
wrote reads back typed; a value of the wrong type is one InputError line, never a traceback; an absent key is
its default; a stage without an entry or without details has no record."""

from __future__ import annotations

import json

import pytest

from pipeline.core import records
from pipeline.core.errors import InputError
from pipeline.core.manifest import StageEntry
from pipeline.core.records import BuildRecord, ExportRecord, TrainRecord, VerifyRecord
from pipeline.core.run import RunDir
from pipeline.core.status import Status


def _run_with(tmp_path, stages: dict) -> RunDir:
    (tmp_path / "manifest.json").write_text(json.dumps({"schema": "pipeline.manifest/1", "stages": stages}))
    return RunDir(tmp_path)


def test_a_stage_without_an_entry_or_details_has_no_record(tmp_path):
    run = _run_with(tmp_path, {"train": {"status": "failed", "details": {}}})
    assert run.train_record() is None and run.build_record() is None and run.verify_record() is None
    assert run.export_skipped("int8") is None


def test_what_the_stages_wrote_reads_back_typed(tmp_path):
    run = _run_with(tmp_path, {
        "train": {"status": "ok", "details": {"best_val_acc": 0.9, "epochs": 2, "amp": "off", "seed": 0,
                                              "history": [{"epoch": 1, "val_loss": 0.5, "val_acc": 0.8}],
                                              "learning": {"learned": False, "line": "did not learn"}}},
        "export": {"status": "ok", "details": {"opset": 18, "int8": {"enabled": True, "skipped": "no ModelOpt"},
                                               "fp16": {"fp16_fraction": 0.75, "fp16_nodes": 3, "fp32_nodes": [
                                                   {"name": "n", "op_type": "Softmax", "reason": "range"}]}}},
        "build": {"status": "skipped", "details": {"skipped": {"int8": "no ONNX"},
                                                   "openvino": {"fp16": {"error": "could not convert"}}}},
        "verify": {"status": "failed", "details": {"passed": False, "candidates": {"ort": "failed"},
                                                   "replaced_artifacts": ["model.fp16.onnx"]}},
    })
    train = run.train_record()
    assert train.best_val_acc == 0.9 and train.history[0].val_acc == 0.8 and train.learning.learned is False
    fp16 = run.export_record().graph("fp16")
    assert (fp16.fraction, fp16.nodes, fp16.fp32_nodes[0].op_type) == (0.75, 3, "Softmax")
    assert run.export_skipped("int8") == "no ModelOpt" and run.export_record().graph("bf16") is None
    build = run.build_record()
    assert build.skipped == {"int8": "no ONNX"} and build.openvino["fp16"].error == "could not convert"
    verify = run.verify_record()
    assert verify.candidates == {"ort": Status.FAILED} and verify.replaced_artifacts == ["model.fp16.onnx"]
    assert verify.deployable is None and not verify.judged_reference


@pytest.mark.parametrize("kind, details, where", [
    (BuildRecord, {"skipped": {"int8": 3}}, "stages.build.details.skipped.int8"),
    (BuildRecord, {"openvino": "fp16"}, "stages.build.details.openvino"),
    (TrainRecord, {"learning": ["learned"]}, "stages.train.details.learning"),
    (TrainRecord, {"history": [{"epoch": "1", "val_loss": 0.1, "val_acc": 0.1}]}, "stages.train.details.history.0"),
    (VerifyRecord, {"replaced_artifacts": "model.fp16.onnx"}, "stages.verify.details.replaced_artifacts"),
    (VerifyRecord, {"candidates": {"ort": None}}, "stages.verify.details.candidates.ort"),
])
def test_a_value_of_the_wrong_type_is_one_line(kind, details, where):
    with pytest.raises(InputError) as caught:
        kind.parse(details)
    message = str(caught.value)
    assert "\n" not in message and message.startswith("manifest.json is damaged: ") and where in message


def test_details_that_are_not_an_object_are_one_line(tmp_path):
    with pytest.raises(InputError, match=r"stages\.verify\.details is not an object \(got list\)"):
        records.from_entry(VerifyRecord, {"status": "ok", "details": ["passed"]})
    export = ExportRecord.parse({"int8": "skipped"})
    with pytest.raises(InputError, match=r"stages\.export\.details\.int8 is not an object \(got str\)"):
        export.graph("int8")


def test_the_run_directory_names_its_manifest(tmp_path):
    run = _run_with(tmp_path, {"build": {"status": "ok", "details": {"skipped": []}}})
    with pytest.raises(InputError, match=str(tmp_path / "manifest.json")):
        run.build_record()


def test_a_manifest_dict_gives_the_same_record():
    manifest = {"stages": {"train": {"status": "ok", "details": {"amp": "bf16"}}}}
    assert records.from_manifest(TrainRecord, manifest).amp == "bf16"
    assert records.from_manifest(TrainRecord, {"stages": []}) is None
    assert records.from_manifest(ExportRecord, manifest) is None


def test_recorded_artifacts_are_their_sha256(tmp_path):
    sha = "0" * 64
    run = _run_with(tmp_path, {"build": {"status": "failed", "artifacts": {"a.plan": {"sha256": sha, "bytes": 1}}}})
    assert run.recorded_artifacts("build") == {"a.plan": sha} and run.recorded_artifacts("verify") == {}
    assert run.recorded_sha256("build", "a.plan") is None  # build failed: not a file it finished


def test_every_stage_with_a_summary_has_a_record_kind():
    from pipeline import stages

    assert {name for name, s in stages.STAGES.items() if s.summary} <= set(records.RECORDS)


def test_a_damaged_record_is_said_on_its_summary_line():
    from pipeline import stages

    line = stages.STAGES["verify"].line(StageEntry(status="ok", details={"candidates": {"ort": 1}}))
    assert line.startswith("manifest.json is damaged: stages.verify.details.candidates.ort")
