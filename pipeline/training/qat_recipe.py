"""Quantization-aware fine-tuning (QAT) of the trained model for INT8, written as ``model.int8.onnx``: what the qat
stage and tune's third rung run (:func:`fine_tune`), and what export rebuilds the graph with from QAT's checkpoint
(:func:`rebuild`).

When post-training quantization breaks a model, fine-tune it for INT8 (docs/verify.md, "Quantization-aware
fine-tuning"):

1. The placement: ModelOpt's ONNX PTQ of ``model.onnx`` with every layer in INT8 (export's calibration and
   exclusions, the FP16 fallback's FP32 nodes kept), read by module (:func:`pipeline.precision.qat.placement`).
2. The trained model with ModelOpt's PyTorch fake quantizers exactly there, PTQ's activation ranges as the start.
3. The project's :class:`~pipeline.training.trainer.Trainer` for ``qat.epochs`` at ``qat.lr``: same data and
   augmentation, AMP, checkpoints (``qat.checkpoint.pt``, quantizer state included), ``--resume``, progress bars,
   ``qat.metrics.jsonl`` and ``qat_curve.png``; the loss distils the FP32 model's logits.
4. The fine-tuned weights exported (quantizers off) and quantized by the same PTQ, with the activation ranges the
   fine-tuning trained with: ``model.int8.onnx`` in exactly the form build, verify and benchmark read, stamped with
   the trained weights it comes from. The manifest records the method, epochs, data and source weights' sha256.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnx
import torch

from pipeline.core import artifacts as a
from pipeline.core import data as data_mod
from pipeline.core import modeling, onnx_io, provenance
from pipeline.core.data import calibration_batch
from pipeline.core.errors import BackendUnavailable, InputError, UsageError, first_line
from pipeline.core.run import RunDir, install, scratch_folder, sha256_file, write_json
from pipeline.core.torch_onnx import export_onnx
from pipeline.precision import fallback, int8, plugs, qat
from pipeline.precision.fallback import QATSource, Raised
from pipeline.training import batchnorm
from pipeline.training.checkpoint import Checkpoint, load_checkpoint
from pipeline.training.device import AMP_NAMES, resolve_amp, resolve_device
from pipeline.training.distributed import Dist
from pipeline.training.metrics import plot_curves
from pipeline.training.records import QatTrainResult
from pipeline.training.rng import seed_everything
from pipeline.training.trainer import Trainer

if TYPE_CHECKING:  # annotations only
    from pipeline.core.config_schema import Config
    from pipeline.core.model_card import ModelCard

log = logging.getLogger("pipeline")

TEMPLATE = "model.qat.ptq.onnx"  # PTQ's all-INT8 graph: the placement and the ranges (removed when read)
PLUG = plugs.INT8


class QATTrainer(Trainer):
    """The project's trainer on the fake-quantized model: its own files, a distillation loss, BatchNorm frozen,
    weight ranges kept at the weights' per-channel max (PTQ's rule), no deployable weights written."""

    checkpoint_name = a.QAT_CHECKPOINT
    best_name = a.QAT_BEST_CHECKPOINT
    metrics_name = a.QAT_METRICS
    stage_name = "qat"
    epochs_setting = "qat.epochs"

    def __init__(self, cfg: Config, run_dir: RunDir, model, teacher, spec, splits, device, amp_dtype, source: str):
        super().__init__(cfg, run_dir, model, spec, splits, device, Dist(), amp_dtype)
        self.teacher = teacher.to(device).eval()
        self.qc, self.source = cfg.qat, source

    def loss(self, logits, x, y):
        with torch.no_grad():
            teacher = self.teacher(x)
        return qat.distillation_loss(logits, teacher, y, temperature=self.qc.temperature,
                                     label_weight=self.qc.label_weight)

    def micro_step(self, x, y, epoch, batch_index, group, group_size, sync):
        qat.sync_weight_ranges(self.model)
        if self.qc.freeze_batchnorm:
            for layer in batchnorm.layers(self.model):
                layer.eval()
        return super().micro_step(x, y, epoch, batch_index, group, group_size, sync)

    def validate(self):
        qat.sync_weight_ranges(self.model)
        return super().validate()

    def checkpoint_state(self) -> Checkpoint:
        import modelopt.torch.opt as mto

        return dataclasses.replace(super().checkpoint_state(), modelopt_state=mto.modelopt_state(self.model),
                                   source_weights_sha256=self.source)

    def resume(self) -> None:
        if self.ckpt_path.exists() and load_checkpoint(self.ckpt_path).source_weights_sha256 != self.source:
            raise InputError(f"{self.ckpt_path.name} was fine-tuned from other trained weights than {a.WEIGHTS}; "
                             "run qat without --resume")
        super().resume()

    def finish(self, seconds: float) -> QatTrainResult:
        """The facts for the manifest, the curve; the best epoch's weights loaded into the model (what is exported)."""
        plot_curves(self.run_dir.file(a.QAT_METRICS), self.run_dir.file(a.QAT_CURVE))
        source = self.best_path if self.best_path.exists() else self.ckpt_path
        best = load_checkpoint(source)
        self.model.load_state_dict(best.model)
        qat.sync_weight_ranges(self.model)
        epochs_run = max(1, len(self.history))
        return QatTrainResult(
            epochs=self.tc.epochs, steps=self.state.step, skipped_steps=self.state.skipped_steps,
            best_val_acc=self.state.best_acc, best_epoch=best.epoch, history=tuple(self.history),
            train_seconds=round(seconds, 2), seconds_per_epoch=round(seconds / epochs_run, 2),
            images_per_s=round(self.images_seen / max(seconds, 1e-9), 1))


