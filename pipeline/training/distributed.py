"""Many processes under torchrun: the process group, reductions, buffer broadcast and replica checksums."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

log = logging.getLogger("pipeline")


@dataclass
class Dist:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def launched_by_torchrun() -> bool:
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def init_distributed(device_type: str) -> Dist:
    """Join torchrun's process group: NCCL on GPU, gloo on CPU. A single process needs none."""
    if not launched_by_torchrun():
        return Dist()
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device_type == "cuda" else "gloo")
    return Dist(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))


def all_reduce_sum(values: list[float], world: Dist, device) -> list[float]:
    if not world.enabled:
        return values
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.tolist()


def broadcast_buffers(model: nn.Module, world: Dist) -> None:
    """Give every rank rank 0's buffers (BatchNorm running statistics).

    DDP broadcasts buffers at the start of each forward, so after the last training step each
    rank holds rank 0's statistics plus its own last batch: without this the replicas would
    evaluate with different statistics and end with different weights.
    """
    if not world.enabled:
        return
    for buffer in unwrap(model).buffers():
        dist.broadcast(buffer.data, src=0)


def average_buffers(tensors: list[torch.Tensor], world: Dist) -> None:
    """Every rank gets the mean over the ranks of each tensor (precise BatchNorm statistics, each rank's estimate
    from its own batches)."""
    if not world.enabled:
        return
    for t in tensors:
        dist.all_reduce(t.data)
        t.data.div_(world.world_size)


def state_checksum(state: dict[str, torch.Tensor]) -> str:
    """sha256 over every tensor's name, dtype, shape and bytes (layout-independent), in key order."""
    import hashlib

    digest = hashlib.sha256()
    for key in sorted(state):
        t = state[key].detach().to("cpu").contiguous()
        digest.update(f"{key}|{t.dtype}|{tuple(t.shape)}|".encode())
        digest.update(t.view(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return digest.hexdigest()


def replica_checksums(model: nn.Module, world: Dist) -> list[str]:
    """Every rank's :func:`state_checksum` of the model (parameters and buffers), gathered on all ranks."""
    mine = state_checksum(unwrap(model).state_dict())
    if not world.enabled:
        return [mine]
    gathered: list = [None] * world.world_size
    dist.all_gather_object(gathered, mine)
    return gathered


def unwrap(model: nn.Module) -> nn.Module:
    model = getattr(model, "module", model)  # DDP
    return getattr(model, "_orig_mod", model)  # torch.compile
