"""This process's device and the autocast dtype ``train.amp`` resolves to on it (said, never guessed)."""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

import torch

from pipeline.core import env
from pipeline.core.errors import BackendUnavailable, UsageError

if TYPE_CHECKING:  # annotations only
    from pipeline.core.config_schema import Config

log = logging.getLogger("pipeline")


AMP_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16", None: "off"}  # as train.amp spells them


def resolve_device(cfg: Config) -> torch.device:
    """This process's device; under torchrun each process takes the GPU of its LOCAL_RANK.

    Called before the process group starts, because NCCL needs every rank on its own GPU first.
    """
    want = cfg.train.device
    if want == "cuda" or (want == "auto" and torch.cuda.is_available()):
        ok, reason = env.cuda_status()
        if not ok:
            raise BackendUnavailable(f"train.device=cuda but {reason}")
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def resolve_amp(requested: str, device: torch.device) -> tuple[torch.dtype | None, str]:
    """Which autocast dtype to use, and a note saying why (recorded in the manifest)."""
    dtype, note = _choose_amp(requested, device)
    if device.type == "cpu" and requested in ("auto", "bf16") and env.cpu_flags_simulated() is not None:
        note += f" [CPU flags simulated by {env.CPU_FLAGS_ENV}={env.cpu_flags_simulated()!r}]"
    return dtype, note


def _choose_amp(requested: str, device: torch.device) -> tuple[torch.dtype | None, str]:
    if requested == "off":
        return None, "mixed precision off (train.amp=off)"
    if requested == "fp16":
        note = "float16 autocast with GradScaler"
        if device.type == "cpu":
            note += " (on CPU: slow, usually only useful to test the fp16 path)"
        return torch.float16, note
    if requested == "bf16":
        if device.type == "cuda" and not torch.cuda.is_bf16_supported():
            raise UsageError("train.amp=bf16 but this GPU has no bfloat16 support; use train.amp=fp16")
        note = "bfloat16 autocast (no GradScaler needed)"
        if device.type == "cpu" and not env.cpu_has_native_bf16():
            note += f"; this CPU ({env.cpu_model()}) has no bf16 matrix units, so expect it to be slower than FP32"
        return torch.bfloat16, note
    # auto
    if device.type == "cuda":
        return torch.float16, "auto: float16 autocast with GradScaler on CUDA"
    if env.cpu_has_native_bf16():
        return torch.bfloat16, "auto: bfloat16 autocast on a CPU with bf16 matrix units (AMX/AVX512-BF16)"
    return None, (
        f"auto: mixed precision off: this CPU ({env.cpu_model()}) has no bf16 matrix units "
        "(AMX or AVX512-BF16), where bf16 autocast runs several times slower than FP32; "
        "set train.amp=bf16 to use it anyway"
    )
