"""Staging, pure parts: the record of what a staging run proved on a host, and whether the
disk holds a new model beside the one that serves.

A rollout stages every host before it drains the first (``commands/rollout*``,
``stages/staging.py``): the release venv, the patch, the model files, and the checks that run
without the GPUs (the JIT toolchain, the release smoke under the unit's sandbox). What the
checks proved is kept on the host as a record whose content is a digest of everything they
depended on (the release, the rendered unit, the launch flags, the smoke steps and
environment, the JIT environment and the GPUs' compute capabilities): the rolling run that
follows skips a check only when the record's sha256, read by the host-state read, is the
sha256 of the record it would write itself, that is, when it would prove the same thing.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from sglang_deploy.core.errors import ModelError

#: headroom kept free beyond a new model's size (the server's caches, logs, the journal)
DISK_HEADROOM_BYTES = 2 * 1024 ** 3


def record_text(inputs: Mapping[str, Any]) -> str:
    """The staging record for INPUTS (JSON values): one line holding their digest only (the
    unit and flags stay out of the file; the digest says whether they are the same)."""
    digest = hashlib.sha256(json.dumps(inputs, sort_keys=True, default=str).encode()).hexdigest()
    return json.dumps({"staged": digest}) + "\n"


def record_sha256(inputs: Mapping[str, Any]) -> str:
    return hashlib.sha256(record_text(inputs).encode()).hexdigest()


def proven(present: Mapping[str, Any] | None, inputs: Mapping[str, Any]) -> bool:
    """True when the host's record (``paths[record]`` of the host-state read: kind and
    sha256, or None) is the record of exactly these INPUTS."""
    return present is not None and bool(present) \
        and present.get("sha256") == record_sha256(inputs)


def model_disk_error(path: str, need_bytes: int | None, present_bytes: int,
                     free_bytes: int | None, headroom: int = DISK_HEADROOM_BYTES) -> ModelError | None:
    """None when the disk under PATH holds the new model beside the files that serve now,
    else the error (the figures, and the fix). NEED_BYTES: the new model's full size (None:
    unknown, not judged); PRESENT_BYTES: what of it is already there (a resumed download);
    FREE_BYTES: free space on PATH's file system (None: unknown, not judged). The old files
    are kept until the new release has verified on every host, so they are not counted free."""
    if need_bytes is None or free_bytes is None:
        return None
    missing = max(0, need_bytes - present_bytes)
    if missing + headroom <= free_bytes:
        return None
    gib = 1024 ** 3
    return ModelError(
        what=f"room for the new model under {path}: {missing / gib:.1f} GiB still to fetch "
             f"+ {headroom / gib:.1f} GiB headroom",
        found=f"{free_bytes / gib:.1f} GiB free ({(missing + headroom - free_bytes) / gib:.1f} "
              "GiB short)",
        fix=f"free {(missing + headroom - free_bytes) / gib:.1f} GiB on the file system of "
            f"{path} (an unused model or old release; the model that serves now is kept until "
            "the new one has verified everywhere), or point `sglang_model_path` at a larger "
            "disk; then re-run the rollout (nothing was drained)",
        details={"need_bytes": missing + headroom, "free_bytes": free_bytes})
