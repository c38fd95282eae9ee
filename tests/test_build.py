"""Build: the Polygraphy loader chain (lazy, inspected without TensorRT), skip/require, engine sidecar."""

import json

import pytest

from pipeline import build, config
from pipeline.core import artifacts
from pipeline.core.artifacts import timing_cache_name
from pipeline.core.engine_sidecar import BuildFlags
from pipeline.core.run import RunDir
from pipeline.runtime.builders import tensorrt_engine


def pieces_for(tmp_path, **build_overrides):
    """The loader chain's pieces, inspected through their public attributes (no TensorRT needed)."""
    cfg = config.resolve(overrides=[f"build.{k}={v}" for k, v in build_overrides.items()] + ["verify.batch_size=8"])
    onnx_path = tmp_path / "model.fp16.onnx"
    onnx_path.write_bytes(b"not parsed until the loader is called")
    shapes = tensorrt_engine.profile_shapes(cfg.build, [3, 32, 32])
    network = tensorrt_engine.network_loader(onnx_path)
    builder_config = tensorrt_engine.config_loader(input_name="input", shapes=shapes, build_cfg=cfg.build,
                                         timing_cache=tmp_path / "trt_timing.cache")
    loader = tensorrt_engine.engine_loader(onnx_path, input_name="input", shapes=shapes, build_cfg=cfg.build,
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
    monkeypatch.setattr(tensorrt_engine, "network_loader", lambda path: seen.setdefault("network", path))
    monkeypatch.setattr(tensorrt_engine, "config_loader", lambda **kw: seen.setdefault("config", kw))
    cfg = config.resolve()
    tensorrt_engine.engine_loader(tmp_path / "m.onnx", input_name="x",
                                  shapes=tensorrt_engine.profile_shapes(cfg.build, [3, 8, 8]),
                                  build_cfg=cfg.build, timing_cache=None)
    assert seen["network"] == tmp_path / "m.onnx" and seen["config"]["input_name"] == "x"


def test_tf32_is_configurable(tmp_path):
    _, cfg, _ = pieces_for(tmp_path, tf32="true")
    assert cfg.tf32 is True


def test_timing_cache_is_keyed_by_tensorrt_version_gpu_and_compute_capability(tmp_path, monkeypatch):
    """An H100 and an H200 are both sm90: the GPU's name keeps their caches apart (Polygraphy merges the cache on
    disk into the new one with ignore_mismatch=True)."""
    cfg = config.resolve()
    run = RunDir(tmp_path / "runs" / "m")
    monkeypatch.setattr(tensorrt_engine, "current_platform", lambda: dict(PLATFORM))
    assert tensorrt_engine.timing_cache_path(cfg, run) == tmp_path / "runs" / "trt_timing.11.4.0.NVIDIA_H200.sm90.cache"
    other_gpu = {**PLATFORM, "gpu": "NVIDIA A100-SXM4-80GB", "compute_capability": "8.0"}
    same_sm = {**PLATFORM, "gpu": "NVIDIA H100 80GB HBM3"}
    other_trt = {**PLATFORM, "tensorrt": "10.13.0"}
    paths = {tensorrt_engine.timing_cache_path(cfg, run, p) for p in (PLATFORM, other_gpu, same_sm, other_trt)}
    assert len(paths) == 4 and all(p.parent == tmp_path / "runs" for p in paths)
    assert tensorrt_engine.timing_cache_path(cfg, run, other_gpu).name == \
        "trt_timing.11.4.0.NVIDIA_A100-SXM4-80GB.sm80.cache"
    assert tensorrt_engine.timing_cache_path(cfg, run, same_sm).name == \
        "trt_timing.11.4.0.NVIDIA_H100_80GB_HBM3.sm90.cache"


@pytest.mark.parametrize("gpu, part", [("../../etc/passwd", "etc_passwd"), ("NVIDIA H200", "NVIDIA_H200"),
                                       ("", "unknown"), (None, "unknown"), (" / . ", "unknown"), ("x" * 300, "x" * 64)])
def test_a_gpu_name_is_one_safe_part_of_the_cache_s_file_name(gpu, part):
    name = timing_cache_name("11.4.0", gpu, "9.0")
    assert name == f"trt_timing.11.4.0.{part}.sm90.cache" and "/" not in name and ".." not in name


def test_a_given_timing_cache_wins(tmp_path, monkeypatch):
    monkeypatch.setattr(tensorrt_engine, "current_platform", lambda: dict(PLATFORM))
    cfg = config.resolve(overrides=[f"build.timing_cache={tmp_path / 'mine.cache'}"])
    assert tensorrt_engine.timing_cache_path(cfg, RunDir(tmp_path / "runs" / "m")) == tmp_path / "mine.cache"


def test_build_skips_with_reason_without_tensorrt(clone_run):
    from conftest import cli

    ok, reason = tensorrt_engine.availability()
    if ok:
        pytest.skip("this machine can build engines")
    run = clone_run()
    assert cli("build", "--run-dir", run) == 0
    entry = json.loads((run / "manifest.json").read_text())["stages"]["build"]
    assert entry["status"] == "skipped" and entry["reason"] == reason
    assert not (run / tensorrt_engine.FP16_ENGINE).exists()


def test_require_tensorrt_fails_with_exit_3(clone_run, capsys):
    from conftest import cli

    if tensorrt_engine.availability()[0]:
        pytest.skip("TensorRT is available here")
    run = clone_run()
    assert cli("build", "--run-dir", run, "--require", "tensorrt") == 3
    assert "TensorRT engine required" in capsys.readouterr().err


PLATFORM = {"tensorrt": "11.4.0", "gpu": "NVIDIA H200", "compute_capability": "9.0"}


def fake_engine(tmp_path, **sidecar_changes):
    import hashlib

    engine = tmp_path / tensorrt_engine.FP16_ENGINE
    engine.write_bytes(b"serialized engine bytes")
    sidecar = {"schema": tensorrt_engine.SIDECAR_SCHEMA, "built_by": "pipeline 0.1.0",
               "engine": tensorrt_engine.FP16_ENGINE, "sha256": hashlib.sha256(engine.read_bytes()).hexdigest(),
               **PLATFORM, **sidecar_changes}
    (tmp_path / tensorrt_engine.SIDECAR).write_text(json.dumps(sidecar))
    run = RunDir(tmp_path)  # as the build stage records it: only recorded engines are loaded
    run.manifest["stages"]["build"] = {"status": "ok", "artifacts": {tensorrt_engine.FP16_ENGINE: {
        "sha256": hashlib.sha256(engine.read_bytes()).hexdigest(), "bytes": engine.stat().st_size}}}
    return run


def test_engine_with_matching_sidecar_loads(tmp_path):
    data, sidecar = tensorrt_engine.load_engine_bytes(fake_engine(tmp_path), platform=PLATFORM)
    assert data == b"serialized engine bytes" and sidecar.platform.gpu == "NVIDIA H200"


@pytest.mark.parametrize("change, message", [
    ({"sha256": "0" * 64}, "does not match its sidecar"),
    ({"gpu": "NVIDIA A100-SXM4-80GB"}, "built for GPU NVIDIA A100"),
    ({"compute_capability": "8.0"}, "compute capability 8.0"),
    ({"tensorrt": "10.13.0"}, "TensorRT version 10.13.0"),
    ({"built_by": "someone else"}, "not a pipeline engine sidecar"),
    ({"schema": "other/1"}, "not a pipeline engine sidecar"),
])
def test_engine_refused_when_sidecar_does_not_match(tmp_path, change, message):
    from pipeline.core.errors import InputError

    run = fake_engine(tmp_path, **change)
    with pytest.raises(InputError, match=message) as err:
        tensorrt_engine.load_engine_bytes(run, platform=PLATFORM)
    assert "rebuild" in str(err.value)


def test_tampered_engine_bytes_refused(tmp_path):
    from pipeline.core.errors import InputError

    run = fake_engine(tmp_path)
    (tmp_path / tensorrt_engine.FP16_ENGINE).write_bytes(b"serialized engine bytes, with a payload appended")
    with pytest.raises(InputError, match="changed after the build"):
        tensorrt_engine.load_engine_bytes(run, platform=PLATFORM)


def test_engine_without_sidecar_refused(tmp_path):
    from pipeline.core.errors import InputError

    run = fake_engine(tmp_path)
    (tmp_path / tensorrt_engine.SIDECAR).unlink()
    with pytest.raises(InputError, match="executable code"):
        tensorrt_engine.load_engine_bytes(run, platform=PLATFORM)


@pytest.mark.gpu
def test_engine_build_on_gpu(clone_run):
    """GPU + TensorRT: a real strongly typed engine, its sidecar, and verify with TensorRT required."""
    ok, reason = tensorrt_engine.availability()
    if not ok:
        pytest.skip(reason)
    from conftest import cli

    run = clone_run()
    assert cli("build", "--run-dir", run, "--require", "tensorrt") == 0
    sidecar = json.loads((run / tensorrt_engine.SIDECAR).read_text())
    assert sidecar["flags"]["strongly_typed"] is True and sidecar["flags"]["precision_flags"] == []
    assert cli("verify", "--run-dir", run, "--require", "tensorrt") == 0
    report = json.loads((run / "verify.json").read_text())
    assert {c["name"]: c["status"] for c in report["candidates"]}["tensorrt_fp16"] == "passed"


# --------------------------------------------------------------------------- one engine per precision
# TensorRT is not installed here: these tests replace the Polygraphy loader chain by a recorder and check
# what the build stage plans, writes and records per precision, not TensorRT itself.


@pytest.fixture
def fake_trt(monkeypatch):
    """TensorRT "available", this machine is PLATFORM, and the engine bytes name the ONNX graph they came from."""
    built = []

    def engine_loader(onnx_path, **kwargs):
        built.append(onnx_path.name)
        return lambda: b"engine from " + onnx_path.read_bytes()[:16]

    monkeypatch.setattr(tensorrt_engine, "availability", lambda: (True, ""))
    monkeypatch.setattr(tensorrt_engine, "current_platform", lambda: dict(PLATFORM))
    monkeypatch.setattr(tensorrt_engine, "engine_loader", engine_loader)
    return built


def with_int8_onnx(run):
    """A graph in model.int8.onnx's place (the FP32 one: build reads it for the engine's node precisions; the
    recording builder does not parse it)."""
    (run / tensorrt_engine.INT8_ONNX).write_bytes((run / build.FP32_ONNX).read_bytes())
    from conftest import listed

    listed(run, tensorrt_engine.INT8_ONNX)  # where export writes it
    return run


def build_entry(run):
    return json.loads((run / "manifest.json").read_text())["stages"]["build"]


def test_build_makes_one_engine_per_precision_from_its_graph(clone_bf16_run, fake_trt):
    from conftest import cli

    run = with_int8_onnx(clone_bf16_run())
    assert cli("build", "--run-dir", run, "--require", "tensorrt") == 0
    assert fake_trt == [tensorrt_engine.FP16_ONNX, artifacts.BF16_ONNX, tensorrt_engine.INT8_ONNX]
    entry = build_entry(run)
    assert entry["status"] == "ok" and entry["details"]["skipped"] == {}
    engines = {name for name in entry["artifacts"] if not name.startswith("openvino/")}  # build writes the IR too
    assert engines == {tensorrt_engine.FP16_ENGINE, tensorrt_engine.SIDECAR, artifacts.BF16_ENGINE,
                       artifacts.BF16_ENGINE_SIDECAR, tensorrt_engine.INT8_ENGINE,
                       tensorrt_engine.INT8_ENGINE_SIDECAR}
    engines = entry["details"]["engines"]
    assert engines["int8"]["precision"].startswith("int8 (strongly typed from model.int8.onnx")
    assert engines["fp16"]["precision"].startswith("fp16 (strongly typed from model.fp16.onnx")
    assert engines["bf16"]["precision"].startswith("bf16 (strongly typed from model.bf16.onnx")
    for precision, engine, onnx_name in (("fp16", tensorrt_engine.FP16_ENGINE, tensorrt_engine.FP16_ONNX),
                                         ("bf16", artifacts.BF16_ENGINE, artifacts.BF16_ONNX),
                                         ("int8", tensorrt_engine.INT8_ENGINE, tensorrt_engine.INT8_ONNX)):
        data, sidecar = tensorrt_engine.load_engine_bytes(RunDir(run), platform=PLATFORM, engine=engine)
        assert data == b"engine from " + (run / onnx_name).read_bytes()[:16]
        assert sidecar.onnx == onnx_name and sidecar.precision_label == engines[precision]["precision"]
        assert sidecar.flags == BuildFlags(strongly_typed=True, precision_flags=[], tf32=False,
                                           builder_optimization_level=3)
        assert sidecar.timing_cache.endswith("trt_timing.11.4.0.NVIDIA_H200.sm90.cache")
        assert sidecar.to_json() == json.loads((run / tensorrt_engine.target_of(engine).sidecar).read_text())


@pytest.mark.parametrize("overrides, reason", [
    (["export.int8.enabled=false"], "no model.int8.onnx (export.int8.enabled is false)"),
    (["build.precisions=[fp16,bf16]"], "build.precisions does not include int8"),
])
def test_a_precision_without_its_graph_is_skipped_with_its_reason(clone_bf16_run, fake_trt, overrides, reason):
    from conftest import cli

    run = clone_bf16_run()
    if "build.precisions=[fp16,bf16]" in overrides:
        with_int8_onnx(run)
    (run / tensorrt_engine.INT8_ENGINE).write_bytes(b"an engine of an earlier build")  # stale: removed, never loaded
    from conftest import listed

    listed(run, tensorrt_engine.INT8_ENGINE)  # as that earlier build wrote it
    assert cli("build", "--run-dir", run, "--require", "tensorrt", *overrides) == 0
    entry = build_entry(run)
    assert entry["status"] == "ok" and entry["details"]["skipped"] == {"int8": reason}
    assert set(entry["details"]["engines"]) == {"fp16", "bf16"}
    assert fake_trt == [tensorrt_engine.FP16_ONNX, artifacts.BF16_ONNX]
    assert not (run / tensorrt_engine.INT8_ENGINE).exists() and not (run / tensorrt_engine.INT8_ENGINE_SIDECAR).exists()


def test_a_graph_the_config_expects_and_export_did_not_write_is_run_export_first(clone_run, fake_trt, capsys):
    """INT8 on in the config, and no model.int8.onnx: the same answer as for FP16, never a quiet skip."""
    from conftest import cli

    run = clone_run()
    assert cli("build", "--run-dir", run, "--require", "tensorrt", "export.int8.enabled=true") == 2
    assert "build needs model.int8.onnx" in capsys.readouterr().err and fake_trt == []


def test_no_engine_to_build_is_a_skipped_stage(clone_run, fake_trt):
    from conftest import cli

    run = clone_run()
    assert cli("build", "--run-dir", run, "build.precisions=[int8]", "export.int8.enabled=false") == 0
    entry = build_entry(run)
    assert entry["status"] == "skipped" and fake_trt == []
    assert entry["reason"] == "no engine to build: fp16: build.precisions does not include fp16; bf16: " \
        "build.precisions does not include bf16; int8: no model.int8.onnx (export.int8.enabled is false)"


def test_int8_engine_has_the_same_trust_checks(clone_run, fake_trt):
    from conftest import cli
    from pipeline.core.errors import InputError

    run = with_int8_onnx(clone_run())
    assert cli("build", "--run-dir", run) == 0
    rd = RunDir(run)
    with pytest.raises(InputError, match="built for TensorRT version 11.4.0, but this machine has 10.13.0"):
        tensorrt_engine.load_engine_bytes(rd, platform={**PLATFORM, "tensorrt": "10.13.0"},
                                          engine=tensorrt_engine.INT8_ENGINE)
    (run / tensorrt_engine.INT8_ENGINE).write_bytes(b"engine from another graph")
    with pytest.raises(InputError, match="changed after the build"):
        tensorrt_engine.load_engine_bytes(rd, platform=PLATFORM, engine=tensorrt_engine.INT8_ENGINE)
    # The FP16 engine and sidecar put in the INT8 engine's place: the sidecar names another engine.
    for src, dst in ((tensorrt_engine.FP16_ENGINE, tensorrt_engine.INT8_ENGINE),
                     (tensorrt_engine.SIDECAR, tensorrt_engine.INT8_ENGINE_SIDECAR)):
        (run / dst).write_bytes((run / src).read_bytes())
    with pytest.raises(InputError, match="describes model.fp16.engine, not model.int8.engine"):
        tensorrt_engine.load_engine_bytes(rd, platform=PLATFORM, engine=tensorrt_engine.INT8_ENGINE)
    (run / tensorrt_engine.INT8_ENGINE_SIDECAR).unlink()
    with pytest.raises(InputError, match="has no sidecar model.int8.engine.json"):
        tensorrt_engine.load_engine_bytes(rd, platform=PLATFORM, engine=tensorrt_engine.INT8_ENGINE)


def test_an_int8_engine_the_build_did_not_record_is_refused(tmp_path):
    from pipeline.core.errors import InputError

    run = fake_engine(tmp_path)  # records only model.fp16.engine
    (tmp_path / tensorrt_engine.INT8_ENGINE).write_bytes((tmp_path / tensorrt_engine.FP16_ENGINE).read_bytes())
    sidecar = json.loads((tmp_path / tensorrt_engine.SIDECAR).read_text())
    (tmp_path / tensorrt_engine.INT8_ENGINE_SIDECAR).write_text(
        json.dumps({**sidecar, "engine": tensorrt_engine.INT8_ENGINE}))
    with pytest.raises(InputError, match="not the engine the build stage recorded"):
        tensorrt_engine.load_engine_bytes(run, platform=PLATFORM, engine=tensorrt_engine.INT8_ENGINE)


def test_unavailable_tensorrt_skips_every_precision_and_removes_stale_engines(clone_run, monkeypatch):
    from conftest import cli

    monkeypatch.setattr(tensorrt_engine, "availability", lambda: (False, "TensorRT is not installed (test)"))
    run = with_int8_onnx(clone_run())
    (run / tensorrt_engine.INT8_ENGINE).write_bytes(b"stale")
    (run / tensorrt_engine.INT8_ENGINE_SIDECAR).write_text("{}")
    from conftest import listed

    listed(run, tensorrt_engine.INT8_ENGINE, tensorrt_engine.INT8_ENGINE_SIDECAR)  # an earlier build's
    assert cli("build", "--run-dir", run) == 0
    assert build_entry(run)["reason"] == "TensorRT is not installed (test)"
    assert not (run / tensorrt_engine.INT8_ENGINE).exists() and not (run / tensorrt_engine.INT8_ENGINE_SIDECAR).exists()
    assert cli("build", "--run-dir", run, "--require", "tensorrt") == 3


def test_fp16_graph_missing_while_fp16_export_is_on_is_run_export_first(clone_bf16_run, fake_trt, capsys):
    """Never an FP32 engine under the FP16 name: a missing graph is run export first; FP16 export off, a skip."""
    from conftest import cli

    run = clone_bf16_run()
    (run / tensorrt_engine.FP16_ONNX).unlink()
    assert cli("build", "--run-dir", run) == 2
    assert "build needs model.fp16.onnx" in capsys.readouterr().err and fake_trt == []
    # FP16 export off: no FP16 engine at all (an FP32 engine under the FP16 name would be timed as FP16)
    assert cli("build", "--run-dir", run, "export.fp16.enabled=false") == 0
    assert fake_trt == [artifacts.BF16_ONNX]
    entry = build_entry(run)
    assert "fp16" not in entry["details"]["engines"]
    assert entry["details"]["skipped"]["fp16"] == "no model.fp16.onnx (export.fp16.enabled is false)"
