"""The configuration's schema and its file formats: the bottom layer's part of the config.

Every section, key, type, default, range and meaning (``python -m pipeline config`` prints them), the YAML reader
and writer and the ``key=value`` overrides. What the backend table decides (which names ``verify.candidates.<name>``,
``verify.gate`` and ``benchmark.backends`` may hold, and their defaults) is checked by :mod:`pipeline.config`, the
orchestration's loader, which every caller goes through: :class:`Config` is what it returns, so every layer can
take ``cfg: Config`` without importing the layers above.
"""

from __future__ import annotations

import copy
import math
import re
from pathlib import Path
from typing import Any, Literal, Optional, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from pipeline.core.artifacts import BF16_ONNX, FP16_ONNX, INT8_ONNX, METRICS
from pipeline.core.errors import ConfigError, first_line
from pipeline.core.precisions import CALIBRATION_METHODS, PRECISIONS

MAX_CONFIG_BYTES = 1 << 20


MAX_YAML_DEPTH = 32  # the config tree is 4 levels deep; deeper YAML is a mistake or an attack
SEED_LIMIT = 2**32  # numpy.random.seed takes 0 <= seed < 2**32 (train.seed reaches it)
FLOAT32_TINY = 1.1754943508222875e-38  # numpy.finfo(numpy.float32).tiny, without importing numpy here
# Upper bounds of the timing keys: each is per backend (or tune candidate), batch size and trial, so a value past
# these makes a run that does not end in any useful time (tune.warmup_s=1e9 and tune.trials=1000000 ran until killed).
MAX_TIMING_S = 60.0  # a warm-up or a trial's timed seconds
MAX_TRIALS = 100
MAX_ITERATIONS = 10_000  # timed runs per trial, at least (a ResNet-18 at batch 32 on a CPU: about 3 hours)
MAX_CHILD_WAIT_S = 3600.0  # isolate.timeout_s: an hour without an answer is a hang
# Upper bounds of every other number (tests/test_read_back.py checks that each numeric key has one): far above any
# use, far below what allocates terabytes or loops for a lifetime (data.samples_per_class=1e11 asked for 8 TB). What
# depends on the machine (threads against its cores, the synthetic set against its memory) is checked by
# pipeline.config.machine_problems before any work.
MAX_COUNT = 1_000_000_000  # steps between two log lines or checkpoints, consecutive skipped steps
MAX_IMAGES = 10_000_000  # images of a kind: per class, calibrated on, compared, measured
MAX_BATCH = 65_536
MAX_EPOCHS = 100_000
MAX_CLASSES = 100_000
MAX_THREADS = 4096  # benchmark.threads, before the machine's own bound (a small multiple of its cores)
MAX_ROUNDS = 10_000  # fallback rounds, rows of a table, profiler steps, depth of a reduction
MAX_RATIO = 1e6  # errors in units of a logit scale, gradient norms, ratios of speeds
MAX_LR = 1e30  # a learning rate that diverges on purpose (tests/test_train.py's non-finite steps) is still in range
FLOAT32_MAX = 3.4028234663852886e38  # the graphs are float32: a bound past this is no bound


class Section(BaseModel):
    # strict: a string is never silently turned into a number, nor a float into an int.
    # allow_inf_nan=False: every float (also in lists, dicts and unions) must be finite; an
    # infinite warm-up or std is never meant, and would hang the benchmark or blank the inputs.
    model_config = ConfigDict(extra="forbid", strict=True, validate_default=True, allow_inf_nan=False)


class ModelConfig(Section):
    name: str = Field("resnet18", description="registered model name, or 'package.module:factory' / 'file.py:factory'")
    num_classes: Optional[int] = Field(None, gt=0, le=MAX_CLASSES,
                                       description="class count for a user model (default: the data set's)")
    mean: Optional[list[float]] = Field(None, description="per-channel normalisation mean (default: the model's)")
    std: Optional[list[float]] = Field(None, description="per-channel normalisation std (default: the model's)")

    @model_validator(mode="after")
    def _std_positive(self):
        if any(abs(v) > MAX_RATIO for v in (*(self.mean or ()), *(self.std or ()))):
            raise ValueError(f"model.mean and model.std values must lie within +-{MAX_RATIO:g}")
        if self.std is not None and any(s <= 0 for s in self.std):
            raise ValueError("model.std values must be > 0")
        if self.std is not None and any(s < FLOAT32_TINY for s in self.std):  # the inputs are float32
            raise ValueError(f"model.std values must be at least {FLOAT32_TINY:.3g} (float32's smallest normal "
                             "number): smaller ones are zero or lose precision in float32 and blow up the inputs")
        return self


class DataConfig(Section):
    source: Literal["synthetic", "imagefolder", "cifar10", "coco", "scenes"] = Field(
        "synthetic", description="where images come from (coco: a COCO-format detection folder; scenes: real images "
        "shipped with matplotlib composited into detection scenes; docs/detection.md)")
    path: Optional[str] = Field(None, description="data directory (imagefolder, cifar10, coco)")
    image_size: Optional[int] = Field(32, gt=0, le=4096, description="square input size; null: the model's own")
    num_classes: int = Field(10, ge=2, le=1000, description="classes of the synthetic set")
    samples_per_class: int = Field(300, ge=2, le=MAX_IMAGES, description="images per class of the synthetic set")
    val_fraction: float = Field(0.2, gt=0, lt=1, description="held-out share when the data has no val/ split")
    batch_size: int = Field(64, ge=1, le=MAX_BATCH, description="training batch size (per process)")
    workers: int = Field(0, ge=0, le=1024, description="DataLoader worker processes")
    augment: bool = Field(False, description="random crop with padding and horizontal flip while training")
    seed: int = Field(0, ge=0, lt=SEED_LIMIT, description="seed of the synthetic set and of the train/val split")

    @model_validator(mode="after")
    def _path_needed(self):
        if self.source not in ("synthetic", "scenes") and not self.path:
            raise ValueError(f"data.path is required when data.source is {self.source!r}")
        return self


