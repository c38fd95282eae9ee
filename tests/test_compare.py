"""The release gate across runs: `baseline` writes a bundle, `compare` judges a run against it."""

import dataclasses
import functools
import hashlib
import io
import json
import shutil
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest

from conftest import TINY, cli
from pipeline import config, stages
from pipeline.core.errors import CheckFailed
from pipeline.core.run import RunDir
from pipeline.core.timings import Timing, TimingKind
from pipeline.runtime import backends, runners
from pipeline.runtime.runners import TorchRunner

# benchmark of the in-process PyTorch backend only, one thread, enough timed runs for compare to judge
CHEAP_BENCH = ["benchmark.backends=[torch_fp32]", "benchmark.batch_sizes=[1]", "benchmark.threads=1",
               "benchmark.min_iterations=40", "benchmark.min_duration_s=0.05", "benchmark.trials=2"]


def _cfg(run, *extra):
    return config.resolve(overrides=["model.name=tiny_cnn", *TINY, *CHEAP_BENCH, *extra])


def _baseline(run, out):
    assert cli("baseline", "--run-dir", run, "--out", out) == 0
    return out


@pytest.fixture
def benched(clone_run, tmp_path):
    run = clone_run()
    cfg = _cfg(run)
    stages.run_stage("benchmark", cfg, RunDir(run))
    return run, cfg, _baseline(run, tmp_path / "bundle")


def test_own_bundle_after_a_fresh_benchmark_passes_20_of_20(benched):
    run, cfg, bundle = benched
    outcomes = []
    for _ in range(20):
        stages.run_stage("benchmark", cfg, RunDir(run))
        try:
            stages.run_stage("compare", cfg, RunDir(run), baseline=str(bundle))
            outcomes.append("passed")
        except CheckFailed as exc:
            outcomes.append(str(exc))
    assert outcomes == ["passed"] * 20
    report = json.loads((run / "compare.json").read_text())
    assert report["latency"] and all(r["status"] == "passed" for r in report["latency"])
    assert all(a["agreement"]["value"] == 1.0 for a in report["artifacts"])


def test_rewording_a_timing_label_changes_no_comparison(benched, monkeypatch):
    """compare matches rows on (backend, batch, timing kind): a runner whose label is reworded after the baseline
    was written is still compared row for row (it was "missing", exit 1, while the label was the key)."""
    run, cfg, bundle = benched
    reworded = Timing(TimingKind.CPU_CALL, "host wall clock around one blocking call (reworded)")
    monkeypatch.setattr(runners, "CPU_WALL_CLOCK", reworded)
    stages.run_stage("benchmark", cfg, RunDir(run))
    assert {r["timing"] for r in json.loads((run / "benchmark.json").read_text())["results"]} == {reworded.label}
    stages.run_stage("compare", cfg, RunDir(run), baseline=str(bundle))
    rows = json.loads((run / "compare.json").read_text())["latency"]
    assert rows and all(r["status"] == "passed" and r["timing_kind"] == "cpu_call" for r in rows)
    assert {r["timing"] for r in rows} == {"wall-clock, synchronous CPU call"}  # the baseline's label, shown


RELEASE_0_1_0 = Path(__file__).parent / "data" / "release_0.1.0"


def test_a_bundle_written_by_release_0_1_0_compares_with_exit_0_against_its_own_run(tmp_path, capsys):
    """tests/data/release_0.1.0/bundle: what `baseline` of release 0.1.0 (commit b015ec5) wrote of a tiny_cnn run
    (conftest's TINY, benchmark.batch_sizes=[1,2], benchmark.threads=1, benchmark.backends=[torch_fp32,onnxrt_fp32,
    openvino_fp32]); run/: the files of that run compare reads. Neither has ``timing_kind``: its rows are keyed by
    the kinds their labels name, read once (pipeline.core.timings.legacy_kind), the async-throughput row included."""
    run = tmp_path / "run"
    shutil.copytree(RELEASE_0_1_0 / "run", run)
    assert cli("compare", "--run-dir", run, "--baseline", RELEASE_0_1_0 / "bundle") == 0
    report = json.loads((run / "compare.json").read_text())
    assert {a["name"]: a["status"] for a in report["artifacts"]} == dict.fromkeys(
        ["onnxrt_fp32", "fp16_emulation", "onnxrt_fp16_cpu", "openvino_fp32", "openvino_bf16"], "passed")
    assert {(r["backend"], r["batch_size"], r["timing_kind"]) for r in report["latency"]} == {
        *((b, n, "cpu_call") for b in ("torch_fp32", "onnxrt_fp32", "openvino_fp32") for n in (1, 2)),
        ("openvino_fp32", 2, "async_throughput")}
    assert all(r["status"] in ("passed", "skipped") and r["ratio"] in (1.0, None) for r in report["latency"])


