"""The environment the pipeline records, and the install rules it relies on."""

from pipeline import env


def test_exactly_one_onnxruntime_distribution():
    """onnxruntime and onnxruntime-gpu overwrite each other's files; the install must bring one."""
    assert env.onnxruntime_conflict() is None
    assert env.package_version("onnxruntime") or env.package_version("onnxruntime-gpu")


def test_collect_names_the_machine():
    info = env.collect()
    assert info["cpu"] and info["cpu_cores"] >= 1 and info["torch"] and info["onnx"] and info["polygraphy"]
    assert isinstance(info["cpu_native_bf16"], bool)
    if info["gpu"] is None:
        assert env.cuda_status()[0] is False and env.cuda_status()[1]


def test_tensorrt_status_gives_a_reason():
    trt, reason = env.tensorrt_status()
    assert (trt is None) == bool(reason)
