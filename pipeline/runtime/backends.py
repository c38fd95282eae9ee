"""The one table of backends that verify checks and benchmark times, in the style of Polygraphy's runners.

Each :class:`Backend` names a runtime x precision x device x artifact, says why it cannot run
here (``unavailable(ctx)``: "" when it can), and makes a runner (``make(ctx)``) that follows
:mod:`pipeline.runtime.runners`' contract: a context manager with ``infer(feed) -> outputs`` plus the
timing hook ``timers(feed)``. verify checks every entry with a ``candidate`` name against the
PyTorch FP32 reference; benchmark times the entries named in ``benchmark.backends``. Adding a
backend (INT8 TensorRT, OpenVINO) is one entry here, its runner, and its tests.

verify and benchmark get runners through :func:`pipeline.runtime.isolate.runner_for`: an entry backed by a native
runtime (``runtime`` other than PyTorch) runs in a child process (:class:`pipeline.runtime.isolate.Isolated`,
Polygraphy's ``--use-subprocess``), so a crash there becomes that backend's "crashed" row.

This module imports nothing heavy: the runners and their libraries load inside ``make``.
"""

from __future__ import annotations

import logging
from dataclasses import KW_ONLY, dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, Callable

from pipeline.core import env
from pipeline.core.artifacts import ENGINE, FP16_ONNX, FP32_ONNX, INT8_ENGINE, INT8_ONNX, xml_name
from pipeline.core.errors import InputError
from pipeline.core.run import RunDir, sha256_file

if TYPE_CHECKING:  # only for the annotations: this module imports nothing heavy
    import onnx
    import torch

log = logging.getLogger("pipeline")

REFERENCE = "torch_fp32"
NO_FP16 = "no model.fp16.onnx (export.fp16.enabled is false)"
NO_INT8 = "no model.int8.onnx (export.int8.enabled is false)"


@dataclass
class Context:
    """What the runners of one stage may need; built once by verify or benchmark."""

    cfg: Any  # the validated config (pipeline.config.Config; in a child process, the same keys as attributes)
    run_dir: RunDir
    stage: str  # "verify" or "benchmark", for messages
    spec: dict  # the model card's spec: input/output names, input size
    model: torch.nn.Module | None = None  # the trained FP32 model (verify's reference; the torch backends)
    threads: int | None = None  # ONNX Runtime intra-op threads; None: its defaults (verify)
    gpu: bool = False  # whether "auto" backends run on CUDA (benchmark on a GPU machine)
    fp16: onnx.ModelProto | None = field(default=None, repr=False)  # an FP16 ModelProto under test (verify's fallback candidates)
    isolate: bool = True  # native runtimes in a child process (False: in this process, as the child itself does)
    int8: onnx.ModelProto | None = field(default=None, repr=False)  # an INT8 Q/DQ ModelProto under test (verify's fallback candidates)

    @cached_property
    def fp16_model(self):
        """``model.fp16.onnx`` (or the FP16 model under test), loaded and checked once; None without one."""
        return self.fp16 if self.fp16 is not None else self._graph(FP16_ONNX, "FP16 ONNX model")

    @cached_property
    def int8_model(self):
        """``model.int8.onnx`` (or the INT8 model under test), loaded and checked once; None without one."""
        return self.int8 if self.int8 is not None else self._graph(INT8_ONNX, "INT8 ONNX model")

    def _graph(self, name: str, what: str):
        from pipeline.core import onnx_io

        path = self.run_dir.file(name)
        return onnx_io.load(path, what) if path.exists() else None

    def fp32_path(self):
        from pipeline.core import onnx_io

        path = self.run_dir.require(FP32_ONNX, "export", self.stage)
        onnx_io.load(path)  # the external-data check, and one clear error for a corrupt file
        return path


