"""The baseline bundle's folder (issue 46, low cases): a link inside it is refused in the bundle's own words (not the
run directory's), an existing empty folder is taken as ``--out``, and the folder itself as a symbolic link is refused,
for writing (``baseline --out``) and for reading (``compare --baseline``)."""

from __future__ import annotations

import shutil

import pytest

from conftest import cli


@pytest.fixture
def bundled(clone_run, tmp_path):
    run, out = clone_run(), tmp_path / "bundle"
    assert cli("baseline", "--run-dir", run, "--out", out) == 0
    return run, out


def _one_error(capsys) -> str:
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, errors
    return errors[0]


def test_a_link_in_the_bundle_is_refused_in_the_bundles_words(bundled, tmp_path, capsys):
    run, bundle = bundled
    real = tmp_path / "real.json"
    shutil.move(bundle / "baseline.json", real)
    (bundle / "baseline.json").symlink_to(real)
    capsys.readouterr()
    for command in (["compare", "--run-dir", run, "--baseline", bundle],
                    ["baseline", "--run-dir", run, "--out", bundle]):
        assert cli(*command) == 2
        said = _one_error(capsys)
        assert "symbolic link" in said and "a baseline bundle holds plain files only" in said, said
        assert "run directory" not in said and "use another --run-dir" not in said, said
    assert (bundle / "baseline.json").is_symlink() and real.is_file()


def test_an_existing_empty_folder_is_taken_as_out(clone_run, tmp_path, capsys):
    run, out = clone_run(), tmp_path / "empty"
    out.mkdir()
    assert cli("baseline", "--run-dir", run, "--out", out) == 0
    assert sorted(p.name for p in out.iterdir()) == ["baseline.json", "predictions.npz"]
    assert cli("compare", "--run-dir", run, "--baseline", out) == 0
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    capsys.readouterr()
    assert cli("baseline", "--run-dir", run, "--out", other) == 2  # not empty, not a bundle: left alone
    assert "is not a baseline bundle" in _one_error(capsys)
    assert [p.name for p in other.iterdir()] == ["notes.txt"]


def test_the_bundle_folder_itself_as_a_link_is_refused(bundled, tmp_path, capsys):
    run, bundle = bundled
    link = tmp_path / "link"
    link.symlink_to(bundle, target_is_directory=True)
    before = {p.name: p.read_bytes() for p in bundle.iterdir()}
    capsys.readouterr()
    assert cli("baseline", "--run-dir", run, "--out", link) == 2
    said = _one_error(capsys)
    assert "is a symbolic link" in said and "--out" in said, said
    assert {p.name: p.read_bytes() for p in bundle.iterdir()} == before  # nothing written through it
    assert cli("compare", "--run-dir", run, "--baseline", link) == 2
    said = _one_error(capsys)
    assert "is a symbolic link" in said and "--baseline" in said, said
    empty_link = tmp_path / "empty_link"
    (tmp_path / "target").mkdir()
    empty_link.symlink_to(tmp_path / "target", target_is_directory=True)
    assert cli("baseline", "--run-dir", run, "--out", empty_link) == 2
    assert not any((tmp_path / "target").iterdir())
