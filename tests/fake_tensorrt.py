"""A recording fake of the TensorRT Python bindings and of the CUDA memory under them, for tests only.

It checks the CALLS the pipeline makes to TensorRT, not TensorRT's numerics: the "engine" runs its ONNX
file with ONNX Runtime on the CPU, so verify's numbers are real but say nothing about TensorRT kernels.

What it checks (each breach is appended to ``FakeTensorRT.violations`` and makes the call return False,
as TensorRT does, so unchecked returns also show up as wrong results):

* signatures: the methods have the parameters of TensorRT's bindings (tensorrt-stubs 10.13, TensorRT 11's
  ``pyCore.cpp``): ``set_input_shape(name, shape) -> bool``, ``set_tensor_address(name, memory: int) -> bool``,
  ``execute_async_v3(stream_handle: int) -> bool``, ``get_tensor_shape(name) -> Dims`` (a tuple here, -1 for
  an unset dynamic dimension), ``set_output_allocator(name, allocator) -> bool``;
* ``set_input_shape`` was called for every dynamic input before ``execute_async_v3``, within the profile;
* every address bound with ``set_tensor_address`` is a live device allocation when the engine runs, and
  stays the SAME allocation it was when bound (a buffer freed and its address reused counts as freed):
  device memory is either Polygraphy's (its ``cuda.wrapper()`` is :class:`FakeCudart`, host memory standing in
  for device memory, made after Polygraphy's real ``libcudart.so*`` search on a pip-only CUDA 13 machine:
  :func:`cuda_wrapper_class`) or the pipeline's torch tensors (``pipeline.runtime.runners.DEVICE_MEMORY``
  is replaced by :class:`FakeDeviceMemory`, CPU tensors tracked by weak reference);
* CUDA graphs: ``torch.cuda.graph`` must be called with ``capture_error_mode="thread_local"``; an enqueue during
  a capture needs an earlier enqueue of the same context (TensorRT's warm-up) and is recorded with the shapes
  and addresses bound then, and run at ``replay()``;
* streams and time: everything runs on the virtual CUDA device of ``tests/virtual_cuda.py`` (streams with
  virtual clocks, the legacy default stream's ordering, events, poison until a synchronize; its docstring and
  docs/gpu-validation.md say what it models). ``execute_async_v3`` is a kernel on the stream whose handle it
  gets (an unknown handle is a violation; handle 0, the legacy default stream, logs TensorRT's warning and
  synchronizes, as TensorRT does); the binding calls cost the host virtual time, and so does the enqueue itself
  before its first kernel starts: TensorRT's set-up (``vc.ENQUEUE_NS``), each call of a Python output allocator
  (``vc.CALLBACK_NS``: Polygraphy sets one on every ``infer``), then one launch per layer; ``torch.cuda``'s streams,
  events, graphs, ``current_stream``/``stream`` and ``is_available()`` (True) are the device's, so
  Polygraphy's ``TrtRunner`` takes its torch-tensor path.

* the builder, as Polygraphy's real loaders drive it (``NetworkFromOnnxPath(strongly_typed=True)``,
  ``CreateConfig``, ``EngineBytesFromNetwork``): ``Builder``, ``create_network(flags)``, ``OnnxParser``
  (``parse_from_file``, ``num_errors``/``get_error``), ``create_builder_config`` with ``set_flag``/``clear_flag``
  (recorded; TF32 on by default, as in TensorRT), optimization profiles (``set_shape``), the timing cache
  (``create_timing_cache``/``set_timing_cache``/``serialize``/``combine``) and ``builder_optimization_level``.
  ``build_serialized_network`` refuses, as TensorRT does, a dynamic input without a profile and a precision
  flag (FP16, INT8, BF16, FP8, ...) on a strongly typed network, logging the error through the logger it was
  given; otherwise it returns the fake engine (:func:`serialize`: a header with the profile and the config's
  flags, then the ONNX model). It does not optimise, choose tactics or check layer support.

* the engine inspector (``ICudaEngine.create_engine_inspector()``, an ``EngineInspector``):
  ``get_engine_information(LayerInformationFormat.JSON)`` gives TensorRT's JSON, ``{"Layers": [...], "Bindings":
  [...]}``, each layer's record only when the engine was built with ``ProfilingVerbosity.DETAILED`` (with
  LAYER_NAMES_ONLY, TensorRT's default, the names alone), each tensor's type only through an ``execution_context``
  with every dynamic input's shape set. The records follow real published dumps (:mod:`fake_inspector`: Cask
  layers, NoOp and Reformat copies, Myelin's gemm/kgen/shape_call layers or one ``{ForeignNode[...]}`` layer,
  TensorRT 10's ``Format/Datatype`` or 11's ``DataType``/``Format``, as ``FakeTensorRT.inspector`` says); their
  data types follow the strongly typed graph: Int8 behind a DequantizeLinear of INT8, Half on float16 tensors,
  Float otherwise.

``fail["warning"] = "<text>"`` makes every enqueue log that TensorRT WARNING through the runtime's logger.
``fail`` injects failures: ``fail["execute_async_v3"] = {4}`` makes ``execute_async_v3`` return False at
batch 4 (no violation: TensorRT may legitimately fail), as with ``set_input_shape``; ``fail["capture"]`` makes
an execute during capture return False; ``fail["parse"] = "<message>"`` makes the ONNX parser report that
error.
"""

from __future__ import annotations

import contextlib
import ctypes
import enum
import functools
import hashlib
import itertools
import json
import types
import weakref

import numpy as np

import fake_inspector
import virtual_cuda as vc

MAGIC = b"FAKE-TRT-FP16_ENGINE\n"
STREAM = 0x5EED  # a blocking stream that exists on every virtual device (the first one created)


class DataType(enum.IntEnum):  # TensorRT's values (NvInferRuntimeBase.h)
    FLOAT = 0
    HALF = 1
    INT8 = 2
    INT32 = 3
    BOOL = 4
    BF16 = 7
    INT64 = 8


class TensorIOMode(enum.IntEnum):
    NONE = 0
    INPUT = 1
    OUTPUT = 2


class TensorFormat(enum.IntEnum):
    LINEAR = 0
    HWC = 8
    CHW16 = 3


class Severity(enum.IntEnum):
    INTERNAL_ERROR = 0
    ERROR = 1
    WARNING = 2
    INFO = 3
    VERBOSE = 4


class ILogger:
    pass


class Logger(ILogger):
    INTERNAL_ERROR, ERROR, WARNING, INFO, VERBOSE = list(Severity)


class IOutputAllocator:
    pass


class IDebugListener:
    pass


# ONNX elem type -> (TensorRT type, the NumPy type of its bytes). NumPy has no bfloat16: a BF16 tensor's bytes are
# uint16 here (the upper half of a float32), which is all a device buffer is.
_ONNX_TYPES = {1: (DataType.FLOAT, np.float32), 10: (DataType.HALF, np.float16), 16: (DataType.BF16, np.uint16),
               3: (DataType.INT8, np.int8), 6: (DataType.INT32, np.int32), 7: (DataType.INT64, np.int64),
               9: (DataType.BOOL, np.bool_)}


