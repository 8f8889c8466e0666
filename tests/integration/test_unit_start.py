"""The deploy's start command (``unitstart.start_command``) against a testbed host's real
systemd: a unit that starts, and one that systemd cannot begin (its User= does not exist),
whose failure says the status, what it means, the fix and the journal's lines. A throwaway
unit on TB1 (removed at the end); nothing of the deployed service is touched."""

from __future__ import annotations

import shlex

import pytest

from sglang_deploy.core import unitstart

from .helpers import TB1

UNIT = "sgd-start-check.service"


def install(testbed, user: str) -> None:
    text = (f"[Unit]\nDescription=sglang-deploy start check\n[Service]\nType=exec\n"
            f"User={user}\nExecStart=/bin/sleep 600\n")
    testbed.ssh(TB1, f"printf %s {shlex.quote(text)} > /etc/systemd/system/{UNIT} && "
                     f"systemctl daemon-reload && systemctl reset-failed {UNIT} || true", check=True)


@pytest.fixture
def throwaway(testbed):
    yield testbed
    testbed.ssh(TB1, f"systemctl stop {UNIT}; rm -f /etc/systemd/system/{UNIT}; "
                     f"systemctl daemon-reload; systemctl reset-failed {UNIT} || true")


def test_a_unit_that_starts_is_active_and_nothing_is_printed(throwaway):
    install(throwaway, "daemon")
    r = throwaway.ssh(TB1, unitstart.start_command("restart", UNIT))
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert throwaway.ssh(TB1, f"systemctl is-active {UNIT}").stdout.strip() == "active"


def test_a_start_systemd_cannot_begin_says_its_status_the_fix_and_the_journal(throwaway):
    install(throwaway, "no-such-user-sgd")
    r = throwaway.ssh(TB1, unitstart.start_command("start", UNIT))
    assert r.returncode != 0
    assert f"{UNIT} did not start: systemd result exit-code, exit status 217" in r.stderr, r.stderr
    assert "status 217/USER: the unit's User= does not exist. Fix: re-run the deploy" in r.stderr
    journal = r.stderr.split(f"the last {unitstart.JOURNAL_LINES} lines of its journal:")[1]
    assert "Failed at step USER spawning /bin/sleep" in journal, journal
    assert "starting it again" not in r.stderr  # only 219/CGROUP is tried again
