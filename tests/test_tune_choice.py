"""tune's choice and speed glue (pipeline/tune.py: ``_choose``, ``time_candidates``) over stand-in Tuners: no model,
no runtime, milliseconds.

Issue 46: two planted defects survived the suite here: the confirmation of the chosen mix (the gate on the graph
export will really make) replaced by ``True``, and the speed baseline timed on the all-INT8 mix instead of the FP32
model (every speed-up then reads about 1 and the speed gate judges nothing). The pure rules under them
(:mod:`pipeline.precision.sensitivity`) have their own tests (tests/test_tune_rules.py).
"""

from __future__ import annotations

from contextlib import contextmanager
from types import SimpleNamespace

import pytest

from pipeline import tune
from pipeline.core.status import Status
from pipeline.precision import sensitivity
from pipeline.precision.sensitivity import Candidate, MethodRun
from pipeline.runtime.speed.openvino_speed import Session


def _run(method: str, candidates: list[Candidate], graph: object = None) -> MethodRun:
    """One calibration method's search as tune holds it, with only what the choice reads."""
    return MethodRun(method, [], {}, [], candidates, graph)


def _cand(high, ms, calibration="max", passed=True) -> Candidate:
    return Candidate(list(high), f"top-{len(high)}", {"status": Status.PASSED if passed else Status.FAILED},
                     latency_ms={1: ms, 8: 4 * ms}, calibration=calibration)


class FakeTuner(SimpleNamespace):
    """What ``_choose`` and ``time_candidates`` read of a Tuner; ``full`` passes the graphs named in ``sound``.

    The target's ``open(model, low)`` yields a session whose timers return fixed latencies (10 ms for the FP32
    model, 5 ms plus one per raised layer for a mix; four times that at batch 8) and records what it opened in
    ``opened`` (model, low flag) and how many it closed in ``closed``. The timing settings are zero, so
    :func:`pipeline.runtime.speed.interleave.time_rounds` runs each timer a few times per round and takes what it
    returns: the rounds are exact and the same every run (nothing is left to the machine's clock)."""

    def __init__(self, sound=(), timed=True):
        target = tune.SpeedTarget("stand-in target", self.open) if timed else \
            tune.SpeedTarget("none", None, "no target: stand-in")
        super().__init__(batches=[1, 8], seconds={}, fp32_model="fp32 model", judged=[], opened=[], closed=0,
                         cfg=SimpleNamespace(tune=SimpleNamespace(same_speed=0.05)),
                         plug=SimpleNamespace(label="INT8", raised_to="out of INT8",
                                              fallback_file="int8_fallback.json"),
                         timing=SimpleNamespace(warmup_s=0.0, min_duration_s=0.0, trials=1, min_iterations=1),
                         sanity=None, sessions_timed=0, target=target)
        self.sound = set(sound)

    def converted(self, high, fp32, method):
        return ("export's graph", tuple(high), tuple(fp32), method)

    def full(self, graph):
        self.judged.append(graph)
        return SimpleNamespace(passed=graph[1] in self.sound, results=[{"graph": list(graph[1])}])

    def mix(self, graph, high, fp32=()):
        return ("mix", graph, tuple(high), tuple(fp32))

    @contextmanager
    def open(self, model, low):
        self.opened.append((model, low))
        ms = 10.0 if model == self.fp32_model else 5.0 + len(model[2])
        try:
            yield Session(timers={b: (lambda x=ms * (4 if b == 8 else 1): x) for b in self.batches},
                          runtime={"low": low})
        finally:
            self.closed += 1


def test_a_mix_whose_exported_graph_fails_gives_way_to_the_next():
    fast, slower = _cand(["a"], 2.0), _cand(["a", "b"], 3.0)
    t = FakeTuner(sound={("a", "b")})
    chosen, why = tune._choose(t, [_run("max", [fast, slower])])
    assert chosen is slower and "fastest passing mix" in why
    assert fast.confirmed.status == Status.FAILED
    assert slower.confirmed.status == Status.PASSED
    assert [g[1] for g in t.judged] == [("a",), ("a", "b")]  # each confirmed on the graph export makes
    assert t.judged[0] == ("export's graph", ("a",), (), "max")


