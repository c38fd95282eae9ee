"""OpenVINO IR: the CPU deployment artifacts build writes, and the only way verify and benchmark load them.

build converts each ONNX model with ``openvino.convert_model`` and saves it with
``openvino.save_model(..., compress_to_fp16=False)`` (the weights stay FP32: the precision is a
runtime decision of the CPU plugin) into ``openvino/``:

============  ==================  ========================  =====================================
IR            from                INFERENCE_PRECISION_HINT  what it is
============  ==================  ========================  =====================================
fp32.xml      model.onnx          f32                       FP32 on every CPU
bf16.xml      model.onnx          bf16                      BF16 compute on CPUs with bf16 units
int8.xml      model.int8.onnx     f32                       the Q/DQ graph: int8 kernels where the
                                                            graph quantizes, f32 elsewhere
============  ==================  ========================  =====================================

bf16 has its own file although its graph and weights equal fp32's: a deployed file and its verdict
name one precision, so each IR carries its hint in its own runtime info
(``pipeline/inference_precision_hint``) and its sidecar; a deployment compiles it with that hint.

Each IR has a sidecar ``openvino/<precision>.json`` (OpenVINO version, hint, the CPU it was
checked on, the sha256 of its ONNX source and of the .xml and .bin). An IR is a model, not code,
but the gate's verdict is about exact files, so :func:`load` refuses, before OpenVINO reads a
byte, any IR whose sidecar is missing or foreign, whose files changed, that came from another
ONNX file than the one in the run directory, or that the build stage did not record in the manifest.
The bytes checked are the bytes loaded.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline import __version__
from pipeline.core import env
from pipeline.core.artifacts import FP32_ONNX, INT8_ONNX, IR_TEMP_PREFIX, OPENVINO_DIR, bin_name, sidecar_name, xml_name
from pipeline.core.errors import InputError, StageFailed
from pipeline.core.run import RunDir, StageRecord, make_folder, now, read_sidecar, sha256_file, write_json

if TYPE_CHECKING:  # annotations only
    from pipeline.core.config_schema import Config

log = logging.getLogger("pipeline")

SIDECAR_SCHEMA = "pipeline.openvino/1"
HINT_RT_INFO = ["pipeline", "inference_precision_hint"]  # where each IR names its hint (model runtime info)


@dataclass(frozen=True)
class Spec:
    precision: str  # "fp32", "bf16", "int8": the file name and the backend's precision
    onnx: str  # the ONNX artifact it is converted from
    hint: str  # INFERENCE_PRECISION_HINT at compile time
    fp32_regions: bool = False  # the INT8 graph's FP16 regions upcast first (pipeline.precision.int8.with_fp32_regions)


SPECS = {s.precision: s for s in (Spec("fp32", FP32_ONNX, "f32"), Spec("bf16", FP32_ONNX, "bf16"),
                                  Spec("int8", INT8_ONNX, "f32", fp32_regions=True))}


def status() -> tuple[object | None, str]:
    """``(openvino_module, "")`` or ``(None, reason)``."""
    try:
        import openvino
    except ImportError as exc:
        return None, f"OpenVINO is not installed ({exc}); pip install openvino"
    except Exception as exc:  # a broken install
        return None, f"OpenVINO failed to import: {type(exc).__name__}: {exc}"
    return openvino, ""


def cpu_capabilities() -> list[str]:
    """OpenVINO's CPU plugin's OPTIMIZATION_CAPABILITIES (FP32, BF16, INT8, ...); [] without OpenVINO."""
    ov, _ = status()
    if ov is None:
        return []
    return [str(c) for c in ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")]


def bf16_reason() -> str:
    """Why BF16 cannot run natively on this CPU ("" when it can): the pipeline's CPU flags AND OpenVINO's plugin."""
    if not env.cpu_has_native_bf16():
        simulated = env.cpu_flags_simulated()
        where = f" (CPU flags simulated by {env.CPU_FLAGS_ENV}={simulated!r})" if simulated is not None else ""
        return f"this CPU has no bf16 units (neither amx_bf16 nor avx512_bf16){where}: BF16 would be emulated"
    caps = cpu_capabilities()
    if "BF16" not in caps:
        return f"OpenVINO's CPU plugin does not list BF16 among its capabilities ({', '.join(caps) or 'none'})"
    return ""


def checked_on() -> dict:
    """The CPU an IR was converted and checked on."""
    flags = env.cpu_flags()
    return {"cpu": env.cpu_model(), "isa": [f for f in env.ISA_FLAGS if f in flags],
            "openvino_capabilities": cpu_capabilities(),
            **({"cpu_flags_simulated": env.cpu_flags_simulated()} if env.cpu_flags_simulated() is not None else {})}


# --------------------------------------------------------------------------- build


def write_all(cfg: Config, run_dir: RunDir, record: StageRecord) -> dict:
    """build's hook: every IR whose ONNX source exists, with its sidecar, recorded in ``record``.

    Runs whether or not TensorRT can build here. Returns what it wrote (build's details["openvino"]).
    """
    ov, reason = status()
    if ov is None:
        _remove_all(run_dir)
        log.info("build: OpenVINO IR skipped: %s", reason)
        return {"skipped": reason}
    written = {}
    for spec in SPECS.values():
        source = run_dir.file(spec.onnx)
        if not source.is_file():
            _remove(run_dir, spec.precision)  # never an IR of a model that is no longer there
            continue
        try:
            sidecar = write(ov, source, run_dir, spec)
        except StageFailed as exc:  # this IR only: the others are still written, its candidate says why
            _remove(run_dir, spec.precision)
            log.warning("build: %s", exc)
            written[spec.precision] = {"error": str(exc)}
            continue
        for name in (xml_name(spec.precision), bin_name(spec.precision), sidecar_name(spec.precision)):
            record.artifact(name)
        written[spec.precision] = {k: sidecar[k] for k in ("onnx", "hint", "openvino")}
    log.info("build: OpenVINO %s IR written to %s/: %s", ov.__version__, OPENVINO_DIR,
             ", ".join(p for p, w in written.items() if "error" not in w) or "none")
    return written


def build_error(run_dir: RunDir, precision: str) -> str | None:
    """Why the build stage could not write this IR (OpenVINO could not convert its ONNX file), if it said so."""
    build = run_dir.build_record()
    ir = build.openvino.get(precision) if build is not None else None
    return ir.error if ir is not None else None


def write(ov, source: Path, run_dir: RunDir, spec: Spec) -> dict:
    """Convert ``source`` and save ``openvino/<precision>.xml/.bin`` and the sidecar (files replaced at once)."""
    where = folder(run_dir)
    make_folder(where)
    with tempfile.TemporaryDirectory(prefix=IR_TEMP_PREFIX, dir=where) as tmp:
        try:
            model = ov.convert_model(str(_convertible(source, spec, Path(tmp))))
        except Exception as exc:  # OpenVINO's message: the first line names the C++ file, the next ones the cause
            lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
            what = f"{lines[1][:160]} ... {lines[-1][:200]}" if len(lines) > 2 else " ".join(lines)[:400]
            raise StageFailed(f"OpenVINO {ov.__version__.split('-')[0]} could not convert {source.name}: "
                              f"{what}") from None
        model.set_rt_info(spec.hint, HINT_RT_INFO)
        ov.save_model(model, str(Path(tmp) / "m.xml"), compress_to_fp16=False)
        os.replace(Path(tmp) / "m.bin", run_dir.file(bin_name(spec.precision)))
        os.replace(Path(tmp) / "m.xml", run_dir.file(xml_name(spec.precision)))
    sidecar = {
        "schema": SIDECAR_SCHEMA,
        "written_by": f"pipeline {__version__}",
        "precision": spec.precision,
        "hint": spec.hint,
        "openvino": ov.__version__,
        "checked_on": checked_on(),
        "onnx": spec.onnx,
        "onnx_sha256": sha256_file(source),
        "xml": xml_name(spec.precision),
        "xml_sha256": sha256_file(run_dir.file(xml_name(spec.precision))),
        "bin": bin_name(spec.precision),
        "bin_sha256": sha256_file(run_dir.file(bin_name(spec.precision))),
        "compress_to_fp16": False,
        "fp16_regions": "upcast to FP32 before conversion (the Q/DQ nodes and scales unchanged)" if spec.fp32_regions
        else None,
        "written_at": now(),
    }
    write_json(run_dir.file(sidecar_name(spec.precision)), sidecar)
    return sidecar


def _convertible(source: Path, spec: Spec, tmp: Path) -> Path:
    """What ``convert_model`` reads: the ONNX file, or for INT8 its FP32-region twin in ``tmp``.

    OpenVINO 2026.4 cannot convert ModelOpt's INT8 graph with FP16 regions; see
    :func:`pipeline.precision.int8.with_fp32_regions`. The sidecar still records the sha256 of ``model.int8.onnx``.
    """
    if not spec.fp32_regions:
        return source
    import onnx

    from pipeline.precision import int8

    target = tmp / f"{spec.precision}.fp32-regions.onnx"
    onnx.save(int8.with_fp32_regions(onnx.load(str(source))), str(target))
    return target


def folder(run_dir: RunDir) -> Path:
    """``openvino/`` in the run directory; a symlink there could send the IR (or read it from) elsewhere: refused."""
    path = run_dir.file(OPENVINO_DIR)
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        raise InputError(f"{path} is a symlink or not a folder: the OpenVINO IR lives in a real folder of the run "
                         f"directory; remove it and re-run build")
    return path


def _remove(run_dir: RunDir, precision: str) -> None:
    for name in (xml_name(precision), bin_name(precision), sidecar_name(precision)):
        run_dir.file(name).unlink(missing_ok=True)


def _remove_all(run_dir: RunDir) -> None:
    if folder(run_dir).is_dir():
        shutil.rmtree(folder(run_dir))


# --------------------------------------------------------------------------- load


def load(run_dir: RunDir, precision: str) -> tuple[bytes, bytes, dict]:
    """The IR's .xml and .bin bytes and its sidecar, after every check passed on exactly those bytes.

    This is the only way the pipeline reads an IR. Raises :class:`InputError` (exit 2), one line.
    """
    xml_path = folder(run_dir) / f"{precision}.xml"
    rebuild = f"re-run `python -m pipeline build --run-dir {run_dir.path}`"
    if not xml_path.is_file() or not run_dir.file(bin_name(precision)).is_file():
        raise InputError(f"{xml_name(precision)} (or its .bin) does not exist; the build stage writes it: {rebuild}")
    xml, weights = xml_path.read_bytes(), run_dir.file(bin_name(precision)).read_bytes()
    sidecar = check_sidecar(run_dir, precision, xml, weights, rebuild)
    check_recorded(run_dir, precision, xml, weights, rebuild)
    return xml, weights, sidecar


def check_sidecar(run_dir: RunDir, precision: str, xml: bytes, weights: bytes, rebuild: str) -> dict:
    """The sidecar exists, is ours, matches these bytes, and names the ONNX file in the run directory now."""
    name, path = xml_name(precision), run_dir.file(sidecar_name(precision))
    sidecar = read_sidecar(path, name, what="OpenVINO IR", schema=SIDECAR_SCHEMA, author_key="written_by",
                           rebuild=rebuild)
    if sidecar.get("precision") != precision:
        raise InputError(f"{sidecar_name(precision)} is not this tool's sidecar of {name}; refusing to load it; "
                         f"{rebuild}")
    for what, data in (("xml", xml), ("bin", weights)):
        actual = hashlib.sha256(data).hexdigest()
        if actual != sidecar.get(f"{what}_sha256"):
            raise InputError(f"{sidecar.get(what) or what} does not match its sidecar (sha256 {actual[:12]}..., "
                             f"recorded {str(sidecar.get(f'{what}_sha256'))[:12]}...): the file was changed after "
                             f"the build; refusing to load it; {rebuild}")
    source = run_dir.file(SPECS[precision].onnx)
    if not source.is_file() or sha256_file(source) != sidecar.get("onnx_sha256"):
        now_ = "is missing" if not source.is_file() else "has changed since"
        raise InputError(f"{name} was converted from another {SPECS[precision].onnx} (the file {now_} the build): "
                         f"it is not the model under test; {rebuild}")
    return sidecar


def check_recorded(run_dir: RunDir, precision: str, xml: bytes, weights: bytes, rebuild: str) -> None:
    """The IR must be the one the build stage recorded in the manifest (a sidecar alone proves nothing)."""
    for name, data in ((xml_name(precision), xml), (bin_name(precision), weights)):
        want = run_dir.recorded_sha256("build", name)
        actual = hashlib.sha256(data).hexdigest()
        if want != actual:
            why = "no build recorded it" if want is None else f"the build recorded sha256 {want[:12]}..."
            raise InputError(f"{name} (sha256 {actual[:12]}...) is not the IR the build stage recorded in the "
                             f"manifest ({why}); refusing to load it; {rebuild}")
