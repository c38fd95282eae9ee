"""Rewrite the config-key table in README.md from pipeline.config (tests/test_readme.py checks it)."""

import json
import re
from pathlib import Path

from pipeline.config import describe

README = Path(__file__).resolve().parents[1] / "README.md"


def table() -> str:
    rows = ["| key | default | meaning |", "|---|---|---|"]
    for key, default, doc in describe():
        if ".candidates." in key and not key.startswith("verify.candidates.onnxrt_fp32."):
            continue  # every candidate has the same keys; the README says so
        shown = default if isinstance(default, str) else json.dumps(default)
        rows.append(f"| `{key}` | `{shown}` | {doc.replace('|', '/')} |")
    return "\n".join(rows)


if __name__ == "__main__":
    text = README.read_text()
    new = re.sub(r"(<!-- keys:start -->\n).*?(\n<!-- keys:end -->)", lambda m: m.group(1) + table() + m.group(2),
                 text, flags=re.S)
    README.write_text(new)
    print("README.md config table:", "updated" if new != text else "already up to date")
