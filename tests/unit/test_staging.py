"""Staging, pure parts (core/staging.py): the record of what a staging run proved, and the
disk-space decision for a new model kept beside the serving one."""

from __future__ import annotations

import hashlib

from sglang_deploy.core import staging

INPUTS = {"release": "r2", "unit": "[Service]\nExecStart=x\n", "flags": ["--tp-size", "8"],
          "steps": ["import"], "smoke": True, "jit_env": {"PATH": "/bin"}, "caps": ["12.0"]}
GIB = 1024 ** 3


def present(text: str) -> dict:
    return {"kind": "file", "sha256": hashlib.sha256(text.encode()).hexdigest()}


def test_a_record_stands_only_for_exactly_what_it_proved():
    text = staging.record_text(INPUTS)
    assert "ExecStart" not in text and "tp-size" not in text  # the digest only
    assert staging.proven(present(text), INPUTS)
    assert staging.proven(present(text), dict(reversed(list(INPUTS.items()))))  # key order
    for key, other in (("unit", "[Service]\nExecStart=y\n"), ("release", "r3"),
                       ("caps", ["9.0"]), ("smoke", False), ("jit_env", {})):
        assert not staging.proven(present(text), {**INPUTS, key: other}), key
    assert not staging.proven(None, INPUTS)
    assert not staging.proven({"kind": "file", "sha256": None}, INPUTS)


def test_the_new_model_needs_its_missing_bytes_and_headroom_free():
    assert staging.model_disk_error("/models/m2", 100 * GIB, 0, 103 * GIB) is None
    assert staging.model_disk_error("/models/m2", 100 * GIB, 90 * GIB, 13 * GIB) is None  # resumed
    err = staging.model_disk_error("/models/m2", 100 * GIB, 0, 60 * GIB)
    assert err is not None
    assert "100.0 GiB still to fetch" in err.what and "60.0 GiB free (42.0 GiB short)" in err.found
    assert "free 42.0 GiB" in err.fix and "nothing was drained" in err.fix
    assert err.details == {"need_bytes": 102 * GIB, "free_bytes": 60 * GIB}


def test_unknown_figures_are_not_judged():
    assert staging.model_disk_error("/m", None, 0, 1) is None
    assert staging.model_disk_error("/m", 100 * GIB, 0, None) is None
