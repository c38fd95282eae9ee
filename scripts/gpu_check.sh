#!/usr/bin/env bash
# The whole GPU path on a tiny configuration, in a few minutes: `pipeline doctor` first (the stack, one line
# per part, every CUDA mismatch), then CUDA AMP training (fp16 + GradScaler), export (FP32, AutoCast FP16 and,
# where ModelOpt quantizes, Q/DQ INT8 ONNX), one strongly typed TensorRT engine per precision, verify with
# TensorRT required, benchmark with CUDA events, the GPU-marked tests and bench-train. Where TensorRT is missing
# it still runs every CUDA step and says what it could not run. docs/gpu-validation.md says what each step checks.
#
#   scripts/gpu_check.sh [RUN_DIR]        (default: runs/gpu_check)
#
# Exit code: 0 when everything ran and passed, 1 when a step failed, 3 when only TensorRT was missing.
set -u
cd "$(dirname "$0")/.."
RUN="${1:-runs/gpu_check}"
PY="${PYTHON:-python3}"
TINY=(train.epochs=1 data.samples_per_class=40 data.image_size=32 data.batch_size=32
      verify.samples=64 benchmark.batch_sizes=[1,8] benchmark.min_duration_s=0.2 benchmark.trials=2)
declare -a SUMMARY=()
status=0
note() { SUMMARY+=("$1"); echo "== $1"; }
step() {  # step NAME EXPECTED_CODES... -- COMMAND...
    local name=$1; shift
    local ok=()
    while [ "$1" != "--" ]; do ok+=("$1"); shift; done; shift
    local t0=$SECONDS
    "$@"
    local rc=$?
    local took=$((SECONDS - t0))
    if [[ " ${ok[*]} " == *" $rc "* ]]; then
        note "$name: exit $rc (${took}s) ok"
    else
        note "$name: exit $rc (${took}s) FAILED"; status=1
    fi
    return $rc
}

echo "== machine"
nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader 2>/dev/null \
    || echo "nvidia-smi not available"

echo "== doctor"
DOCTOR_OUT="$(mktemp)"
doctor() { "$PY" -m pipeline doctor "$@" 2>&1 | tee "$DOCTOR_OUT"; return "${PIPESTATUS[0]}"; }
step "doctor (the stack; --require cuda)" 0 -- doctor --require cuda
while IFS= read -r line; do note "doctor: $line"; done < <(grep -E '^(mismatch|libcudart|tensorrt|error)' "$DOCTOR_OUT")
rm -f "$DOCTOR_OUT"

have_trt=0
"$PY" -c "import tensorrt" 2>/dev/null && have_trt=1

rm -rf "$RUN"
step "train (cuda, amp fp16 + GradScaler)" 0 -- "$PY" -m pipeline train --model resnet18 --run-dir "$RUN" --require cuda train.device=cuda train.amp=fp16 "${TINY[@]}"
step "export (FP32 ONNX, AutoCast FP16 ONNX, INT8 Q/DQ ONNX)" 0 -- "$PY" -m pipeline export --run-dir "$RUN"
if [ $have_trt = 1 ]; then
    step "doctor --require tensorrt" 0 -- "$PY" -m pipeline doctor --require tensorrt >/dev/null
    step "build (strongly typed TensorRT engines: fp16, int8)" 0 -- "$PY" -m pipeline build --run-dir "$RUN" --require tensorrt
    step "verify (TensorRT required)" 0 -- "$PY" -m pipeline verify --run-dir "$RUN" --require tensorrt
else
    step "build without TensorRT (expect exit 3 with --require tensorrt)" 3 -- "$PY" -m pipeline build --run-dir "$RUN" --require tensorrt
    step "build without TensorRT (expect skipped)" 0 -- "$PY" -m pipeline build --run-dir "$RUN"
    step "verify (ONNX Runtime CUDA + emulation; TensorRT not installed)" 0 -- "$PY" -m pipeline verify --run-dir "$RUN" --require cuda
    note "NOT RUN: TensorRT engine build, TensorRT verify and TensorRT benchmark (TensorRT is not installed)"
fi
step "benchmark (CUDA events + host latency)" 0 -- "$PY" -m pipeline benchmark --run-dir "$RUN"
step "GPU-marked tests (pytest -m gpu)" 0 -- "$PY" -m pytest -q -m gpu -p no:cacheprovider
if "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    step "bench-train (fp16 vs fp32 on the GPU)" 0 -- "$PY" -m pipeline bench-train --model resnet18 --steps 20 data.image_size=224 data.batch_size=64 train.device=cuda
else  # bench-train falls back to the CPU, where ResNet-18 at 224x224 takes many minutes
    note "NOT RUN: bench-train (no CUDA GPU)"; status=1
fi

echo
echo "== results"
[ -f "$RUN/verify.md" ] && cat "$RUN/verify.md"
[ -f "$RUN/benchmark.md" ] && cat "$RUN/benchmark.md"
echo
echo "== engines"
[ -f "$RUN/manifest.json" ] && "$PY" - "$RUN/manifest.json" <<'PY'
import json, sys
build = json.load(open(sys.argv[1]))["stages"].get("build", {})
details = build.get("details", {})
print("build:", build.get("status"), build.get("reason", ""))
for precision, engine in details.get("engines", {}).items():
    print(f"  {precision}: {engine['engine']} = {engine['precision']}, built in {engine['build_seconds']} s")
for precision, reason in details.get("skipped", {}).items():
    print(f"  {precision}: skipped: {reason}")
PY
echo
echo "== summary"
printf '  %s\n' "${SUMMARY[@]}"
if [ $status = 0 ] && [ $have_trt = 0 ]; then exit 3; fi
exit $status
