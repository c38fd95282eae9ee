"""The baseline bundle: a small, reviewable record of a verified run that later runs are compared with.

``python -m pipeline baseline --run-dir DIR --out PATH`` writes a folder of two files, fit to commit:

* ``baseline.json`` (schema ``pipeline.baseline/2``, typed in :mod:`pipeline.core.bundle_schema`): the model card,
  the config, the environment (torch, ONNX Runtime, OpenVINO, TensorRT, the driver, the GPU, the CPU and its ISA),
  per artifact whose verdict counts as passed its verdict, accuracy, per-class accuracy and batch-size rows, every
  benchmark row with its raw latency samples, and the sha256 of ``predictions.npz``;
* ``predictions.npz``: per validation image its name, label and pixel digest, and per artifact (and the FP32
  reference) the top-5 classes with their logits (:mod:`pipeline.evaluation.predictions`).

:func:`read` reads a bundle back, through the run directory's confinement rules (no links, bounded, typed); a
``pipeline.baseline/1`` bundle (without image digests) is refused with how to write a new one. Both files are
written through :func:`pipeline.core.run.atomic_write`, ``predictions.npz`` first: a bundle whose writing was
interrupted has a ``baseline.json`` whose recorded sha256 does not match, and is refused, never half-read.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from pipeline.core import artifacts, benchmark_rows, bundle_schema, env, model_card, schema, verdicts, verify_rows
from pipeline.core.benchmark_rows import BenchmarkRow
from pipeline.core.bundle_schema import Artifact, BatchRow, Environment, LatencyRow, Meta, made
from pipeline.core.compare_result import EnvChange
from pipeline.core.errors import InputError, UsageError
from pipeline.core.run import RunDir, atomic_write, confined, now, open_confined, sha256_file
from pipeline.core.verify_rows import CandidateRow
from pipeline.evaluation import drift, predictions
from pipeline.evaluation.predictions import Predictions

SCHEMA = bundle_schema.SCHEMA
META = "baseline.json"
PREDICTIONS = "predictions.npz"
WRITE = "`python -m pipeline baseline --run-dir DIR --out PATH`"
# What a bundle is, in a refusal of a link or a device inside it (pipeline.core.run.confined)
BUNDLE_FOLDER = f"a baseline bundle holds plain files only: remove it, or write the bundle again with {WRITE}"
# The CPU features that change which kernels a runtime picks (and so its numbers): recorded and diffed.
ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile", "amx_bf16", "amx_int8")


@dataclass(frozen=True)
class Bundle:
    path: Path
    meta: Meta
    predictions: Predictions


# --------------------------------------------------------------------------- the environment


def environment(collected: dict) -> dict:
    """The facts a comparison names when they change, flat: versions, driver, GPU, CPU and ISA."""
    gpu = collected.get("gpu") or {}
    flags = env.cpu_flags()
    return {
        "torch": collected.get("torch"), "onnxruntime": collected.get("onnxruntime"),
        "openvino": collected.get("openvino"), "tensorrt": collected.get("tensorrt"),
        "polygraphy": collected.get("polygraphy"), "onnx": collected.get("onnx"),
        "driver": gpu.get("driver"), "gpu": gpu.get("name"), "cpu": collected.get("cpu"),
        "cpu_isa": " ".join(f for f in ISA_FLAGS if f in flags) or None,
    }


def env_diff(before: Environment, after: Environment) -> list[EnvChange]:
    """Every fact whose value changed, by name; versions printed as "10.13 -> 11.4"."""
    pairs = ((name, getattr(before, name), getattr(after, name)) for name in sorted(Environment.model_fields))
    return [EnvChange(what=name, baseline=then, run=now_) for name, then, now_ in pairs if then != now_]


def describe_env_diff(rows: list[EnvChange]) -> str:
    """One phrase: "tensorrt 10.13 -> 11.4, driver 580 -> 590"; "no change" when empty. The bundle's text is
    shown through :func:`pipeline.core.schema.printable` (no escape sequence, no newline, bounded)."""
    return ", ".join(f"{r.what} {schema.printable(r.baseline or '(none)', 80)} -> "
                     f"{schema.printable(r.run or '(none)', 80)}" for r in rows) or "no change"


# --------------------------------------------------------------------------- reading a run


def recorded_policy(run: RunDir) -> verdicts.InconclusivePolicy:
    """``verify.inconclusive`` as verify ran with it (:func:`pipeline.reports.verify_report.read_policy`)."""
    from pipeline.reports import verify_report

    return verify_report.read_policy(run)


def written_by(run: RunDir, stage: str, name: str, consumer: str) -> tuple[Path, str]:
    """The path of ``name`` and the sha256 ``stage`` recorded for it, which the file must still have (checked by
    the caller on the bytes it reads): never a file edited, copied in or left from another run."""
    path = run.require(name, stage, consumer)
    recorded = run.recorded_artifacts(stage).get(name)
    if not recorded:
        raise InputError(f"{path} is not recorded in the manifest as written by {stage}: re-run {stage}")
    return path, recorded


def check_written_by(run: RunDir, stage: str, name: str, consumer: str) -> Path:
    path, recorded = written_by(run, stage, name, consumer)
    if sha256_file(path) != recorded:
        raise InputError(f"{path} is not the file {stage} wrote (its sha256 differs from the manifest's): "
                         f"re-run {stage}")
    return path


def run_predictions(run: RunDir, consumer: str, candidates: list[str], classes: int) -> Predictions:
    """The run's ``verify.predictions.npz`` (only if it is the file verify wrote), with the ``candidates`` it has."""
    path, recorded = written_by(run, "verify", artifacts.VERIFY_PREDICTIONS, consumer)
    try:
        return predictions.read(path, "verify's predictions", candidates, classes, optional=True, finite=False,
                                sha256=recorded)
    except InputError as exc:
        raise InputError(f"{exc}; re-run verify") from None


