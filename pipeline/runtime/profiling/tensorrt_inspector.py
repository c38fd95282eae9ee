"""What TensorRT's engine inspector says each matrix layer ran in: pure functions of its JSON (no TensorRT here).

The JSON of ``IEngineInspector.get_engine_information(LayerInformationFormat.JSON)`` is ``{"Layers": [...]}``; with
``ProfilingVerbosity.DETAILED`` each layer is a record with ``Name``, ``LayerType``, ``Inputs``/``Outputs`` and, from
TensorRT 8.6, ``Metadata``. What a real engine writes there, and what this module does with it (each from a
published dump or NVIDIA's own text):

* a layer's data type is that of the activation it reads (its first input: the INT8 kernel of a Q/DQ convolution
  reads Int8, whatever it writes). TensorRT <= 10 writes ``"Format/Datatype"`` ("Thirty-two wide channel vectorized
  row major Int8 format"; kgen layers "Half"); TensorRT 11's migration page for ``IEngineInspector``
  (docs.nvidia.com/deeplearning/tensorrt/11.0.0/api/migration/tensorrt-10x-to-11x-IEngineInspector.html) announces
  the split of that field, spelled ``"DataType"`` ("Float") and ``"Format"`` ("Row major linear FP32 format
  (kLINEAR)"). The 11.3 and 11.4 overviews no longer mention the split, so both spellings are read: ``DataType``,
  then ``Format/Datatype``, then any key spelled "datatype" in another case, then the words of ``Format``;
* "N/A due to dynamic shapes" is what a layer of a dynamic-shape engine says when the inspector has no execution
  context with every input shape set (``IEngineInspector::setExecutionContext``, ``NvInferRuntime.h``: "Otherwise
  ... format information will not be shown"; a published dump: "Format/Datatype": "N/A due to dynamic shapes"):
  ``unknown``, never a guess;
* layers that compute nothing of the graph are skipped: ``Reformat`` and ``NoOp`` copies ("Reformatting CopyNode
  for Input Tensor 1 to <the layer>", which name the layer they feed and read the other input's type),
  ``Constant``, ``shape_call``, and Myelin's ``signal``/``wait`` (trex skips Constant, NoOp and shape_call the
  same way: ``trex/engine_plan.py``);
* a ``{ForeignNode[first...last]}`` layer (LayerType ``Myelin``) stands for a whole Myelin region: its one input
  type says nothing about each matrix op inside, so it is assigned to none of them (they stay ``unknown`` unless an
  expanded layer names them);
* Myelin's expanded layers are named after the graph with ``.`` written ``_`` and a ``_myl<region>_<n>`` suffix,
  several fused MatMuls joined by ``+`` and fully connected ones prefixed ``fc_``: ``/model_10/m/m_0/attn/
  MatMul_myl109_2`` for the ONNX node ``/model.10/m/m.0/attn/MatMul`` (a YOLO11 engine), ``fc_/model/decoder/
  decoder/layers_0/self_attn/MatMul_1+fc_/model/decoder/decoder/layers_0/self_attn/MatMul_myl71_31`` (RT-DETRv2,
  TensorRT 10.0, NVIDIA/TensorRT#4048), ``matMul1_myl0_0`` with an empty ``Metadata`` (TensorRT's own
  samples/sampleEditableTimingCache/README.md). A layer's ONNX nodes are its ``Metadata``'s "[ONNX Layer: name]"
  entries (NVIDIA/TensorRT#4397, a TensorRT 10 BERT) and the parts of its name, matched exactly or, for a Myelin
  name, after the same rewriting of the graph's names (an ambiguous rewriting matches nothing).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

UNKNOWN = "unknown"

# LayerTypes that compute nothing of the graph (copies, constants, shape calls, Myelin's stream synchronisation)
SKIPPED_TYPES = frozenset({"Reformat", "NoOp", "Constant", "shape_call", "signal", "wait"})
FOREIGN_NODE = re.compile(r"^\{ForeignNode\[.*\]\}$", re.DOTALL)

# TensorRT joins fused layers' names with " + " (vertical fusion) and " || " (horizontal); Metadata names each ONNX
# node as "[ONNX Layer: name]", joined with \x1e; 10.x may put \x1e/\x1f into names too.
_NAME_SEPARATORS = re.compile(r" \+ | \|\| |[\x1e\x1f]")
_ONNX_LAYER = re.compile(r"\[ONNX Layer: ([^\]\x1e]*)\]")
_MYELIN_SUFFIX = re.compile(r"_myl\d+_\d+$")

# The words TensorRT's formats and data types use, e.g. "Thirty-two wide channel vectorized row major Int8 format",
# "Channel major FP16 format where channel % 8 == 0", "Row major linear FP32", kgen's "Int8"/"Half"/"Float", and
# TensorRT 11's "Float" / "Row major linear FP32 format (kLINEAR)" (the vocabulary of trex/activations.py).
_DATA_TYPES = {"INT8": "int8", "FP16": "fp16", "HALF": "fp16", "FP32": "fp32", "FLOAT": "fp32", "BFLOAT16": "bf16",
               "BF16": "bf16", "FP8": "fp8", "FLOAT8E4M3": "fp8", "INT4": "int4", "FP4": "fp4", "FP4E2M1": "fp4",
               "UINT8": "uint8", "INT32": "int32", "INT64": "int64", "BOOL": "bool"}


@dataclass(frozen=True)
class Reading:
    """What the inspector says of each matrix node of the graph: ``precisions[node]`` ("int8", "fp16", ...,
    ``unknown``), in graph order."""

    precisions: dict[str, str]

    @property
    def unknown(self) -> list[str]:
        """The matrix nodes no layer told the precision of."""
        return [name for name, precision in self.precisions.items() if precision == UNKNOWN]


@dataclass(frozen=True)
class InspectedLayer:
    """One layer record of the inspector's JSON, parsed once (:meth:`of`): its ``Name``, ``LayerType``,
    ``Metadata`` (each "" where absent or not text) and the data type of its first input (:func:`tensor_precision`;
    ``unknown`` without inputs)."""

    name: str
    layer_type: str
    metadata: str
    input_precision: str

    @classmethod
    def of(cls, record: dict) -> InspectedLayer:
        inputs = record.get("Inputs")
        first = inputs[0] if isinstance(inputs, list) and inputs and isinstance(inputs[0], dict) else None
        return cls(name=_text(record.get("Name")), layer_type=_text(record.get("LayerType")),
                   metadata=_text(record.get("Metadata")),
                   input_precision=tensor_precision(first) if first is not None else UNKNOWN)


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def layers_of(info: dict) -> list[InspectedLayer]:
    """The layer records of the inspector's JSON, parsed; ValueError when it names the layers only (no data
    types)."""
    layers = info.get("Layers") or []
    if not layers or not all(isinstance(layer, dict) for layer in layers):
        raise ValueError("the engine inspector reports layer names only")
    return [InspectedLayer.of(layer) for layer in layers]


def read(info: dict, node_names: list[str], matrix_nodes: list[str]) -> Reading:
    """The data type each of ``matrix_nodes`` ran in: that of the first computing layer naming it
    (:func:`layer_nodes`), read from the layer's first input (:func:`tensor_precision`)."""
    names = NodeNames.of(node_names)
    executed: dict[str, str] = {}
    for layer in layers_of(info):
        if not computes(layer):
            continue
        for node in layer_nodes(layer, names):
            executed.setdefault(node, layer.input_precision)
    return Reading({node: executed.get(node, UNKNOWN) for node in matrix_nodes})


