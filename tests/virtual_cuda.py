"""A virtual CUDA device for the tests: a small discrete-event model of a GPU's streams, events and graphs.

It models the SEMANTICS that GPU timing code must respect, not a GPU's speed or TensorRT's kernels:

* time is virtual (integer nanoseconds): the host has a clock, every stream has a clock (when its last
  piece of work ends); nothing here reads the wall clock, so every timing is exact and repeatable;
* work is enqueued on the stream it was launched on and starts when that stream is free AND the host has
  finished launching it: a launch costs the host :data:`LAUNCH_NS`, and the work it launches starts no earlier
  than the end of that launch. So an event recorded on an idle stream right before a launch fires before the
  work starts, and the pair brackets the launch too (on a GPU: cudaLaunchKernel, cudaGraphLaunch, TensorRT's
  enqueue loop); only work queued ahead on the stream hides it. Kernels (an engine's ``execute_async_v3``, a
  graph replay) take :data:`LAYER_NS` per layer of the engine's ONNX graph, copies :data:`COPY_FIXED_NS` plus a
  cost per byte (pageable host memory costs twice as much per byte, and the host waits for such a copy), event
  records take no time;
* the legacy default stream (handle 0) orders with blocking streams (Polygraphy's ``cudaStreamCreate``
  streams) and not with non-blocking ones (``torch.cuda.Stream()``: PyTorch's pool streams are created
  with ``cudaStreamNonBlocking``);
* ``torch.cuda.current_stream()`` starts as the legacy default stream and ``with torch.cuda.stream(s)``
  changes it; an event records on the stream it is given (the current one when none is), and
  ``CUDAGraph.replay()`` launches on the CURRENT stream, as PyTorch's does;
* ``elapsed_time`` is the virtual time between two events, and raises when either has not completed
  (CUDA's ``cudaErrorNotReady``);
* data: a piece of work reads its sources when it starts and writes its destinations when it ends, and a
  copy into host memory fills the host buffer with poison (NaN, 0xFF bytes) as soon as it is enqueued; the
  host sees the result only after a synchronize (stream, event or device) that covers the copy;
* host costs: a launch costs the host :data:`LAUNCH_NS`, a call to the execution context's binding methods
  :data:`HOST_CALL_NS`, returning from a synchronize :data:`SYNC_NS` (TensorRT's enqueue adds its own, in the
  fake: :data:`ENQUEUE_NS` of set-up, one launch per layer, :data:`CALLBACK_NS` per Python output-allocator
  call). By default a launch is cheaper than the work it launches (:data:`LAUNCH_NS` < :data:`LAYER_NS`), so a
  stream kept busy ahead runs back to back and "GPU compute" measured that way is exactly the kernels' time; with
  ``VIRTUAL_CUDA_LAUNCH_NS`` above :data:`LAYER_NS` the host sets the pace (enqueue-bound: every timer measures
  the host);
* CUDA graphs: capture needs a stream that is not the legacy default stream; launches on the capture stream
  are recorded, not run; ``replay`` runs them as one launch. The capture-time rules of TensorRT (a warm-up
  enqueue before the capture, shapes fixed at capture) are checked by the fake execution context.

It does not model: concurrency inside a stream, several GPUs, memory bandwidth contention, launch latency
on the device side (between the launch's end and the work's start), jitter of any host cost, stream priorities,
per-thread default streams, events inside graphs, or any real kernel's speed. docs/gpu-validation.md says so too.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import os
import weakref
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

LAYER_NS = 20_000  # one layer (ONNX node) of an engine
COPY_FIXED_NS = 10_000  # one host<->device copy, before its bytes
PINNED_NS_PER_BYTE = 0.05  # 20 GB/s from page-locked memory
PAGEABLE_NS_PER_BYTE = 0.1  # staged through a driver buffer: half the speed, and synchronous for the host
# the host's cost of one launch (kernel, copy, graph replay); the work starts after it. VIRTUAL_CUDA_LAUNCH_NS sets
# another (read when this module is imported; tests set the attribute): above LAYER_NS the host sets the pace, as
# a Python enqueue slower than the kernels does on a fast GPU (a 32x32 ResNet-18 at batch 1 on an H200).
LAUNCH_NS = int(os.environ.get("VIRTUAL_CUDA_LAUNCH_NS", "2000"))
HOST_CALL_NS = 500  # the host's cost of one call to the execution context's binding methods
SYNC_NS = 5_000  # the host's cost of returning from a synchronize once the work is done
ENQUEUE_NS = 15_000  # TensorRT's enqueue on the host before it launches its first kernel (fake_tensorrt)
CALLBACK_NS = 30_000  # one Python callback from TensorRT's enqueue (Polygraphy's output allocator; fake_tensorrt)
LEGACY = 0  # the legacy default stream's handle
POISON = 0xFF  # a host byte not yet written by its copy: NaN as float32 and as float16


def copy_ns(nbytes: int, pinned: bool) -> int:
    return COPY_FIXED_NS + round(nbytes * (PINNED_NS_PER_BYTE if pinned else PAGEABLE_NS_PER_BYTE))


@dataclass
class Op:
    """One piece of work on a stream: its reads at ``start``, its writes at ``end``."""

    kind: str  # "kernel", "graph", "H2D", "D2H", "D2D"
    stream: int
    start: int
    end: int
    seq: int
    read: Callable[[], object] = lambda: None
    write: Callable[[object], None] = lambda data: None
    nbytes: int = 0
    pinned: bool = True
    snapshot: object = None


@dataclass
class Stream:
    handle: int
    blocking: bool
    device: "Device"
    ready: int = 0  # when its last piece of work ends

    # torch.cuda.Stream's interface
    @property
    def cuda_stream(self) -> int:
        return self.handle

    @property
    def ptr(self) -> int:
        return self.handle

    def synchronize(self) -> None:
        self.device.host_wait(self.ready)

    def query(self) -> bool:
        return self.ready <= self.device.host

    def wait_stream(self, other: "Stream") -> None:
        self.ready = max(self.ready, other.ready)

    def __eq__(self, other) -> bool:
        return isinstance(other, Stream) and other.handle == self.handle

    def __hash__(self) -> int:
        return self.handle


@dataclass
class Captured:
    kind: str
    duration: int
    run: Callable[[], None]


@dataclass
class Graph:
    """``torch.cuda.CUDAGraph``: the launches captured on its stream, replayed as one launch."""

    nodes: list = field(default_factory=list)
    captured: bool = False

    def replay(self) -> None:
        if not self.captured:
            raise RuntimeError("CUDA error: replay of a graph that was not captured")
        device = DEVICE[0]
        nodes = list(self.nodes)
        device.launch("graph", device.current, sum(n.duration for n in nodes),
                      read=lambda: None, write=lambda _: [n.run() for n in nodes])

    def reset(self) -> None:
        self.nodes, self.captured = [], False


class Event:
    """``torch.cuda.Event``: records the time its stream reaches it."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
        self.enable_timing, self.time, self.stream = enable_timing, None, None

    def record(self, stream: Stream | None = None) -> None:
        device = DEVICE[0]
        stream = stream or device.current
        self.time, self.stream = device.start_time(stream), stream.handle
        stream.ready = self.time
        device.events.append((self.time, stream.handle))

    def synchronize(self) -> None:
        if self.time is not None:
            DEVICE[0].host_wait(self.time)

    def query(self) -> bool:
        return self.time is None or self.time <= DEVICE[0].host

    def elapsed_time(self, end: "Event") -> float:
        if not (self.enable_timing and end.enable_timing):
            raise RuntimeError("CUDA error: invalid resource handle (an event created without enable_timing)")
        if self.time is None or end.time is None:
            raise RuntimeError("CUDA error: invalid resource handle (an event that was never recorded)")
        if not (self.query() and end.query()):
            raise RuntimeError("CUDA error: device not ready (elapsed_time of an event that has not completed)")
        return (end.time - self.time) / 1e6


