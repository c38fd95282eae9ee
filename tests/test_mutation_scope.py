"""The mutation command's scope stays true (scripts/mutation_scope.txt, pyproject's [tool.mutmut]): every pattern names
code that exists, every mutated file is named, and the score counts only what the scope names (issue 46)."""

from __future__ import annotations

import importlib
import sys

import tomllib

from conftest import ROOT

sys.path.insert(0, str(ROOT / "scripts"))
import mutation_score  # noqa: E402

SCOPE = mutation_score.read_scope(ROOT / "scripts" / "mutation_scope.txt")
MUTMUT = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mutmut"]


def _target(pattern: str) -> tuple[str, str | None]:
    """``pipeline.tune.x__choose*`` -> (``pipeline.tune``, ``_choose``); ``pipeline.precision.gate*`` -> (its module,
    None)."""
    stem = pattern.rstrip("*")
    module, _, function = stem.partition(".x_")
    return module, function or None


def test_every_pattern_names_a_module_or_function_that_exists_in_a_mutated_file():
    files = {path.removesuffix(".py").replace("/", ".") for path in MUTMUT["only_mutate"]}
    for pattern in SCOPE:
        module, function = _target(pattern)
        assert module in files, f"{pattern}: {module} is not in [tool.mutmut] only_mutate"
        if function is not None:
            assert callable(getattr(importlib.import_module(module), function, None)), pattern


def test_every_mutated_file_is_in_the_scope_and_its_tests_are_selected():
    named = {_target(p)[0] for p in SCOPE}
    for path in MUTMUT["only_mutate"]:
        assert path.removesuffix(".py").replace("/", ".") in named, path
    for test in MUTMUT["pytest_add_cli_args_test_selection"]:
        assert (ROOT / test).is_file(), test


def test_the_score_counts_only_the_scope_and_names_a_pattern_that_matches_nothing():
    results = {"pipeline.tune.x__choose__mutmut_1": "killed", "pipeline.tune.x_run__mutmut_1": "no tests",
               "pipeline.precision.gate.x_judge__mutmut_1": "survived"}
    kept, unmatched = mutation_score.in_scope(results, ["pipeline.tune.x__choose*", "pipeline.precision.gate*",
                                                        "pipeline.tune.x_gone*"])
    assert kept == {"pipeline.tune.x__choose__mutmut_1": "killed",
                    "pipeline.precision.gate.x_judge__mutmut_1": "survived"}
    assert unmatched == ["pipeline.tune.x_gone*"]


def test_the_score_fails_on_a_stale_scope(tmp_path, capsys):
    results, equivalent, scope = tmp_path / "results.txt", tmp_path / "equivalent.txt", tmp_path / "scope.txt"
    results.write_text("pipeline.tune.x__choose__mutmut_1: killed\npipeline.tune.x_run__mutmut_1: no tests\n")
    equivalent.write_text("")
    scope.write_text("# comment\npipeline.tune.x__choose*\n")
    assert mutation_score.main(str(results), str(equivalent), "0.9", str(scope)) == 0
    assert "100.0%" in capsys.readouterr().out
    assert mutation_score.main(str(results), str(equivalent), "0.9") == 1  # unscoped: the untested mutant counts
    scope.write_text("pipeline.tune.x__choose*\npipeline.tune.x_gone*\n")
    assert mutation_score.main(str(results), str(equivalent), "0.9", str(scope)) == 1
    assert "no mutant matches pipeline.tune.x_gone*" in capsys.readouterr().out


def test_an_equivalent_outside_the_scope_is_not_called_stale(tmp_path, capsys):
    results, equivalent, scope = tmp_path / "results.txt", tmp_path / "equivalent.txt", tmp_path / "scope.txt"
    results.write_text("pipeline.tune.x__choose__mutmut_1: killed\npipeline.tune.x__choose__mutmut_2: survived\n")
    equivalent.write_text("pipeline.tune.x__choose__mutmut_2  why\npipeline.precision.gate.x_judge__mutmut_2  why\n")
    scope.write_text("pipeline.tune.x__choose*\n")
    assert mutation_score.main(str(results), str(equivalent), "0.9", str(scope)) == 0
    assert "listed as equivalent but caught now" not in capsys.readouterr().out
    equivalent.write_text("pipeline.tune.x__choose__mutmut_1  renumbered: caught now\n")
    assert mutation_score.main(str(results), str(equivalent), "0.9", str(scope)) == 1