class PreciseBNConfig(Section):
    """BatchNorm statistics re-estimated on training batches at the end of every epoch (fvcore's precise BN)."""

    enabled: bool = Field(True, description="re-estimate every BatchNorm's running statistics over training batches "
                          "at each epoch's end, before validation and the checkpoint (docs/training.md)")
    batches: int = Field(20, ge=1, le=MAX_ROUNDS,
                         description="training batches the statistics are averaged over (at most one "
                         "epoch's)")


class TrainConfig(Section):
    """Training. A registered model's card sets the recipe keys (optimizer, lr, momentum, weight_decay,
    warmup_epochs, epochs, bn_momentum) beneath the user's config: :func:`resolve`."""

    epochs: int = Field(4, ge=1, le=MAX_EPOCHS, description="training epochs")
    optimizer: Literal["sgd", "adamw"] = Field("sgd", description="optimizer")
    lr: float = Field(0.05, gt=0, le=MAX_LR, description="peak learning rate")
    momentum: float = Field(0.9, ge=0, lt=1, description="SGD momentum")
    weight_decay: float = Field(5e-4, ge=0, le=1, description="weight decay")
    bn_momentum: float | None = Field(None, gt=0, le=1, description="BatchNorm momentum while training (null: "
                                         "the layers' own)")
    label_smoothing: float = Field(0.0, ge=0, lt=1, description="cross-entropy label smoothing")
    warmup_epochs: float = Field(0.5, ge=0, le=MAX_EPOCHS, description="linear LR warm-up, then cosine decay to zero")
    amp: Literal["auto", "fp16", "bf16", "off"] = Field(
        "auto", description="autocast dtype: auto = fp16 on CUDA, bf16 on CPUs with bf16 units, else off"
    )
    fp32_warmup_epochs: int = Field(0, ge=0, le=MAX_EPOCHS,
                                    description="first epochs in FP32 before mixed precision starts")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="training device")
    channels_last: bool = Field(True, description="NHWC memory format")
    accumulate: int = Field(1, ge=1, le=MAX_BATCH, description="micro-batches per optimizer step")
    clip_grad_norm: Optional[float] = Field(None, gt=0, le=MAX_RATIO, description="clip gradients to this total norm")
    max_nonfinite: int = Field(3, ge=1, le=MAX_COUNT,
                               description=("consecutive skipped steps (non-finite loss or gradients) "
                                                     "before stopping"))
    compile: bool = Field(False, description="torch.compile the model")
    deterministic: bool = Field(False, description="deterministic algorithms (slower)")
    seed: int = Field(0, ge=0, lt=SEED_LIMIT, description="seed of Python, NumPy and torch")
    init_weights: Optional[str] = Field(None, description="start from this state dict (.safetensors or .pt)")
    checkpoint_every: int = Field(0, ge=0, le=MAX_COUNT,
                                  description="also checkpoint every N optimizer steps (0: each epoch)")
    log_every: int = Field(10, ge=1, le=MAX_COUNT, description=f"optimizer steps between {METRICS} lines")
    tensorboard: bool = Field(True, description="write TensorBoard events when tensorboard is installed")
    profile_steps: int = Field(5, ge=1, le=MAX_ROUNDS, description="steps recorded by train --profile")
    precise_bn: PreciseBNConfig = PreciseBNConfig()
    require_learning: bool = Field(True, description="fail (exit 1) when the validation accuracy is not above chance "
                                   "at verify.confidence: nothing is exported")
    min_val_accuracy: float | None = Field(None, ge=0, le=1, description="fail (exit 1) below this validation "
                                              "accuracy: a CI quality gate (null: off)")
    min_mode_agreement: float = Field(0.8, ge=0, le=1, description="train-mode and eval-mode top-1 agreement on "
                                      "validation images below which train names the gap and its likely cause")


class FP16Config(Section):
    enabled: bool = Field(True, description=f"write {FP16_ONNX} with ModelOpt AutoCast")
    calibration_samples: int = Field(64, ge=1, le=MAX_IMAGES, description="real images AutoCast measures ranges on "
                                     "(export.calibration_split)")
    range_rule: bool = Field(True, description="keep nodes whose measured values exceed data_max in FP32")
    data_max: float = Field(512.0, gt=0, le=FLOAT32_MAX,
                            description="largest |value| a node's I/O may reach and run in FP16")
    init_max: float = Field(65504.0, gt=0, le=FLOAT32_MAX,
                            description="largest |initializer| a node may hold and run in FP16")
    max_depth_of_reduction: Optional[int] = Field(None, gt=0, le=MAX_ROUNDS,
                                                  description="keep deeper reductions in FP32")
    nodes_to_exclude: list[str] = Field([], description="node-name regexes kept in FP32")
    op_types_to_exclude: list[str] = Field([], description="op types kept in FP32")


