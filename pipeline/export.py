"""The export stage: FP32 ONNX with a dynamic batch axis, checked; then mixed-precision FP16 and INT8 ONNX.

``model.onnx`` comes from ``torch.onnx.export`` (the TorchScript exporter by default: a
ResNet-18 exported with the dynamo exporter once lost all accuracy, pytorch/pytorch#169178;
either way verify is what proves the result). ``model.fp16.onnx`` is the FP32 graph converted
by ModelOpt AutoCast with FP32 inputs and outputs kept, calibrated on real images of the training split;
``model.bf16.onnx`` the same in BF16 (opset 22). ``model.int8.onnx`` is the FP32 graph quantized by
ModelOpt's INT8 PTQ (explicit Q/DQ, FP16 elsewhere; see :mod:`pipeline.precision.int8`), calibrated on
images of the same split (calibration_images.json records which). Each through its plug
(:mod:`pipeline.precision.plugs`).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import onnx
import torch

from pipeline.core import modeling, onnx_io, tasks
from pipeline.core.artifacts import CALIBRATION, CALIBRATION_IMAGES, FP32_ONNX, WEIGHTS
from pipeline.core.data import validation_batch
from pipeline.core.run import RunDir, StageRecord, sha256_file
from pipeline.core.torch_onnx import ACCEPT_KEY, export_onnx
from pipeline.precision import fallback, int8, plugs
from pipeline.training import qat_recipe

if TYPE_CHECKING:  # annotations only
    from pipeline.core.config_schema import Config
    from pipeline.core.model_card import ModelCard

log = logging.getLogger("pipeline")


def fixed_output_dims(model, examples, task: tasks.Task) -> dict[str, tuple[int, ...]]:
    """The dimensions after the batch of the outputs besides the gated one, as the model returns them: a detector's
    ``detections`` are [batch, max_detections, 6] by construction (the task's contract), which the tracer leaves
    symbolic, and a Triton configuration (deploy) needs them."""
    if not task.extra_outputs:
        return {}
    model.eval()
    with torch.no_grad():
        out = model(torch.from_numpy(examples))
    return {name: tuple(int(d) for d in tensor.shape[1:]) for name, tensor in zip(task.extra_outputs, out[1:],
                                                                               strict=True)}


def run(cfg: Config, run_dir: RunDir, record: StageRecord) -> None:
    model, card = modeling.load_trained(cfg, run_dir, "export")
    weights_sha256 = sha256_file(run_dir.file(WEIGHTS))  # what every graph of this export records (the lock is held)
    # An export that does not finish leaves no graph a later stage could take for its output: the derived graphs
    # go first; model.onnx is replaced atomically, and one from other weights is refused by its stamp (provenance).
    for plug in plugs.ORDER:
        run_dir.file(plug.graph).unlink(missing_ok=True)
    run_dir.file(CALIBRATION_IMAGES).unlink(missing_ok=True)
    spec = card.spec
    ec = cfg.export
    examples, _ = validation_batch(cfg, card, 2)
    path = run_dir.file(FP32_ONNX)
    log.info("export: %s -> %s (opset %d, %s exporter)", cfg.model.name, FP32_ONNX, ec.opset, ec.exporter)
    tracer_warnings = export_onnx(model, torch.from_numpy(examples), path, opset=ec.opset, exporter=ec.exporter,
                                  input_name=spec.input_name, output_name=spec.output_name,
                                  dynamic_batch=ec.dynamic_batch, weights_sha256=weights_sha256,
                                  extra_outputs=tasks.of(spec).extra_outputs,
                                  accept_trace_warnings=ec.accept_trace_warnings,
                                  output_dims=fixed_output_dims(model, examples, tasks.of(spec)))
    accepted = [w.text for w in tracer_warnings if w.differs]  # export_onnx refuses them unless the setting is on
    for warned in tracer_warnings[:3]:
        log.warning("export: exporter warning%s: %s", f" accepted ({ACCEPT_KEY})" if warned.differs else "",
                    warned.text)
    exported = onnx.load(str(path))
    record.details.update({
        "exporter": f"torch.onnx.export(dynamo={ec.exporter == 'dynamo'}) {ec.exporter}",
        "torch": torch.__version__,
        "onnx": onnx.__version__,
        "opset": ec.opset,
        "dynamic_batch": ec.dynamic_batch,
        "input": {"name": spec.input_name, "shape": onnx_io.input_shape(exported, spec.input_name)},
        "output": spec.output_name,
        "nodes": len(exported.graph.node),
        "checker": "onnx.checker.check_model(full_check=True) passed",
        "exporter_warnings": [w.text for w in tracer_warnings],
        "accepted_trace_warnings": accepted,  # the graph may differ from the model: accepted by the setting
    })
    record.artifact(FP32_ONNX)

    for plug in plugs.ORDER:
        export_graph(cfg, run_dir, card, record, exported, plug)


def export_graph(cfg: Config, run_dir: RunDir, card: ModelCard, record: StageRecord, exported: onnx.ModelProto,
                 plug) -> None:
    """``model.<precision>.onnx`` when ``export.<precision>.enabled``; without ModelOpt, "skipped: <reason>" in the
    record. The fallback file's raises are kept higher, its names checked against ``model.onnx``."""
    path = run_dir.file(plug.graph)
    if not plug.enabled(cfg):
        path.unlink(missing_ok=True)
        record.details[plug.name] = {"enabled": False, "reason": f"export.{plug.name}.enabled is false"}
        return
    reason = int8.availability()  # ModelOpt: AutoCast and INT8 PTQ alike
    if reason:
        path.unlink(missing_ok=True)
        log.warning("export: %s skipped: %s", plug.label, reason)
        record.details[plug.name] = {"enabled": True, "skipped": reason}
        return
    raised = fallback.read(run_dir, plug, exported)
    source = fallback.qat_source(run_dir, plug)  # tune or qat chose QAT's graph: rebuilt from its checkpoint
    record.details[plug.name] = qat_recipe.rebuild(cfg, run_dir, card, source) if source is not None else \
        plug.write(cfg, run_dir, card, raised)
    record.artifact(plug.graph)
    if run_dir.file(CALIBRATION).exists():
        record.artifact(CALIBRATION)
    if run_dir.file(CALIBRATION_IMAGES).exists():
        record.artifact(CALIBRATION_IMAGES)
