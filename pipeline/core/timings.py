"""What a benchmark row measures, as an identity: :class:`TimingKind`. A row's prose label (``timing`` in
benchmark.json, "host latency (H2D + compute + D2H, pinned host memory, TrtRunner.infer)") is for people; every
decision that asks "which kind of timing is this" (compare's row keys, the async-throughput rows benchmark's
headline keeps apart, the ratio to eager FP32 of the same kind) reads the kind. Rewording a label changes no
decision.

Rows written before the kind was recorded (benchmark.json and baseline bundles of earlier releases) carry the label
only: :func:`legacy_kind` reads those labels, once, at the schema layer that reads such a file.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class TimingKind(StrEnum):
    """One way of timing one inference. A StrEnum, so a kind is its own JSON string."""

    CPU_CALL = "cpu_call"  # the wall clock around one synchronous call on the host
    GPU_COMPUTE = "gpu_compute"  # CUDA events around the device's work, the input already on the device
    GPU_COMPUTE_CUDA_GRAPHS = "gpu_compute_cuda_graphs"  # the same, replaying a captured CUDA graph
    HOST_LATENCY = "host_latency"  # host clock around H2D copy + compute + D2H copy
    HOST_LATENCY_CUDA_GRAPHS = "host_latency_cuda_graphs"  # the same, the compute a captured CUDA graph
    ASYNC_THROUGHPUT = "async_throughput"  # several requests in flight: ms per batch amortised, not a latency

    @property
    def is_throughput(self) -> bool:
        """Whether the row's "latency" is time per batch amortised over requests in flight."""
        return self is TimingKind.ASYNC_THROUGHPUT

    @property
    def on_gpu(self) -> bool:
        """Whether CUDA events time the device's work only (no host copies)."""
        return self in (TimingKind.GPU_COMPUTE, TimingKind.GPU_COMPUTE_CUDA_GRAPHS)

    @property
    def cuda_graphs(self) -> bool:
        return self in (TimingKind.GPU_COMPUTE_CUDA_GRAPHS, TimingKind.HOST_LATENCY_CUDA_GRAPHS)

    @property
    def clock(self) -> TimingKind:
        """What is timed, CUDA graphs or not: the kind without its graphs (rows of one clock are alike enough to
        take a ratio of, as benchmark's ``vs_eager`` does)."""
        return {TimingKind.GPU_COMPUTE_CUDA_GRAPHS: TimingKind.GPU_COMPUTE,
                TimingKind.HOST_LATENCY_CUDA_GRAPHS: TimingKind.HOST_LATENCY}.get(self, self)


@dataclass(frozen=True)
class Timing:
    """A runner's timer's name: its kind (what decisions read) and its label (what people read)."""

    kind: TimingKind
    label: str


# --------------------------------------------------------------------------- compatibility

# The label prefixes of rows written before the kind was recorded (up to this release's labels), in the order
# they are tried: the first that starts the label gives its kind; "with CUDA graphs" at the end, its graphs twin.
_LEGACY_PREFIXES = (
    ("wall-clock", TimingKind.CPU_CALL),
    ("throughput", TimingKind.ASYNC_THROUGHPUT),
    ("GPU compute", TimingKind.GPU_COMPUTE),
    ("host latency", TimingKind.HOST_LATENCY),
)
_GRAPHS = {TimingKind.GPU_COMPUTE: TimingKind.GPU_COMPUTE_CUDA_GRAPHS,
           TimingKind.HOST_LATENCY: TimingKind.HOST_LATENCY_CUDA_GRAPHS}


def legacy_kind(label: str) -> TimingKind:
    """The kind of a row that has only its label (a file written before the kind was recorded). Raises
    ``ValueError`` for a label no release wrote."""
    kind = next((k for prefix, k in _LEGACY_PREFIXES if label.startswith(prefix)), None)
    if kind is None:
        raise ValueError(f"timing label {label[:80]!r} is not one a pipeline release wrote; its kind is unknown")
    return _GRAPHS.get(kind, kind) if label.endswith("with CUDA graphs") else kind