def test_no_mix_is_chosen_when_every_confirmation_fails():
    t = FakeTuner(sound=())
    chosen, why = tune._choose(t, [_run("max", [_cand(["a"], 2.0), _cand(["b"], 3.0)])])
    assert chosen is None and why == "no passing mix (confirmation failed for 2)"


def test_a_confirmed_pick_is_taken_at_once():
    pick = _cand(["a"], 2.0)
    t = FakeTuner(sound={("a",)})
    chosen, _ = tune._choose(t, [_run("max", [pick, _cand(["a", "b"], 3.0)])])
    assert chosen is pick and len(t.judged) == 1


def test_the_speed_baseline_is_the_fp32_model_and_each_mix_is_timed_once():
    all_low, top1, same_as_top1 = _cand([], 0.0), _cand(["a"], 0.0), _cand(["a"], 0.0)
    t = FakeTuner()
    runs = [_run("max", [all_low, top1, same_as_top1], "all-INT8 graph")]
    baseline = tune.time_candidates(t, runs)
    assert t.opened[0] == ("fp32 model", False)  # FP32, as deployed: no low-precision flag
    assert baseline.origin == tune.FP32_REFERENCE and baseline.runtime == {"low": False}
    assert baseline.latency_ms == {1: 10.0, 8: 40.0}
    assert [m for m, low in t.opened[1:]] == [("mix", "all-INT8 graph", (), ()), ("mix", "all-INT8 graph", ("a",), ())]
    assert all(low for _, low in t.opened[1:]) and t.closed == len(t.opened) == 3
    assert all_low.latency_ms == {1: 5.0, 8: 20.0} and top1.latency_ms == same_as_top1.latency_ms == {1: 6.0, 8: 24.0}
    assert top1.runtime == {"low": True} and same_as_top1.rounds == top1.rounds
    # one set of rounds for all: the mixes' speed-ups over FP32 are per-round ratios, not about 1
    assert t.sessions_timed == 1 and {c.session for c in (baseline, all_low, top1, same_as_top1)} == {1}
    assert sensitivity.speedups(baseline.latency_ms, top1.latency_ms) == {1: 10 / 6, 8: 40 / 24}
    ratios = sensitivity.time_ratio(top1, baseline, t.batches)
    assert all(r.rounds == len(top1.rounds[b]) > 1 and r.estimate == pytest.approx(0.6) for b, r in ratios.items())
    assert t.sanity.trustworthy and t.sanity.attempts == 1


def test_each_calibrations_mix_is_made_from_its_own_graph():
    a, b = _cand(["x"], 0.0, calibration="max"), _cand(["x"], 0.0, calibration="entropy")
    t = FakeTuner()
    tune.time_candidates(t, [_run("max", [a], "max graph"),
                             _run("entropy", [b], "entropy graph")])
    assert [m[1] for m, _ in t.opened[1:]] == ["max graph", "entropy graph"]


def test_nothing_is_timed_without_a_target(caplog):
    t = FakeTuner(timed=False)
    cand = _cand([], 0.0)
    cand.latency_ms = {}
    assert tune.time_candidates(t, [_run("max", [cand], "g")]) is None
    assert t.opened == [] and cand.latency_ms == {} and t.sessions_timed == 0 and t.sanity is None


@pytest.mark.parametrize("timed", [True, False])
def test_an_untimed_choice_says_so(timed):
    t = FakeTuner(sound={("a",)}, timed=timed)
    chosen, why = tune._choose(t, [_run("max", [_cand(["a"], 2.0)])])
    assert chosen is not None
    assert ("speed not measured" in why) is not timed


def test_the_confirmation_records_its_round():
    pick = _cand(["a"], 2.0)
    tune._choose(FakeTuner(sound={("a",)}), [_run("max", [pick])])
    assert pick.confirmed.to_json() == {"status": Status.PASSED, "candidates": [{"graph": ["a"]}]}


