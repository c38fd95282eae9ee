"""The compare stage: a release gate across runs. The run in the run directory against a baseline bundle.

``python -m pipeline compare --baseline PATH [--run-dir DIR]`` (and ``all`` after benchmark when
``compare.baseline`` is set) reads the bundle (:mod:`pipeline.baseline`: typed, bounded, no links), and of this run
verify's verdicts for the files there now, verify's per-image predictions and benchmark's raw latency samples
(each only if it is the file its stage wrote). It refuses with exit 2 a bundle of another model, class list or
input size, or made on other images (names, pixels or labels). Otherwise every decision is
:mod:`pipeline.evaluation.drift`'s: per artifact of the bundle, ``missing`` unless this run has a verdict for the
file there now that counts as passed, else the prediction drift; per benchmark row of the bundle, the latency
ratio (``missing`` when this run did not time it). Exit 1 when an artifact or a row fails or is missing. Every
change in the environment is named. The result is one :class:`pipeline.core.compare_result.CompareResult`, made
here from drift's records. Reports: compare.json (its ``to_json``), compare.md, compare.junit.xml, the GitHub step
summary, and a section in report.html.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from pipeline import baseline as bundles
from pipeline.core import artifacts
from pipeline.core.benchmark_rows import BenchmarkRow
from pipeline.core.bundle_schema import Environment, made
from pipeline.core.compare_result import SCHEMA, ArtifactComparison, BaselineRef, CompareResult, LatencyComparison
from pipeline.core.errors import CheckFailed, InputError, UsageError
from pipeline.core.run import RunDir, StageRecord, now
from pipeline.core.schema import printable
from pipeline.core.status import Status
from pipeline.evaluation import drift
from pipeline.evaluation.predictions import REFERENCE, Predictions
from pipeline.precision import gate as criteria
from pipeline.reports import compare_report

if TYPE_CHECKING:  # annotations only
    from pipeline.core.config_schema import Config

log = logging.getLogger("pipeline")


def thresholds(cfg: Config) -> drift.Thresholds:
    return drift.Thresholds(**cfg.compare.model_dump(exclude={"baseline"}))  # the same names, in the same order


def _image_set(model: str, classes, input_size, p: Predictions) -> drift.ImageSet:
    return drift.ImageSet(model, tuple(classes), tuple(input_size), p.names, p.digests, p.labels)


def compare_artifacts(base: bundles.Bundle, run: Predictions, verdicts: dict, policy: str, t: drift.Thresholds,
                      classes: list[str]) -> list[ArtifactComparison]:
    """Every artifact of the bundle: missing (with why) or compared (:func:`drift.compare_artifact`)."""
    scale = criteria.logit_scale(base.predictions.top5[REFERENCE].logits)
    out = []
    for a in base.meta.artifacts:
        verdict, batches = verdicts.get(a.name), a.batch_sizes or None
        why = drift.missing_reason(verdict, policy, a.name in run.top5)
        if why is not None:
            out.append(ArtifactComparison.missing(a.name, verdict, batches, why))
            continue
        result = drift.compare_artifact(base.predictions.top5[a.name], run.top5[a.name], run.labels, run.names,
                                        classes, scale, t)
        failed = drift.failed_checks(result)
        out.append(ArtifactComparison.compared(a.name, verdict, batches, result,
                                               compare_report.artifact_reason(result, failed) if failed else None))
    return out


def compare_latency(base: bundles.Bundle, run_rows: list[BenchmarkRow],
                    t: drift.Thresholds) -> list[LatencyComparison]:
    series = [drift.LatencySeries(r.backend, r.batch_size, r.timing_kind, r.timing, np.asarray(r.samples_ms))
              for r in base.meta.latency]
    here = [drift.LatencySeries(r.backend, r.batch_size, r.timing_kind, r.timing, np.asarray(r.samples_ms))
            for r in run_rows]
    return [row.with_reason(compare_report.latency_reason(row)) if row.status == Status.FAILED else row
            for row in drift.compare_latency(series, here, t)]


def build_result(cfg: Config, base: bundles.Bundle, run: Predictions, verdicts: dict, policy: str,
                 run_env: Environment, run_rows) -> CompareResult:
    t = thresholds(cfg)
    meta = base.meta
    changes = bundles.env_diff(meta.environment, run_env)
    compared = compare_artifacts(base, run, verdicts, policy, t, list(meta.classes))
    latency = compare_latency(base, run_rows, t)
    return CompareResult(
        schema=SCHEMA, created=now(), model=meta.model,
        baseline=BaselineRef(path=str(base.path), created=meta.created, run_dir=meta.run_dir, schema=bundles.SCHEMA),
        thresholds=t, inconclusive_policy=policy, images=len(run.names), environment=changes,
        environment_summary=bundles.describe_env_diff(changes), artifacts=compared, latency=latency,
        passed=drift.gate_passed([a.status for a in compared] + [r.status for r in latency]))


def _bundle_path(cfg: Config, baseline: str | None) -> Path:
    where = baseline or cfg.compare.baseline
    if not where:
        raise UsageError("no baseline to compare with: pass --baseline PATH or set compare.baseline "
                         "(write one with `python -m pipeline baseline --run-dir DIR --out PATH`)")
    return Path(where).expanduser()


def run(cfg: Config, run_dir: RunDir, record: StageRecord, *, baseline: str | None = None) -> None:
    base = bundles.read(_bundle_path(cfg, baseline))
    from pipeline.core import model_card

    card = model_card.read(run_dir.require(artifacts.MODEL_CARD, "train", "compare"))
    classes = card.classes or []
    verdicts, policy = bundles.run_verdicts(run_dir, "compare")
    judged = [a.name for a in base.meta.artifacts  # only these have predictions worth loading
              if drift.missing_reason(verdicts.get(a.name), policy, has_predictions=True) is None]
    current = bundles.run_predictions(run_dir, "compare", judged, len(classes))
    meta = base.meta
    refused = drift.incompatibility(_image_set(meta.model, meta.classes, meta.input_size, base.predictions),
                                    _image_set(card.model, classes, card.spec.input_size, current))
    if refused:
        raise InputError(refused)
    facts = bundles.environment((run_dir.manifest or {}).get("environment") or {})
    run_env = made(lambda: Environment(**facts), run_dir.file(artifacts.MANIFEST), "environment")
    result = build_result(cfg, base, current, verdicts, policy, run_env, bundles.latency_rows(run_dir, "compare"))
    for p in compare_report.write_all(run_dir, result):
        record.artifact(p.name)
    record.details.update({"passed": result.passed, "baseline": str(base.path),
                           "artifacts": {a.name: a.status for a in result.artifacts},
                           "latency_regressions": [f"{r.backend}@{r.batch_size}" for r in result.latency
                                                   if r.status in drift.FAILING],
                           "environment": result.environment_summary})
    log.info("compare: %s against %s; environment: %s", Status.PASSED if result.passed else "FAILED",
             printable(base.path, 400), result.environment_summary)
    if not result.passed:
        raise CheckFailed(compare_report.failure_message(result))