class BF16Config(FP16Config):
    """BF16 keeps FP32's exponent range, so nothing FP32 holds overflows it: no range rule by default; its 8-bit
    mantissa rounds more than FP16's 11, which the gate (verify.bf16) judges."""

    enabled: bool = Field(True, description=f"write {BF16_ONNX} with ModelOpt AutoCast (opset 22: the first with "
                          "bfloat16 Conv, Gemm and pooling)")
    range_rule: bool = Field(False, description="keep nodes whose measured values exceed data_max in FP32 (BF16 "
                             "holds FP32's range: off by default)")
    init_max: float = Field(3.0e38, gt=0, le=FLOAT32_MAX,
                            description="largest |initializer| a node may hold and run in BF16")


class StabilityConfig(Section):
    """The calibration stability certificate (docs/verify.md, "Calibration stability"): the INT8 graph recalibrated on
    ``draws`` draws of training images, each judged by the gate on the verdict images."""

    draws: int = Field(5, ge=2, le=64, description="calibration draws K, the deployed one included")
    draw_size: Optional[int] = Field(None, ge=1, le=100_000, description="images per draw (null: "
                                     "export.int8.calibration_samples, the deployed draw's size)")
    sampling: Literal["disjoint", "bootstrap"] = Field("disjoint", description="disjoint draws of the training split "
                                                        "(bootstrap, said, where it holds too few) or bootstrap draws")
    in_tune: bool = Field(True, description="certify tune's chosen mix (tune.md)")
    in_verify: bool = Field(False, description="certify model.int8.onnx in verify (all's default run: off, it costs "
                            "one quantization and one gate run per draw)")


class INT8Config(Section):
    enabled: bool = Field(True, description=(f"write {INT8_ONNX} with ModelOpt PTQ "
                                             "(skipped, and said, without ModelOpt)"))
    calibration_method: Literal[CALIBRATION_METHODS] = Field(
        "max", description="activation ranges: max (per-tensor absolute max) or entropy (KL-optimal clipping); the "
        "two ModelOpt 0.47 offers for INT8 (no percentile)")
    calibration_samples: int = Field(256, ge=1, le=MAX_IMAGES, description="real images the ranges are calibrated on "
                                     "(export.calibration_split); 256: the smallest size whose certificate pass share "
                                     "and scale spread were stable (docs/verify.md)")
    nodes_to_exclude: list[str] = Field([], description="node-name regexes left unquantized")
    op_types_to_exclude: list[str] = Field([], description="op types left unquantized")
    stability: StabilityConfig = StabilityConfig()


class ExportConfig(Section):
    opset: int = Field(18, ge=17, le=23, description="ONNX opset (>= 17 keeps LayerNormalization one op)")
    calibration_split: Literal["train", "validation"] = Field(
        "train", description="where calibration images (INT8 ranges, AutoCast's range rule) come from: train (evenly "
        "spaced over the training split, never judged on) or validation (its first images: verify then reports its "
        "verdict as not held out)")
    exporter: Literal["torchscript", "dynamo"] = Field("torchscript", description="torch.onnx exporter")
    dynamic_batch: bool = Field(True, description="dynamic batch axis")
    accept_trace_warnings: bool = Field(False, description="accept an exporter warning that the graph may differ "
                                        "from the model (a tensor turned into a Python value, control flow traced as "
                                        "a constant); false: export fails (exit 1) naming the model's source line")
    fp16: FP16Config = FP16Config()
    bf16: BF16Config = BF16Config()
    int8: INT8Config = INT8Config()


class BuildConfig(Section):
    precisions: list[Literal[PRECISIONS]] = Field(list(PRECISIONS), description="TensorRT engines to build "
                                                  "(each from its ONNX graph, where export wrote it)")
    min_batch: int = Field(1, ge=1, le=MAX_BATCH, description="optimization profile: smallest batch")
    opt_batch: int = Field(8, ge=1, le=MAX_BATCH, description="optimization profile: batch tuned for")
    max_batch: int = Field(32, ge=1, le=MAX_BATCH, description="optimization profile: largest batch")
    optimization_level: int = Field(3, ge=0, le=5, description="TensorRT builder optimization level")
    tf32: bool = Field(False, description="allow TF32 in the layers AutoCast kept FP32")
    timing_cache: Optional[str] = Field(None, description="timing cache path, used as given (default: beside the run "
                                        "directories, one per TensorRT version and GPU compute capability)")

    @model_validator(mode="after")
    def _profile_order(self):
        if not self.min_batch <= self.opt_batch <= self.max_batch:
            raise ValueError("build: need min_batch <= opt_batch <= max_batch")
        return self


Tolerance = float | dict[str, float]
ErrorStat = Literal["elemwise", "max", "mean", "median", "quantile"]


def _check_tolerances(gate):
    for key in ("atol", "rtol"):
        value = getattr(gate, key)
        values = value.values() if isinstance(value, dict) else [value]
        if any(v is not None and (v < 0 or math.isnan(v)) for v in values):
            raise ValueError(f"{key} must be >= 0")
        if any(v is not None and v > MAX_RATIO for v in values):
            raise ValueError(f"{key} must be at most {MAX_RATIO:g}")
    return gate


Criterion = Literal["scaled", "absolute"]


