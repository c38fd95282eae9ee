"""The stage table: fingerprints, options, the run it opens, and ``run_all`` from Python being
``python -m pipeline all``."""

from __future__ import annotations

import json
import os

import pytest

from conftest import TINY, cli, run_cli
from pipeline import config, stages
from pipeline.core import artifacts
from pipeline.core.errors import UsageError
from pipeline.core.run import RunDir


def tiny_cfg(*overrides: str):
    return config.resolve({}, None, ["model.name=tiny_cnn", *TINY, *overrides])


def manifest(run_dir) -> dict:
    return json.loads((run_dir / artifacts.MANIFEST).read_text())


def outcome(run_dir) -> dict:
    """What `all` leaves behind, without the times, hashes and ids that differ between two runs."""
    m = manifest(run_dir)
    return {
        "model": m["model"],
        "environment": sorted(m["environment"]),
        "stages": {name: (e["status"], e.get("reason"), sorted(e["artifacts"]), e.get("require"))
                   for name, e in m["stages"].items()},
        "config.yaml": (run_dir / artifacts.CONFIG).read_text(),
    }


def run_ids(run_dir) -> dict:
    return {name: e["run_id"] for name, e in manifest(run_dir)["stages"].items()}


def test_run_all_from_python_is_the_all_command(tiny_run, tmp_path):
    by_cli, by_python = tiny_run, tmp_path / "python"  # tiny_run: `all` with TINY, through the command line's main
    returned = stages.run_all(tiny_cfg(), by_python)
    assert returned["stages"] == manifest(by_python)["stages"]
    assert outcome(by_python) == outcome(by_cli)
    assert list(manifest(by_python)["stages"]) == list(stages.ORDER)

    # Unchanged: a second run_all skips every stage, as `all` does.
    before = run_ids(by_python)
    stages.run_all(tiny_cfg(), by_python)
    assert run_ids(by_python) == before


def test_run_all_and_the_all_command_refuse_a_locked_run_alike(tmp_path, capsys):
    holder = RunDir(tmp_path)
    with holder.locked():
        claimed = (tmp_path / artifacts.MANIFEST).read_bytes()  # the holder's claim: its manifest, nothing else
        with pytest.raises(UsageError, match=rf"in use by another pipeline process \(pid {os.getpid()}\)"):
            stages.run_all(tiny_cfg(), tmp_path)
        out = run_cli("all", "--model", "tiny_cnn", "--run-dir", tmp_path, *TINY)
        assert out.returncode == 2
        assert f"in use by another pipeline process (pid {os.getpid()})" in out.stderr
    # nothing written by the refused commands
    assert not (tmp_path / artifacts.CONFIG).exists() and (tmp_path / artifacts.MANIFEST).read_bytes() == claimed
    with RunDir(tmp_path).locked():  # and both let go of nothing they did not hold
        pass


def test_open_run_saves_the_config_and_records_the_environment(tmp_path):
    cfg = tiny_cfg("require=[cuda]")
    saved = tiny_cfg()
    with stages.open_run(cfg, tmp_path / "run", save=saved) as run:
        assert (tmp_path / "run" / artifacts.LOCK).read_text() == str(os.getpid())
        with pytest.raises(UsageError, match="in use by another pipeline process"), RunDir(run.path).locked():
            pass
    kept = config.load_yaml_file(tmp_path / "run" / artifacts.CONFIG)
    assert config.resolve(kept, None, []) == saved
    assert kept["require"] == []  # this call's requirement is not the run's
    m = manifest(tmp_path / "run")
    assert m["model"] == "tiny_cnn" and m["environment"]["torch"] and m["environment"]["cpu"]


def test_open_run_creates_nothing_for_an_unknown_model(tmp_path):
    with pytest.raises(UsageError, match="resnet19"), stages.open_run(tiny_cfg("model.name=resnet19"), tmp_path / "r"):
        pass
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("name", ["build", "verify"])
def test_a_requirement_is_not_a_fingerprint_input(tmp_path, name):
    """`--require` checks a backend; it does not change what a stage makes, so it must not invalidate it."""
    run = RunDir(tmp_path)
    plain, required = tiny_cfg(), tiny_cfg("require=[tensorrt,cuda]")
    stage = stages.STAGES[name]
    assert stages.fingerprint(stage, plain, run) == stages.fingerprint(stage, required, run)
    assert stages.fingerprint(stage, plain, run) != stages.fingerprint(stage, tiny_cfg(f"{name}.{_a_key(name)}"), run)


def _a_key(name: str) -> str:
    return {"build": "opt_batch=2", "verify": "samples=32"}[name]


