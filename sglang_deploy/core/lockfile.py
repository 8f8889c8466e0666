"""The release lock (``locks/NAME.txt``, ``uv pip compile --generate-hashes``), read (pure).

``parse_lock`` gives every pin with its sha256 hashes; ``sglang_pin`` the one the launch
flags are checked against (the controller's flag check reads that wheel's server_args.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from packaging.utils import canonicalize_name

from sglang_deploy.core.errors import DataError


@dataclass(frozen=True)
class Pin:
    name: str
    version: str
    hashes: frozenset[str]

    def requirement(self) -> str:
        """``name==version --hash=sha256:...`` (one line of a requirements file)."""
        return f"{self.name}=={self.version} " + " ".join(
            f"--hash=sha256:{h}" for h in sorted(self.hashes))


def parse_lock(text: str, source: str = "the lock") -> list[Pin]:
    """Pins of a hashed lock (continuation lines joined); raises DataError for a line that is
    not pinned with == or a pin without hashes."""
    joined = re.sub(r"\\\n", " ", text)
    pins = []
    for line in joined.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        m = re.match(r"([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==([^\s;]+)", line)
        if not m:
            raise DataError(key="sglang_lock", what=f"every requirement of {source} pinned with ==",
                            found=f"`{line[:120]}`", fix="regenerate it: sglang-deploy lock")
        hashes = frozenset(re.findall(r"--hash=sha256:([0-9a-f]{64})", line))
        if not hashes:
            raise DataError(key="sglang_lock", what=f"hashes for every pin of {source}",
                            found=f"{m.group(1)} has none",
                            fix="regenerate the lock with `sglang-deploy lock`")
        pins.append(Pin(str(canonicalize_name(m.group(1))), m.group(2), hashes))
    return pins


def sglang_pin(text: str, source: str = "the lock") -> Pin:
    """The ``sglang==VERSION`` pin of a lock, with its hashes."""
    for pin in parse_lock(text, source):
        if pin.name == "sglang":
            return pin
    raise DataError(key="sglang_lock", what=f"{source} pins sglang==VERSION",
                    found="no sglang pin", fix="add sglang to the .in file and re-lock")
