"""Detection (issue 50): the box metrics against pycocotools, the gate's box decisions (properties), the decode and
NMS in the graph against PyTorch's, the data sources, ``all`` on the embedded detection set and on a COCO-format
folder, and the planted detector faults (tests/fault_models.py)."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import FAULTS, cli, copy_run
from pipeline.core import boxes
from pipeline.core.status import Status
from pipeline.precision import detection_gate

# Small and quick: the tiny fault detectors at 32x32 (8x8 cells), FP32 training, INT8 and BF16 off unless a test
# needs them, the benchmark on three rows.
DET_TINY = ["data.image_size=32", "data.samples_per_class=40", "data.batch_size=16", "train.epochs=3",
            "train.optimizer=adamw", "train.lr=0.003", "train.amp=off", "train.require_learning=false",
            "train.log_every=100", "export.fp16.calibration_samples=16", "export.int8.enabled=false",
            "export.bf16.enabled=false", "verify.samples=48", "verify.batch_size=16", "benchmark.batch_sizes=[1,4]",
            "benchmark.min_duration_s=0.02", "benchmark.min_iterations=3", "benchmark.trials=2", "benchmark.warmup_s=0",
            "benchmark.max_row_s=0.25", "benchmark.backends=[torch_fp32,onnxrt_fp32,onnxrt_fp16_cpu]"]
RULES = {"match_iou": 0.5, "min_score": 0.3, "min_matched_share": 0.9, "max_map_drop": 0.02, "bootstrap": 50}


# --------------------------------------------------------------------------- metrics and decisions (pure)


def pycocotools_map(dets: list[np.ndarray], truths: list[np.ndarray], classes: int) -> float:
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    images = [{"id": i + 1, "width": 100, "height": 100} for i in range(len(truths))]
    anns = [{"id": k + 1, "image_id": i + 1, "category_id": int(r[0]) + 1, "iscrowd": 0,
             "bbox": [r[1], r[2], r[3] - r[1], r[4] - r[2]], "area": (r[3] - r[1]) * (r[4] - r[2])}
            for k, (i, r) in enumerate((i, r) for i, t in enumerate(truths) for r in boxes.valid_truth(t))]
    results = [{"image_id": i + 1, "category_id": int(r[5]) + 1, "bbox": [r[0], r[1], r[2] - r[0], r[3] - r[1]],
                "score": float(r[4])} for i, d in enumerate(dets) for r in boxes.valid_detections(d)]
    if not anns:
        return 0.0
    if not results:
        return 0.0
    with contextlib.redirect_stdout(io.StringIO()):
        gt = COCO()
        gt.dataset = {"images": images, "annotations": anns,
                      "categories": [{"id": c + 1, "name": str(c)} for c in range(classes)]}
        gt.createIndex()
        ev = COCOeval(gt, gt.loadRes(results), "bbox")
        ev.params.areaRng = [[0, 1e10]] * 4  # the area range "all" only
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    return float(ev.stats[0])


@st.composite
def detection_sets(draw):
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    n, classes = int(rng.integers(1, 7)), 3
    truths, dets = [], []
    for _ in range(n):
        t = np.full((5, 5), -1.0)
        for j in range(int(rng.integers(0, 5))):
            x, y = rng.uniform(0, 60, 2)
            w, h = rng.uniform(4, 40, 2)
            t[j] = [rng.integers(0, classes), x, y, x + w, y + h]
        d = np.zeros((8, 6))
        for j in range(int(rng.integers(0, 8))):
            if j < 5 and t[j, 0] >= 0 and rng.random() < 0.7:  # near a true box
                d[j] = [*(t[j, 1:5] + rng.normal(0, 3, 4)), rng.uniform(0.05, 1), t[j, 0]]
            else:
                x, y = rng.uniform(0, 60, 2)
                w, h = rng.uniform(4, 40, 2)
                d[j] = [x, y, x + w, y + h, rng.uniform(0.05, 1), rng.integers(0, classes)]
        truths.append(t)
        dets.append(d)
    return dets, truths, classes


@settings(max_examples=30, deadline=None)
@given(detection_sets())
def test_map_is_pycocotools(case):
    dets, truths, classes = case
    assert boxes.coco_map(dets, truths, classes)["map"] == pytest.approx(pycocotools_map(dets, truths, classes),
                                                                         abs=1e-9)


@settings(max_examples=30, deadline=None)
@given(detection_sets())
def test_the_same_boxes_pass_and_agree_fully(case):
    dets, truths, classes = case
    result = detection_gate.task_check(dets, [d.copy() for d in dets], truths, classes, RULES, 0.95)
    assert result.status == Status.PASSED and result.map_drop == 0 and result.matched_share == 1.0


@settings(max_examples=30, deadline=None)
@given(detection_sets())
def test_boxes_moved_past_the_match_iou_are_unmatched(case):
    """Every box moved off the image: IoU 0 with every reference box, so nothing matches and every box counts."""
    dets, truths, classes = case
    moved = [d.copy() for d in dets]
    for d in moved:
        d[:, [0, 2]] += 1000
    same = boxes.agreement(dets, dets, 0.5, 0.3)
    agree = boxes.agreement(dets, moved, 0.5, 0.3)
    assert same.matched == same.reference_boxes == same.boxes
    assert agree.matched == 0 and agree.boxes == 2 * same.boxes
    result = detection_gate.task_check(dets, moved, truths, classes, RULES, 0.95)
    if same.boxes >= 12:  # enough boxes for the bound to show it
        assert result.agreement.status == Status.FAILED


@settings(max_examples=30, deadline=None)
@given(detection_sets())
def test_boxes_of_another_class_are_unmatched(case):
    """The same places, another class: no pair matches (the same class is part of the rule)."""
    dets, truths, classes = case
    relabelled = [d.copy() for d in dets]
    for d in relabelled:
        d[:, 5] = classes  # a class no reference box has
    assert boxes.agreement(dets, relabelled, 0.5, 0.3).matched == 0


@settings(max_examples=200, deadline=None)
@given(st.floats(-1, 1), st.lists(st.floats(-1, 1), min_size=1, max_size=50), st.floats(0, 0.5),
       st.floats(0.5, 0.99))
def test_map_drop_decisions(drop, resampled, maximum, confidence):
    r = detection_gate.map_drop_check(drop, np.array(resampled), maximum, confidence)
    lower = np.quantile(resampled, 1 - confidence)
    assert r.status == (Status.PASSED if drop <= maximum else Status.FAILED if lower > maximum
                           else Status.INCONCLUSIVE)
    assert detection_gate.map_drop_check(float("nan"), np.array(resampled), maximum, confidence).status == \
        Status.FAILED


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 500), st.integers(0, 500), st.floats(0.5, 1.0))
def test_matched_share_fails_only_when_its_bound_shows_it(matched, extra, minimum):
    agree = boxes.BoxAgreement(matched, matched + extra, matched + extra, matched)
    r = detection_gate.matched_check(agree, minimum, 0.95)
    if agree.share >= minimum:
        assert r.status == Status.PASSED
    elif r.status == Status.FAILED:
        assert r.upper_bound < minimum
    else:
        assert r.status == Status.INCONCLUSIVE and r.upper_bound >= minimum


def test_a_classifiers_card_and_task_are_as_before():
    """Classification files stay as they were: no ``task`` key in a classifier's card spec, logits as its output."""
    from pipeline.core import tasks
    from pipeline.core.registry import models

    spec = models.get_spec("resnet18")
    assert "task" not in spec.to_dict() and tasks.of(spec.to_dict()).outputs(spec.to_dict()) == ["logits"]
    detector = models.get_spec("centernet_resnet18").to_dict()
    assert detector["task"] == "detection" and tasks.of(detector).outputs(detector) == ["head", "detections"]


