"""verify at every batch size the artifact serves (build.min_batch/opt_batch/max_batch):
pipeline/evaluation/batching.py."""

import json

from conftest import ROOT, TINY, cli


def _rows(run, name):
    verify = json.loads((run / "verify.json").read_text())
    return {r["batch_size"]: r for r in next(c for c in verify["candidates"] if c["name"] == name)["batch_sizes"]}


def test_a_sound_model_passes_at_every_profile_batch_size(tiny_run):
    rows = _rows(tiny_run, "onnxrt_fp32")
    assert sorted(rows) == [1, 8, 32]  # build.min_batch, opt_batch, max_batch (defaults)
    assert {r["status"] for r in rows.values()} == {"passed"}
    # the 20 tiny images (< 64), one by one
    assert rows[1]["profile"] == ["build.min_batch"] and rows[1]["batches"] == 20


def test_an_output_that_depends_on_the_batch_fails_and_names_the_batch_size(tmp_path, capsys):
    run = tmp_path / "run"
    model = f"{ROOT / 'tests' / 'batch_models.py'}:batch_mean"
    code = cli("all", "--model", model, "--run-dir", run, *TINY, "benchmark.backends=[torch_fp32]",
               "build.opt_batch=16")
    err = capsys.readouterr().err
    assert code == 1
    line = next(x for x in err.splitlines() if x.startswith("error: verify:"))
    assert "the output depends on the batch size: fails at batch 1 (build.min_batch)" in line
    rows = _rows(run, "onnxrt_fp32")
    # verify.batch_size is 16 = build.opt_batch: the main check, which the reference agrees with at that batching
    assert rows[16]["status"] == "passed" and rows[16]["profile"] == ["build.opt_batch"]
    assert rows[1]["status"] == "failed" and rows[32]["status"] == "failed"
    assert "--auto-fallback" not in line  # not a precision fault: no fallback is offered


def test_a_static_artifact_is_skipped_with_the_reason():
    from types import SimpleNamespace

    from pipeline.evaluation import batching

    chk = SimpleNamespace(artifact="model.onnx", backend=SimpleNamespace(runtime="ONNX Runtime"))
    cfg = SimpleNamespace(export=SimpleNamespace(dynamic_batch=False))
    runs = batching.run_sizes(None, chk, cfg, {1: [], 32: []})  # the runner is never asked
    assert [r["status"] for r in runs.values()] == ["skipped", "skipped"]
    assert "static batch (export.dynamic_batch=false)" in runs[1]["reason"]


def test_the_other_batch_sizes_run_on_the_main_checks_runner(clone_run, monkeypatch):
    """One start per candidate: a second start of its child process, session or IR would double verify's time."""
    from pipeline.runtime import isolate

    starts = []
    real = isolate.runner_for
    monkeypatch.setattr(isolate, "runner_for",
                        lambda backend, ctx: starts.append(backend.candidate) or real(backend, ctx))
    run = clone_run()
    assert cli("verify", "--run-dir", run) == 0
    assert len(starts) >= 3 and len(starts) == len(set(starts)), starts
    assert {r["status"] for r in _rows(run, "onnxrt_fp32").values()} == {"passed"}