def qat_config(cfg: Config) -> Config:
    """``cfg`` with train's section set for fine-tuning: qat's epochs and LR, no warm-up, no precise BN, no compile."""
    tc = cfg.train.model_copy(update={
        "epochs": cfg.qat.epochs, "lr": cfg.qat.lr, "warmup_epochs": 0.0, "fp32_warmup_epochs": 0, "compile": False,
        "label_smoothing": 0.0, "precise_bn": cfg.train.precise_bn.model_copy(update={"enabled": False})})
    return cfg.model_copy(update={"train": tc})


def exporter_reason(cfg: Config) -> str:
    """"" when QAT can map PTQ's Q/DQ nodes to modules with this config's exporter; else why not."""
    return "" if cfg.export.exporter == "torchscript" else (
        "qat maps PTQ's Q/DQ nodes to modules by the TorchScript exporter's node names: set "
        "export.exporter=torchscript")


def missing(cfg: Config) -> str:
    """Why QAT cannot run with this config on this machine ("" when it can): what :func:`check` refuses, as words
    (tune's ``tune.qat=auto`` says it in tune.md instead of failing)."""
    reason = int8.availability() or qat.availability()
    return f"qat needs ModelOpt: {reason}" if reason else exporter_reason(cfg)


def check(cfg: Config) -> None:
    """Refuse, with the reason, a config or machine QAT cannot run with (exit 2 or 3)."""
    if not PLUG.enabled(cfg):
        raise UsageError("qat writes model.int8.onnx, but export.int8.enabled is false (set it to true)")
    reason = exporter_reason(cfg)
    if reason:
        raise UsageError(reason)
    for reason in (int8.availability(), qat.availability()):
        if reason:
            raise BackendUnavailable(f"qat needs ModelOpt: {reason}")


def _template(cfg: Config, run_dir: RunDir, card: ModelCard, fp32_nodes: list[str]) -> tuple[onnx.ModelProto, dict]:
    """PTQ's graph with every layer in INT8 (the FP16 fallback's FP32 nodes kept), and its precision report."""
    try:
        report = PLUG.write(cfg, run_dir, card, Raised(fp32=list(fp32_nodes)), out_name=TEMPLATE)
        return onnx.load(str(run_dir.file(TEMPLATE))), report
    finally:
        run_dir.file(TEMPLATE).unlink(missing_ok=True)


def _prepare(cfg: Config, run_dir: RunDir, with_data: bool = True):
    """The trained model, its frozen FP32 copy (the teacher), the card, the data, the PTQ template."""
    model, card = modeling.load_trained(cfg, run_dir, "qat")
    fp32_model = onnx_io.load(run_dir.require(a.FP32_ONNX, "export", "qat"))
    fp32_nodes = fallback.inherited_fp32(run_dir, PLUG, fp32_model)
    template, ptq_report = _template(cfg, run_dir, card, fp32_nodes)
    spec = modeling.resolve_spec(cfg)
    size = modeling.image_size(cfg, spec)
    mean, std = modeling.normalisation(cfg, spec)
    splits = data_mod.load(cfg.data, image_size=size, mean=mean, std=std) if with_data else None
    teacher = copy.deepcopy(model).eval()
    for p in teacher.parameters():
        p.requires_grad_(False)
    return model, teacher, card, splits, template, ptq_report, fp32_nodes


