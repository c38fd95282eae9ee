"""Never a verdict on what was not checked (issue 13, section 2).

A missing artifact the config says should exist, a verify.json about other files, data whose classes
changed, an ONNX file from another run and a trained model that itself gives NaN must each end in a
clear refusal, never in "passed".
"""

import json
import os
import random
import shutil
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import jsonschema
import pytest

from conftest import ROOT, TINY, cli
from pipeline import config as config_mod
from pipeline.core.run import RunDir, sha256_file
from pipeline.core.verdicts import JUDGED
from pipeline.reports.verify_report import artifact_sha256

SCHEMA = json.loads((ROOT / "docs" / "verify.schema.json").read_text())


def verify_report(run: Path) -> dict:
    payload = json.loads((run / "verify.json").read_text())
    jsonschema.validate(payload, SCHEMA)
    return payload


def run_cfg(run: Path, *overrides: str):
    return config_mod.resolve(config_mod.load_yaml_file(run / "config.yaml"), overrides=list(overrides))


def export_with_classes(run: Path, num_classes: int) -> None:
    """Replace model.onnx by an export of the same architecture with another class count (another run's file)."""
    import torch

    from pipeline.core import modeling
    from pipeline.export import export_onnx

    cfg = run_cfg(run)
    module, _ = modeling.build(cfg, num_classes, 16)
    export_onnx(module, torch.zeros(1, 3, 16, 16), run / "model.onnx", opset=18, exporter="torchscript",
                input_name="input", output_name="logits", dynamic_batch=True)


# --------------------------------------------------------------------------- missing artifacts


def test_missing_fp16_model_is_run_export_first(clone_run, capsys):
    run = clone_run()
    os.remove(run / "model.fp16.onnx")
    assert cli("verify", "--run-dir", run) == 2
    err = capsys.readouterr().err
    assert "verify needs model.fp16.onnx" in err and "run `python -m pipeline export" in err
    assert "export.fp16.enabled is false" not in err
    assert cli("benchmark", "--run-dir", run) == 2  # onnxrt_fp16_cpu is among the timed backends
    assert "benchmark needs model.fp16.onnx" in capsys.readouterr().err


def test_fp16_candidates_skip_only_when_the_config_writes_no_fp16_model(clone_run):
    run = clone_run()
    os.remove(run / "model.fp16.onnx")
    assert cli("verify", "--run-dir", run, "export.fp16.enabled=false") == 0
    fp16 = [c for c in verify_report(run)["candidates"] if c["name"] in ("fp16_emulation", "onnxrt_fp16_cpu")]
    assert [c["status"] for c in fp16] == ["skipped", "skipped"]
    assert all("export.fp16.enabled is false" in c["reason"] for c in fp16)


def test_missing_engine_where_tensorrt_can_run_is_run_build_first(clone_run, monkeypatch, capsys):
    run = clone_run()
    monkeypatch.setattr("pipeline.runtime.builders.tensorrt_engine.availability", lambda: (True, ""))
    assert cli("verify", "--run-dir", run) == 2
    err = capsys.readouterr().err
    assert "verify needs model.fp16.engine" in err and "run `python -m pipeline build" in err


# --------------------------------------------------------------------------- verdicts and the files they judged


def test_verify_json_records_what_each_verdict_judged(tiny_run):
    payload = verify_report(tiny_run)
    assert payload["reference"]["weights_sha256"] == sha256_file(tiny_run / "model.safetensors")
    for c in payload["candidates"]:
        if c["status"] in JUDGED:  # a verdict (inconclusive too) names the file it judged
            assert c["artifact_sha256"] == artifact_sha256(RunDir(tiny_run, create=False), c["artifact"]), c["name"]
            if not c["artifact"].endswith(".xml"):  # an OpenVINO IR's digest covers its .xml and .bin
                assert c["artifact_sha256"] == sha256_file(tiny_run / c["artifact"]), c["name"]
        else:
            assert c["artifact_sha256"] is None


def test_benchmark_shows_no_verdict_for_another_model_onnx(clone_run):
    from pipeline.reports.verify_report import read_verdicts

    run = clone_run()
    assert read_verdicts(RunDir(run))["onnxrt_fp32"] == "passed"
    export_with_classes(run, run_cfg(run).data.num_classes)  # same shape, other weights: another run's file
    verdicts = read_verdicts(RunDir(run))
    assert verdicts["onnxrt_fp32"] == "not verified"
    assert verdicts["onnxrt_fp16_cpu"] == "passed"  # model.fp16.onnx is still the file verify judged

    assert cli("benchmark", "--run-dir", run) == 0
    rows = json.loads((run / "benchmark.json").read_text())["results"]
    column = {r["backend"]: r["verify"] for r in rows}
    assert column == {"torch_fp32": "reference", "onnxrt_fp32": "not verified", "onnxrt_fp16_cpu": "passed"}


