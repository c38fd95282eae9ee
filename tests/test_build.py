"""Build: the Polygraphy loader chain (lazy, inspected without TensorRT), skip/require, engine sidecar."""

import json

import pytest

from pipeline import build, config
from pipeline.run import RunDir


def pieces_for(tmp_path, **build_overrides):
    """The loader chain's pieces, inspected through their public attributes (no TensorRT needed)."""
    cfg = config.resolve(overrides=[f"build.{k}={v}" for k, v in build_overrides.items()] + ["verify.batch_size=8"])
    onnx_path = tmp_path / "model.fp16.onnx"
    onnx_path.write_bytes(b"not parsed until the loader is called")
    shapes = build.profile_shapes(cfg, [3, 32, 32])
    network = build.network_loader(onnx_path)
    builder_config = build.config_loader(input_name="input", shapes=shapes, build_cfg=cfg.build,
                                         timing_cache=tmp_path / "trt_timing.cache")
    loader = build.engine_loader(onnx_path, input_name="input", shapes=shapes, build_cfg=cfg.build,
                                 timing_cache=tmp_path / "trt_timing.cache")
    return network, builder_config, loader


def test_loader_chain_is_strongly_typed_with_profile_and_no_precision_flags(tmp_path):
    network, cfg, loader = pieces_for(tmp_path, min_batch=1, opt_batch=4, max_batch=16, optimization_level=5)
    assert network.strongly_typed is True
    assert str(network.path).endswith("model.fp16.onnx")
    # TensorRT 11 has no FP16/INT8/BF16/FP8 builder flags: none may be requested.
    assert (cfg.fp16, cfg.int8, cfg.bf16, cfg.fp8) == (False, False, False, False)
    assert cfg.precision_constraints is None
    assert cfg.tf32 is False  # a deliberate choice, recorded in the sidecar
    assert cfg.builder_optimization_level == 5
    (profile,) = cfg.profiles
    assert tuple(profile["input"].min) == (1, 3, 32, 32)
    assert tuple(profile["input"].opt) == (4, 3, 32, 32)
    assert tuple(profile["input"].max) == (16, 3, 32, 32)
    assert loader.timing_cache_path.endswith("trt_timing.cache")


def test_engine_loader_is_built_from_the_public_pieces(tmp_path, monkeypatch):
    seen = {}
    monkeypatch.setattr(build, "network_loader", lambda path: seen.setdefault("network", path))
    monkeypatch.setattr(build, "config_loader", lambda **kw: seen.setdefault("config", kw))
    cfg = config.resolve()
    build.engine_loader(tmp_path / "m.onnx", input_name="x", shapes=build.profile_shapes(cfg, [3, 8, 8]),
                        build_cfg=cfg.build, timing_cache=None)
    assert seen["network"] == tmp_path / "m.onnx" and seen["config"]["input_name"] == "x"


def test_tf32_is_configurable(tmp_path):
    _, cfg, _ = pieces_for(tmp_path, tf32="true")
    assert cfg.tf32 is True


def test_timing_cache_lives_beside_the_run_directories(tmp_path):
    cfg = config.resolve()
    assert build.timing_cache_path(cfg, RunDir(tmp_path / "runs" / "m")) == (tmp_path / "runs" / "trt_timing.cache")


def test_build_skips_with_reason_without_tensorrt(clone_run):
    from conftest import cli

    ok, reason = build.availability()
    if ok:
        pytest.skip("this machine can build engines")
    run = clone_run()
    assert cli("build", "--run-dir", run) == 0
    entry = json.loads((run / "manifest.json").read_text())["stages"]["build"]
    assert entry["status"] == "skipped" and entry["reason"] == reason
    assert not (run / build.ENGINE).exists()


def test_require_tensorrt_fails_with_exit_3(clone_run, capsys):
    from conftest import cli

    if build.availability()[0]:
        pytest.skip("TensorRT is available here")
    run = clone_run()
    assert cli("build", "--run-dir", run, "--require", "tensorrt") == 3
    assert "TensorRT engine required" in capsys.readouterr().err


PLATFORM = {"tensorrt": "11.4.0", "gpu": "NVIDIA H200", "compute_capability": "9.0"}


def fake_engine(tmp_path, **sidecar_changes):
    import hashlib

    engine = tmp_path / build.ENGINE
    engine.write_bytes(b"serialized engine bytes")
    sidecar = {"schema": build.SIDECAR_SCHEMA, "built_by": "pipeline 0.1.0", "engine": build.ENGINE,
               "sha256": hashlib.sha256(engine.read_bytes()).hexdigest(), **PLATFORM, **sidecar_changes}
    (tmp_path / build.SIDECAR).write_text(json.dumps(sidecar))
    run = RunDir(tmp_path)  # as the build stage records it: only recorded engines are loaded
    run.manifest["stages"]["build"] = {"status": "ok", "artifacts": {build.ENGINE: {
        "sha256": hashlib.sha256(engine.read_bytes()).hexdigest(), "bytes": engine.stat().st_size}}}
    return run


def test_engine_with_matching_sidecar_loads(tmp_path):
    data, sidecar = build.load_engine_bytes(fake_engine(tmp_path), platform=PLATFORM)
    assert data == b"serialized engine bytes" and sidecar["gpu"] == "NVIDIA H200"


@pytest.mark.parametrize("change, message", [
    ({"sha256": "0" * 64}, "does not match its sidecar"),
    ({"gpu": "NVIDIA A100-SXM4-80GB"}, "built for GPU NVIDIA A100"),
    ({"compute_capability": "8.0"}, "compute capability 8.0"),
    ({"tensorrt": "10.13.0"}, "TensorRT version 10.13.0"),
    ({"built_by": "someone else"}, "not a pipeline engine sidecar"),
    ({"schema": "other/1"}, "not a pipeline engine sidecar"),
])
def test_engine_refused_when_sidecar_does_not_match(tmp_path, change, message):
    from pipeline.errors import InputError

    run = fake_engine(tmp_path, **change)
    with pytest.raises(InputError, match=message) as err:
        build.load_engine_bytes(run, platform=PLATFORM)
    assert "rebuild" in str(err.value)


def test_tampered_engine_bytes_refused(tmp_path):
    from pipeline.errors import InputError

    run = fake_engine(tmp_path)
    (tmp_path / build.ENGINE).write_bytes(b"serialized engine bytes, with a payload appended")
    with pytest.raises(InputError, match="changed after the build"):
        build.load_engine_bytes(run, platform=PLATFORM)


def test_engine_without_sidecar_refused(tmp_path):
    from pipeline.errors import InputError

    run = fake_engine(tmp_path)
    (tmp_path / build.SIDECAR).unlink()
    with pytest.raises(InputError, match="executable code"):
        build.load_engine_bytes(run, platform=PLATFORM)


@pytest.mark.gpu
def test_engine_build_on_gpu(clone_run):
    """GPU + TensorRT: a real strongly typed engine, its sidecar, and verify with TensorRT required."""
    ok, reason = build.availability()
    if not ok:
        pytest.skip(reason)
    from conftest import cli

    run = clone_run()
    assert cli("build", "--run-dir", run, "--require", "tensorrt") == 0
    sidecar = json.loads((run / build.SIDECAR).read_text())
    assert sidecar["flags"]["strongly_typed"] is True and sidecar["flags"]["precision_flags"] == []
    assert cli("verify", "--run-dir", run, "--require", "tensorrt") == 0
    report = json.loads((run / "verify.json").read_text())
    assert {c["name"]: c["status"] for c in report["candidates"]}["tensorrt_fp16"] == "passed"
