"""benchmark.json's rows as types: :class:`BenchmarkRow` (one timed backend, batch size and timing kind) and
:class:`SkippedRow` (one that could not be timed, and why); beside them what else benchmark measures: a TensorRT
row's :class:`TrtexecCheck`, the per-layer :class:`Profile`s, the :class:`Roofline` and OpenVINO's
:class:`CrossCheck` (each made where it is measured, written by its own ``to_json``).

The benchmark stage makes these records where it measures (:mod:`pipeline.benchmark`), and :func:`to_json` is the
one serialiser of its ``results`` and ``skipped`` lists. Every reader (benchmark's headline, ratios, contests and
plots, the trtexec and benchmark_app cross-checks, the per-layer profiles, the report's pages, deploy's throughput
curves, baseline and compare) gets them back through :func:`read` (a file) or :func:`rows_of` (a payload already
read), typed and bounded here once: benchmark.json is a file a user may edit, so a damaged row is one
:class:`~pipeline.core.errors.InputError`, never a traceback.

A row is keyed by its backend, batch size and :class:`~pipeline.core.timings.TimingKind`; its ``timing`` label is for
people. Rows written before the kind was recorded (release 0.1.0) get it from their label here, once
(:func:`pipeline.core.timings.legacy_kind`). The JSON keeps the shape of earlier releases: the same keys, in the same
order (``trtexec`` only on the rows trtexec ran beside).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, StringConstraints, model_validator

from pipeline.core import schema, timings
from pipeline.core.timings import TimingKind

MAX_ROWS = 4096
MAX_SAMPLES = 1_000_000
MAX_BATCH = 1 << 20
# A timed run lasts at least a nanosecond and at most an hour: 1e-300 ms (ratios of 300 digits) or 1e300 ms (every
# latency check silently disabled) is no duration a clock measured.
MIN_MS, MAX_MS = 1e-6, 3.6e6

Name = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.\-]{1,64}$")]  # a backend name
Text = Annotated[str, StringConstraints(max_length=4096)]
Reason = Annotated[str, StringConstraints(max_length=1 << 16)]  # an error's one line, a crash with its log's path
Millis = Annotated[float, Field(ge=MIN_MS, le=MAX_MS, allow_inf_nan=False)]
BatchSize = Annotated[int, Field(ge=1, le=MAX_BATCH)]
Ratio = Annotated[float, Field(gt=0, allow_inf_nan=False)]  # a ratio of two times
Kind = Annotated[TimingKind, Field(strict=False)]  # its JSON string
Num = int | float  # a setting as the config gave it (1 stays 1, not 1.0)


def kind_from_label(row: Any) -> Any:
    """A row without ``timing_kind`` (written by release 0.1.0) gets the kind its ``timing`` label names."""
    if isinstance(row, dict) and row.get("timing_kind") is None and isinstance(row.get("timing"), str):
        return {**row, "timing_kind": timings.legacy_kind(row["timing"])}
    return row


class Latency(schema.Open):
    """A row's latency statistics over every timed run (ms; ms per batch for an async-throughput row)."""

    mean: float
    std: float
    cv: float
    min: float
    max: float
    p50: float
    p90: float
    p95: float
    p99: float


class Stop(schema.Open):
    """Runs taken, the median, its 95 % interval and its coverage, and why timing stopped
    (:func:`pipeline.runtime.speed.stopping.record`)."""

    runs: int
    reason: Text
    median_ms: float | None = None
    interval_ms: list[float] | None = None
    relative_halfwidth: float | None = None
    coverage: float | None = None


class TrtexecCheck(schema.Open):
    """trtexec on the same engine beside a TensorRT row (:mod:`pipeline.runtime.speed.trtexec`): its statistics and the
    relative difference of the p50s with the flag, an ``error``, or why it was ``not_run`` (another TensorRT
    release). Written with the keys it was made with."""

    command: Text | None = None
    metric: Text | None = None
    tensorrt_major: int | None = None
    tensorrt: Text | None = None
    error: Reason | None = None
    not_run: Reason | None = None
    p50: float | None = None
    p90: float | None = None
    p99: float | None = None
    mean: float | None = None
    iterations: int | None = None
    times_json: Text | None = None
    profile_json: Text | None = None
    difference: float | None = None
    flag: bool | None = None

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(exclude_unset=True)


