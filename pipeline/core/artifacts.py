"""Every file name the pipeline reads or writes in a run directory, in one place.

A stage names its outputs and inputs through these constants, so renaming an artifact is one
edit and the stage table, the report and the docs cannot drift apart. Plain strings only: this
module imports nothing, so the command line can use it without loading any library.
"""

# run directory bookkeeping (pipeline/core/run.py)
MANIFEST = "manifest.json"
CONFIG = "config.yaml"
LOCK = ".lock"
DATA_DIGESTS = "data.digests.json"  # the sha256 of each data file, by its stat: re-runs hash only what changed

# train
CHECKPOINT = "checkpoint.pt"
BEST_CHECKPOINT = "checkpoint.best.pt"
WEIGHTS = "model.safetensors"
MODEL_CARD = "model.json"
METRICS = "metrics.jsonl"
CURVE = "train_curve.png"
TRACE = "train.trace.json"
TENSORBOARD = "tensorboard"  # a directory

# export: one graph per lower precision (pipeline/precision/plugs.py), its fallback file, and the graph the fallback
# is trying; build: one strongly typed TensorRT engine per precision, with its sidecar


def graph_file(precision: str) -> str:
    """``model.<precision>.onnx``: the graph that carries the precision's decisions (export writes it)."""
    return f"model.{precision}.onnx"


def fallback_file(precision: str) -> str:
    """The nodes ``verify --auto-fallback`` or ``tune`` raised, kept across re-exports."""
    return f"{precision}_fallback.json"


def fallback_candidate_file(precision: str) -> str:
    """The graph ``verify --auto-fallback`` is trying, while it tries it."""
    return f"model.{precision}.fallback.onnx"


def engine_file(precision: str) -> str:
    """The strongly typed TensorRT engine built from :func:`graph_file` (build.precisions)."""
    return f"model.{precision}.engine"


def engine_sidecar(precision: str) -> str:
    return f"{engine_file(precision)}.json"


FP32_ONNX = "model.onnx"
CALIBRATION = "calibration.npz"
CALIBRATION_IMAGES = "calibration_images.json"  # which images calibrated each lower-precision graph (core.roles)
SEARCH_IMAGES = "search_images.json"  # which images tune's search judged on (core.roles)
FP16_ONNX, BF16_ONNX, INT8_ONNX = graph_file("fp16"), graph_file("bf16"), graph_file("int8")
FP16_FALLBACK, BF16_FALLBACK, INT8_FALLBACK = fallback_file("fp16"), fallback_file("bf16"), fallback_file("int8")
FP16_ENGINE, BF16_ENGINE, INT8_ENGINE = engine_file("fp16"), engine_file("bf16"), engine_file("int8")
FP16_ENGINE_SIDECAR, BF16_ENGINE_SIDECAR, INT8_ENGINE_SIDECAR = (engine_sidecar(p) for p in ("fp16", "bf16", "int8"))
OPENVINO_DIR = "openvino"  # OpenVINO IR: openvino/<precision>.xml + .bin + .json sidecar (build)
IR_TEMP_PREFIX = ".ir."  # openvino/.ir.*/: a conversion's temporary folder, removed when it ends

# qat (quantization-aware fine-tuning; it writes model.int8.onnx): its checkpoints (quantizer state included), metrics
# and curve, beside train's
QAT_CHECKPOINT = "qat.checkpoint.pt"
QAT_BEST_CHECKPOINT = "qat.checkpoint.best.pt"
QAT_METRICS = "qat.metrics.jsonl"
QAT_CURVE = "qat_curve.png"

# verify
VERIFY_JSON = "verify.json"
VERIFY_MD = "verify.md"
VERIFY_JUNIT = "verify.junit.xml"
VERIFY_BOXES = "verify_boxes.png"  # a detector's validation images, reference and candidate boxes (docs/detection.md)
VERIFY_PREDICTIONS = "verify.predictions.npz"  # each candidate's top-5 classes and logits per image (baseline/compare)

# benchmark
BENCHMARK_JSON = "benchmark.json"
BENCHMARK_MD = "benchmark.md"
LATENCY_PLOT = "benchmark_latency.png"
THROUGHPUT_PLOT = "benchmark_throughput.png"
PROFILE_PLOT = "benchmark_profile.png"  # per-layer time by layer type and precision, each CPU artifact (issue 35)
BENCHMARK_TRACE = "benchmark.trace.json"
TRTEXEC_DIR = "trtexec"  # trtexec beside the TensorRT rows: <backend>.b<batch>.<kind>.times.json/.profile.json/.log