def fine_tune(cfg: Config, run_dir: RunDir, *, resume: bool = False, out_name: str = a.INT8_ONNX) -> dict:
    """Fine-tune ``run_dir``'s trained model for INT8 and write ``out_name`` from it; returns the facts for the
    manifest (``source``: the fallback file's :class:`~pipeline.precision.fallback.QATSource`)."""
    check(cfg)
    start = time.perf_counter()
    seed_everything(cfg.train.seed, cfg.train.deterministic)
    model, teacher, card, splits, template, ptq_report, fp32_nodes = _prepare(cfg, run_dir)
    simulated = _quantize(cfg, card, model, template)
    device = resolve_device(cfg)
    amp_dtype, amp_note = resolve_amp(cfg.train.amp, device)
    log.info("qat: %s, %d epochs at lr %g, %s; fake quantization at %d inputs and %d weights (%d Q/DQ places with "
             "no module to simulate them in)", cfg.model.name, cfg.qat.epochs, cfg.qat.lr, amp_note,
             len(simulated["inputs"]), len(simulated["weights"]), len(simulated["not_simulated"]))
    source = sha256_file(run_dir.file(a.WEIGHTS))
    trainer = QATTrainer(qat_config(cfg), run_dir, model, teacher, _CardSpec(card.spec.to_json()), splits, device,
                         amp_dtype, source)
    facts = trainer.train(resume=resume, profile=False)
    model.to("cpu").eval()
    report = export_int8(cfg, run_dir, card, model, template, fp32_nodes, out_name)
    details = _details(cfg, splits, facts, simulated, report, ptq_report, source, AMP_NAMES[amp_dtype])
    details["seconds"] = round(time.perf_counter() - start, 2)
    details["source"] = {"epochs": cfg.qat.epochs, "checkpoint": trainer.best_path.name,
                         "source_weights_sha256": source, "checkpoint_sha256": sha256_file(trainer.best_path),
                         "data": f"{splits.source}, {len(splits.train)} training images (train's augmentation)"}
    log.info("qat: %s: best val acc %.2f%% (fake-quantized), %.1f s per epoch; %s", out_name,
             100 * facts.best_val_acc, facts.seconds_per_epoch, _layers_line(report, ptq_report))
    return details


def _quantize(cfg: Config, card: ModelCard, model, template: onnx.ModelProto) -> dict:
    """ModelOpt's quantizers where ``template`` (PTQ's graph) quantizes, calibrated on export's images first."""
    calib, _ = calibration_batch(cfg, card, cfg.export.int8.calibration_samples)
    return qat.quantize_model(model, qat.placement(template), lambda m: m(torch.from_numpy(calib)))


def rebuild(cfg: Config, run_dir: RunDir, card: ModelCard, source: QATSource, out_name: str = a.INT8_ONNX) -> dict:
    """``out_name`` from QAT's checkpoint (no training): what export does when the fallback file says ``method: qat``.
    A checkpoint that is missing, changed, or made from other trained weights is an :class:`InputError`."""
    check(cfg)
    path = run_dir.file(source.checkpoint)
    weights = sha256_file(run_dir.file(a.WEIGHTS))
    if not path.is_file() or sha256_file(path) != source.checkpoint_sha256:
        raise InputError(f"{a.INT8_FALLBACK} asks for QAT's graph, but {source.checkpoint} is missing or changed; run "
                         "python -m pipeline qat (or tune) again")
    if weights != source.source_weights_sha256:
        raise InputError(f"{source.checkpoint} was fine-tuned from other trained weights than {a.WEIGHTS}; run "
                         "python -m pipeline qat (or tune) again")
    model, _, card, _, template, _, fp32_nodes = _prepare(cfg, run_dir, with_data=False)
    _quantize(cfg, card, model, template)
    try:
        model.load_state_dict(load_checkpoint(path).model)
    except (RuntimeError, KeyError, TypeError) as exc:  # not QAT's weights and quantizer state (train's, another's)
        raise InputError(f"{source.checkpoint} does not hold QAT's fine-tuned weights and quantizer state for this "
                         f"model ({first_line(exc)[:160]}); run python -m pipeline qat (or tune) again") from None
    qat.sync_weight_ranges(model)
    report = export_int8(cfg, run_dir, card, model.eval(), template, fp32_nodes, out_name)
    report.update({"qat_checkpoint": source.checkpoint, "qat_epochs": source.epochs})
    log.info("export: %s rebuilt from %s (QAT, %d epochs): %d matrix layers in INT8", out_name, source.checkpoint,
             source.epochs, report["int8_layers"])
    return report


