"""Rewrite the config-key table in docs/configuration.md from pipeline.config.describe (the schema in
pipeline/core/config_schema.py with the backend table's names; tests/test_readme.py checks it)."""

import json
import re
from pathlib import Path

from pipeline.config import describe

PAGE = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"
MARKERS = re.compile(r"(<!-- keys:start -->\n).*?(\n<!-- keys:end -->)", re.DOTALL)


def table() -> str:
    rows = ["| key | default | meaning |", "|---|---|---|"]
    for key, default, doc in describe():
        if ".candidates." in key and not key.startswith("verify.candidates.onnxrt_fp32."):
            continue  # every candidate has the same keys; the page says so
        shown = default if isinstance(default, str) else json.dumps(default)
        rows.append(f"| `{key}` | `{shown}` | {doc.replace('|', '/')} |")
    return "\n".join(rows)


def rewrite(text: str) -> str:
    """``text`` with the table between the keys markers regenerated."""
    if not MARKERS.search(text):
        raise SystemExit(f"{PAGE}: no <!-- keys:start --> ... <!-- keys:end --> markers")
    return MARKERS.sub(lambda m: m.group(1) + table() + m.group(2), text)


if __name__ == "__main__":
    text = PAGE.read_text()
    new = rewrite(text)
    PAGE.write_text(new)
    print(f"{PAGE.name} config table:", "updated" if new != text else "already up to date")