class _Gate(Section):
    """Thresholds a candidate must meet: the tensor check and the task check (docs/verify.md: the criteria and
    how each default was measured on the gate's corpus)."""

    criterion: Criterion = Field("scaled", description="tensor check: scaled (error / the reference's logit scale) "
                                 "or absolute (Polygraphy's atol AND rtol per batch)")
    max_scaled_error: float = Field(le=MAX_RATIO,
                                    description="scaled criterion: largest error per image, in units of the "
                                    "reference's logit scale, at error_quantile of the images")
    error_quantile: float = Field(1.0, gt=0, le=1, description="scaled: the share of images held to "
                                  "max_scaled_error (1.0: every image); absolute with quantile: that quantile")
    atol: Tolerance = Field(description="absolute criterion: absolute tolerance (or per-output dict, '' = default)")
    rtol: Tolerance = Field(description="absolute criterion: relative tolerance, against the reference")
    check_error_stat: ErrorStat = Field("elemwise", description="absolute criterion: the statistic held to "
                                        "atol/rtol")
    min_top1_agreement: float = Field(0.99, ge=0, le=1, description="top-1 agreement with the reference, at least "
                                      "(failed only when the confidence bound shows it is lower)")
    max_accuracy_drop: float = Field(0.01, ge=0, le=1, description="accuracy the candidate may lose, at most "
                                     "(failed only when the confidence bound shows it loses more)")
    max_row_deviation: float = Field(le=MAX_RATIO,
                                     description="row independence: how far an image's output may move with its "
                                     "batch (size, slot, companions), in units of its own logit scale")

    _tolerances = model_validator(mode="after")(_check_tolerances)


class FP32Gate(_Gate):
    max_scaled_error: float = Field(1e-2, ge=0, le=MAX_RATIO,
                                    description="scaled criterion: largest error per image, in units "
                                    "of the reference's logit scale")
    atol: Tolerance = Field(1e-4, description="absolute criterion: absolute tolerance (or per-output dict)")
    rtol: Tolerance = Field(1e-4, description="absolute criterion: relative tolerance, against the reference")
    max_row_deviation: float = Field(1e-4, ge=0, le=MAX_RATIO,
                                     description="row independence: how far an image's output "
                                     "may move with its batch, in units of its logit scale (measured: docs/verify.md)")


class FP16Gate(_Gate):
    max_scaled_error: float = Field(0.02, ge=0, le=MAX_RATIO,
                                    description="scaled criterion: largest error per image, in units "
                                    "of the reference's logit scale")
    atol: Tolerance = Field(2e-2, description="absolute criterion: absolute tolerance (or per-output dict)")
    rtol: Tolerance = Field(2e-2, description="absolute criterion: relative tolerance, against the reference")
    max_row_deviation: float = Field(5e-3, ge=0, le=MAX_RATIO,
                                     description="row independence: how far an image's output "
                                     "may move with its batch, in units of its logit scale (measured: docs/verify.md)")


class INT8Gate(_Gate):
    """INT8 errors have a heavy tail (an 8-bit activation step per layer): the scaled criterion holds the 99th
    percentile image, the task check catches what a quantile could hide (docs/verify.md)."""

    max_scaled_error: float = Field(0.5, ge=0, le=MAX_RATIO,
                                    description="scaled criterion: largest error per image, in units "
                                    "of the reference's logit scale, at error_quantile")
    error_quantile: float = Field(0.99, gt=0, le=1, description="scaled: the share of images held to "
                                  "max_scaled_error; absolute with quantile: that quantile")
    atol: Tolerance = Field(0.5, description="absolute criterion: absolute tolerance (or per-output dict)")
    rtol: Tolerance = Field(0.5, description="absolute criterion: relative tolerance, against the reference")
    check_error_stat: ErrorStat = Field("quantile", description="absolute criterion: the statistic held to "
                                        "atol/rtol")
    min_top1_agreement: float = Field(0.98, ge=0, le=1, description="top-1 agreement with the reference, at least")
    max_row_deviation: float = Field(5e-2, ge=0, le=MAX_RATIO,
                                     description="row independence: how far an image's output "
                                     "may move with its batch, in units of its logit scale (measured: docs/verify.md)")
    min_pass_share: Optional[float] = Field(None, ge=0, le=1, description="calibration stability certificate: the "
                                            "share of calibration draws that must pass, or the INT8 candidates fail "
                                            "(a lucky draw; null: reported only)")


class BF16Gate(_Gate):
    max_scaled_error: float = Field(0.2, ge=0, le=MAX_RATIO,
                                    description="scaled criterion: largest error per image, in units "
                                    "of the reference's logit scale")
    atol: Tolerance = Field(0.1, description="absolute criterion: absolute tolerance (or per-output dict)")
    rtol: Tolerance = Field(0.1, description="absolute criterion: relative tolerance, against the reference")
    max_row_deviation: float = Field(3e-2, ge=0, le=MAX_RATIO,
                                     description="row independence: how far an image's output "
                                     "may move with its batch, in units of its logit scale (measured: docs/verify.md)")


class CandidateConfig(Section):
    """One candidate: on/off, and thresholds that override its precision's defaults when not null."""

    enabled: bool = Field(True, description="run this candidate")
    criterion: Optional[Criterion] = Field(None, description="overrides the precision gate's criterion")
    max_scaled_error: Optional[float] = Field(None, ge=0, le=MAX_RATIO, description="overrides max_scaled_error")
    atol: Optional[Tolerance] = Field(None, description="overrides the precision gate's atol")
    rtol: Optional[Tolerance] = Field(None, description="overrides the precision gate's rtol")
    check_error_stat: Optional[ErrorStat] = Field(None, description="overrides check_error_stat")
    error_quantile: Optional[float] = Field(None, gt=0, le=1, description="overrides error_quantile")
    min_top1_agreement: Optional[float] = Field(None, ge=0, le=1, description="overrides min_top1_agreement")
    max_accuracy_drop: Optional[float] = Field(None, ge=0, le=1, description="overrides max_accuracy_drop")
    max_row_deviation: Optional[float] = Field(None, ge=0, le=MAX_RATIO, description="overrides max_row_deviation")

    _tolerances = model_validator(mode="after")(_check_tolerances)