def run_verdicts(run: RunDir, consumer: str) -> tuple[dict, verdicts.InconclusivePolicy]:
    """verify's verdict per candidate for the files here now (:func:`read_verdicts`), and the policy it ran with."""
    from pipeline.reports import verify_report

    verify_report.require_standing(run, consumer)  # the one check of verify's report (deploy's and the report's)
    return verify_report.read_verdicts(run) or {}, recorded_policy(run)


def latency_rows(run: RunDir, consumer: str) -> list[BenchmarkRow]:
    """benchmark.json's rows with raw samples (the file benchmark wrote, typed and bounded)."""
    path = check_written_by(run, "benchmark", artifacts.BENCHMARK_JSON, consumer)
    return [r for r in benchmark_rows.read(path).results if r.samples_ms]


def _latency_entries(run: RunDir) -> list[LatencyRow]:
    rows = [LatencyRow(backend=r.backend, precision=r.precision, device=r.device, batch_size=r.batch_size,
                       timing=r.timing, timing_kind=r.timing_kind, verify=r.verify, samples_ms=r.samples_ms)
            for r in latency_rows(run, "baseline")]
    if not rows:
        raise UsageError(f"{run.path}: benchmark.json has no timed rows: nothing to hold latency to (run "
                         "benchmark with at least one backend)")
    return rows


def _artifact_entry(candidate: CandidateRow, verdict: str, top1, labels, classes: list[str]) -> Artifact:
    batch_sizes = None if candidate.batch_sizes is None else [BatchRow.model_validate(r.to_json())
                                                              for r in candidate.batch_sizes]
    return Artifact(name=candidate.name, precision=candidate.precision, artifact=candidate.artifact,
                    artifact_sha256=candidate.artifact_sha256, verdict=verdict, accuracy=float((top1 == labels).mean()),
                    per_class_accuracy=drift.per_class_accuracy(top1, labels, classes), batch_sizes=batch_sizes)


def _passed_candidates(run: RunDir) -> list[tuple[CandidateRow, str]]:
    """verify.json's candidates whose verdict, for the files here now, counts as passed; with that verdict."""
    current, policy = run_verdicts(run, "baseline")
    report = verify_rows.read(run.file(artifacts.VERIFY_JSON))
    passed = [(c, current[c.name]) for c in report.candidates
              if verdicts.counts_as_passed(current.get(c.name, ""), policy)]
    if not passed:
        raise UsageError(f"{run.path}: no candidate passed verify's gate for the files there now "
                         "(run verify first): nothing to baseline")
    return passed


# --------------------------------------------------------------------------- writing and reading a bundle


