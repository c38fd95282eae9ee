"""One runner contract for verify and benchmark: Polygraphy's.

A runner is a context manager with ``infer(feed_dict) -> OrderedDict[name, array]`` and a
``name``. ONNX Runtime and TensorRT use Polygraphy's own runners; PyTorch and the strict FP16
emulation get small runners here, because Polygraphy's PyTorch runner is unusable (it returns
a tuple, never sets its timing and hard-codes ``.cuda()``).

Engines are only ever deserialized through :func:`pipeline.build.load_engine_bytes`, which
checks the sidecar first.
"""

from __future__ import annotations

import copy
import time
from collections import OrderedDict
from pathlib import Path

import numpy as np
from polygraphy.backend.base import BaseRunner
from polygraphy.common import TensorMetadata

# Polygraphy prints INFO lines for every session and comparison; the pipeline reports itself.
from polygraphy.logger import G_LOGGER

G_LOGGER.module_severity = G_LOGGER.CRITICAL


class TorchRunner(BaseRunner):
    """Runs an ``nn.Module`` (eval mode, no grad), optionally under autocast, on CPU or CUDA."""

    def __init__(self, model, *, name: str, input_name: str, output_name: str, input_shape: tuple,
                 device: str = "cpu", autocast_dtype=None, channels_last: bool = False):
        super().__init__(name=name)
        self.model = model
        self.input_name = input_name
        self.output_name = output_name
        self.input_shape = input_shape
        self.device = device
        self.autocast_dtype = autocast_dtype
        self.channels_last = channels_last

    def activate_impl(self):
        import torch

        self.model = self.model.to(self.device).eval()
        if self.channels_last:
            self.model = self.model.to(memory_format=torch.channels_last)

    def get_input_metadata_impl(self):
        return TensorMetadata().add(self.input_name, dtype=np.float32, shape=(None, *self.input_shape))

    def infer_impl(self, feed_dict):
        import torch

        x = feed_dict[self.input_name]
        x = torch.as_tensor(x).to(self.device)
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        start = time.perf_counter()
        with torch.inference_mode(), torch.autocast(
            x.device.type, dtype=self.autocast_dtype or torch.float32, enabled=self.autocast_dtype is not None
        ):
            out = self.model(x)
        out = out.float()
        if out.device.type == "cuda":
            torch.cuda.synchronize()
        self.inference_time = time.perf_counter() - start
        return OrderedDict([(self.output_name, out.cpu().numpy())])

    def deactivate_impl(self):
        pass


class ReferenceRunner(BaseRunner):
    """``onnx.reference.ReferenceEvaluator`` over a model: NumPy semantics, FP16 computed in FP16."""

    def __init__(self, model, *, name: str):
        super().__init__(name=name)
        self.model = model

    def activate_impl(self):
        from onnx.reference import ReferenceEvaluator

        self.evaluator = ReferenceEvaluator(self.model)
        initializers = {t.name for t in self.model.graph.initializer}
        self.inputs = [i for i in self.model.graph.input if i.name not in initializers]
        self.output_names = [o.name for o in self.model.graph.output]

    def get_input_metadata_impl(self):
        meta = TensorMetadata()
        for value in self.inputs:
            dims = [d.dim_value if d.HasField("dim_value") else None for d in value.type.tensor_type.shape.dim]
            meta.add(value.name, dtype=np.float32, shape=dims)
        return meta

    def infer_impl(self, feed_dict):
        start = time.perf_counter()
        outputs = self.evaluator.run(None, dict(feed_dict))
        self.inference_time = time.perf_counter() - start
        return OrderedDict((n, np.asarray(o)) for n, o in zip(self.output_names, outputs))

    def deactivate_impl(self):
        del self.evaluator


def onnxrt_runner(model: str | Path | bytes, *, name: str, providers: list[str] | None = None):
    """Polygraphy's ``OnnxrtRunner`` over ``SessionFromOnnx`` (a path or serialized model)."""
    from polygraphy.backend.onnxrt import OnnxrtRunner, SessionFromOnnx

    source = str(model) if isinstance(model, Path) else model
    return OnnxrtRunner(SessionFromOnnx(source, providers=providers or ["cpu"]), name=name)


def ort_session_uses(session_or_runner, provider: str) -> bool:
    sess = getattr(session_or_runner, "sess", session_or_runner)
    return provider in sess.get_providers()


def collect(runner, feeds: list[dict]) -> list[OrderedDict]:
    """Run ``runner`` over every feed; outputs are copied (runners may reuse their buffers)."""
    outputs = []
    with runner:
        for feed in feeds:
            out = runner.infer(feed)
            outputs.append(OrderedDict((k, np.array(copy.deepcopy(_to_numpy(v)))) for k, v in out.items()))
    return outputs


def _to_numpy(value):
    if hasattr(value, "detach"):
        return value.detach().cpu().numpy()
    return value
