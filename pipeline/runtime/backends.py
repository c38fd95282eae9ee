"""The one table of backends that verify checks and benchmark times, in the style of Polygraphy's runners.

Each :class:`Backend` names a runtime x precision x device x artifact, says why it cannot run
here (``unavailable(ctx)``: "" when it can), and makes a runner (``make(ctx)``) that follows
:mod:`pipeline.runtime.runners`' contract: a context manager with ``infer(feed) -> outputs`` plus the
timing hook ``timers(feed)``. verify checks every entry with a ``verify_name`` against the
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
from typing import TYPE_CHECKING, Callable

from pipeline.core import env, precision_config
from pipeline.core.artifacts import FP32_ONNX, engine_file, graph_file, xml_name
from pipeline.core.errors import InputError
from pipeline.core.precisions import PRECISIONS
from pipeline.core.run import RunDir, sha256_file

if TYPE_CHECKING:  # only for the annotations: this module imports nothing heavy
    import onnx
    import torch

    from pipeline.core.config_schema import Config
    from pipeline.core.model_card import CardSpec

log = logging.getLogger("pipeline")

REFERENCE = "torch_fp32"


def disabled(precision: str) -> str:
    """Why a precision's candidates do not run when the config writes no graph of it."""
    return f"no {graph_file(precision)} (export.{precision}.enabled is false)"


@dataclass
class Context:
    """What the runners of one stage may need; built once by verify or benchmark."""

    cfg: Config  # the validated config (pipeline.config.resolve; in a child process, the same keys as attributes)
    run_dir: RunDir
    stage: str  # "verify" or "benchmark", for messages
    spec: CardSpec  # the model card's spec: input/output names, input size (in a child, its fields as attributes)
    model: torch.nn.Module | None = None  # the trained FP32 model (verify's reference; the torch backends)
    threads: int | None = None  # ONNX Runtime intra-op threads; None: its defaults (verify)
    gpu: bool = False  # whether "auto" backends run on CUDA (benchmark on a GPU machine)
    isolate: bool = True  # native runtimes in a child process (False: in this process, as the child itself does)
    # A lower-precision graph under test, by precision (verify's fallback candidates, tune's mixes); else the run's.
    under_test: dict[str, onnx.ModelProto] = field(default_factory=dict, repr=False)
    _loaded: dict = field(default_factory=dict, repr=False, compare=False)

    def graph(self, precision: str):
        """``model.<precision>.onnx`` (or the graph under test), loaded and checked once; None without one."""
        if precision in self.under_test:
            return self.under_test[precision]
        if precision not in self._loaded:
            from pipeline.core import onnx_io

            path = self.run_dir.file(graph_file(precision))
            self._loaded[precision] = onnx_io.load(path, f"{precision.upper()} ONNX model") if path.exists() else None
        return self._loaded[precision]

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
    label: str | Callable[[Config], str]  # one line for the reports (or a function of the config)
    unavailable: Callable[[Context], str]  # why it cannot run here; "" when it can
    make: Callable[[Context], object]  # its runner (see pipeline.runtime.runners)
    verify_name: str | None = None  # verify checks it under this name (verify.candidates.<name>); None: it does not
    benchmark: str = "default"  # "default": in benchmark.backends' default; "opt-in": timed when named; "no"
    requires: str | None = None  # the `require` entry that makes its absence an error ("tensorrt", "cuda")
    shown_precision: str = ""  # benchmark.json's precision column, when more telling than ``precision``
    note: str = ""  # benchmark.json's note
    runtime: str = "PyTorch"  # the library that runs it, as crash messages name it
    required_if: Callable[[Config], bool] | None = None  # whether the config asks for it at all (None: always)
    graph: str | None = None  # the precision whose graph it runs (the file, or an engine or IR made from it)
    deploys: bool = True  # a deployment (benchmark may name it the fastest); False: an emulation, timed for its cost
    # Whether its verdict decides verify's exit code under verify.gate=auto: a deployment target (an engine, an
    # OpenVINO IR, the FP32 export) or the faithful CPU proxy of one (the FP16 emulation, the exact Q/DQ run).
    # False only for what is neither, which is then run and reported only.
    gates: bool = True
    # Whether it claims to compute in its lower precision (verify's precision manifest holds it to that); False
    # only where its label already says it does not (ONNX Runtime's CPU provider runs FP16 regions in FP32).
    claims_precision: bool = True
    # How a Triton server runs its artifact ("tensorrt_plan", "onnxruntime", "openvino"; docs/deploy.md): deploy's
    # formats come from here, so a new deployment backend needs no second table. None: no Triton backend runs it.
    triton: str | None = None
    # Whether its verdict is the FP32 export's own check (the exported graph run as written): when it fails, the
    # export is broken, and verify runs no precision gate (localisation and fallback compare against that graph).
    checks_export: bool = False
    # What verify says when it fails where no fallback file can help (a runtime hint, not the graph, sets its
    # kernels' precision); "" where the precision's fallback applies.
    no_fallback_hint: str = ""

    @property
    def claims(self) -> str | None:
        """The lower precision it claims to compute in; None for FP32 (and "mixed", PyTorch's autocast)."""
        return self.precision if self.claims_precision and self.precision in PRECISIONS else None

    @property
    def isolated(self) -> bool:
        """Whether its runner runs in a child process: every native runtime (a crash there must not kill the stage)."""
        return self.runtime != "PyTorch"

    def on(self, ctx: Context) -> str:
        return ("cuda" if ctx.gpu else "cpu") if self.device == "auto" else self.device

    def required(self, cfg: Config) -> bool:
        """Its absence is exit 3: ``require`` names its runtime and the config asks for it (an engine
        precision left out of ``build.precisions`` or whose export is off is skipped, never required)."""
        wanted = self.required_if is None or self.required_if(cfg)
        return self.requires is not None and self.requires in cfg.require and wanted