@dataclass(frozen=True)
class Backend:
    name: str  # benchmark.backends entry and benchmark.json "backend"
    _: KW_ONLY  # every other field is named where an entry is written
    precision: str  # "fp32", "fp16", "int8", "bf16", "mixed": picks the gate verify.<precision> (else verify.fp32)
    device: str  # "cpu", "cuda", or "auto" (CUDA where usable, else the CPU)
    artifact: str | None  # the run-directory file it runs; None: the trained PyTorch model
    label: str | Callable[[object], str]  # one line for the reports (or a function of the config)
    unavailable: Callable[[Context], str]  # why it cannot run here; "" when it can
    make: Callable[[Context], object]  # its runner (see pipeline.runtime.runners)
    candidate: str | None = None  # verify checks it under this name (verify.candidates.<name>); None: it does not
    benchmark: str = "default"  # "default": in benchmark.backends' default; "opt-in": timed when named; "no"
    requires: str | None = None  # the `require` entry that makes its absence an error ("tensorrt", "cuda")
    shown_precision: str = ""  # benchmark.json's precision column, when more telling than ``precision``
    note: str = ""  # benchmark.json's note
    runtime: str = "PyTorch"  # the library that runs it, as crash messages name it
    required_if: Callable[[object], bool] | None = None  # whether the config asks for it at all (None: always)
    # Whether its verdict decides verify's exit code under verify.gate=auto: a deployment target (an engine, an
    # OpenVINO IR, the FP32 export) or the faithful CPU proxy of one (the FP16 emulation, the exact Q/DQ run).
    # False only for what is neither, which is then run and reported only.
    gates: bool = True

    @property
    def isolated(self) -> bool:
        """Whether its runner runs in a child process: every native runtime (a crash there must not kill the stage)."""
        return self.runtime != "PyTorch"

    def on(self, ctx: Context) -> str:
        return ("cuda" if ctx.gpu else "cpu") if self.device == "auto" else self.device

    def required(self, cfg) -> bool:
        """Its absence is exit 3: ``require`` names its runtime and the config asks for it (an engine
        precision left out of ``build.precisions`` or whose export is off is skipped, never required)."""
        wanted = self.required_if is None or self.required_if(cfg)
        return self.requires is not None and self.requires in cfg.require and wanted

    @property
    def uses_fp16_model(self) -> bool:
        """Whether it runs the FP16 model (so localisation and the FP32 fallback concern it)."""
        return self.artifact in (FP16_ONNX, ENGINE)

    @property
    def uses_int8_model(self) -> bool:
        """Whether it runs the INT8 Q/DQ model, or an engine or IR made from it (so INT8 localisation and
        fallback concern it)."""
        return self.artifact in (INT8_ONNX, INT8_ENGINE, xml_name("int8"))


# --------------------------------------------------------------------------- availability


def _always(ctx: Context) -> str:
    return ""


def _needs_fp16(ctx: Context) -> str:
    """"" with an FP16 model; the reason without one, only when the config says export writes none.

    When ``export.fp16.enabled`` is true, a missing ``model.fp16.onnx`` is an :class:`InputError`
    ("run export first"): skipping its candidates would pass a gate that checked nothing.
    """
    if ctx.fp16_model is not None:
        return ""
    if ctx.cfg.export.fp16.enabled:
        ctx.run_dir.require(FP16_ONNX, "export", ctx.stage)  # raises: the file is missing
    return NO_FP16


def _needs_int8(ctx: Context) -> str:
    """"" with an INT8 model; the reason without one: disabled by the config, or the reason export recorded
    for skipping it (no ModelOpt). Otherwise a missing ``model.int8.onnx`` is an :class:`InputError`."""
    if ctx.int8_model is not None:
        return ""
    if not ctx.cfg.export.int8.enabled:
        return NO_INT8
    skipped = ((ctx.run_dir.stage_entry("export") or {}).get("details") or {}).get("int8", {}).get("skipped")
    if skipped:
        return f"no model.int8.onnx: export skipped INT8 ({skipped})"
    ctx.run_dir.require(INT8_ONNX, "export", ctx.stage)  # raises: the file is missing
    return NO_INT8


def no_int8_dot_product(runtime: str) -> str:
    """Why a CPU runtime's int8 kernels are not judged on a CPU without VNNI/AMX: their u8s8 dot products sum in
    16 bits and can saturate (ONNX Runtime's quantization notes; OpenVINO with oneDNN limited to AVX2 moved
    a tiny model's logits 0.40 where the exact Q/DQ execution moved them 0.017)."""
    return (f"this CPU has no VNNI or AMX int8 units: {runtime}'s int8 kernels can saturate on it, so they would "
            "not compute model.int8.onnx's arithmetic; int8_exact still checks the INT8 decisions here")


def _ort_int8_unavailable(ctx: Context) -> str:
    return _needs_int8(ctx) or ("" if env.cpu_has_int8_dot_product() else no_int8_dot_product(ORT))


def _cuda_ort(fp16_graph: bool) -> Callable[[Context], str]:
    def check(ctx: Context) -> str:
        if fp16_graph and _needs_fp16(ctx):
            return NO_FP16
        ok, reason = env.cuda_status()
        if not ok:
            return reason
        import onnxruntime

        if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
            return "this ONNX Runtime build has no CUDA provider (install onnxruntime-gpu)"
        return ""

    return check


