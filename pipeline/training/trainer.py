"""The training recipe: :class:`Trainer` (AMP loop, accumulation, clipping, DDP, checkpoints with resume, metrics,
precise BatchNorm, the learning check's evidence). ``pipeline.train`` runs it as the train stage; ``pipeline.qat``
runs a subclass of it (quantization-aware fine-tuning) with its own files and loss.

The :class:`Trainer` follows the usual AMP recipe: an explicit ``torch.autocast``
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
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler

from pipeline.core import data as data_mod
from pipeline.core import modeling
from pipeline.core.artifacts import BEST_CHECKPOINT, CHECKPOINT, CURVE, METRICS, TENSORBOARD, TRACE
from pipeline.core.errors import InputError, StageFailed, UsageError, check_interrupt, first_line
from pipeline.core.model_card import ModelCard
from pipeline.core.run import RunDir, atomic_path
from pipeline.training import batchnorm, learning
from pipeline.training import detection as detection_training
from pipeline.training.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from pipeline.training.device import AMP_NAMES
from pipeline.training.distributed import (
    Dist,
    all_reduce_sum,
    average_buffers,
    broadcast_buffers,
    replica_checksums,
    unwrap,
)
from pipeline.training.metrics import MetricsLog, evaluate, plot_curves, predict
from pipeline.training.optim import (
    StepResult,
    lr_lambda,
    make_optimizer,
    optimizer_step,
    restore_buffers,
    snapshot_buffers,
)
from pipeline.training.profiler import StepProfiler
from pipeline.training.records import (
    EpochLine,
    EpochRecord,
    PreciseBnDetails,
    QatTrainResult,
    RunLine,
    StepLine,
    TrainResult,
)
from pipeline.training.rng import EpochBatches, batch_generator, rng_state, set_rng_state

if TYPE_CHECKING:  # annotations only
    from pipeline.core.config_schema import Config, TrainConfig

log = logging.getLogger("pipeline")

MODE_CHECK_IMAGES = 256  # validation images the learning check predicts in train mode and in eval mode


# --------------------------------------------------------------------------- state and steps


@dataclass
class TrainState:
    """Where training stands; saved in every checkpoint, so a resumed run continues exactly."""

    epoch: int = 0  # the epoch running (or next to run)
    batch: int = 0  # the next batch of that epoch
    step: int = 0  # optimizer steps taken (a skipped step is no step)
    best_acc: float = -1.0
    skipped_steps: int = 0

    def restore(self, checkpoint: Checkpoint) -> None:
        self.epoch, self.batch, self.step = checkpoint.epoch, checkpoint.batch, checkpoint.step
        self.best_acc, self.skipped_steps = checkpoint.best_acc, checkpoint.skipped_steps


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


def build_loader(cfg: Config, dataset, world: Dist, device) -> tuple[DistributedSampler, EpochBatches, DataLoader]:
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



@contextlib.contextmanager
def sigchld_kept():
    """Put back the SIGCHLD handler that training found. DataLoader's worker processes (``data.workers`` > 0) install
    one for the whole process, once, and never remove it, so every command run after train in the same process
    (``all``, a caller of ``cli.main``) would take each child's end through it; a test process that went on to
    benchmark after such a train died with SIGSEGV (2026-12-05). The loader still notices a dead worker by its own
    polling."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.getsignal(signal.SIGCHLD)
    try:
        yield
    finally:
        if before is not None and signal.getsignal(signal.SIGCHLD) is not before:
            signal.signal(signal.SIGCHLD, before)

