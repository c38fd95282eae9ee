"""The train stage: mixed precision on CPU, one GPU, or many processes under torchrun.

The loop in :func:`train_loop` follows the usual AMP recipe: an explicit ``torch.autocast``
region, ``torch.amp.GradScaler`` (enabled only for float16), ``unscale_`` before clipping,
and a scheduler that does not advance on a step the scaler skipped. All randomness that
decides a batch (order, augmentation) is derived from (seed, epoch, batch index), and the RNG
states travel in the checkpoint, so a resumed run ends with the same weights as an
uninterrupted one.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, Sampler

from pipeline import data as data_mod
from pipeline import env, modeling
from pipeline.errors import BackendUnavailable, InputError, StageFailed, UsageError
from pipeline.run import RunDir, StageRecord, atomic_path

log = logging.getLogger("pipeline")

CHECKPOINT = "checkpoint.pt"
BEST_CHECKPOINT = "checkpoint.best.pt"
METRICS = "metrics.jsonl"
CURVE = "train_curve.png"
TRACE = "train.trace.json"
CHECKPOINT_FORMAT = "pipeline.checkpoint/1"
AMP_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16", None: "off"}  # as train.amp spells them


# --------------------------------------------------------------------------- distributed


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


# --------------------------------------------------------------------------- precision and device


def resolve_device(cfg) -> torch.device:
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


def seed_everything(seed: int, deterministic: bool) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False


def rng_state() -> dict:
    np_state = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": {"keys": torch.from_numpy(np_state[1].astype(np.int64)), "pos": int(np_state[2]),
                  "has_gauss": int(np_state[3]), "cached": float(np_state[4])},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    npst = state["numpy"]
    np.random.set_state(("MT19937", npst["keys"].numpy().astype(np.uint32), npst["pos"], npst["has_gauss"],
                         npst["cached"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# --------------------------------------------------------------------------- data order


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
    return torch.Generator().manual_seed(((seed * 1_000_003 + epoch) * 1_000_003 + batch) * 101 + rank)


# --------------------------------------------------------------------------- schedule


def lr_lambda(total_steps: int, warmup_steps: int):
    def factor(step: int) -> float:
        if warmup_steps and step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return factor


def make_optimizer(cfg, model: nn.Module) -> torch.optim.Optimizer:
    # No weight decay on norm scales and biases (1-D parameters), as is usual for CNNs and ViTs.
    decay = [p for p in model.parameters() if p.requires_grad and p.ndim > 1]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.ndim <= 1]
    groups = [{"params": decay, "weight_decay": cfg.train.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    if cfg.train.optimizer == "adamw":
        return torch.optim.AdamW(groups, lr=cfg.train.lr)
    return torch.optim.SGD(groups, lr=cfg.train.lr, momentum=cfg.train.momentum)


# --------------------------------------------------------------------------- metrics


class MetricsLog:
    """Append-only JSONL (one object per line, flushed), rank 0 only; TensorBoard when installed."""

    def __init__(self, path: Path, enabled: bool, tensorboard_dir: Path | None):
        self.enabled = enabled
        self.f = open(path, "a", encoding="utf-8") if enabled else None
        self.tb = None
        if enabled and tensorboard_dir is not None:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(str(tensorboard_dir))
            except ImportError:
                self.tb = None

    def write(self, record: dict) -> None:
        if not self.enabled:
            return
        self.f.write(json.dumps(record) + "\n")
        self.f.flush()
        if self.tb is not None:
            step = record.get("step", 0)
            for key, value in record.items():
                if isinstance(value, (int, float)) and key not in ("step", "epoch"):
                    self.tb.add_scalar(f"{record['event']}/{key}", value, step)

    def close(self) -> None:
        if self.f:
            self.f.close()
        if self.tb is not None:
            self.tb.close()


def read_metrics(path: Path) -> list[dict]:
    """Parse metrics.jsonl, tolerating a torn last line left by a killed process."""
    records = []
    if not path.exists():
        return records
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            continue
    return records


def plot_curves(metrics_path: Path, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_metrics(metrics_path)
    # After a resume the log holds the replayed steps again: keep the last record of each step.
    steps = {r["step"]: r for r in records if r.get("event") == "step"}
    epochs = {r["epoch"]: r for r in records if r.get("event") == "epoch"}
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.6))
    if steps:
        xs = sorted(steps)
        ax1.plot(xs, [steps[s]["loss"] for s in xs], lw=1, label="train loss")
    if epochs:
        es = sorted(epochs)
        ax1.plot([epochs[e]["step"] for e in es], [epochs[e]["val_loss"] for e in es], "o-", label="val loss")
        ax2.plot([e + 1 for e in es], [100 * epochs[e]["val_acc"] for e in es], "o-", color="tab:green")
    ax1.set_xlabel("optimizer step")
    ax1.set_ylabel("loss")
    ax1.legend()
    ax1.grid(alpha=0.3)
    ax2.set_xlabel("epoch")
    ax2.set_ylabel("validation accuracy (%)")
    ax2.grid(alpha=0.3)
    fig.tight_layout()
    with atomic_path(out) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------- checkpoints


def save_checkpoint(path: Path, state: dict) -> None:
    with atomic_path(path) as tmp:
        torch.save(state, tmp)


def load_checkpoint(path: Path) -> dict:
    state = modeling.safe_torch_load(path, what="checkpoint")
    if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
        raise InputError(f"{path} is not a pipeline checkpoint; re-run train without --resume")
    return state


def unwrap(model: nn.Module) -> nn.Module:
    model = getattr(model, "module", model)  # DDP
    return getattr(model, "_orig_mod", model)  # torch.compile


# --------------------------------------------------------------------------- evaluation


@torch.no_grad()
def evaluate(model: nn.Module, dataset, device, world: Dist, amp_dtype, channels_last: bool,
             batch_size: int = 256) -> tuple[float, float]:
    """Validation loss and accuracy; each rank takes every world_size-th image, sums are reduced."""
    model.eval()
    indices = list(range(world.rank, len(dataset), world.world_size))
    loss_sum, correct = 0.0, 0.0
    for i in range(0, len(indices), batch_size):
        x, y = data_mod.collate(_fetch(dataset, indices[i : i + batch_size]))
        x, y = x.to(device), y.to(device)
        if channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        with torch.autocast(device.type, dtype=amp_dtype or torch.float32, enabled=amp_dtype is not None):
            logits = model(x)
        loss_sum += nn.functional.cross_entropy(logits.float(), y, reduction="sum").item()
        correct += (logits.argmax(1) == y).sum().item()
    loss_sum, correct, count = all_reduce_sum([loss_sum, correct, float(len(indices))], world, device)
    return loss_sum / max(count, 1), correct / max(count, 1)


def _fetch(dataset, indices: list[int]):
    if hasattr(dataset, "__getitems__"):
        return dataset.__getitems__(indices)
    return [dataset[i] for i in indices]


# --------------------------------------------------------------------------- the stage


def run(cfg, run_dir: RunDir, record: StageRecord, *, resume: bool = False, profile: bool = False) -> None:
    """Train ``cfg.model`` on ``cfg.data`` into ``run_dir`` (checkpoints, weights, metrics, curve)."""
    device = resolve_device(cfg)
    world = init_distributed(device.type)
    if not world.is_main:
        logging.getLogger("pipeline").setLevel(logging.WARNING)
    seed_everything(cfg.train.seed, cfg.train.deterministic)

    spec = modeling.resolve_spec(cfg)
    size = modeling.image_size(cfg, spec)
    mean, std = modeling.normalisation(cfg, spec)
    splits = data_mod.load(cfg.data, image_size=size, mean=mean, std=std)
    model, spec = modeling.build(cfg, splits.num_classes, size)
    init_info = None
    if cfg.train.init_weights:
        init_info = modeling.load_init_weights(model, cfg.train.init_weights)
        log.info("train: initial weights from %s (missing %d, unexpected %d%s)", cfg.train.init_weights,
                 len(init_info["missing_keys"]), len(init_info["unexpected_keys"]),
                 f", head replaced: {'; '.join(init_info['replaced_head'])}" if init_info["replaced_head"] else "")

    amp_dtype, amp_note = resolve_amp(cfg.train.amp, device)
    log.info("train: %s on %s (%s), %d classes at %dx%d, %s", cfg.model.name, device,
             f"{world.world_size} processes" if world.enabled else "1 process",
             splits.num_classes, size, size, amp_note)

    record.details.update({
        "device": str(device),
        "world_size": world.world_size,
        "amp_requested": cfg.train.amp,
        "amp": AMP_NAMES[amp_dtype],
        "amp_note": amp_note,
        "seed": cfg.train.seed,
        "deterministic": cfg.train.deterministic,
        "data": {"source": splits.source, "classes": splits.num_classes, "image_size": size, **splits.details},
        "init_weights": init_info,
    })

    result = train_loop(cfg, run_dir, model, spec, splits, device, world, amp_dtype, resume=resume, profile=profile)
    record.details.update(result)
    if world.is_main:
        for name in (CHECKPOINT, BEST_CHECKPOINT, modeling.WEIGHTS, modeling.MODEL_CARD, METRICS, CURVE):
            if run_dir.file(name).exists():
                record.artifact(name)
        if profile and run_dir.file(TRACE).exists():
            record.artifact(TRACE)
    if world.enabled:
        dist.barrier()
        dist.destroy_process_group()


def train_loop(cfg, run_dir: RunDir, model: nn.Module, spec, splits, device, world: Dist, amp_dtype,
               *, resume: bool, profile: bool) -> dict:
    tc = cfg.train
    accumulate = tc.accumulate
    batch_size = cfg.data.batch_size
    sampler = DistributedSampler(splits.train, num_replicas=world.world_size, rank=world.rank,
                                 shuffle=True, seed=tc.seed, drop_last=True)
    batches = EpochBatches(sampler, batch_size)
    batches_per_epoch = len(sampler) // batch_size
    if batches_per_epoch < 1:
        raise UsageError(
            f"the training split has {len(splits.train)} images, fewer than one batch of {batch_size}"
            f"{f' per process ({world.world_size} processes)' if world.enabled else ''}; lower data.batch_size"
        )
    steps_per_epoch = math.ceil(batches_per_epoch / accumulate)
    total_steps = tc.epochs * steps_per_epoch
    warmup_steps = round(tc.warmup_epochs * steps_per_epoch)

    model.to(device)
    if tc.channels_last:
        model.to(memory_format=torch.channels_last)
    optimizer = make_optimizer(cfg, model)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(total_steps, warmup_steps))
    scaler = torch.amp.GradScaler(device.type, enabled=amp_dtype == torch.float16)

    start_epoch, start_batch, step, best_acc, skipped_total = 0, 0, 0, -1.0, 0
    ckpt_path, best_path = run_dir.file(CHECKPOINT), run_dir.file(BEST_CHECKPOINT)
    metrics_path = run_dir.file(METRICS)
    if resume:
        if not ckpt_path.exists():
            raise InputError(f"nothing to resume: {ckpt_path} does not exist; run train without --resume")
        state = load_checkpoint(ckpt_path)
        try:
            unwrap(model).load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            scheduler.load_state_dict(state["scheduler"])
            scaler.load_state_dict(state["scaler"])
        except (KeyError, RuntimeError, ValueError) as exc:
            raise InputError(f"{ckpt_path} does not fit this model/config ({str(exc).splitlines()[0]}); "
                             "train without --resume") from None
        start_epoch, start_batch, step = state["epoch"], state["batch"], state["step"]
        best_acc, skipped_total = state["best_acc"], state["skipped_steps"]
        set_rng_state(state["rng"])
        if state["config"].get("train", {}).get("epochs") != tc.epochs:
            log.warning("train: resuming with train.epochs=%d (checkpoint was made for %s): the LR schedule changes",
                        tc.epochs, state["config"].get("train", {}).get("epochs"))
        log.info("train: resuming from %s at epoch %d, batch %d (step %d)", ckpt_path.name, start_epoch + 1,
                 start_batch, step)
    elif world.is_main:
        metrics_path.unlink(missing_ok=True)
        for stale in (ckpt_path, best_path):
            stale.unlink(missing_ok=True)

    train_model = model
    if tc.compile:
        train_model = torch.compile(model)
    if world.enabled:
        train_model = nn.parallel.DistributedDataParallel(
            train_model, device_ids=[device.index] if device.type == "cuda" else None)

    # Its own generator: each iter(loader) draws a worker base seed, which from the global RNG
    # would shift the dropout masks of a resumed run (one draw more after a mid-epoch resume, or
    # with persistent workers one draw less per epoch), so it would no longer match.
    loader = DataLoader(
        splits.train, batch_sampler=batches, collate_fn=data_mod.collate, num_workers=cfg.data.workers,
        pin_memory=device.type == "cuda", persistent_workers=cfg.data.workers > 0,
        generator=torch.Generator().manual_seed(tc.seed),
    )
    criterion = nn.CrossEntropyLoss(label_smoothing=tc.label_smoothing)
    metrics = MetricsLog(metrics_path, world.is_main,
                         run_dir.file("tensorboard") if tc.tensorboard else None)
    metrics.write({"event": "start" if not resume else "resume", "epoch": start_epoch, "step": step,
                   "time": time.time()})

    def checkpoint_state(epoch: int, batch: int) -> dict:
        return {
            "format": CHECKPOINT_FORMAT,
            "model": unwrap(model).state_dict(),
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "scaler": scaler.state_dict(),
            "epoch": epoch,
            "batch": batch,
            "step": step,
            "best_acc": best_acc,
            "skipped_steps": skipped_total,
            "rng": rng_state(),
            "config": cfg.to_dict(),
            "spec": spec.to_dict(),
            "classes": splits.classes,
        }

    profiler = _start_profiler(device) if profile and world.is_main else None
    nonfinite_run = 0
    history = []
    val_loss = val_acc = float("nan")
    t_train = time.perf_counter()
    images_seen = 0
    from tqdm import tqdm

    for epoch in range(start_epoch, tc.epochs):
        sampler.set_epoch(epoch)
        batches.start = start_batch if epoch == start_epoch else 0
        amp_now = amp_dtype if epoch >= tc.fp32_warmup_epochs else None
        train_model.train()
        bar = tqdm(total=batches_per_epoch, initial=batches.start, desc=f"epoch {epoch + 1}/{tc.epochs}",
                   disable=None if world.is_main else True, leave=False, dynamic_ncols=True)
        t_data, window_images, window_start = 0.0, 0, time.perf_counter()
        t_fetch = time.perf_counter()
        pending_finite, group_loss = True, 0.0
        for batch_index, (x, y) in enumerate(loader, start=batches.start):
            t_data += time.perf_counter() - t_fetch
            if cfg.data.augment:
                x = data_mod.augment(x, batch_generator(tc.seed, epoch, batch_index, world.rank))
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            if tc.channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            # Micro-batches form groups of `accumulate`; the last group of an epoch may be shorter.
            group_start = (batch_index // accumulate) * accumulate
            group_size = min(accumulate, batches_per_epoch - group_start)
            sync = batch_index == group_start + group_size - 1
            last_of_epoch = batch_index == batches_per_epoch - 1
            no_sync = train_model.no_sync() if world.enabled and not sync else contextlib.nullcontext()
            with no_sync:
                with torch.autocast(device.type, dtype=amp_now or torch.float32, enabled=amp_now is not None):
                    logits = train_model(x)
                    loss = criterion(logits.float(), y)
                loss_value = loss.item()
                finite = math.isfinite(loss_value)
                pending_finite = pending_finite and finite
                group_loss += loss_value / group_size
                scaler.scale(loss / group_size).backward()
            images_seen += x.shape[0]
            window_images += x.shape[0]
            if sync:
                step_lr = optimizer.param_groups[0]["lr"]  # the LR this step uses (the scheduler moves it on)
                result = _optimizer_step(tc, train_model, model, optimizer, scaler, scheduler, world, device,
                                         pending_finite, amp_now)
                pending_finite = True
                if result["skipped"]:
                    skipped_total += 1
                if result["nonfinite"]:
                    nonfinite_run += 1
                    log.warning("train: non-finite loss at epoch %d step %d (%d in a row)", epoch + 1, step,
                                nonfinite_run)
                    if nonfinite_run >= tc.max_nonfinite:
                        metrics.close()
                        bar.close()
                        if profiler is not None:
                            profiler.stop()
                        kept = (f"the last good checkpoint ({ckpt_path.name}) is kept" if ckpt_path.exists()
                                else "no checkpoint had been written yet")
                        raise StageFailed(
                            f"the loss was non-finite for {nonfinite_run} consecutive steps (epoch {epoch + 1}, "
                            f"step {step}, lr {step_lr:.3g}); training stopped, {kept}. "
                            "Lower train.lr or use train.amp=fp16/off"
                        )
                else:
                    nonfinite_run = 0
                step += 1 if not result["skipped"] else 0
                if profiler is not None:
                    profiler.step()
                    if profiler.step_num >= cfg.train.profile_steps:
                        _finish_profiler(profiler, run_dir.file(TRACE))
                        profiler = None
                if step % tc.log_every == 0 and not result["skipped"]:  # the same decision on every rank
                    # The step's loss: the mean over its micro-batches and over the ranks.
                    step_loss = all_reduce_sum([group_loss], world, device)[0] / world.world_size
                    now_t = time.perf_counter()
                    elapsed = now_t - window_start
                    metrics.write({  # rank 0 only
                        "event": "step", "epoch": epoch, "step": step, "loss": step_loss,
                        "lr": step_lr, "loss_scale": scaler.get_scale() if scaler.is_enabled() else None,
                        "skipped_steps": skipped_total, "grad_norm": result["grad_norm"],
                        "images_per_s": window_images * world.world_size / max(elapsed, 1e-9),
                        "data_time_share": t_data / max(elapsed, 1e-9),
                    })
                    window_images, window_start, t_data = 0, now_t, 0.0
                group_loss = 0.0
                if (world.is_main and tc.checkpoint_every and step and step % tc.checkpoint_every == 0
                        and not last_of_epoch and not result["skipped"]):
                    save_checkpoint(ckpt_path, checkpoint_state(epoch, batch_index + 1))
            bar.update(1)
            bar.set_postfix(loss=f"{loss_value:.3f}", lr=f"{scheduler.get_last_lr()[0]:.3g}", refresh=False)
            t_fetch = time.perf_counter()
        bar.close()

        broadcast_buffers(model, world)
        val_loss, val_acc = evaluate(model, splits.val, device, world, amp_now, tc.channels_last)
        history.append({"epoch": epoch + 1, "val_loss": val_loss, "val_acc": val_acc})
        metrics.write({"event": "epoch", "epoch": epoch, "step": step, "val_loss": val_loss, "val_acc": val_acc,
                       "amp": AMP_NAMES[amp_now],
                       "skipped_steps": skipped_total})
        log.info("train: epoch %d/%d  val loss %.4f  val acc %.2f%%  (%d skipped steps)", epoch + 1, tc.epochs,
                 val_loss, 100 * val_acc, skipped_total)
        improved = val_acc >= best_acc
        best_acc = max(best_acc, val_acc)
        if world.is_main:
            state = checkpoint_state(epoch + 1, 0)
            save_checkpoint(ckpt_path, state)
            if improved:
                save_checkpoint(best_path, state)
        start_batch = 0

    if profiler is not None:
        _finish_profiler(profiler, run_dir.file(TRACE))
    metrics.close()
    seconds = time.perf_counter() - t_train
    checksums = replica_checksums(model, world)
    if world.enabled:
        if len(set(checksums)) == 1:
            log.info("train: all %d replicas hold identical weights (sha256 %s)", world.world_size, checksums[0][:16])
        else:
            log.warning("train: the replicas' weights differ (sha256 per rank: %s); rank 0's are saved",
                        ", ".join(c[:16] for c in checksums))
    if world.is_main:
        _write_outputs(run_dir, best_path if best_path.exists() else ckpt_path, cfg, spec, splits)
        plot_curves(metrics_path, run_dir.file(CURVE))
    best_state = load_checkpoint(best_path) if world.is_main and best_path.exists() else None
    return {
        "epochs": tc.epochs,
        "steps": step,
        "skipped_steps": skipped_total,
        "final_val_acc": val_acc,
        "final_val_loss": val_loss,
        "best_val_acc": best_acc,
        "best_epoch": best_state["epoch"] if best_state else None,
        "train_seconds": round(seconds, 2),
        "images_per_s": round(images_seen * world.world_size / max(seconds, 1e-9), 1),
        "history": history,
        "final_weights_sha256": checksums[0],  # the final (not the best) weights, see state_checksum
        **({"replica_sha256": checksums, "replicas_identical": len(set(checksums)) == 1} if world.enabled else {}),
    }


def _optimizer_step(tc, train_model, model, optimizer, scaler, scheduler, world: Dist, device, finite: bool,
                    amp_now) -> dict:
    """One optimizer step. Returns whether it was skipped (scaler or non-finite loss) and the grad norm."""
    grad_norm = None
    if not scaler.is_enabled():
        # Without a scaler nothing protects the weights from a NaN/Inf loss: skip such a step on
        # every rank (the decision is reduced so the replicas stay identical).
        ok = all_reduce_sum([0.0 if finite else 1.0], world, device)[0] == 0.0
        if not ok:
            optimizer.zero_grad(set_to_none=True)
            return {"skipped": True, "nonfinite": True, "grad_norm": None}
    if tc.clip_grad_norm:
        scaler.unscale_(optimizer)
        grad_norm = float(nn.utils.clip_grad_norm_(model.parameters(), tc.clip_grad_norm))
    scale_before = scaler.get_scale() if scaler.is_enabled() else None
    # Gradients are all-reduced before this point, so every rank's scaler sees the same inf/NaN
    # and makes the same skip decision.
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    skipped = scaler.is_enabled() and scaler.get_scale() < scale_before
    if not skipped:
        scheduler.step()
    return {"skipped": skipped, "nonfinite": False, "grad_norm": grad_norm}


def _write_outputs(run_dir: RunDir, source: Path, cfg, spec, splits) -> None:
    """``model.safetensors`` (best weights) and ``model.json`` (everything a deployment needs to know)."""
    from safetensors.torch import save_file

    state = load_checkpoint(source)
    weights = {k: v.contiguous() for k, v in state["model"].items()}
    with atomic_path(run_dir.file(modeling.WEIGHTS)) as tmp:
        save_file(weights, str(tmp), metadata={"model": cfg.model.name, "epoch": str(state["epoch"])})
    modeling.write_card(run_dir, {
        "model": cfg.model.name,
        "spec": spec.to_dict(),
        "classes": splits.classes,
        "weights": modeling.WEIGHTS,
        "weights_epoch": state["epoch"],
        "val_acc": state["best_acc"],
        "input": {"name": spec.input_name, "shape": ["batch", *spec.input_size], "dtype": "float32",
                  "layout": "NCHW", "normalisation": {"mean": list(spec.mean), "std": list(spec.std)}},
        "output": {"name": spec.output_name, "shape": ["batch", spec.num_classes], "meaning": "logits"},
    })


def _start_profiler(device):
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    prof = profile(activities=activities, record_shapes=False)
    prof.start()
    return prof


def _finish_profiler(prof, path: Path) -> None:
    prof.stop()
    with atomic_path(path) as tmp:
        prof.export_chrome_trace(str(tmp))
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=10)
    log.info("train: profile of %d steps written to %s (open in https://ui.perfetto.dev)\n%s", prof.step_num,
             path.name, table)
