"""The mutation score from ``mutmut results --all true``, per module, against the committed list of equivalent mutants.

Usage: python scripts/mutation_score.py RESULTS EQUIVALENT MINIMUM [SCOPE]

RESULTS: lines ``<module>.x_<function>__mutmut_<n>: <status>``. EQUIVALENT: lines ``<mutant name>  <reason>`` (``#``
starts a comment); each names a mutant that no test can tell from the original, and why. A killed mutant (a test
failed), one that hung past mutmut's timeout, and one that crashed the interpreter count as caught; one that no test
covers counts as surviving. The score is caught / (mutants - equivalents); exit 1 below MINIMUM, or when the list
names a mutant that no longer survives (keep the list true), exit 0 otherwise. SCOPE (scripts/mutation_scope.txt):
fnmatch patterns of mutant names, one a line; only the mutants they name count, and a pattern that names none fails
the command (a function renamed or moved must not leave the scope silently).
"""

from __future__ import annotations

import fnmatch
import re
import sys
from collections import Counter, defaultdict
from pathlib import Path

CAUGHT = {"killed", "timeout", "segfault", "caught by type check"}
LINE = re.compile(r"^\s*(?P<name>\S+?)\s*:\s*(?P<status>.+?)\s*$")


def read_results(path: Path) -> dict[str, str]:
    results = {}
    for line in path.read_text().splitlines():
        match = LINE.match(line)
        if match and "__mutmut_" in match["name"]:
            results[match["name"]] = match["status"]
    return results


def read_equivalent(path: Path) -> dict[str, str]:
    listed = {}
    for line in path.read_text().splitlines() if path.is_file() else []:
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, _, reason = line.partition(" ")
        if not reason.strip():
            raise SystemExit(f"{path}: {name} has no reason: say why no test can tell it from the original")
        listed[name] = reason.strip()
    return listed


def read_scope(path: Path) -> list[str]:
    return [line.split("#", 1)[0].strip() for line in path.read_text().splitlines() if line.split("#", 1)[0].strip()]


def in_scope(results: dict[str, str], patterns: list[str]) -> tuple[dict[str, str], list[str]]:
    """The results the patterns name, and the patterns that name none."""
    kept = {n: s for n, s in results.items() if any(fnmatch.fnmatchcase(n, p) for p in patterns)}
    unmatched = [p for p in patterns if not any(fnmatch.fnmatchcase(n, p) for n in results)]
    return kept, unmatched


def module_of(name: str) -> str:
    return name.split(".x_")[0].split(".xǁ")[0]


def main(results_path: str, equivalent_path: str, minimum: str, scope_path: str | None = None) -> int:
    results = read_results(Path(results_path))
    equivalent = read_equivalent(Path(equivalent_path))
    if not results:
        print(f"no mutants in {results_path}: did mutmut run?")
        return 1
    if scope_path is not None:
        patterns = read_scope(Path(scope_path))
        results, unmatched = in_scope(results, patterns)
        equivalent = {n: why for n, why in equivalent.items() if any(fnmatch.fnmatchcase(n, p) for p in patterns)}
        if unmatched:
            print(f"{scope_path}: no mutant matches {', '.join(unmatched)}: keep the scope true")
            return 1
    stale = sorted(n for n in equivalent if results.get(n, "killed") in CAUGHT)
    per_module: dict[str, Counter] = defaultdict(Counter)
    survivors = []
    for name, status in sorted(results.items()):
        kind = "equivalent" if name in equivalent else "caught" if status in CAUGHT else "survived"
        per_module[module_of(name)][kind] += 1
        if kind == "survived":
            survivors.append(f"  {name}: {status}")
    print(f"{'module':<40} {'mutants':>8} {'caught':>7} {'equiv.':>7} {'survived':>9} {'score':>7}")
    total = Counter()
    for module, counts in sorted(per_module.items()):
        total.update(counts)
        print(_row(module, counts))
    print(_row("all", total))
    score = total["caught"] / max(1, total["caught"] + total["survived"])
    if survivors:
        print(f"\n{len(survivors)} surviving mutants (`mutmut show NAME` prints one):")
        print("\n".join(survivors))
    if stale:
        print(f"\n{len(stale)} listed as equivalent but caught now (remove them from {equivalent_path}):")
        print("\n".join(f"  {n}" for n in stale))
    print(f"\nmutation score {100 * score:.1f}% (minimum {100 * float(minimum):.0f}%)")
    return 0 if score >= float(minimum) and not stale else 1


def _row(module: str, c: Counter) -> str:
    judged = c["caught"] + c["survived"]
    score = f"{100 * c['caught'] / judged:.1f}%" if judged else "-"
    return (f"{module:<40} {c['caught'] + c['survived'] + c['equivalent']:>8} {c['caught']:>7} {c['equivalent']:>7} "
            f"{c['survived']:>9} {score:>7}")


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:5]))
