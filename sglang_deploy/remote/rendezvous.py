#!/usr/bin/env python3
"""A real TCP rendezvous between the nodes of a multi-node group (stdlib only, run by the
host's system python before any server of the group stops).

    rendezvous.py listen  --bind ADDR --port P [--reach R] --peers N --card JSON --timeout S
    rendezvous.py connect --addr ADDR --port P [--reach R] --card JSON --timeout S
    (either: --out FILE writes the result there, whole, by a rename; else to stdout)

Rank 0 listens on each port: the card ports (``--port``: one port of the kernel's ephemeral
range, as NCCL's bootstrap uses) and the reach ports (``--reach``: the dist-init port), and
waits for N peers on each. Every other node connects to each port, retrying until the
deadline (as torch's store client does), all ports in turn. On a card port it sends its card
(one JSON line: its name, release, flags hash, driver version and clock, ``time.time()``) and
rank 0 answers with its own; on a reach port it only connects and closes: that port may be
held by rank 0's running server, and a card would be garbage to torch's store. Each side
prints one JSON object: what it saw of every peer (address, card, the clock offset measured
against its own clock), or the error (``refused``, ``timeout``, ``unreachable``, ``in use``)
per port. Exit status 0 when every exchange happened (the deploy judges the result with the
cards, ``core.group.judge_rendezvous``).
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import selectors
import socket
import sys
import time


def _card_line(card: dict) -> bytes:
    return (json.dumps({**card, "clock": time.time()}, sort_keys=True) + "\n").encode()


def _read_line(conn: socket.socket, deadline: float) -> dict | None:
    buf = b""
    while b"\n" not in buf and len(buf) < 65536:
        conn.settimeout(max(0.1, deadline - time.monotonic()))
        try:
            chunk = conn.recv(4096)
        except (socket.timeout, OSError):
            return None
        if not chunk:
            break
        buf += chunk
    try:
        out = json.loads(buf.split(b"\n", 1)[0].decode())
    except ValueError:
        return None
    return out if isinstance(out, dict) else None


def _error(exc: OSError) -> str:
    if isinstance(exc, socket.timeout):
        return "timeout"
    return {errno.ECONNREFUSED: "refused", errno.EHOSTUNREACH: "unreachable",
            errno.ENETUNREACH: "unreachable", errno.EADDRINUSE: "in use",
            errno.EADDRNOTAVAIL: "address not on this host"}.get(exc.errno or 0, str(exc))


def _bind(bind: str, ports: list[int], peers: int, result: dict) -> dict:
    """A listening socket per port of PORTS; a port that cannot be bound is reported in
    RESULT (``in use``...)."""
    socks = {}
    for port in ports:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((bind, port))
            s.listen(peers + 4)
        except OSError as exc:
            s.close()
            result["ports"][str(port)] = {"error": _error(exc), "peers": []}
            result["ok"] = False
            continue
        socks[port] = s
        result["ports"][str(port)] = {"error": None, "peers": []}
    return socks


def _accepted(conn: socket.socket, addr, card: dict, reach_only: bool, deadline: float
              ) -> dict | None:
    """What a peer that connected gives: nothing read on a reach port, else its card (and
    rank 0's in return); None when it sent no card."""
    if reach_only:
        conn.close()
        return {"addr": addr[0], "reach_only": True}
    conn.setblocking(True)
    with conn:
        got = _read_line(conn, min(deadline, time.monotonic() + 5.0))
        now = time.time()
        try:
            conn.sendall(_card_line(card))
        except OSError:
            pass
    if got is None:
        return None
    return {"addr": addr[0], "card": got, "offset_s": round(got.get("clock", now) - now, 3)}


def listen(bind: str, ports: list[int], peers: int, card: dict, timeout: float,
           reach_ports: list[int] = ()) -> dict:
    """Rank 0: PORTS exchange cards with each peer; REACH_PORTS only count the peers that
    connect (nothing is read: the others only reach them, as they reach a running server's
    store there). A port in use is reported as such (``in use``)."""
    deadline = time.monotonic() + timeout
    result: dict = {"ok": True, "ports": {}}
    socks = _bind(bind, [*reach_ports, *ports], peers, result)
    # every port at once: a port that nobody reaches does not starve the others
    sel = selectors.DefaultSelector()
    for port, s in socks.items():
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ, port)
    pending = {port for port in socks if peers > 0}
    while pending and time.monotonic() < deadline:
        for key, _ in sel.select(timeout=max(0.05, min(1.0, deadline - time.monotonic()))):
            port = key.data
            try:
                conn, addr = key.fileobj.accept()
            except OSError:
                continue
            seen = result["ports"][str(port)]["peers"]
            got = _accepted(conn, addr, card, port in reach_ports, deadline)
            if got is not None:
                seen.append(got)
            if len(seen) >= peers:
                pending.discard(port)
    for port, s in socks.items():
        if len(result["ports"][str(port)]["peers"]) < peers:
            result["ports"][str(port)]["error"] = "timeout"
            result["ok"] = False
        s.close()
    sel.close()
    return result


