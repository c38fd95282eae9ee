"""The release gate across runs: `baseline` writes a bundle, `compare` judges a run against it."""

import dataclasses
import json
import shutil
import time

import pytest

from conftest import TINY, cli
from pipeline import config, stages
from pipeline.runtime import backends
from pipeline.core.errors import CheckFailed
from pipeline.core.run import RunDir
from pipeline.runtime.runners import TorchRunner

# benchmark of the in-process PyTorch backend only, one thread, enough timed runs for compare to judge
CHEAP_BENCH = ["benchmark.backends=[torch_fp32]", "benchmark.batch_sizes=[1]", "benchmark.threads=1",
               "benchmark.min_iterations=40", "benchmark.min_duration_s=0.05", "benchmark.trials=2"]


def _cfg(run, *extra):
    return config.resolve(overrides=["model.name=tiny_cnn", *TINY, *CHEAP_BENCH, *extra])


def _baseline(run, out):
    assert cli("baseline", "--run-dir", run, "--out", out) == 0
    return out


@pytest.fixture
def benched(clone_run, tmp_path):
    run = clone_run()
    cfg = _cfg(run)
    stages.run_stage("benchmark", cfg, RunDir(run))
    return run, cfg, _baseline(run, tmp_path / "bundle")


def test_own_bundle_after_a_fresh_benchmark_passes_20_of_20(benched):
    run, cfg, bundle = benched
    outcomes = []
    for _ in range(20):
        stages.run_stage("benchmark", cfg, RunDir(run))
        try:
            stages.run_stage("compare", cfg, RunDir(run), baseline=str(bundle))
            outcomes.append("passed")
        except CheckFailed as exc:
            outcomes.append(str(exc))
    assert outcomes == ["passed"] * 20
    report = json.loads((run / "compare.json").read_text())
    assert report["latency"] and all(r["status"] == "passed" for r in report["latency"])
    assert all(a["agreement"]["value"] == 1.0 for a in report["artifacts"])


def _slow_runner(ctx):
    import torch

    class Slowed(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            time.sleep(0.003)  # the planted regression, inside the timed call
            return self.inner(x)

    return TorchRunner(Slowed(ctx.model), name="torch_fp32", input_name=ctx.spec["input_name"],
                       output_name=ctx.spec["output_name"], input_shape=tuple(ctx.spec["input_size"]))


def test_a_slowed_benchmark_is_flagged(benched, monkeypatch, capsys):
    run, cfg, bundle = benched
    slowed = dataclasses.replace(backends.by_name("torch_fp32"), make=_slow_runner)
    monkeypatch.setattr(backends, "TABLE", [slowed if b.name == "torch_fp32" else b for b in backends.TABLE])
    stages.run_stage("benchmark", cfg, RunDir(run))
    assert cli("compare", "--run-dir", run, "--baseline", bundle) == 1
    err = capsys.readouterr().err
    assert "torch_fp32 at batch 1" in err and "environment: no change" in err
    row = json.loads((run / "compare.json").read_text())["latency"][0]
    assert row["status"] == "failed" and row["ci_low"] > cfg.compare.max_latency_ratio


def test_an_edited_tensorrt_version_is_named_in_the_environment_diff(benched, monkeypatch, tmp_path):
    run, _, bundle = benched
    meta = json.loads((bundle / "baseline.json").read_text())
    meta["environment"]["tensorrt"] = "10.13.0"
    (bundle / "baseline.json").write_text(json.dumps(meta))
    summary = tmp_path / "step_summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    assert cli("compare", "--run-dir", run, "--baseline", bundle) == 0  # a changed toolchain alone fails nothing
    report = json.loads((run / "compare.json").read_text())
    assert report["environment"] == [{"what": "tensorrt", "baseline": "10.13.0", "run": None}]
    assert "tensorrt 10.13.0 -> (none)" in (run / "compare.md").read_text()
    assert "| tensorrt | 10.13.0 | None |" in summary.read_text()  # the GitHub step summary, as verify's
    junit = (run / "compare.junit.xml").read_text()
    assert 'name="pipeline.compare"' in junit and "tensorrt 10.13.0 -&gt; (none)" in junit


def test_a_bundle_of_another_model_or_input_is_refused_with_exit_2(benched, capsys):
    run, _, bundle = benched
    meta = json.loads((bundle / "baseline.json").read_text())
    for key, value, said in (("model", "resnet18", "model 'resnet18'"), ("input_size", [3, 32, 32], "input size"),
                             ("classes", ["a", "b"], "classes")):
        (bundle / "baseline.json").write_text(json.dumps({**meta, key: value}))
        assert cli("compare", "--run-dir", run, "--baseline", bundle) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: compare: ") and said in err[0]
    assert cli("compare", "--run-dir", run, "--baseline", run) == 2  # not a bundle


def test_runs_differing_only_in_the_training_seed_fail_and_list_the_flips(clone_run, tmp_path, capsys):
    run = clone_run()
    bundle = _baseline(run, tmp_path / "bundle")
    other = tmp_path / "seed1"
    shutil.copytree(run, other)
    common = ["--run-dir", other, *TINY, "train.seed=1"]
    for stage in ("train", "export", "build", "verify"):
        assert cli(stage, *common) == 0
    assert cli("compare", "--run-dir", other, "--baseline", bundle) == 1
    err = capsys.readouterr().err
    assert "images flipped" in err and "environment: no change" in err
    report = json.loads((other / "compare.json").read_text())
    assert report["environment"] == []
    flipped = report["artifacts"][0]["flipped"]
    assert flipped and all(f["baseline"] != f["run"] for f in flipped)
    assert flipped[0]["image"].startswith("val[")
    assert "Images whose top-1 changed" in (other / "compare.md").read_text()


def test_all_runs_compare_when_a_baseline_is_set(clone_run, tmp_path, capsys):
    run = clone_run()
    bundle = _baseline(run, tmp_path / "bundle")
    assert cli("all", "--run-dir", run, f"compare.baseline={bundle}") == 0
    out = capsys.readouterr().out
    assert "compare    ok" in out
    assert (run / "compare.junit.xml").is_file()
    assert cli("report", "--run-dir", run) == 0
    assert "Compared with the baseline: PASSED" in (run / "report.md").read_text()
    assert "Compared with the baseline" in (run / "report.html").read_text()


def test_the_ci_example_runs_baseline_and_compare_with_commands_that_parse():
    import re
    import shlex

    import yaml

    from conftest import ROOT
    from pipeline.cli import build_parser

    workflow = yaml.safe_load((ROOT / "docs" / "ci-example.yml").read_text())
    assert {"gate-cpu", "update-baseline"} <= set(workflow["jobs"])
    steps = "\n".join(s.get("run", "") for job in workflow["jobs"].values() for s in job["steps"])
    commands = re.findall(r"python -m pipeline [^\n]*", steps)
    assert any(" baseline " in c for c in commands) and "compare.baseline=" in steps
    for command in commands:
        build_parser().parse_args(shlex.split(command.replace("${baseline:-}", ""))[3:])
