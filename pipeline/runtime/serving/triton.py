"""A Triton model's signature read from the artifact itself, and its ``config.pbtxt`` as Triton's own ``ModelConfig``.

The signature (input and output names, Triton data types, dims) comes from the file Triton will load: the ONNX graph,
the OpenVINO IR (read by OpenVINO) or the TensorRT engine (deserialized by TensorRT, with its optimisation profile).
The configuration is built as ``tritonclient``'s ``model_config_pb2.ModelConfig`` (the protobuf Triton parses), written
with protobuf's ``text_format`` and parsed back the same way: what deploy checks is what Triton reads.

``tritonclient[grpc]`` (the project's ``deploy`` extra) is imported lazily, so the rest of the pipeline does not
need it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.core.errors import BackendUnavailable, InputError, first_line

INSTALL = "install the project's 'deploy' extra (pip install -e '.[deploy]'): it brings tritonclient[grpc], whose " \
          "ModelConfig protobuf writes and checks config.pbtxt"

# Triton's data types (model_config.proto DataType) of each runtime's element types.
ONNX_TYPES = {1: "TYPE_FP32", 10: "TYPE_FP16", 16: "TYPE_BF16", 11: "TYPE_FP64", 2: "TYPE_UINT8", 3: "TYPE_INT8",
              5: "TYPE_INT16", 6: "TYPE_INT32", 7: "TYPE_INT64", 9: "TYPE_BOOL"}
OPENVINO_TYPES = {"f32": "TYPE_FP32", "f16": "TYPE_FP16", "bf16": "TYPE_BF16", "f64": "TYPE_FP64", "u8": "TYPE_UINT8",
                  "i8": "TYPE_INT8", "i16": "TYPE_INT16", "i32": "TYPE_INT32", "i64": "TYPE_INT64",
                  "boolean": "TYPE_BOOL"}
TENSORRT_TYPES = {"FLOAT": "TYPE_FP32", "HALF": "TYPE_FP16", "BF16": "TYPE_BF16", "INT8": "TYPE_INT8",
                  "UINT8": "TYPE_UINT8", "INT32": "TYPE_INT32", "INT64": "TYPE_INT64", "BOOL": "TYPE_BOOL"}
NUMPY_TYPES = {"TYPE_FP32": "float32", "TYPE_FP16": "float16", "TYPE_FP64": "float64", "TYPE_UINT8": "uint8",
               "TYPE_INT8": "int8", "TYPE_INT16": "int16", "TYPE_INT32": "int32", "TYPE_INT64": "int64",
               "TYPE_BOOL": "bool"}


@dataclass(frozen=True)
class Tensor:
    """One input or output as the artifact declares it: ``dims`` include the first (batch) dimension, -1 dynamic."""

    name: str
    dtype: str  # a Triton DataType name: "TYPE_FP32"
    dims: tuple[int, ...]


@dataclass(frozen=True)
class Signature:
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]
    profile_max: int | None = None  # a TensorRT engine: its optimisation profile's largest first dimension
    profile_min: int | None = None  # and its smallest

    @property
    def batch_dim(self) -> int | None:
        """The first dimension of the first input (None: dynamic)."""
        first = self.inputs[0].dims[0] if self.inputs and self.inputs[0].dims else None
        return None if first is None or first < 0 else first


def _type(table: dict, key: Any, what: str, name: str) -> str:
    if key not in table:
        raise InputError(f"{what} tensor {name} has element type {key}, which a Triton model cannot declare here")
    return table[key]


# --------------------------------------------------------------------------- signatures, from the artifacts


def onnx_signature(path: Path) -> Signature:
    """Names, types and dims of an ONNX graph's inputs (initializers excluded) and outputs."""
    from pipeline.core import onnx_io

    model = onnx_io.load(path, "ONNX model")
    initializers = {t.name for t in model.graph.initializer}

    def tensor(value) -> Tensor:
        t = value.type.tensor_type
        dims = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in t.shape.dim)
        return Tensor(value.name, _type(ONNX_TYPES, t.elem_type, path.name, value.name), dims)

    return Signature(tuple(tensor(v) for v in model.graph.input if v.name not in initializers),
                     tuple(tensor(v) for v in model.graph.output))


def openvino_signature(xml: bytes, weights: bytes) -> Signature:
    """Names, types and dims of an IR as OpenVINO reads it (the bytes ``openvino_ir.load`` checked)."""
    import numpy as np
    import openvino as ov

    model = ov.Core().read_model(xml.decode("utf-8"), ov.Tensor(np.frombuffer(weights, np.uint8)))

    def tensor(port) -> Tensor:
        dims = tuple(d.get_length() if d.is_static else -1 for d in port.get_partial_shape())
        return Tensor(port.get_any_name(), _type(OPENVINO_TYPES, port.get_element_type().get_type_name(), "IR",
                                                 port.get_any_name()), dims)

    return Signature(tuple(tensor(p) for p in model.inputs), tuple(tensor(p) for p in model.outputs))


