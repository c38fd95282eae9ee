"""Which images play which role: calibration, tune's search, the final verdict (docs/verify.md, "Held-out images").

A verdict counts only on images that neither calibration nor any search has seen. The roles, by default:

- **calibration** (INT8 ranges, AutoCast's range rule): images of the *training* split, evenly spaced over it;
- **search** (tune's per-layer sensitivity and its candidate search): a stratified share of the *validation* split
  (``verify.search_fraction``);
- **verdict** (verify, and tune's held-out confirmation): the rest of the validation split.

Where the validation split is too small to give both search and verdict ``verify.min_held_out_images`` images, it is
not split: search and verdict share it, and every verdict says "not held out" (a visible status, never a silent one).

Everything here is pure: indices in, indices and a status out. The images' content hashes make the check real: the
status compares what each role recorded (split, index, sha256 of the image as fed), not what the split intended.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

HELD_OUT = "held out"
NOT_HELD_OUT = "not held out"

CALIBRATION, SEARCH, VERDICT = "calibration", "search", "verdict"


@dataclass(frozen=True)
class ValidationParts:
    """The validation split's indices, cut into tune's search part and the verdict part."""

    search: tuple[int, ...]
    verdict: tuple[int, ...]
    split: bool  # False: too few images to split; search and verdict are both the whole split
    reason: str = ""


def partition_validation(labels: Sequence[int], search_fraction: float, min_images: int, seed: int) -> ValidationParts:
    """Stratified: each class gives ``search_fraction`` of its validation images to the search part (rounded, at least
    one where it has two), the rest to the verdict part; deterministic in ``seed``. Unsplit (both parts the whole split,
    ``split`` False, and why) when either part would hold fewer than ``min_images`` images."""
    everything = tuple(range(len(labels)))
    if not 0 < search_fraction < 1:
        return ValidationParts(everything, everything, False, f"verify.search_fraction is {search_fraction:g}")
    rng = random.Random(seed)
    by_class: dict[int, list[int]] = {}
    for index, label in enumerate(labels):
        by_class.setdefault(int(label), []).append(index)
    search: list[int] = []
    for label in sorted(by_class):
        members = by_class[label]
        rng.shuffle(members)
        take = round(len(members) * search_fraction)
        if len(members) >= 2:
            take = min(max(take, 1), len(members) - 1)
        search += members[:take]
    verdict = sorted(set(everything) - set(search))
    if min(len(search), len(verdict)) < min_images:
        return ValidationParts(everything, everything, False,
                               f"the validation split has {len(labels)} images: too few to give tune's search and the "
                               f"verdict {min_images} each (verify.min_held_out_images)")
    return ValidationParts(tuple(sorted(search)), tuple(verdict), True)


def spread(indices: Sequence[int], count: int) -> list[int]:
    """``count`` of ``indices`` evenly spaced over them (all of them when ``count`` is not smaller): an image folder's
    split is ordered by class, so its first images would be the first classes only."""
    n = len(indices)
    if count >= n:
        return list(indices)
    if count <= 0:
        return []
    if count == 1:
        return [indices[0]]
    return [indices[round(i * (n - 1) / (count - 1))] for i in range(count)]


def image_hash(image_bytes: bytes) -> str:
    """An image's content hash as recorded: the sha256 of its float32 bytes as fed, 16 hex digits."""
    return hashlib.sha256(image_bytes).hexdigest()[:16]


@dataclass(frozen=True)
class ImageSet:
    """The images of one role: the split they come from, their indices there, their content hashes."""

    role: str
    split: str
    indices: tuple[int, ...]
    hashes: tuple[str, ...]

    def keys(self) -> set[tuple[str, int]]:
        return {(self.split, i) for i in self.indices}

    def to_json(self) -> dict:
        return {"role": self.role, "split": self.split, "count": len(self.indices), "indices": list(self.indices),
                "sha256_16": list(self.hashes)}

    @classmethod
    def from_json(cls, data: dict) -> ImageSet:
        """From a recorded file (untrusted): wrong types raise ValueError."""
        indices, hashes = data.get("indices"), data.get("sha256_16")
        if not isinstance(indices, list) or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0
                                                    for i in indices):
            raise ValueError("indices must be a list of non-negative integers")
        if not isinstance(hashes, list) or not all(isinstance(h, str) and len(h) <= 64 for h in hashes):
            raise ValueError("sha256_16 must be a list of hex strings")
        role, split = data.get("role"), data.get("split")
        if not isinstance(role, str) or not isinstance(split, str):
            raise ValueError("role and split must be strings")
        return cls(role, split, tuple(indices), tuple(hashes))


@dataclass(frozen=True)
class HeldOut:
    """Whether a verdict is on held-out images, and why (or why not)."""

    status: str  # HELD_OUT or NOT_HELD_OUT
    reasons: tuple[str, ...] = ()
    overlaps: dict[str, int] = field(default_factory=dict)  # role -> verdict images it shares
    checked: tuple[str, ...] = ()  # the recorded roles the verdict images were compared with
    unrecorded: tuple[str, ...] = ()  # roles that did not run (tune's search without tune): nothing to overlap

    @property
    def held_out(self) -> bool:
        return self.status == HELD_OUT

    def line(self) -> str:
        if not self.held_out:
            return f"not held out: {'; '.join(self.reasons)}"
        line = "held out: no verdict image is among the images of " + (", ".join(self.checked) or "any other role")
        return line + (f" ({', '.join(self.unrecorded)}: not run)" if self.unrecorded else "")

    def to_json(self) -> dict:
        return {"status": self.status, "held_out": self.held_out, "reasons": list(self.reasons),
                "overlaps": dict(self.overlaps), "checked": list(self.checked), "not_run": list(self.unrecorded),
                "line": self.line()}


def held_out_status(verdict: ImageSet, others: dict[str, ImageSet | None], split: bool, split_reason: str = "",
                    missing: Sequence[str] = ()) -> HeldOut:
    """The verdict is held out only when the validation split was cut (``split``), every role that ran left a record
    (``missing`` names those that ran and did not), and no verdict image is, by split and index or by content, among
    any recorded role's images. A role mapped to None did not run (a run without tune has no search images): it cannot
    overlap, and is named as not run."""
    reasons: list[str] = []
    overlaps: dict[str, int] = {}
    if not split:
        reasons.append(split_reason or "the validation split was not cut into search and verdict parts")
    reasons += [f"no record of the {role} images" for role in missing]
    mine = verdict.keys()
    for role, other in others.items():
        if other is None:
            continue
        theirs = set(other.hashes)
        count = max(len(mine & other.keys()), sum(1 for h in verdict.hashes if h in theirs))
        if count:
            overlaps[role] = count
            reasons.append(f"{count} of the {len(verdict.indices)} verdict images are {role} images")
    checked = tuple(role for role, other in others.items() if other is not None)
    unrecorded = tuple(role for role, other in others.items() if other is None)
    return HeldOut(NOT_HELD_OUT if reasons else HELD_OUT, tuple(reasons), overlaps, checked, unrecorded)
