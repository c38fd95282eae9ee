"""The verdict over candidates, what inconclusive counts as, and the exit code: pipeline/core/verdicts.py.

Plain rows stand for verify's candidates, so every rule is checked in milliseconds; the properties are written
against oracles that say the rule another way (failed beats inconclusive beats passed in every fold; a required
candidate that did not run always fails; an error never passes; the policy decides inconclusive and nothing else).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.core import errors, verdicts
from pipeline.core.status import Status
from pipeline.core.verdicts import Outcome

FAST = settings(max_examples=150, deadline=None)
STATUSES = [Status.PASSED, Status.FAILED, Status.INCONCLUSIVE, Status.SKIPPED, Status.ERROR, Status.CRASHED]
POLICIES = ["pass", "fail"]


@dataclass(frozen=True)
class Row:
    name: str
    status: str
    gates: bool = True
    required: bool = False
    after_fallback: bool = False


rows = st.lists(st.builds(Row, name=st.text("abcdef", min_size=1, max_size=3), status=st.sampled_from(STATUSES),
                          gates=st.booleans(), required=st.booleans(), after_fallback=st.booleans()), max_size=8)


# --------------------------------------------------------------------------- folds and the policy


@FAST
@given(st.lists(st.sampled_from(STATUSES)))
def test_fold_failed_beats_inconclusive_beats_passed(statuses):
    folded = verdicts.fold(statuses)
    if Status.FAILED in statuses:
        assert folded == Status.FAILED
    elif Status.INCONCLUSIVE in statuses:
        assert folded == Status.INCONCLUSIVE
    else:
        assert folded == Status.PASSED


def test_fold_in_any_order():
    assert verdicts.fold([Status.FAILED, Status.INCONCLUSIVE]) == Status.FAILED
    assert verdicts.fold([Status.INCONCLUSIVE, Status.FAILED, Status.PASSED]) == Status.FAILED
    assert verdicts.fold([Status.PASSED, Status.INCONCLUSIVE]) == Status.INCONCLUSIVE
    assert verdicts.fold([Status.INCONCLUSIVE, Status.PASSED]) == Status.INCONCLUSIVE
    assert verdicts.fold(["skipped", "error"]) == Status.PASSED
    assert verdicts.fold([]) == Status.PASSED
    assert verdicts.fold(["failed"]) is Status.FAILED  # plain strings, as read from a file


@pytest.mark.parametrize("status, policy, counts, undecided", [
    (Status.PASSED, "pass", True, False), (Status.PASSED, "fail", True, False),
    (Status.INCONCLUSIVE, "pass", True, True), (Status.INCONCLUSIVE, "fail", False, False),
    (Status.FAILED, "pass", False, False), (Status.FAILED, "fail", False, False),
    (Status.SKIPPED, "pass", False, False), (Status.ERROR, "pass", False, False),
    (Status.NOT_VERIFIED, "pass", False, False), ("", "pass", False, False)])
def test_what_a_verdict_counts_as(status, policy, counts, undecided):
    assert verdicts.counts_as_passed(status, policy) is counts
    assert verdicts.passed_undecided(status, policy) is undecided


def test_judged_is_the_three_verdicts():
    assert verdicts.JUDGED == {Status.PASSED, Status.FAILED, Status.INCONCLUSIVE}


# --------------------------------------------------------------------------- the verdict over candidates


def oracle_passed(checks: list[Row], policy: str) -> bool:
    for c in checks:
        if c.required and c.status == Status.SKIPPED and not c.after_fallback:
            return False
        if not c.gates:
            continue
        if c.status in (Status.FAILED, Status.ERROR, Status.CRASHED):
            return False
        if c.status == Status.INCONCLUSIVE and policy == "fail":
            return False
    return True


@FAST
@given(rows, st.sampled_from(POLICIES))
def test_the_verdict_matches_the_oracle(checks, policy):
    v = verdicts.verdict(checks, policy)
    gating = [c for c in checks if c.gates]
    assert v.passed == oracle_passed(checks, policy)
    assert v.ran == sum(1 for c in gating if c.status in (Status.PASSED, Status.FAILED, Status.INCONCLUSIVE))
    assert v.failed == [c for c in gating if c.status == Status.FAILED]
    assert v.errors == [c for c in gating if c.status in (Status.ERROR, Status.CRASHED)]
    assert v.inconclusive == [c for c in gating if c.status == Status.INCONCLUSIVE]
    assert v.missing_required == [c for c in checks if c.required and c.status == Status.SKIPPED
                                  and not c.after_fallback]
    assert v.deployable == [c.name for c in gating if c.status == Status.PASSED
                            or (c.status == Status.INCONCLUSIVE and policy == "pass")]
    assert v.undecided == [c.name for c in gating if c.status == Status.INCONCLUSIVE and policy == "pass"]
    assert v.reported_only == [c.name for c in checks if not c.gates]


@FAST
@given(rows, st.sampled_from(POLICIES), st.sampled_from(STATUSES))
def test_a_worse_candidate_never_turns_a_failed_verdict_into_a_pass(checks, policy, extra):
    before = verdicts.verdict(checks, policy).passed
    after = verdicts.verdict([*checks, Row("z", extra)], policy).passed
    if not before:
        assert not after
    if after:
        assert before


@FAST
@given(rows)
def test_the_fail_policy_is_never_more_lenient(checks):
    assert not (verdicts.verdict(checks, "fail").passed and not verdicts.verdict(checks, "pass").passed)


def test_the_verdict_cases_by_name():
    ok = Row("a", Status.PASSED)
    assert verdicts.verdict([ok]).passed and verdicts.verdict([ok]).ran == 1
    assert not verdicts.verdict([ok, Row("b", Status.ERROR)]).passed
    assert not verdicts.verdict([ok, Row("b", Status.CRASHED)]).passed
    assert not verdicts.verdict([ok, Row("b", Status.SKIPPED, required=True)]).passed
    assert not verdicts.verdict([ok, Row("b", Status.SKIPPED, gates=False, required=True)]).passed
    assert verdicts.verdict([ok, Row("b", Status.SKIPPED, required=True, after_fallback=True)]).passed
    assert verdicts.verdict([ok, Row("b", Status.SKIPPED)]).passed
    assert verdicts.verdict([ok, Row("b", Status.FAILED, gates=False)]).passed
    assert verdicts.verdict([ok, Row("b", Status.ERROR, gates=False)]).passed
    assert verdicts.verdict([Row("b", Status.INCONCLUSIVE)]).passed
    assert not verdicts.verdict([Row("b", Status.INCONCLUSIVE)], "fail").passed
    assert verdicts.verdict([]).passed and verdicts.verdict([]).ran == 0
    assert verdicts.Verdict(passed=False).failed == []


# --------------------------------------------------------------------------- the outcome and its exit code


def oracle_exit(checks: list[Row], policy: str) -> int:
    gating = [c for c in checks if c.gates]
    if any(c.required and c.status == Status.SKIPPED and not c.after_fallback for c in checks):
        return 3
    if any(c.status == Status.FAILED for c in gating):
        return 1
    if any(c.status in (Status.ERROR, Status.CRASHED) for c in gating):
        return 4
    if policy == "fail" and any(c.status == Status.INCONCLUSIVE for c in gating):
        return 5
    return 0


@FAST
@given(rows, st.sampled_from(POLICIES))
def test_the_outcome_exit_code_matches_the_oracle(checks, policy):
    v = verdicts.verdict(checks, policy)
    assert verdicts.outcome(v).value == oracle_exit(checks, policy)
    assert (verdicts.outcome(v) is Outcome.PASSED) == v.passed


def test_outcomes_carry_the_documented_exit_codes():
    assert Outcome.PASSED.value == errors.EXIT_OK == 0
    assert Outcome.FAILED.value == errors.EXIT_CHECK_FAILED == 1
    assert Outcome.MISSING_REQUIRED.value == errors.EXIT_BACKEND_UNAVAILABLE == 3
    assert Outcome.ERRORS.value == errors.EXIT_RUNTIME == 4
    assert Outcome.INCONCLUSIVE.value == errors.EXIT_INCONCLUSIVE == 5


@pytest.mark.parametrize("rows_, policy, expected", [
    ([Row("a", Status.FAILED), Row("b", Status.CRASHED)], "pass", Outcome.FAILED),  # a shown fault before a crash
    ([Row("b", Status.CRASHED), Row("a", Status.FAILED)], "pass", Outcome.FAILED),
    ([Row("a", Status.FAILED), Row("c", Status.SKIPPED, required=True)], "pass", Outcome.MISSING_REQUIRED),
    ([Row("a", Status.ERROR), Row("b", Status.INCONCLUSIVE)], "fail", Outcome.ERRORS),
    ([Row("b", Status.INCONCLUSIVE)], "fail", Outcome.INCONCLUSIVE),
    ([Row("b", Status.INCONCLUSIVE)], "pass", Outcome.PASSED),
    ([Row("a", Status.FAILED, gates=False)], "pass", Outcome.PASSED)])
def test_outcome_precedence(rows_, policy, expected):
    assert verdicts.outcome(verdicts.verdict(rows_, policy)) is expected


def test_verify_ends_each_outcome_with_the_exception_of_its_exit_code():
    from pipeline import verify

    assert set(verify.ENDINGS) == set(Outcome) - {Outcome.PASSED}
    for ending, exception in verify.ENDINGS.items():
        assert exception.exit_code == ending.value, ending
    verify._raise_for(verdicts.verdict([Row("a", Status.PASSED)]), None, False, False)  # passed: nothing raised


# --------------------------------------------------------------------------- a fallback round's re-check


def oracle_round(statuses: list[str], policy: str) -> bool:
    allowed = {Status.PASSED, Status.SKIPPED} | ({Status.INCONCLUSIVE} if policy == "pass" else set())
    return all(s in allowed for s in statuses) and any(s in verdicts.JUDGED for s in statuses)


@FAST
@given(st.lists(st.sampled_from(STATUSES), max_size=6), st.sampled_from(POLICIES))
def test_a_round_passes_as_the_oracle_says(statuses, policy):
    assert verdicts.round_passed(statuses, policy) == oracle_round(statuses, policy)


def test_round_cases():
    assert not verdicts.round_passed([], "pass")  # nothing ran: nothing was shown
    assert not verdicts.round_passed([Status.SKIPPED], "pass")
    assert verdicts.round_passed([Status.SKIPPED, Status.PASSED], "pass")
    assert verdicts.round_passed([Status.INCONCLUSIVE], "pass")
    assert not verdicts.round_passed([Status.INCONCLUSIVE], "fail")
    assert not verdicts.round_passed([Status.PASSED, Status.ERROR], "pass")


# --------------------------------------------------------------------------- the exit code of a command


PROJECT_ERRORS = [errors.UsageError, errors.InputError, errors.DataError, errors.CheckFailed, errors.Inconclusive,
                  errors.BackendUnavailable, errors.StageFailed, errors.PipelineError]


@FAST
@given(st.sampled_from(PROJECT_ERRORS + [RuntimeError, OSError, ValueError, KeyboardInterrupt]), st.booleans(),
       st.booleans())
def test_the_exit_code_of_an_ending(kind, wrapped, requested):
    """The interrupt beats everything, whatever carries it; then the project's own class; then 4."""
    err = kind("x")
    if wrapped:  # a library's own error around it (OpenVINO turns a KeyboardInterrupt into RuntimeError)
        outer = RuntimeError("wrapped")
        outer.__cause__ = err
        err = outer
    if requested:
        errors.interrupt_requested.set()
    try:
        code = errors.exit_code(err)
    finally:
        errors.interrupt_requested.clear()
    if requested or kind is KeyboardInterrupt:
        assert code == errors.EXIT_INTERRUPTED == 130
    elif not wrapped and issubclass(kind, errors.PipelineError):
        assert code == kind.exit_code
    else:
        assert code == errors.EXIT_RUNTIME


