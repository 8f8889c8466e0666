"""`sglang-deploy metrics-targets`: Prometheus file_sd target groups from an inventory (the
pure builder, and the command's host reading on a real inventory with the SSH read replaced).
Prometheus's own reading of the file and a real scrape: tests/integration/test_metrics.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from sglang_deploy.core import metricstargets as mt

REPO = Path(__file__).resolve().parents[2]


def host(name="h1", **kw) -> mt.Host:
    base = {"name": name, "router": False, "bind": "10.0.0.11", "port": 30000,
            "ssh_address": "10.0.0.11", "release": "abc123", "model": "glm-5"}
    return mt.Host(**{**base, **kw})


def test_a_server_is_labelled_host_group_release_model():
    groups, left = mt.target_groups([host()])
    assert left == []
    assert groups == [{"targets": ["10.0.0.11:30000"],
                       "labels": {"component": "server", "host": "h1", "group": "h1",
                                  "release": "abc123", "model": "glm-5"}}]


def test_routed_servers_carry_the_worker_url_and_group_nodes_their_rank():
    groups, _ = mt.target_groups([
        host("a", group="g", node_rank=0, worker_url="http://10.0.0.11:30000"),
        host("b", bind="10.0.0.12", ssh_address="10.0.0.12", group="g", node_rank=1),
    ])
    a, b = (g["labels"] for g in groups)
    assert a["worker"] == "http://10.0.0.11:30000" and a["group"] == "g" and a["node_rank"] == "0"
    assert "worker" not in b and b["node_rank"] == "1"


def test_wildcard_binds_are_scraped_at_the_hosts_address_and_ipv6_is_bracketed():
    groups, _ = mt.target_groups([host(bind="0.0.0.0", ssh_address="gpu1.example"),
                                  host("h2", bind="fd00::2", ssh_address="fd00::2")])
    assert [g["targets"] for g in groups] == [["gpu1.example:30000"], ["[fd00::2]:30000"]]


def test_loopback_targets_are_left_out_with_the_fix_unless_asked_for():
    servers = [host(bind="127.0.0.1"),
               mt.Host(name="r", router=True, bind="127.0.0.1", port=29000,
                       ssh_address="10.0.0.10", release="smg1")]
    groups, left = mt.target_groups(servers)
    assert groups == []
    assert [(lo.host, lo.component) for lo in left] == [("h1", "server"), ("r", "router")]
    assert "`sglang_host`" in left[0].fix and "`router_prometheus_host`" in left[1].fix
    groups, left = mt.target_groups(servers, include_loopback=True)
    assert left == [] and [g["targets"] for g in groups] == [["127.0.0.1:30000"],
                                                             ["127.0.0.1:29000"]]
    assert groups[1]["labels"] == {"component": "router", "host": "r", "release": "smg1"}


def test_metrics_off_leaves_the_server_out_and_the_watchdog_has_its_own_target():
    groups, left = mt.target_groups([host(metrics_on=False, watchdog_port=9400),
                                     host("h2", release=None, watchdog_port=9400)])
    assert [lo.host for lo in left] == ["h1"] and "enable-metrics" in left[0].why
    assert [(g["targets"][0], g["labels"]["component"]) for g in groups] == [
        ("10.0.0.11:9400", "watchdog"), ("10.0.0.11:30000", "server"),
        ("10.0.0.11:9400", "watchdog")]
    assert groups[1]["labels"]["release"] == "unknown"  # not read


@pytest.mark.parametrize("out, release", [
    ("/opt/sglang/releases/d5e0ed013b590921\n", "d5e0ed013b590921"),
    ("/opt/sglang/releases/d5e0ed013b590921/\n", "d5e0ed013b590921"),
    ("", None),  # no `current` link: never deployed
])
def test_release_of_the_current_link(out, release):
    assert mt.release_of(out) == release
    assert mt.release_command("/opt/sglang/") == "readlink -- /opt/sglang/current || true"


# ---- the command's reading of an inventory ------------------------------------------------

INVENTORY = '''
_base = {"ssh_port": 9, "sglang_model_path": "/srv/models/m", "sglang_lock": "locks/testbed.txt",
         "sglang_served_model_name": "glm-5", "watchdog_metrics_port": 9400,
         "router_host": "0.0.0.0", "router_api_key_env": "MT_ROUTER_KEY"}
gpu_hosts = ([("gpu1", {**_base, "ssh_hostname": "10.9.0.11"}),
              ("gpu2", {**_base, "ssh_hostname": "10.9.0.12",
                        "sglang_flags": {"tp-size": 8, "enable-metrics": False},
                        "watchdog": "off"})], {})
routers = ([("rt", {**_base, "ssh_hostname": "10.9.0.10", "router_prometheus_host": "0.0.0.0"})],
           {})
'''


@pytest.fixture
def project(tmp_path, monkeypatch):
    (tmp_path / "locks").mkdir()
    for lock in ("testbed.txt", "router.txt"):
        (tmp_path / "locks" / lock).write_text((REPO / "locks" / lock).read_text())
    (tmp_path / "inv.py").write_text(INVENTORY)
    for key, value in {"SGLANG_DEPLOY_CACHE": str(tmp_path / "cache"),
                       "SGLANG_DEPLOY_WHEEL_CACHE": str(tmp_path / "wheels"),
                       "PIP_CONFIG_FILE": "/dev/null", "PIP_INDEX_URL": "http://127.0.0.1:9/simple",
                       "MT_ROUTER_KEY": "k" * 32}.items():
        monkeypatch.setenv(key, value)
    return tmp_path


def test_the_inventory_becomes_targets_with_one_parallel_read_per_host(project):
    from sglang_deploy.commands import metricstargets
    from sglang_deploy.controller import hosts as hostsmod

    sel = hostsmod.select("inv.py", cwd=project)
    reads, lock = [], threading.Lock()
    started = threading.Barrier(3, timeout=30)  # all three reads run at once, or this fails

    def read(name, data, root, cwd):
        with lock:
            reads.append((name, root))
        started.wait()
        return {"gpu1": ("rel1", None), "rt": ("smgrel", None)}.get(name, (None, "ssh: refused"))

    hosts, errors = metricstargets.hosts_of(sel, cwd=str(project), read=read)
    assert sorted(reads) == [("gpu1", "/opt/sglang"), ("gpu2", "/opt/sglang"), ("rt", "/opt/smg")]
    assert errors == {"gpu2": "ssh: refused"}
    groups, left = mt.target_groups(hosts)
    by = {(g["labels"]["host"], g["labels"]["component"]): g for g in groups}
    # behind the router, a loopback sglang_host binds the worker address (ssh_hostname)
    assert by["gpu1", "server"] == {"targets": ["10.9.0.11:30000"], "labels": {
        "component": "server", "host": "gpu1", "group": "gpu1", "release": "rel1",
        "model": "glm-5", "worker": "http://10.9.0.11:30000"}}
    assert by["gpu1", "watchdog"]["targets"] == ["10.9.0.11:9400"]
    assert ("gpu2", "server") not in by and [lo.host for lo in left] == ["gpu2"]
    assert ("gpu2", "watchdog") not in by  # `watchdog: off`: no watchdog serves there
    assert by["rt", "router"] == {"targets": ["10.9.0.10:29000"], "labels": {
        "component": "router", "host": "rt", "release": "smgrel"}}


def test_the_command_writes_the_file_and_fails_for_an_unreadable_host(project):
    """The real command: nothing listens on port 9, so every read fails; the file is still
    written (release unknown) and the exit status says so."""
    out = project / "targets.json"
    env = {**os.environ, "SGLANG_DEPLOY_CACHE": str(project / "cache"),
           "SGLANG_DEPLOY_WHEEL_CACHE": str(project / "wheels"), "PIP_CONFIG_FILE": "/dev/null",
           "PIP_INDEX_URL": "http://127.0.0.1:9/simple", "MT_ROUTER_KEY": "k" * 32}
    r = subprocess.run([sys.executable, "-m", "sglang_deploy.commands.cli", "metrics-targets",
                        "inv.py", "--out", str(out), "--data", "ssh_hostname=127.0.0.1",
                        "--data", "router_worker_address=10.9.0.11",
                        "--data", "ssh_connect_retries=0"],
                       cwd=project, env=env, capture_output=True, text=True, timeout=120,
                       check=False)
    assert r.returncode == 1, r.stdout + r.stderr
    groups = json.loads(out.read_text())
    assert {g["labels"]["release"] for g in groups} == {"unknown"}
    assert "gpu1: release not read (" in r.stderr
    assert "gpu2 (server) left out: its flags turn /metrics off" in r.stderr