class Trainer:
    """The training recipe: set up in ``__init__``, then :meth:`train`; each piece below does one thing."""

    # What it was given
    cfg: Config  # the whole config; ``tc`` is its train section
    tc: TrainConfig
    run_dir: RunDir
    spec: dict  # the model card's spec (input/output names and size)
    splits: object  # data.DataSplits: train and validation sets
    # The model and where it runs
    model: nn.Module  # the bare model: what is checkpointed and exported
    train_model: nn.Module  # what the steps call: ``model`` wrapped for DDP / torch.compile
    device: torch.device
    world: Dist  # this process's rank among the torchrun processes (one process: rank 0 of 1)
    amp_dtype: torch.dtype | None  # the autocast dtype, None: FP32
    # Data
    sampler: DistributedSampler
    batches: EpochBatches
    loader: DataLoader
    batches_per_epoch: int
    # Optimisation
    bn_layers: int  # BatchNorm layers with running statistics (train.precise_bn re-estimates them)
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    scaler: torch.amp.GradScaler  # enabled for float16 only
    criterion: nn.Module
    # Progress: what a checkpoint restores (``state``) and what only this process tracks
    state: TrainState
    ckpt_path: Path
    best_path: Path
    history: list[EpochRecord]  # per-epoch results, for the manifest
    nonfinite_run: int  # consecutive non-finite steps (train.max_nonfinite stops the run)
    images_seen: int
    amp_now: torch.dtype | None  # the autocast dtype of this epoch (None during train.fp32_warmup_epochs)
    # Output (the file names are the class's: a subclass, QAT's, writes its own)
    checkpoint_name: str = CHECKPOINT
    best_name: str = BEST_CHECKPOINT
    metrics_name: str = METRICS
    stage_name: str = "train"  # the command, in messages
    epochs_setting: str = "train.epochs"  # the setting that says how many epochs run (QAT's: qat.epochs)
    metrics: MetricsLog | None
    profiler: StepProfiler
    window: Window  # throughput since the last metrics line

    def __init__(self, cfg: Config, run_dir: RunDir, model: nn.Module, spec, splits, device, world: Dist, amp_dtype):
        self.cfg, self.tc, self.run_dir = cfg, cfg.train, run_dir
        self.model, self.spec, self.splits = model, spec, splits
        self.detection = getattr(spec, "task", "classification") == "detection"  # the task plug: pipeline.core.tasks
        self.device, self.world, self.amp_dtype = device, world, amp_dtype
        self.sampler, self.batches, self.loader = build_loader(cfg, splits.train, world, device)
        self.batches_per_epoch = len(self.sampler) // cfg.data.batch_size
        steps_per_epoch = math.ceil(self.batches_per_epoch / self.tc.accumulate)
        warmup_steps = round(self.tc.warmup_epochs * steps_per_epoch)
        model.to(device)
        self.bn_layers = batchnorm.set_momentum(model, self.tc.bn_momentum)
        if self.tc.channels_last:
            model.to(memory_format=torch.channels_last)
        self.optimizer = make_optimizer(cfg, model)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lr_lambda(self.tc.epochs * steps_per_epoch, warmup_steps))
        self.scaler = torch.amp.GradScaler(device.type, enabled=amp_dtype == torch.float16)
        self.criterion = nn.CrossEntropyLoss(label_smoothing=self.tc.label_smoothing)
        self.ckpt_path, self.best_path = run_dir.file(self.checkpoint_name), run_dir.file(self.best_name)
        self.state = TrainState()
        self.train_model: nn.Module = model
        self.metrics: MetricsLog | None = None
        self.profiler = StepProfiler(device, 0, None)
        self.amp_now = None
        self.window = Window()
        self.history: list[EpochRecord] = []
        self.nonfinite_run = 0
        self.images_seen = 0

    def train(self, *, resume: bool, profile: bool) -> TrainResult | QatTrainResult:
        """Run the remaining epochs; returns the facts recorded in the manifest."""
        self.resume() if resume else self.start_fresh()
        self.train_model = wrap_for_training(self.model, self.tc, self.world, self.device)
        t_train = time.perf_counter()
        trace = self.run_dir.file(TRACE) if profile and self.world.is_main else None
        # Whatever ends the loop (the end, an error, Ctrl-C) closes the metrics file and the profiler.
        with contextlib.ExitStack() as stack:
            stack.enter_context(sigchld_kept())
            self.metrics = stack.enter_context(MetricsLog(
                self.run_dir.file(self.metrics_name), self.world.is_main,
                self.run_dir.file(TENSORBOARD) if self.tc.tensorboard else None))
            self.profiler = StepProfiler(self.device, self.cfg.train.profile_steps, trace)
            stack.callback(self.profiler.close)
            self.metrics.write(RunLine(event="resume" if resume else "start", epoch=self.state.epoch,
                                       step=self.state.step, time=time.time()))
            for epoch in range(self.state.epoch, self.tc.epochs):
                self.train_epoch(epoch)
                self.end_epoch(epoch)
            self.profiler.finish()
        return self.finish(time.perf_counter() - t_train)

    def start_fresh(self) -> None:
        if self.world.is_main:
            for stale in (self.run_dir.file(self.metrics_name), self.ckpt_path, self.best_path):
                stale.unlink(missing_ok=True)

    def resume(self) -> None:
        if not self.ckpt_path.exists():
            raise InputError(f"nothing to resume: {self.ckpt_path} does not exist; run train without --resume")
        saved = load_checkpoint(self.ckpt_path)
        try:
            unwrap(self.model).load_state_dict(saved.model)
            self.optimizer.load_state_dict(saved.optimizer)
            self.scheduler.load_state_dict(saved.scheduler)
            self.scaler.load_state_dict(saved.scaler)
            self.state.restore(saved)
        except (KeyError, RuntimeError, ValueError) as exc:
            raise InputError(f"{self.ckpt_path} does not fit this model/config ({first_line(exc)}); "
                             "train without --resume") from None
        set_rng_state(saved.rng)
        ran = self.state.epoch + (1 if self.state.batch else 0)  # epochs the checkpoint has begun or finished
        if ran > self.tc.epochs:  # more than asked for already: resuming would record epochs that never ran
            raise InputError(f"{self.ckpt_path.name} has already trained {ran} epochs, more than "
                             f"{self.epochs_setting}={self.tc.epochs}: set {self.epochs_setting} to {ran} or more to "
                             f"resume it, or run {self.stage_name} without --resume")
        made_for = saved.made_for_epochs
        if made_for != self.tc.epochs:
            log.warning("%s: resuming with %s=%d (checkpoint was made for %s): the LR schedule changes",
                        self.stage_name, self.epochs_setting, self.tc.epochs, made_for)
        log.info("%s: resuming from %s at epoch %d, batch %d (step %d)", self.stage_name, self.ckpt_path.name,
                 self.state.epoch + 1, self.state.batch, self.state.step)

    def checkpoint_state(self) -> Checkpoint:
        st = self.state
        return Checkpoint(
            model=unwrap(self.model).state_dict(), optimizer=self.optimizer.state_dict(),
            scheduler=self.scheduler.state_dict(), scaler=self.scaler.state_dict(),
            epoch=st.epoch, batch=st.batch, step=st.step, best_acc=st.best_acc, skipped_steps=st.skipped_steps,
            rng=rng_state(), config=self.cfg.to_dict(), spec=self.spec.to_dict(), classes=self.splits.classes)

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
        if self.cfg.data.augment and not self.detection:  # crops and flips would move a detector's boxes
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
                loss = self.loss(logits, x, y)
            loss_value = loss.item()
            group.finite = group.finite and math.isfinite(loss_value)
            group.loss += loss_value / group_size
            self.scaler.scale(loss / group_size).backward()
        self.images_seen += x.shape[0]
        self.window.images += x.shape[0]
        return loss_value

    def loss(self, logits: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The loss of one micro-batch (inside its autocast region); QAT's distils from the FP32 model."""
        if self.detection:
            post = unwrap(self.model).postprocess
            return detection_training.loss(logits, y, post.num_classes, post.stride)
        return self.criterion(logits.float(), y)

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
        self.metrics.write(StepLine(  # rank 0 only
            epoch=epoch, step=self.state.step, loss=step_loss, lr=step_lr,
            loss_scale=self.scaler.get_scale() if self.scaler.is_enabled() else None,
            skipped_steps=self.state.skipped_steps, grad_norm=grad_norm,
            images_per_s=self.window.images * self.world.world_size / elapsed,
            data_time_share=self.window.data_s / elapsed,
        ))
        self.window = Window(start=now)

    def end_epoch(self, epoch: int) -> None:
        """Re-estimate the BatchNorm statistics, validate, log, fail on divergence, and checkpoint (the best one too
        when it improved): the best epoch is chosen, and saved, with the statistics that are exported."""
        broadcast_buffers(self.model, self.world)
        before = self.precise_bn(epoch)
        val_loss, val_acc = self.validate()
        st = self.state
        self.history.append(EpochRecord(epoch=epoch + 1, val_loss=val_loss, val_acc=val_acc,
                                        val_acc_before_precise_bn=before))
        self.metrics.write(EpochLine(epoch=epoch, step=st.step, val_loss=val_loss, val_acc=val_acc,
                                     val_acc_before_precise_bn=before, amp=AMP_NAMES[self.amp_now],
                                     skipped_steps=st.skipped_steps))
        log.info("train: epoch %d/%d  val loss %.4f  %s %.2f%%%s  (%d skipped steps)", epoch + 1, self.tc.epochs,
                 val_loss, "val mAP@0.5:0.95" if self.detection else "val acc", 100 * val_acc,
                 "" if before is None else f" ({100 * before:.2f}% before precise BN)", st.skipped_steps)
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

    def validate(self) -> tuple[float, float]:
        if self.detection:  # loss and mAP@0.5:0.95 (recorded where a classifier's accuracy is)
            return detection_training.evaluate(unwrap(self.model), self.splits.val, self.device, self.amp_now,
                                               self.tc.channels_last)
        return evaluate(self.model, self.splits.val, self.device, self.world, self.amp_now, self.tc.channels_last)

    def precise_bn(self, epoch: int) -> float | None:
        """``train.precise_bn``: every BatchNorm's running statistics re-estimated over this epoch's first training
        batches (averaged over the ranks); returns the validation accuracy before, None where nothing was done."""
        if not self.tc.precise_bn.enabled or not self.bn_layers:
            return None
        _, before = self.validate()
        model = unwrap(self.model)
        batchnorm.recompute_statistics(model, self.precise_batches(epoch), amp_dtype=self.amp_now,
                                       device_type=self.device.type)
        average_buffers(batchnorm.statistics(model), self.world)
        return before

    def precise_batches(self, epoch: int):
        """The epoch's first ``train.precise_bn.batches`` batches, as training saw them (order and augmentation are
        functions of seed, epoch and batch index), without their labels."""
        self.sampler.set_epoch(epoch)
        order, size = list(self.sampler), self.cfg.data.batch_size
        for b in range(min(self.tc.precise_bn.batches, self.batches_per_epoch)):
            check_interrupt()
            x, _ = data_mod.collate(data_mod.fetch_items(self.splits.train, order[b * size:(b + 1) * size]))
            if self.cfg.data.augment and not self.detection:
                x = data_mod.augment(x, batch_generator(self.tc.seed, epoch, b, self.world.rank))
            x = x.to(self.device)
            yield x.contiguous(memory_format=torch.channels_last) if self.tc.channels_last else x

    def finish(self, seconds: float) -> TrainResult:
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
        last = self.history[-1] if self.history else EpochRecord(0, float("nan"), float("nan"))
        best_epoch = best_state.epoch if best_state else None
        return TrainResult(
            epochs=self.tc.epochs, steps=st.step, skipped_steps=st.skipped_steps,
            final_val_acc=last.val_acc, final_val_loss=last.val_loss, best_val_acc=st.best_acc, best_epoch=best_epoch,
            train_seconds=round(seconds, 2),
            images_per_s=round(self.images_seen * world.world_size / max(seconds, 1e-9), 1),
            history=tuple(self.history),
            final_weights_sha256=checksums[0],  # the final (not the best) weights, see state_checksum
            replica_sha256=tuple(checksums) if world.enabled else None,
            precise_bn=self.precise_bn_details(best_epoch),
        )

    def precise_bn_details(self, best_epoch: int | None) -> PreciseBnDetails:
        """What ``train.precise_bn`` did, and its effect on the exported (best) epoch's validation accuracy."""
        done = self.tc.precise_bn.enabled and self.bn_layers > 0
        best = next((h for h in self.history if h.epoch == best_epoch), None)
        details = PreciseBnDetails(
            enabled=self.tc.precise_bn.enabled, batchnorm_layers=self.bn_layers,
            batches=min(self.tc.precise_bn.batches, self.batches_per_epoch) if done else 0,
            best_epoch_val_acc_before=best.val_acc_before_precise_bn if best else None,
            best_epoch_val_acc_after=best.val_acc if best and done else None)
        if done and details.best_epoch_val_acc_before is not None:
            log.info("train: precise BatchNorm statistics (%d layers, %d batches per epoch): %s of the exported "
                     "weights (epoch %d) %.2f%% -> %.2f%%", self.bn_layers, details.batches,
                     "val mAP@0.5:0.95" if self.detection else "val acc", best_epoch,
                     100 * details.best_epoch_val_acc_before, 100 * details.best_epoch_val_acc_after)
        return details

    def check_learning(self) -> tuple[learning.LearningEvidence, learning.LearningVerdict, learning.LearningPolicy]:
        """The learning check on the exported weights (rank 0, after :meth:`finish` wrote them): the evidence, the
        verdict and the policy it was judged under, logged; the caller records it and raises on a failed one."""
        source = self.best_path if self.best_path.exists() else self.ckpt_path
        model = unwrap(self.model)
        model.load_state_dict(load_checkpoint(source).model)
        evidence = self.learning_evidence(model)
        policy = learning.LearningPolicy(confidence=self.cfg.verify.confidence,
                                         require_learning=self.tc.require_learning,
                                         min_val_accuracy=self.tc.min_val_accuracy,
                                         min_mode_agreement=self.tc.min_mode_agreement)
        verdict = learning.judge(evidence, policy)
        if verdict.mode_gap and (verdict.learned or not verdict.train_mode_learned):  # else the line below names it
            log.warning("train: %s", learning.gap_line(evidence, verdict, policy))
        if not verdict.learned and not self.tc.require_learning:
            log.warning("train: %s (train.require_learning=false: going on)",
                        learning.not_learned_line(evidence, verdict, policy.confidence))
        elif verdict.learned:
            log.info("train: %s", learning.summary(evidence, verdict, policy))
        return evidence, verdict, policy

    def check_detection_learning(self) -> detection_training.DetectionLearning:
        """A detector's learning check on the exported weights: its mAP against an untrained model's (the same
        architecture, freshly initialised with ``train.seed``), with a bootstrap bound over the validation images."""
        source = self.best_path if self.best_path.exists() else self.ckpt_path
        model = unwrap(self.model)
        model.load_state_dict(load_checkpoint(source).model)
        with torch.random.fork_rng():
            torch.manual_seed(self.tc.seed)
            untrained, _ = modeling.build(self.cfg, self.splits.num_classes, self.spec.input_size[1])
        result = detection_training.learning_check(
            model, untrained.to(self.device), self.splits.val, self.device, self.cfg.verify.confidence,
            self.tc.min_val_accuracy, self.tc.require_learning, self.tc.seed)
        (log.info if result.learned else log.warning)("train: %s", result.line)
        return result

    def learning_evidence(self, model: nn.Module) -> learning.LearningEvidence:
        """Counts over the validation images: eval mode (FP32, as exported and verified) on all of them; train mode,
        eval mode and BatchNorm alone on batch statistics on the first batches of the training batch size."""
        predicted, labels = predict(model, self.splits.val, self.device, self.tc.channels_last)
        size = self.cfg.data.batch_size
        count = min(len(labels), MODE_CHECK_IMAGES)
        count = count // size * size if count >= size else count
        if count < 2:  # BatchNorm on batch statistics needs two images
            agree = train_right = count = 0
            batchnorm_agree = None
        else:
            x, y = data_mod.collate(data_mod.fetch_items(self.splits.val, list(range(count))))
            x = x.to(self.device)
            modes = batchnorm.mode_predictions(
                model, x.contiguous(memory_format=torch.channels_last) if self.tc.channels_last else x,
                batch_size=size, seed=self.tc.seed)
            agree, train_right = int((modes.eval == modes.train).sum()), int((modes.train.cpu() == y).sum())
            batchnorm_agree = None if modes.batchnorm_only is None else int((modes.eval == modes.batchnorm_only).sum())
        return learning.LearningEvidence(
            classes=self.splits.num_classes, samples=len(labels), correct=int((predicted == labels).sum()),
            majority=int(labels.bincount().max()) if len(labels) else 0, mode_samples=count, mode_agree=agree,
            train_mode_correct=train_right, batchnorm_agree=batchnorm_agree, dropout=batchnorm.has_dropout(model),
            precise_bn=self.tc.precise_bn.enabled and self.bn_layers > 0)


def _write_outputs(run_dir: RunDir, source: Path, cfg: Config, spec, splits) -> None:
    """``model.safetensors`` (best weights) and ``model.json`` (everything a deployment needs to know)."""
    from safetensors.torch import save_file

    state = load_checkpoint(source)
    weights = {k: v.contiguous() for k, v in state.model.items()}
    with atomic_path(run_dir.file(modeling.WEIGHTS)) as tmp:
        # One metadata key: safetensors writes a metadata map in a per-process random order, so two keys would
        # give the same weights a different sha256 in every run (and every graph stamped with it, downstream).
        about = json.dumps({"epoch": state.epoch, "model": cfg.model.name}, sort_keys=True)
        save_file(weights, str(tmp), metadata={"pipeline": about})
    modeling.write_card(run_dir, ModelCard.trained(cfg.model.name, spec, splits.classes, modeling.WEIGHTS,
                                                   state.epoch, state.best_acc))


