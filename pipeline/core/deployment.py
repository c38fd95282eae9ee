"""What ``deploy`` decides, as pure functions of plain data: which artifacts may be served, the batch sizes a Triton
model takes and prefers, which Triton container runs an engine, and whether served outputs match the verified ones.

No I/O, no model runs (tested in milliseconds, with properties: tests/test_deploy_rules.py). The stage
(:mod:`pipeline.deploy`) reads the run, asks these functions, and writes what they decided.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pipeline.core import manifest, verdicts
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


def max_batch_size(*, batch_dim: int | None, profile_max: int | None, served_max: int, profile_min: int | None = None,
                   batch_fixed_by_backend: bool = False) -> int:
    """Triton's ``max_batch_size``, so that every batch the artifact serves reaches it.

    0 (the batch dimension stays in ``dims`` and each request is executed as sent) for: an artifact without a batch
    dimension of its own (a static first dimension other than 1 is a shape, not a batch); a backend that fixes the
    batch at ``max_batch_size`` (``batch_fixed_by_backend``: Triton's openvino backend calls ``ov::set_batch(model,
    max_batch_size)`` and refuses any other batch, openvino.cc:596-600 and 1049-1066, so a dynamic-batch IR keeps its
    dynamic batch only with 0); an engine whose optimisation profile starts above 1 (batching Triton's way would send
    it batches below the profile's minimum). Else the engine profile's largest batch, else the largest batch the build
    profile serves and verify checked (``build.max_batch``).

    ``batch_dim``: the artifact's first dimension (None: dynamic); ``profile_min``/``profile_max``: an engine's
    optimisation profile bounds for that dimension (None: no profile)."""
    if batch_dim is not None and batch_dim != 1:
        return 0
    if batch_fixed_by_backend and batch_dim is None:
        return 0
    if profile_min is not None and profile_min > 1:
        return 0
    if profile_max is not None:
        return profile_max
    return served_max if batch_dim is None else 1


def served_batch_range(*, max_batch: int, batch_dim: int | None, served_max: int,
                       profile_min: int | None = None, profile_max: int | None = None) -> tuple[int, int]:
    """The smallest and largest batch a model written with ``max_batch`` takes in one request: up to ``max_batch``
    when Triton batches; with the batch in ``dims`` (``max_batch`` 0) the artifact's own range (an engine's profile,
    else ``build.max_batch`` for a dynamic batch, else its static first dimension)."""
    if max_batch > 0:
        return 1, max_batch
    if batch_dim is not None:
        return batch_dim, batch_dim
    return (profile_min or 1), (profile_max or served_max)


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


# --------------------------------------------------------------------------- what the stock backends can be told

OPENVINO_SOURCE = ("triton-inference-server/openvino_backend src/openvino.cc, release branch r25.08 (commit "
                   "64651dcd5a7e; the same logic in r24.10, the Triton 2.51 of nvidia-pytriton)")
ONNXRUNTIME_SOURCE = ("triton-inference-server/onnxruntime_backend src/onnxruntime.cc, release branch r25.08 (commit "
                      "78357801c133)")


def stock_refusal(candidate: str, triton: str | None, precision: str, device: str) -> str:
    """Why Triton's stock backend for ``triton`` cannot be told to run ``candidate``'s artifact the way verify
    gated it; "" when it can. An artifact is never written where the server would run it in another precision.

    - OpenVINO FP32 and INT8: the backend's only precision parameter is ``HINT_BF16`` (openvino.cc:358-367, set as
      ``ov::hint::inference_precision(bf16)``); nothing keeps FP32, and OpenVINO's CPU plugin computes in bf16 by
      default on a CPU with bf16 units (AVX512_BF16, AMX). verify gated these in FP32 (INFERENCE_PRECISION_HINT=f32).
    - ONNX Runtime INT8 on the CPU: verify ran it with ``WeightBiasQuantization`` off (it changes an INT8 graph's
      results, runners.INT8_CPU_DISABLED_OPTIMIZERS); the backend sets only the graph optimisation level
      (onnxruntime.cc:217-237), not single optimizers.
    """
    if triton is None:
        return f"{candidate}: no Triton backend runs it"
    why = _CANNOT_BE_TOLD.get((triton, precision, device), "")
    return f"{candidate}: {why}" if why else ""


_KEEP_FP32 = ("Triton's openvino backend cannot be told to keep FP32: its only precision parameter is HINT_BF16 "
              "(openvino.cc:358), and OpenVINO's CPU plugin computes in bf16 by default on a CPU with bf16 units "
              "(AVX512_BF16, AMX), a precision verify did not gate this artifact in; deploy the FP32 graph as "
              "onnxrt_fp32 (or the BF16 IR, openvino_bf16) instead")
# What a stock backend cannot be told, per (Triton backend, the artifact's precision, its device): why deploy refuses
# such an artifact. A table of the backends' behaviour (their sources, cited in stock_refusal), not a branch per
# precision.
_CANNOT_BE_TOLD = {
    ("openvino", "fp32", "cpu"): _KEEP_FP32,
    ("openvino", "int8", "cpu"): _KEEP_FP32,
    ("onnxruntime", "int8", "cpu"): (
        "Triton's onnxruntime backend cannot turn off the WeightBiasQuantization optimizer (it sets only the graph "
        "optimisation level, onnxruntime.cc:217-237), which verify turned off because it changes an INT8 graph's "
        "results; the served outputs would not be the ones verify gated"),
}
# The parameters that make a stock backend run an artifact in the precision verify gated, per (backend, precision).
_PARAMETERS = {("openvino", "bf16"): (("HINT_BF16", "YES"),)}


def stock_parameters(triton: str | None, precision: str) -> tuple[tuple[str, str], ...]:
    """The ``parameters`` that make the stock backend run the artifact in the precision verify gated: ``HINT_BF16:
    YES`` for the BF16 IR (without it a CPU whose plugin defaults to FP32 runs it in FP32)."""
    return _PARAMETERS.get((triton, precision), ()) if triton is not None else ()


def precision_mismatch(gated: str, served: str | None) -> str:
    """Why a model served in ``served`` ("f32", "bf16", "f16": OpenVINO's element names, or None where the backend
    does not say) is not the one verify gated in ``gated``; "" when it is. FP16 graphs on ONNX Runtime's CPU provider
    and INT8 graphs compute their float regions as verify ran them, so only OpenVINO's hint is compared."""
    if served is None:
        return ""
    wanted = {"fp32": "f32", "bf16": "bf16", "fp16": "f16"}.get(gated)
    if wanted is None or wanted == served:
        return ""
    return f"the backend runs it in {served}, but verify gated it in {gated}"