# --------------------------------------------------------------------------- availability


def _always(ctx: Context) -> str:
    return ""


def _needs(precision: str) -> Callable[[Context], str]:
    """"" with the precision's graph; the reason without one: disabled by the config, or the reason export recorded
    for skipping it (no ModelOpt). Otherwise a missing ``model.<precision>.onnx`` is an :class:`InputError` ("run
    export first"): skipping its candidates would pass a gate that checked nothing."""
    def check(ctx: Context) -> str:
        if ctx.graph(precision) is not None:
            return ""
        if not precision_config.export_section(ctx.cfg, precision).enabled:
            return disabled(precision)
        skipped = ctx.run_dir.export_skipped(precision)
        if skipped:
            return f"no {graph_file(precision)}: export skipped {precision.upper()} ({skipped})"
        ctx.run_dir.require(graph_file(precision), "export", ctx.stage)  # raises: the file is missing
        return disabled(precision)

    return check


def no_int8_dot_product(runtime: str) -> str:
    """Why a CPU runtime's int8 kernels are not judged on a CPU without VNNI/AMX: their u8s8 dot products sum in
    16 bits and can saturate (ONNX Runtime's quantization notes; OpenVINO with oneDNN limited to AVX2 moved
    a tiny model's logits 0.40 where the exact Q/DQ execution moved them 0.017)."""
    return (f"this CPU has no VNNI or AMX int8 units: {runtime}'s int8 kernels can saturate on it, so they would "
            "not compute model.int8.onnx's arithmetic; int8_exact still checks the INT8 decisions here")


def _ort_int8_unavailable(ctx: Context) -> str:
    return _needs("int8")(ctx) or ("" if env.cpu_has_int8_dot_product() else no_int8_dot_product(ORT))


def _cuda_ort(precision: str | None) -> Callable[[Context], str]:
    def check(ctx: Context) -> str:
        missing = _needs(precision)(ctx) if precision else ""
        if missing:
            return missing
        ok, reason = env.cuda_status()
        if not ok:
            return reason
        import onnxruntime

        if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
            return "this ONNX Runtime build has no CUDA provider (install onnxruntime-gpu)"
        return ""

    return check


