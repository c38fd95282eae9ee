"""Which node localisation names (pure: rows and precisions in, a row out; :mod:`pipeline.runtime.profiling.localize`
runs the graphs). In the mutation command's scope (scripts/mutation.sh), with tests/test_localize_rules.py."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pipeline.core.check_results import NodeError

FP32 = "fp32"


def lowered(precisions: Mapping[str, tuple[str, str]]) -> set[str]:
    """The nodes that compute below FP32, whatever the lower precision (INT8, and the FP16 or BF16 regions ModelOpt and
    AutoCast leave): ``precisions`` is a plug's ``node_precisions``, ``{node: (op type, precision)}``."""
    return {name for name, (_, precision) in precisions.items() if precision != FP32}


def first_lowered_over(rows: Sequence[NodeError], lowered_nodes: set[str],
                       order: Mapping[str, int]) -> NodeError | None:
    """The row of the first node, in graph order, that computes below FP32 and is over tolerance (``exceeds``);
    None when there is none (then the first node over tolerance stands)."""
    over = [r for r in rows if r.exceeds and r.name in lowered_nodes]
    return min(over, key=lambda r: order[r.name]) if over else None
