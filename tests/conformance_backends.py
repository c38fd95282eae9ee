"""Planted backends for the conformance checks (tests/test_conformance.py), found by the child process here by their
``make``'s module and file, as tests/crash_backends.py's are.

* ``onnxrt_fp32`` whose outputs mix rows: each row gets ``MIX`` times the batch's mean row added, as a kernel that
  reduces over the batch axis by mistake would (NVIDIA/TensorRT#4813: errors that depend on the other rows). Alone,
  an image is its own mean, so batch 1 differs from a full batch; reversed, the mean is the same, so only the
  companions arrangement and batch 1 show it.
* ``openvino_int8`` that says its runtime ran every matrix layer in FP32 (an INT8 label over FP32 kernels,
  roboflow/rf-detr#1453), with the real runner's outputs (so only the precision manifest can tell);
* ``fp16_emulation`` over a graph whose every node was put back in FP32 (a "FP16" graph with no FP16 layer).
"""

import dataclasses
import os
from collections import OrderedDict

import numpy as np

from pipeline.runtime import backends

MIX = float(os.environ.get("PLANTED_MIX", "0.05"))


def _mixing(real):
    def make(ctx):
        runner = real.make(ctx)
        infer = runner.infer_impl

        def mixed(feed_dict):
            out = infer(feed_dict)
            return OrderedDict((k, v + MIX * v.mean(axis=0, keepdims=True)) for k, v in out.items())

        runner.infer_impl = mixed
        return runner

    return make


def _fp32_account(real):
    def make(ctx):
        runner = real.make(ctx)
        layers = runner.layers

        def all_fp32(feed):
            return [{**layer, "precision": "fp32"} for layer in layers(feed)]

        runner.layers = all_fp32
        return runner

    return make


TABLE = [dataclasses.replace(backends.by_name("onnxrt_fp32"), make=_mixing(backends.by_name("onnxrt_fp32"))),
         dataclasses.replace(backends.by_name("openvino_int8"), make=_fp32_account(backends.by_name("openvino_int8")))]


def planted(name: str) -> list:
    """backends.TABLE with ``name`` replaced by its planted twin."""
    twin = next(b for b in TABLE if b.name == name)
    return [twin if b.name == name else b for b in backends.TABLE]


def lift_to_fp32(model):
    """``model`` (a low-precision graph) with every tensor in FP32 and no Cast left: ONNX's own float types only."""
    import onnx
    from onnx import numpy_helper

    for init in model.graph.initializer:
        if init.data_type in (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16):
            init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init).astype(np.float32), init.name))
    for node in model.graph.node:
        for attr in node.attribute:
            if node.op_type == "Cast" and attr.name == "to":
                attr.i = onnx.TensorProto.FLOAT
    return model
