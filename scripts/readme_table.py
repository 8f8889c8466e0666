"""Rewrite the data-key table in docs/data-keys.md from sglang_deploy.core.data.KEYS (run after adding keys)."""

import re
from pathlib import Path

from sglang_deploy.core import data

page = Path(__file__).resolve().parents[1] / "docs" / "data-keys.md"
text = page.read_text()
new, n = re.subn(r"^\| key \| type \| default \| meaning \|\n(?:\|.*\n)+", data.markdown_table() + "\n",
                 text, count=1, flags=re.MULTILINE)
assert n == 1, "no data table found in docs/data-keys.md"
page.write_text(new)