def to_bf16_bytes(values: np.ndarray) -> np.ndarray:
    """float32 values (already bfloat16-rounded: the BF16 emulation's) as bfloat16 bytes (uint16)."""
    return (np.ascontiguousarray(values, np.float32).view(np.uint32) >> 16).astype(np.uint16)


class FakeCudart:
    """Polygraphy's ``cuda.wrapper()`` on the virtual device: host memory stands in for device memory, every
    allocation is tracked until ``free``, copies and streams go through :mod:`virtual_cuda`."""

    def __init__(self, fake: "FakeTensorRT"):
        self.fake, self.blocks = fake, {}

    def malloc(self, nbytes: int) -> int:
        block = np.full(max(int(nbytes), 1), vc.POISON, np.uint8)  # uninitialised device memory
        ptr = block.ctypes.data
        self.blocks[ptr] = block
        self.fake.live[ptr] = (next(self.fake.ids), block.nbytes, lambda: ptr in self.blocks)
        return ptr

    def free(self, ptr: int) -> None:
        self.blocks.pop(ptr, None)

    def memcpy(self, dst, src, nbytes, kind, stream_ptr=None):
        stream = None if stream_ptr is None else self.fake.stream(stream_ptr, "memcpy")
        vc.DEVICE[0].memcpy(int(dst), int(src), int(nbytes), stream)

    def create_stream(self):
        return vc.DEVICE[0].new_stream(blocking=True).handle  # cudaStreamCreate: a blocking stream

    def stream_synchronize(self, ptr):
        self.fake.stream(ptr, "stream_synchronize").synchronize()

    def destroy_stream(self, ptr):
        vc.DEVICE[0].streams.pop(ptr, None)


def cuda_wrapper_class(fake: "FakeTensorRT"):
    """What ``polygraphy.cuda.wrapper()`` constructs: Polygraphy's own ``Cuda.__init__`` search, run for real
    (``_find_cuda_lib_dirs()``: ``LD_LIBRARY_PATH`` as it is NOW, ``/usr/local/cuda/lib64``, ``/usr/lib``, ``/lib``,
    ``nvidia/cuda_runtime/lib`` on ``sys.path``; the first ``libcudart.so*`` found is loaded), then the virtual
    device's :class:`FakeCudart` instead of ``ctypes.CDLL``. Nothing found: the ``OSError`` ``ctypes.CDLL(
    "libcudart.so")`` raises on a machine without it. Found: recorded in ``fake.libcudart``, and a violation unless
    it is the library :func:`pipeline.core.env.find_libcudart` chose (the one the pipeline's other TensorRT entry
    points and doctor name): another copy, e.g. ``/usr/local/cuda``'s beside the CUDA 13 wheel, is another CUDA
    runtime than the one the benchmark's TensorRT uses."""

    def make():
        from polygraphy.cuda import cuda as pcuda
        from polygraphy.util import util as pg_util

        from pipeline.core import env

        found = pg_util.find_in_dirs("libcudart.so*", pcuda._find_cuda_lib_dirs())
        if not found:
            raise OSError("libcudart.so: cannot open shared object file: No such file or directory (Polygraphy "
                          f"searched {pcuda._find_cuda_lib_dirs()})")
        fake.libcudart = found[0]
        chosen = env.find_libcudart()
        if chosen != found[0]:
            fake.violation(f"Polygraphy's CUDA wrapper loaded {found[0]}, not {chosen}, the libcudart the pipeline "
                           "found: env.expose_libcudart() was not called before the first TensorRT runner")
        return FakeCudart(fake)

    return make


@functools.lru_cache(maxsize=None)
def pip_cuda13_site() -> str:
    """A virtual pip-only CUDA 13 install: ``<site>/nvidia/cu13/lib/libcudart.so.13`` (the ``nvidia-cuda-runtime``
    13.x wheel's layout, where Polygraphy does not look). One per test session; never loaded, only found."""
    import atexit
    import pathlib
    import shutil
    import tempfile

    site = pathlib.Path(tempfile.mkdtemp(prefix="fake-pip-cu13-"))
    atexit.register(shutil.rmtree, site, True)
    lib = site / "nvidia" / "cu13" / "lib"
    lib.mkdir(parents=True)
    (lib / "libcudart.so.13").write_bytes(b"\x7fELF (a stand-in, never loaded)")
    return str(site)


def _virtual_tensor_class():
    import torch

    class VirtualTensor(torch.Tensor):
        """A CPU tensor that stands for device or page-locked memory: its ``copy_`` to or from device memory is a
        copy on the current stream of the virtual device, and ``resize_`` keeps the allocation tracked."""

        __torch_function__ = torch._C._disabled_torch_function_impl  # results of other ops are plain tensors

        def copy_(self, src, non_blocking=False):
            device = vc.DEVICE[0]
            if not (device.device_memory(self.data_ptr()) or device.device_memory(src.data_ptr())):
                return torch.Tensor.copy_(self, src, non_blocking)
            if src.dtype != self.dtype or src.nbytes != self.nbytes or not src.is_contiguous():
                raise RuntimeError("virtual device: copy_ between device memory and another dtype, size or layout")
            host_pinned = device.is_pinned(src.data_ptr()) or device.is_pinned(self.data_ptr())
            device.memcpy(self.data_ptr(), src.data_ptr(), self.nbytes,
                          device.current if non_blocking and host_pinned else None)
            return self

        def resize_(self, *shape, **kwargs):
            torch.Tensor.resize_(self, *shape, **kwargs)
            FAKE[0].device_memory_track(self)
            return self

    return VirtualTensor


class FakeDeviceMemory:
    """``pipeline.runtime.runners.DEVICE_MEMORY`` on the virtual device: "device" tensors are CPU tensors tracked by
    weak reference (their ``copy_`` is a virtual copy), "pinned" ones are CPU tensors the device knows are
    page-locked."""

    device = "cpu"

    def __init__(self, fake: "FakeTensorRT"):
        self.fake = fake

    def _virtual(self, tensor):
        return tensor.as_subclass(self.fake.tensor_class)

    def tensor(self, host):
        import torch

        return self.fake.device_memory_track(self._virtual(torch.from_numpy(np.array(host, copy=True))))

    def empty(self, shape, dtype):
        import torch

        tensor = self._virtual(torch.empty(shape, dtype=dtype))
        tensor.view(torch.uint8).fill_(vc.POISON)  # uninitialised device memory
        return self.fake.device_memory_track(tensor)

    def pinned(self, host):
        import torch

        tensor = self._virtual(torch.from_numpy(np.array(host, copy=True)))
        vc.DEVICE[0].pin(tensor)
        return tensor

    def pinned_empty(self, shape, dtype):
        import torch

        tensor = self._virtual(torch.empty(shape, dtype=dtype))
        vc.DEVICE[0].pin(tensor)
        return tensor


def _has_bf16(proto) -> bool:
    from onnx import TensorProto

    return any(i.data_type == TensorProto.BFLOAT16 for i in proto.graph.initializer) or any(
        a.name == "to" and a.i == TensorProto.BFLOAT16 for n in proto.graph.node for a in n.attribute)


def _bf16_emulated(proto):
    from pipeline.precision import plugs

    return plugs.BF16.faithful_model(proto)