# --------------------------------------------------------------------------- which verify.json deploy trusts


def verify_finished(status: str | None, exit_code: int | None, recorded_sha256: str | None, sha256: str) -> bool:
    """Whether verify.json is the report of a verify that finished: the stage ended ok, or failed its gate (exit 1:
    every verdict was reached), and the file is the one it recorded (``recorded_sha256``, the manifest's)."""
    return manifest.finished(status, exit_code) and recorded_sha256 == sha256


# --------------------------------------------------------------------------- which folder deploy may replace


def replace_refusal(on_disk: dict[str, str], written: dict[str, str] | None) -> str:
    """Why deploy must not replace the folder whose entries are ``on_disk`` (relative path -> sha256 of a file, or
    "dir" for a folder, "other" for a link or anything else); "" when it may: the folder is empty, or every entry is
    one deploy wrote there, unchanged (``written``: its files manifest, pipeline.files.json, None when absent or
    unreadable). A file deploy wrote and someone then removed is no reason to refuse; any other file is."""
    if not on_disk:
        return ""
    if written is None:
        return ("it holds files deploy did not write (no pipeline.files.json, deploy's record of what it wrote); name "
                "an empty or new folder")
    folders = {parent for path in written for parent in _parents(path)}
    foreign = sorted(p for p, digest in on_disk.items()
                     if p not in written and not (digest == "dir" and p in folders))
    changed = sorted(p for p, digest in on_disk.items() if p in written and written[p] != digest)
    if not foreign and not changed:
        return ""
    parts = []
    if foreign:
        parts.append(f"files deploy did not write ({', '.join(foreign[:5])}{', …' if len(foreign) > 5 else ''})")
    if changed:
        parts.append(f"files changed since deploy wrote them ({', '.join(changed[:5])}"
                     f"{', …' if len(changed) > 5 else ''})")
    return "it holds " + " and ".join(parts) + "; nothing there is removed: move them, or name another folder"


def _parents(path: str) -> list[str]:
    parts = path.split("/")[:-1]
    return ["/".join(parts[: i + 1]) for i in range(len(parts))]


# --------------------------------------------------------------------------- which Triton container runs an engine


