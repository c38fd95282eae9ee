"""Issue 48: which images play which role. The validation split's cut into search and verdict parts, the spread of a
role's images, and the held-out status (pure: properties); a tiny run whose validation split is too small to cut says
"not held out" in verify.json, verify.md and the end-of-run summary. The disjointness of the roles recorded by a real
run (export's calibration, tune's search, verify's verdict): tests/test_tune.py (its first test)."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from pipeline.core import roles

labels_st = st.lists(st.integers(0, 5), min_size=0, max_size=200)


@given(labels_st, st.floats(0.05, 0.95), st.integers(1, 60), st.integers(0, 1000))
def test_the_cut_is_disjoint_covers_the_split_and_is_deterministic(labels, fraction, min_images, seed):
    parts = roles.partition_validation(labels, fraction, min_images, seed)
    assert parts == roles.partition_validation(labels, fraction, min_images, seed)
    everything = set(range(len(labels)))
    if parts.split:
        assert not set(parts.search) & set(parts.verdict)
        assert set(parts.search) | set(parts.verdict) == everything
        assert min(len(parts.search), len(parts.verdict)) >= min_images
        # stratified: a class with two images or more has one in each part
        for label in set(labels):
            members = {i for i, x in enumerate(labels) if x == label}
            if len(members) >= 2:
                assert members & set(parts.search) and members & set(parts.verdict)
    else:
        assert set(parts.search) == set(parts.verdict) == everything
        assert parts.reason


@given(st.integers(0, 200), st.integers(1, 100), st.floats(0.05, 0.95))
def test_a_split_too_small_for_both_parts_is_not_cut(n, min_images, fraction):
    parts = roles.partition_validation([i % 3 for i in range(n)], fraction, min_images, 0)
    if n < 2 * min_images:
        assert not parts.split and "too few" in parts.reason


@given(st.lists(st.integers(0, 10_000), unique=True, max_size=300).map(sorted), st.integers(0, 400))
def test_spread_takes_count_distinct_indices_in_order(indices, count):
    chosen = roles.spread(indices, count)
    assert len(chosen) == min(count, len(indices))
    assert chosen == sorted(set(chosen)) and set(chosen) <= set(indices)
    if 2 <= count < len(indices):
        assert chosen[0] == indices[0] and chosen[-1] == indices[-1]


def _set(role: str, split: str, indices, hashes=None) -> roles.ImageSet:
    indices = tuple(indices)
    return roles.ImageSet(role, split, indices, tuple(hashes or (f"{split}{i}" for i in indices)))


index_sets = st.sets(st.integers(0, 60), max_size=30)


@given(index_sets, index_sets, index_sets, st.booleans())
def test_held_out_exactly_when_cut_and_no_verdict_image_is_another_roles(verdict, calibration, search, cut):
    v = _set("verdict", "val", sorted(verdict))
    c = _set("calibration", "val", sorted(calibration))  # the old way: calibration on validation images
    s = _set("search", "val", sorted(search))
    held = roles.held_out_status(v, {"int8 calibration": c, "tune search": s}, cut, "too small")
    disjoint = not (verdict & calibration) and not (verdict & search)
    assert held.held_out == (cut and disjoint)
    assert ("not held out" in held.line()) == (not held.held_out)
    if verdict & calibration:
        assert held.overlaps["int8 calibration"] == len(verdict & calibration)


@given(index_sets, index_sets)
def test_the_same_content_under_another_index_is_an_overlap(verdict, other):
    """A duplicate image (the same bytes at another index, in another split) counts: content, not names."""
    v = _set("verdict", "val", sorted(verdict), [f"h{i}" for i in sorted(verdict)])
    c = _set("calibration", "train", sorted(other), [f"h{i}" for i in sorted(other)])
    held = roles.held_out_status(v, {"int8 calibration": c}, True)
    assert held.held_out == (not verdict & other)


def test_a_role_that_ran_without_a_record_is_not_held_out_and_one_that_did_not_run_is_named():
    v = _set("verdict", "val", [1, 2, 3])
    missing = roles.held_out_status(v, {"int8 calibration": None}, True, missing=["int8 calibration"])
    assert not missing.held_out and "no record of the int8 calibration images" in missing.line()
    not_run = roles.held_out_status(v, {"int8 calibration": _set("c", "train", [1, 2]), "tune search": None}, True)
    assert not_run.held_out and "tune search: not run" in not_run.line()


def test_image_set_from_a_damaged_record_is_refused():
    import pytest

    for bad in ({"role": "c", "split": "train", "indices": [-1], "sha256_16": []},
                {"role": "c", "split": "train", "indices": "0,1", "sha256_16": []},
                {"role": 1, "split": "train", "indices": [], "sha256_16": []},
                {"role": "c", "split": "train", "indices": [True], "sha256_16": []}):
        with pytest.raises(ValueError):
            roles.ImageSet.from_json(bad)
    good = _set("calibration", "train", [0, 5])
    assert roles.ImageSet.from_json(good.to_json()) == good


def test_a_split_too_small_to_cut_says_not_held_out_in_the_reports_and_the_summary(tiny_run):
    """The tiny run's validation split (24 images) cannot give tune's search and the verdict 30 images each: verify
    says "not held out" in verify.json, verify.md and the summary line of `all`."""
    from pipeline import stages
    from pipeline.core.run import RunDir

    report = json.loads((tiny_run / "verify.json").read_text())
    images = report["images"]
    assert images["held_out"]["status"] == "not held out" and not images["held_out"]["held_out"]
    assert images["validation_split"]["cut"] is False and "too few" in images["held_out"]["line"]
    assert "Held-out images: NOT HELD OUT" in (tiny_run / "verify.md").read_text()
    assert "verdict images: NOT HELD OUT" in stages.summary(RunDir(tiny_run))
    # the calibration images came from the training split all the same: no overlap is reported
    assert not images["held_out"]["overlaps"]
