#!/usr/bin/env python3
"""The names TensorRT's Python bindings define, read from their pybind11 source: what tests/fake_tensorrt.py's
TensorRT 11 mode and tests/test_typecheck.py check the pipeline's TensorRT calls against.

    python scripts/tensorrt_binding_names.py TENSORRT_CHECKOUT REV > tests/data/tensorrt_11_1_bindings.json

TENSORRT_CHECKOUT is a git clone of github.com/NVIDIA/TensorRT, REV a tag of it (``v11.1``). It reads
``python/src/infer/*.cpp`` and ``python/src/parsers/*.cpp`` at REV and writes, as JSON: every ``py::enum_`` with its
``.value`` names, every ``py::class_`` with its ``.def``/``.def_property``/``.def_readwrite``/... names, and the
module-level ``m.def`` functions, each in source order. A name is attributed to the last enum or class opened before
it in the file: the layout of these sources (one chain of calls per type). Nothing is compiled.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

OPEN = re.compile(r'py::(enum_|class_)<[^;()]*?>\s*\(\s*m\s*,\s*"(\w+)"')
MEMBER = re.compile(r'(?<!\bm)\.(value|def|def_static|def_property|def_property_readonly|def_readwrite|def_readonly)'
                    r'\(\s*"(\w+)"')
MODULE = re.compile(r'\bm\.(def|attr)\(\s*"(\w+)"')
FOLDERS = ("python/src/infer", "python/src/parsers")


def sources(checkout: str, rev: str) -> dict[str, str]:
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", checkout, *args], capture_output=True, text=True, check=True).stdout

    names = [p for p in git("ls-tree", "-r", "--name-only", rev, *FOLDERS).splitlines() if p.endswith(".cpp")]
    return {path: git("show", f"{rev}:{path}") for path in sorted(names)}


def names(text: str, table: dict) -> None:
    events = sorted([(m.start(), "open", m.group(1), m.group(2)) for m in OPEN.finditer(text)]
                    + [(m.start(), "member", m.group(1), m.group(2)) for m in MEMBER.finditer(text)]
                    + [(m.start(), "module", m.group(1), m.group(2)) for m in MODULE.finditer(text)])
    current = None
    for _, what, kind, name in events:
        if what == "open":
            current = table["enums" if kind == "enum_" else "classes"].setdefault(name, [])
        elif what == "module":
            if name not in table["module"]:
                table["module"].append(name)
        elif current is not None and name not in current:
            current.append(name)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    checkout, rev = argv
    table: dict = {"source": f"github.com/NVIDIA/TensorRT {rev}: python/src/{{infer,parsers}}/*.cpp",
                   "generated_by": "scripts/tensorrt_binding_names.py", "enums": {}, "classes": {}, "module": []}
    for text in sources(checkout, rev).values():
        names(text, table)
    print(json.dumps(table, indent=1, sort_keys=False))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