class FakeEngine:
    """An ``ICudaEngine`` whose serialized form is a header plus the ONNX file it "compiled"."""

    def __init__(self, fake: "FakeTensorRT", blob: bytes, logger=None):
        import onnx
        import onnxruntime as ort

        header, model = blob[len(MAGIC):].split(b"\n", 1)
        self.fake, self.header, self.logger = fake, json.loads(header), logger
        proto = onnx.load_from_string(model)
        # ONNX Runtime's CPU provider has no BF16 kernels: a BF16 engine computes as the BF16 emulation (every BF16
        # tensor rounded, FP32 accumulation: what a BF16 tensor core does). Tensors marked as network outputs
        # (Polygraphy's ModifyNetworkOutputs) are outputs of the computation too, asked for by name.
        marked = self.header.get("marked", {})
        computes = _bf16_emulated(proto) if _has_bf16(proto) else proto
        if marked:
            from pipeline.core import onnx_io

            computes = onnx_io.mark_outputs(computes, [o.name for o in computes.graph.output] + list(marked))
        self.session = ort.InferenceSession(computes.SerializeToString(), providers=["CPUExecutionProvider"])
        self.proto = proto
        self.layers = len(proto.graph.node)  # the kernel's virtual time: vc.LAYER_NS per layer
        # What the builder config said; an engine serialized without it has TensorRT's default.
        self.profiling_verbosity = ProfilingVerbosity[self.header.get("profiling_verbosity", "LAYER_NAMES_ONLY")]
        self.io = {}
        for value, mode in [(v, TensorIOMode.INPUT) for v in proto.graph.input] + \
                           [(v, TensorIOMode.OUTPUT) for v in proto.graph.output]:
            dims = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in value.type.tensor_type.shape.dim)
            self.io[value.name] = (mode, dims, _ONNX_TYPES[value.type.tensor_type.elem_type])
        for name, (elem_type, dims) in marked.items():  # -1: the batch dimension
            self.io[name] = (TensorIOMode.OUTPUT, tuple(dims), _ONNX_TYPES[elem_type])

    @property
    def num_io_tensors(self) -> int:
        return len(self.io)

    def get_tensor_name(self, index: int) -> str:
        return list(self.io)[index]

    def get_tensor_mode(self, name: str) -> TensorIOMode:
        return self.io[name][0]

    def get_tensor_shape(self, name: str) -> tuple:
        return self.io[name][1]

    def get_tensor_dtype(self, name: str) -> DataType:
        return self.io[name][2][0]

    def get_tensor_format(self, name: str, profile_index: int = 0) -> TensorFormat:
        return TensorFormat.LINEAR

    def is_shape_inference_io(self, name: str) -> bool:
        return False

    def get_tensor_profile_shape(self, name: str, profile_index: int) -> list:
        p = self.header["profile"]
        return [tuple(p["min"]), tuple(p["opt"]), tuple(p["max"])]

    def create_execution_context(self, strategy=None) -> "FakeContext":
        self.fake.record("create_execution_context")
        return FakeContext(self)

    @property
    def num_layers(self) -> int:
        return len(fake_inspector.engine_layers(self.proto, FAKE[0].inspector))

    def create_engine_inspector(self) -> EngineInspector:
        self.fake.record("create_engine_inspector")
        return EngineInspector(self)


class ICudaEngine(FakeEngine):
    pass


def _host_call(method):
    """A binding call on the execution context costs the host virtual time (vc.HOST_CALL_NS)."""
    def timed(self, *args, **kwargs):
        vc.DEVICE[0].host += vc.HOST_CALL_NS
        return method(self, *args, **kwargs)

    timed.__name__ = method.__name__
    return timed


DEFAULT_STREAM_WARNING = ("Using default stream in enqueueV3() may lead to performance issues due to additional calls "
                          "to cudaStreamSynchronize() by TensorRT to ensure correct synchronization. Please use "
                          "non-default stream instead.")


