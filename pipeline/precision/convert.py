"""Writing the lower-precision graphs: ``model.fp16.onnx`` and ``model.bf16.onnx`` (ModelOpt AutoCast to a low float
type) and ``model.int8.onnx`` (ModelOpt INT8 PTQ, explicit Q/DQ), each calibrated on real images of the training split,
stamped with the weights they come from, with the fallback's nodes kept in higher precision. The export stage writes
them through their plugs (:mod:`pipeline.precision.plugs`); verify's fallback and tune rewrite them through the same
two functions, so what they re-check is what export would write."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import numpy as np
import onnx

from pipeline.core import onnx_io, precision_config, provenance
from pipeline.core.artifacts import CALIBRATION, CALIBRATION_IMAGES, FP32_ONNX, INT8_ONNX
from pipeline.core.run import RunDir, atomic_path, install, read_json, scratch_folder, write_json
from pipeline.precision import fallback, fp16, int8

if TYPE_CHECKING:  # annotations only
    from pipeline.core.config_schema import Config
    from pipeline.core.model_card import ModelCard

log = logging.getLogger("pipeline")


def _calibration_images(cfg: Config, card: ModelCard, count: int, run_dir: RunDir | None = None, precision: str = "",
                        artifact: bool = False):
    """:func:`pipeline.core.data.calibration_batch` (the training split's images by default, never the verdict's),
    imported here: it needs torch, and the verify child that builds an emulation graph from this module's plugs must
    not pay torch's import (two seconds of every start). ``artifact``: the graph made is the run's own (not a scratch
    mix of tune's), so which images calibrated it is recorded in ``calibration_images.json``."""
    from pipeline.core.data import calibration_batch

    images, image_set = calibration_batch(cfg, card, count)
    if artifact and run_dir is not None:
        record_calibration(run_dir, precision, image_set)
    return images, None


def record_calibration(run_dir: RunDir, precision: str, image_set) -> None:
    """``calibration_images.json``: per precision, the images its ranges were calibrated on (split, index, hash), or
    ``{"calibrated": false}`` (``image_set`` None: AutoCast without its range rule reads no image);
    verify reads it to say whether its verdict images are held out (:mod:`pipeline.core.roles`)."""
    path = run_dir.file(CALIBRATION_IMAGES)
    recorded = {}
    if path.is_file():
        try:
            recorded = read_json(path, CALIBRATION_IMAGES)
        except Exception:  # a damaged record is replaced: export writes it whole for every graph it makes
            recorded = {}
    if not isinstance(recorded, dict):
        recorded = {}
    recorded[precision] = image_set.to_json() if image_set is not None else {"calibrated": False}
    write_json(path, recorded)


# A detector's decode and NMS (the ``postprocess`` module of models/detector.py: sigmoid, exp of the box sizes, top-k,
# NonMaxSuppression): kept in FP32 in every lower-precision graph by rule. exp() of a box size overflows FP16 at 11,
# and NMS turns a rounded score into a box that appears or vanishes.
POSTPROCESS_SCOPE = "/postprocess/"


def fp32_by_rule(run_dir: RunDir) -> list[str]:
    """The nodes of ``model.onnx`` every precision keeps in FP32 by rule (a detector's decode and NMS)."""
    graph = onnx.load(str(run_dir.file(FP32_ONNX)), load_external_data=False)
    return [n.name for n in graph.graph.node if n.name.startswith(POSTPROCESS_SCOPE)]


def _by_rule_report(report: dict, nodes: list[str]) -> None:
    if nodes:
        report["fp32_by_rule"] = {"nodes": len(nodes), "why": "a detector's decode and NMS stay in FP32 by rule "
                                                              "(exp overflows FP16; NMS turns a rounded score into a "
                                                              "box that appears or vanishes)"}
        log.info("export: %d nodes of the decode and NMS kept in FP32 by rule", len(nodes))


def quantize_int8(cfg: Config, run_dir: RunDir, card: ModelCard, out_of_int8: list[str], plug,
                  out_name: str = INT8_ONNX, fp32_nodes: list[str] = (), calibration_method: str | None = None) -> dict:
    """ModelOpt INT8 PTQ of ``model.onnx`` into ``out_name``, calibrated on real images of the training split; the
    fallback's nodes left out of INT8, and its FP32 nodes kept in FP32 in the FP16 regions. The calibration
    method: ``calibration_method``, else the one tune chose (``plug``'s fallback file), else the config's."""
    method = calibration_method or fallback.calibration_method(run_dir, plug) or cfg.export.int8.calibration_method
    ic = cfg.export.int8.model_copy(update={"calibration_method": method})
    images, _ = _calibration_images(cfg, card, ic.calibration_samples, run_dir, plug.name, out_name == plug.graph)
    report = quantize_images(run_dir, card, images, ic, out_of_int8, fp32_nodes, out_name)
    log.info("export: %s: %d Q/DQ pairs, %d nodes INT8 (%.1f%% of the matrix ops), %d FP16, %d FP32 (%.1f s)",
             out_name, report["qdq_pairs"], report["int8_nodes"], 100 * report["int8_fraction"],
             report["fp16_nodes"], report["fp32_nodes_count"], report["seconds"])
    return report


def quantize_images(run_dir: RunDir, card: ModelCard, images: np.ndarray, ic, out_of_int8: list[str],
                    fp32_nodes: list[str], out_name: str) -> dict:
    """ModelOpt INT8 PTQ of ``model.onnx`` calibrated on ``images`` into ``out_name`` (stamped, checked); its report.
    export's graph and the stability certificate's draws (:mod:`pipeline.evaluation.certificate`) come from here."""
    by_rule = fp32_by_rule(run_dir)  # a detector's decode and NMS, kept in FP32 by rule (pipeline.core.tasks)
    fp32_nodes = list(dict.fromkeys([*fp32_nodes, *by_rule]))
    # And out of INT8: ModelOpt quantizes a MaxPool's input, so the peak pick's heatmap would pass a Q/DQ pair in
    # FP16 whose two consumers ONNX Runtime's CPU computes in two precisions (docs/detection.md).
    out_of_int8 = list(dict.fromkeys([*out_of_int8, *by_rule]))
    # ModelOpt rewrites its input in place and writes intermediates beside it: it gets a private copy.
    with scratch_folder(run_dir.file(FP32_ONNX)) as scratch:
        fp32_copy, quantized = scratch / FP32_ONNX, scratch / out_name
        source = provenance.source_weights(onnx.load(str(fp32_copy), load_external_data=False))
        report = int8.quantize(fp32_copy, images, card.spec.input_name, ic, quantized, out_of_int8,
                               list(fp32_nodes))
        provenance.stamp_file(quantized, source or "")
        onnx_io.check(quantized)
        install(quantized, run_dir.file(out_name))
    _by_rule_report(report, by_rule)
    return report


def convert_float(cfg: Config, run_dir: RunDir, card: ModelCard, plug, fp32_nodes: list[str], out_name: str) -> dict:
    """AutoCast ``model.onnx`` into ``out_name`` in ``plug``'s low float type (its section ``export.<name>``),
    calibrated on real images of the training split, ``fp32_nodes`` kept in FP32 (the automatic fallback's)."""
    fc = precision_config.export_section(cfg, plug.name)
    calib_path = run_dir.file(CALIBRATION)
    by_rule = fp32_by_rule(run_dir)
    fp32_nodes = list(dict.fromkeys([*fp32_nodes, *by_rule]))
    if fc.range_rule:
        images, _ = _calibration_images(cfg, card, fc.calibration_samples, run_dir, plug.name, out_name == plug.graph)
        with atomic_path(calib_path) as tmp:
            with open(tmp, "wb") as f:
                np.savez(f, **{card.spec.input_name: images})
    elif out_name == plug.graph:
        record_calibration(run_dir, plug.name, None)
    with scratch_folder(run_dir.file(FP32_ONNX), *([calib_path] if fc.range_rule else [])) as scratch:
        fp32_copy = scratch / FP32_ONNX  # AutoCast, a ModelOpt library, also works on a private copy
        model16, report = fp16.convert(fp32_copy, scratch / CALIBRATION if fc.range_rule else None, fc, fp32_nodes,
                                       low=plug.name, opset=plug.opset)
        source = provenance.source_weights(onnx.load(str(fp32_copy), load_external_data=False))
    provenance.stamp(model16, source or "")
    with atomic_path(run_dir.file(out_name)) as tmp:
        onnx.save(model16, str(tmp))
        onnx_io.check(tmp)
    report["calibration_images"] = fc.calibration_samples if fc.range_rule else 0
    _by_rule_report(report, by_rule)
    low = report[f"{plug.name}_nodes"]
    log.info("export: %s: %d of %d float nodes in %s (%.1f%%), %d kept in FP32", out_name, low,
             low + report["fp32_nodes_count"], plug.label, 100 * report[f"{plug.name}_fraction"],
             report["fp32_nodes_count"])
    return report
