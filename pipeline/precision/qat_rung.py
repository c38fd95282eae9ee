"""tune's third rung, decided: whether quantization-aware fine-tuning runs after PTQ and the best PTQ mix
(:func:`qat_wanted`), and which of QAT's graph and PTQ's pick tune chooses (:func:`with_qat`). Pure: the stage
(:mod:`pipeline.tune`) runs QAT and times it; the mutation command measures these rules' tests."""

from __future__ import annotations

from pipeline.core import speed_claims
from pipeline.precision.sensitivity import Candidate, time_ratio


def qat_wanted(mode: str, ptq_passed: bool, speed_failure: str, *, low_layers: int,
               missing: str = "") -> tuple[bool, str]:
    """Whether tune runs QAT (``tune.qat``), and why: ``off`` never; never where PTQ's placement puts no layer in
    INT8 (``low_layers`` 0: QAT fine-tunes only where PTQ quantizes, so it would time the FP32 network again);
    ``on`` otherwise always, ``auto`` only when no PTQ mix passes the gate with ``tune.min_speedup`` (none passes,
    or the fastest that does is too slow), and only where QAT can run here (``missing``: why not; said in tune.md,
    never silent)."""
    if mode == "off":
        return False, "tune.qat=off"
    if low_layers == 0:
        return False, ("PTQ's placement puts no layer in INT8 (export.int8.op_types_to_exclude, the fallback's "
                       "fp32_nodes): QAT fine-tunes only where PTQ quantizes, so there is nothing to fine-tune")
    if mode == "on":
        return True, "tune.qat=on"
    need = ("no PTQ mix passes the gate" if not ptq_passed else
            f"the best PTQ mix is too slow: {speed_failure}" if speed_failure else "")
    if need and missing:
        return False, f"{need}, but QAT cannot run here: {missing} (tune.qat=auto)"
    if need:
        return True, f"{need} (tune.qat=auto)"
    return False, "a PTQ mix passes the gate with tune.min_speedup (tune.qat=auto runs QAT only when none does)"


def with_qat(chosen: Candidate | None, why: str, qat: Candidate | None, batches: list[int],
             same_speed: float) -> tuple[Candidate | None, str]:
    """The fastest that passes, PTQ's pick or QAT's graph: QAT where it passes and the PTQ pick does not beat it
    beyond the noise (:func:`pipeline.core.speed_claims.beats` on their ratios at ``batches``, the timed ones;
    a tie goes to QAT's graph, every layer in INT8; none timed: QAT's graph wins when it passes)."""
    if qat is None or not qat.passed:
        return chosen, why
    if chosen is None:
        return qat, "QAT's graph: no PTQ mix passes the gate"
    ratios = time_ratio(chosen, qat, batches)
    if batches and speed_claims.beats(ratios, same_speed):
        worst = next(b for b, r in ratios.items() if speed_claims.verdict(r, same_speed) is speed_claims.Speed.FASTER)
        return chosen, why + (f"; QAT's graph passes but is slower at batch {worst} (its time over the PTQ mix's: "
                              f"{ratios[worst].inverse().text()})")
    lat = ", ".join(f"{qat.latency_ms[b]:.3f} ms at batch {b}" for b in batches) or "speed not measured"
    return qat, (f"QAT's graph passes with every layer in INT8 and the best PTQ mix is not faster beyond the noise "
                 f"({lat}; the PTQ mix raised {len(chosen.high)} layers)")
