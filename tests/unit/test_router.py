"""The router's pure decisions (sglang_deploy.core.router) and its data keys."""

import json
from pathlib import Path

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


def test_routed_worker_without_any_key_is_refused_naming_the_routers_key():
    # the operator pass: the bind check blamed the loopback `sglang_host` of the data
    with pytest.raises(DataError) as exc:
        r.routed_data({**BASE}, "gpu-1", True)
    assert exc.value.key == "router_api_key_env"
    assert exc.value.headline().startswith("[gpu-1] invalid data: router_api_key_env: expected")
    assert "binds the address the router reaches it at (10.0.0.1)" in exc.value.headline()


def test_routed_worker_public_without_key_on_purpose_is_left_to_the_bind_check():
    raw = r.routed_data({**BASE, "sglang_allow_public_without_key": True}, "gpu-1", True)
    assert data.resolve(raw, environ={}).sglang_host == "10.0.0.1"


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


@pytest.mark.parametrize("state, router_load, worker_reqs, until, elapsed, want", [
    ("ready", 0, 0, "idle", 1.0, "wait"),          # the DELETE not seen yet: still routable
    ("not_ready", 0, 0, "idle", 1.0, "wait"),      # not routed now, but may be again
    ("draining", 3, 3, "idle", 1.0, "wait"),       # out of routing, requests in flight
    ("draining", 1, 0, "idle", 1.0, "wait"),       # the router still waits for one
    ("draining", 0, 1, "idle", 1.0, "wait"),       # the server still runs one
    ("draining", 0, 0, "idle", 1.0, "done"),       # out of routing and idle: before the settle
    ("draining", 0, None, "idle", 1.0, "done"),    # the server cannot say; the router counts 0
    ("draining", 1, None, "idle", 1.0, "wait"),
    ("draining", 0, 0, "removed", 1.0, "wait"),    # the baseline waits for the router's forget
    ("removed", 2, 0, "removed", 1.0, "done"),     # forgotten: the last router count is moot
    ("removed", 2, 0, "idle", 1.0, "done"),
    ("removed", 2, 1, "idle", 1.0, "wait"),        # forgotten, the server still runs one
    ("removed", 0, None, "idle", 1.0, "done"),     # the server cannot say; the router saw none
    ("removed", 1, None, "idle", 1.0, "wait"),     # the server cannot say; the router last saw one
    ("removed", 2, 1, "idle", 30.0, "timeout"),
    ("draining", 1, 1, "idle", 30.0, "timeout"),
])
def test_drain_step(state, router_load, worker_reqs, until, elapsed, want):
    w = r.DrainWatch(url="http://10.0.0.1:30000", worker_id="a", router_load=router_load,
                     removed=state == "removed", worker_reqs=worker_reqs, router_state=state,
                     until=until)
    assert r.drain_step(w, elapsed, 30.0) == want
    assert f"router: {state}" in w.last()


# Answers of the real router (smg 1.13.0, the wheel of locks/router.txt) and of the testbed's
# server during a drain under load, captured by bench/smg_drain_capture.py.
SMG = json.loads((Path(__file__).parents[1] / "fixtures" / "router" / "smg-1.13.0"
                  / "drain.json").read_text())


def _replay(until: str):
    """drain_step over the captured drain, poll by poll (the router's answer, then the
    server's): the label of the answer it ended at and the watch."""
    w = r.DrainWatch(url=SMG["worker"], worker_id="x", until=until)
    answers = SMG["answers"]
    start = next(i for i, a in enumerate(answers) if a["label"] == "delete")
    end = next(i for i, a in enumerate(answers) if a["label"] == "delete (second drain)")
    for a in answers[start + 1:end]:
        if a["on"] == "router" and a["path"].startswith("/workers/"):
            w.observe(a["status"], a["body"])
            if w.removed:
                w.worker_reqs = 0  # the capture's last server answer before the 404: idle
        elif a["on"] == "worker":
            w.worker_reqs = int(a["body"]["aggregate"]["total_reqs"])
        else:
            continue
        if r.drain_step(w, a["t"], 300.0) == "done":
            return a, w
    raise AssertionError("the drain never ended over the capture")


def test_over_the_real_router_the_drain_ends_when_idle_while_the_router_still_settles():
    first = next(a for a in SMG["answers"] if a["label"] == "poll worker while draining")
    assert first["body"]["status"] == "draining" and first["body"]["load"] > 0  # the capture's premise
    at, w = _replay("idle")
    assert (w.router_state, w.router_load, w.worker_reqs) == ("draining", 0, 0)
    gone = next(a for a in SMG["answers"] if a["status"] == 404)
    assert at["t"] < gone["t"]  # it ended before the router forgot the worker (its settle)
    at, w = _replay("removed")
    assert w.removed and at["t"] >= gone["t"]


def test_over_the_real_router_a_re_add_while_draining_is_refused_and_a_replace_is_undone():
    """Why the put back waits for the forget: SMG refuses a re-add of a draining worker and
    its pending removal takes a worker replaced (PUT) while it drained."""
    by = {a["label"]: a for a in SMG["answers"]}
    assert by["re-add while draining"]["status"] == 409
    draining = next(a for a in SMG["answers"] if a["label"] == "poll worker while draining")
    assert r.put_back_step(draining["body"]["status"]) == "wait-removal"
    replaced = [a for a in SMG["answers"] if a["label"] == "poll replaced worker"]
    assert replaced[0]["body"]["status"] == "ready" and replaced[-1]["status"] == 404
    after = by["list after the replaced worker's removal"]["body"]["workers"]
    assert SMG["worker"] not in [x["url"].rstrip("/") for x in after]


@pytest.mark.parametrize("status, step", [
    (None, "add"), ("draining", "wait-removal"), ("pending", "wait-ready"),
    ("not_ready", "wait-ready"), ("ready", "verify"),
])
def test_put_back_step(status, step):
    assert r.put_back_step(status) == step


def test_observe_reads_the_real_answers():
    by = {a["label"]: a for a in SMG["answers"]}
    w = r.DrainWatch(url=SMG["worker"], worker_id="x")
    w.observe(200, by["one worker, requests in flight"]["body"])
    assert (w.router_state, w.removed) == ("ready", False) and w.router_load > 0
    w.observe(503, {"error": "busy"})  # neither forgotten nor a state: nothing changes
    assert w.router_state == "ready"
    gone = next(a for a in SMG["answers"] if a["status"] == 404)
    w.observe(gone["status"], gone["body"])
    assert w.removed and w.router_state == "removed"


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
