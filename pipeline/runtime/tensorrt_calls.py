"""TensorRT's bool-returning calls, checked: shared by the runners and the engine inspection (no TensorRT import)."""


class TensorrtCallFailed(RuntimeError):
    """A TensorRT binding returned False (or a CUDA graph capture failed): nothing may be timed after it."""


def checked(ok, call: str) -> None:
    """TensorRT's ``set_input_shape``, ``set_tensor_address`` and ``execute_async_v3`` return bool: a False
    means the call did nothing (TensorRT logged why), so raise instead of timing an empty launch."""
    if not ok:
        raise TensorrtCallFailed(f"TensorRT {call} returned False (its log above says why)")