class FakeContext:
    """An ``IExecutionContext`` that checks shapes, addresses and lifetimes when it enqueues, and runs the engine
    as a kernel on the virtual device (its ONNX graph through ONNX Runtime, at the kernel's virtual end)."""

    def __init__(self, engine: FakeEngine):
        self.engine, self.fake = engine, engine.fake
        self.shapes, self.addresses, self.allocators = {}, {}, {}
        self.active_optimization_profile = 0
        self.launched = 0  # enqueues outside a capture: TensorRT sets itself up on the first one

    @_host_call
    def set_input_shape(self, name: str, shape) -> bool:
        shape = tuple(int(d) for d in shape)
        self.fake.record("set_input_shape", name, shape)
        mode, dims, _ = self.engine.io.get(name, (None, (), None))
        p = self.engine.header["profile"]
        in_profile = mode == TensorIOMode.INPUT and len(shape) == len(dims) and all(
            lo <= d <= hi for d, lo, hi in zip(shape, p["min"], p["max"], strict=False))
        if not in_profile or shape[0] in self.fake.fail.get("set_input_shape", ()):
            return False
        self.shapes[name] = shape
        return True

    @_host_call
    def get_tensor_shape(self, name: str) -> tuple:
        return self._shape(name)

    def _shape(self, name: str) -> tuple:
        if self.engine.get_tensor_mode(name) == TensorIOMode.INPUT:
            return self.shapes.get(name, self.engine.io[name][1])
        batch = next(iter(self.shapes.values()), (-1,))[0]
        return (batch, *self.engine.io[name][1][1:])

    @_host_call
    def get_tensor_address(self, name: str) -> int:
        return self.addresses.get(name, (0, None))[0]

    @_host_call
    def set_tensor_address(self, name: str, memory: int) -> bool:
        self.fake.record("set_tensor_address", name, memory)
        if not isinstance(memory, int) or name not in self.engine.io:
            return False
        block = self.fake.block_at(memory)
        if block is None:
            self.fake.violation(f"set_tensor_address({name!r}, {memory:#x}): not a device allocation")
            return False
        self.addresses[name] = (memory, block[0])
        return True

    @_host_call
    def set_output_allocator(self, name: str, output_allocator) -> bool:
        self.allocators[name] = output_allocator
        return True

    def set_optimization_profile_async(self, profile_index: int, stream_handle: int) -> bool:
        return profile_index == 0

    def execute_async_v3(self, stream_handle: int) -> bool:
        """Enqueue the engine on the stream ``stream_handle``: checked now, computed when the kernel ends."""
        self.fake.record("execute_async_v3", stream_handle)
        device = vc.DEVICE[0]
        if not isinstance(stream_handle, int):
            self.fake.violation(f"execute_async_v3({stream_handle!r}): the stream handle must be an int")
            return False
        stream = self.fake.stream(stream_handle, "execute_async_v3")
        if stream is None:
            return False
        capturing = device.capture is not None and device.capture[0] == stream
        if capturing and (self.fake.fail.get("capture") or not self._capturable()):
            return False
        if self.fake.fail.get("warning") and self.engine.logger is not None:
            self.engine.logger.log(Severity.WARNING, self.fake.fail["warning"])
        if self.warn_default_stream(stream):
            device.synchronize()  # what TensorRT does on the legacy default stream
        device.host += vc.ENQUEUE_NS  # TensorRT's own work before its first kernel launch
        kernel = self._kernel()
        if kernel is None:
            return False
        try:
            device.launch("kernel", stream, vc.LAYER_NS * self.engine.layers, read=kernel[0], write=kernel[1])
        except RuntimeError as exc:  # the legacy default stream during a capture: the capture is invalidated
            self.fake.violation(f"execute_async_v3: {exc}")
            return False
        # one kernel launch per layer: the first starts the op above, the others overlap the running kernels
        device.host += (self.engine.layers - 1) * vc.LAUNCH_NS
        if not capturing:
            self.launched += 1
        if self.warn_default_stream(stream, log=False):
            device.host_wait(stream.ready)
        return True

    def warn_default_stream(self, stream, log: bool = True) -> bool:
        if stream.handle != vc.LEGACY:
            return False
        if log and self.engine.logger is not None:
            self.engine.logger.log(Severity.WARNING, DEFAULT_STREAM_WARNING)
        return True

    def _capturable(self) -> bool:
        """TensorRT's enqueue allocates and sets itself up on the first launch of a context: that cannot be
        captured in a CUDA graph, so a capture needs a warm-up enqueue first."""
        if self.launched == 0:
            self.fake.violation("execute_async_v3 during a CUDA graph capture before any warm-up enqueue of this "
                                "execution context (TensorRT's first enqueue cannot be captured)")
            return False
        return True

    def _kernel(self):
        """(read, write) of one run with the shapes and addresses bound NOW (a capture fixes them), or None."""
        inputs = []
        for name, (mode, dims, (_, np_dtype)) in self.engine.io.items():
            if mode != TensorIOMode.INPUT:
                continue
            if -1 in dims and name not in self.shapes:
                return self.fake.violation(f"execute_async_v3: dynamic input {name!r} has no shape "
                                           "(set_input_shape was not called)") or None
            shape = self.shapes.get(name, dims)
            if shape[0] in self.fake.fail.get("execute_async_v3", ()):
                return None
            nbytes = int(np.prod(shape)) * np.dtype(np_dtype).itemsize
            if self._live(name, nbytes) is None:
                return None
            inputs.append((name, self.addresses[name][0], shape, np_dtype, nbytes))
        outputs = []
        for name, (mode, _dims, (_, np_dtype)) in self.engine.io.items():
            if mode != TensorIOMode.OUTPUT:
                continue
            shape = self._shape(name)
            nbytes = int(np.prod(shape)) * np.dtype(np_dtype).itemsize
            if name in self.allocators:  # a Python callback on the host, inside the enqueue, before any kernel
                vc.DEVICE[0].host += vc.CALLBACK_NS
                ptr = self.allocators[name].reallocate_output_async(name, 0, nbytes, 256, vc.LEGACY)
                self.allocators[name].notify_shape(name, tuple(shape))
                self.addresses[name] = (ptr, self.fake.block_at(ptr)[0]) if self.fake.block_at(ptr) else (ptr, None)
            if self._live(name, nbytes) is None:
                return None
            outputs.append((self.addresses[name][0], np_dtype, nbytes))
        self.fake.runs.append({name: shape for name, _, shape, _, _ in inputs})

        def read():  # memory freed since the enqueue reads as poison (on a GPU: undefined, often a crash)
            return {name: np.frombuffer(ctypes.string_at(ptr, n) if self.fake.block_at(ptr) else b"\xff" * n,
                                        dt).reshape(shape) for name, ptr, shape, dt, n in inputs}

        names = [name for name, (mode, _, _) in self.engine.io.items() if mode == TensorIOMode.OUTPUT]

        def write(feeds):
            for (ptr, np_dtype, nbytes), name, value in zip(outputs, names, self.engine.session.run(names, feeds),
                                                             strict=True):
                value = to_bf16_bytes(value) if self.engine.io[name][2][0] == DataType.BF16 else \
                    np.ascontiguousarray(value.astype(np_dtype))
                if self.fake.block_at(ptr):
                    ctypes.memmove(ptr, value.ctypes.data, min(nbytes, value.nbytes))

        return read, write

    def _live(self, name: str, nbytes: int):
        if name not in self.addresses:
            self.fake.violation(f"execute_async_v3: no address was set for {name!r}")
            return None
        ptr, block_id = self.addresses[name]
        block = self.fake.block_at(ptr)
        if block is None or block[0] != block_id:
            self.fake.violation(f"execute_async_v3: the buffer bound to {name!r} at {ptr:#x} was freed "
                                "(it must live as long as the context bound to it)")
            return None
        if block[1] < nbytes:
            self.fake.violation(f"execute_async_v3: the buffer bound to {name!r} holds {block[1]} bytes, "
                                f"{nbytes} needed")
            return None
        return True


class Runtime:
    def __init__(self, logger):
        self.logger = logger

    def deserialize_cuda_engine(self, serialized_engine) -> FakeEngine | None:
        blob = bytes(serialized_engine)
        if not blob.startswith(MAGIC):
            return None
        built_by = json.loads(blob[len(MAGIC):].split(b"\n", 1)[0]).get("tensorrt", FAKE[0].version)
        if release(built_by) != release(FAKE[0].version):  # an engine runs only in the release that built it
            if self.logger is not None:
                self.logger.log(Severity.ERROR, engine_version_error(FAKE[0].version, built_by))
            return None
        return ICudaEngine(FAKE[0], blob, self.logger)


def release(version: str) -> tuple:
    """``(major, minor, patch)`` of a TensorRT version: what an engine is bound to."""
    return tuple(int(p) for p in str(version).split(".")[:3])


def engine_version_error(library: str, engine: str) -> str:
    """TensorRT's error for an engine of another release (its wording as users report it)."""
    return ("IRuntime::deserializeCudaEngine: Error Code 1: Serialization (Serialization assertion "
            f"plan file is not compatible with this version of TensorRT, expecting library version {library} got "
            f"{engine}, please rebuild.)")



# --------------------------------------------------------------------------- the builder (Polygraphy's loaders)


class BuilderFlag(enum.IntEnum):  # TensorRT 10.13's values (tensorrt-stubs)
    FP16 = 0
    INT8 = 1
    DEBUG = 2
    GPU_FALLBACK = 3
    REFIT = 4
    DISABLE_TIMING_CACHE = 5
    TF32 = 6
    SPARSE_WEIGHTS = 7
    SAFETY_SCOPE = 8
    OBEY_PRECISION_CONSTRAINTS = 9
    PREFER_PRECISION_CONSTRAINTS = 10
    DIRECT_IO = 11
    REJECT_EMPTY_ALGORITHMS = 12
    VERSION_COMPATIBLE = 13
    EXCLUDE_LEAN_RUNTIME = 14
    FP8 = 15
    ERROR_ON_TIMING_CACHE_MISS = 16
    BF16 = 17
    DISABLE_COMPILATION_CACHE = 18
    WEIGHTLESS = 19
    INT4 = 22
    FP4 = 26


