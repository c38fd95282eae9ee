"""Localisation's node selection (pipeline/runtime/profiling/localize_rules.py) against an oracle that walks the graph
in order.

Issue 46: a planted defect that took only the INT8 nodes as computing below FP32 (dropping the FP16 regions ModelOpt
leaves between quantized layers) survived the suite. Fast (no model): the mutation command runs this file.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.core.check_results import NodeError
from pipeline.runtime.profiling import localize_rules

PRECISIONS = ("fp32", "fp16", "bf16", "int8")


@st.composite
def graphs(draw):
    """Nodes in graph order, each with a precision; rows for some of them (any order), each over tolerance or not."""
    n = draw(st.integers(0, 12))
    names = [f"n{i}" for i in range(n)]
    precisions = {name: ("MatMul", draw(st.sampled_from(PRECISIONS))) for name in names}
    compared = draw(st.permutations(names))[:draw(st.integers(0, n))]
    rows = [NodeError(name=name, exceeds=draw(st.booleans())) for name in compared]
    return names, precisions, rows


def oracle(names, precisions, rows):
    by_name = {r.name: r for r in rows}
    for name in names:  # graph order
        if name in by_name and by_name[name].exceeds and precisions[name][1] != "fp32":
            return by_name[name]
    return None


@settings(max_examples=150, deadline=None)
@given(graphs())
def test_the_first_lowered_node_over_tolerance_in_graph_order(graph):
    names, precisions, rows = graph
    order = {name: i for i, name in enumerate(names)}
    lowered = localize_rules.lowered(precisions)
    assert lowered == {name for name in names if precisions[name][1] != "fp32"}
    assert localize_rules.first_lowered_over(rows, lowered, order) == oracle(names, precisions, rows)


def test_an_fp16_region_counts_as_lowered_before_a_later_int8_node():
    precisions = {"conv": ("Conv", "int8"), "add": ("Add", "fp16"), "gemm": ("Gemm", "int8"), "out": ("Relu", "fp32")}
    order = {name: i for i, name in enumerate(precisions)}
    rows = [NodeError(name="gemm", exceeds=True), NodeError(name="out", exceeds=True),
            NodeError(name="add", exceeds=True), NodeError(name="conv", exceeds=False)]
    lowered = localize_rules.lowered(precisions)
    assert lowered == {"conv", "add", "gemm"}
    assert localize_rules.first_lowered_over(rows, lowered, order).name == "add"
    assert localize_rules.first_lowered_over(rows[1:2], lowered, order) is None  # only an FP32 node over
    assert localize_rules.first_lowered_over([], lowered, order) is None
