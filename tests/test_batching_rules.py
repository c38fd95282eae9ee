"""The batch-size check's decisions (pipeline/evaluation/batching.py) with test doubles for the runner and the
candidate: which sizes run, what a size that cannot run counts as, how one size's verdict fails the candidate.
Milliseconds: the mutation command runs these for every mutant of batching.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np
import pytest

from pipeline.core.check_results import BatchSizeRow, CandidateResult
from pipeline.core.status import Status
from pipeline.evaluation import batching
from pipeline.runtime.isolate import Crashed

GATE = {"criterion": "scaled", "max_scaled_error": 0.05, "error_quantile": 1.0, "atol": 1e-3, "rtol": 1e-3,
        "check_error_stat": "elemwise", "min_top1_agreement": 0.9, "max_accuracy_drop": 0.05}


def cfg(min_batch=1, opt_batch=8, max_batch=16, batch_size=8, samples=32, dynamic=True):
    return SimpleNamespace(build=SimpleNamespace(min_batch=min_batch, opt_batch=opt_batch, max_batch=max_batch),
                           verify=SimpleNamespace(batch_size=batch_size, batch_check_samples=samples),
                           export=SimpleNamespace(dynamic_batch=dynamic))


class Runner:
    """A runner whose output for an image depends on the batch only when ``mixes`` (a fraction of the batch mean)."""

    def __init__(self, weights: np.ndarray, mixes: float = 0.0, refuse: dict | None = None, fails_at=()):
        self.weights, self.mixes, self.refuse, self.fails_at = weights, mixes, refuse or {}, set(fails_at)
        self.sizes: list[int] = []

    def batch_reason(self, size: int) -> str:
        return self.refuse.get(size, "")

    def infer(self, feed: dict) -> dict:
        x = feed["x"]
        self.sizes.append(len(x))
        if len(x) in self.fails_at:
            raise RuntimeError("profile does not cover this shape\nsecond line")
        out = x @ self.weights
        return {"y": out + self.mixes * out.mean(axis=0, keepdims=True)}


@dataclass
class Chk:
    name: str = "openvino_fp32"
    precision: str = "fp32"
    artifact: str | None = "openvino/fp32.xml"
    result: CandidateResult = field(default_factory=lambda: CandidateResult(status=Status.PASSED))
    batch_runs: dict = field(default_factory=dict)

    @property
    def status(self) -> str:
        return self.result.status


def evidence(n=32, batch=8, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 6)).astype(np.float32)
    w = rng.normal(size=(6, 5)).astype(np.float32)
    ref = x @ w
    feeds = [{"x": x[i:i + batch]} for i in range(0, n, batch)]
    reference = [{"y": ref[i:i + batch]} for i in range(0, n, batch)]
    labels = ref.argmax(1)
    return SimpleNamespace(feeds=feeds, reference=reference, labels=labels, output_name="y", confidence=0.95), w


def test_served_batches_name_every_profile_key_once_per_size_in_order():
    assert batching.served_batches(cfg(1, 8, 16)) == {1: ["build.min_batch"], 8: ["build.opt_batch"],
                                                      16: ["build.max_batch"]}
    assert batching.served_batches(cfg(8, 8, 4)) == {4: ["build.max_batch"], 8: ["build.min_batch", "build.opt_batch"]}


def test_rebatch_keeps_rows_and_order_and_a_short_last_batch():
    rows = [{"x": np.arange(5)[:, None]}, {"x": np.arange(5, 7)[:, None]}]
    cut = batching.rebatch(rows, "x", 3)
    assert [len(b["x"]) for b in cut] == [3, 3, 1]
    np.testing.assert_array_equal(np.concatenate([b["x"] for b in cut]).ravel(), np.arange(7))


def test_feeds_by_size_take_the_first_images_at_every_other_served_size():
    ev, _ = evidence(n=40)
    feeds = batching.feeds_by_size(cfg(samples=20), ev.feeds)
    assert sorted(feeds) == [1, 16]  # 8 is the main check's own batching
    assert [len(b["x"]) for b in feeds[16]] == [16, 4] and len(feeds[1]) == 20
    np.testing.assert_array_equal(feeds[1][3]["x"][0], ev.feeds[0]["x"][3])
    assert batching.feeds_by_size(cfg(samples=0), ev.feeds) == {}
    one = batching.feeds_by_size(cfg(samples=4), ev.feeds[:1])  # a single batch of evidence
    assert [len(b["x"]) for b in one[1]] == [1, 1, 1, 1] and one[16][0]["x"].shape == (4, 6)


def test_a_size_the_runtime_refuses_is_skipped_and_one_that_raises_fails_the_candidate():
    ev, w = evidence()
    feeds = batching.feeds_by_size(cfg(), ev.feeds)
    runner = Runner(w, refuse={16: "beyond the engine's profile"}, fails_at={1})
    runs = batching.run_sizes(runner, Chk(), cfg(), feeds)
    assert runs[16] == {"status": Status.SKIPPED, "reason": "beyond the engine's profile"}
    assert runs[1]["status"] == Status.FAILED
    assert runs[1]["reason"] == "cannot run at batch 1: RuntimeError: profile does not cover this shape"


def test_a_crash_at_another_size_propagates():
    class Dying(Runner):
        def infer(self, feed):
            raise Crashed("killed by SIGSEGV", "inferring", "x.log", [])

    ev, w = evidence()
    with pytest.raises(Crashed):
        batching.run_sizes(Dying(w), Chk(), cfg(), batching.feeds_by_size(cfg(), ev.feeds))


def test_a_static_artifact_serves_one_size_but_the_reference_model_has_no_artifact():
    ev, w = evidence()
    feeds = batching.feeds_by_size(cfg(), ev.feeds)
    static = batching.run_sizes(Runner(w), Chk(), cfg(dynamic=False), feeds)
    assert static == {size: {"status": Status.SKIPPED, "reason": "static batch (export.dynamic_batch=false): the "
                                                                 "artifact serves one batch size"} for size in (1, 16)}
    runs = batching.run_sizes(Runner(w), Chk(artifact=None), cfg(dynamic=False), feeds)
    assert all("outputs" in r for r in runs.values())


def gate_for(config, name: str, precision: str) -> dict:
    """The candidate's own gate, looked up as verify does (a wrong argument finds no gate)."""
    assert config.verify.batch_check_samples is not None
    return {("openvino_fp32", "fp32"): GATE, ("int8_exact", "int8"): {**GATE, "max_scaled_error": 10.0,
                                                                      "min_top1_agreement": 0.0,
                                                                      "max_accuracy_drop": 1.0}}[name, precision]


