"""Localisation on TensorRT builds its all-outputs engine with the engine's own build config.

TensorRT is not installed here: the Polygraphy loaders are lazy, so their configuration is inspected
without building anything (what TensorRT would compute is not checked).
"""

import numpy as np

from pipeline import config
from pipeline.core.check_results import CandidateResult, Localization
from pipeline.core.run import RunDir
from pipeline.evaluation import candidates
from pipeline.precision import plugs
from pipeline.runtime import backends
from pipeline.runtime.builders import tensorrt_engine
from pipeline.runtime.profiling import localize

OVERRIDES = ["build.tf32=true", "build.optimization_level=5", "build.min_batch=2", "build.opt_batch=4",
             "build.max_batch=16", "verify.batch_size=4"]


def both_loaders(tmp_path):
    cfg = config.resolve(overrides=OVERRIDES)
    onnx_path = tmp_path / "model.fp16.onnx"
    shapes = tensorrt_engine.profile_shapes(cfg.build, [3, 8, 8])
    cache = tmp_path / "trt_timing.11.4.0.sm90.cache"
    cache.write_bytes(b"a timing cache")
    engine = tensorrt_engine.engine_loader(onnx_path, input_name="x", shapes=shapes, build_cfg=cfg.build,
                                           timing_cache=cache)
    layers = localize.tensorrt_layers_engine(onnx_path, input_name="x", shapes=shapes, build_cfg=cfg.build,
                                             timing_cache=cache)
    return engine, layers


def test_localisation_config_is_the_engines(tmp_path, monkeypatch):
    seen = []
    real = tensorrt_engine.config_loader
    monkeypatch.setattr(tensorrt_engine, "config_loader", lambda **kw: seen.append(kw) or real(**kw))
    both_loaders(tmp_path)
    engine_kwargs, layers_kwargs = seen
    assert layers_kwargs == engine_kwargs
    assert engine_kwargs["build_cfg"].tf32 is True and engine_kwargs["build_cfg"].optimization_level == 5


def test_localisation_builder_config_matches_field_by_field(tmp_path):
    engine, layers = both_loaders(tmp_path)
    for attr in ("tf32", "builder_optimization_level", "timing_cache_path", "fp16", "int8", "bf16"):
        assert getattr(layers._config, attr) == getattr(engine._config, attr), attr
    assert (layers._config.tf32, layers._config.builder_optimization_level) == (True, 5)
    assert layers._config.timing_cache_path.endswith("trt_timing.11.4.0.sm90.cache")
    (engine_profile,), (layers_profile,) = engine._config.profiles, layers._config.profiles
    for shape in ("min", "opt", "max"):
        assert tuple(getattr(layers_profile["x"], shape)) == tuple(getattr(engine_profile["x"], shape))
    assert tuple(layers_profile["x"].min) == (2, 3, 8, 8)
    parsed = layers._network._network  # ModifyNetworkOutputs(NetworkFromOnnxPath(...))
    assert parsed.strongly_typed is True and str(parsed.path).endswith("model.fp16.onnx")


def test_verify_passes_the_build_config_and_cache_to_tensorrt_localisation(tmp_path, monkeypatch):
    cfg = config.resolve(overrides=OVERRIDES)
    monkeypatch.setattr(tensorrt_engine, "current_platform", lambda: {"tensorrt": "11.4.0", "gpu": "H200",
                                                             "compute_capability": "9.0"})
    seen = {}

    def fake_localize_tensorrt(*args, **kwargs):
        seen.update(kwargs)
        return Localization(first_divergent=None, worst=[], compared_nodes=0)

    monkeypatch.setattr(localize, "localize_tensorrt", fake_localize_tensorrt)
    run = RunDir(tmp_path / "runs" / "r")
    chk = candidates.Check(backends.by_name("tensorrt_fp16"), "TensorRT", False,
                       result=CandidateResult(tolerance={"criterion": "scaled", "max_scaled_error": 0.05,
                                                         "atol": 1e-3, "rtol": 1e-3}))
    evidence = candidates.Evidence([{"input": np.zeros((1, 3, 8, 8), np.float32)}], [], np.zeros(1), "logits")
    result = candidates.localize_candidate(cfg, plugs.FP16, None, None, evidence, chk, run)
    assert result.candidate == "tensorrt_fp16"
    assert seen["build_cfg"] == cfg.build
    assert seen["timing_cache"] == tmp_path / "runs" / "trt_timing.11.4.0.H200.sm90.cache"
