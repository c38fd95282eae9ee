"""Triton's stock ``openvino`` and ``onnxruntime`` backends, reproduced from their sources: what a Triton server does
with a model folder that deploy wrote, executed here on the files as they are on disk.

The ``tritonserver`` this machine has (the ``nvidia-pytriton`` wheel) ships the Python backend only, so the C++
backends that the repository names are reproduced the way ``tests/fake_tensorrt.py`` reproduces TensorRT: each
behaviour that decides what comes back is one function below, named after the place in the backend's source it
follows (``tests/test_triton_stock.py`` holds each to its line):

- ``openvino``: triton-inference-server/openvino_backend ``src/openvino.cc`` (r25.08, 64651dcd5a7e; r24.10, the
  release of the wheel's Triton 2.51, has the same logic): parameter parsing (:func:`openvino_bool`,
  :func:`openvino_properties`), ``max_batch_size`` autocomplete (:func:`openvino_autocomplete_max_batch`), the fixed
  batch (``ov::set_batch(max_batch_size)``) and its padding (:class:`OpenVinoBatching`), the output batch check,
  compiling on the CPU with the parameters' properties, and the precision the CPU plugin then computes in.
- ``onnxruntime``: triton-inference-server/onnxruntime_backend ``src/onnxruntime.cc`` (r25.08, 78357801c133): the graph
  optimisation level (:func:`onnxruntime_optimization_level`), the execution mode and thread counts
  (:func:`onnxruntime_session_settings`), the CPU or CUDA provider by instance kind.
- Triton's core around them (triton-inference-server/core ``src/model_config_utils.cc`` and the dynamic batcher):
  a request's shape against ``dims`` and ``max_batch_size`` (:func:`request_problem`), one execution per request
  without batching, requests gathered up to ``max_batch_size`` with it, ``count`` instances per model.

:class:`Repository` loads every model folder of a repository (``config.pbtxt`` parsed as Triton's ``ModelConfig``,
the model file read from ``1/``) and answers :meth:`Repository.infer` thread-safely, as a server would. Errors are
the backend's own messages, raised as :class:`StockError`.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pipeline.core.errors import InputError, first_line
from pipeline.runtime.serving import triton

VERSION_FOLDER = "1"
# The CPU the stock backends are run as: None, this one; True/False, one with/without bf16 units (a test's simulation
# of the other kind of CPU: OpenVINO's precision then reported as that CPU's, openvino_precision).
SIMULATED_CPU_BF16: bool | None = None
DEFAULT_FILENAMES = {"openvino": "model.xml", "onnxruntime": "model.onnx", "tensorrt_plan": "model.plan"}


class StockError(Exception):
    """What the stock backend (or Triton's core) answers instead of outputs: its own error text."""


# --------------------------------------------------------------------------- parameters


def parameters(config) -> dict[str, str]:
    """``parameters { key: ... value { string_value: ... } }`` as a dict (Triton hands backends the string values)."""
    return {key: value.string_value for key, value in config.parameters.items()}


def openvino_bool(value: str) -> bool:
    """openvino.cc:297-313 ``ParseBoolParameter``: true only for "yes" in any case; anything else (absent, "true",
    "1") leaves the setting false."""
    return value.lower() == "yes"


@dataclass(frozen=True)
class OpenVinoSettings:
    """What openvino.cc:235-272 reads from ``parameters``."""

    skip_dynamic_batchsize: bool = False
    enable_batch_padding: bool = False
    reshape_io_layers: bool = False
    properties: tuple[tuple[str, object], ...] = ()  # CPU properties, in the order the backend sets them


def _is_number(value: str) -> bool:
    """openvino.cc:48-54 ``IsNumber``: every character a digit (so no sign: non-negative)."""
    return bool(value) and all(c.isdigit() for c in value)


def openvino_properties(params: dict[str, str]) -> tuple[tuple[str, object], ...]:
    """openvino.cc:253-272 and 333-405 (``ParseParameters(device)``, ``ParseParameterHelper``): the CPU properties,
    read in the order INFERENCE_NUM_THREADS, COMPILATION_NUM_THREADS, HINT_BF16, NUM_STREAMS, PERFORMANCE_HINT;
    values compared lower-cased; an empty or absent one is skipped, an invalid one is the backend's error. Other keys
    are not read. ``HINT_BF16`` accepts only YES and sets ``inference_precision(bf16)``: no parameter asks for f32."""
    out: list[tuple[str, object]] = []
    for key in ("INFERENCE_NUM_THREADS", "COMPILATION_NUM_THREADS", "HINT_BF16", "NUM_STREAMS", "PERFORMANCE_HINT"):
        value = params.get(key, "").lower()
        if not value:
            continue
        if key in ("INFERENCE_NUM_THREADS", "COMPILATION_NUM_THREADS"):
            if not _is_number(value):
                raise StockError(f"expected the parameter '{key}' to be a non-negative number, got {value}")
            out.append((key, int(value)))
        elif key == "HINT_BF16":
            if value != "yes":
                raise StockError(f"expected the parameter '{key}' to be YES, got {value}")
            out.append(("INFERENCE_PRECISION_HINT", "bf16"))
        elif key == "NUM_STREAMS":
            if value in ("auto", "numa"):
                out.append((key, value.upper()))
            elif _is_number(value):
                out.append((key, int(value)))
            else:
                raise StockError(f"expected the parameter '{key}' to be either AUTO/NUMA/<int_value>, got {value}")
        else:
            modes = {"latency": "LATENCY", "throughput": "THROUGHPUT",
                     "cumulative_throughput": "CUMULATIVE_THROUGHPUT"}
            if value not in modes:
                raise StockError(f"expected the parameter '{key}' to be LATENCY/THROUGHPUT/CUMULATIVE_THROUGHPUT, "
                                 f"got {value}")
            out.append(("PERFORMANCE_HINT", modes[value]))
    return tuple(out)


def openvino_settings(params: dict[str, str]) -> OpenVinoSettings:
    """openvino.cc:235-250 (the model-wide booleans) and :func:`openvino_properties` (the CPU's)."""
    return OpenVinoSettings(openvino_bool(params.get("SKIP_OV_DYNAMIC_BATCHSIZE", "")),
                            openvino_bool(params.get("ENABLE_BATCH_PADDING", "")),
                            openvino_bool(params.get("RESHAPE_IO_LAYERS", "")), openvino_properties(params))


def openvino_autocomplete_max_batch(max_batch_size: int, layouts_have_batch: bool, default_max_batch_size: int) -> int:
    """openvino.cc:701-760 ``AutoCompleteBatching``: a model whose every input and output layout has a batch (``N``)
    and whose config says ``max_batch_size: 0`` is given ``max(default_max_batch_size, 1)`` (Triton's
    ``--backend-config=default-max-batch-size``, 4 unless set); otherwise the config's value stays."""
    if layouts_have_batch and max_batch_size == 0:
        return max(default_max_batch_size, 1)
    return max_batch_size


def openvino_allow_auto_batching(max_batch_size: int, skip_dynamic_batchsize: bool) -> bool:
    """openvino.cc:955-961: the compile property ``ALLOW_AUTO_BATCHING`` is on with batching, unless
    ``SKIP_OV_DYNAMIC_BATCHSIZE``."""
    return max_batch_size != 0 and not skip_dynamic_batchsize


@dataclass
class OpenVinoBatching:
    """openvino.cc:1032-1098 (``ProcessRequests``) and 1345-1363 (``ValidateOutputBatchSize``) for one instance.

    With ``max_batch_size`` > 0 the model's batch was fixed at ``max_batch_size`` (openvino.cc:596-600,
    ``ov::set_batch``): an execution whose requests do not add up to exactly that fails, unless
    ``ENABLE_BATCH_PADDING`` pads it with zeros. The pad size is kept on the instance and set only when a batch is
    short, never reset (openvino.cc:1049-1052): after one short batch, a full one is cut to the old short size and
    its output batch check fails. With ``max_batch_size`` 0 every request is an execution of its own (the batch is
    whatever the request's first dimension is)."""

    max_batch_size: int
    enable_padding: bool
    pad: int = 0

    def total(self, request_batches: Sequence[int]) -> int:
        """The execution's batch, or the backend's error for these requests."""
        if self.max_batch_size <= 0:
            total = len(request_batches)
            if total != 1:
                raise StockError(f"batch size {total} for the model, max allowed is {self.max_batch_size}")
            return total
        total = sum(request_batches)
        if total != self.max_batch_size:
            if not self.enable_padding:
                raise StockError(f"expected requests with batch size '{self.max_batch_size}', got '{total}'... this "
                                 "error can be avoided by setting 'ENABLE_BATCH_PADDING' parameter in model "
                                 "configuration to 'YES' at a performance cost.")
            self.pad = self.max_batch_size - total
        if total != 1 and total > self.max_batch_size:
            raise StockError(f"batch size {total} for the model, max allowed is {self.max_batch_size}")
        return total

    def output_rows(self, produced: int) -> int:
        """openvino.cc:1345-1363: rows of the output handed back (``max_batch_size - pad``), or the error."""
        if self.max_batch_size <= 0:
            return produced
        if produced != self.max_batch_size and produced != self.max_batch_size - self.pad:
            raise StockError(f"expected the batch size of openvino model output to be {self.max_batch_size}, got "
                             f"{produced}")
        return self.max_batch_size - self.pad


def openvino_precision(compiled_precision: str, hint_bf16: bool, cpu_bf16: bool | None) -> str:
    """The precision OpenVINO's CPU plugin computes in: what the compiled model reports (``INFERENCE_PRECISION_HINT``
    after compiling with the parameters' properties), or, where ``cpu_bf16`` simulates another CPU, that CPU's: bf16
    on one with bf16 units (its default, and the HINT_BF16 hint), f32 on one without (the hint cannot be honoured)."""
    if cpu_bf16 is None:
        return compiled_precision
    return "bf16" if cpu_bf16 else "f32"


# --------------------------------------------------------------------------- ONNX Runtime


def onnxruntime_optimization_level(config) -> str:
    """onnxruntime.cc:217-237: ``optimization { graph { level } }``: -1 basic, 1 extended, 2 none, anything else
    (0, absent) all; returned as ONNX Runtime's ``GraphOptimizationLevel`` member name."""
    level = config.optimization.graph.level if config.HasField("optimization") else 0
    return {-1: "ORT_ENABLE_BASIC", 1: "ORT_ENABLE_EXTENDED", 2: "ORT_DISABLE_ALL"}.get(level, "ORT_ENABLE_ALL")


def _int_parameter(params: dict[str, str], key: str) -> int:
    """``TryParseModelStringParameter`` (triton-inference-server/backend ``backend_common.cc``, called at
    onnxruntime.cc:246, 279, 295): an integer string value, 0 when absent, else an error."""
    value = params.get(key, "")
    if not value:
        return 0
    try:
        return int(value)
    except ValueError:
        raise StockError(f"failed to convert {key} '{value}' to integral number") from None


def onnxruntime_session_settings(params: dict[str, str]) -> dict[str, int]:
    """onnxruntime.cc:239-302 (the model's session options): ``execution_mode`` (0 sequential, 1 parallel, else an
    error), and the intra/inter-op thread counts, set only when > 0 (0: ONNX Runtime picks)."""
    mode = _int_parameter(params, "execution_mode")
    if mode not in (0, 1):
        raise StockError(f"Invalid configuration value provided. Expected values for  execution_mode are 0 or 1 but "
                         f"got {mode} .")
    return {"execution_mode": mode, "intra_op_thread_count": _int_parameter(params, "intra_op_thread_count"),
            "inter_op_thread_count": _int_parameter(params, "inter_op_thread_count")}


# --------------------------------------------------------------------------- Triton's core


def request_problem(shape: Sequence[int], dims: Sequence[int], max_batch_size: int) -> str:
    """Why Triton's core rejects a request of ``shape`` for an input declared with ``dims`` (the config's, without
    the batch when ``max_batch_size`` > 0); "" when it accepts it: the batch (first dimension) at most
    ``max_batch_size``, every other dimension equal to the declared one or the declared one -1."""
    rest = list(shape)
    if max_batch_size > 0:
        if not rest:
            return "a batching model's input needs a batch dimension"
        if rest[0] < 1 or rest[0] > max_batch_size:
            return f"inference request batch-size must be <= {max_batch_size}, got {rest[0]}"
        rest = rest[1:]
    if len(rest) != len(dims) or any(d != -1 and d != s for s, d in zip(rest, dims, strict=False)):
        return f"unexpected shape for input, model configuration specifies {list(dims)}, got {list(shape)}"
    return ""


# --------------------------------------------------------------------------- one model, as its backend runs it


@dataclass
class _Instance:
    """One model instance: its own infer request or session, one execution at a time."""

    run: object  # callable(batch) -> outputs of the concatenated batch
    batching: OpenVinoBatching | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)