def _exchange(addr: str, port: int, card: dict | None, deadline: float) -> dict:
    """One attempt on ADDR:PORT: connect and, with a CARD, send it and read rank 0's."""
    with socket.create_connection(
            (addr, port), timeout=max(0.1, min(3.0, deadline - time.monotonic()))) as c:
        if card is None:
            return {"error": None, "card": None, "reach_only": True}
        sent = time.time()
        c.sendall(_card_line(card))
        got = _read_line(c, deadline)
        received = time.time()
    if got is None:
        return {"error": "no answer", "card": None}
    # rank 0's clock against the middle of the round trip here
    return {"error": None, "card": got,
            "offset_s": round(got.get("clock", sent) - (sent + received) / 2, 3)}


def connect(addr: str, ports: list[int], card: dict, timeout: float,
            reach_ports: list[int] = ()) -> dict:
    """Each port of PORTS (a card exchange) and REACH_PORTS (a TCP connect only) tried in
    turn, retried until it answers or the deadline: one port that nobody reaches does not
    starve the others."""
    deadline = time.monotonic() + timeout
    todo = [(p, None) for p in reach_ports] + [(p, card) for p in ports]
    attempts = {p: 0 for p, _ in todo}
    last = {p: "timeout" for p, _ in todo}
    done: dict[int, dict] = {}
    while len(done) < len(todo) and time.monotonic() < deadline:
        for port, what in todo:
            if port in done or time.monotonic() >= deadline:
                continue
            attempts[port] += 1
            try:
                got = _exchange(addr, port, what, deadline)
            except OSError as exc:
                last[port] = _error(exc)
                continue
            if got["error"] is None:
                done[port] = got
            else:
                last[port] = got["error"]
        if len(done) < len(todo):
            time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
    result: dict = {"ok": len(done) == len(todo), "ports": {}}
    for port, what in todo:
        entry = done.get(port) or {"error": last[port], "card": None}
        if what is None:
            entry["reach_only"] = True
        result["ports"][str(port)] = {**entry, "attempts": attempts[port]}
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("listen", "connect"):
        s = sub.add_parser(name)
        s.add_argument("--port", type=int, action="append", required=True)
        s.add_argument("--card", required=True, help="this node's card (JSON)")
        s.add_argument("--timeout", type=float, default=30.0)
        s.add_argument("--reach", type=int, action="append", default=[],
                       help="a port only reached (a TCP connect, no card)")
        s.add_argument("--out", help="write the result to this file (whole, by a rename) "
                                     "rather than to stdout")
        if name == "listen":
            s.add_argument("--bind", required=True)
            s.add_argument("--peers", type=int, required=True)
        else:
            s.add_argument("--addr", required=True)
    args = p.parse_args(argv)
    card = json.loads(args.card)
    out = listen(args.bind, args.port, args.peers, card, args.timeout, args.reach) \
        if args.cmd == "listen" \
        else connect(args.addr, args.port, card, args.timeout, args.reach)
    text = json.dumps(out, sort_keys=True) + "\n"
    if args.out:
        with open(args.out + ".tmp", "w") as f:
            f.write(text)
        os.replace(args.out + ".tmp", args.out)
    else:
        print(text, end="", flush=True)
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
