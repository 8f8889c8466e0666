"""The group rendezvous tool over loopback: rank 0 hears every node's card on each port and
answers with its own; a node that finds nothing listening reports `refused` in bounded time."""

from __future__ import annotations

import socket
import threading

from sglang_deploy.remote import rendezvous


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_nodes_exchange_cards_on_each_port():
    ports = [_free_port(), _free_port()]
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("rank0", rendezvous.listen(
        "127.0.0.1", ports, 1, {"name": "n0", "release": "r1"}, 10.0)))
    t.start()
    node = rendezvous.connect("127.0.0.1", ports, {"name": "n1", "release": "r1"}, 10.0)
    t.join(15)
    assert node["ok"], node
    for p in ports:
        assert node["ports"][str(p)]["card"]["name"] == "n0"
        assert abs(node["ports"][str(p)]["offset_s"]) < 5
        heard = out["rank0"]["ports"][str(p)]["peers"]
        assert [h["card"]["name"] for h in heard] == ["n1"] and heard[0]["addr"] == "127.0.0.1"
    assert out["rank0"]["ok"]


def test_nothing_listening_is_refused_within_the_deadline():
    port = _free_port()
    node = rendezvous.connect("127.0.0.1", [port], {"name": "n1"}, 0.5)
    assert not node["ok"]
    assert node["ports"][str(port)]["error"] == "refused"
    assert node["ports"][str(port)]["attempts"] >= 1


def test_rank0_waiting_for_a_node_that_never_comes_times_out():
    port = _free_port()
    out = rendezvous.listen("127.0.0.1", [port], 1, {"name": "n0"}, 0.3)
    assert not out["ok"] and out["ports"][str(port)]["error"] == "timeout"


def test_a_port_in_use_is_named():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        out = rendezvous.listen("127.0.0.1", [port], 1, {"name": "n0"}, 0.3)
    assert out["ports"][str(port)]["error"] == "in use"


def test_a_port_nobody_reaches_does_not_starve_the_other_port():
    dead, live = _free_port(), _free_port()
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("rank0", rendezvous.listen(
        "127.0.0.1", [live], 1, {"name": "n0"}, 3.0)))
    t.start()
    node = rendezvous.connect("127.0.0.1", [live], {"name": "n1"}, 2.0, reach_ports=[dead])
    t.join(10)
    assert node["ports"][str(live)]["card"]["name"] == "n0"
    assert node["ports"][str(dead)]["error"] == "refused" and node["ports"][str(dead)]["reach_only"]
    assert not node["ok"] and out["rank0"]["ok"]


def test_reach_only_connects_without_sending_a_card():
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)
        port = srv.getsockname()[1]
        node = rendezvous.connect("127.0.0.1", [], {"name": "n1"}, 2.0, reach_ports=[port])
        conn, _ = srv.accept()
        with conn:
            conn.settimeout(1.0)
            assert conn.recv(10) == b""   # connected and closed: nothing sent to the store
    assert node["ok"] and node["ports"][str(port)]["error"] is None


def test_rank_0_counts_the_nodes_that_reach_a_reach_port_without_reading_a_card():
    reach, cards = _free_port(), _free_port()
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("rank0", rendezvous.listen(
        "127.0.0.1", [cards], 1, {"name": "n0"}, 5.0, reach_ports=[reach])))
    t.start()
    node = rendezvous.connect("127.0.0.1", [cards], {"name": "n1"}, 5.0, reach_ports=[reach])
    t.join(10)
    assert node["ok"] and out["rank0"]["ok"], (node, out)
    assert out["rank0"]["ports"][str(reach)]["peers"] == [{"addr": "127.0.0.1", "reach_only": True}]
    assert out["rank0"]["ports"][str(cards)]["peers"][0]["card"]["name"] == "n1"