class DetectionGateConfig(Section):
    """The task check of a detector (docs/detection.md): boxes matched with the reference's, and the mAP drop."""

    match_iou: float = Field(0.5, gt=0, le=1, description="a candidate box matches a reference box of the same class "
                             "at this IoU or more")
    min_score: float = Field(0.3, ge=0, lt=1, description="boxes scored below this are not compared (as a "
                             "deployment's score threshold drops them)")
    min_matched_share: float = Field(0.9, ge=0, le=1, description="matched pairs among all boxes of either side, at "
                                     "least (failed only when the upper confidence bound is below it)")
    max_map_drop: float = Field(0.02, ge=0, le=1, description="mAP@0.5:0.95 drop against the ground truth, at most "
                                "(failed only when the bootstrap's lower bound exceeds it)")
    bootstrap: int = Field(200, ge=20, le=10000, description="bootstrap resamples of the images for the mAP drop's "
                           "bound")


class VerifyConfig(Section):
    samples: Optional[int] = Field(None, ge=1, le=MAX_IMAGES,
                                   description="real validation images compared (null: every "
                                   "validation image, up to max_samples)")
    max_samples: int = Field(1000, ge=1, le=MAX_IMAGES, description="cap on the images compared when samples is null")
    confidence: float = Field(0.95, ge=0.5, lt=1, description="one-sided confidence of the task check's bounds")
    inconclusive: Literal["pass", "fail"] = Field("pass", description="a task check the images cannot decide: "
                                                  "pass with a warning, or fail (exit 5)")
    gate: Union[Literal["auto"], list[str]] = Field(
        "auto", description="the candidates whose verdicts decide the exit code (auto: the deployment targets and "
        "their faithful CPU proxies, docs/verify.md); every other candidate is run and reported only")
    batch_size: int = Field(32, ge=1, le=MAX_BATCH, description="images per inference")
    batch_check_samples: int = Field(64, ge=0, le=MAX_IMAGES,
                                     description="images each candidate runs again at every profile "
                                     "batch size (build.min/opt/max_batch); 0: no batch-size check")
    emulation: Literal["fast", "strict"] = Field("fast", description="FP16 emulation: fast (ORT) or strict (numpy)")
    conformance: bool = Field(True, description="row independence (each image alone, in a full batch, reversed, "
                              "beside other companions) and the precision manifest (the runtime's own account)")
    min_precision_share: float = Field(0.5, ge=0, le=1, description="precision manifest: the share of the matrix "
                                       "layers its graph puts in the claimed precision that must run in it")
    fp32: FP32Gate = FP32Gate()
    fp16: FP16Gate = FP16Gate()
    int8: INT8Gate = INT8Gate()
    bf16: BF16Gate = BF16Gate()
    candidates: dict[str, CandidateConfig] = Field(
        {}, description="one section per verify candidate of the backend table, by its name (pipeline.config checks "
        "the names and fills in every candidate's defaults)")
    search_fraction: float = Field(0.5, gt=0, lt=1, description="share of the validation split (stratified) kept "
                                   "for tune's search; verify and tune's confirmation judge on the rest")
    min_held_out_images: int = Field(30, ge=1, le=100_000, description="images both the search and the verdict part "
                                     "need; a smaller validation split is not cut, and every verdict on it is marked "
                                     "not held out")
    localize: bool = Field(True, description="on failure, find the first node whose error exceeds tolerance")
    localize_top: int = Field(10, ge=1, le=MAX_ROUNDS, description="rows in the worst-nodes table")
    auto_fallback: bool = Field(False, description="on failure, move offending nodes to FP32 and retry")
    detection: DetectionGateConfig = Field(default_factory=DetectionGateConfig, description="a detector's task "
                                           "check (docs/detection.md)")
    fallback_iterations: int = Field(8, ge=1, le=MAX_ROUNDS, description="fallback rounds before giving up")


