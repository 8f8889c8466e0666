"""core/lxchost/restart.py: the restart decision per situation and dialect."""

from __future__ import annotations

import pytest
from lxchost_fixtures import run_standin

from sglang_deploy.core.errors import LxcHostError
from sglang_deploy.core.lxchost import restart as r
from sglang_deploy.core.lxchost.containers import Serves


def decide(**kw):
    base = {"changed": True, "running": True, "serving": True}
    return r.decide(kw.pop("dialect", "lxc"), "gpu-node-1", **{**base, **kw})


def test_unchanged_does_nothing():
    assert decide(changed=False).action == r.NOTHING


def test_stopped_is_started():
    d = decide(running=False, dialect="proxmox", ctid=105)
    assert (d.action, d.command) == (r.START, "pct start 105")


def test_not_serving_restarts_now():
    d = decide(serving=False)
    assert (d.action, d.command) == (r.RESTART, "lxc-stop -n gpu-node-1 && lxc-start -n gpu-node-1")


def test_serving_when_idle_is_only_reported_with_the_command():
    d = decide(dialect="incus")
    assert (d.action, d.command) == (r.NEEDED, "incus restart gpu-node-1")
    assert "when-idle" in d.reason


def test_now_restarts_a_serving_container_or_drains_it_behind_a_router():
    plain = decide(policy="now")
    assert (plain.action, plain.steps) == (r.RESTART, ("restart", "boot"))
    d = decide(policy="now", behind_router=True, serves=True, dialect="lxd")
    assert (d.action, d.command) == (r.DRAIN, "lxc restart gpu-node-1")
    assert d.steps == ("drain", "restart", "boot", "verify", "put-back")


def test_a_named_server_without_a_router_is_restarted_then_verified():
    d = decide(policy="now", serves=True)
    assert (d.action, d.steps) == (r.RESTART, ("restart", "boot", "verify"))
    assert "verified" in d.reason


def test_a_router_without_a_named_server_is_no_drain():
    """BEHIND_ROUTER comes from the server the data names: without one nothing to drain."""
    assert decide(policy="now", behind_router=True).action == r.RESTART


@pytest.mark.parametrize("kw", [{"serving": False}, {"running": False}, {"changed": False},
                                {"policy": "when-idle"}, {"policy": "never"}])
def test_only_a_serving_container_restarting_now_is_drained_and_verified(kw):
    d = decide(**{"policy": "now", "behind_router": True, "serves": True, **kw})
    assert d.action != r.DRAIN and "verify" not in d.steps and "drain" not in d.steps
    if d.action in (r.NOTHING, r.NEEDED):
        assert d.steps == ()


@pytest.mark.parametrize("step", ["drain", "restart", "boot", "verify", "put-back"])
def test_a_failed_step_says_what_was_expected_found_and_how_it_goes_back(step):
    serves = Serves("inventory/prod.py", "gpu1", ("gpu_p2p_min_gbps=0.5",))
    err = r.step_failed("gpu-node-1", serves, step, "last: 3 in flight", routed=True)
    assert isinstance(err, LxcHostError)
    assert err.found == "last: 3 in flight"
    back = "sglang-deploy rebuild inventory/prod.py gpu1 --data gpu_p2p_min_gbps=0.5"
    assert back in err.fix and "stays out of the router" in err.fix
    assert "stays out" not in r.step_failed("c", serves, step, "x", routed=False).fix
    if step == "verify":
        assert "pyinfra inventory/prod.py deploy.py --limit gpu1" in err.what
    if step == "drain":
        assert "was not restarted" in err.fix


def test_never_leaves_even_an_idle_container():
    d = decide(policy="never", serving=False, dialect="proxmox", ctid=105)
    assert (d.action, d.command) == (r.NEEDED, "pct reboot 105")


@pytest.mark.parametrize("dialect", ["proxmox", "incus", "lxd"])
def test_restart_and_start_argv_are_accepted_by_the_stand_ins(tmp_path, dialect):
    for argv in r.restart_argv(dialect, "gpu-node-1", 105) + r.start_argv(dialect, "gpu-node-1", 105):
        done, calls = run_standin(argv, tmp_path)
        assert done.returncode == 0, (argv, done.stderr)
        assert calls[-1]["argv"] == list(argv)