def write(run: RunDir, out: Path) -> Path:
    """The bundle of ``run`` in the folder ``out`` (created; an existing bundle there is replaced)."""
    from pipeline import config as config_mod

    card = model_card.read(run.require(artifacts.MODEL_CARD, "train", "baseline"))
    classes = list(card.classes or [])
    candidates = _passed_candidates(run)
    preds = run_predictions(run, "baseline", [predictions.REFERENCE, *(c.name for c, _ in candidates)],
                            len(classes))
    if predictions.REFERENCE not in preds.top5:
        raise InputError(f"{run.file(artifacts.VERIFY_PREDICTIONS)} has no predictions of the reference "
                         f"({predictions.REFERENCE}): re-run verify")
    kept = [(c, v) for c, v in candidates if c.name in preds.top5]
    shown = {predictions.REFERENCE, *(c.name for c, _ in kept)}
    data = predictions.to_bytes(predictions.as_arrays(Predictions(
        preds.names, preds.labels, preds.digests, {k: v for k, v in preds.top5.items() if k in shown})))
    config = config_mod.load_yaml_file(run.file(artifacts.CONFIG)) if run.file(artifacts.CONFIG).is_file() else None
    facts = environment((run.manifest or {}).get("environment") or env.collect())
    meta = made(lambda: Meta(  # what compare will read back, checked before writing
        schema=SCHEMA, created=now(), run_dir=str(run.path), model=card.model, classes=classes,
        input_size=card.spec.input_size, model_card=card.to_json(), config=config, environment=Environment(**facts),
        images=len(preds.names), predictions_sha256=hashlib.sha256(data).hexdigest(),
        artifacts=[_artifact_entry(c, v, preds.top5[c.name].top1, preds.labels, classes) for c, v in kept],
        latency=_latency_entries(run)), out / META)
    folder = _folder(out)
    atomic_write(confined(folder, PREDICTIONS, BUNDLE_FOLDER), data)
    atomic_write(confined(folder, META, BUNDLE_FOLDER),
                 json.dumps(meta.to_json(), indent=1, sort_keys=False, default=str) + "\n")
    return out


def _folder(out: Path) -> Path:
    """``out``, created; refused when it is a symbolic link or holds something that is not a bundle (never written
    into). An empty folder is taken."""
    _refuse_linked_folder(out, "--out")
    if out.exists() and not (out.is_dir() and (_empty(out) or confined(out, META, BUNDLE_FOLDER).is_file())):
        raise UsageError(f"{out} exists and is not a baseline bundle: choose another --out")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot create the bundle folder {out}: {exc.strerror or exc}") from None
    return out


def _empty(folder: Path) -> bool:
    try:
        return next(os.scandir(folder), None) is None
    except OSError:
        return False


def _refuse_linked_folder(folder: Path, option: str) -> None:
    """The bundle folder itself as a symbolic link: writing through it would change the folder it points at, and a
    bundle read through one is not the folder the user named. Refused, never followed."""
    if folder.is_symlink():
        raise UsageError(f"refusing the bundle folder {folder}: it is a symbolic link (to {os.readlink(folder)}); "
                         f"give the real folder as {option}")


def read(path: Path) -> Bundle:
    """A bundle's metadata and predictions, checked; anything else is an :class:`InputError` (exit 2) in one line.
    Its files are read through the confinement rules: a link in the bundle is refused, never followed."""
    _refuse_linked_folder(path, "--baseline")
    meta_path = confined(path, META, BUNDLE_FOLDER) if path.is_dir() else path / META
    if not meta_path.is_file():
        raise InputError(f"{path} is not a baseline bundle (no {META}); write one with {WRITE}")
    meta = bundle_schema.read_meta(meta_path, WRITE)
    names = [predictions.REFERENCE, *(a.name for a in meta.artifacts)]
    preds = predictions.read(confined(path, PREDICTIONS, BUNDLE_FOLDER), "baseline predictions", names,
                             len(meta.classes), sha256=meta.predictions_sha256)
    if len(preds.names) != meta.images:
        raise InputError(f"{path / PREDICTIONS} holds {len(preds.names)} images, {META} says {meta.images}")
    return Bundle(path, meta, preds)


def digests(path: str | Path | None) -> dict | None:
    """The sha256 of a bundle's two files (None for one that is not there or not readable): what compare read,
    for its fingerprint."""
    if not path:
        return None
    folder = Path(path).expanduser()
    out = {}
    for name in (META, PREDICTIONS):
        try:
            with open_confined(confined(folder, name)) as f:  # no link in the bundle is followed
                out[name] = hashlib.file_digest(f, "sha256").hexdigest()
        except (OSError, InputError, UsageError):
            out[name] = None
    return out
