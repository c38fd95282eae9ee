"""deploy.json as types: :class:`DeployResult` (the repository deploy wrote, each :class:`ModelEntry`, each
:class:`Refusal` and the engines' :class:`Compatibility`) and, after ``deploy --serve``, :class:`Serve` (each
:class:`ServedModel` with its :class:`ServedCheck` per arrangement, the :class:`ServerInfo`, and the client-side
:class:`ServedTiming` rows with their :class:`ServedTimingMethod`); beside them the two files deploy writes into the
repository: each model's :class:`TritonSidecar` (``pipeline.json``) and the :class:`FilesManifest`
(``pipeline.files.json``).

deploy makes these where it decides (:mod:`pipeline.deploy`: a model entry where the model is written, a refusal
where it is planned; :mod:`pipeline.evaluation.served`: a check where the outputs are judged), and each type's
``to_json`` is the one serialiser of its part: the keys of earlier releases, in their order (a check whose request
failed has no ``scaled_error``/``top1_agreement``; a model not served here no ``precision``/``checks``; a server not
started no ``start_s``: each is written with the keys it was made with). Every reader (the report's deployment
sections) gets deploy.json back through :func:`of` (a payload already read, through the bounded
:func:`pipeline.core.schema.read_json`) or :func:`read` (the file): typed and bounded here, once, so a damaged file is
one :class:`~pipeline.core.errors.InputError`, never a traceback.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, StringConstraints

from pipeline.core import schema

SCHEMA = "pipeline.deploy/1"
SIDECAR_SCHEMA = "pipeline.triton/1"
FILES_SCHEMA = "pipeline.files/1"
MAX_MODELS = 1000  # candidates in the backend table: a few dozen
MAX_ENTRIES = 100_000  # a folder with more entries than this is no repository deploy wrote
MAX_ROWS = 1000  # tensors of a model, checks, timing rows

Text = Annotated[str, StringConstraints(max_length=1 << 16)]
Name = Annotated[str, StringConstraints(max_length=200)]
Verdict = Annotated[str, StringConstraints(max_length=40)]  # a Status's value
Sha256 = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
Rows = Field(max_length=MAX_ROWS)


class _Part(schema.Open):
    """A part written with the keys it was made with (read back: the keys the file has)."""

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(exclude_unset=True)


# --------------------------------------------------------------------------- the repository written


class TensorEntry(_Part):
    """One input or output of a model as its ``config.pbtxt`` declares it
    (:class:`pipeline.runtime.serving.triton.Tensor`)."""

    name: Name
    dtype: Name  # a Triton DataType name: "TYPE_FP32"
    dims: Annotated[list[int], Field(max_length=64)]  # -1: dynamic


class ModelEntry(_Part):
    """One model folder written: the candidate and the verdict it was deployed on, how Triton runs it, its batching,
    the precision verify gated and the one the stock backend computes in, the releases that load it, its tensors."""

    name: Name
    candidate: Name
    verdict: Verdict | None
    verdict_sha256: Sha256 | None
    platform: Name | None  # "tensorrt_plan", or None with a backend
    backend: Name | None  # "onnxruntime", "openvino", or None with a platform
    device: Name
    max_batch_size: int
    preferred_batch_sizes: Annotated[list[int], Rows]
    # the four below: absent in a deploy.json written before deploy recorded them (read back empty)
    parameters: dict[str, Text] = Field(default_factory=dict, max_length=64)
    gated_precision: Name | None = None
    runs_in: Text = ""
    loads_in: Text = ""
    inputs: Annotated[list[TensorEntry], Rows]
    outputs: Annotated[list[TensorEntry], Rows]

    @property
    def runs_on(self) -> str | None:
        """What Triton runs it with: its platform, else its backend."""
        return self.platform or self.backend

    @property
    def tensors(self) -> list[TensorEntry]:
        return [*self.inputs, *self.outputs]


class Refusal(_Part):
    """A deployable candidate not written: verify's verdict on it (None: none reached) and why."""

    candidate: Name
    verdict: Verdict | None
    reason: Text


class Compatibility(_Part):
    """The TensorRT of the engines deployed (None: no engine) and the Triton releases that run them."""

    tensorrt: Name | None
    releases: Text
    target_release: Name | None  # deploy.triton_release
    source: Text


# --------------------------------------------------------------------------- served here (deploy --serve)


