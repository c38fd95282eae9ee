"""Which reference should the tensor check of a QAT graph use? (docs/verify.md, "Quantization-aware fine-tuning")

For a run after ``python -m pipeline qat``: the QAT graph (``model.int8.onnx``, executed exactly as ``int8_exact``
does) and a planted broken copy of it (one activation range 16x too wide, the fault of a wrong calibration) are
compared on verify's images with two references: the trained FP32 model (what verify uses) and the QAT model with
its quantizers off (the fine-tuned weights in FP32). Prints, per reference, the gate's statistic (the 99th-percentile
per-image scaled error) of the sound and the broken graph and their ratio: the reference with the larger ratio
separates sound from broken better.

    python scripts/qat_reference.py RUN_DIR [IMAGES]
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import numpy_helper

from pipeline import config as config_mod
from pipeline.core import artifacts as a
from pipeline.core import modeling
from pipeline.core.data import validation_batch
from pipeline.core.run import RunDir
from pipeline.precision import gate, int8, qat
from pipeline.training import qat_recipe
from pipeline.training.checkpoint import load_checkpoint


def _exact(model: onnx.ModelProto, images: np.ndarray, input_name: str) -> np.ndarray:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(int8.exact_model(model).SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    return session.run(None, {input_name: images})[0]


def _broken(model: onnx.ModelProto) -> onnx.ModelProto:
    """The last activation Q/DQ's range 16x too wide (both scales of that pair)."""
    broken = onnx.ModelProto()
    broken.CopyFrom(model)
    inits = {i.name: i for i in broken.graph.initializer}
    dq = [n for n in broken.graph.node if n.op_type == "DequantizeLinear" and inits.get(n.input[1]) is not None
          and list(inits[n.input[1]].dims) == [] and n.input[0] not in inits]
    last = dq[-1]
    q = next(n for n in broken.graph.node if n.output[0] == last.input[0])
    for name in {q.input[1], last.input[1]}:
        value = numpy_helper.to_array(inits[name])
        inits[name].CopyFrom(numpy_helper.from_array((value * 16).astype(value.dtype), name))
    return broken


def main(run_path: str, count: int = 300) -> None:
    run = RunDir(Path(run_path))
    import yaml

    cfg = config_mod.resolve(yaml.safe_load(run.file(a.CONFIG).read_text()))
    trained, card = modeling.load_trained(cfg, run, "qat_reference")
    images, _ = validation_batch(cfg, card, count)
    model, _, card, _, template, _, _ = qat_recipe._prepare(cfg, run, with_data=False)
    qat_recipe._quantize(cfg, card, model, template)
    model.load_state_dict(load_checkpoint(run.file(a.QAT_BEST_CHECKPOINT))["model"])
    qat.sync_weight_ranges(model)
    x = torch.from_numpy(images)
    with torch.no_grad(), qat.quantizers_off(model):
        references = {"trained FP32 model": trained(x).numpy(), "QAT model, quantizers off": model.eval()(x).numpy()}
    graph = onnx.load(str(run.file(a.INT8_ONNX)))
    name = card["spec"]["input_name"]
    candidates = {"QAT graph": _exact(graph, images, name), "planted broken": _exact(_broken(graph), images, name)}
    for ref_name, ref in references.items():
        q99 = {c: float(np.quantile(gate.scaled_errors(ref, out), 0.99)) for c, out in candidates.items()}
        agree = {c: float((out.argmax(1) == ref.argmax(1)).mean()) for c, out in candidates.items()}
        print(f"{ref_name:28s} sound q99 {q99['QAT graph']:.4f} (top-1 {agree['QAT graph']:.3f})  broken q99 "
              f"{q99['planted broken']:.4f} (top-1 {agree['planted broken']:.3f})  ratio "
              f"{q99['planted broken'] / max(q99['QAT graph'], 1e-12):.1f}")


if __name__ == "__main__":
    main(sys.argv[1], *(int(v) for v in sys.argv[2:3]))
