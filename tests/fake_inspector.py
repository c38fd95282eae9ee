"""What TensorRT's engine inspector writes for a strongly typed build of an ONNX graph, for the fake engine of
``tests/fake_tensorrt.py``: modelled on real published dumps, not on an ideal one.

The dumps it follows (each shape of record below is one of theirs):

* CNNs, TensorRT 8.x, trex's example plans (NVIDIA/TensorRT ``tools/experimental/trt-engine-explorer/examples/
  pytorch/resnet/A100/{fp16,qat,qat-residual}/*.graph.json`` and ``tests/inputs/mobilenet.qat.onnx.engine.graph.json``,
  removed from the tree in the 11.1 release): Cask layers named after every node they fuse, weights' Q/DQ
  included, joined by " + " ("layer1.0.conv2.weight + QuantizeLinear_32 + Conv_34 + Add_36 + Relu_37"), long
  format strings ("Thirty-two wide channel vectorized row major Int8 format"), a Reformat in front of the first
  layer, ``NoOp`` copies named "Reformatting CopyNode for Input Tensor 0 to <the layer they feed>";
* TensorRT 10 with Myelin, an INT8 BERT (NVIDIA/TensorRT#4397): ``gemm`` layers named after their MatMuls with
  ``.`` written ``_`` and a ``_myl<region>_<n>`` suffix, the Q, K and V projections as one layer joined by ``+``
  ("/encoder/layers_2/mha/attn/mha_prob/key/MatMul+/encoder/layers_2/mha/attn/mha_prob/query/MatMul+/encoder/
  layers_2/mha/attn/value/MatMul_myl0_16"), ``kgen`` layers named ``__myl_<ops>_myl<region>_<n>``, kgen formats
  ("Half"), Metadata "[ONNX Layer: name]" per node; TensorRT's own samples/sampleEditableTimingCache/README.md
  shows the same layers (``matMul1_myl0_0`` gemm, ``__myl_TraMaxSubExpSum_myl0_1`` kgen) with an empty
  ``Metadata`` (``metadata=False``);
* a YOLO11 engine of TensorRT 10 (a published table of its ``best.engine.layers.json``, found through the code
  index without its repository): ``dummy_shape_call__mye4273_0_myl109_0`` (``shape_call``), ``__myl_MovSliSliTra_
  myl109_1`` (kgen), ``/model_10/m/m_0/attn/MatMul_myl109_2`` (gemm), "Reformatting CopyNode for Output Tensor 0 to
  {ForeignNode[/model.10/m/m.0/attn/Split_16.../model.10/m/m.0/attn/Add]}" (Reformat) after the region, and a
  ``NoOp`` "Reformatting CopyNode for Input Tensor 1 to /model.10/m/m.0/attn/proj/conv/Conv + /model.10/m/m.0/Add"
  right before the layer whose residual input it copies;
* a Myelin region as ONE layer, ``{ForeignNode[first...last]}`` of LayerType ``Myelin`` (``myelin="foreign"``):
  the name as TensorRT's build logs print it ("[GpuLayer] MYELIN: {ForeignNode[/Constant_257_output_0 + (Unnamed
  Layer* 2679) [Shuffle].../Transpose_13]}", hmorimitsu/ptlflow#65; "Could not find any implementation for node
  {ForeignNode[...]}"), its Metadata naming every node of the region (an assumption: no published DETAILED dump
  of such a layer was found);
* "N/A due to dynamic shapes" for every tensor when the engine has a dynamic input and the inspector has no
  execution context with every input shape set (a published TensorRT 8 dump; ``NvInferRuntime.h``,
  ``IEngineInspector::setExecutionContext``). Assumed the same for TensorRT 11's two keys;
* TensorRT 11 (``version=11``): ``DataType`` ("Float") and ``Format`` ("Row major linear FP32 format (kLINEAR)")
  instead of ``Format/Datatype``, spelled as the 11.0 migration page for ``IEngineInspector`` spells them.

What it does not model: tactics, timing, TensorRT's real fusion rules (which nodes Myelin takes is a simple rule
here: connected MatMul/Softmax/pointwise/shape nodes around a MatMul), layers of plugins, several profiles.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import onnx

# A Myelin region: the connected nodes of these types around a MatMul (Q/DQ pairs fuse into its layers).
MYELIN_OPS = {"MatMul", "Softmax", "Transpose", "Reshape", "Mul", "Div", "Add", "Sub", "Cast", "Split", "Slice",
              "LayerNormalization", "Erf", "Sqrt", "Pow", "ReduceMean"}
QDQ = ("QuantizeLinear", "DequantizeLinear")
# How kgen names spell the ops they fused ("__myl_MulMaxSubExpSum", "__myl_MovSliSliTra", "__myl_DivMulTra")
_KGEN = {"Softmax": "MaxSubExpSumDiv", "Transpose": "Tra", "Reshape": "Res", "Slice": "Sli", "Split": "Sli",
         "LayerNormalization": "MeanSubMulMeanAddSqrtDivMul", "ReduceMean": "Mean"}
_CASK = {"Conv": "CaskConvolution", "ConvTranspose": "CaskDeconvolutionV2", "Gemm": "CaskGemmConvolution",
         "MatMul": "CaskGemmMatrixMultiply"}
# TensorRT <= 10's "Format/Datatype" of a Cask layer's tensor (trex's activations.py lists them); kgen and gemm
# layers write the bare data type ("Int8", "Half", "Float"). TensorRT 11's "Format" ends with the enum's name, as in
# the migration page's "Row major linear FP32 format (kLINEAR)" (and trex's "Row major linear FP4 format (kLINEAR)").
# BF16: no published dump of a BF16 engine was found; its format is spelled as FP16's with the type's name, and its
# data type as TensorRT's DataType.BF16 prints ("BFloat16"): tensorrt_inspector reads either word.
_FORMATS = {"Int8": "Thirty-two wide channel vectorized row major Int8 format",
            "Half": "Channel major FP16 format where channel % 8 == 0", "Float": "Row major linear FP32",
            "BFloat16": "Channel major BF16 format where channel % 8 == 0"}
_FORMATS_11 = {"Int8": "Thirty-two wide channel vectorized row major Int8 format (kCHW32)",
               "Half": "Channel major FP16 format where channel % 8 == 0 (kHWC8)",
               "Float": "Row major linear FP32 format (kLINEAR)",
               "BFloat16": "Channel major BF16 format where channel % 8 == 0 (kHWC8)"}
DYNAMIC = "N/A due to dynamic shapes"


@dataclass
class Options:
    """How the fake inspector writes: ``version`` (10: ``Format/Datatype``; 11: ``DataType`` and ``Format``),
    ``myelin`` ("expanded": kgen/gemm layers; "foreign": one ``{ForeignNode[...]}`` layer per region), ``metadata``
    (False: Myelin layers with an empty Metadata, as in sampleEditableTimingCache's dump)."""

    version: int = 10
    myelin: str = "expanded"
    metadata: bool = True


@dataclass
class Tensor:
    name: str
    type: str  # "Int8", "Half", "Float", "BFloat16"
    kgen: bool = False  # written as the bare data type (kgen, gemm) rather than a Cask format string

    def record(self, version: int, shapes_known: bool) -> dict:
        out: dict = {"Name": self.name, "Location": "Device", "Dimensions": []}
        if version >= 11:
            out["DataType"] = self.type if shapes_known else DYNAMIC
            out["Format"] = _FORMATS_11[self.type] if shapes_known else DYNAMIC
        else:
            out["Format/Datatype"] = (self.type if self.kgen else _FORMATS[self.type]) if shapes_known else DYNAMIC
        return out


@dataclass
class Layer:
    name: str
    type: str
    inputs: list[Tensor]
    outputs: list[Tensor] = field(default_factory=list)
    nodes: list[str] = field(default_factory=list)  # what its Metadata names

    def record(self, version: int, shapes_known: bool) -> dict:
        return {"Name": self.name, "LayerType": self.type,
                "Inputs": [t.record(version, shapes_known) for t in self.inputs],
                "Outputs": [t.record(version, shapes_known) for t in self.outputs],
                "Metadata": "\x1e".join(f"[ONNX Layer: {n}]" for n in self.nodes)}


def records(proto: onnx.ModelProto, options: Options, shapes_known: bool) -> list[dict]:
    """The inspector's DETAILED layer records of a strongly typed build of ``proto``."""
    return [layer.record(options.version, shapes_known) for layer in engine_layers(proto, options)]


def engine_layers(proto: onnx.ModelProto, options: Options | None = None) -> list[Layer]:
    """One layer per compute node outside Myelin (its weights' DequantizeLinear, a residual Add and a Relu fused in,
    with a NoOp copy of the residual in front), Myelin's layers per region, and a Reformat before the first layer
    when it reads another type than the network input. A layer reads Int8 when its input comes from a
    DequantizeLinear of an INT8 tensor (an explicitly quantized kernel), Half on float16, Float otherwise."""
    graph = Graph(proto)
    options = options or Options()
    regions = graph.myelin_regions()
    region_of = {node.name: index for index, region in enumerate(regions) for node in region}
    layers: list[Layer] = []
    done: set[str] = set()
    for node in proto.graph.node:
        if node.name in done or node.op_type in (*QDQ, "Constant"):
            continue
        if node.name in region_of:
            region = regions[region_of[node.name]]
            layers += myelin_layers(graph, region, region_of[node.name], options)
            done.update(n.name for n in region)
            continue
        layers += cask_layers(graph, node, done | set(region_of))
        done.update(layers[-1].nodes)
    return _reformat_first(graph, layers)


def cask_layers(graph: Graph, node, taken: set[str]) -> list[Layer]:
    """A Cask (or pointwise) layer; for a convolution with a residual Add, the NoOp copy of its Input Tensor 1 first,
    reading the residual's type. Nodes in ``taken`` are another layer's."""
    weights = [graph.producer[i].name for i in node.input[1:] if i in graph.producer
               and graph.producer[i].op_type == "DequantizeLinear"]
    add = graph.sole_consumer(node, "Add") if node.op_type in _CASK else None
    add = None if add is not None and add.name in taken else add
    relu = graph.sole_consumer(add or node, "Relu") if node.op_type in _CASK else None
    names = [*weights, node.name, *(n.name for n in (add, relu) if n is not None)]
    out = (relu or add or node).output[0]
    inputs = [Tensor(graph.origin(node.input[0]), graph.reads(node.input[0]))]
    residual = next((i for i in add.input if i != node.output[0]), None) if add is not None else None
    if residual is not None:
        inputs.append(Tensor(residual, graph.reads(residual)))
    layer = Layer(" + ".join(names), _CASK.get(node.op_type, "PointWiseV2"), inputs, [Tensor(out, graph.reads(out))],
                  names)
    if residual is None:
        return [layer]
    copy = Layer(f"Reformatting CopyNode for Input Tensor 1 to {layer.name}", "NoOp", [inputs[1]], [inputs[1]])
    return [copy, layer]


def myelin_layers(graph: Graph, region: list, index: int, options: Options) -> list[Layer]:
    compute = [n for n in region if n.op_type not in QDQ]
    first_input = Tensor(graph.origin(compute[0].input[0]), graph.reads(compute[0].input[0]), kgen=True)
    last_output = Tensor(compute[-1].output[0], graph.reads(compute[-1].output[0]), kgen=True)
    foreign = f"{{ForeignNode[{compute[0].name}...{compute[-1].name}]}}"
    if options.myelin == "foreign":
        return [Layer(foreign, "Myelin", [first_input], [last_output], [n.name for n in compute])]
    layers = [Layer(f"dummy_shape_call__mye{4273 + index}_0_myl{index}_0", "shape_call", [])]
    for group in _groups(compute):
        n = len(layers)
        nodes = [x.name for x in group] if options.metadata else []
        if group[0].op_type == "MatMul":
            name = "+".join(x.name.replace(".", "_") for x in group) + f"_myl{index}_{n}"
            inputs = [Tensor(graph.origin(i), graph.reads(i), kgen=True) for i in group[0].input]
            layers.append(Layer(name, "gemm", inputs, [Tensor(group[0].output[0], graph.reads(group[0].output[0]),
                                                              kgen=True)], nodes))
        else:
            ops = "".join(_KGEN.get(x.op_type, x.op_type[:3]) for x in group)
            source = group[0].input[0]
            layers.append(Layer(f"__myl_{ops}_myl{index}_{n}", "kgen", [Tensor(source, graph.reads(source),
                                                                                kgen=True)],
                                [Tensor(group[-1].output[0], graph.reads(group[-1].output[0]), kgen=True)], nodes))
    layers.append(Layer(f"Reformatting CopyNode for Output Tensor 0 to {foreign}", "Reformat", [last_output],
                        [Tensor(last_output.name, last_output.type)]))
    return layers


def _groups(nodes: list) -> list[list]:
    """MatMuls sharing their input and reading constant weights as one gemm (Q, K, V projections), every other
    MatMul alone, the runs of other nodes between them as one kgen each."""
    groups: list[list] = []
    for node in nodes:
        last = groups[-1] if groups else None
        if node.op_type == "MatMul":
            shares = (last is not None and last[0].op_type == "MatMul" and last[0].input[0] == node.input[0])
            groups[-1:] = [[*last, node]] if shares else [*([last] if last else []), [node]]
        elif last is not None and last[0].op_type != "MatMul":
            last.append(node)
        else:
            groups.append([node])
    return groups


def _reformat_first(graph: Graph, layers: list[Layer]) -> list[Layer]:
    """TensorRT copies the network input into the format and type the first layer reads: a Reformat named after the
    QuantizeLinear it carries out when that layer reads Int8 ("QuantizeLinear_2" in trex's resnet-qat plan), else
    "Reformatting CopyNode for Input Tensor 0 to <the layer>"."""
    network_input = graph.proto.graph.input[0].name
    first = next((layer for layer in layers if layer.type != "NoOp" and layer.inputs
                  and layer.inputs[0].name == network_input), None)
    if first is None or first.inputs[0].type == graph.reads(network_input):
        return layers
    quantize = next((n.name for n in graph.consumers.get(network_input, []) if n.op_type == "QuantizeLinear"), None)
    name = quantize if first.inputs[0].type == "Int8" and quantize else \
        f"Reformatting CopyNode for Input Tensor 0 to {first.name}"
    copy = Layer(name, "Reformat", [Tensor(network_input, graph.reads(network_input))],
                 [Tensor(f"Reformatted Input Tensor 0 to {first.name}", first.inputs[0].type)])
    return [copy, *layers]


class Graph:
    """The ONNX graph as the fake builder sees it: each tensor's type, producer and consumers."""

    def __init__(self, proto: onnx.ModelProto):
        self.proto = proto
        inferred = onnx.shape_inference.infer_shapes(proto)
        self.types = {t.name: t.data_type for t in proto.graph.initializer}
        for value in (*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output):
            self.types[value.name] = value.type.tensor_type.elem_type
        self.producer = {o: n for n in proto.graph.node for o in n.output}
        self.consumers: dict = {}
        for n in proto.graph.node:
            for i in n.input:
                self.consumers.setdefault(i, []).append(n)

    def reads(self, tensor: str) -> str:
        source = self.producer.get(tensor)
        if source is not None and source.op_type == "DequantizeLinear" and \
                self.types.get(source.input[0]) in (onnx.TensorProto.INT8, onnx.TensorProto.UINT8):
            return "Int8"
        return {onnx.TensorProto.FLOAT16: "Half", onnx.TensorProto.BFLOAT16: "BFloat16"}.get(self.types.get(tensor),
                                                                                              "Float")

    def origin(self, tensor: str) -> str:
        """The tensor a Q/DQ pair quantizes: the name TensorRT gives the fused kernel's input."""
        dq = self.producer.get(tensor)
        q = self.producer.get(dq.input[0]) if dq is not None and dq.op_type == "DequantizeLinear" else None
        return q.input[0] if q is not None and q.op_type == "QuantizeLinear" else tensor

    def sole_consumer(self, node, op_type: str):
        after = self.consumers.get(node.output[0], [])
        return after[0] if len(after) == 1 and after[0].op_type == op_type else None

    def myelin_regions(self) -> list[list]:
        """Connected nodes of :data:`MYELIN_OPS` (and the Q/DQ between them) holding a MatMul, in graph order."""
        members = [n for n in self.proto.graph.node if n.op_type in MYELIN_OPS or n.op_type in QDQ]
        names = {n.name for n in members}
        region: dict[str, int] = {}
        for start in members:
            if start.name in region:
                continue
            stack, region[start.name] = [start], len(region)
            while stack:
                node = stack.pop()
                for other in self._neighbours(node):
                    if other.name in names and other.name not in region:
                        region[other.name] = region[start.name]
                        stack.append(other)
        groups: dict[int, list] = {}
        for node in members:
            groups.setdefault(region[node.name], []).append(node)
        return [g for g in groups.values() if any(n.op_type == "MatMul" for n in g)]

    def _neighbours(self, node) -> list:
        before = [self.producer[i] for i in node.input if i in self.producer]
        return before + [c for o in node.output for c in self.consumers.get(o, [])]