def _slow_runner(ctx):
    import torch

    class Slowed(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            time.sleep(0.003)  # the planted regression, inside the timed call
            return self.inner(x)

    return TorchRunner(Slowed(ctx.model), name="torch_fp32", input_name=ctx.spec.input_name,
                       output_name=ctx.spec.output_name, input_shape=tuple(ctx.spec.input_size))


def test_a_slowed_benchmark_is_flagged(benched, monkeypatch, capsys):
    run, cfg, bundle = benched
    slowed = dataclasses.replace(backends.by_name("torch_fp32"), make=_slow_runner)
    monkeypatch.setattr(backends, "TABLE", [slowed if b.name == "torch_fp32" else b for b in backends.TABLE])
    stages.run_stage("benchmark", cfg, RunDir(run))
    assert cli("compare", "--run-dir", run, "--baseline", bundle) == 1
    err = capsys.readouterr().err
    assert "torch_fp32 at batch 1" in err and "environment: no change" in err
    row = json.loads((run / "compare.json").read_text())["latency"][0]
    assert row["status"] == "failed" and row["ci_low"] > cfg.compare.max_latency_ratio


def test_an_edited_tensorrt_version_is_named_in_the_environment_diff(benched, monkeypatch, tmp_path):
    run, _, bundle = benched
    meta = json.loads((bundle / "baseline.json").read_text())
    meta["environment"]["tensorrt"] = "10.13.0"
    (bundle / "baseline.json").write_text(json.dumps(meta))
    summary = tmp_path / "step_summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    assert cli("compare", "--run-dir", run, "--baseline", bundle) == 0  # a changed toolchain alone fails nothing
    report = json.loads((run / "compare.json").read_text())
    assert report["environment"] == [{"what": "tensorrt", "baseline": "10.13.0", "run": None}]
    assert "tensorrt 10.13.0 -> (none)" in (run / "compare.md").read_text()
    assert "| tensorrt | 10.13.0 | None |" in summary.read_text()  # the GitHub step summary, as verify's
    junit = (run / "compare.junit.xml").read_text()
    assert 'name="pipeline.compare"' in junit and "tensorrt 10.13.0 -&gt; (none)" in junit


def test_a_bundle_of_another_model_or_input_is_refused_with_exit_2(benched, capsys):
    run, _, bundle = benched
    meta = json.loads((bundle / "baseline.json").read_text())
    for key, value, said in (("model", "resnet18", "model 'resnet18'"), ("input_size", [3, 32, 32], "input size"),
                             ("classes", ["a", "b"], "classes")):
        (bundle / "baseline.json").write_text(json.dumps({**meta, key: value}))
        assert cli("compare", "--run-dir", run, "--baseline", bundle) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: compare: ") and said in err[0]
    assert cli("compare", "--run-dir", run, "--baseline", run) == 2  # not a bundle


def test_runs_differing_only_in_the_training_seed_fail_and_list_the_flips(clone_run, tmp_path, capsys):
    run = clone_run()
    bundle = _baseline(run, tmp_path / "bundle")
    other = tmp_path / "seed1"
    shutil.copytree(run, other)
    common = ["--run-dir", other, *TINY, "train.seed=1"]
    for stage in ("train", "export", "build", "verify"):
        assert cli(stage, *common) == 0
    assert cli("compare", "--run-dir", other, "--baseline", bundle) == 1
    err = capsys.readouterr().err
    assert "images flipped" in err and "environment: no change" in err
    report = json.loads((other / "compare.json").read_text())
    assert report["environment"] == []
    flipped = report["artifacts"][0]["flipped"]
    assert flipped and all(f["baseline"] != f["run"] for f in flipped)
    assert flipped[0]["image"].startswith("val[")
    assert "Images whose top-1 changed" in (other / "compare.md").read_text()


def test_all_runs_compare_when_a_baseline_is_set(clone_run, tmp_path, capsys):
    run = clone_run()
    bundle = _baseline(run, tmp_path / "bundle")
    assert cli("all", "--run-dir", run, f"compare.baseline={bundle}") == 0
    out = capsys.readouterr().out
    assert "compare    ok" in out
    assert (run / "compare.junit.xml").is_file()
    assert cli("report", "--run-dir", run) == 0
    assert "Compared with the baseline: PASSED" in (run / "report.md").read_text()
    assert "Compared with the baseline" in (run / "report.html").read_text()


def test_the_ci_example_runs_baseline_and_compare_with_commands_that_parse():
    import re
    import shlex

    import yaml

    from conftest import ROOT
    from pipeline.cli import build_parser

    workflow = yaml.safe_load((ROOT / "docs" / "ci-example.yml").read_text())
    assert {"gate-cpu", "update-baseline"} <= set(workflow["jobs"])
    steps = "\n".join(s.get("run", "") for job in workflow["jobs"].values() for s in job["steps"])
    commands = re.findall(r"python -m pipeline [^\n]*", steps)
    assert any(" baseline " in c for c in commands) and "compare.baseline=" in steps
    for command in commands:
        build_parser().parse_args(shlex.split(command.replace("${baseline:-}", ""))[3:])


# --------------------------------------------------------------------------- issue 30: compare cannot be fooled


@pytest.fixture
def bundled(clone_run, tmp_path):
    """A tiny run and its own bundle (its benchmark rows are too short to judge: latency is reported only)."""
    run = clone_run()
    return run, _baseline(run, tmp_path / "bundle")


def _compare(run, bundle, capsys) -> tuple[int, list[str]]:
    """compare's exit code and its stderr lines (its log lines, then the error line)."""
    capsys.readouterr()
    code = cli("compare", "--run-dir", run, "--baseline", bundle)
    return code, capsys.readouterr().err.strip().splitlines()


def _failure(code, err) -> str:
    """The one error line of an exit 1 (after compare's log lines)."""
    errors = [line for line in err if line.startswith("error: ")]
    assert code == 1 and len(errors) == 1 and err[-1] == errors[0], (code, err)
    return errors[0]


def _report(run) -> dict:
    return json.loads((run / "compare.json").read_text())


def _statuses(run) -> dict:
    return {a["name"]: a["status"] for a in _report(run)["artifacts"]}


def _edit(bundle, meta_edit=None, npz_edit=None) -> None:
    """Change a bundle as a hand (or an attacker) would, keeping its files consistent with each other: an edited
    predictions.npz gets its new sha256 in baseline.json, so what is tested is the check of its content."""
    meta = json.loads((bundle / "baseline.json").read_text())
    if npz_edit is not None:
        with np.load(bundle / "predictions.npz") as npz:
            data = {key: npz[key] for key in npz.files}
        npz_edit(data)
        buffer = io.BytesIO()
        np.savez_compressed(buffer, **data)
        (bundle / "predictions.npz").write_bytes(buffer.getvalue())
        meta["predictions_sha256"] = hashlib.sha256(buffer.getvalue()).hexdigest()
    if meta_edit is not None:
        meta = meta_edit(meta)
    (bundle / "baseline.json").write_text(meta if isinstance(meta, str) else json.dumps(meta))  # str: as it is


def _set(path: str, value):
    """A meta edit: ``path`` like "latency.0.samples_ms" set to ``value`` (a key removed when value is DROP)."""
    def edit(meta):
        *parents, last = [int(p) if p.isdigit() else p for p in path.split(".")]
        node = functools.reduce(lambda n, k: n[k], parents, meta)
        if value is DROP:
            del node[last]
        else:
            node[last] = value
        return meta
    return edit


DROP = object()


def _array(key, change):
    def edit(data):
        data[key] = change(data[key])
    return edit


def _assert_one_line(code, err, said=""):
    assert code == 2 and len(err) == 1 and err[0].startswith("error: compare: "), (code, err)
    assert said in err[0], err[0]


def test_compare_fails_artifacts_whose_verdict_failed_in_this_run(bundled, capsys):
    """§2.1: after a verify that failed (exit 1), the run's own bundle no longer passes: no stale verdict counts."""
    run, bundle = bundled
    assert cli("verify", "--run-dir", run, "verify.fp16.max_scaled_error=1e-9") == 1
    line = _failure(*_compare(run, bundle, capsys))
    assert "fp16_emulation: missing: failed in this run's verify" in line
    assert _statuses(run)["fp16_emulation"] == "missing" and _statuses(run)["onnxrt_fp32"] == "passed"


def test_compare_fails_an_artifact_replaced_or_removed_since_verify(bundled, capsys):
    """§2.1: another graph copied over model.fp16.onnx, or the graph removed (an interrupted export): missing."""
    run, bundle = bundled
    shutil.copyfile(run / "model.onnx", run / "model.fp16.onnx")
    line = _failure(*_compare(run, bundle, capsys))
    assert "fp16_emulation: missing: this run's verdict is about another file" in line
    (run / "model.fp16.onnx").unlink()
    _failure(*_compare(run, bundle, capsys))
    missing = {n for n, s in _statuses(run).items() if s == "missing"}
    assert {"fp16_emulation", "onnxrt_fp16_cpu"} <= missing and "onnxrt_fp32" not in missing


def test_compare_refuses_verify_files_that_are_not_the_ones_verify_wrote(bundled, capsys):
    run, bundle = bundled
    report = json.loads((run / "verify.json").read_text())
    (run / "verify.json").write_text(json.dumps({**report, "created": "edited"}))
    _assert_one_line(*_compare(run, bundle, capsys), "verify.json is not the report of a verify that finished here")


EMPTIED = [("no artifacts", _set("artifacts", []), None, "artifacts: list should have at least 1 item"),
           ("no latency rows", _set("latency", []), None, "latency: list should have at least 1 item"),
           ("NaN samples", _set("latency.0.samples_ms", ["NaN", "NaN"]), None, "latency.0.samples_ms.0"),
           ("relabelled images", None, _array("labels", lambda a: (a + 1) % (a.max() + 1)),
            "labels 20 of 20 images differently")]


@pytest.mark.parametrize("case, meta_edit, npz_edit, said", EMPTIED, ids=[c[0] for c in EMPTIED])
def test_an_emptied_or_relabelled_bundle_is_refused(bundled, capsys, case, meta_edit, npz_edit, said):
    """§2.2: a bundle that compares nothing, NaN latencies and relabelled images are refused (exit 2)."""
    run, bundle = bundled
    _edit(bundle, meta_edit, npz_edit)
    _assert_one_line(*_compare(run, bundle, capsys), said)


def test_a_redrawn_validation_set_under_the_same_names_is_refused(bundled, capsys):
    """§2.3: data.seed=1 redraws the synthetic images under the same names val[0]...: other images, exit 2."""
    run, bundle = bundled
    assert cli("verify", "--run-dir", run, "data.seed=1") == 0
    _assert_one_line(*_compare(run, bundle, capsys), "images hold other pixels under the same name")


def test_links_in_a_bundle_are_never_written_through_or_followed(bundled, tmp_path, capsys):
    """§2.4: a link planted in the bundle folder (the old temporary name, a bundle file) is neither written through
    nor read: the file it points at is untouched, and compare refuses a bundle holding one."""
    run, bundle = bundled
    outside = tmp_path / "outside.txt"
    outside.write_text("precious")
    (bundle / "predictions.npz.tmp").symlink_to(outside)
    assert cli("baseline", "--run-dir", run, "--out", bundle) == 0
    assert outside.read_text() == "precious"
    for name in ("predictions.npz", "baseline.json"):
        real = tmp_path / f"real.{name}"
        shutil.move(bundle / name, real)
        (bundle / name).symlink_to(real)
        _assert_one_line(*_compare(run, bundle, capsys), "symbolic link")
        assert cli("baseline", "--run-dir", run, "--out", bundle) == 2
        assert real.is_file() and (bundle / name).is_symlink()
        (bundle / name).unlink()
        shutil.move(real, bundle / name)
    assert _compare(run, bundle, capsys)[0] == 0


def _npz_with_unused_member(bundle, elements: int) -> None:
    """predictions.npz with one more member: ``elements`` float64 zeros, deflated to a few hundred KB."""
    from numpy.lib import format as npy

    path = bundle / "predictions.npz"
    with zipfile.ZipFile(path, "a", compression=zipfile.ZIP_DEFLATED) as archive, \
            archive.open("unused.npy", "w", force_zip64=True) as f:
        npy.write_array_header_1_0(f, {"descr": "<f8", "fortran_order": False, "shape": (elements,)})
        block = bytes(1 << 20)
        for _ in range(elements * 8 // len(block)):
            f.write(block)
    _edit(bundle, _set("predictions_sha256", hashlib.sha256(path.read_bytes()).hexdigest()))


def _peak(run, bundle, capsys) -> int:
    """The most memory compare held (Python and NumPy allocations), in bytes; it must pass."""
    import tracemalloc

    tracemalloc.start()
    try:
        code, err = _compare(run, bundle, capsys)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert code == 0, err
    return peak


def test_compare_loads_only_the_arrays_it_uses(bundled, capsys):
    """§2.5: an unused 128 MiB array in a 1 MB predictions.npz is never loaded (it was, and compare passed)."""
    run, bundle = bundled
    plain = _peak(run, bundle, capsys)
    _npz_with_unused_member(bundle, 1 << 24)  # 128 MiB once loaded
    assert (bundle / "predictions.npz").stat().st_size < 2 << 20
    grown = _peak(run, bundle, capsys) - plain
    assert grown < 16 << 20, f"compare held {grown / 2**20:.0f} MiB more"


def test_arrays_compare_uses_are_bounded_before_they_are_loaded(bundled, tmp_path, capsys):
    """§2.5: a member whose header claims too many elements, too many members, a file over the size cap: exit 2."""
    run, bundle = bundled
    spare = tmp_path / "spare"
    shutil.copytree(bundle, spare)
    _edit(bundle, npz_edit=_array("names", lambda a: np.repeat(a, 5001)))
    _assert_one_line(*_compare(run, bundle, capsys), "names has 100,020 elements, more than 100,000")
    _edit(spare, npz_edit=lambda data: data.update({f"extra{i}": np.zeros(1) for i in range(5000)}))
    _assert_one_line(*_compare(run, spare, capsys), "lists 5,")
    with open(spare / "predictions.npz", "r+b") as f:
        f.truncate(65 << 20)  # sparse: nothing is written, and nothing may be read
    _assert_one_line(*_compare(run, spare, capsys), "more than the 67,108,864 such a file can be")


DAMAGED = [
    ("artifact without name", _set("artifacts.0.name", DROP), None, "artifacts.0.name: field required"),
    ("environment null", _set("environment", None), None, "environment: input should be"),
    ("input_size 32", _set("input_size", 32), None, "input_size: input should be a valid list"),
    ("samples as a string", _set("latency.0.samples_ms", "1.0 2.0"), None, "latency.0.samples_ms"),
    ("classes as a string", _set("classes", "cat,dog"), None, "classes"),
    ("artifacts as a string", _set("artifacts", "onnxrt_fp32"), None, "artifacts"),
    ("latency as a dict", _set("latency", {}), None, "latency"),
    ("batch size as a string", _set("latency.0.batch_size", "1"), None, "latency.0.batch_size"),
    ("model as a number", _set("model", 5), None, "model"),
    ("images as a string", _set("images", "48"), None, "images"),
    ("a row without backend", _set("latency.0.backend", DROP), None, "latency.0.backend"),
    ("an unknown key", _set("extra", 1), None, "extra: extra inputs are not permitted"),
    ("an accuracy of 2", _set("artifacts.0.accuracy", 2.0), None, "artifacts.0.accuracy"),
    ("per-class keys of other classes", _set("artifacts.0.per_class_accuracy", {"x": 1.0}), None,
     "per_class_accuracy does not name the classes"),
    ("an artifact named with a path", _set("artifacts.0.name", "../x"), None, "artifacts.0.name"),
    ("a top-level list", lambda meta: [meta], None, "(top level): input should be a valid dictionary"),
    ("no schema", _set("schema", DROP), None, "schema"),
    ("an old schema", _set("schema", "pipeline.baseline/1"), None, "re-write the baseline with"),
    ("class index 99", None, _array("torch_fp32.top5_class", lambda a: a * 0 + 99), "must be class indices in [0, "),
    ("1-D top-5 arrays", None, _array("onnxrt_fp32.top5_class", lambda a: a[:, 0]), "expected 2 dimension(s)"),
    ("labels missing", None, lambda data: data.pop("labels"), "lacks labels"),
    ("2-D names", None, _array("names", lambda a: a[:, None]), "names has shape"),
    ("digests not sha256", None, _array("digests", lambda a: np.array(["x"] * len(a))), "not sha256 values"),
    ("a pickled array", None, _array("names", lambda a: a.astype(object)), "dtype object"),
    ("labels as floats", None, _array("labels", lambda a: a.astype(np.float32)), "labels has dtype float32"),
    ("predictions edited without its sha256", _set("predictions_sha256", "0" * 64), None, "sha256 differs"),
]


def test_a_damaged_bundle_is_exit_2_in_one_line(bundled, tmp_path, capsys):
    """§2.6: every damage is one line naming the file and the first problem, exit 2 (it used to be exit 4 and a
    bare KeyError/TypeError/IndexError in 15 cases)."""
    run, bundle = bundled
    for case, meta_edit, npz_edit, said in DAMAGED:
        copy = tmp_path / case.replace(" ", "_")
        shutil.copytree(bundle, copy)
        _edit(copy, meta_edit, npz_edit)
        code, err = _compare(run, copy, capsys)
        assert code == 2 and len(err) == 1 and err[0].startswith("error: compare: ") and said in err[0], (case, err)
    (tmp_path / "not_json").mkdir()
    (tmp_path / "not_json" / "baseline.json").write_text('{"schema": "pipeline.baseline/2", ')
    _assert_one_line(*_compare(run, tmp_path / "not_json", capsys), "is not valid JSON")


def test_baseline_out_below_a_file_is_exit_2_in_one_line(bundled, tmp_path, capsys):
    run, _ = bundled
    (tmp_path / "afile").write_text("")
    capsys.readouterr()
    assert cli("baseline", "--run-dir", run, "--out", tmp_path / "afile" / "sub") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot create the bundle folder" in err[0] and "Not a directory" in err[0], err


IMPOSSIBLE = [
    ("negative latencies", _set("latency.0.samples_ms", [-1.0] * 30), None,
     "input should be greater than or equal to 0.000001"),
    ("a zero latency", _set("latency.0.samples_ms", [0.0] * 30), None,
     "input should be greater than or equal to 0.000001"),
    # issue 46: 1e-300 ms printed 300-digit ratios, 1e300 ms silently disabled the latency check
    ("a 1e-300 ms latency", _set("latency.0.samples_ms", [1e-300] * 30), None,
     "input should be greater than or equal to 0.000001"),
    ("a 1e300 ms latency", _set("latency.0.samples_ms", [1e300] * 30), None,
     "input should be less than or equal to 3600000"),
    ("an infinite latency", lambda meta: json.dumps(meta).replace('"samples_ms": [', '"samples_ms": [1e999, ', 1),
     None, "latency.0.samples_ms.0: input should be a finite number"),
    ("NaN in the JSON", lambda meta: json.dumps(meta).replace('"samples_ms": [', '"samples_ms": [NaN, ', 1),
     None, "NaN is not a JSON value"),
    ("NaN reference logits", None, _array("torch_fp32.top5_logit", lambda a: np.where(a == a.max(), np.nan, a)),
     "NaN or infinite"),
    ("class -1", None, _array("onnxrt_fp32.top5_class", lambda a: np.where(a == a[0, 0], -1, a)),
     "must be class indices in [0, "),
    ("a 1-row logit array", None, _array("onnxrt_fp32.top5_logit", lambda a: a[:1]), "expected [20 images"),
    ("logits out of order", None, _array("onnxrt_fp32.top5_logit", lambda a: a[:, ::-1].copy()),
     "not in descending order"),
    ("zero images", _set("images", 0), None, "images: input should be greater than or equal to 1"),
]


def test_impossible_values_are_refused(bundled, tmp_path, capsys):
    """§2.7: negative latencies (judged as a 1e14 regression before), NaN reference logits, class -1 (it wrapped to
    the last class), a 1-row logit array broadcast over 20 images: exit 2, one line."""
    run, bundle = bundled
    for case, meta_edit, npz_edit, said in IMPOSSIBLE:
        copy = tmp_path / case.replace(" ", "_")
        shutil.copytree(bundle, copy)
        _edit(copy, meta_edit, npz_edit)
        code, err = _compare(run, copy, capsys)
        assert code == 2 and len(err) == 1 and said in err[0], (case, err)


def test_compare_in_all_is_unchanged_when_nothing_it_reads_changed(bundled, capsys):
    """§2.8: a second identical `all` skips compare; a changed bundle re-runs it; once compare.baseline is dropped
    the summary says the earlier compare is not part of this result."""
    run, bundle = bundled
    setting = f"compare.baseline={bundle}"
    assert cli("all", "--run-dir", run, setting) == 0
    first = RunDir(run).stage_entry("compare").run_id
    capsys.readouterr()
    assert cli("all", "--run-dir", run, setting) == 0
    assert RunDir(run).stage_entry("compare").run_id == first
    out, err = capsys.readouterr()
    assert "compare: unchanged since" in err and "compare    ok" in out
    _edit(bundle, _set("environment.tensorrt", "10.13.0"))
    assert cli("all", "--run-dir", run, setting) == 0
    assert RunDir(run).stage_entry("compare").run_id != first
    capsys.readouterr()
    assert cli("all", "--run-dir", run, "compare.baseline=null") == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.strip().startswith("compare"))
    assert "not run" in row and "compare.baseline is not set" in row and "is not part of this result" in row, row


def test_bundle_text_is_shown_printable(bundled, capsys):
    """§2.9: an escape sequence, a newline and a table break in the bundle reach neither the terminal nor
    compare.md; a 5,000-character value is refused (bounded), never printed."""
    run, bundle = bundled
    planted = "\x1b[31mRED\x1b[0m\n| x | y |"
    _edit(bundle, _set("environment.tensorrt", planted))
    (run / "model.fp16.onnx").unlink()  # onnxrt_fp16_cpu missing: the failure line carries the environment
    code, err = _compare(run, bundle, capsys)
    assert "tensorrt ?[31mRED?[0m?" in _failure(code, err) and not any("\x1b" in line for line in err), err
    md = (run / "compare.md").read_text()
    assert "\x1b" not in md and "RED?[0m?" in md
    row = next(line for line in md.splitlines() if line.startswith("| tensorrt"))
    assert row.count(" | ") == 2, row  # the table row is whole: three cells
    assert "\x1b" not in (run / "compare.junit.xml").read_text()
    _edit(bundle, _set("environment.tensorrt", "x" * 5000))
    _assert_one_line(*_compare(run, bundle, capsys), "environment.tensorrt: string should have at most 256")


@pytest.mark.parametrize("value,shown", [(2.2345, "2.23"), (1e-12 / 3.6, "2.78e-13"), (3.6e12, "3.6e+12"), (1.0, "1")])
def test_ratios_print_with_three_significant_digits(value, shown):
    from pipeline.core.compare_result import LatencyComparison
    from pipeline.core.status import Status
    from pipeline.core.timings import TimingKind
    from pipeline.reports import compare_report

    assert compare_report.ratio(value) == shown
    reason = compare_report.latency_reason(LatencyComparison(
        backend="onnxrt_fp32", batch_size=1, timing=None, timing_kind=TimingKind.CPU_CALL, status=Status.FAILED,
        baseline_p50_ms=1e-6, run_p50_ms=3.6e6, ratio=value, ci_low=value, ci_high=value, threshold=3.0))
    assert len(reason) < 120, reason