# Weak typing's flags: TensorRT 10.12+ rejects them on a strongly typed network, TensorRT 11 removed them.
PRECISION_FLAGS = {BuilderFlag.FP16, BuilderFlag.INT8, BuilderFlag.BF16, BuilderFlag.FP8, BuilderFlag.INT4,
                   BuilderFlag.FP4, BuilderFlag.OBEY_PRECISION_CONSTRAINTS, BuilderFlag.PREFER_PRECISION_CONSTRAINTS}
PRECISION_FLAG_NAMES = {f.name for f in PRECISION_FLAGS}


class NetworkDefinitionCreationFlag(enum.IntEnum):  # TensorRT 10.13's
    EXPLICIT_BATCH = 0
    STRONGLY_TYPED = 1


VERSIONS = {"10": "10.13.0.35", "11": "11.1.0.106"}  # the fake's two modes: tensorrt.__version__
BINDINGS_11 = "tensorrt_11_1_bindings.json"  # tests/data: TensorRT 11.1's binding names (tensorrt_binding_names.py)


@functools.lru_cache(maxsize=None)
def bindings_11() -> dict:
    """TensorRT 11.1's Python binding names: ``{"enums": {name: [members]}, "classes": {name: [members]},
    "module": [...]}``, read from its pybind11 sources by scripts/tensorrt_binding_names.py."""
    import pathlib

    return json.loads((pathlib.Path(__file__).parent / "data" / BINDINGS_11).read_text())


def enums_11() -> tuple[type, type]:
    """``BuilderFlag`` and ``NetworkDefinitionCreationFlag`` exactly as TensorRT 11.1's bindings define them: no
    FP16/INT8/BF16/FP8/INT4/FP4/OBEY_.../PREFER_PRECISION_CONSTRAINTS, no EXPLICIT_BATCH. Values: NvInfer.h's where
    10.13 had the same name, the others above them (Polygraphy and the pipeline use the names)."""
    known = {f.name: int(f) for f in BuilderFlag}
    names = bindings_11()["enums"]["BuilderFlag"]
    extra = itertools.count(100)
    builder = enum.IntEnum("BuilderFlag", {n: known[n] if n in known else next(extra) for n in names})
    network = enum.IntEnum("NetworkDefinitionCreationFlag",  # NvInfer.h 11.1: kSTRONGLY_TYPED = 0 (deprecated)
                           {n: i for i, n in enumerate(("STRONGLY_TYPED", "PREFER_JIT_PYTHON_PLUGINS",
                                                        "PREFER_AOT_PYTHON_PLUGINS"))})
    assert set(network.__members__) == set(bindings_11()["enums"]["NetworkDefinitionCreationFlag"])
    return builder, network


LayerType = enum.IntEnum("LayerType", ["CONVOLUTION", "ACTIVATION", "POOLING", "SCALE", "SOFTMAX", "ELEMENTWISE",
                                        "UNARY", "SHUFFLE", "REDUCE", "MATRIX_MULTIPLY", "CONSTANT", "CAST", "SHAPE",
                                        "QUANTIZE", "DEQUANTIZE"], start=0)  # names as in both 10.13 and 11.1


class DeviceType(enum.IntEnum):
    GPU = 0
    DLA = 1


class ProfilingVerbosity(enum.IntEnum):
    LAYER_NAMES_ONLY = 0
    NONE = 1
    DETAILED = 2


class LayerInformationFormat(enum.IntEnum):
    ONELINE = 0
    JSON = 1


class EngineInspector:
    """``ICudaEngine.create_engine_inspector()`` (the binding's class is ``tensorrt.EngineInspector``). As TensorRT's:
    what it tells depends on the profiling verbosity the engine was built with: DETAILED gives every layer's record
    (:mod:`fake_inspector`: modelled on published dumps, in TensorRT 10's or 11's keys), LAYER_NAMES_ONLY (the
    builder's default) the layer names alone, NONE no layers (an assumption: the documentation says only that
    nothing is printed); and, for an engine with a dynamic input, on ``execution_context``: without a context
    whose every input shape is set, each tensor's type is "N/A due to dynamic shapes"."""

    def __init__(self, engine: FakeEngine):
        self.engine, self.execution_context, self.error_recorder = engine, None, None

    def get_engine_information(self, format: LayerInformationFormat) -> str:
        FAKE[0].record("get_engine_information", LayerInformationFormat(format).name)
        layers = self._layers()
        if format == LayerInformationFormat.ONELINE:
            return "\n".join(layer if isinstance(layer, str) else json.dumps(layer) for layer in layers)
        return json.dumps({"Layers": layers, "Bindings": list(self.engine.io)})

    def get_layer_information(self, layer_index: int, format: LayerInformationFormat) -> str:
        layer = self._layers()[layer_index]
        return json.dumps(layer) if format == LayerInformationFormat.JSON or isinstance(layer, dict) else layer

    def _layers(self) -> list:
        verbosity = self.engine.profiling_verbosity
        if verbosity == ProfilingVerbosity.DETAILED:
            return fake_inspector.records(self.engine.proto, FAKE[0].inspector, self._shapes_known())
        if verbosity == ProfilingVerbosity.LAYER_NAMES_ONLY:
            return [layer.name for layer in fake_inspector.engine_layers(self.engine.proto, FAKE[0].inspector)]
        return []

    def _shapes_known(self) -> bool:
        dynamic = [name for name, (mode, dims, _) in self.engine.io.items()
                   if mode == TensorIOMode.INPUT and -1 in dims]
        context = self.execution_context
        return all(name in (context.shapes if context is not None else {}) for name in dynamic)


