"""Say what is happening (issue 25, section 5): the controller's download of the locked sglang
wheel is announced in one line; offline, the warning says "no network" (read from pip's own
output, tests/fixtures/pip/) with the fix, not pip's "No matching distribution"."""

from __future__ import annotations

from pathlib import Path

import pytest

from sglang_deploy.controller import flagcache, lockedflags, pipdownload

REPO = Path(__file__).resolve().parents[2]
PIP = REPO / "tests" / "fixtures" / "pip"
LOCK = REPO / "locks" / "testbed.txt"


@pytest.mark.parametrize("sample, reason", [
    ("refused.txt", "127.0.0.1:9 refused the connection"),
    ("no-network-dns.txt", "cannot resolve pypi.org"),
    ("netns-loopback-down.txt", "network unreachable (127.0.0.1:9)"),
    ("read-timeout.txt", "127.0.0.1:18765 did not answer in time"),
    ("proxy-refused.txt", "127.0.0.1:9 refused the connection"),
])
def test_pips_output_of_an_unreachable_index_is_read_as_such(sample, reason):
    assert pipdownload.unreachable((PIP / sample).read_text()) == reason


def test_an_index_that_answers_without_the_version_is_not_no_network():
    output = (PIP / "reachable-no-such-version.txt").read_text()
    assert "No matching distribution" in output
    assert pipdownload.unreachable(output) is None
    assert pipdownload.unreachable("") is None


def test_offline_the_warning_says_no_network_and_the_fix():
    folders = [Path("/wh"), Path("/cache/wheels")]
    text = lockedflags.no_wheel_warning("0.5.12.post1", LOCK, folders,
                                        (PIP / "no-network-dns.txt").read_text())
    assert text.startswith("the launch flags were not checked on the controller: no network: "
                           "pip could not reach the package index (cannot resolve pypi.org)")
    assert "No matching distribution" not in text
    assert "the host checks them after the install" in text
    assert "fix: make an index reachable" in text and "/wh or /cache/wheels" in text
    assert f"`sglang-deploy wheelhouse {LOCK} DIR`" in text


def test_with_an_index_that_lacks_the_wheel_the_warning_gives_pips_error():
    text = lockedflags.no_wheel_warning("0.5.12.post1", LOCK, [Path("/cache/wheels")],
                                        (PIP / "reachable-no-such-version.txt").read_text())
    assert "no network" not in text
    assert "ERROR: No matching distribution found for sglang==0.5.12.post1" in text


def test_the_download_is_announced_in_one_line_and_offline_says_no_network(tmp_path,
                                                                           monkeypatch):
    """The real pip, against an index on 127.0.0.1 where nothing listens."""
    monkeypatch.setenv("SGLANG_DEPLOY_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("SGLANG_DEPLOY_WHEEL_CACHE", str(tmp_path / "wheels"))
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_FIND_LINKS", "")
    monkeypatch.setattr(flagcache, "_MEMORY", {})
    notes: list[str] = []
    got = lockedflags.locked_flags(LOCK, note=notes.append)
    assert len(notes) == 1 and "\n" not in notes[0]
    assert notes[0] == ("sglang-deploy: downloading the sglang 0.5.12.post1 wheel (pip download, "
                        f"once per version) into {tmp_path / 'wheels'}, to check the launch "
                        "flags against it on the controller")
    assert got.spec is None
    assert "no network: pip could not reach the package index (127.0.0.1:9 refused the " \
           "connection)" in (got.warning or "")


def test_no_download_no_announcement(tmp_path, monkeypatch):
    """Flags already parsed for one of the lock's wheels: nothing is downloaded or said."""
    from sglang_deploy.core import lockfile
    from sglang_deploy.core.flags.spec import FlagSpec

    monkeypatch.setenv("SGLANG_DEPLOY_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(flagcache, "_MEMORY", {})
    sha = min(lockfile.sglang_pin(LOCK.read_text(), str(LOCK)).hashes)
    flagcache.store(lockedflags.spec_cache(), sha, FlagSpec([], version="0.5.12.post1"))
    notes: list[str] = []
    got = lockedflags.locked_flags(LOCK, note=notes.append)
    assert notes == [] and "(cached)" in got.source


# ------------------------------------------------------------------ --help imports no heavy module

HEAVY = ("pyinfra", "pyinfra_cli", "paramiko", "gevent", "rich", "jinja2")
COMMANDS = ("patch", "doctor", "lock", "wheelhouse", "rollout", "status", "logs", "cache",
            "rebuild", "bench", "explain-log", "report", "data-table")


@pytest.mark.parametrize("argv", [[], *([c] for c in COMMANDS)], ids=lambda a: " ".join(a) or "-")
def test_help_imports_none_of_what_the_commands_run_on(argv):
    """`sglang-deploy [CMD] --help` (and building the parser) imports neither pyinfra (with
    paramiko and gevent: ~0.8 s) nor rich nor jinja2: the command modules import them in
    the functions that run. Checked in a fresh interpreter, by sys.modules."""
    import subprocess
    import sys

    code = ("import contextlib, io, sys\n"
            "from sglang_deploy.commands import cli\n"
            "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
            "    try:\n"
            f"        cli.main({[*argv, '--help']!r})\n"
            "    except SystemExit as exc:\n"
            "        assert exc.code == 0, exc.code\n"
            "assert 'usage: sglang-deploy' in out.getvalue()\n"
            f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       check=False, cwd=REPO)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]", f"--help imported {r.stdout.strip()}"
