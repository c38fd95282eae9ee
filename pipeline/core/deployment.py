"""What ``deploy`` decides, as pure functions of plain data: which artifacts may be served, the batch sizes a Triton
model takes and prefers, which Triton container runs an engine, and whether served outputs match the verified ones.

No I/O, no model runs (tested in milliseconds, with properties: tests/test_deploy_rules.py). The stage
(:mod:`pipeline.deploy`) reads the run, asks these functions, and writes what they decided.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pipeline.core import verdicts
from pipeline.core.status import Status
from pipeline.core.verdicts import InconclusivePolicy

# --------------------------------------------------------------------------- which artifacts may be deployed

def refusal(candidate: str, status: str | None, policy: InconclusivePolicy) -> str:
    """Why verify's verdict does not let ``candidate``'s artifact be deployed; "" when it does.

    ``status`` is what :func:`pipeline.reports.verify_report.read_verdicts` says for the files here now (None: verify
    never judged it); only a verdict that counts as passed (:func:`pipeline.core.verdicts.counts_as_passed`) deploys.
    """
    if status is None:
        return f"{candidate}: verify has no verdict for it: run verify"
    if verdicts.counts_as_passed(status, policy):
        return ""
    if status == Status.NOT_VERIFIED:
        return f"{candidate}: not verified: its artifact or the weights changed since verify judged it; re-run verify"
    if status == Status.INCONCLUSIVE:
        return (f"{candidate}: inconclusive, which verify.inconclusive=fail does not count as passed; verify on more "
                "images")
    if status == Status.FAILED:
        return f"{candidate}: failed the precision gate (verify.md says why); fix it or deploy another artifact"
    return f"{candidate}: verify did not judge it ({status}); only an artifact that passed the gate is deployed"


# --------------------------------------------------------------------------- batch sizes


def max_batch_size(*, batch_dim: int | None, profile_max: int | None, served_max: int) -> int:
    """Triton's ``max_batch_size``: 0 for an artifact without a batch dimension of its own (a static first dimension
    other than 1 is a shape, not a batch), else the engine profile's largest batch, else the largest batch the build
    profile serves and verify checked (``build.max_batch``).

    ``batch_dim``: the artifact's first dimension (None: dynamic); ``profile_max``: an engine's optimisation profile
    maximum for that dimension (None: no profile)."""
    if batch_dim is not None and batch_dim != 1:
        return 0
    if profile_max is not None:
        return profile_max
    return served_max if batch_dim is None else 1


def preferred_batch_sizes(curve: Sequence[tuple[int, float]], max_batch: int, fraction: float) -> tuple[int, ...]:
    """The dynamic batcher's ``preferred_batch_size``: from the measured throughput curve (batch size, images/s), the
    smallest batch that reaches ``fraction`` of the best throughput (the knee: later batches add latency, not much
    throughput) and the batch with the best throughput, both within ``max_batch``. Empty without a measured point
    (the batcher then forms the largest batches it can, Triton's default)."""
    fastest: dict[int, float] = {}  # a batch size measured more than once (timers of one backend): its best
    for batch, speed in curve:
        if 1 <= batch <= max_batch and speed > 0:
            fastest[batch] = max(speed, fastest.get(batch, 0.0))
    if not fastest:
        return ()
    best_batch, best = max(fastest.items(), key=lambda p: (p[1], -p[0]))
    knee = min(batch for batch, speed in fastest.items() if speed >= fraction * best)
    return tuple(sorted({knee, best_batch}))


# --------------------------------------------------------------------------- which Triton container runs an engine


@dataclass(frozen=True)
class TritonRelease:
    """One NGC Triton container release and the TensorRT it ships (engines run only under the TensorRT that built
    them)."""

    release: str  # "25.01": nvcr.io/nvidia/tritonserver:<release>-trtllm-python-py3
    tensorrt: str
    cuda: str
    driver: str

    @property
    def tag(self) -> str:
        return f"nvcr.io/nvidia/tritonserver:{self.release}-trtllm-python-py3"


# NVIDIA's "Release Compatibility Matrix" for Triton (triton-inference-server/server, docs/introduction/compatibility.md
# at commit 0f963c9a8c6913aa4cd9b57ee04f9c2b76ee8d2a; published as
# https://docs.nvidia.com/deeplearning/triton-inference-server/user-guide/docs/introduction/compatibility.html), table
# "Container Name: trtllm-python-py3": the release, its TensorRT version, CUDA version and CUDA driver version, copied
# as published. The plain ``-py3`` containers are listed in NVIDIA's Frameworks Support Matrix
# (https://docs.nvidia.com/deeplearning/frameworks/support-matrix/index.html); docs/deploy.md says how to check one.
RELEASES_SOURCE = ("NVIDIA Triton Release Compatibility Matrix, trtllm-python-py3 table: "
                   "https://docs.nvidia.com/deeplearning/triton-inference-server/user-guide/docs/introduction/"
                   "compatibility.html (triton-inference-server/server docs/introduction/compatibility.md, "
                   "commit 0f963c9a8c69)")
TRITON_RELEASES: tuple[TritonRelease, ...] = (
    TritonRelease("26.07", "10.14.1.48", "13.1.0.036", "590.44.01"),
    TritonRelease("26.06", "10.14.1.48", "13.1.0.036", "590.44.01"),
    TritonRelease("26.05", "10.14.1.48", "13.1.0.036", "590.44.01"),
    TritonRelease("26.04", "10.14.1.48", "13.1.0.036", "590.44.01"),
    TritonRelease("26.03", "10.14.1.48", "13.1.0.036", "590.44.01"),
    TritonRelease("26.02", "10.13.3.9", "13.0.2.006", "580.95.05"),
    TritonRelease("26.01", "10.13.3.9", "13.0.2.006", "580.95.05"),
    TritonRelease("25.12", "10.13.3.9", "13.0.2.006", "580.95.05"),
    TritonRelease("25.11", "10.13.3.9", "13.0.2.006", "580.95.05"),
    TritonRelease("25.10", "10.11.0.33", "12.9.1.010", "575.57.08"),
    TritonRelease("25.09", "10.11.0.33", "12.9.1.010", "575.57.08"),
    TritonRelease("25.08", "10.11.0.33", "12.9.0.043", "575.51.03"),
    TritonRelease("25.07", "10.10.0.31", "12.9.0.036", "575.51.03"),
    TritonRelease("25.06", "10.10.0.31", "12.9.0.036", "575.51.03"),
    TritonRelease("25.05", "10.9.0.34", "12.8.1.012", "570.124.06"),
    TritonRelease("25.04", "10.9.0.34", "12.8.1.012", "570.124.06"),
    TritonRelease("25.03", "10.9.0.34", "12.8.1.012", "570.124.06"),
    TritonRelease("25.02", "10.8.0.43", "12.8.0.038", "570.86.10"),
    TritonRelease("25.01", "10.8.0.43", "12.8.0.038", "570.86.10"),
    TritonRelease("24.12", "10.7.0", "12.6.3", "560.35.05"),
    TritonRelease("24.11", "10.6.0", "12.6.3", "555.42.06"),
    TritonRelease("24.10", "10.4.0", "12.5.1.007", "555.42.06"),
    TritonRelease("24.09", "10.4.0", "12.5.1.007", "555.42.06"),
    TritonRelease("24.08", "10.3.0", "12.5.1.007", "555.42.06"),
    TritonRelease("24.07", "10.1.0", "12.4.1.003", "550.54.15"),
    TritonRelease("24.06", "10.0.1", "12.4.0.041", "550.54.14"),
    TritonRelease("24.05", "10.0.1.6", "12.3.2.001", "545.23.08"),
)


def _release_key(version: str) -> tuple[int, ...]:
    """A TensorRT version as major.minor.patch ("10.8.0.43" and "10.8.0" are the same release): an engine's
    serialization is tied to that triple."""
    parts = []
    for part in version.split(".")[:3]:
        digits = "".join(c for c in part if c.isdigit()) if part else ""
        parts.append(int(digits) if digits else 0)
    return tuple(parts + [0] * (3 - len(parts)))


def releases_for(tensorrt: str, table: Sequence[TritonRelease] = TRITON_RELEASES) -> list[TritonRelease]:
    """The container releases whose TensorRT is the engine's (same major.minor.patch), newest first."""
    return [r for r in table if _release_key(r.tensorrt) == _release_key(tensorrt)]


def release_refusal(tensorrt: str | None, target: str | None,
                    table: Sequence[TritonRelease] = TRITON_RELEASES) -> str:
    """Why engines built with ``tensorrt`` must not be written for the configured container release ``target``
    (``deploy.triton_release``); "" when they may (no engine, no target, or the same TensorRT). A release missing
    from the table is refused too: its TensorRT is unknown, and a wrong one fails at load ("Version tag does not
    match", triton-inference-server/server#7613)."""
    if tensorrt is None or target is None:
        return ""
    matching = releases_for(tensorrt, table)
    wanted = next((r for r in table if r.release == target), None)
    fits = ", ".join(r.release for r in matching) or "none in the table"
    if wanted is None:
        return (f"deploy.triton_release {target} is not in the compatibility table (its TensorRT is unknown); the "
                f"engines were built with TensorRT {tensorrt}, which matching releases ship: {fits}")
    if wanted in matching:
        return ""
    return (f"the engines were built with TensorRT {tensorrt}, but Triton {target} ships TensorRT {wanted.tensorrt}: "
            f"the engine would not load there; use a release with TensorRT {tensorrt} ({fits}) or rebuild the "
            "engines with that release's TensorRT")


def describe_releases(tensorrt: str | None, table: Sequence[TritonRelease] = TRITON_RELEASES) -> str:
    """One line for doctor and deploy: which container releases run engines of this TensorRT."""
    if tensorrt is None:
        return "no TensorRT here: engines are not built, so no Triton release is needed for them"
    matching = releases_for(tensorrt, table)
    if not matching:
        return (f"TensorRT {tensorrt}: no Triton container release in the compatibility table ships it; serve its "
                "engines from a container with exactly this TensorRT, or rebuild them inside one")
    return f"TensorRT {tensorrt}: Triton release {', '.join(r.release for r in matching)} ({matching[0].tag})"


# --------------------------------------------------------------------------- served outputs


@dataclass(frozen=True)
class ServedMatch:
    """How the served outputs of one protocol and concurrency compare with the verified artifact's, image by image."""

    images: int
    identical: int  # images whose output is bit for bit the in-process one
    max_abs_diff: float
    status: str  # the gate's verdict (pipeline.precision.gate.judge) of the served outputs against the artifact's

    @property
    def passed(self) -> bool:
        return self.status == Status.PASSED


def serving_verdict(matches: Sequence[ServedMatch]) -> Status:
    """The verdict over every served check: failed if one failed, else inconclusive if one was, else passed (the
    fold verify uses); no check at all is not a pass."""
    return verdicts.fold(m.status for m in matches) if matches else Status.FAILED