class HostMemory(bytes):
    """``IHostMemory``: a buffer, also a context manager (Polygraphy writes ``with cache.serialize() as buf``)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class FakeTensor:
    """An ``ITensor`` of the network: name, dtype, shape with -1 for a dynamic dimension, the ONNX elem type."""

    is_shape_tensor = False

    def __init__(self, name: str, dtype: DataType, shape: tuple, elem_type: int = 1):
        self.name, self.dtype, self.shape, self.elem_type = name, dtype, shape, elem_type
        self.network = None

    @property
    def is_network_output(self) -> bool:
        return self.network is not None and self in self.network.outputs


class FakeLayer:
    """``ILayer``: one ONNX node of the parsed graph, its type and its input and output tensors (what Polygraphy's
    ``ModifyNetworkOutputs(MARK_ALL)`` walks to mark every layer's outputs)."""

    TYPES = {"Conv": "CONVOLUTION", "MatMul": "MATRIX_MULTIPLY", "Gemm": "MATRIX_MULTIPLY", "Relu": "ACTIVATION",
             "Sigmoid": "ACTIVATION", "Add": "ELEMENTWISE", "Mul": "ELEMENTWISE", "Sub": "ELEMENTWISE",
             "Div": "ELEMENTWISE", "Cast": "CAST", "Constant": "CONSTANT", "Shape": "SHAPE", "Reshape": "SHUFFLE",
             "Flatten": "SHUFFLE", "Transpose": "SHUFFLE", "MaxPool": "POOLING", "AveragePool": "POOLING",
             "GlobalAveragePool": "REDUCE", "ReduceMean": "REDUCE", "QuantizeLinear": "QUANTIZE",
             "DequantizeLinear": "DEQUANTIZE", "BatchNormalization": "SCALE", "Softmax": "SOFTMAX"}

    def __init__(self, node, tensors: dict):
        self.name = node.name
        self.type = LayerType[self.TYPES.get(node.op_type, "UNARY")]
        self.inputs = [tensors.get(n) for n in node.input]
        self.outputs = [tensors[n] for n in node.output if n]

    @property
    def num_inputs(self) -> int:
        return len(self.inputs)

    @property
    def num_outputs(self) -> int:
        return len(self.outputs)

    def get_input(self, index: int):
        return self.inputs[index]

    def get_output(self, index: int):
        return self.outputs[index]


class FakeNetwork:
    """``INetworkDefinition``, filled by the parser: its inputs, its layers (one per ONNX node, with typed tensors),
    the outputs marked on it, and the ONNX model it came from."""

    def __init__(self, flags: int):
        self.flags, self.inputs, self.onnx, self.layers, self.outputs = flags, [], None, [], []

    def get_flag(self, flag) -> bool:
        return bool(self.flags & (1 << int(flag)))

    @property
    def num_inputs(self) -> int:
        return len(self.inputs)

    def get_input(self, index: int) -> FakeTensor:
        return self.inputs[index]

    @property
    def num_outputs(self) -> int:
        return len(self.outputs)

    def get_output(self, index: int) -> FakeTensor:
        return self.outputs[index]

    def mark_output(self, tensor: FakeTensor) -> None:
        FAKE[0].record("mark_output", tensor.name)
        if tensor not in self.outputs:
            self.outputs.append(tensor)

    def unmark_output(self, tensor: FakeTensor) -> None:
        self.outputs.remove(tensor)

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def __iter__(self):
        return iter(self.layers)


class ParserError:
    def __init__(self, text: str):
        self.text = text

    def desc(self) -> str:
        return self.text

    def __str__(self) -> str:
        return self.text


class OnnxParser:
    """``OnnxParser(network, logger)``: reads the ONNX file into the network's inputs; ``fail["parse"]`` (a
    message) makes it report that error as TensorRT's parser does (logger ERROR, ``num_errors``, False)."""

    def __init__(self, network: FakeNetwork, logger):
        self.network, self.logger, self.errors = network, logger, []
        FAKE[0].record("OnnxParser")

    def parse_from_file(self, model: str) -> bool:
        FAKE[0].record("parse_from_file", model)
        import onnx

        try:
            proto = onnx.load(model)  # with its external data, as the parser reads it beside the file
        except Exception as exc:
            return self._error(f"ModelImporter.cpp:771: Failed to parse ONNX model from file: {model}: {exc}")
        return self._read(proto)

    def parse(self, model, path: str | None = None) -> bool:
        FAKE[0].record("parse", path)
        import onnx

        try:
            return self._read(onnx.load_from_string(bytes(model)))
        except Exception as exc:
            return self._error(f"ModelImporter.cpp:771: Failed to parse ONNX model: {exc}")

    def _read(self, proto) -> bool:
        if FAKE[0].fail.get("parse"):
            return self._error(FAKE[0].fail["parse"])
        initializers = {t.name for t in proto.graph.initializer}
        for value in proto.graph.input:
            if value.name in initializers:
                continue
            dims = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in value.type.tensor_type.shape.dim)
            self.network.inputs.append(FakeTensor(value.name, _ONNX_TYPES[value.type.tensor_type.elem_type][0], dims))
        self.network.onnx = proto.SerializeToString()
        self._layers(proto)
        self.logger.log(Severity.INFO, f"----- Parsing of ONNX model {proto.graph.name} is Done ----")
        return True

    def _layers(self, proto) -> None:
        """One layer per node, its tensors typed by ONNX shape inference; the graph's outputs marked."""
        import onnx

        inferred = onnx.shape_inference.infer_shapes(proto)
        tensors = {t.name: t for t in self.network.inputs}
        for value in [*inferred.graph.value_info, *inferred.graph.output]:
            elem = value.type.tensor_type.elem_type
            dims = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in value.type.tensor_type.shape.dim)
            if elem in _ONNX_TYPES:
                tensors[value.name] = FakeTensor(value.name, _ONNX_TYPES[elem][0], dims, elem)
        for node in proto.graph.node:
            for out in node.output:
                tensors.setdefault(out, FakeTensor(out, DataType.FLOAT, (), 1))
            self.network.layers.append(FakeLayer(node, tensors))
        for tensor in tensors.values():
            tensor.network = self.network
        self.network.outputs = [tensors[o.name] for o in proto.graph.output]

    def _error(self, text: str) -> bool:
        self.errors.append(ParserError(text))
        self.logger.log(Severity.ERROR, text)
        return False

    @property
    def num_errors(self) -> int:
        return len(self.errors)

    def get_error(self, index: int) -> ParserError:
        return self.errors[index]

    def clear_errors(self) -> None:
        self.errors.clear()


class FakeOptimizationProfile:
    """``IOptimizationProfile``: ``set_shape(input, min, opt, max)``; valid (truthy) when min <= opt <= max."""

    def __init__(self):
        self.shapes: dict = {}

    def set_shape(self, input: str, min, opt, max) -> None:
        self.shapes[input] = tuple(tuple(int(d) for d in dims) for dims in (min, opt, max))
        FAKE[0].record("set_shape", input, *self.shapes[input])

    def get_shape(self, input: str) -> list:
        return list(self.shapes[input])

    def __bool__(self) -> bool:
        return bool(self.shapes) and all(len(lo) == len(mid) == len(hi) and all(a <= b <= c for a, b, c in
                                         zip(lo, mid, hi, strict=True)) for lo, mid, hi in self.shapes.values())


class FakeTimingCache:
    """``ITimingCache``: a set of entries, serialized as JSON; the build adds one per engine it builds."""

    def __init__(self, data: bytes):
        self.entries = set(json.loads(data)["entries"]) if data else set()

    def serialize(self) -> HostMemory:
        return HostMemory(json.dumps({"entries": sorted(self.entries)}).encode())

    def combine(self, input_cache: "FakeTimingCache", ignore_mismatch: bool) -> bool:
        self.entries |= input_cache.entries
        return True


class FakeBuilderConfig:
    """``IBuilderConfig``: flags, profiles, timing cache and optimization level, every change recorded."""

    DLA_core = -1
    default_device_type = DeviceType.GPU
    profiling_verbosity = ProfilingVerbosity.LAYER_NAMES_ONLY

    def __init__(self):
        self.flags = {FAKE[0].BuilderFlag.TF32}  # TensorRT's default: TF32 on
        self.profiles: list = []
        self.timing_cache = None
        self.builder_optimization_level = 3

    def set_flag(self, flag) -> None:
        FAKE[0].record("set_flag", FAKE[0].BuilderFlag(flag).name)
        self.flags.add(FAKE[0].BuilderFlag(flag))

    def clear_flag(self, flag) -> None:
        FAKE[0].record("clear_flag", FAKE[0].BuilderFlag(flag).name)
        self.flags.discard(FAKE[0].BuilderFlag(flag))

    def get_flag(self, flag) -> bool:
        return FAKE[0].BuilderFlag(flag) in self.flags

    def add_optimization_profile(self, profile: FakeOptimizationProfile) -> int:
        if not profile:
            return -1
        self.profiles.append(profile)
        return len(self.profiles) - 1

    @property
    def num_optimization_profiles(self) -> int:
        return len(self.profiles)

    def create_timing_cache(self, serialized_timing_cache) -> FakeTimingCache:
        FAKE[0].record("create_timing_cache", len(bytes(serialized_timing_cache)))
        return FakeTimingCache(bytes(serialized_timing_cache))

    def set_timing_cache(self, cache: FakeTimingCache, ignore_mismatch: bool) -> bool:
        self.timing_cache = cache
        return True

    def get_timing_cache(self) -> FakeTimingCache:
        return self.timing_cache


