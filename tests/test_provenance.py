"""Provenance acceptance (pipeline/core/provenance.py): a graph is judged only if it names the weights it was
exported from, and they are the run's. Tiny graphs built here; milliseconds."""

from __future__ import annotations

import pytest
from onnx import TensorProto, helper

from pipeline.core import provenance
from pipeline.core.errors import InputError

WEIGHTS = "a" * 64
OTHER = "b" * 64


def graph():
    node = helper.make_node("Identity", ["x"], ["y"])
    return helper.make_model(helper.make_graph([node], "g",
                                               [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                                               [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])]))


def test_a_stamped_graph_names_its_weights_and_a_second_stamp_replaces_the_first():
    model = graph()
    model.metadata_props.add(key="author", value="someone")
    assert provenance.source_weights(model) is None
    provenance.stamp(model, OTHER)
    assert provenance.stamp(model, WEIGHTS) is model
    assert provenance.source_weights(model) == WEIGHTS
    assert [p.key for p in model.metadata_props] == ["author", provenance.KEY]  # one stamp, the rest kept


def test_only_the_runs_own_weights_are_accepted():
    model = provenance.stamp(graph(), WEIGHTS)
    provenance.check_graph(model, "model.onnx", WEIGHTS)
    with pytest.raises(InputError, match=r"model.onnx was exported from other weights \(sha256 aaaaaaaaaaaa…\), not "
                                         r"from the current model.safetensors \(sha256 bbbbbbbbbbbb…\)"):
        provenance.check_graph(model, "model.onnx", OTHER)


@pytest.mark.parametrize("stamp", [None, ""])
def test_an_unstamped_graph_is_refused(stamp):
    model = graph() if stamp is None else provenance.stamp(graph(), stamp)
    with pytest.raises(InputError, match="exported without a record of its weights"):
        provenance.check_graph(model, "model.int8.onnx", WEIGHTS)
    with pytest.raises(InputError):
        provenance.check_graph(model, "model.int8.onnx", "")  # an empty record never matches an empty hash


def test_every_graph_present_is_checked_and_absent_ones_are_skipped():
    good, bad = provenance.stamp(graph(), WEIGHTS), provenance.stamp(graph(), OTHER)
    provenance.check_graphs(WEIGHTS, {"model.onnx": good, "model.fp16.onnx": None})
    with pytest.raises(InputError, match="model.int8.onnx"):
        provenance.check_graphs(WEIGHTS, {"model.onnx": good, "model.fp16.onnx": None, "model.int8.onnx": bad})


def test_stamp_file_rewrites_the_file(tmp_path):
    import onnx

    path = tmp_path / "m.onnx"
    onnx.save(graph(), str(path))
    provenance.stamp_file(path, WEIGHTS)
    assert provenance.source_weights(onnx.load(str(path))) == WEIGHTS


def test_the_refusal_says_what_to_do():
    with pytest.raises(InputError) as caught:
        provenance.check_graph(graph(), "model.onnx", WEIGHTS)
    assert str(caught.value) == ("model.onnx was exported without a record of its weights, not from the current "
                                 "model.safetensors (sha256 aaaaaaaaaaaa…): export did not finish; re-run export")
