"""The stage table, input fingerprints, and running stages (one at a time or ``all`` in order).

Each stage declares what the command line shows of it (help, flags, summary line), so the CLI is
generic over :data:`STAGES`. :func:`open_run` is the context every stage runs in (lock, config.yaml,
environment); :func:`run_all` from Python is exactly ``python -m pipeline all``.

``all`` calls exactly the same stage functions as the subcommands. With nothing changed, a
stage whose fingerprint (its config sections, a summary of the data's files where it reads data,
the sha256 of its input artifacts, the code and library versions, and the relevant hardware) matches the manifest,
and whose recorded outputs still hash the same, is skipped; a change re-runs that stage and, through the new
artifact hashes, everything downstream of it.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import hashlib
import json
import logging
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.core import artifacts as a
from pipeline.core import env, records
from pipeline.core.errors import BackendUnavailable, InputError, UsageError
from pipeline.core.manifest import STAGE_ORDER, StageEntry
from pipeline.core.run import RunDir, atomic_write, refuse_foreign, sha256_file
from pipeline.core.status import Status
from pipeline.precision import PRECISIONS

if TYPE_CHECKING:  # annotations only
    from pipeline.core.config_schema import Config

log = logging.getLogger("pipeline")

ORDER = STAGE_ORDER

# The stage currently running, for error messages ("error: export: ...").
current_stage: contextvars.ContextVar[str] = contextvars.ContextVar("current_stage", default="pipeline")


@dataclass(frozen=True)
class Option:
    """A command-line flag of a stage (on/off), passed to the stage function as the keyword :attr:`dest`."""

    flag: str  # "--auto-fallback" -> auto_fallback=True
    help: str
    config: str | None = None  # a config key that turns it on as well ("verify.auto_fallback")
    in_all: bool = False  # `all` offers the flag too, for this stage
    metavar: str | None = None  # a flag that takes a value ("--baseline PATH"); the config key is its default

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")

    def value(self, cfg: Config, given):
        configured = functools.reduce(getattr, self.config.split("."), cfg) if self.config else None
        if self.metavar:
            return given if given not in (None, False) else configured
        return bool(given) or bool(configured)


@dataclass(frozen=True)
class JoinsAll:
    """How a stage outside :data:`ORDER` takes part in ``all``: where, when it is wanted, and how ``all`` runs it."""

    before: str | None  # the stage of ORDER it runs before; None: after the last
    wanted: Callable[[Config, dict], bool]  # from the config and the stage's options given to `all`
    run: Callable[[Config, RunDir, set[str]], None]  # runs it (or skips it as unchanged), noting this_invocation
    # When not wanted: what the summary says of an earlier run's entry instead of showing it as this run's
    # (None: the entry is shown as an earlier run's, like any stage this invocation did not reach).
    off_note: str | None = None


@dataclass(frozen=True)
class Stage:
    name: str
    function: Callable[..., None]  # the stage: function(cfg, run_dir, record, **options)
    config_keys: tuple[str, ...]
    inputs: tuple[str, ...]  # artifact files whose hashes enter the fingerprint (when present)
    after: tuple[str, ...]  # upstream stages: when one of them re-runs, this stage re-runs too
    help: str = ""  # one line for the command line
    options: tuple[Option, ...] = ()
    summary: Callable[[dict], str] | None = None  # its note in the end-of-run summary, from its manifest entry
    precheck: Callable[[Config], None] | None = None  # raises before the stage starts (also when it is unchanged)
    # The facts of this machine its results depend on (a fingerprint part): a stage re-runs on other hardware.
    hardware: Callable[[], dict] = lambda: {}
    # What it reads beyond its config sections and input files (fingerprint parts: verify's verdicts, a bundle).
    reads: Callable[[Stage, Config, RunDir, dict | None], dict] | None = None
    joins_all: JoinsAll | None = None  # a stage outside ORDER that `all` runs when wanted
    # The stage compares cfg.require with what it ran (verify's required candidates): a run that requires
    # more than the last one did re-runs it; a requirement is still a check, not a fingerprint input.
    checks_require: bool = False
    distributed: bool = False  # may run under torchrun (every rank calls the stage function)
    # Declared input files that this cfg does not read (tune reads only the fallback files its precision inherits;
    # its own is its output): left out of its fingerprint, or each run would change the next one's; the recorded
    # sha256 of its outputs still catches a hand edit.
    not_read: Callable[..., tuple[str, ...]] | None = None

    def options_for(self, cfg: Config, given: dict) -> dict:
        """The keyword arguments of the stage function: every declared option, from ``given`` or the config."""
        unknown = sorted(set(given) - {o.dest for o in self.options})
        if unknown:
            known = ", ".join(o.dest for o in self.options) or "none"
            raise UsageError(f"{self.name} has no option {', '.join(unknown)} (its options: {known})")
        return {o.dest: o.value(cfg, given.get(o.dest, False)) for o in self.options}

    def configured(self, cfg: Config, options: dict):
        """``cfg`` with each given value option that names a config key set there (``tune --precision fp16`` is
        ``tune.precision=fp16``), so the fingerprint and the manifest describe what the stage ran with."""
        for option in self.options:
            value = options.get(option.dest)
            if option.metavar and option.config and value not in (None, False):
                section, key = option.config.split(".")
                part = getattr(cfg, section).model_copy(update={key: value})
                cfg = cfg.model_copy(update={section: part})
        return cfg

    def line(self, entry: StageEntry) -> str:
        """Its note in the end-of-run summary: its own summary of the details, else the skip or failure reason."""
        # A failed check (exit 1: verify's gate) finished its work, so its summary stands; otherwise the
        # details of a stage that did not finish are partial, and its error is the note.
        finished = entry.finished
        if entry.status in (Status.FAILED, Status.INTERRUPTED) and not finished:
            return " ".join(str(entry.error or "see the error above").split())
        if self.summary and finished:
            try:
                if records.from_entry(records.kind_of(self.name), entry) is not None:
                    return self.summary(entry)
            except InputError as exc:  # a damaged manifest: said on its line, never instead of the run's own error
                return str(exc)
        return entry.reason or ""


def _train_summary(entry: StageEntry) -> str:
    train = records.from_entry(records.TrainRecord, entry) or records.TrainRecord()
    boxes = train.learning is not None and train.learning.task == "detection"  # the val "acc" is a detector's mAP
    line = (f"best val {'mAP@0.5:0.95' if boxes else 'acc'} {100 * (train.best_val_acc or 0):.1f}% after "
            f"{train.epochs} epochs, amp {train.amp}")
    precise = train.precise_bn
    if precise is not None and precise.best_epoch_val_acc_before is not None:
        line += (f"; precise BN {100 * precise.best_epoch_val_acc_before:.1f}% -> "
                 f"{100 * (precise.best_epoch_val_acc_after or 0):.1f}%")
    learning = train.learning
    if learning is not None and entry.status == Status.FAILED:  # the learning check failed (exit 1): its line
        line += f"; {entry.error}"
    elif learning is not None:
        line += f"; {'learned' if learning.learned else learning.line}"
    return line


def _export_summary(entry: StageEntry) -> str:
    export = records.from_entry(records.ExportRecord, entry) or records.ExportRecord()
    graphs = {p: export.graph(p) for p in PRECISIONS}
    shares = [f"{p.upper()} {100 * g.fraction:.1f}%" for p, g in graphs.items() if g and g.fraction is not None]
    accepted = (f"; accepted {len(export.accepted_trace_warnings)} exporter warning(s) that the graph may differ "
                f"from the model (export.accept_trace_warnings): {export.accepted_trace_warnings[0]}"
                if export.accepted_trace_warnings else "")
    return f"opset {export.opset}, {export.exporter}" + (f"; {', '.join(shares)} of the nodes or matrix ops "
                                                         "in that precision" if shares else "") + accepted


def _verify_summary(entry: StageEntry) -> str:
    verify = records.from_entry(records.VerifyRecord, entry) or records.VerifyRecord()
    rows = ", ".join(f"{c}: {s}" for c, s in verify.candidates.items())
    undecided = verify.undecided
    why = (f" ({', '.join(undecided)}: inconclusive, passed only because the bound could not decide)"
           if undecided else "")
    deployable = verify.deployable
    line = rows if deployable is None else f"{rows}; deployable: {', '.join(deployable) or 'none'}{why}"
    if verify.held_out is not None:
        shown = verify.held_out if verify.held_out == "held out" else verify.held_out.upper()  # never a quiet "not"
        line += f"; verdict images: {shown}"
    if not verify.judged_reference:
        return line
    from pipeline.reports.verify_report import reference_words

    return f"{reference_words(verify.reference_accuracy, verify.reference_learned, verify.reference_task)}; {line}"


def _benchmark_summary(entry: StageEntry) -> str:
    return (records.from_entry(records.BenchmarkRecord, entry) or records.BenchmarkRecord()).headline


def _tune_summary(entry: StageEntry) -> str:
    return f"tuned artifact: {(records.from_entry(records.TuneRecord, entry) or records.TuneRecord()).summary}"


def _tune_not_read(cfg: Config) -> tuple[str, ...]:
    """The fallback files a tune of ``cfg.tune.precision`` does not read: its own (its output) and every other
    precision's but those its plug inherits FP32 nodes from (an INT8 tune reads ``fp16_fallback.json``, whose
    nodes stay in FP32 in every INT8 mix; an FP16 or BF16 tune reads none)."""
    from pipeline.precision import plugs

    plug = plugs.PLUGS.get(cfg.tune.precision)  # another name: tune itself says what it takes
    read = plug.reads_fp32_from if plug else ()
    return tuple(a.fallback_file(p) for p in PRECISIONS if p not in read)


def _qat_summary(entry: StageEntry) -> str:
    q = records.from_entry(records.QATRecord, entry) or records.QATRecord()
    return (f"{q.epochs} epochs, {q.seconds_per_epoch} s per epoch, best val acc {100 * (q.best_val_acc or 0):.1f}% "
            f"fake-quantized; {q.int8_layers} matrix layers in INT8 ({100 * (q.int8_fraction or 0):.1f}%)")


def _deploy_summary(entry: StageEntry) -> str:
    deploy = records.from_entry(records.DeployRecord, entry) or records.DeployRecord()
    refused = f"; refused: {', '.join(deploy.refused)}" if deploy.refused else ""
    served = f"; served as written and gated against the FP32 reference: {deploy.served}" if deploy.served else ""
    return f"{deploy.repository}: {', '.join(deploy.models)}{refused}{served}"


def _compare_summary(entry: StageEntry) -> str:
    compare = records.from_entry(records.CompareRecord, entry) or records.CompareRecord()
    rows = ", ".join(f"{name}: {status}" for name, status in compare.artifacts.items())
    slower = compare.latency_regressions
    return f"{rows}; latency regressions or missing rows: {', '.join(slower) or 'none'}; environment: " \
           f"{compare.environment}"


# --------------------------------------------------------------------------- the stage functions
# Each imports its module when called, so the table (and `--help`) loads none of them; each is a plain import, so
# jump-to-definition and the import graph (tests/test_architecture.py) follow it.


def _train(cfg: Config, run: RunDir, record, **options) -> None:
    from pipeline import train

    train.run(cfg, run, record, **options)


def _export(cfg: Config, run: RunDir, record, **options) -> None:
    from pipeline import export

    export.run(cfg, run, record, **options)


def _build(cfg: Config, run: RunDir, record, **options) -> None:
    from pipeline import build

    build.run(cfg, run, record, **options)


def _build_precheck(cfg: Config) -> None:
    from pipeline import build

    build.check_required(cfg)


def _verify(cfg: Config, run: RunDir, record, **options) -> None:
    from pipeline import verify

    verify.run(cfg, run, record, **options)


def _benchmark(cfg: Config, run: RunDir, record, **options) -> None:
    from pipeline import benchmark

    benchmark.run(cfg, run, record, **options)


def _tune(cfg: Config, run: RunDir, record, **options) -> None:
    from pipeline import tune

    tune.run(cfg, run, record, **options)


def _qat(cfg: Config, run: RunDir, record, **options) -> None:
    from pipeline import qat

    qat.run(cfg, run, record, **options)


def _compare(cfg: Config, run: RunDir, record, **options) -> None:
    from pipeline import compare

    compare.run(cfg, run, record, **options)


def _deploy(cfg: Config, run: RunDir, record, **options) -> None:
    from pipeline import deploy

    deploy.run(cfg, run, record, **options)


# --------------------------------------------------------------------------- fingerprint parts


def _gpu_name() -> str | None:
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else None


def _tensorrt_version() -> str | None:
    return getattr(env.tensorrt_status()[0], "__version__", None)


def _build_hardware() -> dict:
    trt, reason = env.tensorrt_status()
    return {"tensorrt": getattr(trt, "__version__", reason), "gpu": _gpu_name()}


def _verify_hardware() -> dict:
    """bf16 and int8 units decide whether openvino_bf16 and onnxrt_int8_cpu run."""
    return {"gpu": _gpu_name(), "tensorrt": _tensorrt_version(), "cpu_bf16": env.cpu_has_native_bf16(),
            "cpu_int8_dot": env.cpu_has_int8_dot_product()}


def _benchmark_hardware() -> dict:
    return {"cpu": env.cpu_model(), "cores": env.usable_cores(), "gpu": _gpu_name(), "tensorrt": _tensorrt_version()}


def _verdicts_read(stage: Stage, cfg: Config, run: RunDir, options: dict | None) -> dict:
    """verify's verdicts, which benchmark shows (the rest of verify's report does not matter), and the policy that
    names the fastest of those that count as passed."""
    from pipeline.reports.verify_report import read_policy, read_verdicts

    return {"verify": read_verdicts(run), "verify_policy": read_policy(run)}


def _compare_reads(stage: Stage, cfg: Config, run: RunDir, options: dict | None) -> dict:
    """verify's verdicts, and what compare reads from outside the run's artifacts: the bundle (its path and its
    files' sha256) and the environment facts it diffs."""
    from pipeline import baseline

    path = (options if options is not None else stage.options_for(cfg, {})).get("baseline")
    return {**_verdicts_read(stage, cfg, run, options),
            "compare": {"bundle": str(path), "files": baseline.digests(path),
                        "environment": baseline.environment((run.manifest or {}).get("environment") or {})}}


# --------------------------------------------------------------------------- stages that join `all` when wanted


def _tune_in_all(cfg: Config, run: RunDir, force: set[str]) -> None:
    """``all --tune``: tune (its speed gate only reported) before verify, then export and build again where its
    int8_fallback.json changed them, so verify and benchmark judge and time the tuned artifact."""
    stage = STAGES["tune"]
    fresh, _ = up_to_date(stage, cfg, run)
    ran = not fresh or stage.name in force
    run.this_invocation[stage.name] = "ran" if ran else "unchanged"
    if ran:
        run_stage(stage.name, cfg, run, no_speed_gate=True)
    for name in ("export", "build"):
        if not up_to_date(STAGES[name], cfg, run)[0]:
            run_stage(name, cfg, run)


def _compare_in_all(cfg: Config, run: RunDir, force: set[str]) -> None:
    """compare, unless it passed on the same bundle, verdicts, predictions, latency rows, config, code and
    environment (a failed compare always runs again: its exit code is this run's result)."""
    stage = STAGES["compare"]
    fresh, why = up_to_date(stage, cfg, run)
    if fresh:
        check_requirements(stage, cfg)
        run.this_invocation[stage.name] = "unchanged"
        log.info("%s: unchanged since %s, skipped", stage.name, run.stage_entry(stage.name).ended)
        return
    log.debug("%s: %s", stage.name, why)
    run.this_invocation[stage.name] = "ran"
    run_stage(stage.name, cfg, run)



TUNE_IN_ALL = JoinsAll(before="verify", wanted=lambda cfg, options: bool(options.get("tune")), run=_tune_in_all)
COMPARE_IN_ALL = JoinsAll(before=None, wanted=lambda cfg, options: bool(cfg.compare.baseline), run=_compare_in_all,
                          off_note="compare.baseline is not set")


# Each lower precision's graph, engine and fallback file (pipeline/precision/plugs.py), by name only: no plug is
# loaded to build the table (`--help` stays light).
GRAPHS = tuple(a.graph_file(p) for p in PRECISIONS)
ENGINES = tuple(a.engine_file(p) for p in PRECISIONS)
FALLBACKS = tuple(a.fallback_file(p) for p in PRECISIONS)

PROFILE = "record a torch.profiler trace (Chrome-trace JSON) of a few steps"

STAGES = {
    "train": Stage("train", _train, ("model", "data", "train"), (), (),
                   help="train the model with mixed precision (CPU, GPU, or torchrun)",
                   options=(Option("--resume", f"continue from the run's {a.CHECKPOINT}"),
                            Option("--profile", PROFILE)),
                   summary=_train_summary, distributed=True),
    "export": Stage("export", _export, ("model", "data", "export"),
                    (a.WEIGHTS, a.MODEL_CARD, *FALLBACKS, a.QAT_BEST_CHECKPOINT), ("train",),
                    help="export FP32 ONNX, convert it to mixed-precision FP16 ONNX and quantize it to INT8 Q/DQ ONNX",
                    summary=_export_summary),
    "build": Stage("build", _build, ("build",), (a.FP32_ONNX, *GRAPHS), ("export",),
                   help="build strongly typed TensorRT engines, FP16 and INT8 (skipped without GPU/TensorRT), and "
                        "OpenVINO IR",
                   precheck=_build_precheck, hardware=_build_hardware),
    # verify reads build.min/opt/max_batch too: it checks every batch size the artifacts serve
    # (pipeline/evaluation/batching.py)
    "verify": Stage("verify", _verify, ("model", "data", "build", "verify"),
                    (a.WEIGHTS, a.MODEL_CARD, a.FP32_ONNX, *GRAPHS, *ENGINES),
                    ("train", "export", "build"),
                    help="compare every backend with the FP32 PyTorch model and gate on it",
                    options=(Option("--auto-fallback", "move failing FP16 nodes to FP32 until the gate passes",
                                    config="verify.auto_fallback", in_all=True),),
                    summary=_verify_summary, checks_require=True, hardware=_verify_hardware),
    # Benchmark shows verify's verdicts, so those (not verify's whole report) enter its fingerprint:
    # a tolerance change that does not flip a verdict does not re-time anything.
    "benchmark": Stage("benchmark", _benchmark, ("model", "data", "benchmark"),
                       (a.WEIGHTS, a.FP32_ONNX, *GRAPHS, *ENGINES),
                       ("train", "export", "build"),
                       help="measure latency and throughput of every available backend",
                       options=(Option("--profile", PROFILE),), summary=_benchmark_summary,
                       hardware=_benchmark_hardware, reads=_verdicts_read),
    # Not in ORDER: `tune`, or `all --tune` (after build; export and build again where its choice changed them).
    # Upstream is train, not export: export re-runs after tune to apply its choice, and a new export run id would
    # make every later `all --tune` tune again. What tune reads of export's is model.onnx, an input by content.
    "tune": Stage("tune", _tune, ("model", "data", "export", "verify", "benchmark", "tune", "qat"),
                  (a.WEIGHTS, a.MODEL_CARD, a.FP32_ONNX, *FALLBACKS), ("train",), not_read=_tune_not_read,
                  help="choose the fastest INT8 (or FP16, BF16) mix that passes the gate, from measured per-layer "
                       "sensitivity and measured speed; write it as the precision's fallback file",
                  options=(Option("--tune", "tune the precision mix (tune.precision) after build, so verify and "
                                  "benchmark judge the tuned artifact", in_all=True),
                           Option("--no-speed-gate", "report the speed-up without failing on tune.min_speedup"),
                           Option("--precision", f"the low precision to mix with higher precision: "
                                  f"{', '.join(PRECISIONS)} (default: tune.precision)", config="tune.precision",
                                  metavar="|".join(PRECISIONS))),
                  summary=_tune_summary, joins_all=TUNE_IN_ALL),


    # Not in ORDER: `qat`, or tune's third rung (tune.qat). It writes model.int8.onnx (and int8_fallback.json, which
    # makes export rebuild that graph from qat's checkpoint: a later `all` keeps it).
    "qat": Stage("qat", _qat, ("model", "data", "train", "export", "qat"),
                 (a.WEIGHTS, a.MODEL_CARD, a.FP32_ONNX, a.FP16_FALLBACK), ("train",),
                 help="fine-tune the trained model for INT8 with fake quantization where PTQ puts its Q/DQ nodes "
                      "(quantization-aware training, distilled from the FP32 model) and write model.int8.onnx",
                 options=(Option("--resume", f"continue from the run's {a.QAT_CHECKPOINT}"),),
                 summary=_qat_summary),
    # A release gate across runs, not a step that makes an artifact: outside ORDER; `all` runs it last when
    # compare.baseline is set, and skips it as unchanged when nothing it reads changed: the bundle's two files and
    # their path (fingerprint), verify's verdicts for the files here now, these inputs, the environment it diffs.
    "compare": Stage("compare", _compare, ("compare",),
                     (a.MODEL_CARD, a.VERIFY_JSON, a.VERIFY_PREDICTIONS, a.BENCHMARK_JSON), ("verify", "benchmark"),
                     help="compare the run with a baseline bundle (predictions, accuracy, latency, environment)",
                     options=(Option("--baseline", "the baseline bundle (`baseline --out`); default compare.baseline",
                                     config="compare.baseline", metavar="PATH"),),
                     summary=_compare_summary, reads=_compare_reads, joins_all=COMPARE_IN_ALL),
    # A handoff, not a step of `all`: a Triton model repository outside the run directory (docs/deploy.md).
    "deploy": Stage("deploy", _deploy, ("model", "data", "build", "verify", "deploy"),
                    (a.VERIFY_JSON, a.BENCHMARK_JSON), ("verify", "benchmark"),
                    help="write a Triton model repository of every artifact that passed the gate (--serve: serve the "
                         "repository as written with a local Triton and gate what comes back)",
                    options=(Option("--target", "the serving system (default deploy.target)", config="deploy.target",
                                    metavar="triton"),
                             Option("--out", "the model repository folder (default deploy.out)", config="deploy.out",
                                    metavar="DIR"),
                             Option("--serve", "serve the written repository with Triton here (the serve extra), each "
                                    "model with its stock backend's behaviour; gate its outputs at batch 1, the "
                                    "largest batch and concurrency 8 against the FP32 reference; time one",
                                    config="deploy.serve")),
                    summary=_deploy_summary),
}


# --------------------------------------------------------------------------- fingerprints


def _source_files(cfg: Config) -> list[Path]:
    from pipeline.core.registry import models

    roots = [Path(__file__).parent, Path(models.__file__).parent]
    files = sorted(p for root in roots for p in root.rglob("*.py"))
    if models.is_import_path(cfg.model.name):  # a user model: its source is part of the code version
        source = models.import_path_source(cfg.model.name)
        if source is not None:
            files.append(source)
    return files


def code_version(cfg: Config) -> str:
    digest = hashlib.sha256()
    for path in _source_files(cfg):
        if path.is_file():
            digest.update(path.name.encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _libraries() -> dict:
    return {name: env.package_version(name) for name in
            ("torch", "onnx", "onnxruntime", "onnxruntime-gpu", "polygraphy", "nvidia-modelopt", "tensorrt",
             "tensorrt-cu12", "tensorrt-cu13", "openvino")}


def fingerprint(stage: Stage, cfg: Config, run: RunDir, options: dict | None = None) -> str:
    """``options``: the stage function's keyword arguments (default: from the config); compare's bundle path."""
    config = cfg.to_dict()
    unread = stage.not_read(cfg) if stage.not_read else ()
    payload = {
        "stage": stage.name,
        "config": {key: config[key] for key in stage.config_keys},
        "inputs": {name: sha256_file(run.file(name)) if run.file(name).is_file() else None for name in stage.inputs
                   if name not in unread},
        "code": code_version(cfg),
        "libraries": _libraries(),
        "hardware": stage.hardware(),
        # Each execution of a stage gets a new run id, so downstream stages re-run after it even
        # when it reproduced byte-identical outputs.
        "upstream_runs": {name: _run_id(run.stage_entry(name)) for name in stage.after},
    }
    if "data" in stage.config_keys:  # the data's content, not only its config: a new class folder re-trains
        payload["data"] = _data_summary(cfg, run)
    if stage.reads is not None:
        payload.update(stage.reads(stage, cfg, run, options))
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


def _run_id(entry: StageEntry | None) -> str | None:
    return entry.run_id if entry is not None else None


def _data_summary(cfg: Config, run: RunDir) -> dict:
    """The data's content summary (:func:`pipeline.core.data.content_summary`); while this command holds the run's
    lock, made once per data config (the data does not change under one command: `all` asks for it per stage) and
    cached by its files' digests in the run's data.digests.json."""
    from pipeline.core.data import content_summary

    if not run.is_locked:
        return content_summary(cfg.data)
    key = json.dumps(cfg.data.model_dump(mode="json"), sort_keys=True)
    if key not in run.memo:
        run.memo[key] = content_summary(cfg.data, run.file(a.DATA_DIGESTS))
    return run.memo[key]


def up_to_date(stage: Stage, cfg: Config, run: RunDir) -> tuple[bool, str]:
    """Whether ``stage`` can be skipped: same fingerprint, finished, outputs still intact."""
    entry = run.stage_entry(stage.name)
    if not entry or not entry.ended_normally:
        return False, "not run yet" if not entry else f"last run {entry.status}"
    if entry.fingerprint != fingerprint(stage, cfg, run):
        return False, "inputs changed"
    if stage.checks_require and not set(cfg.require) <= set(entry.require):
        return False, "it has not checked every required backend yet"
    for name, sha256 in run.recorded_artifacts(stage.name).items():
        path = run.file(name)
        if not path.is_file() or sha256_file(path) != sha256:
            return False, f"{name} is missing or was modified"
    return True, ""


# --------------------------------------------------------------------------- running


@contextlib.contextmanager
def open_run(cfg: Config, run_dir: str | Path, *, save=None, reads_trained: bool = False) -> Iterator[RunDir]:
    """The run directory, locked, with the environment recorded; what every stage runs in.

    The model name is checked first, so a typo creates nothing (``reads_trained``: against the run's model card
    before anything is imported). ``save`` is the config that config.yaml
    keeps (default ``cfg``); the command line passes the one without this invocation's ``--require`` flags.
    It is saved only when it produced something: after each stage that ends normally and when the
    command succeeds (or at once in a new run directory), so the overrides of a failed command never
    become the next run's config. A second process on the same directory gets a :class:`UsageError`.
    """
    from pipeline import config as config_mod
    from pipeline.core import modeling

    config_mod.check_machine(cfg)  # threads against the cores, data against the memory: before any work
    refuse_foreign(run_dir)  # a folder of the user's: refused before anything in it is read or written
    if reads_trained:  # a stage after train: the run's card is checked before a model file is imported
        modeling.check_card_first(cfg, run_dir)
    modeling.check_model_name(cfg)
    run = RunDir(run_dir)
    with run.locked():
        run.config_to_save = save if save is not None else cfg
        if not run.file(a.CONFIG).exists() and not run.file(a.CONFIG).is_symlink():
            save_config(run)  # a new run directory: the next command must not fall back to the defaults
        record_environment(run)
        yield run
        save_config(run)


def save_config(run: RunDir) -> None:
    """Write the config of the command that opened ``run`` to config.yaml (and the model name to the manifest)."""
    from pipeline import config as config_mod

    if run.config_to_save is None:
        return
    atomic_write(run.file(a.CONFIG), config_mod.dump_yaml(run.config_to_save))
    if run.manifest.get("model") != run.config_to_save.model.name:
        run.manifest["model"] = run.config_to_save.model.name
        run.save_manifest()


def _sections(stage: Stage, cfg: Config) -> dict:
    """The config sections ``stage`` reads, as they are recorded in its manifest entry (plain JSON)."""
    config = cfg.to_dict()
    return json.loads(json.dumps({key: config[key] for key in stage.config_keys}, default=str))


def _changes(before: dict, after: dict, prefix: str = "") -> list[str]:
    changes = []
    for key in sorted(set(before) | set(after), key=str):
        old, new = before.get(key, "(unset)"), after.get(key, "(unset)")
        if isinstance(old, dict) and isinstance(new, dict):
            changes += _changes(old, new, f"{prefix}{key}.")
        elif old != new:
            changes.append(f"{prefix}{key} {old} → {new}")
    return changes


def retrain_notice(cfg: Config, run: RunDir, force: set[str]) -> str | None:
    """The line ``all`` prints before it replaces trained weights without ``--force train``; None if it won't."""
    stage = STAGES["train"]
    entry = run.stage_entry(stage.name)
    if stage.name in force or not entry or entry.status != Status.OK or not run.file(a.WEIGHTS).is_file():
        return None
    if up_to_date(stage, cfg, run)[0]:
        return None
    changes = _changes(entry.config or {}, _sections(stage, cfg)) if "config" in entry.model_fields_set else []
    if changes:
        shown = ", ".join(changes[:3]) + (f", and {len(changes) - 3} more" if len(changes) > 3 else "")
        why = f"the model/data/train config changed since train ran ({shown})"
    else:
        why = "train's inputs changed since it ran (its config, the code, the library versions or the data)"
    return f"all: {why}: train re-runs and replaces the trained weights ({a.WEIGHTS})"


def record_environment(run: RunDir) -> None:
    conflict = env.onnxruntime_conflict()
    if conflict:
        log.warning("warning: %s", conflict)
    run.manifest["environment"] = env.collect()
    run.save_manifest()


def check_requirements(stage: Stage, cfg: Config) -> None:
    """Raise :class:`BackendUnavailable` for a required backend this stage cannot have here.

    A requirement is a check, not an input: it runs before the stage starts (also when the stage is
    up to date) and leaves the stage's manifest entry as it was, so an unmet requirement never makes
    the next run redo work.
    """
    token = current_stage.set(stage.name)
    if "cuda" in cfg.require:
        ok, reason = env.cuda_status()
        if not ok:
            raise BackendUnavailable(f"CUDA required but {reason}")  # the stage stays named for the error
    if stage.precheck:
        stage.precheck(cfg)
    current_stage.reset(token)


def run_stage(name: str, cfg: Config, run: RunDir, **options) -> StageEntry:
    """Run one stage with manifest bookkeeping; returns its manifest entry."""
    stage = STAGES[name]
    options = stage.options_for(cfg, options)
    cfg = stage.configured(cfg, options)
    check_requirements(stage, cfg)
    token = current_stage.set(name)
    with run.stage(name, fingerprint(stage, cfg, run, options)) as record:
        # what it ran with: `all` names a change before re-training
        record.update(run_id=uuid.uuid4().hex, require=sorted(cfg.require), config=_sections(stage, cfg))
        stage.function(cfg, run, record, **options)
    current_stage.reset(token)  # left set on failure, so the CLI can name the stage that failed
    save_config(run)  # its artifacts were made with this config
    if _replaced_artifacts(name, run):
        _follow_replacement(name, cfg, run)
    return run.stage_entry(name)


def _replaced_artifacts(name: str, run: RunDir) -> list[str]:
    """The upstream artifacts stage ``name`` replaced (verify --auto-fallback), as its record says."""
    record = records.from_entry(records.kind_of(name), run.stage_entry(name))
    return record.replaced_artifacts if record is not None else []


def _follow_replacement(name: str, cfg: Config, run: RunDir) -> None:
    """A stage replaced an upstream artifact (verify --auto-fallback: model.fp16.onnx or model.int8.onnx). Re-run
    the stages that produce and consume it, so every manifest entry describes the files on disk; then the
    replacing stage is current again, or re-runs where the model or the engine it judged changed."""
    replaced = _replaced_artifacts(name, run)
    log.info("%s replaced %s: re-running export and build", name, ", ".join(replaced))
    judged = {artifact: sha256_file(run.file(artifact)) for artifact in replaced}
    run_stage("export", cfg, run)  # keeps the replacement: the moved nodes are in fp16_fallback.json
    run_stage("build", cfg, run)
    built = bool(run.recorded_artifacts("build"))  # engines, or OpenVINO IR without TensorRT
    if built or any(sha256_file(run.file(a)) != h for a, h in judged.items()):
        run_stage(name, cfg, run)  # judge what is on disk now (a rebuilt engine included)
    else:
        run.refingerprint(name, fingerprint(STAGES[name], cfg, run))


def run_worker(name: str, cfg: Config, run_dir: str | Path, **options) -> None:
    """A torchrun rank > 0: the stage function in step with rank 0, which alone locks the run directory
    and writes the config, the manifest and the artifacts."""
    from pipeline.core.run import StageRecord

    stage = STAGES[name]
    run = RunDir(run_dir)
    current_stage.set(name)
    stage.function(cfg, run, StageRecord(run, name, StageEntry(status=Status.RUNNING), stored=False),
                   **stage.options_for(cfg, options))


def run_stages(cfg: Config, run: RunDir, *, force: set[str] | None = None, options: dict | None = None) -> dict:
    """train -> export -> build -> verify -> benchmark in an open run; unchanged stages are skipped unless forced."""
    force = set(force or ())
    options = options or {}
    unknown = sorted(force - set(ORDER))
    if unknown:
        raise UsageError(f"cannot force {', '.join(unknown)}: the stages are {', '.join(ORDER)}")
    notice = retrain_notice(cfg, run, force)
    if notice:
        log.warning("%s", notice)
    run.this_invocation = {}  # what summary() may show as this invocation's: the rest is marked as earlier
    for name in ORDER:
        stage = STAGES[name]
        for joining in _joining(before=name):
            _join(joining, cfg, run, force, options)
        if name not in force:
            fresh, why = up_to_date(stage, cfg, run)
            if fresh:
                check_requirements(stage, cfg)
                entry = run.stage_entry(name)
                run.this_invocation[name] = "unchanged"
                log.info("%s: unchanged since %s, skipped (--force %s re-runs it)", name, entry.ended, name)
                continue
            log.debug("%s: %s", name, why)
        run.this_invocation[name] = "ran"
        run_stage(name, cfg, run, **options.get(name, {}))
    for joining in _joining(before=None):  # compare: the release gate, skipped only when nothing it reads changed
        _join(joining, cfg, run, force, options)
    return run.manifest


NOT_CONFIGURED = "not configured"
NOT_RUN = StageEntry(status="not run")  # the summary's row of a stage without an entry


def _joining(*, before: str | None) -> list[Stage]:
    """The stages outside ORDER that join `all` before the stage ``before`` (None: after the last)."""
    return [s for s in STAGES.values() if s.joins_all is not None and s.joins_all.before == before]


def _join(stage: Stage, cfg: Config, run: RunDir, force: set[str], options: dict) -> None:
    joins = stage.joins_all
    if joins.wanted(cfg, options.get(stage.name, {})):
        joins.run(cfg, run, force)
    elif joins.off_note:
        run.this_invocation[stage.name] = NOT_CONFIGURED


def summary_order() -> tuple[str, ...]:
    """The stages the end-of-run summary lists: ORDER, each stage that joins `all` where it runs."""
    names = [n for name in ORDER for n in (*(s.name for s in _joining(before=name)), name)]
    return (*names, *(s.name for s in _joining(before=None)))


def run_all(cfg: Config, run_dir: str | Path, *, force: set[str] | None = None, options: dict | None = None,
            save=None, on_end: Callable[[RunDir], None] | None = None) -> dict:
    """Exactly ``python -m pipeline all`` (``cli.cmd_all`` calls it): open the run (lock, config.yaml,
    environment), then every stage.

    ``force`` names stages to re-run even if unchanged; ``options`` maps a stage to its options
    (``{"verify": {"auto_fallback": True}}``); ``on_end(run)`` runs however the stages end (the CLI prints
    the summary there). Returns the manifest.
    """
    with open_run(cfg, run_dir, save=save) as run:
        try:
            return run_stages(cfg, run, force=force, options=options)
        finally:
            if on_end is not None:
                on_end(run)


def summary(run: RunDir) -> str:
    """One line per stage, for the end of ``all``."""
    lines = [f"\nrun directory: {run.path}"]
    done = run.this_invocation
    for name in summary_order():
        entry = run.stage_entry(name)
        if name not in ORDER and entry is None:  # tune, compare: only where they ran
            continue
        shown = entry or NOT_RUN
        line = f"  {name:<10} {shown.status:<12} {STAGES[name].line(shown)}"
        if done is not None and done.get(name) == NOT_CONFIGURED:  # not part of this result: said, not shown
            line = f"  {name:<10} {'not run':<12} {STAGES[name].joins_all.off_note}: the {name} that ended " \
                   f"{shown.ended} ({entry.status if entry else None}) is not part of this result"
        elif done is not None and name not in done and entry:  # not reached now: an earlier run's row
            line = f"  {name:<10} {'earlier':<12} (not run now; an earlier run ended {entry.ended}: " \
                   f"{entry.status})"
        lines.append(line)
    return "\n".join(lines)