def check_candidate(runner: Runner, chk: Chk | None = None, config=None):
    config = config or cfg(samples=20)
    ev, _ = evidence()
    chk = chk or Chk()
    chk.batch_runs = batching.run_sizes(runner, chk, config, batching.feeds_by_size(config, ev.feeds))
    batching.verify_batch_sizes(config, [chk], ev, gate_for)
    return chk


def test_a_sound_runner_passes_at_every_size_and_the_rows_say_so():
    _, w = evidence()
    chk = check_candidate(Runner(w))
    rows = [r.to_json() for r in chk.result.batch_sizes]  # as verify.json holds them
    assert [r["batch_size"] for r in rows] == [1, 8, 16] and chk.status == Status.PASSED
    assert rows[1] == {"batch_size": 8, "profile": ["build.opt_batch"], "status": Status.PASSED,
                       "reason": "verify.batch_size: the main check"}
    assert rows[0]["status"] == Status.PASSED and rows[0]["images"] == 20 and rows[0]["batches"] == 20
    assert rows[2]["batches"] == 2 and rows[2]["top1_agreement"] == 1.0 and rows[2]["tensor_passed"]
    assert set(rows[0]) == {"batch_size", "profile", "status", "images", "batches", "max_abs_error", "scaled_error",
                            "top1_agreement", "tensor_passed", "task_status"}
    assert rows[0]["task_status"] == Status.PASSED and rows[0]["max_abs_error"] < 1e-4
    assert rows[0]["scaled_error"] < 1e-4 and rows[0]["scaled_error"] is not None


def test_a_runner_that_mixes_rows_is_measured_in_the_rows():
    _, w = evidence()
    rows = [r.to_json() for r in check_candidate(Runner(w, mixes=0.5)).result.batch_sizes]
    assert rows[0]["max_abs_error"] > 0.01 and rows[0]["scaled_error"] > 0.01 and not rows[0]["tensor_passed"]
    assert rows[0]["task_status"] in (Status.FAILED, Status.INCONCLUSIVE, Status.PASSED)


def test_the_candidates_own_gate_judges_its_rows():
    _, w = evidence()
    lenient = check_candidate(Runner(w, mixes=0.5), Chk(name="int8_exact", precision="int8"))
    assert lenient.status == Status.PASSED  # its gate tolerates the mixing; openvino_fp32's does not


