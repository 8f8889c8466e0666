"""lxchost/serving.py: the routers that front the server a container holds, read from
the serving fleet's inventory the way `sglang-deploy rollout` reads it, inside a pyinfra run
(its own context kept), with no connection and no HTTP call."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyinfra.context import ctx_inventory, ctx_state

from sglang_deploy.core.errors import DataError, LxcHostError, UsageError
from sglang_deploy.core.lxchost.containers import Serves
from sglang_deploy.lxchost import serving

# the router's key named for every host (its workers too), as the data check asks
ROUTED = """\
KEY = {"router_api_key_env": "LXCDRAIN_TEST_KEY"}
servers = [("gpu1", {"ssh_hostname": "10.9.0.11", **KEY}),
           ("gpu2", {"ssh_hostname": "10.9.0.12", **KEY})]
routers = [("rt1", {"ssh_hostname": "10.9.0.10", "router_host": "0.0.0.0", **KEY})]
"""
ALONE = 'servers = [("gpu1", {"ssh_hostname": "10.9.0.11"})]\n'


def inventory(tmp_path: Path, text: str) -> str:
    path = tmp_path / "fleet.py"
    path.write_text(text)
    return str(path)


def test_the_router_that_fronts_the_host_with_the_controllers_key(tmp_path, monkeypatch):
    monkeypatch.setenv("LXCDRAIN_TEST_KEY", "k-123")
    mine_state, mine_inventory = object(), object()
    ctx_state.set(mine_state)
    ctx_inventory.set(mine_inventory)
    try:
        (r,) = serving.fronting(Serves(inventory(tmp_path, ROUTED), "gpu1"))
        # the run's own pyinfra context is what it was
        assert ctx_state.get() is mine_state and ctx_inventory.get() is mine_inventory
    finally:
        ctx_state.reset()
        ctx_inventory.reset()
    assert (r.host, r.url, r.key) == ("rt1", "http://10.9.0.10:30000", "k-123")
    assert r.workers["gpu1"] == "http://10.9.0.11:30000"


def test_no_router_in_the_inventory_is_no_drain(tmp_path):
    assert serving.fronting(Serves(inventory(tmp_path, ALONE), "gpu1")) == []


def test_a_host_the_inventory_lacks_is_an_error_naming_its_hosts(tmp_path, monkeypatch):
    monkeypatch.setenv("LXCDRAIN_TEST_KEY", "k")
    with pytest.raises(LxcHostError) as e:
        serving.fronting(Serves(inventory(tmp_path, ROUTED), "gpu9"))
    assert "gpu1, gpu2, rt1" in e.value.found and "serves.host" in e.value.fix


def test_no_router_key_on_the_controller_or_no_inventory_stops_before_anything(tmp_path,
                                                                              monkeypatch):
    monkeypatch.delenv("LXCDRAIN_TEST_KEY", raising=False)
    with pytest.raises(DataError, match="LXCDRAIN_TEST_KEY"):
        serving.fronting(Serves(inventory(tmp_path, ROUTED), "gpu1"))
    with pytest.raises(UsageError, match="no file"):
        serving.fronting(Serves(str(tmp_path / "missing.py"), "gpu1"))


def test_the_record_once_done_is_written_root_only_and_whole(tmp_path):
    import subprocess

    path = tmp_path / "gpu1.json"
    path.write_text('{"old": 1}\n')
    text = '{"version": 1, "lines": ["a \'quoted\' $line"]}\n'
    subprocess.run(["sh", "-c", serving._done_record(str(path), text)], check=True)
    assert path.read_text() == text and path.stat().st_mode & 0o777 == 0o600
