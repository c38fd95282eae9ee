"""What one verify run judges and on what: a candidate's :class:`Check` and the :class:`Evidence` every candidate is
compared on. The bottom layer's types, so that the evaluation that fills them and the reports that print them share
one definition (``pipeline.core.verdicts`` folds them into a verdict)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from pipeline.core.check_results import CandidateResult, Judgement, TaskCheck, TensorCheck

if TYPE_CHECKING:  # annotations only: the bottom layer does not import NumPy at start-up
    import numpy as np


class CheckedBackend(Protocol):
    """What a check reads of its backend table entry (``pipeline.runtime.backends.Backend``)."""

    @property
    def verify_name(self) -> str: ...

    @property
    def precision(self) -> str: ...

    @property
    def artifact(self) -> str | None: ...

    @property
    def graph(self) -> str | None: ...  # the precision whose graph it runs (None: FP32 or the reference)

    @property
    def claims(self) -> str | None: ...  # the lower precision it claims to compute in (the precision manifest)

    @property
    def deploys(self) -> bool: ...  # a deployment (False: an emulation, which computes its graph by rounding)

    @property
    def checks_export(self) -> bool: ...  # its verdict is the FP32 export's own check

    @property
    def no_fallback_hint(self) -> str: ...  # said when it fails where no fallback file can help ("": one can)


@dataclass
class Check:
    """One candidate of one verify run: its table entry, why it cannot run ("" if it can), its result."""

    backend: CheckedBackend
    label: str
    required: bool
    reason: str = ""
    result: CandidateResult = field(default_factory=CandidateResult)
    gates: bool = True  # its verdict decides the exit code (verify.gate); else it is run and reported only
    batch_runs: dict = field(default_factory=dict)  # outputs at the other served batch sizes (evaluation.batching)
    conformance_runs: dict = field(default_factory=dict)  # row arrangements, runtime layers (evaluation.conformance)

    @property
    def name(self) -> str:
        return self.backend.verify_name

    @property
    def precision(self) -> str:
        return self.backend.precision

    @property
    def artifact(self) -> str | None:
        return self.backend.artifact

    @property
    def status(self) -> str:
        return self.result.status

    @property
    def tensor_check(self) -> TensorCheck | None:
        """The gate's tensor check (None: not judged)."""
        return self.result.tensor_check

    @property
    def task_check(self) -> TaskCheck | None:
        """The gate's task check (None: not judged)."""
        return self.result.task_check

    @property
    def judgement(self) -> Judgement | None:
        """Both checks, with the candidate's status now (None: not judged)."""
        t, k = self.tensor_check, self.task_check
        return None if t is None or k is None else Judgement(t, k, self.status)

    @property
    def after_fallback(self) -> bool:
        return self.result.after_fallback


@dataclass
class Evidence:
    """What every candidate is compared on: the feeds, the reference's outputs, the labels."""

    feeds: list[dict]
    reference: list[dict]
    labels: np.ndarray
    output_name: str
    confidence: float = 0.95  # of the task check's bounds (verify.confidence)
    names: list[str] = field(default_factory=list)  # each image's name (its file, for an image folder)
    outputs: dict = field(default_factory=dict)  # each judged candidate's outputs (verify.predictions.npz)
    # A detector's task check (pipeline.core.tasks): {"detections": name, "classes": n, "rules": verify.detection}
    detection: dict | None = None
    images: object = None  # the images' role record (pipeline.core.roles.ImageSet): split, indices, content hashes
    parts: object = None  # the validation split's search and verdict parts (pipeline.core.roles.ValidationParts)