def _tensorrt_unavailable(engine: str) -> Callable[[Context], str]:
    def check(ctx: Context) -> str:
        """Cheap checks only: the engine itself is loaded (and checked) when the runner is made."""
        from pipeline.runtime import tensorrt_engine

        if engine == INT8_ENGINE and not ctx.cfg.export.int8.enabled:
            return NO_INT8  # INT8 off: "disabled" everywhere, whatever this machine has
        ok, reason = tensorrt_engine.availability()
        if not ok:
            return reason
        skipped = tensorrt_engine.skip_reason(ctx.cfg, ctx.run_dir, engine)
        if skipped:
            return skipped
        # TensorRT can run here, so build writes this engine: a missing one is "run build first" (exit 2),
        # never a skipped candidate that lets the gate pass without it.
        ctx.run_dir.require(engine, "build", ctx.stage)
        return ""

    return check


def _openvino_unavailable(precision: str) -> Callable[[Context], str]:
    """OpenVINO installed; bf16: bf16 units (the pipeline's CPU flags and OpenVINO's capabilities); int8: the
    Q/DQ model. Cheap checks only: the IR itself is checked (and loaded) when the runner is made."""
    def check(ctx: Context) -> str:
        from pipeline.runtime import openvino_ir

        ov, reason = openvino_ir.status()
        if ov is None:
            return reason
        if precision == "bf16" and openvino_ir.bf16_reason():
            return openvino_ir.bf16_reason()
        if precision == "int8" and _needs_int8(ctx):
            return _needs_int8(ctx)
        if precision == "int8" and not env.cpu_has_int8_dot_product():
            return no_int8_dot_product("OpenVINO")
        return _no_ir(ctx, precision)

    return check


def _no_ir(ctx: Context, precision: str) -> str:
    """Without the IR: "run build first" where the build stage recorded it, else the reason (build has not run)."""
    from pipeline.runtime import openvino_ir

    name = xml_name(precision)
    if ctx.run_dir.file(name).is_file():
        return ""
    error = openvino_ir.build_error(ctx.run_dir, precision)
    if error:
        return f"no {name}: {error}"
    if name in ((ctx.run_dir.stage_entry("build") or {}).get("artifacts") or {}):
        ctx.run_dir.require(name, "build", ctx.stage)  # raises: build wrote it, and it is gone
    return f"no {name}: the build stage has not written it (run `python -m pipeline build`)"


# --------------------------------------------------------------------------- runners


def _torch(name: str, *, autocast: bool = False, compile: bool = False) -> Callable[[Context], object]:
    def make(ctx: Context):
        import torch

        from pipeline.runtime.runners import TorchRunner

        device = "cuda" if ctx.gpu else "cpu"
        dtype = (torch.float16 if device == "cuda" else torch.bfloat16) if autocast else None
        runner = TorchRunner(ctx.model, name=name, input_name=ctx.spec["input_name"],
                             output_name=ctx.spec["output_name"],
                             input_shape=tuple(ctx.spec["input_size"]), device=device, autocast_dtype=dtype,
                             channels_last=ctx.cfg.train.channels_last, compile=compile,
                             cuda_graphs=ctx.cfg.benchmark.cuda_graphs)
        if autocast and device == "cpu" and not env.cpu_has_native_bf16():
            runner.note = "this CPU has no bf16 matrix units: bf16 is emulated and slow"
        return runner

    return make


def _ort(name: str, *, fp16_graph: bool, cuda: bool = False) -> Callable[[Context], object]:
    def make(ctx: Context):
        from pipeline.runtime.runners import onnxrt_runner

        from pipeline.runtime.runners import FP16_CPU_DISABLED_OPTIMIZERS

        source = ctx.fp16_model.SerializeToString() if fp16_graph else ctx.fp32_path()
        disabled = FP16_CPU_DISABLED_OPTIMIZERS if fp16_graph and not cuda else ()
        return onnxrt_runner(source, name=name, providers=["cuda"] if cuda else ["cpu"], threads=ctx.threads,
                             disabled_optimizers=disabled)

    return make


def _emulation(ctx: Context):
    from pipeline.runtime.runners import fp16_emulation_runner

    return fp16_emulation_runner(ctx.fp16_model, ctx.cfg.verify.emulation, "fp16_emulation")


def _emulation_label(cfg) -> str:
    mode = cfg.verify.emulation
    how = "every FP16 tensor rounded, FP32 accumulation" if mode == "fast" else "NumPy float16 reference evaluator"
    return f"FP16 emulation ({mode}: {how}), model.fp16.onnx"


def _int8_exact(ctx: Context):
    from pipeline.runtime.runners import int8_exact_runner

    return int8_exact_runner(ctx.int8_model, "int8_exact")