def computes(layer: InspectedLayer) -> bool:
    """Whether a layer computes graph nodes of its own: not a copy, constant or shape call, not a ForeignNode."""
    return layer.layer_type not in SKIPPED_TYPES and not is_foreign(layer)


def is_foreign(layer: InspectedLayer) -> bool:
    """A Myelin region as one layer: ``{ForeignNode[first...last]}``, LayerType ``Myelin``."""
    return layer.layer_type == "Myelin" or bool(FOREIGN_NODE.match(layer.name))


@dataclass(frozen=True)
class NodeNames:
    """The graph's node names, and Myelin's rewriting of each (``.`` and any other character Myelin drops written
    ``_``) when that rewriting is unique."""

    exact: frozenset[str]
    myelin: dict[str, str]

    @classmethod
    def of(cls, names: list[str]) -> NodeNames:
        rewritten: dict[str, list[str]] = {}
        for name in names:
            rewritten.setdefault(myelin_spelling(name), []).append(name)
        return cls(frozenset(names), {key: found[0] for key, found in rewritten.items() if len(found) == 1})


def myelin_spelling(name: str) -> str:
    return re.sub(r"[^0-9A-Za-z_/]", "_", name)


def layer_nodes(layer: InspectedLayer, names: NodeNames) -> set[str]:
    """The ONNX nodes a layer stands for: its Metadata's "[ONNX Layer: name]" entries and the parts of its name that
    are nodes of the graph, exactly or in Myelin's spelling."""
    found = set(_ONNX_LAYER.findall(layer.metadata))
    for part in _NAME_SEPARATORS.split(layer.name):
        found |= _name_part_nodes(part.strip(), names)
    return found - {""}


def _name_part_nodes(part: str, names: NodeNames) -> set[str]:
    if part in names.exact:
        return {part}
    stripped = _MYELIN_SUFFIX.sub("", part)
    if stripped == part:
        return set()
    pieces = [p.removeprefix("fc_") if p.startswith("fc_/") else p for p in stripped.split("+")]
    return {names.myelin[p] for p in pieces if p in names.myelin}


def tensor_precision(tensor: dict) -> str:
    """The data type of one tensor of a layer (see the module's docstring for the keys read, in this order)."""
    for text in _type_texts(tensor):
        words = [_DATA_TYPES[w] for w in re.findall(r"[A-Z0-9]+", text.upper()) if w in _DATA_TYPES]
        if words:
            return words[0]
    return UNKNOWN


def _type_texts(tensor: dict) -> list[str]:
    spelled = [tensor.get("DataType"), tensor.get("Format/Datatype")]
    spelled += [value for key, value in tensor.items() if key.casefold() == "datatype" and key != "DataType"]
    spelled.append(tensor.get("Format"))
    return [text for text in spelled if isinstance(text, str)]
