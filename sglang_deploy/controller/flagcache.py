"""The controller's cache of parsed ``server_args.py`` files, keyed by the file's sha256.

Reading the flag declarations of a ``server_args.py`` (a large file) costs controller CPU,
and fetching it costs its size per host per run. Every host of a release has the same file,
and a release never changes it, so the host reports the file's sha256 (in the host-state
round trip) and the controller reuses the spec it parsed before from a file with that
sha256. The key also names the parser (a hash of ``core/flags/spec.py``), so a changed parser
never reads an old entry. A missing, unreadable or corrupt entry is a miss, never an error.
The controller's check before connecting (``controller.lockedflags``) keeps its entries the same
way, keyed by the sha256 of the locked sglang WHEEL they were read from.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from sglang_deploy.controller import atomicfile
from sglang_deploy.core.flags import spec as flagmod

#: changes whenever the parser does
PARSER_ID = hashlib.sha256(Path(flagmod.__file__).read_bytes()).hexdigest()[:12]

#: a cache: the specs this process parsed or read, by sha256 (every host of a release reports
#: the same file: one parse or one read per run, not one per host)
_MEMORY: dict[str, flagmod.FlagSpec] = {}


def entry_path(base: str | os.PathLike, sha256: str) -> Path:
    return Path(base) / f"{sha256}.{PARSER_ID}.json"


def load(base: str | os.PathLike, sha256: str | None) -> flagmod.FlagSpec | None:
    """The spec parsed from a ``server_args.py`` with this sha256, or None (a miss)."""
    if not sha256:
        return None
    spec = _MEMORY.get(sha256)
    if spec is not None:
        return spec
    try:
        obj = json.loads(entry_path(base, sha256).read_text())
        if obj.get("sha256") != sha256 or obj.get("parser") != PARSER_ID:
            return None
        spec = flagmod.FlagSpec.from_json(obj["spec"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    _MEMORY[sha256] = spec
    return spec


def store(base: str | os.PathLike, sha256: str, spec: flagmod.FlagSpec) -> None:
    """Keep SPEC for the file with this sha256 (atomic; a failure to write only costs a parse)."""
    _MEMORY[sha256] = spec
    path = entry_path(base, sha256)
    try:
        atomicfile.write(path, json.dumps({"sha256": sha256, "parser": PARSER_ID,
                                           "spec": spec.to_json()}))
    except OSError:
        return


def spec_for(base: str | os.PathLike, text: str, sha256: str | None = None) -> flagmod.FlagSpec:
    """Parse TEXT (a ``server_args.py``) unless the cache has it; keep the result."""
    sha256 = sha256 or hashlib.sha256(text.encode()).hexdigest()
    spec = load(base, sha256)
    if spec is None:
        spec = flagmod.parse_server_args(text)
        store(base, sha256, spec)
    return spec