def test_retrained_weights_unverify_every_candidate(clone_run):
    from safetensors.torch import load_file, save_file

    from pipeline.reports.verify_report import read_verdicts

    run = clone_run()
    state = load_file(str(run / "model.safetensors"))
    key = next(k for k, v in state.items() if v.is_floating_point())
    state[key] = state[key] + 1.0
    save_file(state, str(run / "model.safetensors"))
    assert set(read_verdicts(RunDir(run)).values()) <= {"not verified", "skipped"}


def test_a_verify_json_without_hashes_is_not_a_verdict(clone_run):
    from pipeline.reports.verify_report import read_verdicts

    run = clone_run()
    payload = json.loads((run / "verify.json").read_text())
    for c in payload["candidates"]:
        c.pop("artifact_sha256")
    (run / "verify.json").write_text(json.dumps(payload))
    assert "passed" not in read_verdicts(RunDir(run)).values()


# --------------------------------------------------------------------------- data content


def _png(path: Path, seed: int) -> None:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    Image.frombytes("RGB", (16, 16), bytes(rng.randrange(256) for _ in range(16 * 16 * 3))).save(path)


def _folder(root: Path, classes=("cat", "dog"), per_class: int = 8) -> None:
    for k, cls in enumerate(classes):
        for i in range(per_class):
            _png(root / cls / f"{i}.png", seed=100 * k + i)


IMAGEFOLDER = [a for a in TINY if not a.startswith("data.samples_per_class")]


@pytest.fixture(scope="module")
def folder_run(tmp_path_factory):
    """tiny_cnn trained and exported on a 2-class image folder; tests work on copies."""
    base = tmp_path_factory.mktemp("folder")
    _folder(base / "images")
    run = base / "run"
    assert cli("train", "--model", "tiny_cnn", "--run-dir", run, *IMAGEFOLDER, "data.source=imagefolder",
               f"data.path={base / 'images'}", "data.val_fraction=0.5", "data.batch_size=4") == 0
    assert cli("export", "--run-dir", run) == 0
    return base


def test_a_new_class_folder_changes_every_data_stage_fingerprint(folder_run, tmp_path):
    from pipeline import stages

    base = tmp_path / "copy"
    shutil.copytree(folder_run, base)
    run = base / "run"
    cfg = run_cfg(run, f"data.path={base / 'images'}")
    rd = RunDir(run)
    before = {name: stages.fingerprint(stages.STAGES[name], cfg, rd) for name in stages.ORDER}
    _folder(base / "images", classes=("bird",), per_class=8)
    after = {name: stages.fingerprint(stages.STAGES[name], cfg, rd) for name in stages.ORDER}
    changed = {name for name in stages.ORDER if before[name] != after[name]}
    assert changed == {"train", "export", "verify", "benchmark"}  # build reads no data
    os.utime(base / "images" / "cat" / "0.png", ns=(1, 1))  # a touched image: content decides, not mtimes (issue 46)
    assert stages.fingerprint(stages.STAGES["train"], cfg, rd) == after["train"]
    image = base / "images" / "cat" / "0.png"
    image.write_bytes(image.read_bytes() + b"\0")  # a replaced image counts
    assert stages.fingerprint(stages.STAGES["train"], cfg, rd) != after["train"]


def test_train_is_not_up_to_date_after_a_class_is_added(folder_run, tmp_path):
    from pipeline import stages

    base = tmp_path / "copy"
    shutil.copytree(folder_run, base)
    run = base / "run"
    cfg = run_cfg(run, f"data.path={base / 'images'}")
    # The copied run's fingerprint was taken on the module's folder; re-take it on the copy's.
    rd = RunDir(run)
    rd.refingerprint("train", stages.fingerprint(stages.STAGES["train"], cfg, RunDir(run)))
    assert stages.up_to_date(stages.STAGES["train"], cfg, rd) == (True, "")
    _folder(base / "images", classes=("bird",), per_class=8)
    assert stages.up_to_date(stages.STAGES["train"], cfg, rd) == (False, "inputs changed")


