"""python -m pipeline qat: fake quantization exactly where PTQ puts its Q/DQ nodes, fine-tuned with the project's
trainer, exported to model.int8.onnx in PTQ's form and with PTQ's activation ranges; recorded in the manifest and in
int8_fallback.json, from which export rebuilds the same graph; an interrupted and resumed QAT ends with the same
weights as an uninterrupted one; tune's third rung decides when QAT runs (tune.qat)."""

import json
import shutil

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from conftest import TINY, cli, copy_run, trained_and_exported
from pipeline.core import artifacts
from pipeline.core.run import sha256_file
from pipeline.precision import int8, qat
from pipeline.training import qat_recipe
from pipeline.training.checkpoint import load_checkpoint


@pytest.fixture(autouse=True, scope="module")
def _modelopt_torch_imports():
    """Skip, with the reason, where ModelOpt's PyTorch side does not import: asked when the first test here runs, not
    when the suite is collected (the import takes 4 s, which every worker paid before its first test)."""
    reason = qat.availability()
    if reason:
        pytest.skip(reason)


TRAINED = [*TINY, "data.samples_per_class=30", "train.epochs=4", "export.int8.calibration_samples=16",
           "export.int8.enabled=true", "export.bf16.enabled=false", "verify.samples=60", "verify.batch_size=30",
           "qat.epochs=2", "qat.lr=0.01"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    return trained_and_exported(tmp_path_factory, TRAINED)


# --------------------------------------------------------------------------- placement and ranges (no model)


def _qdq_graph(scale: float) -> onnx.ModelProto:
    """input -Q/DQ-> /conv/Conv (weight through Q/DQ) -> /act/Relu -Q/DQ-> Flatten -> /fc/Gemm (FP weight)."""
    def init(name, value, dtype=np.float32):
        return numpy_helper.from_array(np.asarray(value, dtype), name)

    inits = [init("s_in", scale), init("z_in", 0, np.int8), init("w", np.ones((2, 1, 1, 1))),
             init("s_w", [0.1, 0.2]), init("z_w", [0, 0], np.int8), init("s_r", 2 * scale), init("z_r", 0, np.int8),
             init("fc_w", np.ones((3, 2))), init("fc_b", np.zeros(3))]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s_in", "z_in"], ["xq"], name="x_QuantizeLinear"),
             helper.make_node("DequantizeLinear", ["xq", "s_in", "z_in"], ["xdq"], name="x_DequantizeLinear"),
             helper.make_node("QuantizeLinear", ["w", "s_w", "z_w"], ["wq"], name="w_QuantizeLinear", axis=0),
             helper.make_node("DequantizeLinear", ["wq", "s_w", "z_w"], ["wdq"], name="w_DequantizeLinear", axis=0),
             helper.make_node("Conv", ["xdq", "wdq"], ["c"], name="/conv/Conv"),
             helper.make_node("Relu", ["c"], ["r"], name="/act/Relu"),
             helper.make_node("QuantizeLinear", ["r", "s_r", "z_r"], ["rq"], name="r_QuantizeLinear"),
             helper.make_node("DequantizeLinear", ["rq", "s_r", "z_r"], ["rdq"], name="r_DequantizeLinear"),
             helper.make_node("Flatten", ["rdq"], ["f"], name="/Flatten"),
             helper.make_node("Gemm", ["f", "fc_w", "fc_b"], ["y"], name="/fc/Gemm", transB=1)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 1, 1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_placement_maps_qdq_to_modules_through_shape_only_ops():
    where = qat.placement(_qdq_graph(0.5))
    assert where.inputs == {"conv": pytest.approx(0.5 * 127), "fc": pytest.approx(1.0 * 127)}
    assert where.weights == {"conv"}  # fc's weight has no Q/DQ: PTQ left it in high precision
    assert where.sites == 2 and where.unmapped == []
    assert qat.module_of("/layer1/layer1.0/conv1/Conv") == "layer1.0.conv1" and qat.module_of("/Flatten") is None


@pytest.mark.parametrize("name", ["mobilenet_v3_small", "resnet18", "vit_micro", "tiny_cnn"])
def test_every_matrix_node_maps_to_its_own_module(name, tmp_path):
    """The scopes TorchScript's export writes (nested containers: MobileNetV3's features.3.block.1.0; attributes:
    ResNet's layer1.0.conv1; ViT's blocks.0.attn.qkv) name the module each Conv, Gemm and MatMul of a weight came
    from; a wrong path leaves that layer's quantizers out of QAT."""
    import models

    net = models.create_model(name, num_classes=10)
    net = (net[0] if isinstance(net, tuple) else net).eval()
    size = 32 if models.get_spec(name).fixed_input_size else 16
    path = tmp_path / "m.onnx"
    torch.onnx.export(net, torch.zeros(1, 3, size, size), str(path), dynamo=False, opset_version=18)
    graph = onnx.load(str(path)).graph
    weights = {i.name for i in graph.initializer}
    modules = dict(net.named_modules())
    layers = [n for n in graph.node if n.op_type in ("Conv", "Gemm") or (n.op_type == "MatMul" and n.input[1] in
                                                                           weights)]
    assert layers
    for node in layers:
        module = modules.get(qat.module_of(node.name))
        assert isinstance(module, (torch.nn.Conv2d, torch.nn.Linear)), (node.name, qat.module_of(node.name))


def test_transfer_ranges_copies_activation_scales_only():
    template, target = _qdq_graph(0.5), _qdq_graph(0.25)
    for init in target.graph.initializer:
        if init.name == "s_w":
            init.CopyFrom(numpy_helper.from_array(np.array([9.0, 9.0], np.float32), "s_w"))
    copied, total = qat.transfer_ranges(template, target)
    values = {i.name: numpy_helper.to_array(i) for i in target.graph.initializer}
    assert (copied, total) == (4, 4)  # the input's and the Relu output's Q and DQ
    assert float(values["s_in"]) == 0.5 and float(values["s_r"]) == 1.0
    assert values["s_w"].tolist() == [9.0, 9.0]  # the weights' per-channel scales are the target's own


def test_distillation_is_zero_when_the_student_is_the_teacher():
    logits = torch.randn(4, 10)
    labels = torch.zeros(4, dtype=torch.long)
    assert qat.distillation_loss(logits, logits, labels, temperature=2.0, label_weight=0.0).item() == pytest.approx(0)
    assert qat.distillation_loss(logits, logits.flip(1), labels, temperature=2.0, label_weight=0.0).item() > 0


# --------------------------------------------------------------------------- the stage


def test_qat_writes_ptqs_form_records_it_and_export_rebuilds_it(trained, tmp_path, capsys):
    run = copy_run(trained("tiny_cnn"), tmp_path)
    ptq = onnx.load(str(run / "model.int8.onnx"))
    assert cli("qat", "--run-dir", run, *TRAINED) == 0
    graph = onnx.load(str(run / "model.int8.onnx"))
    ops = [n.op_type for n in graph.graph.node]
    assert ops == [n.op_type for n in ptq.graph.node]  # the same Q/DQ placement and FP16 regions
    fp32 = onnx.load(str(run / "model.onnx"))
    assert int8.node_precisions(fp32, graph) == int8.node_precisions(fp32, ptq)
    ranges = {i.name: numpy_helper.to_array(i) for i in ptq.graph.initializer if i.name.startswith("input_scale")}
    assert ranges and all(np.array_equal(numpy_helper.to_array(i), ranges[i.name]) for i in graph.graph.initializer
                          if i.name in ranges)  # PTQ's activation ranges, kept
    details = json.loads((run / "manifest.json").read_text())["stages"]["qat"]["details"]
    assert details["method"] == "qat" and details["epochs"] == 2 and len(details["history"]) == 2
    assert details["source_weights_sha256"] == sha256_file(run / "model.safetensors")
    assert details["simulated"]["weights"] == ["features.0", "features.4"] and details["seconds_per_epoch"] > 0
    fallback = json.loads((run / "int8_fallback.json").read_text())
    assert fallback["method"] == "qat" and fallback["qat"]["checkpoint"] == artifacts.QAT_BEST_CHECKPOINT
    state = load_checkpoint(run / artifacts.QAT_BEST_CHECKPOINT)
    assert state.modelopt_state is not None and any(k.endswith("input_quantizer._amax") for k in state.model)

    before = sha256_file(run / "model.int8.onnx")
    assert cli("export", "--run-dir", run) == 0  # rebuilt from the checkpoint, not PTQ
    assert sha256_file(run / "model.int8.onnx") == before

    # issue 46: a QAT entry naming train's checkpoint (a valid file, its sha256 given), or train's checkpoint copied
    # in place of QAT's with its sha256: exit 2 in one line, never a raw state-dict error (exit 4)
    fallback_path, kept = run / "int8_fallback.json", (run / "int8_fallback.json").read_text()
    named = json.loads(kept)
    named["qat"].update(checkpoint=artifacts.CHECKPOINT, checkpoint_sha256=sha256_file(run / artifacts.CHECKPOINT))
    copied = json.loads(kept)
    shutil.copyfile(run / artifacts.CHECKPOINT, run / artifacts.QAT_BEST_CHECKPOINT)
    copied["qat"]["checkpoint_sha256"] = sha256_file(run / artifacts.QAT_BEST_CHECKPOINT)
    for edited, said in ((named, "qat.checkpoint"), (copied, "does not hold QAT's fine-tuned weights")):
        fallback_path.write_text(json.dumps(edited))
        capsys.readouterr()
        assert cli("export", "--run-dir", run) == 2
        err = capsys.readouterr().err
        errors = [line for line in err.splitlines() if line.startswith("error:")]  # the rest: export's progress
        assert len(errors) == 1 and said in errors[0] and "Traceback" not in err, err
    fallback_path.write_text(kept)

    (run / artifacts.QAT_BEST_CHECKPOINT).unlink()  # a missing checkpoint is an input error, not a silent PTQ
    assert cli("export", "--run-dir", run) == 2


def test_interrupted_and_resumed_qat_ends_with_the_uninterrupted_weights(trained, tmp_path, monkeypatch):
    source = trained("tiny_cnn")
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    for target in (whole, cut):
        shutil.copytree(source, target)
    assert cli("qat", "--run-dir", whole, *TRAINED) == 0

    real_end = qat_recipe.QATTrainer.end_epoch

    def end_then_interrupt(self, epoch):
        real_end(self, epoch)
        if epoch == 0:
            raise KeyboardInterrupt

    monkeypatch.setattr(qat_recipe.QATTrainer, "end_epoch", end_then_interrupt)
    assert cli("qat", "--run-dir", cut, *TRAINED) == 130
    monkeypatch.setattr(qat_recipe.QATTrainer, "end_epoch", real_end)
    assert cli("qat", "--resume", "--run-dir", cut, *TRAINED) == 0

    a, b = (load_checkpoint(r / artifacts.QAT_CHECKPOINT).model for r in (whole, cut))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert sha256_file(whole / "model.int8.onnx") == sha256_file(cut / "model.int8.onnx")
    events = [json.loads(line)["event"] for line in (cut / artifacts.QAT_METRICS).read_text().splitlines()]
    assert events[0] == "start" and "resume" in events


def test_qat_refuses_a_run_without_int8_and_needs_a_trained_model(trained, tmp_path, capsys):
    run = copy_run(trained("tiny_cnn"), tmp_path)
    assert cli("qat", "--run-dir", run, *TRAINED, "export.int8.enabled=false") == 2
    assert "export.int8.enabled is false" in capsys.readouterr().err
    assert cli("qat", "--run-dir", tmp_path / "empty", "--model", "tiny_cnn") == 2
    assert "train" in capsys.readouterr().err  # the stage to run first


def test_tune_qat_on_without_modelopts_torch_side_exits_3_before_any_work(trained, tmp_path, capsys, monkeypatch):
    run = copy_run(trained("tiny_cnn"), tmp_path)
    monkeypatch.setattr(qat, "availability", lambda: "No module named 'requests'; install the qat extra")
    assert cli("tune", "--run-dir", run, *TRAINED, "tune.qat=on") == 3
    assert "No module named 'requests'" in capsys.readouterr().err
    assert not (run / "tune.json").exists()  # refused before any mix was judged


def test_tune_third_rung_judges_and_times_qat_beside_ptq(trained, tmp_path):
    """tune.qat=on: QAT's graph is judged by the full gate and timed like every mix, and tune.md shows PTQ, the best
    PTQ mix and QAT side by side; the choice stays the fastest that passes."""
    run = copy_run(trained("tiny_cnn"), tmp_path)
    fast = ["tune.calibration_methods=[max]", "benchmark.batch_sizes=[1,4]", "tune.min_duration_s=0.02",
            "tune.warmup_s=0", "benchmark.min_iterations=3"]
    assert cli("tune", "--run-dir", run, "--no-speed-gate", *TRAINED, *fast, "tune.qat=on") == 0
    report = json.loads((run / "tune.json").read_text())
    rungs = {r["rung"]: r for r in report["ladder"]["rungs"]}
    assert report["ladder"]["qat_ran"] and list(rungs) == ["PTQ (every layer INT8)", "best PTQ mix", "QAT"]
    assert rungs["QAT"]["ran"] and rungs["QAT"]["int8_layers"] == rungs["PTQ (every layer INT8)"]["layers"]
    assert set(rungs["QAT"]["latency_ms"]) == {"1", "4"} and rungs["QAT"]["status"] in ("passed", "failed")
    assert "PTQ, best PTQ mix and QAT side by side" in (run / "tune.md").read_text()
    qat_row = next(c for c in report["candidates"] if c["origin"] == "QAT")
    fallback = json.loads((run / "int8_fallback.json").read_text())
    assert fallback.get("method", "ptq") == ("qat" if qat_row["chosen"] else "ptq")
