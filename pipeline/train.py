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
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, Sampler

from pipeline import data as data_mod
from pipeline import env, modeling
from pipeline.artifacts import BEST_CHECKPOINT, CHECKPOINT, CURVE, METRICS, TENSORBOARD, TRACE
from pipeline.errors import BackendUnavailable, InputError, StageFailed, UsageError, check_interrupt
from pipeline.run import RunDir, StageRecord, atomic_path

log = logging.getLogger("pipeline")

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
    restore_cuda_rng(state.get("cuda") or [])


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
    # modulo 2**64: manual_seed takes no more, which train.seed above about 180,000 would exceed
    return torch.Generator().manual_seed((((seed * 1_000_003 + epoch) * 1_000_003 + batch) * 101 + rank) % 2**64)


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
        from pipeline.run import open_append

        self.enabled = enabled
        self.f = open_append(path) if enabled else None  # never through a symbolic link
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
            self.f = None
        if self.tb is not None:
            self.tb.close()
            self.tb = None

    def __enter__(self) -> MetricsLog:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


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
        x, y = data_mod.collate(data_mod.fetch_items(dataset, indices[i : i + batch_size]))
        x, y = x.to(device), y.to(device)
        if channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        with torch.autocast(device.type, dtype=amp_dtype or torch.float32, enabled=amp_dtype is not None):
            logits = model(x)
        loss_sum += nn.functional.cross_entropy(logits.float(), y, reduction="sum").item()
        correct += (logits.argmax(1) == y).sum().item()
    loss_sum, correct, count = all_reduce_sum([loss_sum, correct, float(len(indices))], world, device)
    return loss_sum / max(count, 1), correct / max(count, 1)




# --------------------------------------------------------------------------- state and steps


@dataclass
class TrainState:
    """Where training stands; saved in every checkpoint, so a resumed run continues exactly."""

    epoch: int = 0  # the epoch running (or next to run)
    batch: int = 0  # the next batch of that epoch
    step: int = 0  # optimizer steps taken (a skipped step is no step)
    best_acc: float = -1.0
    skipped_steps: int = 0

    def state_dict(self) -> dict:
        return asdict(self)

    def load_state_dict(self, state: dict) -> None:
        for key in asdict(self):
            setattr(self, key, state[key])


@dataclass
class StepResult:
    skipped: bool  # the weights, buffers and schedule were left as they were
    nonfinite: bool  # ... because the loss or the gradients were NaN/Inf
    grad_norm: float | None = None


def snapshot_buffers(model: nn.Module) -> list[torch.Tensor]:
    """Copies of the buffers (BatchNorm running statistics), taken before a step's first forward pass."""
    return [b.detach().clone() for b in model.buffers()]


def restore_buffers(model: nn.Module, saved: list[torch.Tensor]) -> None:
    with torch.no_grad():
        for buffer, value in zip(model.buffers(), saved):
            buffer.copy_(value)


def grads_finite(model: nn.Module) -> bool:
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    return not grads or bool(torch.stack([torch.isfinite(g).all() for g in grads]).all())


def optimizer_step(*, model: nn.Module, optimizer, scaler, scheduler, clip_grad_norm: float | None,
                   world: Dist, device, loss_finite: bool) -> StepResult:
    """One optimizer step, skipped when its loss or gradients are not finite.

    With float16 the GradScaler finds inf/NaN gradients and skips the step. In bf16 and FP32
    nothing else would, so the same check is made here: a bf16 kernel can return NaN gradients
    from a finite loss (see docs/training.md), and one such step poisons the weights for good.
    The decision is reduced over the ranks, so the replicas stay identical. The caller restores
    the buffers of a skipped step.
    """
    if not scaler.is_enabled():
        ok = loss_finite and grads_finite(model)
        if all_reduce_sum([0.0 if ok else 1.0], world, device)[0] != 0.0:
            optimizer.zero_grad(set_to_none=True)
            return StepResult(skipped=True, nonfinite=True)
    grad_norm = None
    if clip_grad_norm:
        scaler.unscale_(optimizer)
        grad_norm = float(nn.utils.clip_grad_norm_(model.parameters(), clip_grad_norm))
    scale_before = scaler.get_scale() if scaler.is_enabled() else None
    # Gradients are all-reduced before this point, so every rank's scaler sees the same inf/NaN
    # and makes the same skip decision.
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    skipped = scaler.is_enabled() and scaler.get_scale() < scale_before
    if not skipped:
        scheduler.step()
    return StepResult(skipped=skipped, nonfinite=skipped and not loss_finite, grad_norm=grad_norm)