class BenchmarkConfig(Section):
    backends: Optional[list[str]] = Field(None, description="backends to time, as listed (each is skipped with a "
                                          "reason where it cannot run): names of the backend table, which "
                                          "pipeline.config checks; null: the table's defaults, narrowed by "
                                          "benchmark.rows")
    batch_sizes: list[int] = Field([1, 8, 32], min_length=1, description="batch-size sweep")
    rows: Literal["decisive", "all"] = Field(
        "decisive", description="with benchmark.backends null: decisive times only the backends that can change the "
        "answer (torch_fp32, the eager reference every ratio is to, and each deployment whose verify verdict gates), "
        "and OpenVINO's async-throughput rows at the largest batch only; all times every default backend of the "
        "table, and those rows at every batch size")
    method: Literal["adaptive", "fixed"] = Field(
        "adaptive", description="adaptive: each row timed until its median's 95% interval is within "
        "target_halfwidth, or max_row_s; fixed: trials x (min_iterations runs and min_duration_s), the old method")
    warmup_s: float = Field(0.2, ge=0, le=MAX_TIMING_S, description="warm-up time after the first run (at most "
                            f"{MAX_TIMING_S:g} s)")
    min_runs: int = Field(20, ge=1, le=MAX_ITERATIONS, description="adaptive: timed runs per row, at least (at most "
                          f"{MAX_ITERATIONS}; a 95% interval of the median needs 6)")
    target_halfwidth: float = Field(0.05, gt=0, le=1, description="adaptive: a row stops once its median's 95% "
                                    "interval lies within median x (1 +- this)")
    max_row_s: float = Field(1.0, gt=0, le=MAX_TIMING_S, description="adaptive: the time cap: timed seconds after "
                             "which a row stops unconverged, once it has min_runs runs (at most "
                             f"{MAX_TIMING_S:g} s)")
    min_iterations: int = Field(10, ge=1, le=MAX_ITERATIONS, description="fixed: timed runs per trial, at least (at "
                                f"most {MAX_ITERATIONS})")
    min_duration_s: float = Field(0.5, ge=0, le=MAX_TIMING_S, description="fixed: timed seconds per trial, at least "
                                  f"(at most {MAX_TIMING_S:g} s)")
    trials: int = Field(3, ge=1, le=MAX_TRIALS, description=f"fixed: repeated trials (at most {MAX_TRIALS})")
    threads: Optional[int] = Field(None, ge=1, le=MAX_THREADS, description="CPU intra-op threads (default: all cores; "
                                   "at most 4 per core of this machine)")
    cuda_graphs: bool = Field(False, description="replay CUDA graphs for PyTorch and TensorRT on GPU")
    cv_warn: float = Field(0.10, gt=0, le=MAX_RATIO,
                           description="warn when a trial's coefficient of variation exceeds this "
                           "(trtexec uses 2.5% on GPUs; shared CPUs are noisier)")
    profile_iterations: int = Field(5, ge=1, le=MAX_ITERATIONS, description="iterations recorded by benchmark "
                                    f"--profile (at most {MAX_ITERATIONS})")
    benchmark_app_s: float = Field(1.0, ge=0, le=MAX_TIMING_S, description="seconds per OpenVINO benchmark_app run "
                                   f"beside the OpenVINO rows (0: off; at most {MAX_TIMING_S:g} s)")
    benchmark_app_rows: Literal["summary", "all"] = Field(
        "summary", description="OpenVINO rows cross-checked with benchmark_app: those the summary names (the "
        "fastest that passed, at batch 1 and the largest batch) or all")

    @model_validator(mode="after")
    def _positive_batches(self):
        if any(b < 1 or b > MAX_BATCH for b in self.batch_sizes):
            raise ValueError(f"benchmark.batch_sizes must all be between 1 and {MAX_BATCH}")
        return self


class TuneConfig(Section):
    precision: Literal[PRECISIONS] = Field("int8", description="the low precision tune mixes with higher "
                                               "precision (tune --precision)")
    calibration_methods: list[Literal[CALIBRATION_METHODS]] = Field(
        ["max", "entropy"], min_length=1, description="calibration methods searched; the better front is kept")
    sensitivity_samples: int = Field(100, ge=1, le=MAX_IMAGES, description="images of the validation split's "
                                     "search part each per-layer sensitivity is measured on (candidates are judged on "
                                     "all of that part; the chosen mix again on the verdict part)")
    min_speedup: Optional[float] = Field(1.0, gt=0, le=MAX_RATIO, description="tune fails (exit 1) unless the "
                                         "chosen mix is this much faster than FP32 on the target at every timed batch "
                                         "(null: off; all --tune never applies it)")
    warmup_s: float = Field(0.1, ge=0, le=MAX_TIMING_S, description="warm-up per candidate and batch before timing "
                            f"(at most {MAX_TIMING_S:g} s)")
    min_duration_s: float = Field(0.25, ge=0, le=MAX_TIMING_S, description="timed seconds per trial, at least (at "
                                  f"most {MAX_TIMING_S:g} s)")
    trials: int = Field(1, ge=1, le=MAX_TRIALS, description=f"timed trials per candidate and batch (at most "
                        f"{MAX_TRIALS})")
    qat: Literal["auto", "off", "on"] = Field("auto", description="the third rung (INT8 only): quantization-aware "
                                              "fine-tuning (python -m pipeline qat) after PTQ and the best PTQ mix; "
                                              "auto: only when no PTQ mix passes the gate with tune.min_speedup; on: "
                                              "always; off: never")
    same_speed: float = Field(0.05, ge=0, le=MAX_RATIO,
                              description="mixes whose time ratio's 95 % interval lies within this share of 1 are "
                              "the same speed (timing noise); a mix no other beats beyond it ties, and of a tie the "
                              "one with the fewest layers out of INT8 is chosen; a re-run keeps the fallback file's "
                              "mix unless a new one beats it")

    @model_validator(mode="after")
    def _distinct_methods(self):
        repeated = sorted({m for m in self.calibration_methods if self.calibration_methods.count(m) > 1})
        if repeated:
            raise ValueError(f"tune.calibration_methods names {', '.join(repeated)} more than once: each method is "
                             "searched once; list it once")
        return self