def test_verify_refuses_data_with_other_classes(folder_run, tmp_path, capsys):
    base = tmp_path / "copy"
    shutil.copytree(folder_run, base)
    run = base / "run"
    _folder(base / "images", classes=("bird",), per_class=8)
    assert cli("verify", "--run-dir", run, f"data.path={base / 'images'}") == 2
    lines = capsys.readouterr().err.strip().splitlines()
    err = [line for line in lines if line.startswith("error:")]  # the rest: the data layout found (info)
    assert len(err) == 1 and err[0].startswith("error: verify:") and "Traceback" not in "".join(lines)
    assert "new in the data: bird" in err[0] and "re-run train" in err[0] and "Traceback" not in err[0]
    assert not (run / "verify.json").exists()


def test_the_data_summary_of_10000_files_takes_well_under_a_second(tmp_path):
    from pipeline.core.data import content_summary

    root = tmp_path / "many"
    for k in range(10):
        folder = root / f"class_{k}"
        folder.mkdir(parents=True)
        for i in range(1000):
            (folder / f"{i}.png").write_bytes(b"x")
    cfg = config_mod.resolve({}, overrides=["data.source=imagefolder", f"data.path={root}"])
    content_summary(cfg.data)  # warm the file system cache, as a second scan in one run would be
    start = time.perf_counter()
    summary = content_summary(cfg.data)
    elapsed = time.perf_counter() - start
    assert summary["files"] == 10_000 and summary["folders"] == [f"class_{k}" for k in range(10)]
    assert elapsed < 0.5, f"{elapsed:.2f} s"


# --------------------------------------------------------------------------- ONNX shapes


def test_onnx_output_shape_of_another_run_is_re_run_export(clone_run, capsys):
    run = clone_run()
    classes = run_cfg(run).data.num_classes
    export_with_classes(run, classes + 3)
    assert cli("verify", "--run-dir", run) == 2
    err = capsys.readouterr().err
    assert f"output 'logits' has shape ['batch', {classes + 3}], but the model card expects [batch, {classes}]" in err
    assert "re-run export" in err and "Traceback" not in err


def _claim_current_weights(run) -> None:
    """Stamp every graph in ``run`` with the current weights' sha256 (pipeline.core.provenance), as export would."""
    import hashlib

    from pipeline.core import provenance

    weights = hashlib.sha256((run / "model.safetensors").read_bytes()).hexdigest()
    for name in ("model.onnx", "model.fp16.onnx", "model.bf16.onnx", "model.int8.onnx"):
        if (run / name).exists():
            provenance.stamp_file(run / name, weights)


def test_onnx_without_static_output_shape_is_checked_on_the_outputs(clone_run, capsys):
    import onnx

    run = clone_run()
    classes = run_cfg(run).data.num_classes
    export_with_classes(run, classes + 3)
    model = onnx.load(str(run / "model.onnx"))
    model.graph.output[0].type.tensor_type.ClearField("shape")
    onnx.save(model, str(run / "model.onnx"))
    _claim_current_weights(run)  # past the stale-graph check, to the shape check under test
    assert cli("verify", "--run-dir", run) == 2
    err = capsys.readouterr().err
    assert f"gives outputs of shape [batch, {classes + 3}], but the trained model gives [batch, {classes}]" in err
    assert "re-run export" in err and "broadcast" not in err


# --------------------------------------------------------------------------- a non-finite reference


def test_nan_reference_blames_the_trained_model_not_the_export(clone_run, capsys):
    from safetensors.torch import load_file, save_file

    run = clone_run()
    state = load_file(str(run / "model.safetensors"))
    key = next(k for k in state if k.endswith("running_var"))
    state[key] = -state[key].abs() - 1.0  # eval mode only: sqrt of a negative variance is NaN
    save_file(state, str(run / "model.safetensors"))
    _claim_current_weights(run)  # as if export had run from these weights: the export is not at fault here
    assert cli("verify", "--run-dir", run) == 1
    err = capsys.readouterr().err
    assert "the trained model itself (PyTorch FP32, eval mode) produces NaN/Inf" in err
    assert "re-train" in err.lower() and "train.lr" in err
    assert "disagrees with PyTorch" not in err and "data-dependent control flow" not in err
    payload = verify_report(run)
    assert payload["passed"] is False and payload["reference"]["nonfinite"] > 0
    assert {c["status"] for c in payload["candidates"]} == {"skipped"}
    suite = ET.parse(run / "verify.junit.xml").getroot()
    assert int(suite.get("failures")) >= 1