class ServedCheck(_Part):
    """One arrangement's outputs judged by the gate (or the request that failed: then no numbers)."""

    arrangement: Name
    batch: int
    concurrency: int
    status: Verdict
    scaled_error: float | None = None
    top1_agreement: float | None = None
    reason: Text = ""


class ServedModel(_Part):
    """One model as served: the precision verify gated and the one it was served in, every arrangement's check, its
    verdict and why; a model not served here (a GPU's) has only its name, verdict (skipped) and reason."""

    model: Name
    precision: Name | None = None
    served_precision: Name | None = None
    checks: list[ServedCheck] = Field(default_factory=list, max_length=MAX_ROWS)
    verdict: Verdict
    reason: Text = ""


class ServerInfo(_Part):
    """The server in front of the stock backends: Triton's version (None: not Triton, or not started), seconds until
    ready (only when started), and what it is."""

    triton: Name | None = None
    start_s: float | None = None
    binary: Text


class ServedTimingMethod(_Part):
    """perf_analyzer's method as used (:class:`pipeline.runtime.serving.triton_serve.PerfWindows`)."""

    warmup_s: float
    window_s: float
    stability: float
    max_trials: int


class ServedTiming(_Part):
    """One client-side (or in-process) timing row (:class:`pipeline.runtime.serving.triton_serve.Measurement`)."""

    where: Name  # "in-process", "http", "grpc"
    concurrency: int
    requests: int
    p50_ms: float
    p90_ms: float
    p95_ms: float
    p99_ms: float
    mean_ms: float
    throughput_per_s: float
    windows: int
    stable: bool


class Serve(_Part):
    """What ``deploy --serve`` found: the server, the machine, every model's checks, the verdict over them and why,
    and the model timed from the client's side."""

    server: ServerInfo
    cpu: Text
    cores: int
    images: int
    reference: Text
    models: Annotated[list[ServedModel], Field(max_length=MAX_MODELS)]
    verdict: Verdict
    reason: Text
    timed: Name | None = None
    method: ServedTimingMethod
    timings: Annotated[list[ServedTiming], Rows]

    @property
    def in_process(self) -> ServedTiming | None:
        """The timing row of the stock backend called without the server (the overhead's baseline)."""
        return next((t for t in self.timings if t.where == "in-process"), None)


class DeployResult(_Part):
    """deploy.json: the repository written, its models, the candidates refused, the engines' releases, and (after
    ``--serve``) what was served."""

    schema_: Annotated[str, StringConstraints(max_length=100)] = Field(alias="schema")
    created: Name
    target: Name
    repository: Text
    models: Annotated[list[ModelEntry], Field(max_length=MAX_MODELS)]
    refused: Annotated[list[Refusal], Field(max_length=MAX_MODELS)]
    compatibility: Compatibility
    serve: Serve | None = None

    def to_json(self) -> dict[str, Any]:
        """deploy.json as every release wrote it (``serve`` only after ``--serve``)."""
        unserved = {"serve"} if self.serve is None else set()
        return self.model_dump(exclude_unset=True, by_alias=True, exclude=unserved)


# --------------------------------------------------------------------------- the files in the repository


class TritonSidecar(schema.Strict):
    """A model folder's ``pipeline.json``: the verdict it was deployed on, the sha256 that verdict is bound to, the
    run it came from and every file of the folder with its sha256."""

    schema_: str = Field(alias="schema")
    candidate: Name
    verdict: Verdict | None
    verdict_sha256: Sha256 | None
    artifact: Text
    run: Text
    precision: Name | None
    device: Name
    files: Annotated[dict[str, Sha256], Field(max_length=MAX_ENTRIES)]

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True)


class FilesManifest(schema.Strict):
    """``pipeline.files.json`` at the repository's root: every file deploy wrote there, with its sha256."""

    schema_: str = Field(alias="schema", pattern=f"^{FILES_SCHEMA}$")
    files: dict[str, str] = Field(max_length=MAX_ENTRIES)

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True)


# --------------------------------------------------------------------------- the one reader


def of(payload: Any, where: str | Path = "deploy.json") -> DeployResult:
    """The typed deploy.json of a payload already read (the report's, through the bounded reader)."""
    return schema.validate(payload, DeployResult, where, "deploy report")


def read(path: str | Path) -> DeployResult:
    """deploy.json at ``path``, typed and bounded (one :class:`~pipeline.core.errors.InputError` when damaged)."""
    return schema.read_json(path, DeployResult, "deploy report")