class StepProfiler:
    """torch.profiler over the first ``steps`` optimizer steps; a no-op when profiling is off."""

    def __init__(self, device, steps: int, trace: Path | None):
        self.steps, self.trace, self.prof = steps, trace, None
        if trace is not None:
            from torch.profiler import ProfilerActivity, profile

            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
            self.prof = profile(activities=activities, record_shapes=False)
            self.prof.start()

    def step(self) -> None:
        if self.prof is not None:
            self.prof.step()
            if self.prof.step_num >= self.steps:
                self.finish()

    def finish(self) -> None:
        """Stop and write the Chrome trace (at the last profiled step or the end of training)."""
        if self.prof is None:
            return
        prof, self.prof = self.prof, None
        prof.stop()
        with atomic_path(self.trace) as tmp:
            prof.export_chrome_trace(str(tmp))
        table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=10)
        log.info("train: profile of %d steps written to %s (open in https://ui.perfetto.dev)\n%s", prof.step_num,
                 self.trace.name, table)

    def close(self) -> None:
        """Stop without writing (an interrupted or failed run)."""
        if self.prof is not None:
            self.prof.stop()
            self.prof = None


# --------------------------------------------------------------------------- the recipe


@dataclass
class StepGroup:
    """The micro-batches of one optimizer step (``train.accumulate`` of them)."""

    loss: float = 0.0  # their mean loss
    finite: bool = True  # every loss was finite
    buffers: list | None = None  # the buffers before the first forward pass, restored if the step is skipped


@dataclass
class Window:
    """Throughput between two metrics lines."""

    start: float = field(default_factory=time.perf_counter)
    images: int = 0
    data_s: float = 0.0


def build_loader(cfg, dataset, world: Dist, device) -> tuple[DistributedSampler, EpochBatches, DataLoader]:
    batch_size = cfg.data.batch_size
    sampler = DistributedSampler(dataset, num_replicas=world.world_size, rank=world.rank, shuffle=True,
                                 seed=cfg.train.seed, drop_last=True)
    if len(sampler) // batch_size < 1:
        raise UsageError(
            f"the training split has {len(dataset)} images, fewer than one batch of {batch_size}"
            f"{f' per process ({world.world_size} processes)' if world.enabled else ''}; lower data.batch_size"
        )
    batches = EpochBatches(sampler, batch_size)
    # Its own generator: each iter(loader) draws a worker base seed, which from the global RNG
    # would shift the dropout masks of a resumed run (one draw more after a mid-epoch resume, or
    # with persistent workers one draw less per epoch), so it would no longer match.
    loader = DataLoader(
        dataset, batch_sampler=batches, collate_fn=data_mod.collate, num_workers=cfg.data.workers,
        pin_memory=device.type == "cuda", persistent_workers=cfg.data.workers > 0,
        generator=torch.Generator().manual_seed(cfg.train.seed),
    )
    return sampler, batches, loader


def wrap_for_training(model: nn.Module, tc, world: Dist, device) -> nn.Module:
    """The module the loop calls: torch.compile'd and/or DDP-wrapped as configured."""
    if tc.compile:
        model = torch.compile(model)
    if world.enabled:
        model = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    return model


