"""What a benchmark row measures (pipeline/core/timings.py): the kind every decision reads, and the one reader of
the labels that files of release 0.1.0 carry instead of a kind."""

import pytest

from pipeline.core.timings import TimingKind, legacy_kind

# Every label release 0.1.0 (commit b015ec5) wrote into benchmark.json, as pipeline/runtime/runners.py made them.
RELEASE_0_1_0_LABELS = {
    "wall-clock, synchronous CPU call": TimingKind.CPU_CALL,
    "GPU compute (CUDA events, one inference queued ahead, device-resident input)": TimingKind.GPU_COMPUTE,
    "GPU compute (CUDA events, one inference queued ahead, device-resident input) with CUDA graphs":
        TimingKind.GPU_COMPUTE_CUDA_GRAPHS,
    "host latency (H2D + compute + D2H)": TimingKind.HOST_LATENCY,
    "host latency (H2D + compute + D2H) with CUDA graphs": TimingKind.HOST_LATENCY_CUDA_GRAPHS,
    "host latency (H2D + compute + D2H), ONNX Runtime CUDA": TimingKind.HOST_LATENCY,
    "GPU compute (CUDA events, one inference queued ahead, device-resident input, buffers bound with "
    "set_tensor_address)": TimingKind.GPU_COMPUTE,
    "host latency (H2D + compute + D2H, pinned host memory, TrtRunner.infer)": TimingKind.HOST_LATENCY,
    "GPU compute (CUDA events, device-resident input) with CUDA graphs": TimingKind.GPU_COMPUTE_CUDA_GRAPHS,
    "host latency (H2D + compute + D2H, pinned host memory) with CUDA graphs": TimingKind.HOST_LATENCY_CUDA_GRAPHS,
    "throughput: 4 async infer requests (PERFORMANCE_HINT=THROUGHPUT), ms per batch": TimingKind.ASYNC_THROUGHPUT,
    "throughput: async infer requests (PERFORMANCE_HINT=THROUGHPUT)": TimingKind.ASYNC_THROUGHPUT,
}


@pytest.mark.parametrize("label, kind", RELEASE_0_1_0_LABELS.items())
def test_every_label_release_0_1_0_wrote_reads_as_its_kind(label, kind):
    assert legacy_kind(label) is kind


def test_the_kinds_of_release_0_1_0_are_distinct_where_its_labels_were_keys():
    """Two labels that were different keys in one run (a backend's GPU compute and host latency rows, an OpenVINO
    batch's latency and throughput rows) stay different keys."""
    assert len({legacy_kind(label) for label in RELEASE_0_1_0_LABELS}) == len(TimingKind)


def test_a_label_no_release_wrote_is_refused_naming_it():
    with pytest.raises(ValueError, match="^timing label 'stopwatch' is not one a pipeline release wrote"):
        legacy_kind("stopwatch")


def test_a_kind_is_its_json_string_and_says_what_decisions_ask():
    import json

    assert json.dumps({"k": TimingKind.ASYNC_THROUGHPUT}) == '{"k": "async_throughput"}'
    assert [k for k in TimingKind if k.is_throughput] == [TimingKind.ASYNC_THROUGHPUT]
    assert {k.clock for k in TimingKind} == {TimingKind.CPU_CALL, TimingKind.GPU_COMPUTE, TimingKind.HOST_LATENCY,
                                              TimingKind.ASYNC_THROUGHPUT}
    assert {k for k in TimingKind if k.cuda_graphs} == {TimingKind.GPU_COMPUTE_CUDA_GRAPHS,
                                                         TimingKind.HOST_LATENCY_CUDA_GRAPHS}
