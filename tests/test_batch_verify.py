"""verify at every batch size the artifact serves (build.min_batch/opt_batch/max_batch):
pipeline/evaluation/batching.py."""

import json

import numpy as np

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
                        lambda backend, ctx: starts.append(backend.verify_name) or real(backend, ctx))
    run = clone_run()
    assert cli("verify", "--run-dir", run) == 0
    assert len(starts) >= 3 and len(starts) == len(set(starts)), starts
    assert {r["status"] for r in _rows(run, "onnxrt_fp32").values()} == {"passed"}


def test_a_batch_asked_twice_in_one_check_runs_once(clone_run, monkeypatch):
    """The batch-size check's batch 1 and the conformance check's "alone" ask the same first images; the main check's
    first batch and the conformance "batch" ask the same full batch: each distinct batch reaches the runtime once."""
    from pipeline.runtime import isolate

    asked = []
    one, each = isolate.Isolated.infer_impl, isolate.Isolated.infer_each  # one feed a request, or several

    def spy_one(self, feed):
        spy_each(self, [feed], record_only=True)
        return one(self, feed)

    def spy_each(self, feeds, record_only=False):
        if self.backend.name == "onnxrt_fp32":
            asked.extend(b"".join(np.ascontiguousarray(v).tobytes() for v in feed.values()) for feed in feeds)
        return None if record_only else each(self, feeds)

    monkeypatch.setattr(isolate.Isolated, "infer_impl", spy_one)
    monkeypatch.setattr(isolate.Isolated, "infer_each", spy_each)
    run = clone_run()
    assert cli("verify", "--run-dir", run) == 0
    assert asked and len(asked) == len(set(asked))
    assert {r["status"] for r in _rows(run, "onnxrt_fp32").values()} == {"passed"}


def test_an_answer_given_again_is_a_copy_of_the_first():
    from collections import OrderedDict

    from pipeline.runtime.runners import Answered

    class Runner:
        calls = 0

        def infer(self, feed):
            Runner.calls += 1
            return OrderedDict(y=feed["x"] * 2)

        def batch_reason(self, size):
            return f"no {size}"

    asked = Answered(Runner())
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    first = asked.infer({"x": x})
    first["y"][:] = -1  # a caller that writes into what it got back
    again = asked.infer({"x": x.copy()})
    np.testing.assert_array_equal(again["y"], x * 2)
    assert Runner.calls == 1 and asked.batch_reason(4) == "no 4"
    asked.infer({"x": x.astype(np.float64)})  # the same values in another type: another feed
    asked.infer({"x": x[:1]})
    assert Runner.calls == 3
