"""verify.json's candidate rows as types (:mod:`pipeline.core.verify_rows`): made by verify from its checks, written
by one serialiser in the shape earlier releases wrote, read back once (the AST check that nobody reads them by key
is tests/test_benchmark_rows.py's)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from conftest import ROOT
from pipeline.core import verify_rows
from pipeline.core.check_results import CandidateResult, TensorCheck
from pipeline.core.checks import Check
from pipeline.core.errors import InputError
from pipeline.core.status import Status

RELEASE = ROOT / "tests" / "data" / "release_0.1.0" / "run" / "verify.json"


def test_release_0_1_0_candidates_read_and_write_back_in_the_same_shape():
    payload = json.loads(RELEASE.read_text())
    rows = verify_rows.read(RELEASE).candidates
    assert len(rows) == len(payload["candidates"]) > 0
    for old, row in zip(payload["candidates"], rows, strict=True):
        written = json.loads(json.dumps(row.to_json()))
        assert written == old and list(written) == list(old)


def _check(status: Status, **result) -> Check:
    backend = SimpleNamespace(verify_name="onnxrt_fp32", precision="fp32", artifact="model.onnx")
    return Check(backend, "ONNX Runtime FP32", required=False, result=CandidateResult(status=status, **result))


def test_verify_writes_a_row_with_the_keys_it_always_wrote():
    """The optional facts only where the check has them; a verdict's sha256 only where a verdict was reached;
    NaN written as a string (JSON has none)."""
    sha = "a" * 64
    tensor = TensorCheck(passed=True, criterion="scaled", statistic="q1", max_abs_error=float("nan"))
    passed = verify_rows.CandidateRow.of(_check(Status.PASSED, tensor_check=tensor, workaround="set KMP_AFFINITY"),
                                         {"model.onnx": sha}).to_json()
    assert list(passed) == ["name", "label", "precision", "artifact", "artifact_sha256", "required", "status",
                            "reason", "hint", "tolerance", "tensor_check", "task_check", "after_fallback", "gates",
                            "workaround"]
    assert passed["artifact_sha256"] == sha and passed["tensor_check"] == {
        "passed": True, "criterion": "scaled", "statistic": "q1", "max_abs_error": "nan"}
    skipped = verify_rows.CandidateRow.of(_check(Status.SKIPPED, reason="no GPU"), {"model.onnx": sha}).to_json()
    assert skipped["artifact_sha256"] is None and skipped["reason"] == "no GPU" and "workaround" not in skipped


@pytest.mark.parametrize("damage", [{"status": 3}, {"name": None}, {"artifact_sha256": "not a digest"},
                                    {"required": "yes"}, {"log_tail": "one string"}])
def test_a_damaged_candidate_is_one_input_error(tmp_path, damage):
    payload = json.loads(RELEASE.read_text())
    payload["candidates"][0] = {**payload["candidates"][0], **damage}
    path = tmp_path / "verify.json"
    path.write_text(json.dumps(payload))
    with pytest.raises(InputError, match="verify report"):
        verify_rows.read(path)
