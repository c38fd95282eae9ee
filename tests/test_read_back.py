"""One JSON reader for whatever the tool reads back (issue 46): a depth limit, a size cap, no key given twice, only
the top-level keys the tool writes in its own files; each refusal one line, exit 2. YAML keys given twice too."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conftest import cli
from pipeline.core import schema
from pipeline.core.errors import EXIT_USAGE, ConfigError, InputError

DEEP = "[" * 100_000 + "]" * 100_000


def _one_line_exit_2(capsys, *args) -> str:
    capsys.readouterr()
    assert cli(*args) == EXIT_USAGE
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


# --------------------------------------------------------------------------- the parser, pure

JSON_VALUES = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner,
                                                                                        max_size=3), max_leaves=12)


@given(JSON_VALUES)
def test_the_reader_reads_back_what_json_writes(value):
    assert schema.parse_json(json.dumps(value).encode(), "f.json", "a file") == value


@given(depth=st.integers(1, 200))
def test_the_reader_refuses_exactly_what_nests_deeper_than_its_limit(depth):
    raw = ("[" * depth + "]" * depth).encode()
    if depth <= schema.JSON_DEPTH:
        schema.parse_json(raw, "f.json", "a file")
    else:
        with pytest.raises(InputError, match="nests deeper"):
            schema.parse_json(raw, "f.json", "a file")


@pytest.mark.parametrize("raw", ['{"a": 1, "a": 2}', '{"x": [{"k": 1, "k": 1}]}'])
def test_a_key_given_twice_is_refused(raw):
    with pytest.raises(InputError, match="given twice"):
        schema.parse_json(raw.encode(), "f.json", "a file")


def test_only_the_top_level_keys_the_tool_writes(tmp_path):
    assert schema.parse_json(b'{"a": 1}', "f.json", "a file", keys=frozenset({"a", "b"})) == {"a": 1}
    with pytest.raises(InputError, match="a key this tool does not write .'c'"):
        schema.parse_json(b'{"a": 1, "c": 2}', "f.json", "a file", keys=frozenset({"a", "b"}))


# --------------------------------------------------------------------------- every file, through a command


@pytest.mark.parametrize("name,command", [("manifest.json", "report"), ("model.json", "export"),
                                          ("verify.json", "report"), ("benchmark.json", "report"),
                                          ("compare.json", "report")])
def test_a_100000_deep_file_is_exit_2_in_one_line(clone_run, capsys, name, command):
    run = clone_run()
    if not (run / name).exists():  # compare.json: a file of the run's own (a compare ran), listed in its ledger
        manifest = json.loads((run / "manifest.json").read_text())
        manifest["files"].append(name)
        (run / "manifest.json").write_text(json.dumps(manifest))
    (run / name).write_text(DEEP)
    err = _one_line_exit_2(capsys, command, "--run-dir", run)
    assert name in err and ("nests deeper" in err or "is not the" in err), err


def test_a_manifest_with_a_key_given_twice_or_an_unknown_top_level_key_is_refused(clone_run, capsys):
    run = clone_run()
    text = (run / "manifest.json").read_text()
    (run / "manifest.json").write_text(text.replace('"schema":', '"model": "x", "schema":', 1))
    assert "given twice" in _one_line_exit_2(capsys, "report", "--run-dir", run)
    manifest = json.loads(text)
    manifest["mine"] = "kept?"
    (run / "manifest.json").write_text(json.dumps(manifest))
    assert "mine" in _one_line_exit_2(capsys, "report", "--run-dir", run)


def test_a_300_mb_manifest_is_refused_before_it_is_read(clone_run, capsys):
    run = clone_run()
    path = run / "manifest.json"
    with path.open("r+b") as f:  # a sparse file: 300 MB long, nothing of it on the disk
        f.truncate(300 * 1024 * 1024)
    before = path.stat().st_size
    err = _one_line_exit_2(capsys, "report", "--run-dir", run)
    assert "more than the" in err and path.stat().st_size == before


def test_a_model_card_with_a_key_the_tool_does_not_write_is_refused(clone_run, capsys):
    run = clone_run()
    card = json.loads((run / "model.json").read_text())
    card["extra"] = "x" * 10
    (run / "model.json").write_text(json.dumps(card))
    assert "extra" in _one_line_exit_2(capsys, "export", "--run-dir", run)


# --------------------------------------------------------------------------- YAML


@pytest.mark.parametrize("text", ["train:\n  epochs: 1\n  epochs: 2\n", "train: {}\ntrain: {epochs: 2}\n"])
def test_a_yaml_key_given_twice_is_refused(tmp_path, capsys, text):
    from pipeline.core.config_schema import parse_yaml

    with pytest.raises(ConfigError, match="given twice"):
        parse_yaml(text, "c.yaml")
    path = tmp_path / "c.yaml"
    path.write_text(text)
    capsys.readouterr()
    assert cli("config", "--config", path) == EXIT_USAGE
    assert "given twice" in capsys.readouterr().err


def test_yaml_merge_keys_still_let_the_written_key_win():
    from pipeline.core.config_schema import parse_yaml

    assert parse_yaml("<<: {a: 1}\nb: 2\na: 5\n", "c.yaml") == {"a": 5, "b": 2}


def test_a_baseline_bundle_with_a_key_given_twice_is_refused(tmp_path):
    from pipeline.core import bundle_schema

    path = tmp_path / "baseline.json"
    path.write_text('{"schema": "pipeline.baseline/2", "schema": "pipeline.baseline/2"}')
    with pytest.raises(InputError, match="given twice"):
        bundle_schema.read_meta(path, "baseline")


# --------------------------------------------------------------------------- every numeric setting has a range


def _numeric_keys() -> list[tuple[str, object]]:
    """Every config key that takes a number or a list of numbers, with a small value it accepts."""
    from pipeline import config as config_mod

    keys = []
    for key, default, _ in config_mod.describe():
        # its default first: a key whose range starts above 1 (data.samples_per_class >= 2) takes none of the probes
        own = default[:1] if isinstance(default, list) else default
        numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in ([own] if own != [] else [None]))
        for small in ([own] if numeric else []) + [1, 0.5, [1], [0.5]]:
            try:
                config_mod.resolve({}, overrides=[f"{key}={json.dumps(small)}"])
            except ConfigError:
                continue
            keys.append((key, small))
            break
    return keys


def test_every_numeric_setting_has_an_upper_bound():
    from pipeline import config as config_mod

    keys = _numeric_keys()
    assert len(keys) > 200, keys  # the walk found the numeric keys (a regression in it would pass vacuously)
    unbounded = []
    for key, small in keys:
        huge = [10**40] if isinstance(small, list) else 10**40
        if isinstance(small, float) or (isinstance(small, list) and isinstance(small[0], float)):
            huge = [1e300] if isinstance(small, list) else 1e300
        try:
            config_mod.resolve({}, overrides=[f"{key}={json.dumps(huge)}"])
        except ConfigError:
            continue
        unbounded.append(key)
    assert unbounded == [], f"settings without an upper bound: {unbounded}"


@given(cores=st.integers(1, 512), threads=st.integers(1, 4096))
def test_threads_are_bounded_by_a_small_multiple_of_the_cores(cores, threads):
    from pipeline import config as config_mod

    cfg = config_mod.resolve({}, overrides=[f"benchmark.threads={threads}"])
    problems = config_mod.machine_problems(cfg, cores, None)
    assert bool(problems) == (threads > config_mod.THREADS_PER_CORE * cores), problems


@given(per_class=st.integers(2, 10**7), memory=st.integers(1 << 20, 1 << 40))
def test_the_synthetic_set_is_bounded_by_the_memory(per_class, memory):
    from pipeline import config as config_mod

    cfg = config_mod.resolve({}, overrides=[f"data.samples_per_class={per_class}", "data.image_size=32"])
    need = 10 * per_class * 3 * 32 * 32 * 4
    assert bool(config_mod.machine_problems(cfg, 4, memory)) == (need > memory // config_mod.SYNTHETIC_SHARE)


@pytest.mark.parametrize("setting", ["data.samples_per_class=100000000000", "benchmark.threads=100000",
                                     "benchmark.threads=4096", "train.epochs=100000000000000000000000",
                                     "data.workers=100000"])
def test_an_impossible_setting_is_refused_before_any_work(tmp_path, capsys, monkeypatch, setting):
    from pipeline.core import env

    monkeypatch.setattr(env, "usable_cores", lambda: 2)  # 4096 threads: more than 4 per core of a 2-core machine
    run = tmp_path / "run"
    capsys.readouterr()
    assert cli("train", "--model", "tiny_cnn", "--run-dir", run, setting) == EXIT_USAGE
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: config: " + setting.split("=")[0]) and len(err.splitlines()) == 1, err
    assert not run.exists()


@pytest.mark.parametrize("command", ["train", "report", "export"])
def test_a_300_character_run_directory_name_is_exit_2_before_anything_is_made(tmp_path, capsys, command):
    run = tmp_path / ("x" * 300)
    err = _one_line_exit_2(capsys, command, "--run-dir", run)
    assert "more than the 255" in err, err
    assert list(tmp_path.iterdir()) == []
