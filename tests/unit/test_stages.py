"""stages.lock_info: the controller's lock file, parsed once per text (``lockfile.Lock``)."""

from __future__ import annotations

import hashlib
import os
from types import SimpleNamespace

import pytest

from sglang_deploy.core import lockfile
from sglang_deploy.core.errors import DataError
from sglang_deploy.stages import stages

LOCK = "sglang==0.5.12.post1 \\\n    --hash=sha256:" + "a" * 64 + "\n"


@pytest.fixture
def cwd(tmp_path, monkeypatch):
    monkeypatch.setattr(stages, "state", SimpleNamespace(cwd=str(tmp_path)))
    lockfile._parsed.cache_clear()
    return tmp_path


def test_lock_info_parses_a_lock_once(cwd, monkeypatch):
    lock = cwd / "locks" / "x.txt"
    lock.parent.mkdir()
    lock.write_text(LOCK)
    scans = []
    real = lockfile._scan
    monkeypatch.setattr(lockfile, "_scan", lambda text, source: scans.append(source) or real(text, source))
    want = (hashlib.sha256(LOCK.encode()).hexdigest()[:16], "0.5.12.post1", LOCK)
    assert stages.lock_info("locks/x.txt") == want
    assert stages.lock_info("locks/x.txt") == want  # every host of the fleet: no second parse
    assert len(scans) == 1
    # a new version of the file (re-locked during the run) is parsed again
    new = LOCK.replace("0.5.12.post1", "0.5.13")
    lock.write_text(new)
    os.utime(lock, ns=(1, 1))
    assert stages.lock_info("locks/x.txt")[1] == "0.5.13" and len(scans) == 2


@pytest.mark.parametrize("text, words", [("numpy==1.0 --hash=sha256:" + "b" * 64 + "\n", "sglang==VERSION"),
                                         ("sglang==0.5.12\n", "hashes for every pin")])
def test_a_bad_lock_fails_every_time(cwd, text, words):
    (cwd / "bad.txt").write_text(text)
    for _ in range(2):  # errors are not cached away
        with pytest.raises(DataError, match="sglang_lock") as err:
            stages.lock_info("bad.txt")
        assert words in str(err.value)
    with pytest.raises(DataError, match="no file"):
        stages.lock_info("missing.txt")
