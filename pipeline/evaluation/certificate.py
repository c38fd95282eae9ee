"""The calibration stability certificate, run: the INT8 graph recalibrated on K draws of training images (ModelOpt's
PTQ of the exported ``model.onnx``, the mix's layers kept out of INT8 as export keeps them), each draw's graph executed
faithfully (``int8_exact``) on the verdict images and judged by the gate; the decisions are
:mod:`pipeline.precision.stability`'s. verify runs it on ``model.int8.onnx`` (``export.int8.stability.in_verify``),
tune on its chosen mix (``in_tune``)."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import numpy as np
import onnx
from onnx import numpy_helper

from pipeline.core import data
from pipeline.core.checks import Evidence
from pipeline.core.run import RunDir
from pipeline.core.stability_record import (
    CertificateOutcome,
    DrawRow,
    GateSpread,
    KindSpread,
    QuantizerSpread,
    ScaleSpread,
    SpreadRow,
    StabilityCertificate,
)
from pipeline.precision import convert, fallback, sensitivity, stability
from pipeline.precision import gate as criteria

if TYPE_CHECKING:  # annotations only
    from pipeline.core.config_schema import Config
    from pipeline.core.model_card import ModelCard

log = logging.getLogger("pipeline")

SCRATCH = "model.int8.draw.onnx"  # one draw's graph, while it is judged
STATISTICS = ("scaled_error", "top1_agreement", "accuracy_drop")


def quantizer_scales(model: onnx.ModelProto) -> dict[str, tuple[str, float]]:
    """Each QuantizeLinear's scale by the tensor it quantizes: ("activation" | "weight", the scale; a per-channel
    weight scale as its mean)."""
    consts = {i.name: i for i in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant" and node.attribute:
            consts[node.output[0]] = node.attribute[0].t
    weights = set(consts)
    out = {}
    for node in model.graph.node:
        if node.op_type != "QuantizeLinear" or len(node.input) < 2 or node.input[1] not in consts:
            continue
        scale = numpy_helper.to_array(consts[node.input[1]]).astype(np.float64)
        out[node.input[0]] = ("weight" if node.input[0] in weights else "activation", float(scale.mean()))
    return out


def certify(cfg: Config, run_dir: RunDir, card: ModelCard, plug, evidence: Evidence, raised: fallback.Raised,
            method: str, gate: dict, deployed_model: onnx.ModelProto | None = None) -> StabilityCertificate:
    """The certificate of the INT8 mix ``raised`` calibrated with ``method``: K draws, each judged on ``evidence``.
    Draw 0 is the deployed calibration (``deployed_model`` where given: the artifact itself)."""
    from pipeline.runtime.runners import collect, faithful_runner

    sc, ic = cfg.export.int8.stability, cfg.export.int8.model_copy(update={"calibration_method": method})
    size = sc.draw_size or ic.calibration_samples
    start = time.perf_counter()
    deployed_images, deployed_set = data.calibration_batch(cfg, card, ic.calibration_samples)
    n_train = data.training_size(cfg, card)
    draws = stability.draw_indices(n_train, deployed_set.indices if deployed_set.split == "train" else (),
                                   sc.draws, size, sc.sampling, cfg.data.seed + 3)
    if draws.note:
        log.warning("stability: %s", draws.note)
    rows, scales = [], []
    for number, indices in enumerate(draws.indices):
        if number == 0 and deployed_model is not None:
            model = deployed_model
        else:
            images = deployed_images if number == 0 else data.training_images(cfg, card, list(indices))
            try:
                convert.quantize_images(run_dir, card, images, ic, raised.out_of_low, raised.fp32, SCRATCH)
                model = onnx.load(str(run_dir.file(SCRATCH)))
            finally:
                run_dir.file(SCRATCH).unlink(missing_ok=True)
        outputs = collect(faithful_runner(plug, model, cfg.verify.emulation), evidence.feeds)
        result = criteria.judge(outputs, evidence.reference, evidence.labels, gate, evidence.output_name,
                                evidence.confidence)
        numbers = sensitivity.summary(result)
        rows.append(DrawRow(draw=number, deployed=number == 0,
                            images=len(indices) if number else len(deployed_set.indices),
                            split="train" if number else deployed_set.split, status=result.status,
                            **{k: numbers.get(k) for k in STATISTICS}))
        scales.append(quantizer_scales(model))
        log.info("stability: draw %d of %d: %s (scaled error %.3g)", number + 1, len(draws.indices),
                 result.status, rows[-1].scaled_error or float("nan"))
    return payload(draws, rows, scales, gate.get("min_pass_share"), cfg.verify.inconclusive, size,
                   len(evidence.labels), time.perf_counter() - start)


def payload(draws: stability.Draws, rows: list[DrawRow], scales: list[dict], min_pass_share: float | None,
            inconclusive: str, size: int, images: int, seconds: float) -> StabilityCertificate:
    """The certificate's record (verify.json's and tune.json's ``stability``)."""
    cert = stability.certify([r.status for r in rows], min_pass_share, inconclusive)
    kinds = {name: kind for draw in scales for name, (kind, _) in draw.items()}
    spreads = stability.scale_spreads([{n: v for n, (_, v) in draw.items()} for draw in scales])
    top = sorted(spreads, key=lambda n: spreads[n].relative, reverse=True)[:10]
    return StabilityCertificate(
        certificate=_outcome(cert), sampling=draws.sampling, sampling_note=draws.note, draw_size=size,
        verdict_images=images, draws=rows, gate_spread=GateSpread(**{k: _gate_spread(rows, k) for k in STATISTICS}),
        scale_spread=ScaleSpread(activation=_kind_spread(spreads, kinds, "activation"),
                                 weight=_kind_spread(spreads, kinds, "weight")),
        quantizers=[QuantizerSpread(tensor=n, kind=kinds[n], **spreads[n].to_json()) for n in top],
        seconds=round(seconds, 2))


def _outcome(cert: stability.Certificate) -> CertificateOutcome:
    return CertificateOutcome(draws=cert.draws, passing=cert.passing, pass_share=cert.share,
                              deployed_draw=cert.deployed, deployed_passed=cert.deployed_passed,
                              min_pass_share=cert.min_pass_share, status=cert.status, fails_gate=cert.fails_gate,
                              reasons=list(cert.reasons), line=cert.line())


def _gate_spread(rows: list[DrawRow], statistic: str) -> SpreadRow:
    """One gate statistic across the draws (none finite: every end 0)."""
    spread = stability.spread_of([getattr(r, statistic) for r in rows])
    return SpreadRow.model_validate((spread or stability.Spread(0, 0, 0)).to_json())


def _kind_spread(spreads: dict[str, stability.Spread], kinds: dict[str, str], kind: str) -> KindSpread:
    """The scales of the quantizers of one ``kind`` across the draws, and the one that moves most."""
    named = {n: s for n, s in spreads.items() if kinds[n] == kind}
    relative = [s.relative for s in named.values()]
    worst = max(named, key=lambda n: named[n].relative) if named else None
    return KindSpread(quantizers=len(named), median_relative=float(np.median(relative)) if relative else None,
                      max_relative=max(relative) if relative else None, worst=worst)