class BenchmarkRow(schema.Open):
    """One backend timed at one batch size one way: what benchmark measured, the verdict it carries, and the ratio to
    eager FP32 of the same kind (``vs_eager``, set once every row is measured)."""

    backend: Name
    precision: Text | None
    device: Text
    batch_size: BatchSize
    timing: Text  # the label, for people; decisions read timing_kind
    timing_kind: Kind
    latency_ms: Latency
    throughput_per_s: float
    iterations: int
    trials: list[dict[str, Any]]
    stop: Stop
    first_run_ms: float | None
    cv_warning: bool
    cuda_graphs: bool
    verify: Text
    note: Text
    workaround: Text | None
    samples_ms: Annotated[list[Millis], Field(max_length=MAX_SAMPLES)]  # every timed run: compare bootstraps them
    accuracy: float | None = None  # verify's, for the artifact timed here
    deployable: bool = False  # may be named "fastest that passed"
    trtexec: TrtexecCheck | None = None  # trtexec on the same engine (pipeline.runtime.speed.trtexec); absent: not run
    vs_eager: float | None = None
    # vs_eager's 95 % bootstrap interval over the two rows' runs (timed apart); absent where a side has no runs
    vs_eager_interval: Annotated[list[Ratio], Field(min_length=2, max_length=2)] | None = None

    _legacy = model_validator(mode="before")(kind_from_label)

    @property
    def key(self) -> tuple[str, int, TimingKind]:
        """What compare matches rows on: the label is left out, so rewording it changes no comparison."""
        return self.backend, self.batch_size, self.timing_kind

    @property
    def is_throughput(self) -> bool:
        """An async-throughput row: its "latency" is time per batch amortised over requests in flight."""
        return self.timing_kind.is_throughput

    def to_json(self) -> dict[str, Any]:
        """The row as benchmark.json holds it (``trtexec`` only where it ran)."""
        out = self.model_dump(exclude={"trtexec"} | (set() if self.vs_eager_interval else {"vs_eager_interval"}))
        if self.trtexec is None:
            return out
        keys = list(out)
        cut = keys.index("vs_eager") if "vs_eager" in keys else len(keys)
        return {**{k: out[k] for k in keys[:cut]}, "trtexec": self.trtexec.to_json(),
                **{k: out[k] for k in keys[cut:]}}


class SkippedRow(schema.Open):
    """A backend (at a batch size, one timing) that was not timed: why, and a crashed child's log."""

    backend: Name
    batch_size: BatchSize | None = None
    timing: Text | None = None
    timing_kind: Kind | None = None
    reason: Reason
    log: Text | None = None
    log_tail: list[Reason] | None = None

    def to_json(self) -> dict[str, Any]:
        """The row as benchmark.json holds it: only the keys it has."""
        return self.model_dump(exclude_none=True)


# --------------------------------------------------------------------------- per-layer profiles


class Group(schema.Open):
    """Layers grouped by a key (their type, the precision they ran in, both): how many, their time and its share."""

    name: Text
    count: int
    time_us: float
    share: float | None = None


class ProfiledLayer(schema.Open):
    """One layer as its runtime ran it (:class:`pipeline.runtime.profiling.layer_account.Layer`)."""

    name: Text
    kind: Text
    precision: Text
    matrix: bool
    kernel: Text = ""
    time_us: float | None = None


class SlowLayer(ProfiledLayer):
    share: float | None = None


