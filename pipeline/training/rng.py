"""Every random choice of a run: seeding, the RNG states a checkpoint carries, and the batch order derived
from (seed, epoch, batch index), so a resumed run ends with the same weights as an uninterrupted one."""

from __future__ import annotations

import logging
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DistributedSampler, Sampler

from pipeline.core.errors import InputError

log = logging.getLogger("pipeline")


def seed_everything(seed: int, deterministic: bool) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False


@dataclass(frozen=True)
class NumpyRng:
    """NumPy's global MT19937 state (its keys as an int64 tensor: a checkpoint holds tensors, not arrays)."""

    keys: torch.Tensor
    pos: int
    has_gauss: int
    cached: float


@dataclass(frozen=True)
class RngState:
    """Every RNG state a checkpoint carries (issue 47); ``to_state``/``from_state`` are the checkpoint's ``rng``."""

    python: tuple  # random.getstate(): (version, 625 ints, gauss_next)
    numpy: NumpyRng
    torch: torch.Tensor
    cuda: tuple[torch.Tensor, ...] | None = None  # per GPU; None: saved without CUDA (the key is then absent)

    def to_state(self) -> dict[str, Any]:
        n = self.numpy
        state: dict[str, Any] = {"python": self.python, "numpy": {"keys": n.keys, "pos": n.pos,
                                                                 "has_gauss": n.has_gauss, "cached": n.cached},
                                 "torch": self.torch}
        if self.cuda is not None:
            state["cuda"] = list(self.cuda)
        return state

    @classmethod
    def from_state(cls, state: Any, path: Path) -> RngState:
        """A checkpoint's ``rng``, checked; anything else is one :class:`InputError`."""
        state = state if isinstance(state, dict) else {}
        py, npst, cpu, cuda = state.get("python"), state.get("numpy"), state.get("torch"), state.get("cuda")
        npst = npst if isinstance(npst, dict) else {}
        numpy = NumpyRng(keys=npst.get("keys"), pos=npst.get("pos"), has_gauss=npst.get("has_gauss"),
                         cached=npst.get("cached"))
        ok = (isinstance(py, (tuple, list)) and len(py) == 3 and isinstance(py[1], (tuple, list))
              and isinstance(numpy.keys, torch.Tensor) and isinstance(numpy.cached, float)
              and all(isinstance(n, int) and not isinstance(n, bool) for n in (numpy.pos, numpy.has_gauss))
              and isinstance(cpu, torch.Tensor) and (cuda is None or (
                  isinstance(cuda, (list, tuple)) and all(isinstance(t, torch.Tensor) for t in cuda))))
        if not ok:
            raise InputError(f"{path} is damaged: its 'rng' is not the RNG states this tool saves; re-run train "
                             "without --resume")
        return cls(python=tuple(py), numpy=numpy, torch=cpu, cuda=None if cuda is None else tuple(cuda))


def rng_state() -> RngState:
    np_state = np.random.get_state()
    return RngState(
        python=random.getstate(),
        numpy=NumpyRng(keys=torch.from_numpy(np_state[1].astype(np.int64)), pos=int(np_state[2]),
                       has_gauss=int(np_state[3]), cached=float(np_state[4])),
        torch=torch.get_rng_state(),
        cuda=tuple(torch.cuda.get_rng_state_all()) if torch.cuda.is_available() else None)


def set_rng_state(state: RngState) -> None:
    py = state.python
    random.setstate((py[0], tuple(py[1]), py[2]))
    n = state.numpy
    np.random.set_state(("MT19937", n.keys.numpy().astype(np.uint32), n.pos, n.has_gauss, n.cached))
    torch.set_rng_state(state.torch)
    restore_cuda_rng(list(state.cuda or ()))


def restore_cuda_rng(saved: list) -> None:
    """The checkpoint's per-GPU CUDA RNG states, on the GPUs that exist here, and say what was restored.

    ``torch.cuda.set_rng_state_all`` raises IndexError for a checkpoint from a machine with more GPUs;
    on fewer saved states than GPUs the others keep the seed this run set.
    """
    if not saved:
        return
    here = torch.cuda.device_count() if torch.cuda.is_available() else 0
    restored = min(len(saved), here)
    for index in range(restored):
        torch.cuda.set_rng_state(saved[index], device=index)
    if restored == len(saved) == here:
        log.info("train: restored the CUDA RNG state of all %d GPU(s)", restored)
        return
    extra = (f"GPU(s) {restored}-{len(saved) - 1} of the checkpoint do not exist here" if len(saved) > here else
             f"GPU(s) {restored}-{here - 1} here keep this run's seed")
    log.warning("train: restored the CUDA RNG state of %d of the checkpoint's %d GPU(s) (this machine has %d); %s: "
                "random numbers on the GPU differ from an uninterrupted run", restored, len(saved), here, extra)


class EpochBatches(Sampler[list[int]]):
    """Batches of one epoch in DistributedSampler order (seeded by seed and epoch), from ``start`` on."""

    def __init__(self, sampler: DistributedSampler, batch_size: int):
        self.sampler = sampler
        self.batch_size = batch_size
        self.start = 0

    def __len__(self) -> int:
        return len(self.sampler) // self.batch_size - self.start

    def __iter__(self):
        indices = list(self.sampler)
        for b in range(self.start, len(indices) // self.batch_size):
            yield indices[b * self.batch_size : (b + 1) * self.batch_size]


def batch_generator(seed: int, epoch: int, batch: int, rank: int) -> torch.Generator:
    # modulo 2**64: manual_seed takes no more, which train.seed above about 180,000 would exceed
    return torch.Generator().manual_seed((((seed * 1_000_003 + epoch) * 1_000_003 + batch) * 101 + rank) % 2**64)