class QATConfig(Section):
    """``python -m pipeline qat`` (and tune's third rung, ``tune.qat``): quantization-aware fine-tuning of the trained
    model with fake quantization where INT8 PTQ puts its Q/DQ nodes, distilled from the FP32 model (docs/verify.md)."""

    epochs: int = Field(2, ge=1, le=1000, description="fine-tuning epochs (few: the weights start trained)")
    lr: float = Field(1e-3, gt=0, le=MAX_LR,
                      description="peak learning rate (small: a fraction of train.lr), cosine to zero, no "
                      "warm-up; the optimizer, momentum and weight decay are train's")
    temperature: float = Field(2.0, gt=0, le=MAX_RATIO,
                               description="distillation temperature: the loss is T^2 KL(FP32 model's "
                               "softened logits || the quantized model's)")
    label_weight: float = Field(0.0, ge=0, le=1, description="share of the loss from the labels (cross-entropy); the "
                                "rest is distillation from the FP32 model's logits")
    freeze_batchnorm: bool = Field(True, description="BatchNorm keeps its trained running statistics and runs in eval "
                                   "mode (what the export folds into the convolutions)")


class IsolateConfig(Section):
    timeout_s: float = Field(300.0, gt=0, le=MAX_CHILD_WAIT_S, description="seconds a native runtime's child "
                             "process has to answer, at least (plus a minute to start, a quarter second per image, a "
                             "timing's own length); then it is killed and its row says `crashed: no answer in N s` "
                             f"(at most {MAX_CHILD_WAIT_S:g} s)")
    fork_server: bool = Field(True, description="fork each child from one server process that has imported the "
                              "runtimes once (milliseconds to start, not a new interpreter's 0.3-0.4 s); false: a new "
                              "interpreter per child")


class CompareConfig(Section):
    """``python -m pipeline compare`` (and ``all`` when ``baseline`` is set): defaults measured in docs/verify.md."""

    baseline: Optional[str] = Field(None, description="baseline bundle (`python -m pipeline baseline --out`) to "
                                    "compare the run with; `all` runs compare after benchmark when set")
    min_top1_agreement: float = Field(0.99, gt=0, le=1, description="top-1 agreement with the baseline artifact, at "
                                      "least (failed when its upper confidence bound is below)")
    max_accuracy_drop: float = Field(0.01, ge=0, le=1, description="accuracy lost against the baseline artifact on "
                                     "the same images, at most (failed when its lower bound exceeds it)")
    max_logit_drift: float = Field(0.05, ge=0, le=MAX_RATIO,
                                   description="largest change of an image's top-5 logits, in units of "
                                   "the baseline reference's logit scale, at the drift_quantile image")
    drift_quantile: float = Field(0.99, gt=0, le=1, description="share of images held to max_logit_drift")
    max_latency_ratio: float = Field(3.0, gt=1, le=MAX_RATIO,
                                     description="run median / baseline median: a regression only when "
                                     "the whole bootstrap interval lies above this")
    min_samples: int = Field(20, ge=2, le=MAX_IMAGES,
                             description="timed runs a latency row needs on both sides to be judged "
                             "(fewer: reported, not judged)")
    confidence: float = Field(0.95, ge=0.5, lt=1, description="confidence of the agreement/accuracy bounds and of "
                              "the latency interval (two-sided)")
    bootstrap_resamples: int = Field(2000, ge=100, le=100000, description="bootstrap resamples per latency row")
    seed: int = Field(0, ge=0, lt=SEED_LIMIT, description="seed of the bootstrap (the interval is reproducible)")


class DeployConfig(Section):
    """``python -m pipeline deploy``: a Triton model repository of the artifacts that passed the gate
    (docs/deploy.md)."""

    target: Literal["triton"] = Field("triton", description="the serving system the repository is written for")
    out: str | None = Field(None, description="the model repository folder deploy writes (`deploy --out DIR`); "
                               "replaced whole, atomically, and only if it is empty or holds exactly the files deploy "
                               "wrote there (pipeline.files.json)")
    triton_release: str | None = Field(None, pattern=r"^\d\d\.\d\d$", description="the NGC Triton container "
                                          "release the repository is for (`25.01`): engines built with another "
                                          "TensorRT are refused before anything is written (exit 2); null: not checked")
    instances: int = Field(1, ge=1, le=64, description="model instances per device (instance_group count)")
    max_queue_delay_us: int = Field(100, ge=0, le=10_000_000, description="how long the dynamic batcher waits for a "
                                    "preferred batch, in microseconds")
    preferred_fraction: float = Field(0.9, gt=0, le=1, description="preferred batch sizes: the smallest measured batch "
                                      "reaching this share of the best benchmark throughput, and the best one")
    serve: bool = Field(False, description="also serve the written repository with a local Triton (the `serve` extra), "
                        "gate every model's outputs against the FP32 reference and time one (`deploy --serve`)")
    serve_candidate: str = Field("onnxrt_fp32", description="the model `deploy --serve` times (when served and "
                                 "passed; else the first that passed)")
    serve_samples: int = Field(64, ge=1, le=100_000, description="validation images sent through the server (each "
                               "at concurrency 1 and at the largest of concurrency, over HTTP and gRPC)")
    concurrency: list[int] = Field([1, 4], min_length=1, description="client concurrency levels timed (perf_analyzer's "
                                   "--concurrency-range)")
    warmup_s: float = Field(0.5, ge=0, le=MAX_TIMING_S, description="seconds of requests before timing starts")
    window_s: float = Field(1.0, gt=0, le=MAX_TIMING_S, description="one measurement window, in seconds "
                            "(perf_analyzer's --measurement-interval)")
    stability: float = Field(0.1, gt=0, le=1, description="three windows in a row within this share of their mean "
                             "throughput and latency are stable (perf_analyzer's --stability-percentage)")
    max_trials: int = Field(10, ge=3, le=MAX_TRIALS, description="measurement windows at most per level "
                            "(perf_analyzer's --max-trials)")

    @field_validator("triton_release", mode="before")
    @classmethod
    def _release_as_written(cls, value):
        """``deploy.triton_release=25.10`` reads as the number 25.1 in YAML: the release it names is 25.10."""
        return f"{value:.2f}" if isinstance(value, float) else value

    @model_validator(mode="after")
    def _concurrency_positive(self):
        if any(c < 1 or c > 256 for c in self.concurrency):
            raise ValueError("deploy.concurrency values must be between 1 and 256")
        return self