class Device:
    """The one virtual GPU: streams, the host clock, pending work, and a log of what ran."""

    def __init__(self):
        self.host = 0
        self.handles = itertools.count(0x10000)  # 0x5EED is the fake's first stream (created by hand)
        self.seq = itertools.count()
        self.legacy = Stream(LEGACY, True, self)
        self.streams: dict[int, Stream] = {LEGACY: self.legacy}
        self.current = self.legacy
        self.pending: list[Op] = []
        self.done: list[Op] = []  # every op that completed, in order of completion
        self.events: list = []
        self.capture: tuple[Stream, Graph] | None = None
        self.pinned: dict[int, tuple[int, Callable[[], bool]]] = {}  # page-locked host memory
        self.device_memory: Callable[[int], bool] = lambda ptr: False  # set by the fake: is ptr device memory?

    # ------------------------------------------------------------------ streams and time
    def new_stream(self, blocking: bool, handle: int | None = None) -> Stream:
        stream = Stream(next(self.handles) if handle is None else handle, blocking, self)
        self.streams[stream.handle] = stream
        return stream

    def stream(self, handle: int) -> Stream | None:
        return self.streams.get(handle)

    def start_time(self, stream: Stream) -> int:
        """When work launched now on ``stream`` can start: the host has launched it, the stream is free, and
        the legacy default stream's implicit ordering with blocking streams holds."""
        t = max(self.host, stream.ready)
        if stream.handle == LEGACY:
            t = max([t] + [s.ready for s in self.streams.values() if s.blocking])
        elif stream.blocking:
            t = max(t, self.legacy.ready)
        return t

    def launch(self, kind: str, stream: Stream, duration: int, *, read, write, nbytes: int = 0,
               pinned: bool = True) -> Op | None:
        """Enqueue work; during a capture on ``stream`` it is recorded into the graph instead."""
        if self.capture is not None and self.capture[0] == stream:
            self.capture[1].nodes.append(Captured(kind, duration, lambda: write(read())))
            self.host += LAUNCH_NS
            return None
        if self.capture is not None and stream.handle == LEGACY:
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing "
                               "(work on the legacy default stream during a capture)")
        start = max(self.start_time(stream), self.host + LAUNCH_NS)  # not before the host has launched it
        op = Op(kind, stream.handle, start, start + duration, next(self.seq), read, write, nbytes, pinned)
        stream.ready = op.end
        self.pending.append(op)
        self.host += LAUNCH_NS
        return op

    def host_wait(self, until: int) -> None:
        """The host blocks until ``until`` (a synchronize): the work done by then becomes visible."""
        self.host = max(self.host, until) + SYNC_NS
        self.flush(until)

    def synchronize(self) -> None:
        self.host_wait(max(s.ready for s in self.streams.values()))

    def flush(self, until: int) -> None:
        """Carry out the data effects of the work that ended by ``until``: reads at start, writes at end."""
        finished = [op for op in self.pending if op.end <= until]
        self.pending = [op for op in self.pending if op.end > until]
        steps = sorted([(op.start, 1, op.seq, op) for op in finished] + [(op.end, 0, op.seq, op) for op in finished],
                       key=lambda s: s[:3])
        for _, phase, _, op in steps:
            if phase == 1:
                op.snapshot = op.read()
            else:
                op.write(op.snapshot)
                op.snapshot = None
                self.done.append(op)

    # ------------------------------------------------------------------ memory and copies
    def is_pinned(self, ptr: int) -> bool:
        return any(start <= ptr < start + max(n, 1) and alive() for start, (n, alive) in self.pinned.items())

    def pin(self, tensor) -> None:
        ref = weakref.ref(tensor)
        self.pinned[tensor.data_ptr()] = (tensor.nbytes, lambda: ref() is not None)

    def memcpy(self, dst: int, src: int, nbytes: int, stream: Stream | None) -> None:
        """``cudaMemcpyAsync`` on ``stream`` (``cudaMemcpy`` when None: legacy default stream, host waits)."""
        nbytes = int(nbytes)
        dst_dev, src_dev = self.device_memory(dst), self.device_memory(src)
        kind = {(True, False): "H2D", (False, True): "D2H", (True, True): "D2D"}.get((dst_dev, src_dev), "H2H")
        if kind == "H2H":
            ctypes.memmove(dst, src, nbytes)
            return
        host = dst if kind == "D2H" else src
        pinned = kind == "D2D" or self.is_pinned(host)
        if kind == "D2H" and (self.capture is None or self.capture[0] != (stream or self.legacy)):
            ctypes.memset(dst, POISON, nbytes)  # the host must not read this before a synchronize

        def alive(ptr: int, on_device: bool) -> bool:
            """Freed memory is neither read nor written (on a GPU: undefined behaviour, often a crash). A pageable
            host buffer is only touched while memcpy runs: such a copy is synchronous."""
            return self.device_memory(ptr) if on_device else (not pinned or self.is_pinned(ptr))

        def read() -> bytes:
            return ctypes.string_at(src, nbytes) if alive(src, src_dev) else bytes([POISON]) * nbytes

        def write(data: bytes) -> None:
            if alive(dst, dst_dev):
                ctypes.memmove(dst, data, nbytes)

        synchronous = stream is None or not pinned  # cudaMemcpy, or pageable memory: the host waits for the copy
        op = self.launch(kind, stream or self.legacy, copy_ns(nbytes, pinned), read=read, write=write,
                         nbytes=nbytes, pinned=pinned)
        if op is not None and synchronous:
            self.host_wait(op.end)

    # ------------------------------------------------------------------ what ran, for the tests
    def ops(self, kind: str | None = None) -> list[Op]:
        return [op for op in self.done if kind is None or op.kind == kind]


DEVICE: list[Device] = []


@contextlib.contextmanager
def stream_context(stream: Stream | None):
    """``with torch.cuda.stream(s)``: ``s`` is the current stream inside (None changes nothing)."""
    device = DEVICE[0]
    saved = device.current
    if stream is not None:
        device.current = stream
    try:
        yield
    finally:
        device.current = saved


@contextlib.contextmanager
def graph_capture(graph: Graph, pool=None, stream: Stream | None = None, capture_error_mode: str = "global"):
    """``torch.cuda.graph``: synchronizes the device, captures on ``stream`` (a new pool stream when None)."""
    device = DEVICE[0]
    stream = stream or device.new_stream(blocking=False)
    if stream.handle == LEGACY:
        raise RuntimeError("CUDA error: operation not supported (a graph cannot be captured on the legacy "
                           "default stream)")
    device.synchronize()
    graph.reset()
    device.capture = (stream, graph)
    try:
        with stream_context(stream):
            yield
    finally:
        device.capture = None
    graph.captured = True


def poisoned(array: np.ndarray) -> bool:
    """Whether a host array still holds the poison a copy left in it (all NaN)."""
    return bool(np.isnan(np.asarray(array, np.float32)).all())