def test_no_passing_mix_at_all_says_just_that():
    chosen, why = tune._choose(FakeTuner(), [_run("max", [_cand(["a"], 2.0, passed=False)])])
    assert chosen is None and why == "no passing mix"


def test_the_previous_choice_stays_unless_beaten_beyond_the_noise_and_the_reason_says_so():
    incumbent, barely_faster = _cand(["a"], 2.0), _cand(["b"], 1.99)
    incumbent.origin = tune.PREVIOUS
    t = FakeTuner(sound={("a",), ("b",)})
    chosen, why = tune._choose(t, [_run("max", [incumbent, barely_faster])], incumbent)
    assert chosen is incumbent
    assert why.endswith("; kept as the previous choice (int8_fallback.json): the best new mix (top-1, max; "
                        "1.990 ms at batch 1, 7.960 ms at batch 8) is not better beyond tune.same_speed (0.05)"), why
    much_faster = _cand(["b"], 1.0)
    chosen, why = tune._choose(t, [_run("max", [incumbent, much_faster])], incumbent)
    assert chosen is much_faster and why.endswith("max calibration")  # nothing said of a previous choice
    alone = FakeTuner(sound={("a",)})
    chosen, why = tune._choose(alone, [_run("max", [incumbent])], incumbent)
    assert chosen is incumbent and "kept as the previous choice" not in why  # nothing else was better or worse
    chosen, why = tune._choose(t, [_run("max", [incumbent, barely_faster])], None)
    assert chosen is barely_faster and "kept" not in why  # no previous choice: the fastest


def test_a_previous_choice_whose_graph_fails_is_not_kept():
    incumbent, other = _cand(["a"], 2.0), _cand(["b"], 1.99)
    chosen, why = tune._choose(FakeTuner(sound={("b",)}), [_run("max", [incumbent, other])],
                               incumbent)
    assert chosen is other and "kept" not in why


class Bar:
    def __init__(self):
        self.n = 0

    def update(self, k):
        self.n += k


def test_the_speed_phase_is_named_and_counts_every_timing(monkeypatch):
    from contextlib import contextmanager

    phases = []

    @contextmanager
    def phase(t, name, total=None):
        bar = Bar()
        yield bar
        phases.append((name, total, bar.n))

    monkeypatch.setattr(tune, "phase", phase)
    t = FakeTuner()
    cands = [_cand([], 0.0), _cand(["a"], 0.0), _cand(["a"], 0.0)]
    tune.time_candidates(t, [_run("max", cands, "g")])
    assert phases == [("speed, stand-in target", 3, 3)]  # FP32 and two distinct mixes
    assert len(t.opened) == 3 and t.sessions_timed == 1


def test_a_mix_is_timed_with_the_nodes_it_keeps_in_fp32():
    cand = _cand(["a"], 0.0)
    cand.fp32 = ["n1"]
    t = FakeTuner()
    tune.time_candidates(t, [_run("max", [cand], "g")])
    assert t.opened[1] == (("mix", "g", ("a",), ("n1",)), True)


def test_an_untimed_run_logs_why(caplog):
    import logging

    with caplog.at_level(logging.WARNING, logger="pipeline"):
        assert tune.time_candidates(FakeTuner(timed=False), []) is None
    assert caplog.messages == ["tune: speed not measured: no target: stand-in"]


class SlowGraphTuner(FakeTuner):
    """A target on which the mixes made from the graphs named in ``slow`` take three times as long: the "all INT8"
    mixes of two calibrations compile to the same kernels, so such a difference is the machine's, not theirs."""

    def __init__(self, slow=(), same_speed=0.05):
        super().__init__()
        self.slow = set(slow)
        self.cfg.tune.same_speed = same_speed

    @contextmanager
    def open(self, model, low):
        with super().open(model, low) as session:
            if model != self.fp32_model and model[1] in self.slow:
                session = Session(timers={b: (lambda f=f: 3 * f()) for b, f in session.timers.items()},
                                  runtime=session.runtime)
            yield session


