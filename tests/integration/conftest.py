"""Integration tests: one real testbed (LXC containers) per session, and fixtures that
put hosts into the state a test needs.

Every test sets up what it needs through these fixtures, so it passes when selected alone
(`-k`) and whatever ran before it: a fixture READS the host's real state first and acts only
when it differs (cheap when an earlier test left the host right). Shared constants and
helpers (host names TB1..TB3, SEED_FLAGS, pyinfra_deploy, the fault records) are in
tests/integration/helpers.py, the router tests' fleet in routedfleet.py, the stand-in
Hugging Face endpoint in hubmirror.py; test modules never import each other.

- `testbed` (session): `python -m testbed up --hosts $TESTBED_HOSTS` (default 3) once, then
  `down` at the end (unless TESTBED_KEEP=1). Yields helpers.Testbed: hosts, address, ssh,
  host_state, scenario, sim_env, wipe, status, wait_for. If the testbed cannot start, the
  tests FAIL: they are never skipped.
- `healthy_testbed` (autouse): after each test, every GPU/server scenario and sim.env key the
  test set through `testbed.scenario` / `testbed.sim_env` goes back to healthy / its default.
- `deployed_host(*hosts, data=(), env=None, inventory=None)`: the hosts converged on that
  configuration (`--data` KEY=VALUE strings, environment for secrets, inventory) and serving
  the invocation a deploy verified. Skips the deploy when the host's state (invocation,
  verified invocation, unit, secrets, release, health, scenarios) is the one this session's
  last deploy of the same configuration left; otherwise runs the real deploy (a no-op on a
  converged host) and asserts it passed.
- `serving_host(*hosts, data=(), env=None, inventory=None)`: the hosts serve a verified
  server, whatever configuration it runs; deploys DATA only when one does not.
- `fresh_host(*hosts)`: blank hosts, as after `python -m testbed wipe` (no /opt/sglang,
  /etc/sglang or sglang unit); wipes only a host that is not blank.
- `failed_host(host, scenario, data=(), inventory=None, env=None)`: HOST's latest deploy
  failed in the server SCENARIO (set, the service stopped, deployed; the scenario stays
  until the test ends). Returns that deploy's CompletedProcess.

Every test in tests/integration is marked `integration`.
"""

from __future__ import annotations

import json
import os
import time

import pytest

from .helpers import (
    INVENTORY,
    SIM_ENV_DEFAULTS,
    Testbed,
    both,
    data_args,
    pyinfra_deploy,
    run_testbed,
    state_path,
)


def pytest_collection_modifyitems(config, items):
    here = os.path.dirname(os.path.abspath(__file__))
    for item in items:
        if os.path.abspath(str(item.fspath)).startswith(here + os.sep):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def testbed():
    n = os.environ.get("TESTBED_HOSTS", "3")
    if os.geteuid() != 0:
        pytest.fail("the integration testbed needs root (overlays, netns, LXC)")
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


@pytest.fixture(autouse=True)
def healthy_testbed(request):
    """After the test: scenarios and sim.env keys it set go back to healthy / default."""
    yield
    if "testbed" not in request.fixturenames:
        return
    tb: Testbed = request.getfixturevalue("testbed")
    for host in sorted(tb.touched_scenarios):
        run_testbed("scenario", host, "healthy", timeout=120)
    tb.touched_scenarios.clear()
    for host, keys in sorted(tb.touched_sim_env.items()):
        run_testbed("sim-env", host, *(f"{k}={SIM_ENV_DEFAULTS.get(k, '')}" for k in sorted(keys)),
                    timeout=120)
    tb.touched_sim_env.clear()


# host -> (configuration key, the host's state right after that configuration's deploy)
_converged: dict[str, tuple[tuple, dict]] = {}
_STATE_KEYS = ("invocation", "unit", "secrets", "current", "health", "gpu", "sim")


def _serving_verified(s: dict) -> bool:
    return (s.get("health") == "200" and bool(s.get("invocation"))
            and s.get("invocation") == s.get("verified")
            and s.get("gpu") == "healthy" and s.get("sim") == "healthy")


def _config_key(data, env, inventory) -> tuple:
    return (str(inventory or INVENTORY), tuple(data), tuple(sorted((env or {}).items())))


def _deploy_and_note(testbed: Testbed, hosts, data, env, inventory) -> None:
    r = pyinfra_deploy(hosts, *data_args(*data), inventory=inventory or INVENTORY, env=env)
    testbed.log.append(r)
    assert r.returncode == 0, (f"setting up {', '.join(hosts)} (deploy {list(data)}) failed:\n"
                               + both(r)[-4000:])
    key = _config_key(data, env, inventory)
    for h in hosts:
        s = testbed.host_state(h)
        assert _serving_verified(s), (h, s)
        _converged[h] = (key, {k: s.get(k) for k in _STATE_KEYS})


@pytest.fixture
def deployed_host(testbed):
    """deployed_host(*hosts, data=(), env=None, inventory=None): hosts converged on that
    configuration and serving the invocation a deploy verified (see the module docstring)."""

    def ensure(*hosts: str, data=(), env: dict | None = None, inventory=None) -> None:
        key = _config_key(data, env, inventory)
        todo = []
        for h in hosts:
            s = testbed.host_state(h)
            seen = _converged.get(h)
            if not (_serving_verified(s) and seen and seen[0] == key
                    and seen[1] == {k: s.get(k) for k in _STATE_KEYS}):
                todo.append(h)
        if todo:
            _deploy_and_note(testbed, todo, data, env, inventory)

    return ensure


@pytest.fixture
def serving_host(testbed):
    """serving_host(*hosts, data=(), env=None, inventory=None): hosts serving a verified
    server (any configuration); DATA is deployed to those that do not."""

    def ensure(*hosts: str, data=(), env: dict | None = None, inventory=None) -> None:
        todo = [h for h in hosts if not _serving_verified(testbed.host_state(h))]
        if todo:
            _deploy_and_note(testbed, todo, data, env, inventory)

    return ensure


@pytest.fixture
def fresh_host(testbed):
    """fresh_host(*hosts): blank hosts (as after `python -m testbed wipe`)."""

    def ensure(*hosts: str) -> None:
        for h in hosts:
            if testbed.host_state(h).get("blank") != "yes":
                testbed.wipe(h)
                _converged.pop(h, None)
            assert testbed.host_state(h).get("blank") == "yes", h

    return ensure


@pytest.fixture
def failed_host(testbed):
    """failed_host(host, scenario, data=(), inventory=None, env=None): HOST's latest deploy
    failed in server SCENARIO; returns that deploy's CompletedProcess."""

    def make(host: str, scenario: str, data=(), inventory=None, env: dict | None = None):
        testbed.ssh(host, "systemctl stop sglang.service 2>/dev/null; true")
        testbed.scenario(host, scenario)
        r = pyinfra_deploy([host], *data_args(*data), inventory=inventory or INVENTORY, env=env)
        testbed.log.append(r)
        assert r.returncode != 0, f"{host}: the deploy passed in scenario {scenario}:\n" + both(r)[-3000:]
        _converged.pop(host, None)
        return r

    return make
