"""A fast subset of the gate's calibration corpus (scripts/gate_corpus.py, docs/verify.md "Defaults and their
margins"): a real data set (the UCI handwritten digits as scikit-learn ships them, tests/data/digits.npz), a
sound model and two planted faults, with the default gate. Fails when a default loses its margin: every gating
candidate of the sound run must stay SOUND_MARGIN x under its precision's default, and each fault's target MARGIN x
over it."""

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from conftest import FAULTS, ROOT, cli
from pipeline import config
from pipeline.core.verdicts import counts_as_passed

MARGIN = 2.0
# The sound run's margin: 1.5x. On a 2-vCPU AMD EPYC (Zen 4) the sound tiny_cnn's int8_exact reached 0.263 of the
# 0.5 default (1.9x under it; 2.0x and more on the Xeon the corpus was measured on): kernels differ per ISA, and so
# do the trained weights (docs/verify.md, "Defaults and their margins").
SOUND_MARGIN = 1.5
DIGITS = ROOT / "tests" / "data" / "digits.npz"  # 1,797 8x8 images, 10 classes (UCI, CC BY 4.0, via scikit-learn)
COMMON = ["data.source=imagefolder", "data.image_size=16", "data.batch_size=32", "train.log_every=1",
          "train.amp=off", "export.fp16.calibration_samples=32", "export.int8.calibration_samples=32",
          "verify.batch_size=32", "benchmark.batch_sizes=[1]", "train.require_learning=false",  # barely trained too
          # No tune runs here: the whole validation split (180 images) is the verdict's, as the corpus margins were
          # measured (cut in half for tune's search, 90 images leave the sound BF16 run's 1 disagreement undecided).
          # Calibration is on the training split all the same.
          "verify.min_held_out_images=1000"]


@pytest.fixture(scope="module")
def digits(tmp_path_factory) -> Path:
    """Every second digit as an image folder (900 images: 720 to train, 180 to verify)."""
    data = np.load(DIGITS)
    root = tmp_path_factory.mktemp("digits") / "data"
    for i, (image, label) in enumerate(zip(data["images"][::2], data["labels"][::2], strict=True)):
        folder = root / f"digit_{label}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(image).convert("RGB").save(folder / f"{i:04d}.png")
    return root


def _verify(model: str, epochs: int, digits: Path, tmp_path: Path) -> dict:
    run = tmp_path / "run"
    args = ["--run-dir", run, f"data.path={digits}", f"train.epochs={epochs}", *COMMON]
    assert cli("train", "--model", model, *args) == 0
    assert cli("export", *args) == 0 and cli("build", *args) == 0
    cli("verify", *args)  # exit 1 is the point for the faults
    report = json.loads((run / "verify.json").read_text())
    return {c["name"]: c for c in report["candidates"]}


def _default(precision: str) -> float:
    return getattr(config.resolve({}, None, []).verify, precision).max_scaled_error


@pytest.mark.slow
def test_a_sound_model_on_real_digits_stays_well_under_every_default(digits, tmp_path):
    candidates = _verify("tiny_cnn", 6, digits, tmp_path)
    judged = {n: c for n, c in candidates.items() if c["status"] in ("passed", "failed", "inconclusive")}
    assert {"onnxrt_fp32", "fp16_emulation", "int8_exact"} <= set(judged)
    for name, c in judged.items():
        if not c["gates"]:
            continue
        scaled = c["tensor_check"]["scaled_error_quantile"]
        # Deployable under the default policy: passed, or inconclusive where a few disagreements on 180 images
        # decide neither way. On a 2-vCPU AVX2-only AMD EPYC the weights trained differently and int8_exact's
        # accuracy drop was 1.10 points (2 images) against the 1.00 allowed, lower bound -0.17: inconclusive,
        # rightly. The tensor check has no such excuse: it must pass, and by the margin below.
        assert c["tensor_check"]["passed"], (name, c["tensor_check"])
        assert counts_as_passed(c["status"], "pass"), (name, c["tensor_check"], c["task_check"])
        assert scaled <= _default(c["precision"]) / SOUND_MARGIN, (name, scaled, _default(c["precision"]))


@pytest.mark.slow
@pytest.mark.parametrize("fault,target", [("cancellation", "fp16_emulation"), ("outlier_channel", "int8_exact")])
def test_planted_faults_on_real_digits_stay_well_over_their_default(digits, tmp_path, fault, target):
    c = _verify(f"{FAULTS}:{fault}", 3, digits, tmp_path)[target]
    assert c["status"] == "failed"
    assert c["tensor_check"]["scaled_error_quantile"] >= _default(c["precision"]) * MARGIN, c["tensor_check"]
