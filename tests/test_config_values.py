"""Config values that parse but cannot be meant: non-finite numbers, seeds out of range, YAML nested
thousands deep. Each is exit code 2 with one line before any work starts. Also: a full disk outside
the artifact writer, and the summary line of a failed stage."""

from __future__ import annotations

import errno
import json
import os
import re

import pytest
from pydantic import BaseModel

from conftest import TINY, cli
from pipeline import config
from pipeline.core.errors import EXIT_RUNTIME, EXIT_USAGE, ConfigError, StageFailed, disk_full
from pipeline.core.run import RunDir
from pipeline.stages import summary

DEEP = 5000


def problems(**kwargs) -> list[str]:
    with pytest.raises(ConfigError) as err:
        config.resolve(**kwargs)
    return err.value.problems


def run_main(capsys, *args) -> tuple[int, str, str]:
    capsys.readouterr()
    code = cli("-q", *args)
    out, err = capsys.readouterr()
    return code, out, err


def error_lines(err: str) -> list[str]:
    assert "Traceback" not in err, err
    return [line for line in err.splitlines() if line.startswith("error:")]


# --------------------------------------------------------------------------- the command line


@pytest.mark.parametrize("override, message", [
    ("benchmark.warmup_s=.inf", "benchmark.warmup_s: input should be a finite number (got inf)"),  # hung
    ("benchmark.min_duration_s=.inf", "benchmark.min_duration_s: input should be a finite number (got inf)"),  # hung
    ("train.warmup_epochs=.inf", "train.warmup_epochs: input should be a finite number (got inf)"),  # exit 4
    ("data.seed=99999999999999999999", "data.seed: input should be less than 4294967296"),  # exit 4
    ("train.seed=4294967296", "train.seed: input should be less than 4294967296"),  # exit 4
    ("model.std=[.inf,.inf,.inf]", "model.std[0, 1, 2]: input should be a finite number (got inf)"),  # blank inputs
    ("model.std=[0.25,0,0.25]", "model.std values must be > 0"),
    ("train.epochs=" + "[" * DEEP + "]" * DEEP,  # RecursionError, exit 4
     "override train.epochs: malformed YAML (line 1, column 33): nested deeper than 32 levels"),
])
def test_bad_value_is_one_line_and_exit_2_before_any_work(capsys, tmp_path, override, message):
    run = tmp_path / "run"
    code, _, err = run_main(capsys, "train", "--model", "tiny_cnn", "--run-dir", run, *TINY, override)
    assert code == EXIT_USAGE, err
    (line,) = error_lines(err)
    assert line.startswith(f"error: config: {message}")
    assert not run.exists()  # refused before the run directory was made


def test_deeply_nested_config_file_is_malformed_yaml(capsys, tmp_path):
    deep = tmp_path / "deep.yaml"
    deep.write_text("train:\n  epochs: " + "{a: " * DEEP + "1" + "}" * DEEP + "\n")
    code, _, err = run_main(capsys, "config", "--config", deep)
    assert code == EXIT_USAGE
    (line,) = error_lines(err)
    assert line.startswith(f"error: config: {deep}: malformed YAML (line 2, column ")
    assert line.endswith(": nested deeper than 32 levels")


# --------------------------------------------------------------------------- finite numbers, generically


def float_keys(model: type[BaseModel] = config.TableConfig, prefix: str = "") -> dict[str, bool]:
    """Every key whose type admits a float (alone, optional, in a list, dict or union): is it a list?"""
    keys = {}
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            keys.update(float_keys(annotation, f"{prefix}{name}."))
        elif annotation is float or "float" in str(annotation):
            keys[f"{prefix}{name}"] = "list[float]" in str(annotation)
    return keys


def test_every_float_key_is_found():
    keys = float_keys()
    assert {"benchmark.warmup_s", "train.warmup_epochs", "model.std", "model.mean", "verify.fp16.atol",
            "verify.candidates.tensorrt_fp16.rtol", "train.clip_grad_norm", "export.fp16.data_max"} <= set(keys)
    assert len(keys) >= 30


@pytest.mark.parametrize("key, is_list", float_keys().items())
@pytest.mark.parametrize("value", [".inf", "-.inf", ".nan"])
def test_no_float_key_takes_a_non_finite_value(key, is_list, value):
    (line,) = problems(overrides=[f"{key}=[0.5, {value}, 0.5]" if is_list else f"{key}={value}"])
    assert line.startswith(f"{key}[1]: " if is_list else f"{key}: ") and "finite number" in line


