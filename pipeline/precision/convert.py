"""Writing the lower-precision graphs: ``model.fp16.onnx`` and ``model.bf16.onnx`` (ModelOpt AutoCast to a low float
type) and ``model.int8.onnx`` (ModelOpt INT8 PTQ, explicit Q/DQ), each calibrated on real validation images,
stamped with the weights they come from, with the fallback's nodes kept in higher precision. The export stage writes
them through their plugs (:mod:`pipeline.precision.plugs`); verify's fallback and tune rewrite them through the same
two functions, so what they re-check is what export would write."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import numpy as np
import onnx

from pipeline.core import onnx_io, precision_config, provenance
from pipeline.core.artifacts import CALIBRATION, FP32_ONNX, INT8_ONNX
from pipeline.core.run import RunDir, atomic_path, install, scratch_folder
from pipeline.precision import fallback, fp16, int8

if TYPE_CHECKING:  # annotations only
    from pipeline.core.config_schema import Config

log = logging.getLogger("pipeline")


def _calibration_images(cfg: Config, card: dict, count: int):
    """:func:`pipeline.core.data.validation_batch`, imported here: it needs torch, and the verify child that builds
    an emulation graph from this module's plugs must not pay torch's import (two seconds of every start)."""
    from pipeline.core.data import validation_batch

    return validation_batch(cfg, card, count)


def quantize_int8(cfg: Config, run_dir: RunDir, card: dict, out_of_int8: list[str], plug, out_name: str = INT8_ONNX,
                  fp32_nodes: list[str] = (), calibration_method: str | None = None) -> dict:
    """ModelOpt INT8 PTQ of ``model.onnx`` into ``out_name``, calibrated on real validation images; the
    fallback's nodes left out of INT8, and its FP32 nodes kept in FP32 in the FP16 regions. The calibration
    method: ``calibration_method``, else the one tune chose (``plug``'s fallback file), else the config's."""
    method = calibration_method or fallback.calibration_method(run_dir, plug) or cfg.export.int8.calibration_method
    ic = cfg.export.int8.model_copy(update={"calibration_method": method})
    images, _ = _calibration_images(cfg, card, ic.calibration_samples)
    # ModelOpt rewrites its input in place and writes intermediates beside it: it gets a private copy.
    with scratch_folder(run_dir.file(FP32_ONNX)) as scratch:
        fp32_copy, quantized = scratch / FP32_ONNX, scratch / out_name
        source = provenance.source_weights(onnx.load(str(fp32_copy), load_external_data=False))
        report = int8.quantize(fp32_copy, images, card["spec"]["input_name"], ic, quantized, out_of_int8,
                               list(fp32_nodes))
        provenance.stamp_file(quantized, source or "")
        onnx_io.check(quantized)
        install(quantized, run_dir.file(out_name))
    log.info("export: %s: %d Q/DQ pairs, %d nodes INT8 (%.1f%% of the matrix ops), %d FP16, %d FP32 (%.1f s)",
             out_name, report["qdq_pairs"], report["int8_nodes"], 100 * report["int8_fraction"],
             report["fp16_nodes"], report["fp32_nodes_count"], report["seconds"])
    return report


def convert_float(cfg: Config, run_dir: RunDir, card: dict, plug, fp32_nodes: list[str], out_name: str) -> dict:
    """AutoCast ``model.onnx`` into ``out_name`` in ``plug``'s low float type (its section ``export.<name>``),
    calibrated on real validation images, ``fp32_nodes`` kept in FP32 (the automatic fallback's)."""
    fc = precision_config.export_section(cfg, plug.name)
    calib_path = run_dir.file(CALIBRATION)
    if fc.range_rule:
        images, _ = _calibration_images(cfg, card, fc.calibration_samples)
        with atomic_path(calib_path) as tmp:
            with open(tmp, "wb") as f:
                np.savez(f, **{card["spec"]["input_name"]: images})
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
    low = report[f"{plug.name}_nodes"]
    log.info("export: %s: %d of %d float nodes in %s (%.1f%%), %d kept in FP32", out_name, low,
             low + report["fp32_nodes_count"], plug.label, 100 * report[f"{plug.name}_fraction"],
             report["fp32_nodes_count"])
    return report
