"""A stand-in for NVIDIA's ``trtexec``, put on PATH by tests/test_trtexec.py: it checks the PLUMBING (the
arguments benchmark passes, the JSON it reads back), not trtexec.

It speaks the trtexec of TensorRT 10.13 (default) or 11.1 (FAKE_TRTEXEC_VERSION=11), as
``samples/common/sampleOptions.cpp`` defines them: every run (``--help`` too) prints the ``[TensorRT vMMmmpp]``
banner. TensorRT 10: data transfers are on unless ``--noDataTransfers``; ``--includeDataTransfers`` is an unknown
option. TensorRT 11: data transfers are OFF unless ``--includeDataTransfers``; ``--noDataTransfers``,
``--useCudaGraph`` and ``--separateProfileRun`` are accepted as no-ops with a "[W]" warning.

It refuses (exit 1) an engine built by another TensorRT release than its own (the fake engine's header carries
the version that built it, tests/fake_tensorrt.py), as TensorRT's deserializer does. It refuses (exit 2, a
trtexec-style "[E]" line) a command that real trtexec would not run as benchmark means it:
an engine that is not the fake TensorRT engine, ``--shapes`` that are not ``<input>:<b>x<c>x<h>x<w>``, on
TensorRT 10 an ``--exportProfile`` without ``--separateProfileRun``, an unknown flag (TensorRT 11 knows
``--includeDataTransfers`` and ``--noCudaGraph``, 10 neither); which runs use ``--useCudaGraph`` the tests read
from FAKE_TRTEXEC_CALLS.
Otherwise it writes
``--exportTimes`` in trtexec's format (``samples/common/sampleReporting.cpp``: one record per timed inference
with ``startEnqMs … endD2hMs``, ``h2dMs``, ``computeMs``, ``d2hMs``, ``latencyMs`` = h2d + compute + d2h; the
transfers are 0 with ``--noDataTransfers``) and ``--exportProfile`` (``[{"count": N}, {"name", "timeMs",
"averageMs", "medianMs", "percentage"}, ...]``).

Environment: FAKE_TRTEXEC_VERSION (10 = 10.13.0, 11 = 11.1.0, or a release such as 10.14.1; default 10),
FAKE_TRTEXEC_COMPUTE_MS (the compute time per inference, default 1.0; "virtual": what tests/virtual_cuda.py gives
the engine's kernels), FAKE_TRTEXEC_FAIL_BATCH
(exit 1 at that batch), FAKE_TRTEXEC_SLEEP_BATCH (hang at that batch), FAKE_TRTEXEC_GARBAGE (bad JSON),
FAKE_TRTEXEC_CALLS (a file each command line is appended to, as JSON).
"""

import json
import os
import sys
import time

MAGIC = b"FAKE-TRT-FP16_ENGINE\n"
KNOWN = {"--loadEngine", "--shapes", "--useCudaGraph", "--noDataTransfers", "--warmUp", "--iterations", "--duration",
         "--exportTimes", "--exportProfile", "--separateProfileRun", "--help"}
NO_OPS_11 = ("--noDataTransfers", "--useCudaGraph", "--separateProfileRun")  # TensorRT 11: warned, ignored
BANNERS = {"10": "101300", "11": "110100"}  # 10.13.0 and 11.1.0: what tests/fake_tensorrt.py's modes build with


def banner(version: str) -> str:
    """The [TensorRT vMMmmpp] number of FAKE_TRTEXEC_VERSION: "10", "11", or a release "10.14.1"."""
    if version in BANNERS:
        return BANNERS[version]
    major, minor, patch = (int(p) for p in version.split(".")[:3])
    return f"{major * 10000 + minor * 100 + patch}"


def release_of(number: str) -> tuple:
    n = int(number)
    return n // 10000, n // 100 % 100, n % 100


def fail(text: str, code: int = 2):
    print(f"[E] {text}")
    sys.exit(code)