class Model:
    """One model folder loaded as Triton loads it."""

    def __init__(self, folder: Path, *, cpu_bf16: bool | None = None, default_max_batch_size: int = 4):
        self.folder = folder
        self.config = triton.parse(_read_text(folder / triton_config_name()), folder / triton_config_name())
        self.name = self.config.name or folder.name
        self.kind = self.config.backend or self.config.platform
        filename = self.config.default_model_filename or DEFAULT_FILENAMES.get(self.kind, "")
        self.path = folder / VERSION_FOLDER / filename
        if not self.path.is_file() or self.path.is_symlink():
            raise StockError(f"unable to find '{self.path}' for model '{self.name}'")
        self.params = parameters(self.config)
        self.max_batch_size = self.config.max_batch_size
        self.input = self.config.input[0]
        self.output = self.config.output[0]
        self.precision: str | None = None  # what the backend computes in ("f32", "bf16"), where it says
        count = sum(max(g.count, 1) for g in self.config.instance_group) or 1
        gpu = any(g.kind == triton.model_config_pb2().ModelInstanceGroup.Kind.KIND_GPU
                  for g in self.config.instance_group)
        if self.kind == "openvino":
            self.instances = self._openvino(count, gpu, cpu_bf16, default_max_batch_size)
        elif self.kind == "onnxruntime":
            self.instances = self._onnxruntime(count, gpu)
        else:
            raise StockError(f"{self.kind} is not served on this machine (it needs a GPU and TensorRT)")
        self._next = 0
        self._pick = threading.Lock()

    # ----- openvino
    def _openvino(self, count: int, gpu: bool, cpu_bf16: bool | None, default_max_batch: int) -> list[_Instance]:
        import openvino as ov

        if gpu:  # openvino.cc:937-943
            raise StockError(f"unable to load model '{self.name}', Triton openVINO backend supports only CPU device")
        settings = openvino_settings(self.params)
        core = ov.Core()
        model = core.read_model(str(self.path))  # the .bin beside it, as the backend reads it
        has_batch = all(ov.layout_helpers.has_batch(ov.layout_helpers.get_layout(p))
                        for p in [*model.inputs, *model.outputs])
        self.max_batch_size = openvino_autocomplete_max_batch(self.max_batch_size, has_batch, default_max_batch)
        ppp = ov.preprocess.PrePostProcessor(model)
        for tensor in self.config.input:  # openvino.cc:520-590
            port = model.input(tensor.name)
            dims = list(tensor.reshape.shape) if tensor.HasField("reshape") else list(tensor.dims)
            problem = _dims_problem(port.get_partial_shape(), dims, self.max_batch_size)
            if problem and not settings.reshape_io_layers:
                raise StockError(f"model '{self.name}', tensor '{tensor.name}': {problem}")
            ppp.input(tensor.name).tensor().set_element_type(_ov_type(tensor.data_type))
            if self.max_batch_size:
                ppp.input(tensor.name).tensor().set_layout(ov.Layout("N..."))
        for tensor in self.config.output:  # openvino.cc:607-670
            dims = list(tensor.reshape.shape) if tensor.HasField("reshape") else list(tensor.dims)
            problem = _dims_problem(model.output(tensor.name).get_partial_shape(), dims, self.max_batch_size)
            if problem:
                raise StockError(f"model '{self.name}', tensor '{tensor.name}': {problem}")
            ppp.output(tensor.name).tensor().set_element_type(_ov_type(tensor.data_type))
        model = ppp.build()
        if self.max_batch_size:  # openvino.cc:596-600
            ov.set_batch(model, self.max_batch_size)
        properties = dict(settings.properties)
        properties["ALLOW_AUTO_BATCHING"] = openvino_allow_auto_batching(self.max_batch_size,
                                                                         settings.skip_dynamic_batchsize)
        try:
            compiled = core.compile_model(model, "CPU", properties)  # once per model, openvino.cc:430-450
        except RuntimeError as exc:
            raise StockError(f"loading model: {first_line(exc)[:300]}") from None
        reported = compiled.get_property("INFERENCE_PRECISION_HINT")
        self.precision = openvino_precision(reported.get_type_name() if hasattr(reported, "get_type_name")
                                            else str(reported), "INFERENCE_PRECISION_HINT" in properties, cpu_bf16)
        instances = []
        for _ in range(count):
            request = compiled.create_infer_request()
            batching = OpenVinoBatching(self.max_batch_size, settings.enable_batch_padding)
            instances.append(_Instance(_openvino_run(request, batching, self.input.name, self.output.name), batching))
        return instances

    # ----- onnxruntime
    def _onnxruntime(self, count: int, gpu: bool) -> list[_Instance]:
        import onnxruntime as ort

        settings = onnxruntime_session_settings(self.params)
        providers = ["CUDAExecutionProvider"] if gpu else ["CPUExecutionProvider"]
        if gpu and "CUDAExecutionProvider" not in ort.get_available_providers():
            raise StockError(f"{self.name}: KIND_GPU needs CUDA, which this machine does not have")
        instances = []
        for _ in range(count):  # a session per instance (onnxruntime.cc:1360-1370)
            options = ort.SessionOptions()
            options.graph_optimization_level = getattr(ort.GraphOptimizationLevel,
                                                       onnxruntime_optimization_level(self.config))
            options.execution_mode = (ort.ExecutionMode.ORT_PARALLEL if settings["execution_mode"]
                                      else ort.ExecutionMode.ORT_SEQUENTIAL)
            if settings["intra_op_thread_count"] > 0:
                options.intra_op_num_threads = settings["intra_op_thread_count"]
            if settings["inter_op_thread_count"] > 0:
                options.inter_op_num_threads = settings["inter_op_thread_count"]
            options.log_severity_level = 3
            try:
                session = ort.InferenceSession(str(self.path), options, providers=providers)
            except Exception as exc:  # noqa: BLE001 (ONNX Runtime raises its own types)
                raise StockError(f"{self.name}: ONNX Runtime could not load {self.path.name}: "
                                 f"{first_line(exc)[:300]}") from None
            instances.append(_Instance(_onnxruntime_run(session, self.input.name, self.output.name)))
        return instances

    # ----- serving
    def execute(self, requests: Sequence[np.ndarray]) -> list[np.ndarray]:
        """One execution of ``requests`` (gathered by the batcher) on the next free instance: each request's output."""
        with self._pick:
            instance = self.instances[self._next % len(self.instances)]
            self._next += 1
        with instance.lock:
            if instance.batching is not None:
                total = instance.batching.total([len(r) for r in requests] if self.max_batch_size > 0
                                                else [1] * len(requests))
            else:
                total = sum(len(r) for r in requests) if self.max_batch_size > 0 else len(requests)
                if self.max_batch_size <= 0 and total != 1:
                    raise StockError(f"batch size {total} for '{self.name}', max allowed is 0")
            batch = np.concatenate(requests) if len(requests) > 1 else requests[0]
            out = instance.run(batch)
        rows = np.cumsum([0, *[len(r) for r in requests]]) if self.max_batch_size > 0 else None
        if rows is None:
            return [out]
        if len(out) < rows[-1]:
            raise StockError(f"output batch {len(out)} for requests totalling {rows[-1]} (of {total})")
        return [out[rows[i]: rows[i + 1]] for i in range(len(requests))]