def _tensorrt_unavailable(precision: str) -> Callable[[Context], str]:
    engine = engine_file(precision)

    def check(ctx: Context) -> str:
        """Cheap checks only: the engine itself is loaded (and checked) when the runner is made."""
        from pipeline.runtime.builders import tensorrt_engine

        if not precision_config.export_section(ctx.cfg, precision).enabled:
            return disabled(precision)  # its graph off: "disabled" everywhere, whatever this machine has
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


def _openvino_unavailable(ir: str, *needs: Callable[[Context], str]) -> Callable[[Context], str]:
    """OpenVINO installed, then each of ``needs`` (bf16 units; the Q/DQ graph and int8 units), then the IR
    ``openvino/<ir>.xml``. Cheap checks only: the IR itself is checked (and loaded) when the runner is made."""
    def check(ctx: Context) -> str:
        from pipeline.runtime.builders import openvino_ir

        ov, reason = openvino_ir.status()
        if ov is None:
            return reason
        return next((why for need in needs if (why := need(ctx))), "") or _no_ir(ctx, ir)

    return check


def _bf16_units(ctx: Context) -> str:
    from pipeline.runtime.builders import openvino_ir

    return openvino_ir.bf16_reason()


def _int8_units(runtime: str) -> Callable[[Context], str]:
    def check(ctx: Context) -> str:
        return "" if env.cpu_has_int8_dot_product() else no_int8_dot_product(runtime)

    return check


def _no_ir(ctx: Context, precision: str) -> str:
    """Without the IR: "run build first" where the build stage recorded it, else the reason (build has not run)."""
    from pipeline.runtime.builders import openvino_ir

    name = xml_name(precision)
    if ctx.run_dir.file(name).is_file():
        return ""
    error = openvino_ir.build_error(ctx.run_dir, precision)
    if error:
        return f"no {name}: {error}"
    if name in ctx.run_dir.recorded_artifacts("build"):
        ctx.run_dir.require(name, "build", ctx.stage)  # raises: build wrote it, and it is gone
    return f"no {name}: the build stage has not written it (run `python -m pipeline build`)"


# --------------------------------------------------------------------------- runners


def _torch(name: str, *, autocast: bool = False, compile: bool = False) -> Callable[[Context], object]:
    def make(ctx: Context):
        import torch

        from pipeline.runtime.runners import TorchRunner

        device = "cuda" if ctx.gpu else "cpu"
        dtype = (torch.float16 if device == "cuda" else torch.bfloat16) if autocast else None
        runner = TorchRunner(ctx.model, name=name, input_name=ctx.spec.input_name,
                             output_name=ctx.spec.output_name,
                             input_shape=tuple(ctx.spec.input_size), device=device, autocast_dtype=dtype,
                             channels_last=ctx.cfg.train.channels_last, compile=compile,
                             cuda_graphs=ctx.cfg.benchmark.cuda_graphs, tf32=ctx.cfg.build.tf32)
        if autocast and device == "cpu" and not env.cpu_has_native_bf16():
            runner.note = "this CPU has no bf16 matrix units: bf16 is emulated and slow"
        return runner

    return make


def _torch_fp32_label(cfg: Config) -> str:
    from pipeline.runtime.runners import tf32_words

    return f"PyTorch FP32 (eval mode; on CUDA {tf32_words(cfg.build.tf32)})"


def _ort(name: str, *, precision: str | None, cuda: bool = False) -> Callable[[Context], object]:
    """ONNX Runtime on ``model.onnx`` (``precision`` None) or on the precision's graph; on the CPU provider without
    the optimizers that break that graph (``runners.CPU_DISABLED_OPTIMIZERS``)."""
    def make(ctx: Context):
        from pipeline.runtime.runners import CPU_DISABLED_OPTIMIZERS, onnxrt_runner

        source = ctx.graph(precision).SerializeToString() if precision else ctx.fp32_path()
        disabled = () if cuda else CPU_DISABLED_OPTIMIZERS.get(precision, ())
        return onnxrt_runner(source, name=name, providers=["cuda"] if cuda else ["cpu"], threads=ctx.threads,
                             disabled_optimizers=disabled)

    return make