class Config(Section):
    model: ModelConfig = ModelConfig()
    data: DataConfig = DataConfig()
    train: TrainConfig = TrainConfig()
    export: ExportConfig = ExportConfig()
    build: BuildConfig = BuildConfig()
    verify: VerifyConfig = VerifyConfig()
    benchmark: BenchmarkConfig = BenchmarkConfig()
    tune: TuneConfig = TuneConfig()
    qat: QATConfig = QATConfig()
    isolate: IsolateConfig = IsolateConfig()
    compare: CompareConfig = CompareConfig()
    deploy: DeployConfig = DeployConfig()
    require: list[Literal["tensorrt", "cuda"]] = Field(
        [], description="backends whose absence fails the run with exit code 3"
    )

    @model_validator(mode="after")
    def _verify_batches_fit_the_engine(self):
        if self.verify.batch_size > self.build.max_batch:
            raise ValueError(f"verify.batch_size ({self.verify.batch_size}) exceeds build.max_batch "
                             f"({self.build.max_batch}): the engine's profile could not take such batches")
        return self

    def to_dict(self) -> dict:
        return self.model_dump(mode="json")


# --------------------------------------------------------------------------- YAML


class _Loader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 scalars: ``1e-4`` is a float (1.1 needs a dot) and only true/false
    are booleans, so ``train.amp=off`` stays the string "off" (1.1 reads on/off/yes/no as booleans).
    Nesting deeper than :data:`MAX_YAML_DEPTH` is malformed: PyYAML composes recursively, so
    thousands of ``[`` would otherwise end in a RecursionError."""

    _depth = 0

    def compose_node(self, parent, index):
        if self._depth >= MAX_YAML_DEPTH:
            raise yaml.composer.ComposerError(
                None, None, f"nested deeper than {MAX_YAML_DEPTH} levels", self.peek_event().start_mark)
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node, deep=False):
        """A mapping, with a key given twice refused (PyYAML keeps the last one silently)."""
        if isinstance(node, yaml.MappingNode):
            seen = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue  # `<<: *base`: the keys written here override the merged ones, as YAML says
                key = self.construct_object(key_node, deep=True)
                if isinstance(key, (str, int, float, bool)) or key is None:
                    if key in seen:
                        raise yaml.constructor.ConstructorError(
                            None, None, f"the key {key!r} is given twice", key_node.start_mark)
                    seen.add(key)
        return super().construct_mapping(node, deep)


_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))

_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
        |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
        |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
        |[-+]?\.(?:inf|Inf|INF)
        |\.(?:nan|NaN|NAN))$""",
        re.X,
    ),
    list("-+0123456789."),
)


def parse_yaml(text: str, origin: str) -> Any:
    try:
        return yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(exc, "problem", None) or first_line(exc)
        raise ConfigError([f"{origin}: malformed YAML{where}: {problem}"]) from None


def load_yaml_file(path: str | Path) -> dict:
    path = Path(path)
    try:
        if path.stat().st_size > MAX_CONFIG_BYTES:
            raise ConfigError([f"{path}: config file is larger than {MAX_CONFIG_BYTES} bytes"])
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError([f"{path}: config file not found"]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError([f"{path}: cannot read config file: {exc}"]) from None
    data = parse_yaml(text, str(path))
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError([f"{path}: top level must be a mapping of sections, got {type(data).__name__}"])
    return data


# --------------------------------------------------------------------------- overrides


_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


def parse_override(text: str) -> tuple[list[str], Any]:
    """``"train.epochs=3"`` -> ``(["train", "epochs"], 3)``; the value is read as YAML."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep:
        raise ConfigError([f"override {text!r}: expected key=value, for example train.epochs=3"])
    if not _KEY.match(key):
        raise ConfigError([f"override {text!r}: {key!r} is not a dotted key such as train.epochs"])
    value = parse_yaml(raw, f"override {key}") if raw.strip() else None
    return key.split("."), value


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    data = copy.deepcopy(data)
    problems = []
    for text in overrides:
        try:
            path, value = parse_override(text)
        except ConfigError as err:
            problems += err.problems
            continue
        node = data
        for i, part in enumerate(path[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            elif not isinstance(child, dict):
                problems.append(f"override {text!r}: {'.'.join(path[: i + 1])} is not a section")
                break
            node = child
        else:
            node[path[-1]] = value
    if problems:
        raise ConfigError(problems)
    return data


def deep_merge(base: dict, update: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


class _Dumper(yaml.SafeDumper):
    """Quotes every string that :class:`_Loader` would read back as something else (e.g. "1e5")."""


_Dumper.yaml_implicit_resolvers = {
    first: list(yaml.SafeDumper.yaml_implicit_resolvers.get(first, [])) + list(resolvers)
    for first, resolvers in {**yaml.SafeDumper.yaml_implicit_resolvers, **_Loader.yaml_implicit_resolvers}.items()
}


def dump_yaml(config: Config) -> str:
    return yaml.dump(config.to_dict(), Dumper=_Dumper, sort_keys=False)


