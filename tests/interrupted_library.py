"""A stage function whose library turns Ctrl-C into its own exception, as OpenVINO does (issue 30, §3: SIGINT 8 s into
tune, in OpenVINO's model reading, was exit 4 and "failed"). OpenVINO's ONNX frontend calls Python back while it
converts a model (the ``TelemetryExtension`` that ``openvino.convert_model`` adds); a KeyboardInterrupt raised in that
callback comes out of ``convert`` as ``RuntimeError("... KeyboardInterrupt ...")``, with no exception chain.

``stage(cfg, run_dir, record)`` converts a two-node ONNX model with such a callback. On its first call the callback
either sends SIGINT to its own process (``INTERRUPT_HOW=self``) or writes the file ``INTERRUPT_MARKER`` names and
waits for a signal from outside (``INTERRUPT_HOW=wait``)."""

from __future__ import annotations

import os
import signal
import tempfile
import time

import onnx
from onnx import TensorProto, helper


def _model(path: str) -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Add", ["r", "x"], ["y"])]
    onnx.save(helper.make_model(helper.make_graph(nodes, "g", [x], [y]), opset_imports=[helper.make_opsetid("", 18)]),
              path)


def _callback(*_args) -> None:
    if os.environ.get("INTERRUPT_HOW", "self") == "self":
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)  # the handler raises KeyboardInterrupt here
        return
    marker = os.environ["INTERRUPT_MARKER"]
    if not os.path.exists(marker):
        with open(marker, "w") as f:
            f.write(str(os.getpid()))
        time.sleep(60)  # the test's SIGINT arrives while OpenVINO waits on this callback


def stage(cfg, run_dir, record, **options) -> None:
    from openvino.frontend import FrontEndManager, TelemetryExtension

    with tempfile.TemporaryDirectory() as tmp:
        _model(f"{tmp}/m.onnx")
        frontend = FrontEndManager().load_by_framework("onnx")
        frontend.add_extension(TelemetryExtension("test", _callback, _callback, _callback))
        frontend.convert(frontend.load(f"{tmp}/m.onnx"))
    record.details["converted"] = True  # not reached: the callback was interrupted
