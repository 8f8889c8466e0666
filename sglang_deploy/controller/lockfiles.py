"""Lock files on the controller: read here, parsed by ``core.lockfile`` (once per text)."""

from __future__ import annotations

import os
from pathlib import Path

from sglang_deploy.core.lockfile import Lock


def read(path: str | os.PathLike) -> Lock:
    """The lock file at PATH (its text read now; parsed once per text, ``Lock.of``)."""
    return Lock.of(Path(path).read_text(), str(path))
