"""deploy's decisions as pure functions (pipeline/core/deployment.py): which artifact is refused, the batch sizes a
Triton model takes and prefers, which Triton container runs an engine, the verdict over served checks; and the
configuration check (pipeline/runtime/serving/triton.py) catching every way a config.pbtxt can disagree with its
artifact. Milliseconds each, no model."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.core import deployment
from pipeline.core.deployment import TritonRelease
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


@pytest.mark.parametrize("batch_dim, profile_min, profile_max, fixed, served, want", [
    (None, None, None, False, 32, 32),  # dynamic ONNX: what the build profile serves and verify checked
    (None, 1, 16, False, 32, 16),  # an engine: its own profile, whatever the config says now
    (None, 4, 16, False, 32, 0),  # an engine whose profile starts at 4: Triton's batching would send it batch 1
    (1, None, None, False, 32, 1),  # a static batch of one still batches (of one)
    (3, None, None, False, 32, 0),  # a first dimension other than a batch: no batching
    (None, None, None, True, 32, 0),  # OpenVINO: the backend fixes the batch at max_batch_size (set_batch)
])
def test_max_batch_size(batch_dim, profile_min, profile_max, fixed, served, want):
    assert deployment.max_batch_size(batch_dim=batch_dim, profile_min=profile_min, profile_max=profile_max,
                                     served_max=served, batch_fixed_by_backend=fixed) == want


@given(st.one_of(st.none(), st.integers(1, 64)),
       st.one_of(st.none(), st.tuples(st.integers(1, 64), st.integers(1, 64))), st.booleans(), st.integers(1, 64))
def test_every_batch_a_model_is_written_for_is_one_its_artifact_takes(batch_dim, profile, fixed, served):
    """Whatever max_batch_size is written, the batches it lets a request carry lie within the artifact's own range
    (an engine's profile, a static first dimension), and batch 1 reaches a batching model."""
    low, high = sorted(profile) if profile and batch_dim is None else (None, None)
    largest = deployment.max_batch_size(batch_dim=batch_dim, profile_min=low, profile_max=high, served_max=served,
                                        batch_fixed_by_backend=fixed)
    smallest, biggest = deployment.served_batch_range(max_batch=largest, batch_dim=batch_dim, served_max=served,
                                                      profile_min=low, profile_max=high)
    assert smallest <= biggest
    if low is not None:
        assert low <= smallest and biggest <= high
    if batch_dim is not None and batch_dim != 1:
        assert largest == 0 and smallest == biggest == batch_dim
    if fixed and batch_dim is None:
        assert largest == 0  # the batch stays dynamic in dims: every batch from 1 to max works


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
    assert deployment.served_verdict([Status.PASSED, Status.PASSED]) == Status.PASSED
    assert deployment.served_verdict([Status.PASSED, Status.FAILED]) == Status.FAILED
    assert deployment.served_verdict([Status.PASSED, Status.INCONCLUSIVE]) == Status.INCONCLUSIVE
    assert deployment.served_verdict([]) == Status.FAILED
    assert deployment.served_verdict([Status.PASSED], refused=True) == Status.FAILED  # a swapped file, say
    assert deployment.serving_verdict([Status.PASSED, Status.PASSED]) == Status.PASSED
    assert deployment.serving_verdict([Status.PASSED, Status.FAILED]) == Status.FAILED
    assert deployment.serving_verdict([]) == Status.FAILED


@given(st.lists(st.sampled_from([Status.PASSED, Status.FAILED, Status.INCONCLUSIVE]), max_size=6), st.booleans())
def test_a_served_model_passes_only_when_every_arrangement_passed_and_nothing_was_wrong_before(statuses, refused):
    verdict = deployment.served_verdict(statuses, refused=refused)
    assert (verdict == Status.PASSED) == (bool(statuses) and not refused and set(statuses) == {Status.PASSED})


# --------------------------------------------------------------------------- the stock backends' limits


@pytest.mark.parametrize("candidate, triton, precision, device, words", [
    ("openvino_fp32", "openvino", "fp32", "cpu", "HINT_BF16"),
    ("openvino_int8", "openvino", "int8", "cpu", "HINT_BF16"),
    ("onnxrt_int8_cpu", "onnxruntime", "int8", "cpu", "WeightBiasQuantization"),
    ("x", None, "fp32", "cpu", "no Triton backend"),
])
def test_a_model_the_stock_backend_cannot_run_as_gated_is_refused(candidate, triton, precision, device, words):
    reason = deployment.stock_refusal(candidate, triton, precision, device)
    assert reason.startswith(f"{candidate}: ") and words in reason


@pytest.mark.parametrize("candidate, triton, precision, device", [
    ("openvino_bf16", "openvino", "bf16", "cpu"), ("onnxrt_fp32", "onnxruntime", "fp32", "cpu"),
    ("onnxrt_fp16_cpu", "onnxruntime", "fp16", "cpu"), ("onnxrt_cuda_fp16", "onnxruntime", "fp16", "cuda"),
    ("tensorrt_bf16", "tensorrt_plan", "bf16", "cuda"), ("tensorrt_int8", "tensorrt_plan", "int8", "cuda")])
def test_what_the_stock_backend_can_run_as_gated_is_not(candidate, triton, precision, device):
    assert deployment.stock_refusal(candidate, triton, precision, device) == ""


def test_the_bf16_ir_is_written_with_the_hint_and_nothing_else_is():
    assert deployment.stock_parameters("openvino", "bf16") == (("HINT_BF16", "YES"),)
    assert deployment.stock_parameters("onnxruntime", "fp32") == ()
    assert deployment.stock_parameters("tensorrt_plan", "bf16") == ()


def test_a_precision_other_than_the_gated_one_is_named():
    assert deployment.precision_mismatch("fp32", "bf16") == "the backend runs it in bf16, but verify gated it in fp32"
    assert deployment.precision_mismatch("bf16", "f32") != ""
    assert deployment.precision_mismatch("fp32", "f32") == deployment.precision_mismatch("bf16", "bf16") == ""
    assert deployment.precision_mismatch("fp16", None) == ""  # a backend that does not say


def test_every_gating_deployment_backend_has_a_deploy_format():
    """One table: a backend verify gates as a deployment names the Triton backend that runs it, so deploy (whose
    formats come from there) writes it; a new backend needs no second edit (tensorrt_bf16 was missing from deploy's
    own table)."""
    from pipeline import deploy
    from pipeline.runtime import backends

    gating = [b for b in backends.candidates() if b.gates and b.deploys]
    assert {"tensorrt_bf16", "tensorrt_fp16", "openvino_bf16", "onnxrt_fp32"} <= {b.name for b in gating}
    missing = [b.name for b in gating if b.triton not in deploy.FORMATS]
    assert missing == []
    assert not [b.name for b in backends.TABLE if not b.deploys and b.triton]  # an emulation is no deployment


# --------------------------------------------------------------------------- which verify.json deploy trusts


@given(st.sampled_from([*list(Status), None]), st.one_of(st.none(), st.integers(0, 5)), st.booleans())
def test_verify_finished_only_when_it_ended_ok_or_failed_its_gate_and_the_file_is_its(status, code, same):
    finished = deployment.verify_finished(status, code, "a" * 64, "a" * 64 if same else "b" * 64)
    assert finished == (same and (status == Status.OK or (status == Status.FAILED and code == 1)))


# --------------------------------------------------------------------------- which folder deploy may replace


def test_an_empty_folder_or_exactly_what_deploy_wrote_may_be_replaced():
    written = {"m/config.pbtxt": "1" * 64, "m/1/model.onnx": "2" * 64}
    assert deployment.replace_refusal({}, None) == ""
    assert deployment.replace_refusal({"m": "dir", "m/1": "dir", **written}, written) == ""
    assert deployment.replace_refusal({"m": "dir"}, written) == ""  # files deploy wrote, since removed


@pytest.mark.parametrize("on_disk, written, words", [
    ({"data.csv": "3" * 64}, None, "no pipeline.files.json"),
    ({"m": "dir", "m/pipeline.json": "4" * 64, "data.csv": "3" * 64}, None, "no pipeline.files.json"),
    ({"m": "dir", "m/config.pbtxt": "1" * 64, "data.csv": "3" * 64}, {"m/config.pbtxt": "1" * 64}, "data.csv"),
    ({"m": "dir", "m/config.pbtxt": "9" * 64}, {"m/config.pbtxt": "1" * 64}, "changed since deploy wrote them"),
    ({"m": "dir", "m/extra": "dir"}, {"m/config.pbtxt": "1" * 64}, "m/extra"),
    ({"m": "dir", "m/link": "other"}, {"m/config.pbtxt": "1" * 64}, "m/link"),
])
def test_a_folder_with_anything_deploy_did_not_write_is_refused(on_disk, written, words):
    reason = deployment.replace_refusal(on_disk, written)
    assert words in reason and "nothing there is removed" in reason or "name an empty or new folder" in reason


@given(st.dictionaries(st.sampled_from(["a", "b/c", "b/d", "e"]), st.sampled_from(["1" * 64, "2" * 64, "other"]),
                       max_size=4),
       st.dictionaries(st.sampled_from(["a", "b/c", "b/d"]), st.sampled_from(["1" * 64, "2" * 64]), max_size=3))
def test_replaced_only_when_every_entry_is_one_deploy_wrote_unchanged(on_disk, written):
    folders = {"b": "dir"} if any(k.startswith("b/") for k in on_disk) else {}
    allowed = deployment.replace_refusal({**folders, **on_disk}, written) == ""
    assert allowed == all(written.get(k) == v for k, v in on_disk.items())


# --------------------------------------------------------------------------- a config.pbtxt against its artifact


def _model(**changes):
    from pipeline.runtime.serving import triton

    signature = triton.Signature((triton.Tensor("input", "TYPE_FP32", (-1, 3, 16, 16)),),
                                 (triton.Tensor("logits", "TYPE_FP32", (-1, 10)),))
    fields = {"name": "m", "platform": "", "backend": "onnxruntime", "filename": "model.onnx", "signature": signature,
              "max_batch_size": 32, "preferred_batch_sizes": (4, 16), "max_queue_delay_us": 100, "gpu": False,
              "instances": 1}
    return triton.Model(**{**fields, **changes})


def test_the_written_config_parses_as_model_config_and_matches():
    pytest.importorskip("tritonclient.grpc", reason="tritonclient[grpc] (the deploy extra) is not installed")
    from pipeline.runtime.serving import triton

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
    from pipeline.runtime.serving import triton

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
    from pipeline.runtime.serving import triton

    with pytest.raises(InputError, match="not a valid Triton ModelConfig"):
        triton.parse('name: "m"\nmax_batch_sizes: 4\n', "config.pbtxt")


# --------------------------------------------------------------------------- perf_analyzer's stability rule


def test_three_windows_within_the_percentage_are_stable():
    from pipeline.runtime.serving.triton_serve import stable

    assert stable([(100, 1.0), (104, 1.02), (97, 0.99)], 0.1)
    assert not stable([(100, 1.0), (104, 1.02)], 0.1)  # fewer than three windows
    assert not stable([(100, 1.0), (130, 1.0), (100, 1.0)], 0.1)  # throughput moved
    assert not stable([(100, 1.0), (100, 1.5), (100, 1.0)], 0.1)  # latency moved
    assert stable([(10, 9.0), (100, 1.0), (101, 1.0), (99, 1.0)], 0.1)  # only the last three count


# --------------------------------------------------------------------------- which Triton releases load the files


def test_the_onnx_releases_follow_each_releases_onnx_runtime():
    """Triton 24.04 bundles ONNX Runtime 1.17.3 (opset 20, IR 9); 24.05 on, 1.18+ (opset 21, IR 10)."""
    assert deployment.onnxruntime_loads("1.17.3", 18, 8) is True
    assert deployment.onnxruntime_loads("1.17.3", 21, 10) is False
    assert deployment.onnxruntime_loads("1.18.0", 21, 10) is True
    assert deployment.onnxruntime_loads("1.13.1", 17, 8) is None  # older than the table
    assert deployment.onnxruntime_loads("1.24.4", 22, 10) is None  # newer than the table, beyond its last row
    assert deployment.onnxruntime_loads("1.24.4", 21, 10) is True  # newer ones load what 1.20 loads
    line = deployment.describe_onnx_releases(21, 10)
    assert line.startswith("ONNX opset 21, IR 10: Triton 24.05–26.07 (ONNX Runtime 1.18.0 and later)")
    assert line.endswith("; not 24.04")


def test_the_openvino_releases_follow_each_releases_openvino():
    assert deployment.openvino_loads("2023.3.0", [1, 8]) is True
    assert deployment.openvino_loads("2024.4.0", [15]) is False and deployment.openvino_loads("2024.5.0", [15])
    assert deployment.openvino_loads("2026.3.0", [16]) is None
    assert deployment.describe_openvino_releases([1, 8]).startswith("OpenVINO IR up to opset8: Triton 24.05–26.08")
    assert "not 24.05–24.11" in deployment.describe_openvino_releases([15])


@given(st.integers(7, 25), st.integers(3, 11))
def test_a_release_that_loads_a_graph_loads_every_older_one(opset, ir_version):
    """Monotone in the graph: what a release's ONNX Runtime loads, it loads at every lower opset and IR version."""
    for version in deployment.TRITON_ONNXRUNTIME.values():
        if deployment.onnxruntime_loads(version, opset, ir_version):
            assert deployment.onnxruntime_loads(version, max(7, opset - 1), max(3, ir_version - 1))


# --------------------------------------------------------------------------- the exact words (mutation run on main)


def test_verify_finished_for_a_verify_that_failed_its_gate_and_for_one_that_broke():
    assert deployment.verify_finished(Status.FAILED, 1, "a" * 64, "a" * 64)  # judged everything, then failed
    assert not deployment.verify_finished(Status.FAILED, 4, "a" * 64, "a" * 64)  # broke: partial
    assert not deployment.verify_finished(Status.FAILED, None, "a" * 64, "a" * 64)


def test_a_refusal_names_at_most_five_files_of_each_kind_and_says_when_there_are_more():
    written = {f"m/{i}": "1" * 64 for i in range(6)}
    five = {f"x{i}": "3" * 64 for i in range(5)}
    assert deployment.replace_refusal(five, written) == (
        "it holds files deploy did not write (x0, x1, x2, x3, x4); nothing there is removed: move them, or name "
        "another folder")
    assert deployment.replace_refusal({**five, "x5": "3" * 64}, written) == (
        "it holds files deploy did not write (x0, x1, x2, x3, x4, …); nothing there is removed: move them, or name "
        "another folder")
    changed = {f"m/{i}": "9" * 64 for i in range(5)}
    assert deployment.replace_refusal(changed, written) == (
        "it holds files changed since deploy wrote them (m/0, m/1, m/2, m/3, m/4); nothing there is removed: move "
        "them, or name another folder")
    assert deployment.replace_refusal({**changed, "m/5": "9" * 64, "x0": "3" * 64}, written) == (
        "it holds files deploy did not write (x0) and files changed since deploy wrote them (m/0, m/1, m/2, m/3, "
        "m/4, …); nothing there is removed: move them, or name another folder")


def test_every_folder_above_a_file_deploy_wrote_is_its_own():
    written = {"a/b/c/model.onnx": "1" * 64}
    on_disk = {"a": "dir", "a/b": "dir", "a/b/c": "dir", **written}
    assert deployment.replace_refusal(on_disk, written) == ""
    assert "(a/x)" in deployment.replace_refusal({**on_disk, "a/x": "dir"}, written)


def test_batching_triton_s_way_up_to_one_is_a_batch_of_one():
    assert deployment.served_batch_range(max_batch=1, batch_dim=None, served_max=8) == (1, 1)
    assert deployment.max_batch_size(batch_dim=None, profile_max=None, served_max=32) == 32  # the backend batches
    assert deployment.max_batch_size(batch_dim=None, profile_max=8, served_max=32, profile_min=2) == 0
    assert deployment.max_batch_size(batch_dim=None, profile_max=8, served_max=32, profile_min=1) == 8


def test_an_fp16_graph_is_served_in_f16_or_named():
    assert deployment.precision_mismatch("fp16", "f16") == ""
    assert deployment.precision_mismatch("fp16", "f32") == "the backend runs it in f32, but verify gated it in fp16"


def test_the_last_row_of_a_version_table_says_no_to_what_it_cannot_load():
    assert deployment.onnxruntime_loads("1.20.1", 22, 10) is False  # the table's last row: it knows
    assert deployment.onnxruntime_loads("1.21.0", 22, 10) is None  # after it: unknown
    assert deployment.openvino_loads("2024.5.0", [16]) is False
    assert deployment.openvino_loads("2025.0.0", [16]) is None
    assert deployment.openvino_loads("2022.3.0", []) is True  # no operation named: any release reads it


@pytest.mark.parametrize("args, line", [
    ((17, 8), "ONNX opset 17, IR 8: Triton 24.04–26.07 (ONNX Runtime 1.17.3 and later)"),
    ((21, 10), "ONNX opset 21, IR 10: Triton 24.05–26.07 (ONNX Runtime 1.18.0 and later); not 24.04"),
    ((22, 11), "ONNX opset 22, IR 11: no Triton release in the table; not 24.04–25.02; unknown for 25.03–26.07"),
])
def test_the_onnx_release_line_in_full(args, line):
    assert deployment.describe_onnx_releases(*args) == line


@pytest.mark.parametrize("opsets, line", [
    ([], "OpenVINO IR up to opset1: Triton 24.05–26.08 (OpenVINO 2023.3.0 and later)"),
    ([14], "OpenVINO IR up to opset14: Triton 24.06–26.08 (OpenVINO 2024.0.0 and later); not 24.05"),
    ([16], "OpenVINO IR up to opset16: no Triton release in the table; not 24.05–25.01; unknown for 25.02–26.08"),
])
def test_the_openvino_release_line_in_full(opsets, line):
    assert deployment.describe_openvino_releases(opsets) == line


def test_a_span_of_two_releases_names_both_ends():
    assert deployment._span(["24.06", "24.05"]) == "24.05–24.06"
    assert deployment._span(["24.05"]) == "24.05"