@dataclass(frozen=True)
class TritonRelease:
    """One NGC Triton container release and the TensorRT it ships (engines run only under the TensorRT that built
    them)."""

    release: str  # "25.01"; its TensorRT from the -trtllm-python-py3 table, served from the <release>-py3 image
    tensorrt: str
    cuda: str
    driver: str

    @property
    def tag(self) -> str:
        """The image that serves a repository of engines, ONNX and OpenVINO models (the -trtllm-python-py3 image of
        the table holds the TensorRT-LLM and Python backends only; docs/docker.md)."""
        return f"nvcr.io/nvidia/tritonserver:{self.release}-py3"


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
    return (f"TensorRT {tensorrt}: Triton release {', '.join(r.release for r in matching)} (serve from "
            f"{matching[0].tag} after checking its TensorRT there: the table is the -trtllm-python-py3 image's)")


# --------------------------------------------------------------------------- served outputs


def served_verdict(statuses: Sequence[str], *, refused: bool = False) -> Status:
    """One served model's verdict: failed when something about it was wrong before any output was judged
    (``refused``: its file changed, its load failed, its precision is not the gated one), else the fold verify uses
    over its arrangements (failed if one failed, else inconclusive if one was, else passed); no arrangement judged is
    not a pass."""
    if refused or not statuses:
        return Status.FAILED
    return verdicts.fold(statuses)


def serving_verdict(model_verdicts: Sequence[str]) -> Status:
    """The repository's verdict over its served models (those not served here, a GPU's, are left out by the caller):
    the same fold; none served is not a pass."""
    return verdicts.fold(model_verdicts) if model_verdicts else Status.FAILED


# --------------------------------------------------------------------------- which Triton releases load the files

# Triton release -> the ONNX Runtime its onnxruntime backend bundles: Triton's Release Compatibility Matrix, table
# "ONNX Runtime Versions" (triton-inference-server/server docs/introduction/compatibility.md, commit e1db8a603d86).
TRITON_ONNXRUNTIME_SOURCE = ("Triton Release Compatibility Matrix, \"ONNX Runtime Versions\" "
                             "(triton-inference-server/server docs/introduction/compatibility.md, commit e1db8a603d86)")
TRITON_ONNXRUNTIME: dict[str, str] = {
    "26.07": "1.27.0", "26.06": "1.24.4", "26.05": "1.24.4", "26.04": "1.24.4", "26.03": "1.24.2", "26.02": "1.24.1",
    "26.01": "1.23.2", "25.12": "1.23.2", "25.11": "1.23.2", "25.10": "1.23.1", "25.09": "1.23.0", "25.08": "1.23.0",
    "25.07": "1.22.0", "25.06": "1.22.0", "25.05": "1.22.0", "25.04": "1.21.0", "25.03": "1.21.0", "25.02": "1.20.1",
    "25.01": "1.20.1", "24.12": "1.20.1", "24.11": "1.19.2", "24.10": "1.19.2", "24.09": "1.19.2", "24.08": "1.18.1",
    "24.07": "1.18.1", "24.06": "1.18.0", "24.05": "1.18.0", "24.04": "1.17.3",
}
# Triton release -> the OpenVINO its openvino backend is built with: build.py's DEFAULT_TRITON_VERSION_MAP
# ("standalone_openvino_version", or the "Standalone OpenVINO" entry before 24.12) on each release branch rYY.MM of
# triton-inference-server/server (read at the branch heads of 2026-08; the compatibility page lists no OpenVINO).
TRITON_OPENVINO_SOURCE = ("build.py DEFAULT_TRITON_VERSION_MAP, standalone OpenVINO, on each release branch rYY.MM of "
                          "triton-inference-server/server")
TRITON_OPENVINO: dict[str, str] = {
    "26.08": "2026.3.0", "26.07": "2026.2.0", "26.06": "2026.2.0", "26.05": "2026.1.0", "26.04": "2026.1.0",
    "26.03": "2026.0.0", "26.02": "2025.4.1", "26.01": "2025.4.1", "25.12": "2025.4.0", "25.11": "2025.3.0",
    "25.10": "2025.3.0", "25.09": "2025.3.0", "25.08": "2025.2.0", "25.07": "2025.1.0", "25.06": "2025.1.0",
    "25.05": "2025.1.0", "25.04": "2025.0.0", "25.03": "2025.0.0", "25.02": "2025.0.0", "25.01": "2024.5.0",
    "24.12": "2024.5.0", "24.11": "2024.4.0", "24.10": "2024.4.0", "24.09": "2024.0.0", "24.08": "2024.0.0",
    "24.07": "2024.0.0", "24.06": "2024.0.0", "24.05": "2023.3.0",
}
# ONNX Runtime minor version -> (the ONNX opset it implements, the ONNX IR version it supports): ONNX Runtime's
# compatibility page (microsoft/onnxruntime docs/reference/compatibility.md, commit 109c0baa9367; its table ends at
# 1.20). A later release supports at least what 1.20 does ("Newer versions of ONNX Runtime support all models that
# worked with prior versions", same page), so 1.20's row is the bound for those.
ONNXRUNTIME_OPSET_SOURCE = ("ONNX Runtime compatibility, \"ONNX opset support\" (microsoft/onnxruntime "
                            "docs/reference/compatibility.md, commit 109c0baa9367)")
