"""deploy's decisions as pure functions (pipeline/core/deployment.py): which artifact is refused, the batch sizes a
Triton model takes and prefers, which Triton container runs an engine, the verdict over served checks; and the
configuration check (pipeline/runtime/triton.py) catching every way a config.pbtxt can disagree with its artifact.
Milliseconds each, no model."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.core import deployment
from pipeline.core.deployment import ServedMatch, TritonRelease
from pipeline.core.status import Status

# --------------------------------------------------------------------------- refusal


@pytest.mark.parametrize("status, policy", [(Status.PASSED, "pass"), (Status.PASSED, "fail"),
                                            (Status.INCONCLUSIVE, "pass")])
def test_a_verdict_that_counts_as_passed_deploys(status, policy):
    assert deployment.refusal("onnxrt_fp32", status, policy) == ""


@pytest.mark.parametrize("status, policy, words", [
    (None, "pass", "no verdict"), (Status.NOT_VERIFIED, "pass", "changed since verify"),
    (Status.FAILED, "pass", "failed the precision gate"), (Status.INCONCLUSIVE, "fail", "verify.inconclusive=fail"),
    (Status.SKIPPED, "pass", "skipped"), (Status.CRASHED, "pass", "crashed"), (Status.ERROR, "pass", "error")])
def test_every_other_verdict_is_refused_with_its_reason(status, policy, words):
    reason = deployment.refusal("openvino_int8", status, policy)
    assert reason.startswith("openvino_int8: ") and words in reason


@given(st.sampled_from(list(Status)), st.sampled_from(["pass", "fail"]))
def test_refused_exactly_when_the_verdict_does_not_count_as_passed(status, policy):
    from pipeline.core import verdicts

    assert (deployment.refusal("c", status, policy) == "") == verdicts.counts_as_passed(status, policy)


# --------------------------------------------------------------------------- max_batch_size


@pytest.mark.parametrize("batch_dim, profile_max, served, want", [
    (None, None, 32, 32),  # dynamic ONNX / IR: what the build profile serves and verify checked
    (None, 16, 32, 16),  # an engine: its own profile, whatever the config says now
    (1, None, 32, 1),  # a static batch of one still batches (of one)
    (3, None, 32, 0),  # a first dimension other than a batch: no batching
])
def test_max_batch_size(batch_dim, profile_max, served, want):
    assert deployment.max_batch_size(batch_dim=batch_dim, profile_max=profile_max, served_max=served) == want


# --------------------------------------------------------------------------- preferred batch sizes

curves = st.lists(st.tuples(st.integers(1, 512), st.floats(0, 1e6, allow_nan=False)), max_size=12)


def test_preferred_sizes_are_the_knee_and_the_best():
    curve = [(1, 100.0), (4, 350.0), (8, 380.0), (16, 400.0), (32, 390.0)]
    assert deployment.preferred_batch_sizes(curve, 32, 0.85) == (4, 16)  # 350 >= 0.85 * 400
    assert deployment.preferred_batch_sizes(curve, 32, 0.9) == (8, 16)  # 350 < 360 <= 380
    assert deployment.preferred_batch_sizes(curve, 8, 0.9) == (4, 8)  # past max_batch_size does not count
    assert deployment.preferred_batch_sizes([(4, 10.0), (4, 30.0), (8, 31.0)], 8, 0.9) == (4, 8)  # a batch's best
    assert deployment.preferred_batch_sizes(curve, 32, 1.0) == (16,)
    assert deployment.preferred_batch_sizes([], 32, 0.9) == ()


@given(curves, st.integers(1, 512), st.floats(0.01, 1.0))
def test_preferred_sizes_are_measured_within_the_limit_and_include_the_best(curve, limit, fraction):
    chosen = deployment.preferred_batch_sizes(curve, limit, fraction)
    best_of: dict[int, float] = {}
    for b, s in curve:
        if b <= limit and s > 0:
            best_of[b] = max(s, best_of.get(b, 0.0))
    measured = list(best_of.items())
    assert set(chosen) <= {b for b, _ in measured}
    assert list(chosen) == sorted(set(chosen)) and len(chosen) <= 2
    if measured:
        best = max(s for _, s in measured)
        assert any(s == best for b, s in measured if b in chosen)
        assert all(s >= fraction * best for b, s in measured if b == chosen[0])
    else:
        assert chosen == ()


@given(curves, st.integers(1, 512), st.floats(0.01, 0.5), st.floats(0.5, 1.0))
def test_a_lower_fraction_never_prefers_a_larger_knee(curve, limit, low, high):
    loose, tight = (deployment.preferred_batch_sizes(curve, limit, f) for f in (low, high))
    if loose:
        assert loose[0] <= tight[0]


# --------------------------------------------------------------------------- the Triton release of an engine


def test_the_table_is_as_published_and_newest_first():
    releases = [r.release for r in deployment.TRITON_RELEASES]
    assert releases == sorted(releases, reverse=True) and len(set(releases)) == len(releases)
    by_release = {r.release: r.tensorrt for r in deployment.TRITON_RELEASES}
    assert by_release["25.01"] == "10.8.0.43" and by_release["24.10"] == "10.4.0"  # spot checks against the source
    assert "compatibility" in deployment.RELEASES_SOURCE and "0f963c9a8c69" in deployment.RELEASES_SOURCE


def test_the_issue_case_is_refused():
    """triton-inference-server/server#7613: an engine of TensorRT 10.4 in a container of another TensorRT."""
    reason = deployment.release_refusal("10.4.0.26", "25.01")
    assert "TensorRT 10.4.0.26" in reason and "25.01 ships TensorRT 10.8.0.43" in reason and "24.10" in reason
    assert deployment.release_refusal("10.4.0.26", "24.09") == ""