def export_int8(cfg: Config, run_dir: RunDir, card: ModelCard, model, template: onnx.ModelProto,
                fp32_nodes: list[str], out_name: str = a.INT8_ONNX) -> dict:
    """The fine-tuned weights (quantizers off) exported like ``model.onnx``, quantized by export's PTQ, with the
    template's activation ranges: ``model.int8.onnx``, stamped with the trained weights; returns its report."""
    spec, ec = card.spec, cfg.export
    ic = cfg.export.int8.model_copy(update={"calibration_method": fallback.calibration_method(run_dir, PLUG) or
                                            cfg.export.int8.calibration_method})
    images, image_set = calibration_batch(cfg, card, ic.calibration_samples)
    if out_name == a.INT8_ONNX:
        from pipeline.precision.convert import record_calibration

        record_calibration(run_dir, "int8", image_set)
    weights_sha256 = sha256_file(run_dir.file(a.WEIGHTS))
    with scratch_folder(run_dir.file(a.FP32_ONNX)) as scratch:
        fp32_path, quantized = Path(scratch) / "model.qat.fp32.onnx", Path(scratch) / a.INT8_ONNX
        with qat.quantizers_off(model):
            export_onnx(model, torch.from_numpy(images[:2]), fp32_path, opset=ec.opset, exporter=ec.exporter,
                        input_name=spec.input_name, output_name=spec.output_name,
                        dynamic_batch=ec.dynamic_batch, weights_sha256=weights_sha256,
                        accept_trace_warnings=ec.accept_trace_warnings)
        report = int8.quantize(fp32_path, np.ascontiguousarray(images), spec.input_name, ic, quantized, [],
                               list(fp32_nodes))
        graph = onnx.load(str(quantized))
        copied, total = qat.transfer_ranges(template, graph)
        onnx.save(graph, str(quantized))
        provenance.stamp_file(quantized, weights_sha256)
        onnx_io.check(quantized)
        install(quantized, run_dir.file(out_name))
    report.update({"method": "qat", "int8_layers": int8_layers(onnx_io.load(run_dir.file(a.FP32_ONNX)), graph),
                   "quantizer": f"{qat.QUANTIZER}, then {int8.QUANTIZER}",
                   "activation_ranges": f"PTQ's, {copied} of {total} activation Q/DQ nodes"})
    return report


def _layers_line(report: dict, ptq: dict) -> str:
    return (f"{report['int8_nodes']} nodes INT8 ({100 * report['int8_fraction']:.1f}% of the matrix ops; PTQ's "
            f"placement: {ptq['int8_nodes']})")


def _details(cfg: Config, splits, facts: QatTrainResult, simulated: dict, report: dict, ptq: dict, source: str,
             amp: str) -> dict:
    qc = cfg.qat
    return {
        "method": "qat", **facts.to_json(), "source_weights_sha256": source, "amp": amp,
        "recipe": {"lr": qc.lr, "temperature": qc.temperature, "label_weight": qc.label_weight,
                   "freeze_batchnorm": qc.freeze_batchnorm, "optimizer": cfg.train.optimizer,
                   "batch_size": cfg.data.batch_size, "augment": cfg.data.augment},
        "data": {"source": splits.source, "classes": splits.num_classes, "train_images": len(splits.train),
                 "val_images": len(splits.val), **splits.details},
        "quantizer": qat.QUANTIZER, "simulated": simulated,
        "int8": report, "int8_fraction": report["int8_fraction"], "int8_layers": report["int8_layers"],
        "ptq_int8_fraction": ptq["int8_fraction"],
    }


class _CardSpec(dict):
    """The model card's spec where the trainer keeps a spec object (its checkpoints carry ``spec.to_dict()``)."""

    def to_dict(self) -> dict:
        return dict(self)


def int8_layers(fp32_model: onnx.ModelProto, graph: onnx.ModelProto) -> int:
    """The matrix layers (Conv, Gemm, MatMul) of ``graph`` that compute on INT8 inputs."""
    return sum(1 for op, p in int8.node_precisions(fp32_model, graph).values() if op in int8.MATRIX_OPS and p == "int8")


def write_fallback(run_dir: RunDir, source: dict, note: str) -> None:
    """``int8_fallback.json`` naming QAT's graph (every layer PTQ quantizes in INT8; the calibration kept)."""
    method = fallback.calibration_method(run_dir, PLUG)
    payload = {**PLUG.fallback_payload(Raised(), method, note), "method": "qat", "qat": source}
    PLUG.fallback_schema.model_validate(payload)  # what export will read back
    write_json(run_dir.file(PLUG.fallback_file), payload)