def _faithful(precision: str) -> Callable[[Context], object]:
    """The precision's faithful execution (its plug's: the emulation, or the Q/DQ graph executed exactly)."""
    def make(ctx: Context):
        from pipeline.precision import plugs
        from pipeline.runtime.runners import faithful_runner

        plug = plugs.by_name(precision)
        return faithful_runner(plug, ctx.graph(precision), ctx.cfg.verify.emulation)

    return make


def _emulation_label(precision: str) -> Callable[[Config], str]:
    def label(cfg: Config) -> str:
        mode = cfg.verify.emulation
        how = (f"every {precision.upper()} tensor rounded, FP32 accumulation" if mode == "fast" else
               "NumPy reference evaluator in the low type")
        return f"{precision.upper()} emulation ({mode}: {how}), {graph_file(precision)}"

    return label


def _engine_wanted(precision: str) -> Callable[[Config], bool]:
    """Whether the config asks build for this precision's engine (its graph must be written by export too)."""
    def wanted(cfg: Config) -> bool:
        return precision in cfg.build.precisions and precision_config.export_section(cfg, precision).enabled

    return wanted


def _tensorrt(precision: str, name: str) -> Callable[[Context], object]:
    engine = engine_file(precision)

    def make(ctx: Context):
        from pipeline.runtime.builders import tensorrt_engine
        from pipeline.runtime.runners import TensorrtRunner

        engine_bytes, sidecar = tensorrt_engine.load_engine_bytes(ctx.run_dir, engine=engine)
        source = ctx.run_dir.file(sidecar.onnx or tensorrt_engine.target_of(engine).onnx)
        if source.exists() and sidecar.onnx_sha256 != sha256_file(source):
            raise InputError(f"{engine} was built from another {sidecar.onnx}; re-run build")
        env.expose_libcudart()  # before Polygraphy's CUDA wrapper looks for it
        if sidecar.profile is None:
            raise InputError(f"{engine}'s sidecar records no optimization profile; re-run build")
        return TensorrtRunner(engine_bytes, sidecar.profile, note=sidecar.precision_label or "", name=name,
                              input_name=ctx.spec.input_name,
                              output_name=ctx.spec.output_name, cuda_graphs=ctx.cfg.benchmark.cuda_graphs,
                              onnx_path=source)

    return make


def _openvino(precision: str) -> Callable[[Context], object]:
    def make(ctx: Context):
        from pipeline.runtime.builders import openvino_ir
        from pipeline.runtime.runners import OpenVINORunner

        xml, weights, sidecar = openvino_ir.load(ctx.run_dir, precision)  # refused here, before OpenVINO reads it
        return OpenVINORunner(xml, weights, sidecar, name=f"openvino_{precision}", input_name=ctx.spec.input_name,
                              output_name=ctx.spec.output_name, threads=ctx.threads)

    return make


# --------------------------------------------------------------------------- the table

ORT = "ONNX Runtime"
OV = "OpenVINO"
DEPLOYED = ": the deployment runtime itself on this CPU, measured, not an emulation"

