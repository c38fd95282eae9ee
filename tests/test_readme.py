"""The README and docs/ stay true: CI runs the README's test command, every command in the README
parses and its overrides validate, every link resolves, the exit codes and the key table match the code."""

import json
import re
import shlex
import subprocess
import sys

import pytest

from conftest import ROOT
from pipeline.config import describe, resolve
from pipeline.core import errors

README = (ROOT / "README.md").read_text()
CONFIG_PAGE = ROOT / "docs" / "configuration.md"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def quickstart_commands() -> list[str]:
    section = README.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.+?)\n```", section)


def test_quickstart_is_two_commands_and_ci_runs_the_test_one():
    first, second = quickstart_commands()
    assert "python -m pipeline all --model resnet18" in first
    assert "pytest" in second
    ci = (ROOT / ".ci" / "run").read_text()
    assert second in ci.splitlines()


def test_readme_is_a_front_door():
    assert len(README.splitlines()) <= 170, "README.md is meant to stay about 150 lines; move details to docs/"
    for heading in ("## Quickstart", "## Commands", "## Exit codes", "## Read more"):
        assert heading in README


def test_config_table_lists_every_key_with_its_default():
    page = CONFIG_PAGE.read_text()
    table = page.split("<!-- keys:start -->", 1)[1].split("<!-- keys:end -->", 1)[0]
    documented = dict(re.findall(r"^\| `([^`]+)` \| `([^`]*)` \|", table, re.MULTILINE))
    for key, default, _ in describe():
        if ".candidates." in key and not key.startswith("verify.candidates.onnxrt_fp32."):
            continue  # the other candidates have the same keys (said on the page)
        assert key in documented, f"docs/configuration.md misses config key {key}"
        shown = default if isinstance(default, str) else json.dumps(default)
        assert documented[key] == shown, f"docs/configuration.md: default of {key} is {documented[key]}, code: {shown}"
    assert "(docs/configuration.md)" in README


def test_readme_keys_script_leaves_the_page_as_it_is():
    """The page is what scripts/readme_keys.py generates (run it after changing pipeline/config.py)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import readme_keys
    finally:
        sys.path.pop(0)
    text = CONFIG_PAGE.read_text()
    assert readme_keys.rewrite(text) == text


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped but for hyphens and underscores (a heading
    naming `onnxrt_int8_cpu` keeps them), spaces to hyphens."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _headings(path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.DOTALL)
    return {_slug(h) for h in re.findall(r"^#+ (.+)$", text, re.MULTILINE)}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves(page):
    """Each [text](target) that is not a URL names an existing file and, after '#', one of its headings."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    for link in links:
        if re.match(r"[a-z]+://", link):
            continue
        path, _, anchor = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        assert target.is_file(), f"{page.name}: link {link} points to a missing file"
        if anchor:
            assert anchor in _headings(target), f"{page.name}: link {link}: no heading #{anchor} in {target.name}"


def test_readme_links_every_docs_page():
    for page in (ROOT / "docs").glob("*.md"):
        assert f"(docs/{page.name})" in README, f"README does not link docs/{page.name}"


def test_exit_code_table_is_the_codes_of_pipeline_errors():
    table = README.split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    documented = {int(code) for code in re.findall(r"^\| (\d+) \|", table, re.MULTILINE)}
    defined = {value for name, value in vars(errors).items() if name.startswith("EXIT_")}
    assert documented == defined


def readme_commands() -> list[str]:
    """Every ``python -m pipeline ...`` in the README, in code spans and in bash blocks."""
    found = re.findall(r"`(python -m pipeline[^`]*)`", README)
    for block in re.findall(r"```bash\n(.*?)```", README, re.DOTALL):
        found += re.findall(r"(python -m pipeline[^&\n#]*)", block)
    return [re.sub(r"\[([^\]]*)\]", r"\1", command).strip() for command in found]  # "[--keys]" is optional


def test_every_readme_command_parses_and_its_overrides_validate():
    from pipeline.cli import build_parser

    commands = readme_commands()
    assert len(commands) >= 12
    for command in commands:
        argv = shlex.split(command)[3:]
        try:
            args = build_parser().parse_args(argv)
        except SystemExit as exc:
            pytest.fail(f"README command does not parse: {command} (exit {exc.code})")
        overrides = list(getattr(args, "overrides", []) or [])
        resolve(overrides=([f"model.name={args.model}"] if getattr(args, "model", None) else []) + overrides)


@pytest.mark.parametrize("command", ["python -m pipeline models", "python -m pipeline config --keys"])
def test_readme_commands_that_only_read_run(command):
    assert command in readme_commands()
    done = subprocess.run([sys.executable, *shlex.split(command)[1:]], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "resnet18" in done.stdout or "train.epochs" in done.stdout