def engine_signature(engine_bytes: bytes) -> Signature:
    """Names, types, dims and the profile's largest batch of a TensorRT engine, as TensorRT deserializes it (bytes
    that ``tensorrt_engine.load_engine_bytes`` checked)."""
    import tensorrt as trt
    from polygraphy.backend.trt import engine_from_bytes
    from polygraphy.exception import PolygraphyException

    try:
        engine = engine_from_bytes(engine_bytes)
    except PolygraphyException as exc:  # an engine TensorRT refuses to deserialize
        raise InputError(f"TensorRT could not deserialize the engine ({first_line(exc)[:200]}); rebuild it") from None
    inputs, outputs, profile_min, profile_max = [], [], None, None
    for index in range(engine.num_io_tensors):
        name = engine.get_tensor_name(index)
        dtype = _type(TENSORRT_TYPES, engine.get_tensor_dtype(name).name, "engine", name)
        shape = engine.get_tensor_shape(name)
        tensor = Tensor(name, dtype, tuple(int(shape[i]) for i in range(len(shape))))
        if engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT:
            inputs.append(tensor)
            if tensor.dims and tensor.dims[0] < 0:
                shapes = engine.get_tensor_profile_shape(name, 0)
                smallest, largest = int(shapes[0][0]), int(shapes[2][0])
                profile_max = largest if profile_max is None else min(profile_max, largest)
                profile_min = smallest if profile_min is None else max(profile_min, smallest)
        else:
            outputs.append(tensor)
    return Signature(tuple(inputs), tuple(outputs), profile_max, profile_min)


# --------------------------------------------------------------------------- the configuration


def model_config_pb2():
    """tritonclient's ``model_config_pb2`` (Triton's ModelConfig protobuf), or exit 3 with the install line."""
    try:
        from tritonclient.grpc import model_config_pb2
    except ImportError as exc:
        raise BackendUnavailable(f"tritonclient is not installed ({first_line(exc)}); {INSTALL}") from None
    return model_config_pb2


@dataclass(frozen=True)
class Model:
    """What one Triton model is: its name, how Triton runs it, its tensors and its batching."""

    name: str
    platform: str  # "tensorrt_plan", or "" with a backend
    backend: str  # "onnxruntime", "openvino", or "" with a platform
    filename: str  # model.plan, model.onnx, model.xml
    signature: Signature
    max_batch_size: int
    preferred_batch_sizes: tuple[int, ...]
    max_queue_delay_us: int
    gpu: bool  # instance_group KIND_GPU, else KIND_CPU
    instances: int
    parameters: tuple[tuple[str, str], ...] = ()


def build_config(model: Model):
    """The ``ModelConfig`` of ``model``: with a batch dimension (``max_batch_size`` > 0) the dims leave it out, as
    Triton requires, and the dynamic batcher is on."""
    pb = model_config_pb2()
    config = pb.ModelConfig(name=model.name, max_batch_size=model.max_batch_size,
                            default_model_filename=model.filename)
    if model.platform:
        config.platform = model.platform
    else:
        config.backend = model.backend
    cut = 1 if model.max_batch_size > 0 else 0
    for tensor in model.signature.inputs:
        config.input.add(name=tensor.name, data_type=pb.DataType.Value(tensor.dtype), dims=list(tensor.dims[cut:]))
    for tensor in model.signature.outputs:
        config.output.add(name=tensor.name, data_type=pb.DataType.Value(tensor.dtype), dims=list(tensor.dims[cut:]))
    if model.max_batch_size > 0:
        config.dynamic_batching.preferred_batch_size.extend(model.preferred_batch_sizes)
        config.dynamic_batching.max_queue_delay_microseconds = model.max_queue_delay_us
    kind = pb.ModelInstanceGroup.Kind.KIND_GPU if model.gpu else pb.ModelInstanceGroup.Kind.KIND_CPU
    config.instance_group.add(kind=kind, count=model.instances)
    for key, value in model.parameters:
        config.parameters[key].string_value = value
    return config


def to_text(config) -> str:
    from google.protobuf import text_format

    return text_format.MessageToString(config)


def parse(text: str, where: str | Path):
    """``config.pbtxt`` parsed as Triton's ``ModelConfig`` (protobuf text format: an unknown field is an error)."""
    from google.protobuf import text_format

    pb = model_config_pb2()
    try:
        return text_format.Parse(text, pb.ModelConfig())
    except text_format.ParseError as exc:
        raise InputError(f"{where}: not a valid Triton ModelConfig: {first_line(exc)}") from None


def mismatches(config, model: Model) -> list[str]:
    """Every way a parsed configuration differs from the artifact's signature and the batching decided for it (empty:
    it describes the artifact)."""
    pb = model_config_pb2()
    cut = 1 if model.max_batch_size > 0 else 0
    problems = []
    if config.max_batch_size != model.max_batch_size:
        problems.append(f"max_batch_size {config.max_batch_size}, the artifact serves {model.max_batch_size}")
    for kind, declared, tensors in (("input", config.input, model.signature.inputs),
                                    ("output", config.output, model.signature.outputs)):
        got = [(t.name, pb.DataType.Name(t.data_type), tuple(t.dims)) for t in declared]
        want = [(t.name, t.dtype, t.dims[cut:]) for t in tensors]
        if got != want:
            problems.append(f"{kind}s {got}, the artifact has {want}")
    if model.max_batch_size > 0 and tuple(config.dynamic_batching.preferred_batch_size) != model.preferred_batch_sizes:
        problems.append(f"preferred_batch_size {list(config.dynamic_batching.preferred_batch_size)}, decided "
                        f"{list(model.preferred_batch_sizes)}")
    if any(size > model.max_batch_size for size in config.dynamic_batching.preferred_batch_size):
        problems.append("a preferred batch size exceeds max_batch_size")
    return problems


def numpy_dtype(tensor: Tensor) -> str:
    return NUMPY_TYPES[tensor.dtype]
