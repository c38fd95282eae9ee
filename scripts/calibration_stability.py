"""Issue 48's measurements (docs/verify.md, "Calibration stability: measured"): per architecture and data set, the
INT8 verdict on held-out images against the old same-images verdict, and the stability certificate's pass share and
scale spread at several calibration sizes; the table the calibration default is chosen from.

    pip install scikit-learn                                  # the digits data set (measurement only)
    python scripts/calibration_stability.py --out stab/ [--models resnet18,mobilenet_v3_small,vit_micro]
        [--data synthetic,digits] [--sizes 16,64,256,512] [--draws 3] [--epochs 2]
    python scripts/calibration_stability.py --out stab/ --table   # the Markdown table from what was measured

Each run trains (``python -m pipeline train``) and exports (INT8 only) as a user would; the verdicts and the
certificate are the pipeline's own functions (:mod:`pipeline.evaluation.certificate`), judged by the INT8 gate's
faithful candidate (``int8_exact``). "Old" is the verdict before issue 48: calibrated on the first validation images
and judged on the whole validation split, those images included.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
COMMON = ["train.amp=off", "export.fp16.enabled=false", "export.bf16.enabled=false", "export.int8.enabled=true",
          "train.require_learning=false", "verify.batch_size=32"]


def digits_folder(out: Path, every: int = 1) -> Path:
    """sklearn's 1,797 handwritten digits (8x8, 10 classes) as an image folder (the gate corpus's first set); every
    ``every``-th image only, to keep a measurement on a busy 2-core machine short."""
    from PIL import Image
    from sklearn.datasets import load_digits

    root = out / "data" / "digits"
    if root.is_dir():
        return root
    d = load_digits()
    images, labels = (d.images * (255 / 16)).astype(np.uint8)[::every], d.target[::every]
    for i, (img, label) in enumerate(zip(images, labels, strict=True)):
        folder = root / f"class_{int(label)}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(img).convert("RGB").save(folder / f"{i:05d}.png")
    return root


def data_args(name: str, out: Path, every: int = 1) -> list[str]:
    if name == "synthetic":
        return []
    return ["data.source=imagefolder", f"data.path={digits_folder(out, every)}"]


def train_and_export(run: Path, model: str, args: list[str], epochs: int) -> float:
    start = time.perf_counter()
    if not (run / "model.int8.onnx").is_file():
        for stage, extra in (("train", ["--model", model, f"train.epochs={epochs}"]), ("export", [])):
            cmd = [sys.executable, "-m", "pipeline", stage, "--run-dir", str(run), *extra, *args, *COMMON]
            code = subprocess.call(cmd, cwd=ROOT, stdout=subprocess.DEVNULL)
            if code:
                raise SystemExit(f"{run.name}: {stage} exited {code}")
    return time.perf_counter() - start


def measure(run: Path, args: list[str], sizes: list[int], draws: int) -> dict:
    from pipeline import config
    from pipeline.core import modeling, roles
    from pipeline.core.run import RunDir
    from pipeline.evaluation import candidates, certificate
    from pipeline.precision import fallback, plugs

    base = config.resolve(config.load_yaml_file(run / "config.yaml"), None, [*args, *COMMON])
    run_dir = RunDir(run)
    model, card = modeling.load_trained(base, run_dir, "verify")
    plug = plugs.by_name("int8")
    gate = candidates.gate_for(base, plug.faithful, plug.name)
    held = candidates.evidence(base, card, model, roles.VERDICT)
    out = {"verdict_images": len(held.labels), "split_cut": held.parts.split, "sizes": {}}

    def overridden(*pairs: str):
        return config.resolve(config.load_yaml_file(run / "config.yaml"), None, [*args, *COMMON, *pairs])

    # The old verdict: calibrated on the first 64 validation images, judged on the whole split (those included).
    old_cfg = overridden("export.calibration_split=validation", "verify.min_held_out_images=100000")
    old = candidates.evidence(old_cfg, card, model, roles.VERDICT)
    one = [f"export.int8.stability.draws={2}"]
    result = certificate.certify(overridden(*one, "export.int8.stability.draw_size=64",
                                            "export.calibration_split=validation"),
                                 run_dir, card, plug, old, fallback.Raised(), "max", gate)
    out["old"] = {**result["draws"][0], "images": len(old.labels)}
    for size in sizes:
        cfg = overridden(f"export.int8.stability.draws={draws}", f"export.int8.stability.draw_size={size}",
                         f"export.int8.calibration_samples={size}")
        result = certificate.certify(cfg, run_dir, card, plug, held, fallback.Raised(), "max", gate)
        out["sizes"][str(size)] = {k: result[k] for k in ("certificate", "sampling", "draws", "gate_spread",
                                                           "scale_spread", "seconds")}
        if size == 64:
            out["held_out"] = result["draws"][0]
        print(f"  {run.parent.name} size {size}: {result['certificate']['line']}; activation scale spread median "
              f"{result['scale_spread']['activation']['median_relative']}; {result['seconds']} s", flush=True)
    return out


def table(out: Path) -> None:
    print("| architecture | data | verdict: held out (images) | old, same images (images) | size | pass share | "
          "scaled error across draws | activation scale spread (median / max) | seconds |")
    print("|---|---|---|---|---|---|---|---|---|")
    for path in sorted(out.glob("runs/*/stability.json")):
        m = json.loads(path.read_text())
        arch, data = m["model"], m["data"]
        if m.get("digits_every") not in (None, 1):
            data += f" (1 in {m['digits_every']} images)"
        h, o = m.get("held_out") or {}, m["old"]
        first = True
        for size, s in m["sizes"].items():
            c, g, a = s["certificate"], s["gate_spread"]["scaled_error"], s["scale_spread"]["activation"]
            lead = (f"| {arch} | {data} | {h.get('status', '-')} {_n(h.get('scaled_error'))} ({m['verdict_images']}) "
                    f"| {o['status']} {_n(o['scaled_error'])} ({o['images']}) |") if first else "| | | | |"
            undecided = sum(d["status"] == "inconclusive" for d in s["draws"])
            how = f"{s['sampling']}" + (f"; {undecided} inconclusive" if undecided else "")
            print(f"{lead} {size} | {c['passing']}/{c['draws']} ({how}) | {_n(g['min'])}-{_n(g['max'])} | "
                  f"{_p(a['median_relative'])} / {_p(a['max_relative'])} | {s['seconds']:.0f} |")
            first = False


def _n(v) -> str:
    return "-" if v is None else f"{v:.3g}"


def _p(v) -> str:
    return "-" if v is None else f"{100 * v:.1f} %"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("stab"))
    ap.add_argument("--models", default="resnet18,mobilenet_v3_small,vit_micro")
    ap.add_argument("--data", default="synthetic,digits")
    ap.add_argument("--sizes", default="16,64,256,512")
    ap.add_argument("--draws", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--extra", default="", help="more overrides, comma-separated")
    ap.add_argument("--digits-every", type=int, default=1, help="every n-th digit image only")
    ap.add_argument("--table", action="store_true")
    a = ap.parse_args()
    if a.table:
        table(a.out)
        return
    extra = [x for x in a.extra.split(",") if x]
    for data in a.data.split(","):
        for model in a.models.split(","):
            run = a.out / "runs" / f"{data}-{model}" / "run"
            target = run.parent / "stability.json"
            if target.is_file():
                continue
            args = [*data_args(data, a.out, a.digits_every), *extra]
            seconds = train_and_export(run, model, args, a.epochs)
            print(f"{data}-{model}: trained and exported in {seconds:.0f} s", flush=True)
            m = measure(run, args, [int(s) for s in a.sizes.split(",")], a.draws)
            from pipeline.core import env

            m.update({"model": model, "data": data, "epochs": a.epochs, "cpu": env.cpu_model(), "extra": extra,
                      "digits_every": a.digits_every if data == "digits" else None,
                      "train_export_seconds": round(seconds)})
            target.write_text(json.dumps(m, indent=1))


if __name__ == "__main__":
    main()