def test_non_finite_tolerance_in_a_per_output_dict():
    (line,) = problems(overrides=["verify.fp32.atol={'': .inf, logits: 1e-3}"])
    assert line == "verify.fp32.atol.'': input should be a finite number (got inf)"


def test_large_finite_values_still_pass():
    # benchmark.warmup_s was 1e3 here; timing keys now have an upper bound (60 s), and a value at the bound passes.
    # verify.fp16.atol was 1e30 here; every number now has an upper bound (tests/test_read_back.py), 1e6 for a tolerance
    cfg = config.resolve(overrides=["benchmark.warmup_s=60", "model.std=[1e-3, 0.5, 2.0]", "verify.fp16.atol=1e6"])
    assert cfg.benchmark.warmup_s == 60.0 and cfg.model.std == [1e-3, 0.5, 2.0]


# --------------------------------------------------------------------------- values that would never end


TIMING_KEYS = [key for key, _, _ in config.describe() if key.split(".")[0] in ("benchmark", "tune", "isolate")
               and re.search(r"(_s|trials|iterations|runs)$", key)]


def _upper_bound(key: str):
    section, name = key.split(".")
    field = type(getattr(config.TableConfig(), section)).model_fields[name]
    return next((getattr(m, "le", None) or getattr(m, "lt", None) for m in field.metadata
                 if getattr(m, "le", None) is not None or getattr(m, "lt", None) is not None), None), field.description


def test_every_timing_key_is_found():
    assert {"tune.warmup_s", "tune.trials", "tune.min_duration_s", "benchmark.warmup_s", "benchmark.min_iterations",
            "benchmark.min_duration_s", "benchmark.trials", "benchmark.benchmark_app_s", "isolate.timeout_s",
            "benchmark.min_runs", "benchmark.max_row_s"} \
        <= set(TIMING_KEYS)


@pytest.mark.parametrize("key", TIMING_KEYS)
def test_every_timing_key_has_an_upper_bound_and_says_it(key):
    """Issue 30, §3: tune.warmup_s=1e9 and tune.trials=1000000 passed validation, then ran until killed."""
    bound, description = _upper_bound(key)
    assert bound is not None, f"{key} has no upper bound"
    assert f"at most {bound:g}" in description, description
    config.resolve(overrides=[f"{key}={bound}"])  # the bound itself is allowed
    (line,) = problems(overrides=[f"{key}={bound * 10}"])
    assert line.startswith(f"{key}: input should be less than or equal to {bound:g}")


@pytest.mark.parametrize("override, message", [
    ("tune.warmup_s=1e9", "tune.warmup_s: input should be less than or equal to 60 (got 1000000000.0)"),  # ran on
    ("tune.trials=1000000", "tune.trials: input should be less than or equal to 100 (got 1000000)"),  # ran on
])
def test_an_endless_tune_setting_is_exit_2_before_any_work(capsys, tmp_path, override, message):
    run = tmp_path / "run"
    code, _, err = run_main(capsys, "tune", "--model", "tiny_cnn", "--run-dir", run, *TINY, override)
    assert code == EXIT_USAGE, err
    assert error_lines(err) == [f"error: config: {message}"]
    assert not run.exists()


# --------------------------------------------------------------------------- std, seeds, nesting


@pytest.mark.parametrize("std", ["[0, 0.2, 0.2]", "[-0.2, 0.2, 0.2]", "[.nan, 0.2, 0.2]"])
def test_std_must_be_positive_and_finite(std):
    (line,) = problems(overrides=[f"model.std={std}"])
    assert line.startswith("model.std")


@pytest.mark.parametrize("key", ["data.seed", "train.seed"])
def test_seed_range_is_what_numpy_and_torch_take(key):
    assert getattr(config.resolve(overrides=[f"{key}={2**32 - 1}"]), key.split(".")[0]).seed == 2**32 - 1
    assert "less than 4294967296" in problems(overrides=[f"{key}={2**32}"])[0]
    assert "greater than or equal to 0" in problems(overrides=[f"{key}=-1"])[0]
    assert "less than 4294967296" in problems(overrides=[f"{key}=99999999999999999999"])[0]