def _ort_int8(ctx: Context):
    from pipeline.runtime.runners import INT8_CPU_DISABLED_OPTIMIZERS, onnxrt_runner

    return onnxrt_runner(ctx.int8_model.SerializeToString(), name="onnxrt_int8_cpu", threads=ctx.threads,
                         disabled_optimizers=INT8_CPU_DISABLED_OPTIMIZERS)


def _engine_wanted(precision: str) -> Callable[[object], bool]:
    """Whether the config asks build for this precision's engine (INT8 also needs export to write its graph)."""
    def wanted(cfg) -> bool:
        return precision in cfg.build.precisions and (precision != "int8" or cfg.export.int8.enabled)

    return wanted


def _tensorrt(engine: str, name: str) -> Callable[[Context], object]:
    def make(ctx: Context):
        from pipeline.runtime import tensorrt_engine
        from pipeline.runtime.runners import TensorrtRunner

        engine_bytes, sidecar = tensorrt_engine.load_engine_bytes(ctx.run_dir, engine=engine)
        source = ctx.run_dir.file(sidecar.get("onnx") or tensorrt_engine.target_of(engine).onnx)
        if source.exists() and sidecar.get("onnx_sha256") != sha256_file(source):
            raise InputError(f"{engine} was built from another {sidecar.get('onnx')}; re-run build")
        env.expose_libcudart()  # before Polygraphy's CUDA wrapper looks for it
        return TensorrtRunner(engine_bytes, sidecar, name=name, input_name=ctx.spec["input_name"],
                              output_name=ctx.spec["output_name"], cuda_graphs=ctx.cfg.benchmark.cuda_graphs)

    return make


def _openvino(precision: str) -> Callable[[Context], object]:
    def make(ctx: Context):
        from pipeline.runtime import openvino_ir
        from pipeline.runtime.runners import OpenVINORunner

        xml, weights, sidecar = openvino_ir.load(ctx.run_dir, precision)  # refused here, before OpenVINO reads it
        return OpenVINORunner(xml, weights, sidecar, name=f"openvino_{precision}", input_name=ctx.spec["input_name"],
                              output_name=ctx.spec["output_name"], threads=ctx.threads)

    return make


# --------------------------------------------------------------------------- the table

ORT = "ONNX Runtime"
OV = "OpenVINO"
DEPLOYED = ": the deployment runtime itself on this CPU, measured, not an emulation"