def main(argv):
    number = banner(os.environ.get("FAKE_TRTEXEC_VERSION", "10"))
    major = str(release_of(number)[0])
    print(f"&&&& RUNNING TensorRT.trtexec [TensorRT v{number}] # trtexec " + " ".join(argv))
    if argv == ["--help"]:
        print("=== Model Options ===")
        return
    args = dict(a[2:].split("=", 1) if "=" in a else (a[2:], True) for a in argv)
    if os.environ.get("FAKE_TRTEXEC_CALLS"):
        with open(os.environ["FAKE_TRTEXEC_CALLS"], "a") as f:
            f.write(json.dumps(argv) + "\n")
    known = KNOWN | ({"--includeDataTransfers", "--noCudaGraph"} if major == "11" else set())
    unknown = [a for a in argv if a.split("=", 1)[0] not in known]
    if unknown:
        fail(f"Unknown option: {unknown[0]}")
    if major == "11":
        for flag in (f for f in NO_OPS_11 if f[2:] in args):
            print(f"[W] {flag} is deprecated and has no effect")
    with open(args["loadEngine"], "rb") as f:
        blob = f.read()
    if not blob.startswith(MAGIC):
        fail("Error[1]: IRuntime::deserializeCudaEngine: Error Code 1: Serialization (not an engine)")
    built_by = json.loads(blob[len(MAGIC):].split(b"\n", 1)[0]).get("tensorrt", "0.0.0")
    if tuple(int(p) for p in built_by.split(".")[:3]) != release_of(number):  # an engine loads only in its release
        library = ".".join(map(str, release_of(number)))
        fail("Error[1]: IRuntime::deserializeCudaEngine: Error Code 1: Serialization (Serialization assertion plan "
             f"file is not compatible with this version of TensorRT, expecting library version {library} got "
             f"{built_by}, please rebuild.)", 1)
    name, _, dims = str(args.get("shapes", "")).rpartition(":")
    shape = [int(d) for d in dims.split("x") if d.isdigit()]
    if not name or len(shape) != 4:
        fail(f"Invalid --shapes: {args.get('shapes')}")
    if major == "10" and "exportProfile" in args and "separateProfileRun" not in args:
        fail("fake trtexec: expected --separateProfileRun with --exportProfile")
    batch = shape[0]
    if str(batch) == os.environ.get("FAKE_TRTEXEC_FAIL_BATCH"):
        fail("Error[2]: [executionContext.cpp::setInputShape]: out of memory", 1)
    if str(batch) == os.environ.get("FAKE_TRTEXEC_SLEEP_BATCH"):
        time.sleep(60)
    transfers = "includeDataTransfers" in args if major == "11" else "noDataTransfers" not in args
    compute = os.environ.get("FAKE_TRTEXEC_COMPUTE_MS", "1.0")
    compute_ms = virtual_kernel_ms(args["loadEngine"]) if compute == "virtual" else float(compute)
    write_times(args["exportTimes"], batch, not transfers, int(args["iterations"]), compute_ms)
    if "exportProfile" in args:
        with open(args["exportProfile"], "w") as f:
            json.dump([{"count": 10}, {"name": "conv1", "timeMs": 5.0, "averageMs": 0.5, "medianMs": 0.5,
                                       "percentage": 100.0}], f)
    print(f"&&&& PASSED TensorRT.trtexec [TensorRT v{number}] # trtexec " + " ".join(argv))


def virtual_kernel_ms(engine: str) -> float:
    """What the virtual CUDA device of the tests gives the fake engine's kernels (tests/virtual_cuda.py)."""
    import onnx

    import virtual_cuda

    with open(engine, "rb") as f:
        model = onnx.load_from_string(f.read()[len(MAGIC):].split(b"\n", 1)[1])
    return virtual_cuda.LAYER_NS * len(model.graph.node) / 1e6


def write_times(path, batch, no_transfers, iterations, compute):
    if os.environ.get("FAKE_TRTEXEC_GARBAGE"):
        with open(path, "w") as f:
            f.write("[ { \"startEnqMs\" : ")
        return
    records, t = [], 100.0
    for i in range(max(iterations, 10)):
        c = compute * (1 + 0.01 * (i % 5))  # a little spread, so the percentiles differ
        h2d = d2h = 0.0 if no_transfers else 0.002 * batch
        r = {"startEnqMs": t, "endEnqMs": t + 0.01, "startH2dMs": t, "endH2dMs": t + h2d,
             "startComputeMs": t + h2d, "endComputeMs": t + h2d + c, "startD2hMs": t + h2d + c,
             "endD2hMs": t + h2d + c + d2h, "h2dMs": h2d, "computeMs": c, "d2hMs": d2h, "latencyMs": h2d + c + d2h}
        records.append(r)
        t += h2d + c + d2h
    with open(path, "w") as f:
        json.dump(records, f)


if __name__ == "__main__":
    main(sys.argv[1:])