class Builder:
    """``Builder(logger)``: networks, configs, profiles, and ``build_serialized_network``, which writes the fake
    engine (:func:`serialize`) and checks what TensorRT checks: a profile for every dynamic input, and no
    precision flag on a strongly typed network."""

    def __init__(self, logger):
        self.logger = logger
        FAKE[0].record("Builder")

    def create_network(self, flags: int = 0) -> FakeNetwork:
        FAKE[0].record("create_network", flags)
        return FakeNetwork(flags)

    def create_builder_config(self) -> FakeBuilderConfig:
        FAKE[0].configs.append(FakeBuilderConfig())
        return FAKE[0].configs[-1]

    def create_optimization_profile(self) -> FakeOptimizationProfile:
        return FakeOptimizationProfile()

    def build_serialized_network(self, network: FakeNetwork, config: FakeBuilderConfig) -> HostMemory | None:
        FAKE[0].record("build_serialized_network")
        error = self._check(network, config)
        if error:
            self.logger.log(Severity.ERROR,
                            f"IBuilder::buildSerializedNetwork: Error Code 4: API Usage Error ({error})")
            return None
        (inp,) = network.inputs
        lo, mid, hi = config.profiles[0].shapes[inp.name]
        if config.timing_cache is not None:
            config.timing_cache.entries.add(hashlib.sha256(network.onnx).hexdigest()[:16])
        self.logger.log(Severity.INFO, f"Total Activation Memory: {4 * int(np.prod(hi))} bytes")
        import onnx

        graph_outputs = {o.name for o in onnx.load_from_string(network.onnx).graph.output}
        marked = {t.name: [t.elem_type, list(t.shape)] for t in network.outputs if t.name not in graph_outputs}
        header = {"strongly_typed": self._strongly_typed(network), "tensorrt": FAKE[0].version, "marked": marked,
                  "flags": sorted(f.name for f in config.flags), "level": config.builder_optimization_level,
                  "profiling_verbosity": ProfilingVerbosity(config.profiling_verbosity).name}
        return HostMemory(serialize(network.onnx, {"min": list(lo), "opt": list(mid), "max": list(hi)}, **header))

    @staticmethod
    def _strongly_typed(network: FakeNetwork) -> bool:
        """TensorRT 11: every network (the flag is deprecated and ignored); 10.x: with STRONGLY_TYPED."""
        return FAKE[0].major >= 11 or network.get_flag(FAKE[0].NetworkDefinitionCreationFlag.STRONGLY_TYPED)

    @staticmethod
    def _check(network: FakeNetwork, config: FakeBuilderConfig) -> str:
        if network.onnx is None:
            return "the network is empty (nothing was parsed)"
        typed = Builder._strongly_typed(network)
        weak = sorted(f.name for f in config.flags if f.name in PRECISION_FLAG_NAMES)
        if typed and weak:
            return f"precision flags {weak} are not allowed on a strongly typed network"
        for inp in network.inputs:
            if -1 in inp.shape and not any(inp.name in p.shapes for p in config.profiles):
                return f"Network has dynamic or shape inputs, but no optimization profile has been defined ({inp.name})"
        return ""

FAKE: list = []
VIRTUAL_TENSOR: list = []  # one subclass of torch.Tensor for every test


class FakeTensorRT:
    """The state of one installed fake: calls, violations, injected failures."""

    def __init__(self):
        self.calls, self.violations, self.runs, self.capture_modes = [], [], [], []
        self.configs: list[FakeBuilderConfig] = []
        self.fail: dict = {}
        self.inspector = fake_inspector.Options()  # how the engine inspector writes (TensorRT 10 or 11, Myelin)
        self.live: dict = {}  # address -> (allocation id, bytes, is_alive())
        self.libcudart: str | None = None  # what Polygraphy's CUDA wrapper loaded (cuda_wrapper_class)
        self.version, self.major = VERSIONS["10"], 10  # tensorrt.__version__: install() sets it
        self.BuilderFlag, self.NetworkDefinitionCreationFlag = BuilderFlag, NetworkDefinitionCreationFlag
        self.ids = itertools.count(1)
        self.tensor_class = VIRTUAL_TENSOR[0] if VIRTUAL_TENSOR else VIRTUAL_TENSOR.append(_virtual_tensor_class()) \
            or VIRTUAL_TENSOR[0]

    def record(self, *call):
        self.calls.append(call)

    def violation(self, text: str):
        self.violations.append(text)
        return False

    def block_at(self, ptr: int):
        for start, (block_id, nbytes, alive) in self.live.items():
            if start <= ptr < start + max(nbytes, 1) and alive():
                return block_id, nbytes - (ptr - start)
        return None

    def stream(self, handle: int, call: str):
        """The virtual device's stream with this handle, or None (a violation: CUDA would fail or crash)."""
        stream = vc.DEVICE[0].stream(handle)
        if stream is None:
            self.violation(f"{call}({handle:#x}): not a stream of this device")
        return stream

    def device_memory_track(self, tensor):
        """Register a torch tensor as a device allocation (tracked by weak reference)."""
        ref = weakref.ref(tensor)
        self.live[tensor.data_ptr()] = (next(self.ids), tensor.nbytes, lambda: ref() is not None)
        return tensor

    @contextlib.contextmanager
    def graph(self, graph, pool=None, stream=None, capture_error_mode="global"):
        self.capture_modes.append(capture_error_mode)
        if capture_error_mode != "thread_local":
            self.violation(f"torch.cuda.graph(capture_error_mode={capture_error_mode!r}): TensorRT's enqueue must "
                           "be captured in thread-local mode")
        with vc.graph_capture(graph, pool, stream, capture_error_mode):
            yield


class VirtualTorch:
    """What Polygraphy's ``TrtRunner`` sees as ``torch``: the real module, but ``torch.empty(..., device="cuda")``
    (its output allocator) allocates on the virtual device."""

    def __init__(self, fake: FakeTensorRT):
        import torch

        self._torch, self._memory = torch, FakeDeviceMemory(fake)

    def empty(self, *shape, dtype=None, device=None, **kwargs):
        if str(device).startswith("cuda"):
            size = shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
            return self._memory.empty(tuple(size), dtype or self._torch.float32)
        return self._torch.empty(*shape, dtype=dtype, device=device, **kwargs)

    def __getattr__(self, name):
        return getattr(self._torch, name)


