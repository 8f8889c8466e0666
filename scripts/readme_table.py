"""Rewrite the data-key table in README.md from sglang_deploy.core.data.KEYS (run after adding keys)."""

import re
from pathlib import Path

from sglang_deploy.core import data

readme = Path(__file__).resolve().parents[1] / "README.md"
text = readme.read_text()
new, n = re.subn(r"^\| key \| type \| default \| meaning \|\n(?:\|.*\n)+", data.markdown_table() + "\n",
                 text, count=1, flags=re.MULTILINE)
assert n == 1, "no data table found in README.md"
readme.write_text(new)
