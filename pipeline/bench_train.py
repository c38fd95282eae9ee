"""``python -m pipeline bench-train``: training throughput with AMP versus FP32, and what each converges to.

Both precisions run in one process, on the same batches, from the same initial weights, for
the same number of optimizer steps, so a speed-up that costs convergence is visible next to it.
This is a benchmark (a command that measures and reports), not a test.
"""

from __future__ import annotations

import copy
import logging
import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from pipeline.core import data as data_mod
from pipeline.core import env, modeling
from pipeline.training.optim import make_optimizer

if TYPE_CHECKING:  # annotations only
    from pipeline.core.config_schema import Config

log = logging.getLogger("pipeline")


@dataclass(frozen=True)
class PrecisionRun:
    """One precision's timed training steps."""

    images_per_s: float
    step_ms_median: float
    losses: tuple[float, ...]  # every step's, warm-up included
    final_loss: float  # the mean of the last five

    def to_json(self) -> dict[str, Any]:
        return {"images_per_s": self.images_per_s, "step_ms_median": self.step_ms_median,
                "losses": list(self.losses), "final_loss": self.final_loss}


@dataclass(frozen=True)
class TrainBench:
    """What bench-train measured: the machine, the setting, FP32's run and the AMP precision's."""

    model: str
    device: str
    cpu: str
    cpu_native_bf16: bool
    gpu: str | None
    threads: int
    image_size: int
    batch_size: int
    channels_last: bool
    steps: int
    amp: str  # the AMP precision's name: fp16 or bf16
    fp32: PrecisionRun
    amp_run: PrecisionRun

    @property
    def speedup(self) -> float:
        return self.amp_run.images_per_s / self.fp32.images_per_s

    def to_json(self) -> dict[str, Any]:
        """The report's shape: ``results`` keyed by precision name."""
        return {"model": self.model, "device": self.device, "cpu": self.cpu, "cpu_native_bf16": self.cpu_native_bf16,
                "gpu": self.gpu, "threads": self.threads, "image_size": self.image_size,
                "batch_size": self.batch_size, "channels_last": self.channels_last, "steps": self.steps,
                "amp": self.amp, "results": {"fp32": self.fp32.to_json(), self.amp: self.amp_run.to_json()},
                "speedup": self.speedup}


def _batches(cfg: Config, steps: int):
    spec = modeling.resolve_spec(cfg)
    size = modeling.image_size(cfg, spec)
    mean, std = modeling.normalisation(cfg, spec)
    bs = cfg.data.batch_size
    data_cfg = cfg.data
    if data_cfg.source == "synthetic":  # generate only what the benchmark uses
        need = math.ceil(steps * bs / (1 - data_cfg.val_fraction) / data_cfg.num_classes) + 2
        data_cfg = data_cfg.model_copy(update={"samples_per_class": need})
    splits = data_mod.load(data_cfg, image_size=size, mean=mean, std=std)
    g = torch.Generator().manual_seed(cfg.train.seed)
    order = torch.randperm(len(splits.train), generator=g).tolist()
    batches = []
    for i in range(steps):
        idx = [order[(i * bs + j) % len(order)] for j in range(bs)]
        batches.append(data_mod.collate(data_mod.fetch_items(splits.train, idx)))
    return batches, splits.num_classes, size


def _train(model, batches, cfg: Config, device, dtype, warmup: int) -> PrecisionRun:
    optimizer = make_optimizer(cfg, model)
    scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)
    criterion = nn.CrossEntropyLoss()
    losses, times = [], []
    model.train()
    for _i, (x, y) in enumerate(batches):
        x, y = x.to(device), y.to(device)
        if cfg.train.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        if device.type == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = criterion(model(x).float(), y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
        losses.append(loss.item())
    timed = times[warmup:]
    images = len(timed) * batches[0][0].shape[0]
    return PrecisionRun(images_per_s=images / sum(timed), step_ms_median=1000 * sorted(timed)[len(timed) // 2],
                        losses=tuple(losses), final_loss=sum(losses[-5:]) / len(losses[-5:]))


def run(cfg: Config, *, steps: int = 20, amp: str | None = None) -> TrainBench:
    device = torch.device("cuda" if torch.cuda.is_available() and cfg.train.device != "cpu" else "cpu")
    amp = amp or ("fp16" if device.type == "cuda" else "bf16")
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[amp]
    warmup = min(3, max(0, steps // 5))
    batches, num_classes, size = _batches(cfg, steps + warmup)
    torch.manual_seed(cfg.train.seed)
    model, _ = modeling.build(cfg, num_classes, size)
    model.to(device)
    if cfg.train.channels_last:
        model.to(memory_format=torch.channels_last)
    initial = copy.deepcopy(model.state_dict())
    log.info("bench-train: %s at %dx%d, batch %d, %d timed steps (+%d warm-up) per precision on %s",
             cfg.model.name, size, size, cfg.data.batch_size, steps, warmup, device)
    runs = []
    for name, dt in (("fp32", None), (amp, dtype)):
        model.load_state_dict(initial)
        torch.manual_seed(cfg.train.seed)
        runs.append(_train(model, batches, cfg, device, dt, warmup))
        log.info("bench-train: %-4s %8.1f images/s, final loss %.4f", name, runs[-1].images_per_s,
                 runs[-1].final_loss)
    return TrainBench(
        model=cfg.model.name, device=str(device), cpu=env.cpu_model(), cpu_native_bf16=env.cpu_has_native_bf16(),
        gpu=(env.gpu_info() or {}).get("name"), threads=torch.get_num_threads(), image_size=size,
        batch_size=cfg.data.batch_size, channels_last=cfg.train.channels_last, steps=steps, amp=amp,
        fp32=runs[0], amp_run=runs[1])


def _row(name: str, measured: PrecisionRun) -> str:
    return f"  {name:<10}{measured.images_per_s:>10.1f}{measured.step_ms_median:>18.1f}{measured.final_loss:>12.4f}"


def format_result(r: TrainBench) -> str:
    hw = r.gpu or f"{r.cpu} ({r.threads} threads, native bf16: {'yes' if r.cpu_native_bf16 else 'no'})"
    return "\n".join([
        (f"bench-train {r.model} {r.image_size}x{r.image_size}, batch {r.batch_size}, "
         f"channels_last={r.channels_last}, {r.steps} steps, on {hw}"),
        f"  {'precision':<10}{'images/s':>10}{'step ms (median)':>18}{'final loss':>12}",
        _row("fp32", r.fp32),
        _row(r.amp, r.amp_run),
        f"  speed-up {r.amp} / fp32: {r.speedup:.2f}x (same batches, same initial weights)",
    ])