def test_stage_options_come_from_the_flags_or_the_config():
    verify = stages.STAGES["verify"]
    assert verify.options_for(tiny_cfg(), {}) == {"auto_fallback": False}
    assert verify.options_for(tiny_cfg(), {"auto_fallback": True}) == {"auto_fallback": True}
    assert verify.options_for(tiny_cfg("verify.auto_fallback=true"),
                              {"auto_fallback": False}) == {"auto_fallback": True}
    assert stages.STAGES["train"].options_for(tiny_cfg(), {"resume": True}) == {"resume": True, "profile": False}
    with pytest.raises(UsageError, match="export has no option resume"):
        stages.STAGES["export"].options_for(tiny_cfg(), {"resume": True})


def test_unknown_forced_stage_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="cannot force trian"):
        stages.run_stages(tiny_cfg(), RunDir(tmp_path), force={"trian"})


def test_a_stage_in_the_table_is_a_command_with_its_options_and_summary(tmp_path, monkeypatch, capsys):
    """Nothing in the command line knows the stages: one table entry is a subcommand, its flags, its summary."""
    calls = []

    def run(cfg, run_dir, record, *, shout=False):
        calls.append(shout)
        record.details["said"] = "HELLO" if shout else "hello"

    monkeypatch.setitem(stages.STAGES, "probe", stages.Stage(
        "probe", run, ("model",), (), (), help="say hello",
        options=(stages.Option("--shout", "say it loudly"),), summary=lambda entry: entry.details["said"]))

    with pytest.raises(SystemExit):
        cli("probe", "--help")
    assert "--shout" in capsys.readouterr().out
    assert cli("probe", "--model", "tiny_cnn", "--run-dir", tmp_path, "--shout") == 0
    assert calls == [True]
    entry = RunDir(tmp_path).stage_entry("probe")
    assert entry.status == "ok" and stages.STAGES["probe"].line(entry) == "HELLO"
    assert (tmp_path / artifacts.CONFIG).is_file()  # the same open run as every stage


def test_summary_lines_come_from_each_stage(tmp_path):
    run = RunDir(tmp_path)
    run.manifest["stages"] = {
        "train": {"status": "ok", "details": {"best_val_acc": 0.5, "epochs": 2, "amp": "bf16"}},
        "build": {"status": "skipped", "reason": "TensorRT is not installed", "details": {}},
        "verify": {"status": "failed", "exit_code": 1,  # the gate failed: its verdicts are complete
                   "details": {"candidates": {"onnxrt_fp32": "passed", "onnxrt_fp16_cpu": "failed"}}},
    }
    lines = stages.summary(run).splitlines()
    assert lines[1] == f"run directory: {tmp_path}"
    assert lines[2].split() == ["train", "ok", "best", "val", "acc", "50.0%", "after", "2", "epochs,", "amp", "bf16"]
    assert lines[3].split()[:2] == ["export", "not"]
    assert lines[4].endswith("skipped      TensorRT is not installed")
    assert lines[5].endswith("onnxrt_fp32: passed, onnxrt_fp16_cpu: failed")


def test_verify_is_stale_on_a_cpu_with_other_bf16_units(monkeypatch):
    """openvino_bf16 is skipped without bf16 units: a verify from such a CPU must re-run on one that has them."""
    monkeypatch.setattr(stages.env, "cpu_has_native_bf16", lambda: False)
    without = stages.STAGES["verify"].hardware()
    monkeypatch.setattr(stages.env, "cpu_has_native_bf16", lambda: True)
    assert stages.STAGES["verify"].hardware() != without


# What each stage reads of the config, written out here rather than read from the stage table: a section dropped
# from a stage's declaration (the export stage ignoring `export.*`, say) would otherwise pass unnoticed.
READS = {"train": ("model", "data", "train"), "export": ("model", "data", "export"), "build": ("build",),
         "verify": ("model", "data", "verify"), "benchmark": ("model", "data", "benchmark")}
ONE_KEY = {"model": "model.mean=[0.4,0.4,0.4]", "data": "data.seed=3", "train": "train.lr=0.01",
           "export": "export.opset=17", "build": "build.opt_batch=2", "verify": "verify.fp16.max_scaled_error=0.07",
           "benchmark": "benchmark.trials=5"}


@pytest.mark.parametrize("stage,section", [(s, k) for s, sections in READS.items() for k in sections])
def test_every_config_section_a_stage_reads_enters_its_fingerprint(tmp_path, stage, section):
    run = RunDir(tmp_path)
    before = stages.fingerprint(stages.STAGES[stage], tiny_cfg(), run)
    assert stages.fingerprint(stages.STAGES[stage], tiny_cfg(ONE_KEY[section]), run) != before