def _onnxruntime_run(session, input_name: str, output_name: str):
    def run(batch: np.ndarray) -> np.ndarray:
        try:
            return session.run([output_name], {input_name: batch})[0]
        except Exception as exc:  # noqa: BLE001 (ONNX Runtime raises its own types)
            raise StockError(f"onnx runtime error: {first_line(exc)[:300]}") from None

    return run


def _openvino_run(request, batching: OpenVinoBatching, input_name: str, output_name: str):
    def run(batch: np.ndarray) -> np.ndarray:
        if batching.max_batch_size > 0 and batching.pad:  # openvino.cc:1254-1275: zeros, then the requests
            padded = np.zeros((batching.max_batch_size, *batch.shape[1:]), batch.dtype)
            padded[: len(batch)] = batch
            batch = padded
        try:
            request.infer({input_name: np.ascontiguousarray(batch)})
        except RuntimeError as exc:
            raise StockError(f"running inference: {first_line(exc)[:300]}") from None
        out = request.get_tensor(output_name).data.copy()
        return out[: batching.output_rows(len(out))]

    return run


def _ov_type(data_type: int):
    import openvino as ov

    name = triton.model_config_pb2().DataType.Name(data_type)
    types = {"TYPE_FP32": ov.Type.f32, "TYPE_FP16": ov.Type.f16, "TYPE_BF16": ov.Type.bf16, "TYPE_UINT8": ov.Type.u8,
             "TYPE_INT8": ov.Type.i8, "TYPE_INT32": ov.Type.i32, "TYPE_INT64": ov.Type.i64}
    if name not in types:
        raise StockError(f"unsupported datatype {name}")
    return types[name]