class ProfileSummary(schema.Open):
    """One inference's profile (:func:`pipeline.runtime.profiling.layer_profile.summarise`)."""

    layers: int
    timed_layers: int
    total_us: float | None
    by_kind: list[Group]
    by_precision: list[Group]
    by_kind_precision: list[Group]
    matrix_by_precision: list[Group]
    unfused: list[Group]
    unfused_share: float | None
    matrix_shares: dict[str, float]
    slowest: list[SlowLayer]


class Profile(schema.Open):
    """benchmark.json's ``profiles`` entry: one CPU artifact at one batch size, layer by layer."""

    backend: Name
    precision: Text | None
    batch_size: BatchSize
    source: Text
    summary: ProfileSummary
    layers: Annotated[list[ProfiledLayer], Field(max_length=MAX_ROWS * 16)]

    def to_json(self) -> dict[str, Any]:
        return self.model_dump()


# --------------------------------------------------------------------------- the roofline


class Machine(schema.Open):
    vendor: Text
    family: int
    model_name: Text
    mhz: float
    mhz_source: Text
    cores: int
    flags: list[Text]


class PeakEntry(schema.Open):
    """One precision's peak (:class:`pipeline.runtime.profiling.roofline.Peak`)."""

    precision: Text
    flops_per_cycle: int
    unit: Text
    source: Text
    gflops: float


class Macs(schema.Open):
    per_image: int
    source: Text
    layers: list[dict[str, Any]]


class RooflineRow(schema.Open):
    """One CPU row's achieved rate (``2 * MACs * batch / p50``) and its fraction of its precision's peak."""

    backend: Name
    batch_size: BatchSize
    timing: Text
    peak_precision: Text
    p50_ms: float | None
    achieved_gflops: float | None
    peak_gflops: float
    fraction: float | None
    fraction_of_fp32: float | None


class Roofline(schema.Open):
    """benchmark.json's ``roofline`` (:func:`pipeline.runtime.profiling.roofline.section`)."""

    machine: Machine
    peaks: dict[str, PeakEntry]
    macs: Macs
    rows: list[RooflineRow]

    def to_json(self) -> dict[str, Any]:
        return self.model_dump()


# --------------------------------------------------------------------------- OpenVINO's benchmark_app beside ours


class Interval(schema.Open):
    """A per-round ratio's geometric mean and its interval (:meth:`pipeline.core.speed_claims.Ratio.to_json`)."""

    estimate: float
    low: float
    high: float
    rounds: int
    confidence: float | None = None


class CrossCheckRow(schema.Open):
    """One OpenVINO row beside benchmark_app's run of the same IR (:mod:`pipeline.runtime.speed.benchmark_app`): an
    error, one run beside the stage's timing, or both alternated in interleaved rounds (``rounds``, ``interval``,
    ``agreement``). Written with the keys it was made with."""

    backend: Name
    batch_size: BatchSize
    mode: Text
    error: Reason | None = None
    ours: float | None = None
    benchmark_app: dict[str, Any] | None = None  # benchmark_app's own report
    rounds: int | None = None
    ratio: float | None = None
    interval: Interval | None = None
    agreement: Text | None = None  # "agree", "far apart", "undecided"
    flagged: bool | None = None
    ours_per_round: list[float] | None = None
    benchmark_app_per_round: list[float] | None = None
    summary: Text | None = None

    @property
    def said(self) -> str:
        """What the check says: its agreement, else (one run beside ours) far apart when flagged."""
        return self.agreement or ("far apart" if self.flagged else "agree")

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(exclude_unset=True)


class CrossCheck(schema.Open):
    """benchmark.json's ``benchmark_app``: the tool, its seconds per run, the flag's band and each row checked; or
    why it was skipped."""

    skipped: Reason | None = None
    tool: Text | None = None
    seconds: float | None = None
    flag_ratio: float | None = None
    rows: list[CrossCheckRow] | None = None

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(exclude_unset=True)


