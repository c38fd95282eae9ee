"""The precision plugs: everything that differs between the lower precisions a graph can carry, in one place each.

A plug says, for its precision, how the low graph is made (``write``: AutoCast or ModelOpt PTQ, calibrated on real
images, the fallback's raises kept higher), how its nodes are read (``node_precisions``) and summarised
(``fraction``), which faithful execution judges it on a CPU (``faithful``: the emulation that rounds every low
tensor, or the Q/DQ graph executed exactly), which units tune raises and how a mix is cut from the all-low graph
(``is_unit``, ``mix``), its ladder (``int8 < fp16 < fp32``; ``bf16 < fp32``), and which fallback file keeps the
choice (``fallback_payload``). Its files, config sections and gate are named by its ``name``: ``model.<name>.onnx``,
``export.<name>``, ``verify.<name>``, ``build.precisions``, ``tune --precision``.

The gate, the localiser, the fallback loop, tune's sensitivity and search, build, verify and the reports read these
fields and never compare a precision's name (``tests/test_architecture.py`` checks it). FP16 and BF16 are the same
kind of plug (:class:`FloatPrecision`: a float type, AutoCast, rounding), with other data; INT8 is the other kind
(:class:`QuantizedPrecision`: Q/DQ layers, calibration methods). A new precision is an instance here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import onnx

from pipeline.core import artifacts, precision_config
from pipeline.precision import PRECISIONS, convert, fp16, int8, sensitivity
from pipeline.precision.fallback import FloatFallbackFile, Int8FallbackFile, Raised

if TYPE_CHECKING:  # annotations only
    from pipeline.core.config_schema import Config
    from pipeline.core.model_card import ModelCard


@dataclass(frozen=True)
class Precision:
    """What a lower precision is, as the rest of the pipeline sees it."""

    name: str  # "fp16", "bf16", "int8": its files, config sections, build.precisions and tune --precision entry
    label: str  # "FP16": how the reports name it
    ladder: tuple[str, ...]  # its node precisions, lowest first, ending in "fp32": the fallback raises one step
    faithful: str  # the candidate that executes its decisions faithfully on any CPU (the fallback's re-check, tune's)
    raised_to: str  # what tune and the fallback do to a unit they raise ("kept in FP32", "out of INT8")
    offer: str = "move the offending nodes to FP32"  # what verify's failure line offers `--auto-fallback` to do
    divergent: str = "first node"  # how the failure line names the node localisation found
    reads_fp32_from: tuple[str, ...] = ()  # other plugs whose fallback files' FP32 nodes it keeps in FP32 too
    cpu_target: bool = False  # tune can time its mixes on the CPU (OpenVINO's int8 kernels); else on a GPU only
    dot_product_note: str = ""  # said where the CPU lacks the units its CPU kernels need (tune's speed gate)
    trainable: bool = False  # quantization-aware fine-tuning can make its graph (the qat stage, tune's third rung)

    @property
    def graph(self) -> str:
        return artifacts.graph_file(self.name)

    @property
    def engine(self) -> str:
        return artifacts.engine_file(self.name)

    @property
    def fallback_file(self) -> str:
        return artifacts.fallback_file(self.name)

    @property
    def candidate_file(self) -> str:
        return artifacts.fallback_candidate_file(self.name)

    def enabled(self, cfg: Config) -> bool:
        return precision_config.export_section(cfg, self.name).enabled

    def node_precisions(self, fp32_model: onnx.ModelProto, model: onnx.ModelProto) -> dict:
        raise NotImplementedError

    def fraction(self, precisions: dict) -> float:
        """The share of the graph computed in this precision (its report's ``<name>_fraction``)."""
        raise NotImplementedError

    def faithful_model(self, model: onnx.ModelProto) -> onnx.ModelProto:
        """The graph ONNX Runtime runs to execute ``model``'s precision decisions faithfully."""
        raise NotImplementedError

    faithful_optimized: bool = True  # whether ONNX Runtime may optimise the faithful graph
    strict_reference: bool = False  # verify.emulation=strict runs ONNX's reference evaluator in the low type itself
    # Localisation names the first node over tolerance that computes below FP32, on the faithful execution only
    # (a Q/DQ graph: the quantized node, which an engine fuses away); else the first node over it, on the engine
    # itself where the failing candidate is one.
    exact_localization: bool = False

    def methods(self, cfg: Config) -> list[str]:
        """The ways tune makes the all-low graph (calibration methods; AutoCast's one)."""
        raise NotImplementedError

    def write(self, cfg: Config, run_dir, card: ModelCard, raised: Raised, out_name: str | None = None,
              method: str | None = None) -> dict:
        """Export's conversion of ``model.onnx`` into ``out_name`` (default: the run's graph) with ``raised`` kept
        higher; returns its precision report."""
        raise NotImplementedError

    def is_unit(self, node: onnx.NodeProto) -> bool:
        """Whether tune ranks and raises this node (given that it computes in this precision)."""
        raise NotImplementedError

    def mix(self, all_low: onnx.ModelProto, fp32_model: onnx.ModelProto, high, fp32=()) -> onnx.ModelProto:
        """The all-low graph with the units ``high`` raised one step and ``fp32`` kept in FP32 (no re-calibration)."""
        raise NotImplementedError

    def tune_raises(self, raised: Raised) -> tuple[list[str], list[str]]:
        """The fallback's raises as tune's (units raised, nodes kept in FP32)."""
        raise NotImplementedError

    def as_raised(self, high, fp32=()) -> Raised:
        """tune's (units raised, nodes kept in FP32) as the fallback's raises: the inverse of :meth:`tune_raises`."""
        raise NotImplementedError

    def fallback_payload(self, raised: Raised, method: str | None, note: str) -> dict:
        """The fallback file's content (its schema: :attr:`fallback_schema`), with tune's calibration method."""
        raise NotImplementedError

    def raised_from(self, payload) -> Raised:
        """A fallback file's content (its schema model) as the raises it keeps."""
        raise NotImplementedError


@dataclass(frozen=True)
class FloatPrecision(Precision):
    """A low float type (FP16, BF16): ModelOpt AutoCast converts the graph, the emulation rounds every tensor of that
    type, a raised node computes in FP32."""

    opset: int | None = None  # AutoCast's target opset (None: its default for the type)
    strict_reference: bool = True

    def node_precisions(self, fp32_model, model):
        return fp16.node_precisions(fp32_model, model)

    def fraction(self, precisions: dict) -> float:
        return fp16.share(precisions, self.name)

    def faithful_model(self, model):
        return fp16.emulation_model(model)

    def methods(self, cfg: Config) -> list[str]:
        return ["autocast"]  # AutoCast's range rule is the export's, not a searched choice

    def write(self, cfg: Config, run_dir, card, raised, out_name=None, method=None) -> dict:
        return convert.convert_float(cfg, run_dir, card, self, raised.fp32, out_name or self.graph)

    def is_unit(self, node) -> bool:
        return node.op_type not in sensitivity.ROUNDING_FREE  # a fault can sit in an Add as well as in a layer

    def mix(self, all_low, fp32_model, high, fp32=()):
        raised = list(dict.fromkeys([*high, *fp32]))
        return fp16.keep_in_fp32(all_low, raised, fp32_model) if raised else all_low

    fallback_schema: type = FloatFallbackFile

    def tune_raises(self, raised):
        return raised.fp32, []  # a float graph has one step: what the fallback kept in FP32 is what it raised

    def as_raised(self, high, fp32=()):
        return Raised(fp32=list(dict.fromkeys([*high, *fp32])))

    def fallback_payload(self, raised, method, note):
        return {"nodes": list(raised.fp32), "note": note}

    def raised_from(self, payload):
        return Raised(fp32=list(dict.fromkeys(payload.nodes)))


@dataclass(frozen=True)
class QuantizedPrecision(Precision):
    """Explicit Q/DQ layers (INT8): ModelOpt PTQ quantizes the matrix layers, the graph is executed exactly as
    written, a raised layer reads unquantized inputs (into the FP16 regions ModelOpt leaves), and one step further a
    node computes in FP32."""

    faithful_optimized: bool = False  # no Q/DQ fusion: every Q and DQ as written
    exact_localization: bool = True

    def node_precisions(self, fp32_model, model):
        return int8.node_precisions(fp32_model, model)

    def fraction(self, precisions: dict) -> float:
        return int8.int8_fraction(precisions)

    def faithful_model(self, model):
        return int8.exact_model(model)

    def methods(self, cfg: Config) -> list[str]:
        return list(cfg.tune.calibration_methods)

    def write(self, cfg: Config, run_dir, card, raised, out_name=None, method=None) -> dict:
        return convert.quantize_int8(cfg, run_dir, card, raised.out_of_low, self, out_name=out_name or self.graph,
                                     fp32_nodes=raised.fp32, calibration_method=method)

    def is_unit(self, node) -> bool:
        return node.op_type in int8.MATRIX_OPS  # the only ops ModelOpt quantizes

    def mix(self, all_low, fp32_model, high, fp32=()):
        model = sensitivity.unquantize(all_low, fp32_model, high)
        return fp16.keep_in_fp32(model, list(fp32), fp32_model) if fp32 else model

    fallback_schema: type = Int8FallbackFile

    def tune_raises(self, raised):
        return raised.out_of_low, raised.fp32

    def as_raised(self, high, fp32=()):
        return Raised(out_of_low=list(high), fp32=list(fp32))

    def fallback_payload(self, raised, method, note):
        return {"nodes": list(raised.out_of_low), "fp32_nodes": list(raised.fp32),
                **({"calibration_method": method} if method else {}), "note": note}

    def raised_from(self, payload):
        return Raised(out_of_low=list(dict.fromkeys(payload.nodes)), fp32=list(dict.fromkeys(payload.fp32_nodes)))


FP16 = FloatPrecision("fp16", "FP16", ("fp16", "fp32"), "fp16_emulation", "kept in FP32")
# BF16 keeps FP32's exponent range (nothing overflows that FP32 holds) and 8 bits of mantissa (FP16: 11). AutoCast's
# BF16 needs opset 22: before it, Conv, Gemm, pooling and most elementwise ops do not take bfloat16 at all.
# Its strict mode is the rounding emulation too: ONNX's reference evaluator would accumulate every dot product in
# BF16 (8 bits), which no BF16 unit does (tensor cores and AMX accumulate in FP32): measured on the overflow model,
# a scaled error of 1.9 where the rounding emulation, and so the hardware's arithmetic, gives 0.014.
BF16 = FloatPrecision("bf16", "BF16", ("bf16", "fp32"), "bf16_emulation", "kept in FP32", opset=22,
                      strict_reference=False)
INT8 = QuantizedPrecision(
    "int8", "INT8", ("int8", "fp16", "fp32"), "int8_exact", "out of INT8",
    offer="leave the offending layers unquantized", divergent="first quantized node", reads_fp32_from=("fp16",),
    cpu_target=True, dot_product_note="this CPU has no VNNI/AMX int8 dot product", trainable=True)

PLUGS: dict[str, Precision] = {p.name: p for p in (FP16, BF16, INT8)}
assert tuple(PLUGS) == PRECISIONS, "pipeline/precision/__init__.py names every plug, in this order"
# The order export writes them and verify judges them in: a float graph's FP32 nodes carry over to INT8's regions.
ORDER = (FP16, BF16, INT8)
FLOATS = tuple(p for p in ORDER if isinstance(p, FloatPrecision))  # their conversion reports read alike


def by_name(name: str) -> Precision:
    """The plug of ``name``; a ValueError naming the known ones for any other."""
    if name not in PLUGS:
        raise ValueError(f"no precision {name!r}: the precisions are {', '.join(PLUGS)}")
    return PLUGS[name]