def _dims_problem(shape, dims: Sequence[int], max_batch_size: int) -> str:
    """triton-inference-server/backend ``CompareDimsSupported`` (called at openvino.cc:577-581 and 661-663): with
    batching the model's first dimension is the batch (dynamic, or what set_batch makes it) and the rest must equal
    ``dims``; without, the whole shape must; a -1 on either side matches anything."""
    model_dims = [d.get_length() if d.is_static else -1 for d in shape]
    if max_batch_size > 0:
        if not model_dims:
            return "model has no batch dimension, but max_batch_size > 0"
        model_dims = model_dims[1:]
    if len(model_dims) != len(dims) or any(m != -1 and d != -1 and m != d for m, d in zip(model_dims, dims,
                                                                                             strict=False)):
        return f"model expects shape {model_dims}, configuration specifies {list(dims)}"
    return ""


def triton_config_name() -> str:
    from pipeline.core import artifacts

    return artifacts.TRITON_CONFIG


def _read_text(path: Path) -> str:
    from pipeline.core import schema

    try:
        return schema.read_bytes(path, "Triton model configuration", 1 << 20).decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read it ({first_line(exc)})") from None


# --------------------------------------------------------------------------- the repository, as a server


class Repository:
    """Every model folder of a repository, loaded with its stock backend, answering requests the way Triton's core
    schedules them: a batching model (``max_batch_size`` > 0 with ``dynamic_batching``) has its queued requests
    gathered up to ``max_batch_size`` images within ``max_queue_delay_microseconds`` by one scheduler thread per
    instance; any other gets one execution per request. Use it as a context manager (the threads stop on exit)."""

    def __init__(self, root: Path, names: Sequence[str], *, cpu_bf16: bool | None = None):
        self.root = root
        self.models: dict[str, Model] = {}
        self.errors: dict[str, str] = {}
        for name in names:
            try:
                self.models[name] = Model(root / name, cpu_bf16=cpu_bf16)
            except (StockError, InputError) as exc:
                self.errors[name] = str(exc)
        self._queues: dict[str, queue.Queue] = {}
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()
        for model in self.models.values():
            if model.max_batch_size > 0 and model.config.HasField("dynamic_batching"):
                self._queues[model.name] = queue.Queue()
                for _ in model.instances:
                    thread = threading.Thread(target=self._schedule, args=(model,), daemon=True)
                    thread.start()
                    self._threads.append(thread)

    def __enter__(self) -> Repository:
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(5)

    def infer(self, name: str, batch: np.ndarray) -> np.ndarray:
        """One request: ``batch`` for the model's first input; its first output (or the server's error)."""
        model = self.models[name]
        problem = request_problem(batch.shape, list(model.input.dims), model.max_batch_size)
        if problem:
            raise StockError(f"[request id: <id_unknown>] {problem}")
        if model.name not in self._queues:
            return model.execute([batch])[0]
        slot = _Slot(batch)
        self._queues[model.name].put(slot)
        slot.done.wait()
        if slot.error is not None:
            raise slot.error
        return slot.out

    def _schedule(self, model: Model) -> None:
        """The dynamic batcher of one instance: the first queued request, then whatever arrives within the delay
        while the batch stays within ``max_batch_size``."""
        waiting = self._queues[model.name]
        delay = model.config.dynamic_batching.max_queue_delay_microseconds / 1e6
        held: _Slot | None = None
        while not self._stop.is_set():
            first = held
            held = None
            if first is None:
                try:
                    first = waiting.get(timeout=0.05)
                except queue.Empty:
                    continue
            taken, size = [first], len(first.batch)
            deadline = time.perf_counter() + delay
            while size < model.max_batch_size:
                try:
                    nxt = waiting.get(timeout=max(0.0, deadline - time.perf_counter()))
                except queue.Empty:
                    break
                if size + len(nxt.batch) > model.max_batch_size:
                    held = nxt
                    break
                taken.append(nxt)
                size += len(nxt.batch)
            try:
                for slot, out in zip(taken, model.execute([s.batch for s in taken]), strict=True):
                    slot.out = out
            except StockError as exc:
                for slot in taken:
                    slot.error = exc
            finally:
                for slot in taken:
                    slot.done.set()


@dataclass
class _Slot:
    batch: np.ndarray
    out: np.ndarray | None = None
    error: StockError | None = None
    done: threading.Event = field(default_factory=threading.Event)
