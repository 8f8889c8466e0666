"""The router's pure decisions (sglang_deploy.core.router) and its data keys."""

import pytest

from sglang_deploy.core import data
from sglang_deploy.core import router as r
from sglang_deploy.core.errors import DataError

BASE = {"sglang_model_path": "/srv/models/m", "ssh_hostname": "10.0.0.1"}


@pytest.mark.parametrize("raw, routed, host, key", [
    # no router: loopback and no key kept
    ({"sglang_host": "127.0.0.1"}, False, "127.0.0.1", None),
    # routed: loopback -> the address the router reaches it at (ssh_hostname), router's key
    ({"sglang_host": "127.0.0.1", "router_api_key_env": "RK"}, True, "10.0.0.1", "RK"),
    # routed, an explicit worker address wins over ssh_hostname
    ({"router_worker_address": "10.9.0.1", "router_api_key_env": "RK"}, True, "10.9.0.1", "RK"),
    # routed, a non-loopback bind is the operator's choice: kept
    ({"sglang_host": "0.0.0.0", "router_api_key_env": "RK"}, True, "0.0.0.0", "RK"),
    # routed, the same key variable named twice is fine
    ({"sglang_api_key_env": "RK", "router_api_key_env": "RK"}, True, "10.0.0.1", "RK"),
])
def test_routed_data(raw, routed, host, key):
    out = r.routed_data({**BASE, **raw}, "gpu-1", routed)
    assert out.get("sglang_host", "127.0.0.1") == host
    assert out.get("sglang_api_key_env") == key


def test_routed_worker_with_another_key_is_refused():
    with pytest.raises(DataError) as exc:
        r.routed_data({**BASE, "sglang_api_key_env": "OWN", "router_api_key_env": "RK"}, "g", True)
    assert exc.value.key == "sglang_api_key_env"


def test_routed_worker_without_any_key_is_refused_by_the_bind_check():
    raw = r.routed_data({**BASE}, "gpu-1", True)
    with pytest.raises(DataError) as exc:
        data.resolve(raw, environ={})
    assert exc.value.key == "sglang_host"


@pytest.mark.parametrize("over, env, ok", [
    ({}, {}, True),                                                     # loopback, no key
    ({"router_host": "0.0.0.0"}, {}, False),                             # public, no key
    ({"router_host": "10.0.0.5"}, {}, False),
    ({"router_host": "0.0.0.0", "router_api_key_env": "RK"}, {"RK": "k"}, True),
    ({"router_host": "127.0.0.1", "router_api_key_env": "RK"}, {"RK": "k"}, True),
])
def test_public_router_needs_a_key(over, env, ok):
    if ok:
        s = data.resolve({**BASE, **over}, environ=env)
        assert s.router_key == env.get("RK")
        assert "ROUTER_API_KEY" not in s.secrets  # never in the server's secrets file
    else:
        with pytest.raises(DataError) as exc:
            data.resolve({**BASE, **over}, environ=env)
        assert exc.value.key == "router_host"


@pytest.mark.parametrize("over, key", [
    ({"router_policy": "fastest"}, "router_policy"),
    ({"router_port": 0}, "router_port"),
    ({"router_root": "opt/smg"}, "router_root"),
    ({"router_service": "Smg Router"}, "router_service"),
    ({"rollout_drain_timeout_s": 0}, "rollout_drain_timeout_s"),
    ({"router_api_key_env": "UNSET"}, "router_api_key_env"),
])
def test_bad_router_data_names_its_key(over, key):
    with pytest.raises(DataError) as exc:
        data.resolve({**BASE, **over}, environ={})
    assert exc.value.key == key


@pytest.mark.parametrize("bind, raw, want", [
    ("0.0.0.0", {"ssh_hostname": "10.0.0.5"}, "10.0.0.5"),
    ("0.0.0.0", {}, "router-1"),
    ("10.1.1.1", {"ssh_hostname": "10.0.0.5"}, "10.1.1.1"),
    ("127.0.0.1", {}, "127.0.0.1"),
])
def test_router_address(bind, raw, want):
    assert r.router_address(bind, raw, "router-1") == want


@pytest.mark.parametrize("addr, port, url", [
    ("10.0.0.1", 30000, "http://10.0.0.1:30000"),
    ("fd00::1", 8000, "http://[fd00::1]:8000"),
])
def test_http_url(addr, port, url):
    assert r.http_url(addr, port) == url