class BenchmarkMethod(schema.Open):
    """How benchmark timed every row (benchmark.json's ``method``: the config's ``benchmark`` settings, the stopping
    rule's confidence, the method in words, the interval and the percentiles). Written with the keys it was made
    with, in this order."""

    kind: Text | None = None  # benchmark.method: adaptive | fixed
    warmup_s: Num | None = None
    min_iterations: int | None = None
    min_duration_s: Num | None = None
    trials: int | None = None
    min_runs: int | None = None
    target_halfwidth: Num | None = None
    max_row_s: Num | None = None
    confidence: Num | None = None
    cv_warn: Num | None = None
    described: Text | None = None
    interval: Text | None = None
    percentiles: Text | None = None

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(exclude_unset=True)


class Gpu(schema.Open):
    """The GPU benchmark ran on (:func:`pipeline.core.env.gpu_info`): its name first; its other facts are kept as
    written."""

    name: Text | None = None


class BenchmarkEnvironment(schema.Open):
    """The machine and software benchmark ran on (benchmark.json's ``environment``: :func:`pipeline.core.env.collect`'s
    facts in its order, and the threads the CPU backends were given). Written with the keys it was made with."""

    python: Text | None = None
    platform: Text | None = None
    cpu: Text | None = None
    cpu_cores: int | None = None
    cpu_native_bf16: bool | None = None
    cpu_flags_simulated: Text | None = None
    torch: Text | None = None
    torch_threads: int | None = None
    onnx: Text | None = None
    onnxruntime: Text | None = None
    onnxruntime_providers: Annotated[list[Text], Field(max_length=64)] | None = None
    polygraphy: Text | None = None
    modelopt: Text | None = None
    tensorrt: Text | None = None
    openvino: Text | None = None
    gpu: Gpu | None = None
    threads: int | None = None

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(exclude_unset=True)


class RowChoice(schema.Open):
    """Which backends benchmark timed (benchmark.json's ``rows``: :class:`pipeline.benchmark.Rows` as written)."""

    chosen: Text | None = None
    timed: Annotated[list[Text], Field(max_length=MAX_ROWS)] = []
    left_out: Annotated[list[Text], Field(max_length=MAX_ROWS)] = []
    how: Text = ""
    throughput_batches: Annotated[list[int], Field(max_length=MAX_ROWS)] = []


class Facts(schema.Open):
    """How benchmark timed its rows and on what: benchmark.json's ``method``, ``environment`` and ``rows`` (the
    report's benchmark section reads them; its other keys are kept, not read)."""

    method: BenchmarkMethod
    environment: BenchmarkEnvironment
    rows: RowChoice = RowChoice()


class Rows(schema.Open):
    """benchmark.json's rows, profiles, roofline and cross-check (its other keys are kept, not read)."""

    results: Annotated[list[BenchmarkRow], Field(default_factory=list, max_length=MAX_ROWS)]
    skipped: Annotated[list[SkippedRow], Field(default_factory=list, max_length=MAX_ROWS)]
    profiles: Annotated[list[Profile] | None, Field(default=None, max_length=MAX_ROWS)]
    roofline: Roofline | None = None
    benchmark_app: CrossCheck | None = None


def to_json(rows: list[BenchmarkRow] | list[SkippedRow]) -> list[dict[str, Any]]:
    """benchmark.json's ``results`` or ``skipped``: the one serialiser of its rows."""
    return [row.to_json() for row in rows]


def rows_of(payload: Any, where: str | Path = "benchmark.json") -> Rows:
    """The typed rows of a benchmark payload already read (the report's, benchmark's own before it writes)."""
    return schema.validate(payload, Rows, where, "benchmark report")


def facts_of(payload: Any, where: str | Path = "benchmark.json") -> Facts:
    """The method, environment and row choice of a benchmark payload already read, typed and bounded."""
    return schema.validate(payload, Facts, where, "benchmark report")


def read(path: str | Path) -> Rows:
    """benchmark.json's rows at ``path`` (the caller checked that benchmark wrote it), typed and bounded."""
    return schema.read_json(path, Rows, "benchmark report")