# compare (a run against a baseline bundle; `python -m pipeline baseline` writes the bundle)
COMPARE_JSON = "compare.json"
COMPARE_MD = "compare.md"
COMPARE_JUNIT = "compare.junit.xml"

# deploy (a Triton model repository outside the run directory, `deploy --out DIR`; docs/deploy.md)
DEPLOY_JSON = "deploy.json"  # what deploy wrote, refused, served and timed (the report's serving section)
TRITON_CONFIG = "config.pbtxt"  # per model: Triton's ModelConfig, protobuf text format
TRITON_SIDECAR = "pipeline.json"  # per model: the verify verdict and the sha256 it was deployed on
TRITON_VERSION = "1"  # the model version folder
DEPLOY_WORKSPACE_PREFIX = ".triton."  # `deploy --serve`: PyTriton's sockets and model store, removed when it ends

# report
TUNE_JSON = "tune.json"  # python -m pipeline tune: sensitivity, candidates, timings, the choice (INT8)
TUNE_MD = "tune.md"
TUNE_SENSITIVITY_PLOT = "tune_sensitivity.png"
TUNE_PARETO_PLOT = "tune_pareto.png"
STABILITY_PLOT = "stability.png"  # verify's calibration stability certificate: the gate statistic of every draw
TUNE_STABILITY_PLOT = "tune_stability.png"  # tune's, for its chosen INT8 mix
# INT8's tune files kept their first names; every other precision's carry its name.
FIRST_TUNE_FILES = {"int8": (TUNE_JSON, TUNE_MD, TUNE_SENSITIVITY_PLOT, TUNE_PARETO_PLOT)}


def tune_files(precision: str) -> tuple[str, str, str, str]:
    """tune's report, markdown and two plots for one precision: INT8's are ``tune.json`` and the rest, FP16's
    ``tune.fp16.json`` and so on, so tuning one precision never replaces another's report."""
    return FIRST_TUNE_FILES.get(precision, (f"tune.{precision}.json", f"tune.{precision}.md",
                                            f"tune_{precision}_sensitivity.png", f"tune_{precision}_pareto.png"))

REPORT_HTML = "report.html"
REPORT_MD = "report.md"

# verify and benchmark: a native runtime's child process (pipeline/runtime/isolate.py)
LOGS = "logs"  # a directory: the stderr of every child, logs/<stage>.<backend>.log
ISOLATE_PREFIX = ".isolate."  # its temporary folder (inputs and outputs), removed when the child ends


def build_log(precision: str) -> str:
    """Everything TensorRT, its ONNX parser and Polygraphy logged while building one engine."""
    return f"{LOGS}/build.tensorrt.{precision}.log"


def child_log(stage: str, backend: str) -> str:
    """The log of ``backend``'s child process in ``stage``, relative to the run directory."""
    return f"{LOGS}/{stage}.{backend}.log"


def timing_cache_name(tensorrt: str | None, gpu: str | None, compute_capability: str | None) -> str:
    """The TensorRT timing cache beside the run directories, one per TensorRT version, GPU and compute capability.

    ``trt_timing.11.4.0.NVIDIA_H200.sm90.cache``: TensorRT warns that "combining caches generated from devices with
    different device properties may lead to functional/performance bugs" (``NvInfer.h``, ``ITimingCache::combine``)
    and Polygraphy's ``EngineBytesFromNetwork`` combines the cache on disk into the new one with
    ``ignore_mismatch=True``; an H100 and an H200 are both ``sm90``, so the GPU's name is part of the key too.
    """
    sm = "sm" + str(compute_capability or "unknown").replace(".", "")
    return f"trt_timing.{tensorrt or 'unknown'}.{file_safe(gpu or 'unknown')}.{sm}.cache"


FILE_SAFE_CHARS = 64


def file_safe(text: str) -> str:
    """``text`` as one part of a file name: letters, digits and ``-`` kept, every other run of characters one ``_``
    (no separator, no dot, no space), at most :data:`FILE_SAFE_CHARS` characters; "unknown" when nothing is left."""
    kept = [ch if ch.isascii() and (ch.isalnum() or ch == "-") else "_" for ch in text]
    joined = "".join(ch for i, ch in enumerate(kept) if ch != "_" or i == 0 or kept[i - 1] != "_")
    return joined.strip("_")[:FILE_SAFE_CHARS] or "unknown"


def xml_name(precision: str) -> str:
    """An OpenVINO IR's graph (``openvino/fp32.xml``); its weights are :func:`bin_name`."""
    return f"{OPENVINO_DIR}/{precision}.xml"


def bin_name(precision: str) -> str:
    return f"{OPENVINO_DIR}/{precision}.bin"


def sidecar_name(precision: str) -> str:
    return f"{OPENVINO_DIR}/{precision}.json"
