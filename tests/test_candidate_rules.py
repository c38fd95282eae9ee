"""What verify decides about one candidate before and after it runs (pipeline/evaluation/candidates.py): its
thresholds, whether it gates, why it cannot run, which graph it judges, where localisation looks and with what
limit, and when its outputs are unusable. Test doubles for the runner; milliseconds once imported."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from pipeline import config as config_mod
from pipeline.core.check_results import CandidateResult, TensorCheck
from pipeline.core.errors import InputError
from pipeline.core.status import Status
from pipeline.evaluation import candidates
from pipeline.precision import plugs
from pipeline.runtime import backends


def cfg(**overrides):
    return config_mod.resolve({}, None, [f"{k}={v}" for k, v in overrides.items()])


def check(name: str, result: dict | None = None) -> candidates.Check:
    return candidates.Check(backends.by_name(name), name, False, result=CandidateResult(**(result or {})))


def test_a_candidates_own_thresholds_override_its_precisions_and_null_keeps_them():
    base = cfg()
    assert candidates.gate_for(base, "int8_exact", "int8") == base.verify.int8.model_dump()
    own = cfg(**{"verify.candidates.int8_exact.max_scaled_error": 0.9, "verify.int8.min_top1_agreement": 0.5})
    gate = candidates.gate_for(own, "int8_exact", "int8")
    assert gate["max_scaled_error"] == 0.9 and gate["min_top1_agreement"] == 0.5
    assert gate["max_accuracy_drop"] == base.verify.int8.max_accuracy_drop
    assert candidates.gate_for(own, "onnxrt_int8_cpu", "int8")["max_scaled_error"] == base.verify.int8.max_scaled_error
    assert candidates.gate_for(base, "no_such_candidate", "no_such_precision") == base.verify.fp32.model_dump()
    zero = cfg(**{"verify.candidates.onnxrt_fp32.max_scaled_error": 0})
    assert candidates.gate_for(zero, "onnxrt_fp32", "fp32")["max_scaled_error"] == 0  # 0 is a value, not null


def test_which_candidates_gate():
    auto, named = cfg(), cfg(**{"verify.gate": "[onnxrt_int8_cpu]"})
    table = {b.verify_name: b for b in backends.candidates()}
    for name, backend in table.items():
        assert candidates.gates(auto, backend) == backend.gates
        assert candidates.gates(named, backend) == (name == "onnxrt_int8_cpu")


def test_plan_says_why_each_cannot_run_and_a_disabled_one_is_never_asked():
    asked = []

    class Entry:
        def __init__(self, name, reason):
            self.verify_name, self.reason, self.gates, self.label = name, reason, True, name

        def unavailable(self, ctx):
            asked.append(self.verify_name)
            return self.reason

        def required(self, cfg):
            return self.verify_name == "onnxrt_fp32"

    off = cfg(**{"verify.candidates.fp16_emulation.enabled": False})
    checks = candidates.plan(off, None, [Entry("onnxrt_fp32", ""), Entry("fp16_emulation", "x"),
                                         Entry("int8_exact", "no INT8 graph")])
    assert [c.reason for c in checks][0] == "" and checks[2].reason == "no INT8 graph"
    assert "disabled" in checks[1].reason and "fp16_emulation" not in asked
    assert [c.required for c in checks] == [True, False, False] and all(c.gates for c in checks)


def test_runs_graph_follows_the_table():
    for b in backends.candidates():
        chk = candidates.Check(b, b.verify_name, False)
        for plug in plugs.ORDER:
            assert candidates.runs_graph(chk, plug) == (b.graph == plug.name)
    assert {b.verify_name for b in backends.candidates() if b.graph == "bf16"} == {"bf16_emulation", "tensorrt_bf16"}


def test_localisation_limit_and_batch_come_from_the_candidates_own_result():
    gate = {"criterion": "scaled", "max_scaled_error": 0.5, "atol": 0.1, "rtol": 0.1}
    tensor = TensorCheck(passed=False, criterion="scaled", statistic="q1", scaled_error_quantile=0.4, worst_image=20)
    chk = check("int8_exact", {"tolerance": gate, "tensor_check": tensor})
    assert candidates.localization_rule(chk).max_scaled_error == pytest.approx(0.2)
    unmeasured = tensor.model_copy(update={"scaled_error_quantile": None})
    chk.result = chk.result.model_copy(update={"tensor_check": unmeasured})
    assert candidates.localization_rule(chk).max_scaled_error == 0.5
    absolute = check("int8_exact", {"tolerance": {**gate, "criterion": "absolute"}, "tensor_check": TensorCheck(
        passed=False, criterion="absolute", statistic="elemwise", scaled_error_quantile=0.01)})
    assert candidates.localization_rule(absolute).criterion == "absolute"
    assert candidates.localization_rule(absolute).max_scaled_error == 0.5
    feeds = [{"x": np.full((8, 1), i)} for i in range(4)]
    evidence = candidates.Evidence(feeds, [], np.zeros(32), "y")
    chk.result = chk.result.model_copy(update={"tensor_check": tensor.model_copy(update={"worst_image": 20})})
    assert candidates.worst_batch(chk, evidence)["x"][0, 0] == 2


def test_a_missing_output_is_the_candidates_error_and_another_shape_the_users():
    evidence = candidates.Evidence([], [{"y": np.zeros((2, 10))}], np.zeros(2), "y")
    chk = check("onnxrt_fp32")
    assert "y" in candidates._output_problem(chk, [{"z": np.zeros((2, 10))}], evidence)
    assert candidates._output_problem(chk, [{"y": np.zeros((2, 10))}], evidence) == ""
    with pytest.raises(InputError):
        candidates._output_problem(chk, [{"y": np.zeros((2, 5))}], evidence)


class FakeRunner:
    def __init__(self, outputs=None, error: Exception | None = None):
        self.outputs, self.error = outputs, error

    def __enter__(self):
        if self.error is not None:
            raise self.error
        return self

    def __exit__(self, *exc):
        return False

    def infer(self, feed):
        return {"y": self.outputs[: len(feed["x"])]}

    def batch_reason(self, size):
        return ""


@pytest.fixture
def judged(monkeypatch):
    """candidates._judge with the runner replaced: what each runner failure becomes."""
    def run(runner, reason=""):
        monkeypatch.setattr(candidates.isolate, "runner_for", lambda backend, ctx: runner)
        ref = np.eye(4)
        evidence = candidates.Evidence([{"x": np.zeros((4, 1))}], [{"y": ref}], np.arange(4), "y")
        chk = candidates.Check(backends.by_name("onnxrt_fp32"), "onnxrt_fp32", False, reason=reason)
        gate = candidates.gate_for(cfg(), "onnxrt_fp32", "fp32")
        return candidates._judge(chk, SimpleNamespace(cfg=cfg()), evidence, gate, {}), evidence
    return run


def test_a_candidate_that_cannot_run_is_skipped_errored_or_crashed_and_never_judged(judged):
    from pipeline.runtime.isolate import Crashed

    assert judged(FakeRunner(), reason="no GPU")[0] == CandidateResult(status=Status.SKIPPED, reason="no GPU")
    assert judged(FakeRunner(error=RuntimeError("bad graph")))[0].status == Status.ERROR
    assert judged(FakeRunner(error=Crashed("killed by SIGSEGV", "loading", "l.log", [])))[0].status == Status.CRASHED
    with pytest.raises(InputError):
        judged(FakeRunner(error=InputError("corrupt artifact")))
    result, evidence = judged(FakeRunner(outputs=np.eye(4)))
    assert result.status == Status.PASSED and "onnxrt_fp32" in evidence.outputs
    wrong, evidence = judged(FakeRunner(outputs=np.eye(4)[::-1] * 5))
    assert wrong.status == Status.FAILED and "onnxrt_fp32" in evidence.outputs


def test_sample_count():
    size = [3, 32, 32]
    assert candidates.sample_count(cfg(**{"verify.samples": 7}), size) == 7
    assert candidates.sample_count(cfg(**{"verify.max_samples": 50}), size) == 50
    huge = [3, 4096, 4096]
    assert candidates.sample_count(cfg(), huge) == max(1, candidates.IMAGE_BYTES_BUDGET // (4 * 3 * 4096 * 4096))