@given(st.sampled_from(deployment.TRITON_RELEASES), st.sampled_from(deployment.TRITON_RELEASES))
def test_an_engine_fits_exactly_the_releases_of_its_tensorrt(engine: TritonRelease, target: TritonRelease):
    same = deployment._release_key(engine.tensorrt) == deployment._release_key(target.tensorrt)
    assert (deployment.release_refusal(engine.tensorrt, target.release) == "") == same
    assert target in deployment.releases_for(target.tensorrt)


def test_nothing_to_check_and_unknown_releases():
    assert deployment.release_refusal(None, "25.01") == ""  # no engine deployed
    assert deployment.release_refusal("10.8.0.43", None) == ""  # no target configured: said, not refused
    assert "not in the compatibility table" in deployment.release_refusal("10.8.0.43", "19.01")
    assert "none in the table" in deployment.release_refusal("9.9.9", "25.01")
    assert deployment.describe_releases("10.8.0.43").startswith("TensorRT 10.8.0.43: Triton release 25.02, 25.01")
    assert "no Triton container release" in deployment.describe_releases("7.0.0")
    assert "no TensorRT here" in deployment.describe_releases(None)


# --------------------------------------------------------------------------- the served verdict


def test_served_checks_fold_like_verify_and_none_is_not_a_pass():
    ok, off = ServedMatch(8, 8, 0.0, Status.PASSED), ServedMatch(8, 0, 3.0, Status.FAILED)
    assert deployment.serving_verdict([ok, ok]) == Status.PASSED and ok.passed
    assert deployment.serving_verdict([ok, off]) == Status.FAILED and not off.passed
    assert deployment.serving_verdict([ok, ServedMatch(8, 7, 1e-6, Status.INCONCLUSIVE)]) == Status.INCONCLUSIVE
    assert deployment.serving_verdict([]) == Status.FAILED


# --------------------------------------------------------------------------- a config.pbtxt against its artifact


def _model(**changes):
    from pipeline.runtime import triton

    signature = triton.Signature((triton.Tensor("input", "TYPE_FP32", (-1, 3, 16, 16)),),
                                 (triton.Tensor("logits", "TYPE_FP32", (-1, 10)),))
    fields = {"name": "m", "platform": "", "backend": "onnxruntime", "filename": "model.onnx", "signature": signature,
              "max_batch_size": 32, "preferred_batch_sizes": (4, 16), "max_queue_delay_us": 100, "gpu": False,
              "instances": 1}
    return triton.Model(**{**fields, **changes})


def test_the_written_config_parses_as_model_config_and_matches():
    pytest.importorskip("tritonclient.grpc", reason="tritonclient[grpc] (the deploy extra) is not installed")
    from pipeline.runtime import triton

    model = _model()
    text = triton.to_text(triton.build_config(model))
    config = triton.parse(text, "config.pbtxt")
    assert type(config).__name__ == "ModelConfig" and triton.mismatches(config, model) == []
    assert list(config.input[0].dims) == [3, 16, 16] and config.dynamic_batching.preferred_batch_size == [4, 16]
    assert config.instance_group[0].kind == triton.model_config_pb2().ModelInstanceGroup.Kind.KIND_CPU


@pytest.mark.parametrize("edit, words", [
    ("max_batch_size: 32", "max_batch_size 8"), ("dims: 10", "outputs"), ('name: "input"', "inputs"),
    ("data_type: TYPE_FP32", "inputs"), ("preferred_batch_size: 16", "preferred_batch_size")])
def test_every_disagreement_with_the_artifact_is_named(edit, words):
    pytest.importorskip("tritonclient.grpc", reason="tritonclient[grpc] (the deploy extra) is not installed")
    from pipeline.runtime import triton

    model = _model()
    text = triton.to_text(triton.build_config(model))
    replacement = {"max_batch_size: 32": "max_batch_size: 8", "dims: 10": "dims: 11", 'name: "input"': 'name: "x"',
                   "data_type: TYPE_FP32": "data_type: TYPE_FP16",
                   "preferred_batch_size: 16": "preferred_batch_size: 8"}[edit]
    problems = triton.mismatches(triton.parse(text.replace(edit, replacement, 1), "c"), model)
    assert any(words in p for p in problems), problems


def test_a_config_that_is_not_model_config_is_one_line():
    pytest.importorskip("tritonclient.grpc", reason="tritonclient[grpc] (the deploy extra) is not installed")
    from pipeline.core.errors import InputError
    from pipeline.runtime import triton

    with pytest.raises(InputError, match="not a valid Triton ModelConfig"):
        triton.parse('name: "m"\nmax_batch_sizes: 4\n', "config.pbtxt")


# --------------------------------------------------------------------------- perf_analyzer's stability rule


def test_three_windows_within_the_percentage_are_stable():
    from pipeline.runtime.triton_serve import stable

    assert stable([(100, 1.0), (104, 1.02), (97, 0.99)], 0.1)
    assert not stable([(100, 1.0), (104, 1.02)], 0.1)  # fewer than three windows
    assert not stable([(100, 1.0), (130, 1.0), (100, 1.0)], 0.1)  # throughput moved
    assert not stable([(100, 1.0), (100, 1.5), (100, 1.0)], 0.1)  # latency moved
    assert stable([(10, 9.0), (100, 1.0), (101, 1.0), (99, 1.0)], 0.1)  # only the last three count