def _all_int8(calibration: str) -> Candidate:
    return Candidate([], "all INT8", {"status": Status.PASSED}, calibration=calibration)


def _timed(t: FakeTuner, calibrations: list[str], monkeypatch) -> list[int]:
    """Times one "all INT8" mix per calibration (each from its own graph); the seeds each set of rounds ran with."""
    seeds, real = [], tune.time_in_rounds

    def recorded(t, rivals, sessions, seed=0):
        seeds.append(seed)
        real(t, rivals, sessions, seed)

    monkeypatch.setattr(tune, "time_in_rounds", recorded)
    tune.time_candidates(t, [_run(c, [_all_int8(c)], f"{c} graph") for c in calibrations])
    return seeds


def test_twins_timed_apart_are_timed_again_each_round_seeded_anew_and_the_log_names_only_the_pair_that_differs(
        monkeypatch, caplog):
    import logging

    t = SlowGraphTuner(slow={"entropy graph", "percentile graph"})
    with caplog.at_level(logging.WARNING, logger="pipeline"):
        seeds = _timed(t, ["max", "entropy", "percentile"], monkeypatch)
    assert seeds == list(range(1 + tune.RETIMES))  # timed, then again RETIMES times, each with its own seed
    assert t.sessions_timed == 1 + tune.RETIMES
    assert not t.sanity.trustworthy and t.sanity.attempts == 1 + tune.RETIMES
    checks = t.sanity.checks
    assert [c.sane for c in checks] == [False, True]  # max/entropy apart; entropy/percentile alike
    assert all(set(c.ratios) == {"1", "8"} for c in checks)  # at every timed batch
    assert caplog.messages == [f"tune: the timings are not trustworthy (attempt {i} of {1 + tune.RETIMES}): "
                               f"{checks[0].text}" for i in range(1, 2 + tune.RETIMES)]
    assert checks[0].text.startswith("all INT8 (entropy) over all INT8 (max): ")


def test_every_pair_timed_apart_is_named_in_the_retime_log(monkeypatch, caplog):
    import logging

    t = SlowGraphTuner(slow={"entropy graph"})  # max/entropy and entropy/percentile both apart
    with caplog.at_level(logging.WARNING, logger="pipeline"):
        _timed(t, ["max", "entropy", "percentile"], monkeypatch)
    checks = t.sanity.checks
    assert [c.sane for c in checks] == [False, False]
    assert caplog.messages[-1] == (f"tune: the timings are not trustworthy (attempt {1 + tune.RETIMES} of "
                                   f"{1 + tune.RETIMES}): {checks[0].text}; {checks[1].text}")


def test_twins_that_time_alike_are_timed_once_and_the_band_is_tune_same_speed(monkeypatch):
    alike = SlowGraphTuner()
    assert _timed(alike, ["max", "entropy"], monkeypatch) == [0]
    assert alike.sanity.trustworthy and alike.sanity.attempts == 1 and len(alike.sanity.checks) == 1
    # three times as slow is within a same-speed band of x6 (tune.same_speed=5): alike, timed once
    wide = SlowGraphTuner(slow={"entropy graph"}, same_speed=5.0)
    assert _timed(wide, ["max", "entropy"], monkeypatch) == [0]
    assert wide.sanity.trustworthy and wide.sanity.checks[0].sane
    narrow = SlowGraphTuner(slow={"entropy graph"})
    assert _timed(narrow, ["max", "entropy"], monkeypatch) == list(range(1 + tune.RETIMES))


def test_the_speed_baseline_is_an_fp32_deployment_that_passed_with_no_layer_raised():
    baseline = tune.time_candidates(FakeTuner(), [_run("max", [_cand([], 0.0)], "g")])
    assert baseline.high == [] and baseline.fp32 == [] and baseline.result == {"status": Status.PASSED}
    assert baseline.origin == tune.FP32_REFERENCE and baseline.calibration in ("", None)