def serialize(onnx_bytes: bytes, profile: dict, **header) -> bytes:
    """What the fake builder writes: the ONNX model behind a header (its profile, what the config held, and the
    TensorRT version that built it: the installed fake's unless given)."""
    header.setdefault("tensorrt", FAKE[0].version if FAKE else VERSIONS["10"])
    return MAGIC + json.dumps({"profile": profile, **header}).encode() + b"\n" + onnx_bytes


def install(monkeypatch, *, gpu_name: str = "Fake GPU (tests/fake_tensorrt.py)",
            version: str = "10") -> FakeTensorRT:
    """Put the fake in place for this test: ``import tensorrt``, Polygraphy's CUDA wrapper, the runner's device
    memory and torch's CUDA stream/event/graph calls, and a GPU for :mod:`pipeline.core.env`. ``version``: "10"
    (TensorRT 10.13), "11" (TensorRT 11.1: its bindings' flags exactly, :func:`enums_11`) or a full version."""
    import sys

    from polygraphy import cuda as pcuda

    from pipeline.core import env
    from pipeline.runtime import runners

    fake = FakeTensorRT()
    FAKE[:] = [fake]
    module = types.ModuleType("tensorrt")
    module.__version__ = fake.version = VERSIONS.get(version, version)
    fake.major = fake.inspector.version = int(fake.version.split(".")[0])
    if fake.major >= 11:  # exactly TensorRT 11.1's flags: weak typing's are gone
        fake.BuilderFlag, fake.NetworkDefinitionCreationFlag = enums_11()
    for name, value in dict(DataType=DataType, TensorIOMode=TensorIOMode, TensorFormat=TensorFormat,
                            ILogger=ILogger, Logger=Logger, IOutputAllocator=IOutputAllocator,
                            IDebugListener=IDebugListener, Runtime=Runtime, ICudaEngine=ICudaEngine,
                            IExecutionContext=FakeContext, float32=DataType.FLOAT, float16=DataType.HALF,
                            int8=DataType.INT8, int32=DataType.INT32, bool=DataType.BOOL, bfloat16=DataType.BF16,
                            int64=DataType.INT64, LayerType=LayerType, ILayer=FakeLayer, ITensor=FakeTensor,
                            Builder=Builder, OnnxParser=OnnxParser, BuilderFlag=fake.BuilderFlag,
                            NetworkDefinitionCreationFlag=fake.NetworkDefinitionCreationFlag, DeviceType=DeviceType,
                            ProfilingVerbosity=ProfilingVerbosity, IHostMemory=HostMemory,
                            LayerInformationFormat=LayerInformationFormat, EngineInspector=EngineInspector,
                            ITimingCache=FakeTimingCache, IBuilderConfig=FakeBuilderConfig,
                            INetworkDefinition=FakeNetwork, IOptimizationProfile=FakeOptimizationProfile,
                            init_libnvinfer_plugins=lambda logger, namespace: True).items():
        setattr(module, name, value)
    monkeypatch.setitem(sys.modules, "tensorrt", module)
    forget_imported_tensorrt()
    env.tensorrt_status.cache_clear()
    monkeypatch.setattr(env, "cuda_status", lambda: (True, ""))
    monkeypatch.setattr(env, "gpu_info", lambda: {"name": gpu_name, "compute_capability": "0.0", "cuda": None,
                                                  "driver": None})
    # Polygraphy's CUDA wrapper is made on first use, through its real library search (cuda_wrapper_class), on a
    # machine whose CUDA runtime is the pip CUDA 13 wheel's (pip_cuda13_site), LD_LIBRARY_PATH unset.
    monkeypatch.setattr(pcuda.cuda, "G_CUDA", None)
    monkeypatch.setattr(pcuda.cuda, "Cuda", cuda_wrapper_class(fake))
    monkeypatch.setattr(sys, "path", [pip_cuda13_site(), *sys.path])
    monkeypatch.delenv("LD_LIBRARY_PATH", raising=False)
    monkeypatch.setattr(runners, "DEVICE_MEMORY", FakeDeviceMemory(fake))
    install_virtual_cuda(monkeypatch, fake, gpu_name)
    return fake


def forget_imported_tensorrt() -> None:
    """Polygraphy's modules reach TensorRT through ``mod.lazy_import("tensorrt")`` objects that import it once and
    keep it: make every one of them import again, so they see this test's fake (its 10.x or 11.x mode), not the
    first test's."""
    import sys

    for name, loaded in list(sys.modules.items()):
        if not name.startswith("polygraphy"):
            continue
        for value in list(vars(loaded).values()):
            if type(value).__name__ == "LazyModule" and "module" in vars(value):
                held = vars(value)["module"]
                if held is not None and getattr(held, "__name__", "") == "tensorrt":
                    object.__setattr__(value, "module", None)


def fresh_process(monkeypatch) -> None:
    """What a new Python process (a script such as scripts/gpu_timing_check.py) starts with: no CUDA wrapper made
    yet, LD_LIBRARY_PATH as the machine sets it (unset), whatever earlier steps of this test exposed."""
    from polygraphy import cuda as pcuda

    monkeypatch.setattr(pcuda.cuda, "G_CUDA", None)
    monkeypatch.delenv("LD_LIBRARY_PATH", raising=False)
    FAKE[0].libcudart = None


def install_virtual_cuda(monkeypatch, fake: FakeTensorRT, gpu_name: str) -> vc.Device:
    """A fresh virtual device behind torch.cuda's streams, events and graphs, Polygraphy's view of torch
    (``torch.cuda.is_available()`` is True, so ``TrtRunner`` takes its torch-tensor path, and a torch tensor is
    "on the GPU" when it lies in a device allocation), and the runners' host clock."""
    import torch
    from polygraphy.backend.trt import runner as polygraphy_runner
    from polygraphy.util import array

    from pipeline.runtime import runners

    device = vc.Device()
    vc.DEVICE[:] = [device]
    stream = device.new_stream(blocking=True, handle=STREAM)
    assert stream.handle == STREAM
    device.device_memory = lambda ptr: fake.block_at(ptr) is not None
    for name, value in dict(Stream=lambda *a, **k: device.new_stream(blocking=False),  # PyTorch's pool: non-blocking
                            ExternalStream=lambda ptr, *a, **k: fake.stream(ptr, "ExternalStream"),
                            Event=vc.Event, CUDAGraph=vc.Graph, graph=fake.graph, stream=vc.stream_context,
                            current_stream=lambda *a: device.current, default_stream=lambda *a: device.legacy,
                            synchronize=lambda *a: device.synchronize(), is_available=lambda: True,
                            get_device_name=lambda *a: gpu_name).items():
        monkeypatch.setattr(torch.cuda, name, value)
    monkeypatch.setattr(polygraphy_runner, "torch", VirtualTorch(fake))
    real_on_gpu = array.is_on_gpu

    def is_on_gpu(obj) -> bool:
        return fake.block_at(obj.data_ptr()) is not None if isinstance(obj, torch.Tensor) else real_on_gpu(obj)

    monkeypatch.setattr(array, "is_on_gpu", is_on_gpu)
    monkeypatch.setattr(array, "is_on_cpu", lambda obj: not is_on_gpu(obj))
    monkeypatch.setattr(runners, "host_ms", lambda: device.host / 1e6)
    return device