ONNXRUNTIME_OPSET: dict[tuple[int, int], tuple[int, int]] = {
    (1, 20): (21, 10), (1, 19): (21, 10), (1, 18): (21, 10), (1, 17): (20, 9), (1, 16): (19, 9), (1, 15): (19, 8),
    (1, 14): (18, 8),
}
# OpenVINO release -> the newest operation set it reads: OpenVINO's "Available Operation Sets"
# (https://docs.openvino.ai/2024/documentation/openvino-ir-format/operation-sets/available-opsets.html; its table ends
# at 2024.5, opset15). A later release reads at least opset15.
OPENVINO_OPSET_SOURCE = ("OpenVINO \"Available Operation Sets\" (https://docs.openvino.ai/2024/documentation/"
                         "openvino-ir-format/operation-sets/available-opsets.html)")
OPENVINO_OPSET: dict[tuple[int, int], int] = {
    (2024, 5): 15, (2024, 0): 14, (2023, 2): 13, (2023, 1): 12, (2023, 0): 11, (2022, 3): 10,
}


def _minor(version: str) -> tuple[int, int]:
    major, minor = (_release_key(version) + (0, 0))[:2]
    return major, minor


def onnxruntime_loads(version: str, opset: int, ir_version: int) -> bool | None:
    """Whether ONNX Runtime ``version`` loads a graph of ``opset`` and ONNX IR ``ir_version``; None when the table
    cannot say (a version older than it, or newer than its last row and the graph beyond that row)."""
    key = _minor(version)
    known = [k for k in ONNXRUNTIME_OPSET if k <= key]
    if not known:
        return None
    supported_opset, supported_ir = ONNXRUNTIME_OPSET[max(known)]
    if opset <= supported_opset and ir_version <= supported_ir:
        return True
    return None if key > max(ONNXRUNTIME_OPSET) else False


def openvino_loads(version: str, opsets: Sequence[int]) -> bool | None:
    """Whether OpenVINO ``version`` reads an IR whose operations come from ``opsets``; None when the table cannot
    say (older than it, or newer than its last row and the IR beyond that row)."""
    key = _minor(version)
    known = [k for k in OPENVINO_OPSET if k <= key]
    if not known:
        return None
    if max(opsets, default=1) <= OPENVINO_OPSET[max(known)]:
        return True
    return None if key > max(OPENVINO_OPSET) else False


def _span(releases: Sequence[str]) -> str:
    ordered = sorted(releases)
    return f"{ordered[0]}–{ordered[-1]}" if len(ordered) > 1 else ordered[0]


def describe_onnx_releases(opset: int, ir_version: int) -> str:
    """One line for doctor and deploy: the Triton releases whose ONNX Runtime loads such a graph, with the source."""
    good = [r for r, v in TRITON_ONNXRUNTIME.items() if onnxruntime_loads(v, opset, ir_version)]
    bad = [r for r, v in TRITON_ONNXRUNTIME.items() if onnxruntime_loads(v, opset, ir_version) is False]
    text = f"ONNX opset {opset}, IR {ir_version}: "
    text += (f"Triton {_span(good)} (ONNX Runtime {TRITON_ONNXRUNTIME[min(good)]} and later)" if good
             else "no Triton release in the table")
    unknown = sorted(set(TRITON_ONNXRUNTIME) - set(good) - set(bad))
    return text + (f"; not {_span(bad)}" if bad else "") + (f"; unknown for {_span(unknown)}" if unknown else "")


def describe_openvino_releases(opsets: Sequence[int]) -> str:
    """One line: the Triton releases whose OpenVINO reads an IR using ``opsets``."""
    good = [r for r, v in TRITON_OPENVINO.items() if openvino_loads(v, opsets)]
    bad = [r for r, v in TRITON_OPENVINO.items() if openvino_loads(v, opsets) is False]
    text = f"OpenVINO IR up to opset{max(opsets, default=1)}: "
    text += (f"Triton {_span(good)} (OpenVINO {TRITON_OPENVINO[min(good)]} and later)" if good
             else "no Triton release in the table")
    unknown = sorted(set(TRITON_OPENVINO) - set(good) - set(bad))
    return text + (f"; not {_span(bad)}" if bad else "") + (f"; unknown for {_span(unknown)}" if unknown else "")
