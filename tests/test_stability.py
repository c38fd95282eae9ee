"""Issue 48: the calibration stability certificate. Its decisions on plain data (the draws, the spreads, the verdict
and the policy verify.int8.min_pass_share: properties), and verify running it on a trained tiny model's INT8 graph:
verify.json, verify.md and report.html show the draws' table and the plot, and a pass the policy finds lucky fails
the gate (exit 1)."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conftest import TINY, cli, copy_run, trained_and_exported
from pipeline.precision import stability

statuses_st = st.lists(st.sampled_from(["passed", "failed", "inconclusive"]), min_size=1, max_size=20)
share_st = st.none() | st.floats(0, 1)


@given(st.integers(1, 400), st.integers(1, 12), st.integers(1, 40), st.sampled_from(["disjoint", "bootstrap"]),
       st.integers(0, 100))
def test_draws_start_with_the_deployed_one_and_are_disjoint_where_the_split_holds_them(n, k, size, sampling, seed):
    deployed = tuple(range(0, n, max(1, n // min(n, size))))[:size]
    draws = stability.draw_indices(n, deployed, k, size, sampling, seed)
    assert len(draws.indices) == k and draws.indices[0] == deployed
    assert draws == stability.draw_indices(n, deployed, k, size, sampling, seed)
    assert all(0 <= i < n for d in draws.indices for i in d)
    assert all(len(d) == size for d in draws.indices[1:])
    fits = n - len(set(deployed)) >= (k - 1) * size
    if sampling == "disjoint" and fits:
        assert draws.sampling == "disjoint"
        seen = [i for d in draws.indices for i in set(d)]
        assert len(seen) == len(set(seen))  # no image in two draws
    else:
        assert draws.sampling == "bootstrap"
        assert bool(draws.note) == (sampling == "disjoint")  # a switch is said, never silent


def test_draws_refuse_impossible_sizes():
    for args in ((0, (), 3, 4), (10, (), 0, 4), (10, (), 3, 0)):
        with pytest.raises(ValueError):
            stability.draw_indices(*args, "disjoint", 0)


@given(st.lists(st.floats(-1e6, 1e6) | st.just(math.nan), min_size=0, max_size=20))
def test_spread_is_over_the_finite_values(values):
    spread = stability.spread_of(values)
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        assert spread is None
        return
    assert spread.low == min(finite) and spread.high == max(finite) and spread.low <= spread.median <= spread.high
    assert spread.width >= 0 and (spread.relative == 0) == (spread.width == 0)


@given(statuses_st, share_st, st.sampled_from(["pass", "fail"]))
def test_certificate_counts_the_passing_draws_and_only_the_policy_calls_a_pass_lucky(statuses, share, inconclusive):
    cert = stability.certify(statuses, share, inconclusive)
    passes = [s == "passed" or (s == "inconclusive" and inconclusive == "pass") for s in statuses]
    assert cert.passing == sum(passes) and cert.draws == len(statuses)
    assert cert.share == pytest.approx(sum(passes) / len(statuses))
    assert cert.deployed_passed == passes[0]
    assert cert.status in {"certified", "unstable", "lucky", "failed"}
    if not passes[0]:
        assert cert.status == stability.FAILED and not cert.fails_gate
    elif share is not None and cert.share < share:
        assert cert.status == stability.LUCKY and cert.fails_gate and "min_pass_share" in cert.line()
    elif all(passes):
        assert cert.status == stability.STABLE
    else:
        assert cert.status == stability.UNSTABLE and not cert.fails_gate
    assert f"{cert.passing} of {cert.draws}" in cert.line() and "draw 0 deployed" in cert.line()


@given(statuses_st, st.floats(0, 1), st.floats(0, 1))
def test_a_stricter_policy_never_turns_a_failure_into_a_pass(statuses, a, b):
    low, high = sorted((a, b))
    assert stability.certify(statuses, high).fails_gate >= stability.certify(statuses, low).fails_gate


def test_scale_spreads_name_each_quantizer():
    spreads = stability.scale_spreads([{"a": 1.0, "b": 2.0}, {"a": 1.5, "b": 2.0}, {"a": 0.5}])
    assert spreads["a"].width == 1.0 and spreads["a"].relative == 1.0
    assert spreads["b"].width == 0 and spreads["b"].relative == 0


def test_stability_settings_out_of_range_are_exit_2(tmp_path, capsys):
    for bad in ("export.int8.stability.draws=1", "export.int8.stability.draws=65", "verify.int8.min_pass_share=1.5",
                "export.int8.stability.draw_size=0"):
        assert cli("verify", "--run-dir", tmp_path / "run", bad) == 2, bad
        assert "Traceback" not in capsys.readouterr().err


# --------------------------------------------------------------------------- verify runs it

TRAINED = [*TINY, "data.samples_per_class=30", "train.epochs=4", "export.int8.calibration_samples=16",
           "export.int8.enabled=true", "verify.samples=60", "verify.batch_size=30"]
CERTIFY = ["export.int8.stability.in_verify=true", "export.int8.stability.draws=3"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    return trained_and_exported(tmp_path_factory, TRAINED)


def test_verify_certifies_the_int8_graph_and_reports_it(trained, tmp_path):
    run = copy_run(trained("tiny_cnn"), tmp_path)
    assert cli("build", "--run-dir", run) == 0
    assert cli("verify", "--run-dir", run, *CERTIFY) in (0, 1)
    report = json.loads((run / "verify.json").read_text())
    s = report["stability"]
    assert [d["draw"] for d in s["draws"]] == [0, 1, 2] and s["draws"][0]["deployed"]
    assert s["sampling"] == "disjoint" and s["draw_size"] == 16
    cert = s["certificate"]
    assert cert["draws"] == 3 and cert["passing"] == sum(d["status"] == "passed" for d in s["draws"])
    assert s["scale_spread"]["activation"]["quantizers"] > 0
    assert s["scale_spread"]["weight"]["max_relative"] == 0  # weights do not depend on the calibration images
    exact = next(c for c in report["candidates"] if c["name"] == "int8_exact")
    # draw 0 is the deployed graph itself: its numbers are the gate's own
    assert s["draws"][0]["scaled_error"] == pytest.approx(exact["tensor_check"]["scaled_error_quantile"])
    md = (run / "verify.md").read_text()
    assert "Calibration stability certificate (INT8)" in md and "![calibration stability](stability.png)" in md
    assert (run / "stability.png").stat().st_size > 1000
    assert cli("report", "--run-dir", run) == 0
    assert "Calibration stability: the gate" in (run / "report.html").read_text()


def test_a_lucky_pass_fails_the_gate_under_the_policy(trained, tmp_path, monkeypatch, capsys):
    """Every draw but the deployed one fails (a planted certificate): min_pass_share 0.5 fails the INT8 candidates."""
    from pipeline.evaluation import certificate

    run = copy_run(trained("tiny_cnn"), tmp_path)
    real = certificate.payload

    def planted(draws, rows, *args):
        rows = [r.model_copy(update={"status": "passed" if r.draw == 0 else "failed"}) for r in rows]
        return real(draws, rows, *args)

    monkeypatch.setattr(certificate, "payload", planted)
    gate = ["verify.gate=[int8_exact]"]
    assert cli("verify", "--run-dir", run, *CERTIFY, *gate) == 0  # reported only
    assert cli("verify", "--run-dir", run, *CERTIFY, *gate, "verify.int8.min_pass_share=0.5") == 1
    report = json.loads((run / "verify.json").read_text())
    exact = next(c for c in report["candidates"] if c["name"] == "int8_exact")
    assert exact["status"] == "failed" and "lucky" in exact["reason"]
    assert report["stability"]["certificate"]["status"] == "lucky"
