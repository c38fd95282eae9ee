"""What a Triton server returns for the repository deploy wrote, judged by verify's criteria against the FP32 reference.

Every model folder is loaded from disk as it is now (its ``config.pbtxt`` and model file, by
:mod:`pipeline.runtime.serving.triton_stock`, the stock backends' behaviour) and served; the validation images go
through it
in three arrangements (:func:`arrangements`): one image per request, ``max batch`` images per request, and one image
per request from 8 clients at once (the dynamic batcher gathers them). Each arrangement's outputs are judged by the
gate (:func:`pipeline.precision.gate.judge`) with the artifact's own precision criteria against the PyTorch FP32
model's outputs on the same images: the reference verify uses, not the runner that serves them. A model whose file is
not the one deploy wrote, whose backend would compute in another precision than the one verify gated, or which the
server refuses to load or answer, fails with that reason.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.core import deployment
from pipeline.core.deploy_result import ServedCheck, ServedModel, ServerInfo
from pipeline.core.errors import first_line
from pipeline.core.run import sha256_file
from pipeline.core.status import Status

log = logging.getLogger("pipeline")

CONCURRENCY = 8  # clients at once in the concurrent arrangement

Send = Callable[[str, np.ndarray], np.ndarray]  # (model name, one request's batch) -> its first output


@dataclass(frozen=True)
class Arrangement:
    """How the images are sent: ``batch`` images per request, ``concurrency`` clients at once."""

    name: str
    batch: int
    concurrency: int


def arrangements(max_batch: int, concurrency: int = CONCURRENCY) -> list[Arrangement]:
    """Batch 1, the largest batch one request may carry (when above 1), and batch 1 from ``concurrency`` clients."""
    out = [Arrangement("batch 1", 1, 1)]
    if max_batch > 1:
        out.append(Arrangement(f"batch {max_batch}", max_batch, 1))
    out.append(Arrangement(f"batch 1 x concurrency {concurrency}", 1, concurrency))
    return out


@dataclass(frozen=True)
class Served:
    """What one model is, for the check: its name, the precision verify gated it in, its gate, and the sha256 of
    each file deploy wrote for it (relative to the repository)."""

    name: str
    precision: str
    gate: dict
    files: dict[str, str]
    max_batch: int  # the largest batch one request carries (deployment.served_batch_range)


def file_problems(repository: Path, files: dict[str, str]) -> list[str]:
    """Every file of a model that is not, on disk now, the one deploy wrote."""
    problems = []
    for relative, digest in sorted(files.items()):
        path = repository / relative
        if path.is_symlink() or not path.is_file():
            problems.append(f"{relative} is missing")
        elif sha256_file(path) != digest:
            problems.append(f"{relative} is not the file deploy wrote (sha256 differs)")
    return problems


def send_all(send: Send, name: str, images: np.ndarray, arrangement: Arrangement) -> np.ndarray:
    """Every image sent in requests of ``arrangement.batch`` by ``arrangement.concurrency`` clients; the outputs in
    image order. The first failed request is raised. Fewer images than one request carries are repeated to fill it
    and the extra answers dropped: the largest batch is always sent, never only a short one."""
    if 0 < len(images) < arrangement.batch:
        filled = np.resize(images, (arrangement.batch, *images.shape[1:]))  # image i again at i + len(images), ...
        return send_all(send, name, filled, arrangement)[:len(images)]
    starts = list(range(0, len(images), arrangement.batch))
    outputs: list[np.ndarray | None] = [None] * len(starts)
    errors: list[BaseException] = []
    lock = threading.Lock()
    pending = iter(range(len(starts)))

    def work() -> None:
        while not errors:
            with lock:
                i = next(pending, None)
            if i is None:
                return
            try:
                outputs[i] = np.asarray(send(name, images[starts[i]: starts[i] + arrangement.batch]))
            except BaseException as exc:  # noqa: BLE001 (handed to the caller)
                errors.append(exc)

    threads = [threading.Thread(target=work, daemon=True) for _ in range(arrangement.concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return np.concatenate(outputs)


def check_model(model: Served, send: Send, images: np.ndarray, labels: np.ndarray, reference: np.ndarray,
                output_name: str, confidence: float, *, load_error: str = "", served_precision: str | None = None,
                repository: Path | None = None) -> ServedModel:
    """One model: why it cannot be trusted before anything is sent (its files, its load, its precision), then every
    arrangement's outputs judged by the gate against the FP32 reference."""
    refusals = file_problems(repository, model.files) if repository is not None else []
    if load_error:
        refusals.append(f"the server did not load it: {load_error}")
    mismatch = deployment.precision_mismatch(model.precision, served_precision)
    if mismatch:
        refusals.append(mismatch)
    checks: list[ServedCheck] = []
    if not load_error:
        for arrangement in arrangements(model.max_batch):
            checks.append(_check(model, send, images, labels, reference, output_name, confidence, arrangement))
    reasons = refusals + [f"{c.arrangement}: {c.reason}" for c in checks if c.status != Status.PASSED]
    verdict = deployment.served_verdict([c.status for c in checks], refused=bool(refusals))
    return ServedModel(model=model.name, precision=model.precision, served_precision=served_precision,
                       checks=checks, verdict=verdict, reason="; ".join(reasons))


def _check(model: Served, send: Send, images: np.ndarray, labels: np.ndarray, reference: np.ndarray,
           output_name: str, confidence: float, arrangement: Arrangement) -> ServedCheck:
    from pipeline.precision import gate as criteria

    row = functools.partial(ServedCheck, arrangement=arrangement.name, batch=arrangement.batch,
                            concurrency=arrangement.concurrency)
    try:
        served = send_all(send, model.name, images, arrangement)
    except Exception as exc:  # noqa: BLE001 (the server's answer, whatever its type)
        return row(status=Status.FAILED, reason=f"the request failed: {first_line(exc)[:300]}")
    result = criteria.judge([{output_name: served}], [{output_name: reference}], labels, model.gate, output_name,
                            confidence)
    log.info("deploy: served %s, %s: %s", model.name, arrangement.name, result.status)
    scaled, agreement = result.tensor_check.scaled_error_quantile, result.task_check.top1_agreement
    return row(status=result.status, scaled_error=scaled, top1_agreement=agreement,
               reason="" if result.status == Status.PASSED else
               (f"{result.status} verify's {model.precision} criteria against the FP32 reference (scaled error "
                f"{scaled}, top-1 agreement {agreement})"))


@contextlib.contextmanager
def in_process(stock, models, run_dir, log_file):
    """The front end without Triton: requests go straight to the stock backends' scheduler
    (:class:`pipeline.runtime.serving.triton_stock.Repository`), as Triton's core would hand them over. deploy's
    ``FRONT_END`` in the tests that run where the serve extra is not installed; nothing is timed."""
    yield stock.infer, ServerInfo(triton=None, binary="none: the stock backends' behaviour called in this process"), \
        (lambda *args: [])