# --------------------------------------------------------------------------- tune's fingerprint (issue 30, §3)


def test_tunes_own_fallback_file_is_not_its_input_and_export_rerunning_does_not_make_it_stale(tmp_path):
    """A second identical `all --tune` re-ran tune: export re-runs after tune (its choice changed int8_fallback.json),
    and tune's fingerprint held export's run id; an FP16 tune's own fp16_fallback.json was also one of its inputs."""
    run = RunDir(tmp_path)
    tune = stages.STAGES["tune"]
    int8, fp16, bf16 = tiny_cfg(), tiny_cfg("tune.precision=fp16"), tiny_cfg("tune.precision=bf16")
    before = {cfg.tune.precision: stages.fingerprint(tune, cfg, run) for cfg in (int8, fp16, bf16)}
    run.manifest["stages"]["export"] = {"status": "ok", "run_id": "export ran again after tune"}
    (tmp_path / artifacts.FP16_FALLBACK).write_text('{"nodes": ["/a/Add"]}')  # what an FP16 tune writes
    (tmp_path / artifacts.INT8_FALLBACK).write_text('{"nodes": ["/a/Conv"]}')  # what an INT8 tune writes
    (tmp_path / artifacts.BF16_FALLBACK).write_text('{"nodes": ["/a/Mul"]}')  # what a BF16 tune writes
    assert stages.fingerprint(tune, fp16, run) == before["fp16"]  # a float tune reads no other fallback file
    assert stages.fingerprint(tune, bf16, run) == before["bf16"]
    assert stages.fingerprint(tune, int8, run) != before["int8"]  # the FP16 fallback's nodes stay FP32 in INT8 mixes
    (tmp_path / artifacts.FP16_FALLBACK).unlink()
    assert stages.fingerprint(tune, int8, run) == before["int8"]
    run.manifest["stages"]["train"] = {"status": "ok", "run_id": "trained again"}
    assert stages.fingerprint(tune, int8, run) != before["int8"]


def test_tune_precision_flag_is_the_config_key_for_the_fingerprint():
    """`tune --precision fp16` on an int8 config: its manifest entry must not pass for an INT8 tune later."""
    tune = stages.STAGES["tune"]
    cfg = tiny_cfg()
    assert tune.configured(cfg, tune.options_for(cfg, {"precision": "fp16"})).tune.precision == "fp16"
    assert tune.configured(cfg, tune.options_for(cfg, {})).tune.precision == "int8"
    assert cfg.tune.precision == "int8"  # the caller's config is left as it was


def test_the_recipe_enters_the_train_fingerprint_as_resolved(tmp_path, monkeypatch):
    """The model card's recipe is part of the resolved train section, so a changed recipe re-trains."""
    import dataclasses

    from pipeline.core.registry import models

    run = RunDir(tmp_path)
    before = stages.fingerprint(stages.STAGES["train"], tiny_cfg(), run)
    entry = models._REGISTRY["tiny_cnn"]
    monkeypatch.setattr(entry, "recipe", dataclasses.replace(entry.recipe, lr=0.07))
    assert tiny_cfg().train.lr == 0.07
    assert stages.fingerprint(stages.STAGES["train"], tiny_cfg(), run) != before


def test_summary_lines_name_precise_bn_learning_and_the_reference(tmp_path):
    run = RunDir(tmp_path)
    learned = {"learned": True, "line": "learned: ..."}
    run.manifest["stages"] = {
        "train": {"status": "ok", "details": {"best_val_acc": 0.865, "epochs": 4, "amp": "off", "learning": learned,
                                              "precise_bn": {"best_epoch_val_acc_before": 0.1,
                                                             "best_epoch_val_acc_after": 0.865}}},
        "verify": {"status": "ok", "details": {"candidates": {"onnxrt_fp32": "passed"}, "deployable": ["onnxrt_fp32"],
                                               "reference_accuracy": 0.1, "reference_learned": False}},
    }
    lines = stages.summary(run).splitlines()
    assert lines[2].endswith("best val acc 86.5% after 4 epochs, amp off; precise BN 10.0% -> 86.5%; learned")
    assert lines[5].endswith("reference (FP32) val acc 10.0% (it did not learn); onnxrt_fp32: passed; "
                             "deployable: onnxrt_fp32")
    run.manifest["stages"]["train"] = {"status": "failed", "exit_code": 1, "error": "the model did not learn: x",
                                       "details": {"best_val_acc": 0.1, "epochs": 1, "amp": "off",
                                                   "learning": {"learned": False,
                                                                "line": "the model did not learn: x"}}}
    assert stages.summary(run).splitlines()[2].endswith("amp off; the model did not learn: x")
