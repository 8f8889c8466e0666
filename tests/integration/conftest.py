"""Integration tests: one real testbed (systemd-nspawn hosts) per session.

The `testbed` fixture runs `python -m testbed up --hosts $TESTBED_HOSTS` (default 3) once,
yields a small API object and runs `python -m testbed down` at the end (unless
TESTBED_KEEP=1). If the testbed cannot start, the tests FAIL: they are never skipped.
Every test in tests/integration is marked `integration`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).resolve().parent
    for item in items:
        if here in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.integration)


def run_testbed(*args: str, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess:
    """`python -m testbed ARGS` from the repo root (same env: TESTBED_DIR etc. pass through)."""
    r = subprocess.run([sys.executable, "-m", "testbed", *args], check=False, cwd=REPO,
                       capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise AssertionError(f"python -m testbed {' '.join(args)} failed (rc={r.returncode}):\n"
                             f"{r.stdout}\n{r.stderr}")
    return r


def state_path() -> Path:
    env = os.environ.get("TESTBED_DIR")
    return (Path(env).expanduser().resolve() if env else REPO / ".testbed") / "state.json"


@dataclass
class Testbed:
    """What tests get: the hosts of the running testbed and a few helpers."""

    state: dict
    inventory: Path = REPO / "inventory" / "testbed.py"
    log: list = field(default_factory=list)

    @property
    def hosts(self) -> list[str]:
        return [h["name"] for h in self.state["hosts"]]

    def host(self, name: str) -> dict:
        return next(h for h in self.state["hosts"] if h["name"] == name)

    def address(self, name: str) -> str:
        return self.host(name)["address"]

    def reload(self) -> dict:
        self.state = json.loads(state_path().read_text())
        return self.state

    def ssh_argv(self, host: str, cmd: str, known_hosts: str | None = None) -> list[str]:
        return [
            "ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
            "-o", f"UserKnownHostsFile={known_hosts or self.state['known_hosts']}",
            "-o", "GlobalKnownHostsFile=/dev/null", "-o", "IdentitiesOnly=yes",
            "-o", "ConnectTimeout=10", "-o", "LogLevel=ERROR",
            "-i", self.state["key"], f"root@{self.address(host)}", cmd,
        ]

    def ssh(self, host: str, cmd: str, check: bool = False, timeout: float = 120,
            known_hosts: str | None = None) -> subprocess.CompletedProcess:
        """Run CMD (a shell string) on HOST as root, strict host key checking."""
        r = subprocess.run(self.ssh_argv(host, cmd, known_hosts), check=False, capture_output=True, text=True,
                           timeout=timeout, stdin=subprocess.DEVNULL)
        if check and r.returncode != 0:
            raise AssertionError(f"{host}: `{cmd}` rc={r.returncode}\n{r.stdout}\n{r.stderr}")
        return r

    def scenario(self, host: str, name: str, when: str = "") -> None:
        run_testbed("scenario", host, name, *(["--when", when] if when else []), timeout=120)

    def wipe(self, host: str) -> None:
        run_testbed("wipe", host, timeout=300)
        self.reload()

    def status(self) -> dict:
        return json.loads(run_testbed("status", "--json", timeout=120).stdout)

    def wait_for(self, what: str, predicate, timeout: float = 30.0, interval: float = 0.2):
        """Poll PREDICATE until truthy (returned) or fail with its last value."""
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            last = predicate()
            if last:
                return last
            time.sleep(interval)
        raise AssertionError(f"timed out after {timeout}s waiting for {what}; last: {last!r}")


@pytest.fixture(scope="session")
def testbed():
    n = os.environ.get("TESTBED_HOSTS", "3")
    if os.geteuid() != 0:
        pytest.fail("the integration testbed needs root (overlays, netns, systemd-nspawn)")
    t0 = time.monotonic()
    r = run_testbed("up", "--hosts", n, timeout=900, check=False)
    if r.returncode != 0:
        run_testbed("down", timeout=300, check=False)
        pytest.fail(f"testbed did not start (rc={r.returncode}):\n{r.stdout}\n{r.stderr}")
    tb = Testbed(state=json.loads(state_path().read_text()))
    tb.log.append(f"up --hosts {n}: {time.monotonic() - t0:.1f}s")
    try:
        yield tb
    finally:
        if os.environ.get("TESTBED_KEEP") != "1":
            run_testbed("down", timeout=300, check=False)
