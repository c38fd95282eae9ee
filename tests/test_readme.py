"""The README stays true: CI runs its test command, its config table matches the code."""

import re

from conftest import ROOT
from pipeline.config import describe

README = (ROOT / "README.md").read_text()


def quickstart_commands() -> list[str]:
    section = README.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.+?)\n```", section)


def test_quickstart_is_two_commands_and_ci_runs_the_test_one():
    first, second = quickstart_commands()
    assert "python -m pipeline all --model resnet18" in first
    assert "pytest" in second
    ci = (ROOT / ".ci" / "run").read_text()
    assert second in ci.splitlines()


def test_config_table_lists_every_key_with_its_default():
    table = README.split("<!-- keys:start -->", 1)[1].split("<!-- keys:end -->", 1)[0]
    documented = dict(re.findall(r"^\| `([^`]+)` \| `([^`]*)` \|", table, re.M))
    import json

    for key, default, _ in describe():
        if ".candidates." in key and not key.startswith("verify.candidates.onnxrt_fp32."):
            continue  # the other candidates have the same keys (said in the README)
        assert key in documented, f"README misses config key {key}"
        shown = default if isinstance(default, str) else json.dumps(default)
        assert documented[key] == shown, f"README default of {key} is {documented[key]}, code says {shown}"


def test_failure_behaviour_and_performance_sections_are_filled():
    for placeholder in ("KEYS_TABLE", "FAILURE_TABLE", "DOCKER_SECTION", "PERF_SECTION"):
        assert placeholder not in README