# Verify checks candidates in this order; benchmark times them in benchmark.backends' order.
TABLE: list[Backend] = [
    Backend("torch_fp32", precision="fp32", device="auto", artifact=None, label="PyTorch FP32 (eval mode)",
            unavailable=_always, make=_torch("torch_fp32")),
    Backend("torch_autocast", precision="mixed", device="auto", artifact=None,
            label="PyTorch autocast (bf16 on the CPU, fp16 on CUDA)", unavailable=_always,
            make=_torch("torch_autocast", autocast=True)),
    Backend("torch_compile", precision="fp32", device="auto", artifact=None, label="torch.compile, FP32",
            unavailable=_always, make=_torch("torch_compile", compile=True), benchmark="opt-in"),
    Backend("onnxrt_fp32", precision="fp32", device="cpu", artifact=FP32_ONNX, label="ONNX Runtime CPU, model.onnx",
            unavailable=_always, make=_ort("onnxrt_fp32", fp16_graph=False), candidate="onnxrt_fp32",
            note="ONNX Runtime CPU", runtime=ORT),
    Backend("fp16_emulation", precision="fp16", device="cpu", artifact=FP16_ONNX, label=_emulation_label,
            unavailable=_needs_fp16, make=_emulation, candidate="fp16_emulation", benchmark="no",
            runtime="FP16 emulation"),
    Backend("onnxrt_fp16", precision="fp16", device="cpu", artifact=FP16_ONNX,
            label="ONNX Runtime CPU on model.fp16.onnx (a CPU deployment; computes FP16 regions in FP32)",
            unavailable=_needs_fp16, make=_ort("onnxrt_fp16_cpu", fp16_graph=True), candidate="onnxrt_fp16_cpu",
            shown_precision="fp16 graph", note="ONNX Runtime CPU runs most FP16 nodes through FP32 kernels",
            runtime=ORT, gates=False),
    Backend("int8_exact", precision="int8", device="cpu", artifact=INT8_ONNX,
            label="INT8 Q/DQ graph executed exactly (ONNX Runtime, optimisations off: every Q/DQ as written, FP16 "
                  "regions rounded as the FP16 emulation does), model.int8.onnx",
            unavailable=_needs_int8, make=_int8_exact, candidate="int8_exact", benchmark="no", runtime=ORT),
    Backend("onnxrt_int8_cpu", precision="int8", device="cpu", artifact=INT8_ONNX,
            label="ONNX Runtime CPU int8 kernels on model.int8.onnx (a CPU deployment; fuses Q/DQ into int8 ops)",
            unavailable=_ort_int8_unavailable, make=_ort_int8, candidate="onnxrt_int8_cpu",
            shown_precision="int8 (Q/DQ graph)", note="ONNX Runtime CPU int8 kernels", runtime=ORT, gates=False),
    Backend("tensorrt_fp16", precision="fp16", device="cuda", artifact=ENGINE,
            label="TensorRT engine (strongly typed from model.fp16.onnx)", unavailable=_tensorrt_unavailable(ENGINE),
            make=_tensorrt(ENGINE, "tensorrt_fp16"), candidate="tensorrt_fp16", requires="tensorrt",
            shown_precision="fp16 (strongly typed engine)", runtime="TensorRT", required_if=_engine_wanted("fp16")),
    Backend("tensorrt_int8", precision="int8", device="cuda", artifact=INT8_ENGINE,
            label="TensorRT engine (strongly typed from model.int8.onnx: explicit Q/DQ, other regions FP16)",
            unavailable=_tensorrt_unavailable(INT8_ENGINE), make=_tensorrt(INT8_ENGINE, "tensorrt_int8"),
            candidate="tensorrt_int8", requires="tensorrt", shown_precision="int8 (strongly typed Q/DQ engine)",
            runtime="TensorRT", required_if=_engine_wanted("int8")),
    Backend("onnxrt_cuda_fp32", precision="fp32", device="cuda", artifact=FP32_ONNX,
            label="ONNX Runtime CUDA provider on model.onnx", unavailable=_cuda_ort(False),
            make=_ort("onnxrt_cuda_fp32", fp16_graph=False, cuda=True), note="ONNX Runtime CUDA", runtime=ORT),
    Backend("onnxrt_cuda_fp16", precision="fp16", device="cuda", artifact=FP16_ONNX,
            label="ONNX Runtime CUDA provider on model.fp16.onnx", unavailable=_cuda_ort(True),
            make=_ort("onnxrt_cuda_fp16", fp16_graph=True, cuda=True), candidate="onnxrt_cuda_fp16", requires="cuda",
            shown_precision="fp16 graph", note="ONNX Runtime CUDA", runtime=ORT),
    Backend("openvino_fp32", precision="fp32", device="cpu", artifact=xml_name("fp32"),
            label="OpenVINO CPU, openvino/fp32.xml (IR of model.onnx), INFERENCE_PRECISION_HINT=f32" + DEPLOYED,
            unavailable=_openvino_unavailable("fp32"), make=_openvino("fp32"), candidate="openvino_fp32",
            note="OpenVINO CPU", runtime=OV),
    Backend("openvino_bf16", precision="bf16", device="cpu", artifact=xml_name("bf16"),
            label="OpenVINO CPU, openvino/bf16.xml (IR of model.onnx), INFERENCE_PRECISION_HINT=bf16" + DEPLOYED,
            unavailable=_openvino_unavailable("bf16"), make=_openvino("bf16"), candidate="openvino_bf16",
            note="OpenVINO CPU, bf16", runtime=OV),
    Backend("openvino_int8", precision="int8", device="cpu", artifact=xml_name("int8"),
            label="OpenVINO CPU, openvino/int8.xml (IR of the Q/DQ model.int8.onnx), int8 kernels" + DEPLOYED,
            unavailable=_openvino_unavailable("int8"), make=_openvino("int8"), candidate="openvino_int8",
            note="OpenVINO CPU, int8", runtime=OV),
]


def by_name(name: str) -> Backend:
    for backend in TABLE:
        if backend.name == name:
            return backend
    raise KeyError(f"no backend {name!r} in pipeline.runtime.backends.TABLE")


def candidates() -> list[Backend]:
    """The entries verify checks, in table order."""
    return [b for b in TABLE if b.candidate]


def label(backend: Backend, cfg) -> str:
    """The report label; the FP16 emulation's depends on ``verify.emulation``."""
    return backend.label(cfg) if callable(backend.label) else backend.label


def verified_by(backend: Backend) -> str | None:
    """The verify candidate that vouches for a benchmarked backend ("reference" for the FP32 model itself)."""
    if backend.name == REFERENCE:
        return "reference"
    return backend.candidate
