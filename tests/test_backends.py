"""The backend table: one entry makes a backend that verify checks and benchmark times; runners keep the contract."""

import dataclasses
import json
import types
import typing

import numpy as np
import pytest
from polygraphy import config as polygraphy_config

from conftest import TINY
from pipeline import benchmark, config, stages
from pipeline.core.errors import CheckFailed
from pipeline.core.run import RunDir, sha256_file
from pipeline.evaluation import candidates
from pipeline.runtime import backends
from pipeline.runtime.builders import tensorrt_engine
from pipeline.runtime.runners import OrtRunner, ReferenceRunner, TorchRunner


class Offset:
    """The trained model with a planted fault: every logit shifted by 0.5 (far outside any tolerance)."""

    def __new__(cls, model):
        import torch

        class Shifted(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.inner = model

            def forward(self, x):
                return self.inner(x) + 0.5

        return Shifted()


def _offset_runner(ctx):
    return TorchRunner(Offset(ctx.model), name="torch_offset", input_name=ctx.spec.input_name,
                       output_name=ctx.spec.output_name, input_shape=tuple(ctx.spec.input_size))


DUMMY = backends.Backend("torch_offset", precision="fp32", device="cpu", artifact=None,
                         label="PyTorch FP32 with every logit shifted by 0.5", unavailable=lambda ctx: "",
                         make=_offset_runner, verify_name="torch_offset")


def test_one_entry_adds_a_backend_to_verify_and_benchmark(clone_run, monkeypatch):
    run = clone_run()
    monkeypatch.setattr(backends, "TABLE", [*backends.TABLE, DUMMY])
    cfg = config.resolve(overrides=["model.name=tiny_cnn", *TINY])
    with pytest.raises(CheckFailed, match="torch_offset"):
        stages.run_stage("verify", cfg, RunDir(run))
    verify = json.loads((run / "verify.json").read_text())
    row = next(c for c in verify["candidates"] if c["name"] == "torch_offset")
    assert row["status"] == "failed" and row["tensor_check"]["max_abs_error"] == pytest.approx(0.5, rel=1e-3)
    assert row["label"] == DUMMY.label and row["precision"] == "fp32"
    assert {c["name"]: c["status"] for c in verify["candidates"]}["onnxrt_fp32"] == "passed"  # the others still run

    cfg.benchmark.backends = ["torch_fp32", "torch_offset"]  # not assignable through the validated config
    cfg.benchmark.batch_sizes = [1]
    stages.run_stage("benchmark", cfg, RunDir(run))
    rows = {r["backend"]: r for r in json.loads((run / "benchmark.json").read_text())["results"]}
    assert rows["torch_offset"]["verify"] == "failed" and rows["torch_fp32"]["verify"] == "reference"
    assert rows["torch_offset"]["iterations"] >= 6 and rows["torch_offset"]["device"] == "cpu"


def test_table_names_match_the_config():
    """Every verify candidate has its verify.candidates section and every timed backend its benchmark.backends name."""
    assert len({b.name for b in backends.TABLE}) == len(backends.TABLE)
    sections = set(config.CandidatesConfig.model_fields)
    assert {b.verify_name for b in backends.candidates()} == sections
    timed = {b.name for b in backends.TABLE if b.benchmark != "no"}
    assert timed == set(typing.get_args(config.BenchBackend))
    assert config.TableBenchmarkConfig().backends is None  # null: the table's defaults, narrowed by benchmark.rows
    default = backends.default_timed()  # derived from the table, in its order
    assert default == [b.name for b in backends.TABLE if b.benchmark == "default"] and "torch_compile" not in default
    assert {b.benchmark for b in backends.TABLE} == {"default", "opt-in", "no"}


def test_verify_candidates_keep_their_order_and_names():
    assert [b.verify_name for b in backends.candidates()] == [
        "onnxrt_fp32", "fp16_emulation", "onnxrt_fp16_cpu", "bf16_emulation", "int8_exact", "onnxrt_int8_cpu",
        "tensorrt_fp16", "tensorrt_bf16", "tensorrt_int8", "onnxrt_cuda_fp16", "openvino_fp32", "openvino_bf16",
        "openvino_int8"]
    assert backends.verified_by(backends.by_name("onnxrt_fp16_cpu")) == "onnxrt_fp16_cpu"
    assert backends.verified_by(backends.by_name("torch_fp32")) == "reference"
    assert backends.verified_by(backends.by_name("torch_autocast")) is None


def tiny_onnx(tmp_path):
    """A linear classifier as a PyTorch module and as the same ONNX graph (Flatten -> Gemm)."""
    import onnx
    import torch
    from onnx import TensorProto, helper, numpy_helper

    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 3)).eval()
    weight = numpy_helper.from_array(model[1].weight.detach().numpy(), "W")
    bias = numpy_helper.from_array(model[1].bias.detach().numpy(), "B")
    graph = helper.make_graph(
        [helper.make_node("Flatten", ["input"], ["flat"]), helper.make_node("Gemm", ["flat", "W", "B"], ["logits"],
                                                                           transB=1)],
        "linear", [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 3, 2, 2])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 3])], [weight, bias])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return model, path