def test_each_project_error_has_its_documented_code():
    assert {k.__name__: k.exit_code for k in PROJECT_ERRORS} == {
        "UsageError": 2, "InputError": 2, "DataError": 2, "CheckFailed": 1, "Inconclusive": 5,
        "BackendUnavailable": 3, "StageFailed": 4, "PipelineError": 4}
    assert errors.exit_code(errors.ConfigError(["a", "b"])) == 2
    context = RuntimeError("during handling")
    context.__context__ = KeyboardInterrupt()
    assert errors.is_interrupt(context) and not errors.is_interrupt(RuntimeError("KeyboardInterrupt"))
    loop = RuntimeError("a")
    loop.__context__ = loop  # a chain that loops ends the walk
    assert not errors.is_interrupt(loop)


def test_a_full_disk_anywhere_in_the_chain_is_one_line():
    import errno as errno_

    full = OSError(errno_.ENOSPC, "No space left on device", "/run/x.onnx")
    outer = RuntimeError("save failed")
    outer.__cause__ = full
    said = errors.disk_full(outer)
    assert isinstance(said, errors.StageFailed)
    assert str(said) == "no space left on device while writing /run/x.onnx; free space and re-run"
    quota = OSError(errno_.EDQUOT, "Disk quota exceeded")
    assert str(errors.disk_full(quota)) == "disk quota exceeded; free space and re-run"
    worded = RuntimeError("PytorchStreamWriter failed: os error 28")
    assert errors.disk_full_cause(worded) is worded
    assert str(errors.disk_full(worded)) == "no space left on device; free space and re-run"
    assert errors.disk_full_cause(RuntimeError("No space left on device")) is not None
    context = ValueError("later")
    context.__context__ = OSError(errno_.ENOSPC, "x")
    assert errors.disk_full_cause(context) is context.__context__
    assert errors.disk_full(OSError(errno_.EACCES, "denied")) is None and errors.disk_full(ValueError("x")) is None
    loop = RuntimeError("a")
    loop.__cause__ = loop
    assert errors.disk_full_cause(loop) is None
    assert errors.DISK_FULL_ERRNOS == (errno_.ENOSPC, errno_.EDQUOT)


def test_first_line_and_check_interrupt():
    assert errors.first_line(RuntimeError("\n  \n  first  \nsecond")) == "first"
    assert errors.first_line(RuntimeError("")) == ""
    errors.check_interrupt()  # nothing requested: nothing raised
    errors.interrupt_requested.set()
    try:
        with pytest.raises(KeyboardInterrupt):
            errors.check_interrupt()
    finally:
        errors.interrupt_requested.clear()


def test_a_config_error_keeps_every_problem():
    err = errors.ConfigError(["a: bad", "b: worse"])
    assert err.problems == ["a: bad", "b: worse"] and str(err) == "a: bad; b: worse" and err.exit_code == 2