class Trainer:
    """The training recipe: set up in ``__init__``, then :meth:`train`; each piece below does one thing."""

    def __init__(self, cfg, run_dir: RunDir, model: nn.Module, spec, splits, device, world: Dist, amp_dtype):
        self.cfg, self.tc, self.run_dir = cfg, cfg.train, run_dir
        self.model, self.spec, self.splits = model, spec, splits
        self.device, self.world, self.amp_dtype = device, world, amp_dtype
        self.sampler, self.batches, self.loader = build_loader(cfg, splits.train, world, device)
        self.batches_per_epoch = len(self.sampler) // cfg.data.batch_size
        steps_per_epoch = math.ceil(self.batches_per_epoch / self.tc.accumulate)
        warmup_steps = round(self.tc.warmup_epochs * steps_per_epoch)
        model.to(device)
        if self.tc.channels_last:
            model.to(memory_format=torch.channels_last)
        self.optimizer = make_optimizer(cfg, model)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lr_lambda(self.tc.epochs * steps_per_epoch, warmup_steps))
        self.scaler = torch.amp.GradScaler(device.type, enabled=amp_dtype == torch.float16)
        self.criterion = nn.CrossEntropyLoss(label_smoothing=self.tc.label_smoothing)
        self.ckpt_path, self.best_path = run_dir.file(CHECKPOINT), run_dir.file(BEST_CHECKPOINT)
        self.state = TrainState()
        self.train_model: nn.Module = model
        self.metrics: MetricsLog | None = None
        self.profiler = StepProfiler(device, 0, None)
        self.amp_now = None
        self.window = Window()
        self.history: list[dict] = []
        self.nonfinite_run = 0
        self.images_seen = 0

    def train(self, *, resume: bool, profile: bool) -> dict:
        """Run the remaining epochs; returns the facts recorded in the manifest."""
        self.resume() if resume else self.start_fresh()
        self.train_model = wrap_for_training(self.model, self.tc, self.world, self.device)
        t_train = time.perf_counter()
        trace = self.run_dir.file(TRACE) if profile and self.world.is_main else None
        # Whatever ends the loop (the end, an error, Ctrl-C) closes the metrics file and the profiler.
        with contextlib.ExitStack() as stack:
            self.metrics = stack.enter_context(MetricsLog(
                self.run_dir.file(METRICS), self.world.is_main,
                self.run_dir.file(TENSORBOARD) if self.tc.tensorboard else None))
            self.profiler = StepProfiler(self.device, self.cfg.train.profile_steps, trace)
            stack.callback(self.profiler.close)
            self.metrics.write({"event": "resume" if resume else "start", "epoch": self.state.epoch,
                                "step": self.state.step, "time": time.time()})
            for epoch in range(self.state.epoch, self.tc.epochs):
                self.train_epoch(epoch)
                self.end_epoch(epoch)
            self.profiler.finish()
        return self.finish(time.perf_counter() - t_train)

    def start_fresh(self) -> None:
        if self.world.is_main:
            for stale in (self.run_dir.file(METRICS), self.ckpt_path, self.best_path):
                stale.unlink(missing_ok=True)

    def resume(self) -> None:
        if not self.ckpt_path.exists():
            raise InputError(f"nothing to resume: {self.ckpt_path} does not exist; run train without --resume")
        state = load_checkpoint(self.ckpt_path)
        try:
            unwrap(self.model).load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
            self.scheduler.load_state_dict(state["scheduler"])
            self.scaler.load_state_dict(state["scaler"])
            self.state.load_state_dict(state)
        except (KeyError, RuntimeError, ValueError) as exc:
            raise InputError(f"{self.ckpt_path} does not fit this model/config ({str(exc).splitlines()[0]}); "
                             "train without --resume") from None
        set_rng_state(state["rng"])
        made_for = state["config"].get("train", {}).get("epochs")
        if made_for != self.tc.epochs:
            log.warning("train: resuming with train.epochs=%d (checkpoint was made for %s): the LR schedule changes",
                        self.tc.epochs, made_for)
        log.info("train: resuming from %s at epoch %d, batch %d (step %d)", self.ckpt_path.name,
                 self.state.epoch + 1, self.state.batch, self.state.step)

    def checkpoint_state(self) -> dict:
        return {
            "format": CHECKPOINT_FORMAT,
            "model": unwrap(self.model).state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            **self.state.state_dict(),
            "rng": rng_state(),
            "config": self.cfg.to_dict(),
            "spec": self.spec.to_dict(),
            "classes": self.splits.classes,
        }

    def train_epoch(self, epoch: int) -> None:
        from tqdm import tqdm

        self.sampler.set_epoch(epoch)
        self.batches.start = self.state.batch
        self.amp_now = self.amp_dtype if epoch >= self.tc.fp32_warmup_epochs else None
        self.train_model.train()
        self.window = Window()
        group = StepGroup()
        with tqdm(total=self.batches_per_epoch, initial=self.batches.start, desc=f"epoch {epoch + 1}/{self.tc.epochs}",
                  disable=None if self.world.is_main else True, leave=False, dynamic_ncols=True) as bar:
            t_fetch = time.perf_counter()
            for batch_index, (x, y) in enumerate(self.loader, start=self.batches.start):
                self.window.data_s += time.perf_counter() - t_fetch
                # Micro-batches form groups of `accumulate`; the last group of an epoch may be shorter.
                group_start = (batch_index // self.tc.accumulate) * self.tc.accumulate
                group_size = min(self.tc.accumulate, self.batches_per_epoch - group_start)
                sync = batch_index == group_start + group_size - 1
                loss_value = self.micro_step(x, y, epoch, batch_index, group, group_size, sync)
                if sync:
                    self.step(epoch, batch_index, group)
                    group = StepGroup()
                bar.update(1)
                bar.set_postfix(loss=f"{loss_value:.3f}", lr=f"{self.scheduler.get_last_lr()[0]:.3g}", refresh=False)
                t_fetch = time.perf_counter()

    def micro_step(self, x, y, epoch: int, batch_index: int, group: StepGroup, group_size: int, sync: bool) -> float:
        """Forward and backward of one micro-batch; gradients accumulate until ``sync``."""
        check_interrupt()
        if self.cfg.data.augment:
            x = data_mod.augment(x, batch_generator(self.tc.seed, epoch, batch_index, self.world.rank))
        x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
        if self.tc.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        if group.buffers is None:
            group.buffers = snapshot_buffers(unwrap(self.model))
        amp = self.amp_now
        no_sync = self.train_model.no_sync() if self.world.enabled and not sync else contextlib.nullcontext()
        with no_sync:
            with torch.autocast(self.device.type, dtype=amp or torch.float32, enabled=amp is not None):
                logits = self.train_model(x)
                loss = self.criterion(logits.float(), y)
            loss_value = loss.item()
            group.finite = group.finite and math.isfinite(loss_value)
            group.loss += loss_value / group_size
            self.scaler.scale(loss / group_size).backward()
        self.images_seen += x.shape[0]
        self.window.images += x.shape[0]
        return loss_value

    def step(self, epoch: int, batch_index: int, group: StepGroup) -> None:
        """The optimizer step ending a group, then its bookkeeping (skips, log line, periodic checkpoint)."""
        step_lr = self.optimizer.param_groups[0]["lr"]  # the LR this step uses (the scheduler moves it on)
        result = optimizer_step(model=self.model, optimizer=self.optimizer, scaler=self.scaler,
                                scheduler=self.scheduler, clip_grad_norm=self.tc.clip_grad_norm, world=self.world,
                                device=self.device, loss_finite=group.finite)
        if result.skipped:
            restore_buffers(unwrap(self.model), group.buffers)
        self.count_nonfinite(result, epoch, step_lr)
        st = self.state
        st.skipped_steps += int(result.skipped)
        st.step += int(not result.skipped)
        st.batch = batch_index + 1
        self.profiler.step()
        if result.skipped:
            return
        if st.step % self.tc.log_every == 0:  # the same decision on every rank
            self.log_step(epoch, step_lr, group.loss, result.grad_norm)
        last_of_epoch = batch_index == self.batches_per_epoch - 1
        if self.world.is_main and self.tc.checkpoint_every and st.step % self.tc.checkpoint_every == 0 \
                and not last_of_epoch:
            save_checkpoint(self.ckpt_path, self.checkpoint_state())

    def count_nonfinite(self, result: StepResult, epoch: int, step_lr: float) -> None:
        """Consecutive non-finite steps are skipped and counted; ``train.max_nonfinite`` of them stop training."""
        if not result.nonfinite:
            self.nonfinite_run = 0
            return
        self.nonfinite_run += 1
        log.warning("train: non-finite loss or gradients at epoch %d step %d (%d in a row): step skipped, "
                    "weights and BatchNorm statistics kept", epoch + 1, self.state.step, self.nonfinite_run)
        if self.nonfinite_run >= self.tc.max_nonfinite:
            raise StageFailed(
                f"the loss or its gradients were non-finite for {self.nonfinite_run} consecutive steps "
                f"(epoch {epoch + 1}, step {self.state.step}, lr {step_lr:.3g}); training stopped, "
                f"{self.kept_checkpoint()}. {self.advice()}")

    def kept_checkpoint(self) -> str:
        if self.ckpt_path.exists():
            return f"the last good checkpoint ({self.ckpt_path.name}) is kept"
        return "no checkpoint had been written yet"

    def advice(self) -> str:
        tip = f"Lower train.lr (now {self.tc.lr:g})"
        if self.amp_dtype == torch.bfloat16:
            return tip + " or use train.amp=off: some CPU bf16 kernels return NaN gradients (docs/training.md)"
        return tip + (" or use train.amp=off" if self.amp_dtype is not None else " or set train.clip_grad_norm")

    def log_step(self, epoch: int, step_lr: float, group_loss: float, grad_norm: float | None) -> None:
        # The step's loss: the mean over its micro-batches and over the ranks.
        step_loss = all_reduce_sum([group_loss], self.world, self.device)[0] / self.world.world_size
        now = time.perf_counter()
        elapsed = max(now - self.window.start, 1e-9)
        self.metrics.write({  # rank 0 only
            "event": "step", "epoch": epoch, "step": self.state.step, "loss": step_loss, "lr": step_lr,
            "loss_scale": self.scaler.get_scale() if self.scaler.is_enabled() else None,
            "skipped_steps": self.state.skipped_steps, "grad_norm": grad_norm,
            "images_per_s": self.window.images * self.world.world_size / elapsed,
            "data_time_share": self.window.data_s / elapsed,
        })
        self.window = Window(start=now)

    def end_epoch(self, epoch: int) -> None:
        """Validate, log, fail on divergence, and checkpoint (the best one too when it improved)."""
        broadcast_buffers(self.model, self.world)
        val_loss, val_acc = evaluate(self.model, self.splits.val, self.device, self.world, self.amp_now,
                                     self.tc.channels_last)
        st = self.state
        self.history.append({"epoch": epoch + 1, "val_loss": val_loss, "val_acc": val_acc})
        self.metrics.write({"event": "epoch", "epoch": epoch, "step": st.step, "val_loss": val_loss,
                            "val_acc": val_acc, "amp": AMP_NAMES[self.amp_now], "skipped_steps": st.skipped_steps})
        log.info("train: epoch %d/%d  val loss %.4f  val acc %.2f%%  (%d skipped steps)", epoch + 1, self.tc.epochs,
                 val_loss, 100 * val_acc, st.skipped_steps)
        if not math.isfinite(val_loss):
            raise StageFailed(f"training diverged: the validation loss is {val_loss} after epoch {epoch + 1} "
                              f"({st.skipped_steps} steps skipped); {self.kept_checkpoint()}. {self.advice()}")
        improved = val_acc >= st.best_acc
        st.best_acc = max(st.best_acc, val_acc)
        st.epoch, st.batch = epoch + 1, 0
        if self.world.is_main:
            state = self.checkpoint_state()
            save_checkpoint(self.ckpt_path, state)
            if improved:
                save_checkpoint(self.best_path, state)

    def finish(self, seconds: float) -> dict:
        """Check the replicas agree, write the deployable weights and the curve; the facts for the manifest."""
        world, st = self.world, self.state
        checksums = replica_checksums(self.model, world)
        if world.enabled:
            if len(set(checksums)) == 1:
                log.info("train: all %d replicas hold identical weights (sha256 %s)", world.world_size,
                         checksums[0][:16])
            else:
                log.warning("train: the replicas' weights differ (sha256 per rank: %s); rank 0's are saved",
                            ", ".join(c[:16] for c in checksums))
        best_state = None
        if world.is_main:
            source = self.best_path if self.best_path.exists() else self.ckpt_path
            _write_outputs(self.run_dir, source, self.cfg, self.spec, self.splits)
            plot_curves(self.run_dir.file(METRICS), self.run_dir.file(CURVE))
            best_state = load_checkpoint(self.best_path) if self.best_path.exists() else None
        last = self.history[-1] if self.history else {"val_loss": float("nan"), "val_acc": float("nan")}
        return {
            "epochs": self.tc.epochs,
            "steps": st.step,
            "skipped_steps": st.skipped_steps,
            "final_val_acc": last["val_acc"],
            "final_val_loss": last["val_loss"],
            "best_val_acc": st.best_acc,
            "best_epoch": best_state["epoch"] if best_state else None,
            "train_seconds": round(seconds, 2),
            "images_per_s": round(self.images_seen * world.world_size / max(seconds, 1e-9), 1),
            "history": self.history,
            "final_weights_sha256": checksums[0],  # the final (not the best) weights, see state_checksum
            **({"replica_sha256": checksums, "replicas_identical": len(set(checksums)) == 1}
               if world.enabled else {}),
        }


# --------------------------------------------------------------------------- the stage


def run(cfg, run_dir: RunDir, record: StageRecord, *, resume: bool = False, profile: bool = False) -> None:
    """Train ``cfg.model`` on ``cfg.data`` into ``run_dir`` (checkpoints, weights, metrics, curve)."""
    device = resolve_device(cfg)
    world = init_distributed(device.type)
    if not world.is_main:
        logging.getLogger("pipeline").setLevel(logging.WARNING)
    seed_everything(cfg.train.seed, cfg.train.deterministic)
    model, spec, splits, size, init_info = _model_and_data(cfg)
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
    trainer = Trainer(cfg, run_dir, model, spec, splits, device, world, amp_dtype)
    record.details.update(trainer.train(resume=resume, profile=profile))
    if world.is_main:
        for name in (CHECKPOINT, BEST_CHECKPOINT, modeling.WEIGHTS, modeling.MODEL_CARD, METRICS, CURVE):
            if run_dir.file(name).exists():
                record.artifact(name)
        if profile and run_dir.file(TRACE).exists():
            record.artifact(TRACE)
    if world.enabled:
        dist.barrier()
        dist.destroy_process_group()


def _model_and_data(cfg):
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
    return model, spec, splits, size, init_info


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