@pytest.fixture
def correctness_checks(monkeypatch):
    """Polygraphy's own check that a runner's state after deactivation equals its state before activation."""
    monkeypatch.setattr(polygraphy_config, "INTERNAL_CORRECTNESS_CHECKS", True)


@pytest.mark.parametrize("kind", ["torch", "onnxrt", "reference"])
def test_runner_contract_state_reset_and_timing_hook(tmp_path, kind, correctness_checks):
    import onnx

    model, path = tiny_onnx(tmp_path)
    runner = {"torch": lambda: TorchRunner(model, name="t", input_name="input", output_name="logits",
                                           input_shape=(3, 2, 2)),
              "onnxrt": lambda: OrtRunner(path, name="o", threads=1),
              "reference": lambda: ReferenceRunner(onnx.load(str(path)), name="r")}[kind]()
    feed = {"input": np.ones((2, 3, 2, 2), np.float32)}
    for _ in range(2):  # a second activation works on the same object
        with runner:
            out = runner.infer(feed)
            (timing, run_once), *_ = runner.timers(feed)
            assert runner.batch_reason(2) == ""
            assert run_once() > 0 and timing.kind == "cpu_call"
        assert list(out) == ["logits"] and out["logits"].shape == (2, 3)


def test_reference_runner_forgets_its_evaluator(tmp_path):
    import onnx

    _, path = tiny_onnx(tmp_path)
    runner = ReferenceRunner(onnx.load(str(path)), name="r")
    with runner:
        runner.infer({"input": np.ones((1, 3, 2, 2), np.float32)})
    assert not hasattr(runner, "evaluator") and not hasattr(runner, "inputs") and not hasattr(runner, "output_names")


def test_disabled_entry_is_skipped_before_it_is_checked_for_availability(tmp_path):
    calls = []
    entry = dataclasses.replace(DUMMY, verify_name="tensorrt_fp16", unavailable=lambda ctx: calls.append(1) or "")
    cfg = config.resolve(overrides=["verify.candidates.tensorrt_fp16.enabled=false"])

    (chk,) = candidates.plan(cfg, backends.Context(cfg, RunDir(tmp_path), "verify", None), [entry])
    assert chk.reason == "disabled (verify.candidates.tensorrt_fp16.enabled=false)" and not calls


def test_read_verdicts(tmp_path):
    from pipeline.reports.verify_report import read_verdicts

    run = RunDir(tmp_path)
    assert read_verdicts(run) is None
    # A verdict stands only with the sha256 of what it judged (issue 13): a report without them verifies nothing.
    (tmp_path / "verify.json").write_text('{"candidates": [{"name": "onnxrt_fp32", "status": "passed"}]}')
    assert read_verdicts(run) == {"onnxrt_fp32": "not verified"}
    (tmp_path / "model.onnx").write_bytes(b"onnx")
    (tmp_path / "model.safetensors").write_bytes(b"weights")
    hashes = {name: sha256_file(tmp_path / name) for name in ("model.onnx", "model.safetensors")}
    (tmp_path / "verify.json").write_text(json.dumps({
        "reference": {"weights_sha256": hashes["model.safetensors"]},
        "candidates": [{"name": "onnxrt_fp32", "status": "passed", "artifact_sha256": hashes["model.onnx"]},
                       {"name": "onnxrt_fp16_cpu", "status": "skipped", "artifact_sha256": None}]}))
    assert read_verdicts(run) == {"onnxrt_fp32": "passed", "onnxrt_fp16_cpu": "skipped"}
    (tmp_path / "verify.json").write_text("{not json")
    assert read_verdicts(run) is None