# Verify checks candidates in this order; benchmark times them in benchmark.backends' order.
TABLE: list[Backend] = [
    Backend("torch_fp32", precision="fp32", device="auto", artifact=None, label=_torch_fp32_label,
            unavailable=_always, make=_torch("torch_fp32")),
    Backend("torch_autocast", precision="mixed", device="auto", artifact=None,
            label="PyTorch autocast (bf16 on the CPU, fp16 on CUDA)", unavailable=_always,
            make=_torch("torch_autocast", autocast=True)),
    Backend("torch_compile", precision="fp32", device="auto", artifact=None, label="torch.compile, FP32",
            unavailable=_always, make=_torch("torch_compile", compile=True), benchmark="opt-in"),
    Backend("onnxrt_fp32", precision="fp32", device="cpu", artifact=FP32_ONNX, label="ONNX Runtime CPU, model.onnx",
            unavailable=_always, make=_ort("onnxrt_fp32", precision=None), verify_name="onnxrt_fp32",
            note="ONNX Runtime CPU", runtime=ORT, triton="onnxruntime", checks_export=True),
    Backend("fp16_emulation", precision="fp16", device="cpu", artifact=graph_file("fp16"),
            label=_emulation_label("fp16"), unavailable=_needs("fp16"), make=_faithful("fp16"),
            verify_name="fp16_emulation", benchmark="no", runtime="FP16 emulation", graph="fp16", deploys=False),
    Backend("onnxrt_fp16_cpu", precision="fp16", device="cpu", artifact=graph_file("fp16"),
            label="ONNX Runtime CPU on model.fp16.onnx (a CPU deployment; computes FP16 regions in FP32)",
            unavailable=_needs("fp16"), make=_ort("onnxrt_fp16_cpu", precision="fp16"),
            verify_name="onnxrt_fp16_cpu", shown_precision="fp16 graph",
            note="ONNX Runtime CPU runs most FP16 nodes through FP32 kernels", runtime=ORT, gates=False, graph="fp16",
            claims_precision=False, triton="onnxruntime"),
    # ONNX Runtime's CPU provider has no bfloat16 kernels (Conv, Gemm): the BF16 graph runs on a CPU only emulated.
    Backend("bf16_emulation", precision="bf16", device="cpu", artifact=graph_file("bf16"),
            label=_emulation_label("bf16"), unavailable=_needs("bf16"), make=_faithful("bf16"),
            verify_name="bf16_emulation", runtime="BF16 emulation", graph="bf16", deploys=False,
            note="the BF16 graph's arithmetic on FP32 kernels (Cast pairs): a check, not a deployment"),
    Backend("int8_exact", precision="int8", device="cpu", artifact=graph_file("int8"),
            label="INT8 Q/DQ graph executed exactly (ONNX Runtime, optimisations off: every Q/DQ as written, FP16 "
                  "regions rounded as the FP16 emulation does), model.int8.onnx",
            unavailable=_needs("int8"), make=_faithful("int8"), verify_name="int8_exact", benchmark="no", runtime=ORT,
            graph="int8", deploys=False),
    Backend("onnxrt_int8_cpu", precision="int8", device="cpu", artifact=graph_file("int8"),
            label="ONNX Runtime CPU on model.int8.onnx (a CPU deployment: int8 kernels where it fuses the Q/DQ pairs; "
                  "the precision manifest says where it did)",
            unavailable=_ort_int8_unavailable, make=_ort("onnxrt_int8_cpu", precision="int8"),
            verify_name="onnxrt_int8_cpu", shown_precision="int8 (Q/DQ graph)", note="ONNX Runtime CPU int8 kernels",
            runtime=ORT, gates=False, graph="int8", triton="onnxruntime"),
    *(Backend(f"tensorrt_{p}", precision=p, device="cuda", artifact=engine_file(p),
              label=f"TensorRT engine (strongly typed from {graph_file(p)}{how})",
              unavailable=_tensorrt_unavailable(p), make=_tensorrt(p, f"tensorrt_{p}"), verify_name=f"tensorrt_{p}",
              requires="tensorrt", shown_precision=f"{p} (strongly typed{kind} engine)", runtime="TensorRT",
              required_if=_engine_wanted(p), graph=p, triton="tensorrt_plan")
      for p, how, kind in (("fp16", "", ""), ("bf16", "", ""),
                           ("int8", ": explicit Q/DQ, other regions FP16", " Q/DQ"))),
    Backend("onnxrt_cuda_fp32", precision="fp32", device="cuda", artifact=FP32_ONNX,
            label="ONNX Runtime CUDA provider on model.onnx", unavailable=_cuda_ort(None),
            make=_ort("onnxrt_cuda_fp32", precision=None, cuda=True), note="ONNX Runtime CUDA", runtime=ORT),
    Backend("onnxrt_cuda_fp16", precision="fp16", device="cuda", artifact=graph_file("fp16"),
            label="ONNX Runtime CUDA provider on model.fp16.onnx", unavailable=_cuda_ort("fp16"),
            make=_ort("onnxrt_cuda_fp16", precision="fp16", cuda=True), verify_name="onnxrt_cuda_fp16", requires="cuda",
            shown_precision="fp16 graph", note="ONNX Runtime CUDA", runtime=ORT, graph="fp16",
            triton="onnxruntime"),
    Backend("openvino_fp32", precision="fp32", device="cpu", artifact=xml_name("fp32"),
            label="OpenVINO CPU, openvino/fp32.xml (IR of model.onnx), INFERENCE_PRECISION_HINT=f32" + DEPLOYED,
            unavailable=_openvino_unavailable("fp32"), make=_openvino("fp32"), verify_name="openvino_fp32",
            note="OpenVINO CPU", runtime=OV, triton="openvino"),
    # What OpenVINO 2026.4 allows, measured: a node is kept out of BF16 only by the `precise` runtime attribute
    # (ov::DisablePrecisionConversion; Python's RTMap takes only str/int values, so it can be attached only through the
    # IR's XML), and its CPU plugin honours it on some layers (Reduce) but not on MatMul/FullyConnected.
    Backend("openvino_bf16", precision="bf16", device="cpu", artifact=xml_name("bf16"),
            label="OpenVINO CPU, openvino/bf16.xml (IR of model.onnx), INFERENCE_PRECISION_HINT=bf16" + DEPLOYED,
            unavailable=_openvino_unavailable("bf16", _bf16_units), make=_openvino("bf16"),
            verify_name="openvino_bf16", note="OpenVINO CPU, bf16", runtime=OV, triton="openvino", no_fallback_hint=(
                "OpenVINO's BF16 is a whole-model runtime hint: the automatic fallback cannot keep single layers in "
                "f32 there (OpenVINO 2026.4's only per-node mark, the `precise` runtime attribute, is ignored by its "
                "CPU plugin on MatMul/FullyConnected layers); deploy openvino_fp32 (or openvino_int8 where it "
                "passes) for this model, or turn the candidate off with "
                "verify.candidates.openvino_bf16.enabled=false")),
    Backend("openvino_int8", precision="int8", device="cpu", artifact=xml_name("int8"),
            label="OpenVINO CPU, openvino/int8.xml (IR of the Q/DQ model.int8.onnx), int8 kernels" + DEPLOYED,
            unavailable=_openvino_unavailable("int8", _needs("int8"), _int8_units("OpenVINO")),
            make=_openvino("int8"), verify_name="openvino_int8", note="OpenVINO CPU, int8", runtime=OV, graph="int8",
            triton="openvino"),
]
# The old name of onnxrt_fp16_cpu in benchmark.backends: accepted, with a warning (config.BenchmarkConfig).
RENAMED = {"onnxrt_fp16": "onnxrt_fp16_cpu"}


def by_name(name: str) -> Backend:
    for backend in TABLE:
        if backend.name == name:
            return backend
    raise KeyError(f"no backend {name!r} in pipeline.runtime.backends.TABLE")


def default_timed() -> list[str]:
    """The names ``benchmark.backends: null`` starts from (``benchmark="default"``), in table order."""
    return [b.name for b in TABLE if b.benchmark == "default"]


def candidates() -> list[Backend]:
    """The entries verify checks, in table order."""
    return [b for b in TABLE if b.verify_name]


def label(backend: Backend, cfg: Config) -> str:
    """The report label; the FP16 emulation's depends on ``verify.emulation``."""
    return backend.label(cfg) if callable(backend.label) else backend.label


def verified_by(backend: Backend) -> str | None:
    """The verify candidate that vouches for a benchmarked backend ("reference" for the FP32 model itself)."""
    if backend.name == REFERENCE:
        return "reference"
    return backend.verify_name