def test_the_largest_seed_works_where_the_code_uses_it():
    from pipeline.core import data
    from pipeline.training.rng import batch_generator, seed_everything

    top = 2**32 - 1
    seed_everything(top, deterministic=False)
    images, labels = data.synthetic_images(2, 2, 8, top)
    assert images.shape == (4, 3, 8, 8)
    assert data._split_indices(labels, 0.5, top)
    # the augmentation generator of a late batch of a long run (this overflowed manual_seed)
    batch_generator(top, epoch=999, batch=100_000, rank=7)
    a = batch_generator(top, 3, 5, 0).initial_seed()
    assert a == batch_generator(top, 3, 5, 0).initial_seed() != batch_generator(top, 3, 6, 0).initial_seed()
    assert batch_generator(1, 2, 3, 0).initial_seed() == ((1 * 1_000_003 + 2) * 1_000_003 + 3) * 101  # unchanged


@pytest.mark.parametrize("text", ["[" * DEEP + "]" * DEEP, "{a: " * DEEP + "1" + "}" * DEEP, "- " * DEEP + "1"])
def test_deep_yaml_is_malformed_not_a_recursion_error(text):
    (line,) = problems(overrides=[f"train.epochs={text}"])
    assert line.startswith("override train.epochs: malformed YAML") and "nested deeper than 32 levels" in line


def test_nesting_within_the_limit_reaches_validation():
    (line,) = problems(overrides=["train.epochs=" + "[" * 30 + "]" * 30])
    assert line.startswith("train.epochs: input should be a valid integer")
    assert config.resolve(overrides=["verify.fp32.atol={'': 1e-4, logits: 1e-3}"]).verify.fp32.atol["logits"] == 1e-3


# --------------------------------------------------------------------------- a full disk


def test_disk_full_is_found_anywhere_in_the_chain():
    full = disk_full(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/r/metrics.jsonl"))
    assert isinstance(full, StageFailed) and full.exit_code == EXIT_RUNTIME
    assert str(full) == "no space left on device while writing /r/metrics.jsonl; free space and re-run"
    assert str(disk_full(OSError(errno.EDQUOT, "Disk quota exceeded"))) == "disk quota exceeded; free space and re-run"
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as inner:
            raise RuntimeError("writer failed") from inner
    except RuntimeError as outer:
        assert "no space left on device" in str(disk_full(outer))
    assert disk_full(OSError(errno.EIO, "I/O error")) is None
    assert disk_full(ValueError("x")) is None
    loop = ValueError("a")
    loop.__context__ = ValueError("b")
    loop.__context__.__context__ = loop
    assert disk_full(loop) is None


def test_full_disk_while_logging_metrics_is_one_line_and_the_summary_says_train_failed(capsys, tmp_path,
                                                                                     monkeypatch):
    """metrics.jsonl is appended to, not written through the atomic writer: a full disk there was a bare
    ``OSError: [Errno 28]``, and the summary read "best val acc 0.0% after None epochs"."""
    from pipeline.training import metrics

    def full(self, record):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(metrics.MetricsLog, "write", full)
    run = tmp_path / "run"
    code, out, err = run_main(capsys, "all", "--model", "tiny_cnn", "--run-dir", run, *TINY)
    assert code == EXIT_RUNTIME
    assert error_lines(err) == ["error: train: no space left on device; free space and re-run"]
    (train_line,) = [line for line in out.splitlines() if line.strip().startswith("train ")]
    assert train_line.split()[:2] == ["train", "failed"]
    assert "no space left on device" in train_line and "None" not in train_line and "val acc" not in train_line
    entry = json.loads((run / "manifest.json").read_text())["stages"]["train"]
    assert entry["status"] == "failed" and entry["exit_code"] == EXIT_RUNTIME
    assert entry["error"] == "no space left on device; free space and re-run"


# --------------------------------------------------------------------------- the summary


def test_summary_of_failed_and_interrupted_stages_names_the_failure(tmp_path):
    run = RunDir(tmp_path / "run")
    run.manifest["stages"] = {
        "train": {"status": "failed", "error": "the loss was non-finite for 3 consecutive steps",
                  "details": {"amp": "bf16", "seed": 0}},  # partial details, as a failed train leaves them
        "export": {"status": "interrupted", "error": "interrupted by the user", "details": {"opset": 18}},
    }
    lines = summary(run).splitlines()
    (train_line,) = [line for line in lines if line.strip().startswith("train")]
    (export_line,) = [line for line in lines if line.strip().startswith("export")]
    assert train_line.split()[:2] == ["train", "failed"] and "the loss was non-finite" in train_line
    assert "val acc" not in train_line and "None" not in train_line
    assert export_line.split()[:2] == ["export", "interrupted"] and "opset" not in export_line
    assert any(line.split()[:3] == ["verify", "not", "run"] for line in lines)