def test_launch_argv_and_unit_keep_the_key_out():
    argv = r.launch_argv(python="/opt/smg/current/venv/bin/python", launcher="/opt/smg/tools/smg_launch.py",
                         host="0.0.0.0", port=30000, policy="round_robin",
                         workers=["http://10.0.0.1:30000", "http://10.0.0.2:30000"], prometheus_port=29000)
    assert argv[argv.index("--worker-urls") + 1:argv.index("--policy")] == [
        "http://10.0.0.1:30000", "http://10.0.0.2:30000"]
    assert "--api-key" not in argv
    assert argv[argv.index("--prometheus-host") + 1] == "127.0.0.1"
    unit = r.render_unit(r.RouterUnitSpec(release_id="abc", version="1.13.0", user="smg",
                                          home="/var/lib/smg", secrets_file="/etc/smg/secrets.env",
                                          argv=tuple(argv), workers=("http://10.0.0.1:30000",)))
    assert "EnvironmentFile=/etc/smg/secrets.env" in unit
    assert "ExecStart=/opt/smg/current/venv/bin/python /opt/smg/tools/smg_launch.py launch" in unit
    assert "NoNewPrivileges=yes" in unit and "PrivateDevices=yes" in unit
    # deterministic: the same spec renders the same bytes (a second run changes nothing)
    assert unit == r.render_unit(r.RouterUnitSpec(release_id="abc", version="1.13.0", user="smg",
                                                  home="/var/lib/smg", secrets_file="/etc/smg/secrets.env",
                                                  argv=tuple(argv), workers=("http://10.0.0.1:30000",)))


def test_lock_version():
    h = "--hash=sha256:" + "a" * 64
    assert r.lock_version(f"grpcio==1.0 \\\n    {h}\nsmg==1.13.0 \\\n    {h}\n") == "1.13.0"
    assert r.lock_version("sglang==0.5.12\n") is None


WORKERS = {"workers": [
    {"id": "a", "url": "http://10.0.0.1:30000", "status": "ready", "load": 2},
    {"id": "b", "url": "http://10.0.0.2:30000/", "status": "draining", "load": 1},
    {"id": "c", "url": "http://10.0.0.9:30000", "is_healthy": False, "load": None},
]}


def test_parse_workers():
    ws = r.parse_workers(WORKERS)
    assert [(w.id, w.url, w.status, w.load) for w in ws] == [
        ("a", "http://10.0.0.1:30000", "ready", 2), ("b", "http://10.0.0.2:30000", "draining", 1),
        ("c", "http://10.0.0.9:30000", "not_ready", 0)]
    assert r.find_worker(ws, "http://10.0.0.2:30000/").id == "b"
    assert r.find_worker(ws, "http://10.0.0.3:30000") is None


def test_worker_states_name_absent_and_unknown_workers():
    rows = r.worker_states([("gpu-1", "http://10.0.0.1:30000"), ("gpu-2", "http://10.0.0.2:30000"),
                            ("gpu-3", "http://10.0.0.3:30000")], r.parse_workers(WORKERS))
    assert rows == [
        {"host": "gpu-1", "url": "http://10.0.0.1:30000", "state": "ready"},
        {"host": "gpu-2", "url": "http://10.0.0.2:30000", "state": "draining"},
        {"host": "gpu-3", "url": "http://10.0.0.3:30000", "state": "absent"},
        {"host": None, "url": "http://10.0.0.9:30000", "state": "not_ready"},
    ]


@pytest.mark.parametrize("removed, router_load, worker_reqs, elapsed, want", [
    (False, 3, 3, 1.0, "wait"),       # still listed: a re-add now would race the drain job
    (False, 0, 0, 1.0, "wait"),       # idle but still listed
    (True, 2, 1, 1.0, "wait"),        # forgotten by the router, the server still runs one
    (True, 2, 0, 1.0, "done"),
    (True, 0, None, 1.0, "done"),     # the server cannot say; the router saw none in flight
    (True, 1, None, 1.0, "wait"),     # the server cannot say; the router last saw one
    (True, 2, 1, 30.0, "timeout"),
    (False, 1, 1, 30.0, "timeout"),
])
def test_drain_step(removed, router_load, worker_reqs, elapsed, want):
    w = r.DrainWatch(url="http://10.0.0.1:30000", worker_id="a", router_load=router_load,
                     removed=removed, worker_reqs=worker_reqs)
    assert r.drain_step(w, elapsed, 30.0) == want
    assert ("removed" if removed else "draining") in w.last()


@pytest.mark.parametrize("seen, missing", [
    ({}, ["http://a:1", "http://b:1"]),
    ({"http://a:1": 2}, ["http://b:1"]),
    ({"http://a:1": 1, "http://b:1": 1}, []),
])
def test_routing_missing(seen, missing):
    assert r.routing_missing(["http://a:1", "http://b:1/"], seen) == [m for m in missing]


def test_routed_url_reads_the_header_in_any_case():
    assert r.routed_url({"X-SMG-Routed-Worker-Id": "http://a:1/"}) == "http://a:1"
    assert r.routed_url({"content-type": "x"}) is None