def test_every_candidate_is_considered_whatever_the_one_before_it():
    ev, w = evidence()
    config = cfg(samples=20)
    feeds = batching.feeds_by_size(config, ev.feeds)
    skipped = Chk(result=CandidateResult(status=Status.SKIPPED))
    refit = Chk(result=CandidateResult(status=Status.PASSED, after_fallback=True))
    dead = Chk(batch_runs={"error": "child died"})
    mixing = Chk()
    mixing.batch_runs = batching.run_sizes(Runner(w, mixes=0.5), mixing, config, feeds)
    batching.verify_batch_sizes(config, [skipped, refit, dead, mixing], ev, gate_for)
    assert mixing.status == Status.FAILED and refit.result.batch_sizes[0].status == Status.SKIPPED
    assert dead.result.batch_sizes[0].status == Status.ERROR and skipped.result.batch_sizes is None


def test_rows_that_mix_the_batch_fail_the_candidate_and_name_the_size():
    _, w = evidence()
    chk = check_candidate(Runner(w, mixes=0.5))
    assert chk.status == Status.FAILED and chk.result.passed is False
    assert chk.result.reason.startswith("the output depends on the batch size: fails at batch 1 (build.min_batch)")
    assert "batch 16 (build.max_batch)" in chk.result.reason
    assert chk.result.hint == batching.BATCH_HINT
    failed = [r.batch_size for r in chk.result.batch_sizes if r.status == Status.FAILED]
    assert failed == [1, 16]


def test_a_size_that_cannot_run_fails_the_candidate_and_one_refused_does_not():
    _, w = evidence()
    chk = check_candidate(Runner(w, fails_at={16}))
    assert chk.status == Status.FAILED and "cannot run at batch 16" in chk.result.reason
    refused = check_candidate(Runner(w, refuse={16: "static profile"}))
    assert refused.status == Status.PASSED
    assert refused.result.batch_sizes[2].to_json() == {"batch_size": 16, "profile": ["build.max_batch"],
                                                "status": Status.SKIPPED, "reason": "static profile"}


@pytest.mark.parametrize("status", [Status.FAILED, Status.SKIPPED, Status.ERROR, Status.CRASHED])
def test_only_passed_and_inconclusive_candidates_are_checked_at_other_sizes(status):
    _, w = evidence()
    chk = check_candidate(Runner(w, mixes=0.5), Chk(result=CandidateResult(status=status)))
    assert chk.status == status and chk.result.batch_sizes is None


def test_an_inconclusive_candidate_is_checked_and_can_fail():
    _, w = evidence()
    chk = check_candidate(Runner(w, mixes=0.5), Chk(result=CandidateResult(status=Status.INCONCLUSIVE)))
    assert chk.status == Status.FAILED


def test_after_a_fallback_and_after_a_dead_runner_the_row_says_why_and_the_verdict_stands():
    _, w = evidence()
    chk = check_candidate(Runner(w, mixes=0.5), Chk(result=CandidateResult(status=Status.PASSED, after_fallback=True)))
    assert chk.status == Status.PASSED
    assert [r.to_json() for r in chk.result.batch_sizes] == [{"status": Status.SKIPPED,
                                                                 "reason": batching.AFTER_FALLBACK}]
    ev, _ = evidence()
    dead = Chk(batch_runs={"error": "child died"})
    batching.verify_batch_sizes(cfg(), [dead], ev, gate_for)
    assert dead.status == Status.PASSED
    assert [r.to_json() for r in dead.result.batch_sizes] == [{"status": Status.ERROR, "reason": "child died"}]


def test_the_check_is_off_with_no_samples():
    ev, w = evidence()
    chk = Chk()
    batching.verify_batch_sizes(cfg(samples=0), [chk], ev, gate_for)
    assert chk.result.batch_sizes is None


def test_a_size_that_was_not_run_is_a_skipped_row():
    ev, _ = evidence()
    rows = batching.candidate_rows(Chk(), cfg(), ev, GATE)
    assert rows[0].to_json() == {"batch_size": 1, "profile": ["build.min_batch"], "status": Status.SKIPPED,
                                 "reason": "not run"}


def test_describe_words_each_failing_size():
    rows = [BatchSizeRow(batch_size=16, profile=["build.max_batch", "build.opt_batch"], status=Status.FAILED,
                         reason="cannot run"),
            BatchSizeRow(batch_size=1, profile=["build.min_batch", "build.opt_batch"], status=Status.FAILED, images=8,
                         scaled_error=0.25, max_abs_error=1.0, top1_agreement=0.625),
            BatchSizeRow(batch_size=4, profile=["build.max_batch"], status=Status.FAILED, images=8, scaled_error=None,
                         max_abs_error=0.5, top1_agreement=0.5)]
    assert batching.describe(rows) == (
        "the output depends on the batch size: fails at batch 16 (build.max_batch, build.opt_batch): cannot run; "
        "batch 1 (build.min_batch, build.opt_batch): scaled error 0.25, top-1 agreement 62.5%; batch 4 "
        "(build.max_batch): max abs "
        "error 0.5, top-1 agreement 50.0%")