# --------------------------------------------------------------------------- TensorRT, one entry per engine
# TensorRT is not installed here: tensorrt_engine.availability is replaced to reach the checks behind it;
# no engine runs.


def test_tensorrt_int8_entry():
    entry = backends.by_name("tensorrt_int8")
    assert (entry.precision, entry.device, entry.artifact, entry.verify_name, entry.requires, entry.runtime) == (
        "int8", "cuda", "model.int8.engine", "tensorrt_int8", "tensorrt", "TensorRT")
    assert entry.isolated and entry.graph == "int8"
    assert "tensorrt_int8" in backends.default_timed()
    assert benchmark.decisive(entry, config.resolve())  # a deployment whose verdict gates: timed by default


def int8_context(tmp_path, *overrides):
    cfg = config.resolve(overrides=list(overrides))
    spec = types.SimpleNamespace(input_name="input", output_name="logits")
    return backends.Context(cfg, RunDir(tmp_path), "verify", spec)


def test_tensorrt_int8_unavailable_reasons(tmp_path, monkeypatch):
    from pipeline.core.errors import InputError

    check = backends.by_name("tensorrt_int8").unavailable
    monkeypatch.setattr(tensorrt_engine, "availability", lambda: (False, "TensorRT is not installed (simulated)"))
    assert check(int8_context(tmp_path)) == "TensorRT is not installed (simulated)"
    monkeypatch.setattr(tensorrt_engine, "availability", lambda: (True, ""))
    assert check(int8_context(tmp_path, "build.precisions=[fp16]")) == "build.precisions does not include int8"
    ctx = int8_context(tmp_path)
    with pytest.raises(InputError, match="model.int8.engine.*build"):  # TensorRT runs here: build writes it
        check(ctx)
    ctx.run_dir.manifest["stages"]["build"] = {"status": "ok", "details": {
        "skipped": {"int8": "no model.int8.onnx (export.int8.enabled is false)"}}}
    assert check(ctx) == "no model.int8.onnx (export.int8.enabled is false)"
    with pytest.raises(InputError, match="model.fp16.engine"):
        backends.by_name("tensorrt_fp16").unavailable(ctx)
    (tmp_path / "model.int8.engine").write_bytes(b"engine")
    ctx.run_dir.manifest["stages"]["build"] = {"status": "ok", "details": {"skipped": {}}}
    assert check(ctx) == ""


def test_tensorrt_int8_runner_loads_its_own_checked_engine(tmp_path, monkeypatch):
    import hashlib

    from pipeline.core import env
    from pipeline.core.errors import InputError
    from pipeline.runtime import runners

    platform = {"tensorrt": "11.4.0", "gpu": "NVIDIA H200", "compute_capability": "9.0"}
    monkeypatch.setattr(tensorrt_engine, "current_platform", lambda: dict(platform))
    monkeypatch.setattr(runners, "TensorrtRunner", lambda data, sidecar, **kw: (data, sidecar, kw))
    exposed = []
    monkeypatch.setattr(env, "expose_libcudart", lambda: exposed.append(1))
    (tmp_path / "model.int8.onnx").write_bytes(b"q/dq graph")
    (tmp_path / "model.int8.engine").write_bytes(b"int8 engine")
    sha = hashlib.sha256(b"int8 engine").hexdigest()
    sidecar = {"schema": tensorrt_engine.SIDECAR_SCHEMA, "built_by": "pipeline 0.1.0", "engine": "model.int8.engine",
               "sha256": sha, "onnx": "model.int8.onnx", "onnx_sha256": sha256_file(tmp_path / "model.int8.onnx"),
               "precision": "int8 (strongly typed from model.int8.onnx)",
               "profile": {"input": "x", "min": [1, 3], "opt": [1, 3], "max": [1, 3]}, **platform}
    (tmp_path / "model.int8.engine.json").write_text(json.dumps(sidecar))
    ctx = int8_context(tmp_path)
    ctx.run_dir.manifest["stages"]["build"] = {"status": "ok",
                                               "artifacts": {"model.int8.engine": {"sha256": sha, "bytes": 11}}}
    data, seen, kwargs = backends.by_name("tensorrt_int8").make(ctx)
    assert data == b"int8 engine" and seen.min == [1, 3] and kwargs["note"].startswith("int8")
    assert kwargs["name"] == "tensorrt_int8"
    assert exposed == [1]
    (tmp_path / "model.int8.onnx").write_bytes(b"re-quantized graph")
    with pytest.raises(InputError, match="model.int8.engine was built from another model.int8.onnx"):
        backends.by_name("tensorrt_int8").make(ctx)