# --------------------------------------------------------------------------- decode and NMS in the graph


def test_decode_and_nms_in_onnx_answer_as_pytorch(tmp_path):
    """The exported post-processing (ONNX NonMaxSuppression, ScatterND, TopK) gives PyTorch's detections, at any
    batch size (dynamic batch), on heads with many overlapping candidates."""
    import onnxruntime as ort

    from models.detector import PostProcess

    post = PostProcess(3).eval()
    torch.manual_seed(0)
    head = torch.randn(2, 7, 8, 8) * 2
    path = tmp_path / "post.onnx"
    torch.onnx.export(post, (head,), str(path), dynamo=False, opset_version=18, input_names=["head"],
                      output_names=["detections"], dynamic_axes={"head": {0: "b"}, "detections": {0: "b"}})
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    ops = {n.op_type for n in __import__("onnx").load(str(path)).graph.node}
    assert "NonMaxSuppression" in ops
    for batch in (1, 3, 5):
        h = torch.randn(batch, 7, 8, 8) * 2
        want = post(h).numpy()
        got = session.run(None, {"head": h.numpy()})[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
        assert (want[:, :, 4] > 0).sum(1).min() > 0  # boxes survived NMS, and some were suppressed
        assert (want[:, :, 4] > 0).sum() < batch * want.shape[1] * 2


# --------------------------------------------------------------------------- data


def test_the_embedded_detection_set_is_deterministic_with_boxes_inside():
    from pipeline.core import detection_data

    a, ta = detection_data.synthetic_detection(4, 6, 48, seed=3)
    b, tb = detection_data.synthetic_detection(4, 6, 48, seed=3)
    assert torch.equal(a, b) and torch.equal(ta, tb)
    rows = ta.reshape(-1, 5)
    rows = rows[rows[:, 0] >= 0]
    assert len(rows) >= 6 and rows[:, 0].max() < 4
    assert (rows[:, 1] >= 0).all() and (rows[:, 3] <= 48).all() and (rows[:, 3] > rows[:, 1]).all()


def test_the_real_image_scenes_are_deterministic_with_tight_boxes_on_the_pasted_objects():
    """data.source=scenes: matplotlib's sample images composited; each box is tight around pixels that changed."""
    from pipeline.core import scene_data

    a, ta = scene_data.scene_detection(4, 12, 48, seed=3)
    b, tb = scene_data.scene_detection(4, 12, 48, seed=3)
    assert torch.equal(a, b) and torch.equal(ta, tb)
    assert not torch.equal(a, scene_data.scene_detection(4, 12, 48, seed=4)[0])
    rows = ta.reshape(-1, 5)
    rows = rows[rows[:, 0] >= 0]
    assert len(rows) >= 12 and set(rows[:, 0].long().tolist()) == {0, 1, 2, 3}
    assert (rows[:, 1:3] >= 0).all() and (rows[:, 3:] <= 48).all() and (rows[:, 3:] > rows[:, 1:3]).all()
    objects, backgrounds = scene_data.sources()
    assert len(objects) == 4 and len(backgrounds) == 3 and all(o[3].mean() > 0.2 for o in objects)


def test_the_scenes_are_a_detectors_data_source_and_a_classifier_is_refused(tmp_path, capsys):
    from pipeline import config
    from pipeline.core import data

    cfg = config.resolve(overrides=["model.name=centernet_resnet18", "data.source=scenes", "data.samples_per_class=10"])
    splits = data.load(cfg.data, image_size=32, mean=(0.5,) * 3, std=(0.25,) * 3, task="detection")
    assert splits.classes == ["face", "present", "logo", "brain"] and len(splits.train) + len(splits.val) == 20
    x, y = splits.val[0]
    assert x.shape == (3, 32, 32) and y.shape[-1] == 5
    assert data.content_summary(cfg.data, None)["source"] == "scenes"
    assert cli("train", "--model", "tiny_cnn", "--run-dir", tmp_path / "run", "data.source=scenes",
               "data.image_size=16") == 2
    assert "holds boxes, but the model is a classifier" in capsys.readouterr().err


def make_coco_folder(root: Path, images: int = 48, size: int = 40) -> Path:
    """A COCO-format folder: PNG files drawn from the embedded set at another size, and annotations.json."""
    from PIL import Image

    from pipeline.core import detection_data

    pixels, targets = detection_data.synthetic_detection(3, images, size, seed=7)
    (root / "images").mkdir(parents=True)
    anns, infos = [], []
    for i in range(images):
        name = f"img_{i:03d}.png"
        Image.fromarray(pixels[i].permute(1, 2, 0).numpy()).save(root / "images" / name)
        infos.append({"id": i + 1, "file_name": name, "width": size, "height": size})
        for r in targets[i]:
            if r[0] >= 0:
                x1, y1, x2, y2 = (float(v) for v in r[1:])
                anns.append({"id": len(anns) + 1, "image_id": i + 1, "category_id": int(r[0]) + 10,
                             "bbox": [x1, y1, x2 - x1, y2 - y1], "area": (x2 - x1) * (y2 - y1), "iscrowd": 0})
    cats = [{"id": 10 + c, "name": name} for c, name in enumerate(("square", "disc", "triangle"))]
    (root / "annotations.json").write_text(json.dumps({"images": infos, "annotations": anns, "categories": cats}))
    return root


def test_a_coco_folder_that_is_not_one_is_one_line_and_exit_2(tmp_path, capsys):
    (tmp_path / "data").mkdir()
    assert cli("train", "--model", f"{FAULTS}:det_tiny", "--run-dir", tmp_path / "run", "data.source=coco",
               f"data.path={tmp_path / 'data'}", *DET_TINY) == 2
    err = capsys.readouterr().err
    assert "is not a COCO-format folder" in err and "Traceback" not in err


def test_a_classifier_on_boxes_is_refused(tmp_path, capsys):
    root = make_coco_folder(tmp_path / "coco", images=6)
    assert cli("train", "--model", "tiny_cnn", "--run-dir", tmp_path / "run", "data.source=coco",
               f"data.path={root}", "data.image_size=16") == 2
    assert "holds boxes, but the model is a classifier" in capsys.readouterr().err


# --------------------------------------------------------------------------- every stage


def assert_speaks_of_boxes(run: Path, capsys) -> None:
    out = capsys.readouterr()
    text = out.out + out.err  # the summary and every stage's log lines
    summary = text[text.index("run directory:"):]
    train_line = next(line for line in summary.splitlines() if line.strip().startswith("train "))
    verify_line = next(line for line in summary.splitlines() if line.strip().startswith("verify "))
    assert "mAP@0.5:0.95" in train_line and "mAP@0.5:0.95" in verify_line, summary
    assert "top-1" not in text and "val acc" not in text, text
    assert "matched boxes" in text  # verify's log line per candidate


def test_all_on_a_coco_folder(tmp_path, capsys):
    root = make_coco_folder(tmp_path / "coco")
    run = tmp_path / "run"
    assert cli("all", "--model", f"{FAULTS}:det_tiny", "--run-dir", run, "data.source=coco", f"data.path={root}",
               *DET_TINY, "data.batch_size=8", "verify.samples=16", "verify.batch_size=8") == 0
    assert_speaks_of_boxes(run, capsys)
    report = json.loads((run / "verify.json").read_text())
    assert report["task"] == "detection" and report["inputs"]["source"] == "coco"
    emu = next(c for c in report["candidates"] if c["name"] == "fp16_emulation")
    assert emu["status"] == Status.PASSED and emu["task_check"]["task"] == "detection"
    import onnx

    from pipeline.precision import fp16

    precisions = fp16.node_precisions(onnx.load(str(run / "model.onnx")), onnx.load(str(run / "model.fp16.onnx")))
    post = {name: p for name, (_, p) in precisions.items() if name.startswith("/postprocess/")}
    assert post and set(post.values()) == {"fp32"}  # decode and NMS in FP32 by rule
    assert any(p == "fp16" for _, p in precisions.values())  # and the network in FP16
    card = json.loads((run / "model.json").read_text())
    assert card["classes"] == ["square", "disc", "triangle"] and card["spec"]["task"] == "detection"
    assert_triton_configs_carry_the_detections(run, tmp_path / "repo")


def assert_triton_configs_carry_the_detections(run: Path, out: Path) -> None:
    """deploy's config.pbtxt declares both outputs with the dims the artifact returns: ``detections`` is [20, 6]
    after the batch (the tracer left it symbolic; export declares it), as ONNX Runtime computes it."""
    pytest.importorskip("tritonclient.grpc", reason="tritonclient[grpc] (the deploy extra) is not installed")
    import onnxruntime as ort
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as mc

    assert cli("deploy", "--run-dir", run, "--out", out) == 0
    x = np.zeros((3, 3, 32, 32), np.float32)
    head, dets = ort.InferenceSession(str(run / "model.onnx")).run(["head", "detections"], {"input": x})
    folders = [f for f in out.iterdir() if f.is_dir()]
    assert folders
    for folder in folders:
        config = text_format.Parse((folder / "config.pbtxt").read_text(), mc.ModelConfig())
        cut = 1 if config.max_batch_size > 0 else 0  # OpenVINO's batch is in dims (-1)
        dims = {o.name: tuple(o.dims) for o in config.output}
        want = {"head": head.shape[1:], "detections": dets.shape[1:]}
        assert dims == {k: (-1,) * (1 - cut) + v for k, v in want.items()}, (folder.name, dims)
        assert want["detections"] == (20, 6)


@pytest.mark.slow
def test_all_on_the_embedded_detection_set(tmp_path, capsys):
    run = tmp_path / "run"
    assert cli("all", "--model", f"{FAULTS}:det_tiny", "--run-dir", run, *DET_TINY) == 0
    assert_speaks_of_boxes(run, capsys)
    export = json.loads((run / "manifest.json").read_text())["stages"]["export"]["details"]
    assert export["fp16"]["fp32_by_rule"]["nodes"] > 0  # the decode and NMS stay in FP32, and it says so
    assert export["exporter_warnings"] == []  # the static height and width are the design, not a tracer problem
    verify_md = (run / "verify.md").read_text()
    assert "| matched boxes | mAP@0.5:0.95 (ref) |" in verify_md and "top-1" not in verify_md  # a detector's columns
    verify = json.loads((run / "manifest.json").read_text())["stages"]["verify"]
    assert "verify_boxes.png" in verify["artifacts"]  # drawn, and recorded as verify's
    assert cli("report", "--run-dir", run) == 0
    import base64
    import html as html_mod

    page = (run / "report.html").read_text()
    title = html_mod.escape("Validation images: the reference's boxes and a candidate's (a detector)")
    head = f"<figcaption>{title}</figcaption><img alt='{title}' src='data:image/png;base64,"
    assert head in page, "report.html does not show verify_boxes.png"
    embedded = page[page.index(head) + len(head):].split("'", 1)[0]
    assert base64.b64decode(embedded) == (run / "verify_boxes.png").read_bytes()  # the drawing verify wrote


def _colour_pixels(path: Path) -> dict[str, int]:
    """How many pixels of the drawing are the reference's box colour (lime) and the candidate's (red)."""
    from PIL import Image

    with Image.open(path) as img:
        rgb = np.asarray(img.convert("RGB")).astype(int)
    r, g, b = rgb[..., 0], rgb[..., 1], rgb[..., 2]
    return {"lime": int(((g > 200) & (r < 80) & (b < 80)).sum()), "red": int(((r > 200) & (g < 80) & (b < 80)).sum())}


@pytest.mark.parametrize(("ref_score", "cand_score"), [(0.29, 0.9), (0.9, 0.29)])  # each side under and over
def test_verify_boxes_draws_exactly_the_boxes_scored_at_least_the_minimum(tmp_path, ref_score, cand_score):
    from pipeline.reports import detection_plot

    images = np.zeros((2, 3, 32, 32), np.float32)  # grey once the mean is added back: no colour of its own
    box = [4.0, 4.0, 24.0, 24.0]
    reference = np.array([[box + [ref_score, 0.0]]] * 2, np.float32)
    candidate = np.array([[box + [cand_score, 1.0]]] * 2, np.float32)
    path = tmp_path / "verify_boxes.png"
    detection_plot.draw(path, images, np.full((1, 1, 3), 0.5), np.ones((1, 1, 3)), reference, candidate, "int8_exact",
                        ["a", "b"], 0.3)
    colours = _colour_pixels(path)
    assert (colours["lime"] > 0) == (ref_score >= 0.3) and (colours["red"] > 0) == (cand_score >= 0.3), colours


def test_verify_boxes_shows_the_first_failed_candidate_else_the_lowest_precision_that_ran():
    from types import SimpleNamespace as C

    from pipeline.reports import detection_plot

    fp16 = C(name="fp16", gates=True, status=Status.PASSED, precision="fp16")
    int8 = C(name="int8", gates=True, status=Status.INCONCLUSIVE, precision="int8")
    bf16_failed = C(name="bf16", gates=True, status=Status.FAILED, precision="bf16")
    fp16_failed = C(name="fp16b", gates=True, status=Status.FAILED, precision="fp16")
    report_only = C(name="ort_int8", gates=False, status=Status.FAILED, precision="int8")
    skipped = C(name="trt_int8", gates=True, status=Status.SKIPPED, precision="int8")
    assert detection_plot.chosen([fp16, int8]) is int8
    assert detection_plot.chosen([int8, fp16]) is int8
    assert detection_plot.chosen([fp16, int8, bf16_failed, fp16_failed]) is bf16_failed
    assert detection_plot.chosen([report_only, skipped, fp16]) is fp16
    assert detection_plot.chosen([report_only, skipped]) is None


# --------------------------------------------------------------------------- planted faults


@pytest.fixture(scope="module")
def trained_detectors(tmp_path_factory):
    runs = {}

    def get(factory: str, *extra: str) -> Path:
        if factory not in runs:
            run = tmp_path_factory.mktemp(factory) / "run"
            assert cli("train", "--model", f"{FAULTS}:{factory}", "--run-dir", run, *DET_TINY, *extra) == 0
            runs[factory] = run
        return runs[factory]

    return get


def candidate(run: Path, name: str) -> dict:
    return next(c for c in json.loads((run / "verify.json").read_text())["candidates"] if c["name"] == name)


def test_fp16_decode_overflow_fails_and_the_fallback_fixes_it(trained_detectors, tmp_path, capsys):
    run = copy_run(trained_detectors("det_decode_overflow"), tmp_path)
    assert cli("export", "--run-dir", run, "export.fp16.range_rule=false") == 0
    assert cli("verify", "--run-dir", run) == 1
    err = capsys.readouterr().err
    emu = candidate(run, "fp16_emulation")
    assert emu["status"] == Status.FAILED and emu["tensor_check"]["nonfinite"] > 0, emu
    assert "non-finite" in err or "NaN" in err or "inf" in err.lower(), err
    assert cli("verify", "--run-dir", run, "--auto-fallback") == 0
    assert candidate(run, "fp16_emulation")["status"] == Status.PASSED


def test_int8_hostile_regression_head_fails(trained_detectors, tmp_path, capsys):
    run = copy_run(trained_detectors("det_outlier_regression"), tmp_path)
    assert cli("export", "--run-dir", run, "export.int8.enabled=true") == 0
    import onnx

    # The decode and NMS stay out of INT8: a Q/DQ pair on the peak pick's heatmap made ONNX Runtime's CPU compare
    # two precisions of it (docs/detection.md) and lose most boxes.
    graph = onnx.load(str(run / "model.int8.onnx")).graph
    assert not [n.name for n in graph.node if n.name.startswith("/postprocess/")
                and n.op_type in ("QuantizeLinear", "DequantizeLinear")]
    assert any(n.op_type == "QuantizeLinear" for n in graph.node)  # and the network is quantized
    assert cli("verify", "--run-dir", run, "export.int8.enabled=true") == 1
    err = capsys.readouterr().err
    exact = candidate(run, "int8_exact")
    assert exact["status"] == Status.FAILED, exact
    assert "int8_exact" in err


def test_score_head_that_flips_nms_fails(trained_detectors, tmp_path, capsys):
    run = copy_run(trained_detectors("det_score_cancellation"), tmp_path)
    assert cli("export", "--run-dir", run) == 0
    assert cli("verify", "--run-dir", run) == 1
    emu = candidate(run, "fp16_emulation")
    assert emu["status"] == Status.FAILED, emu
    assert emu["task_check"]["matched_share"] < 1.0  # boxes appeared or vanished (measured: 36 of 48 matched)
    err = capsys.readouterr().err
    assert "fp16_emulation" in err and "matched boxes" in err


def test_a_detectors_recipe_sets_its_data_keys_and_they_go_with_it():
    """A detector's recipe sets data.image_size and data.batch_size; a run directory's config saved for it, resolved
    for a classifier, keeps only what the user chose (the classifier's own defaults come back)."""
    from pipeline import config

    det = config.resolve(overrides=["model.name=centernet_resnet18"])
    assert (det.data.image_size, det.data.batch_size) == (64, 16)
    saved = det.to_dict()
    cls = config.resolve(base=saved, overrides=["model.name=resnet18"])
    assert (cls.data.image_size, cls.data.batch_size) == (32, 64)
    mine = config.resolve(base=saved, overrides=["model.name=resnet18", "data.image_size=48"])
    assert mine.data.image_size == 48
