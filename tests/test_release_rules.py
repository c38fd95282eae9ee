"""deploy's refusals and batch rules in pipeline/core/deployment.py, said exactly (issue 46: the mutation command now
covers this module; these tests kill what the first run left). Pure, milliseconds."""

from __future__ import annotations

import pytest

from pipeline.core import deployment
from pipeline.core.deployment import TritonRelease

TABLE = (TritonRelease("26.02", "10.8.0.43", "12.8", "570"), TritonRelease("26.01", "10.8.0.40", "12.8", "570"),
         TritonRelease("25.12", "10.7.0", "12.6", "560"))


@pytest.mark.parametrize(("version", "key"), [
    ("10.8.0.43", (10, 8, 0)), ("10.8", (10, 8, 0)), ("10", (10, 0, 0)), ("10.x.0", (10, 0, 0)), ("10..8", (10, 0, 8)),
    ("10.8rc1.2", (10, 81, 2)),
])
def test_a_release_key_is_major_minor_patch_padded_with_zeros(version, key):
    assert deployment._release_key(version) == key


def test_releases_are_matched_on_major_minor_patch_from_the_given_table():
    assert [r.release for r in deployment.releases_for("10.8", TABLE)] == ["26.02", "26.01"]
    assert deployment.describe_releases("10.8.0", TABLE) == \
        ("TensorRT 10.8.0: Triton release 26.02, 26.01 (serve from nvcr.io/nvidia/tritonserver:26.02-py3 after "
         "checking its TensorRT there: the table is the -trtllm-python-py3 image's)")
    assert deployment.describe_releases("10.7", TABLE) == \
        ("TensorRT 10.7: Triton release 25.12 (serve from nvcr.io/nvidia/tritonserver:25.12-py3 after checking its "
         "TensorRT there: the table is the -trtllm-python-py3 image's)")
    assert deployment.describe_releases("9.9", TABLE) == (
        "TensorRT 9.9: no Triton container release in the compatibility table ships it; serve its engines from a "
        "container with exactly this TensorRT, or rebuild them inside one")
    assert deployment.describe_releases(None, TABLE) == \
        "no TensorRT here: engines are not built, so no Triton release is needed for them"


def test_a_release_refusal_says_what_fits_from_the_given_table():
    assert deployment.release_refusal("10.8.0", "26.01", TABLE) == ""
    assert deployment.release_refusal("10.8.0", "25.12", TABLE) == (
        "the engines were built with TensorRT 10.8.0, but Triton 25.12 ships TensorRT 10.7.0: the engine would not "
        "load there; use a release with TensorRT 10.8.0 (26.02, 26.01) or rebuild the engines with that release's "
        "TensorRT")
    assert deployment.release_refusal("9.9", "30.01", TABLE) == (
        "deploy.triton_release 30.01 is not in the compatibility table (its TensorRT is unknown); the engines were "
        "built with TensorRT 9.9, which matching releases ship: none in the table")
    assert deployment.release_refusal(None, "26.01", TABLE) == deployment.release_refusal("10.8", None, TABLE) == ""


def test_an_inconclusive_refusal_says_what_to_do():
    assert deployment.refusal("onnxrt_fp16_cpu", "inconclusive", "fail") == (
        "onnxrt_fp16_cpu: inconclusive, which verify.inconclusive=fail does not count as passed; verify on more images")


def test_a_batch_measured_twice_keeps_its_best_and_a_tie_goes_to_the_smaller_batch():
    assert deployment.preferred_batch_sizes([(4, 100.0), (4, 50.0), (1, 60.0)], 8, 0.9) == (4,)
    assert deployment.preferred_batch_sizes([(8, 100.0), (4, 100.0), (1, 10.0)], 8, 0.9) == (4,)
    assert deployment.preferred_batch_sizes([(4, 100.0), (8, 100.0), (1, 10.0)], 8, 0.9) == (4,)