@pytest.mark.parametrize("overrides, fp16_required, int8_required", [
    ([], True, True),
    (["build.precisions=[fp16]"], True, False),
    (["export.int8.enabled=false"], True, False),
    (["build.precisions=[int8]"], False, True),
])
def test_require_tensorrt_requires_the_engines_the_config_asks_for(overrides, fp16_required, int8_required):
    """--require tensorrt: an engine precision the config leaves out is skipped with its reason, never exit 3."""
    cfg = config.resolve(overrides=["require=[tensorrt]", *overrides])
    assert backends.by_name("tensorrt_fp16").required(cfg) is fp16_required
    assert backends.by_name("tensorrt_int8").required(cfg) is int8_required
    assert not backends.by_name("tensorrt_int8").required(config.resolve(overrides=overrides))


class _CudaModule:
    """A module that "moves" to CUDA without one: what TorchRunner.activate needs to get past ``.to("cuda")``."""

    def to(self, *args, **kwargs):
        return self

    def eval(self):
        return self


@pytest.mark.parametrize("tf32", [False, True])
def test_the_pytorch_fp32_gpu_row_follows_build_tf32_and_says_so(tf32):
    """PyTorch runs cuDNN convolutions in TF32 by default while the engines are built with TF32 off (build.tf32):
    the PyTorch FP32 GPU reference computes with build.tf32's setting while active (restored after), and its row's
    label and note say which."""
    import torch

    from pipeline import config
    from pipeline.runtime import runners

    before = (torch.backends.cudnn.conv.fp32_precision, torch.backends.cuda.matmul.fp32_precision)
    runner = runners.TorchRunner(_CudaModule(), name="torch_fp32", input_name="x", output_name="y",
                                 input_shape=(3, 8, 8), device="cuda", tf32=tf32)
    with runner:
        want = "tf32" if tf32 else "ieee"
        assert (torch.backends.cudnn.conv.fp32_precision, torch.backends.cuda.matmul.fp32_precision) == (want, want)
    assert (torch.backends.cudnn.conv.fp32_precision, torch.backends.cuda.matmul.fp32_precision) == before
    words = f"TF32 {'on' if tf32 else 'off'} (build.tf32: {str(tf32).lower()}"
    assert runner.note.startswith(words)
    cfg = config.resolve(overrides=[f"build.tf32={str(tf32).lower()}"])
    assert words in backends.label(backends.by_name("torch_fp32"), cfg)


@pytest.mark.parametrize("tf32", [False, True])  # both: a row fixed at PyTorch's default (TF32 on) must fail one
def test_the_torch_backends_pass_build_tf32_to_the_runner(monkeypatch, tf32):
    from pipeline import config
    from pipeline.runtime import runners

    made = []
    monkeypatch.setattr(runners, "TorchRunner", lambda model, **kw: made.append(kw) or kw)
    cfg = config.resolve(overrides=[f"build.tf32={str(tf32).lower()}"])
    ctx = types.SimpleNamespace(gpu=True, cfg=cfg, model=None, spec=types.SimpleNamespace(
        input_name="x", output_name="y", input_size=[3, 8, 8]))
    backends.by_name("torch_fp32").make(ctx)
    assert made[0]["tf32"] is tf32 and made[0]["device"] == "cuda"
