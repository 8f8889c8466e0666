"""Multi-node groups (pure): hosts that serve one model together.

A host joins a group with one data key, ``sglang_group``. Every node of a group runs the same
launch flags plus ``--nnodes N --node-rank R --dist-init-addr ADDR:PORT``; only rank 0 serves
HTTP. ``plan`` reads an inventory's serving hosts (name, merged data), in inventory order, and
returns each group with its nodes in rank order, or raises ``DataError`` before any
connection when the group cannot work: ranks that are not 0..N-1, no IPv4 rank-0 address,
nodes that differ in what must be equal (lock, flags, model, GPU count, ...), or a
``tp-size`` (x ``pp-size``) that is not nodes x GPUs per node. ``group_flags`` and
``group_environment`` are what a node's unit gets on top of its own data.

While a run executes, the group's nodes share results only: ``Results``, append-only (each
node appends its own observations: its rendezvous result, its verification), and every verdict
is judged from them by the node that asks, with the pure judges here (``rendezvous_verdict``,
``peer_failed``, ``verdict``): none is kept, so every node gives the same one.
"""

from __future__ import annotations

import copy
import ipaddress
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sglang_deploy.core.errors import DataError, UsageError, VerifyError

#: flags the tool renders for a group's node: never written in ``sglang_flags``
RESERVED_FLAGS = ("nnodes", "node-rank", "dist-init-addr")
#: launch flags that differ between a group's nodes by design
PER_NODE_FLAGS = ("node-rank", "host")
#: data every node of a group must share (compared before connecting)
SAME = ("sglang_lock", "sglang_flags", "sglang_model_path", "sglang_served_model_name",
        "gpu_expected_count", "gpu_expected_model", "sglang_dist_init_port",
        "sglang_autotune_patch", "sglang_launch_command", "sglang_port",
        # the nodes all-reduce together: all or none, the same tensor, the same deadline
        "gpu_allreduce_check", "gpu_allreduce_mib", "gpu_allreduce_timeout_s")


@dataclass(frozen=True)
class Node:
    name: str
    rank: int


@dataclass(frozen=True)
class Group:
    name: str
    nodes: tuple[Node, ...]   # in rank order: nodes[0] is rank 0
    addr: str                 # rank 0's IPv4 address the other nodes reach
    port: int

    @property
    def nnodes(self) -> int:
        return len(self.nodes)

    @property
    def rank0(self) -> str:
        return self.nodes[0].name

    @property
    def dist_init_addr(self) -> str:
        return f"{self.addr}:{self.port}"

    def rank_of(self, host: str) -> int:
        return next(n.rank for n in self.nodes if n.name == host)

    def members(self) -> list[str]:
        return [n.name for n in self.nodes]


def _key(raw: Mapping[str, Any], name: str, default: Any = None) -> Any:
    from sglang_deploy.core.data import KEYS

    return raw.get(name, KEYS[name].default if name in KEYS else default)


def reserved_flags(flags: Mapping[str, Any]) -> list[str]:
    """The group flags a user wrote in ``sglang_flags`` (by their canonical names)."""
    return [f for f in flags if f.lstrip("-").replace("_", "-") in RESERVED_FLAGS]


def check_no_reserved(host: str, raw: Mapping[str, Any]) -> None:
    """``--nnodes``, ``--node-rank`` and ``--dist-init-addr`` are the tool's to render."""
    bad = reserved_flags(_key(raw, "sglang_flags") or {})
    if bad:
        raise DataError(
            key="sglang_flags", what="no --nnodes, --node-rank or --dist-init-addr in "
            f"`sglang_flags` (host {host}): the tool renders them for a group's nodes",
            found=", ".join(f"`{b}`" for b in bad),
            fix="remove them and put the hosts in one group: `sglang_group = \"NAME\"` on each "
                "(ranks follow inventory order, or `sglang_node_rank`; rank 0's address is its "
                "`ssh_hostname` or `sglang_dist_init_addr`)")


def _ipv4(text: str | None) -> str | None:
    try:
        return str(ipaddress.IPv4Address(text)) if text else None
    except ValueError:
        return None


def _parallel(flags: Mapping[str, Any], *names: str) -> int:
    for name in names:
        for key in (name, f"--{name}", name.replace("-", "_")):
            if key in flags and flags[key] not in (None, False):
                return int(flags[key])
    return 1


def plan(hosts: Sequence[tuple[str, Mapping[str, Any]]]) -> dict[str, Group]:
    """The groups of HOSTS ((name, merged data) of the serving hosts, inventory order)."""
    by_group: dict[str, list[tuple[str, Mapping[str, Any]]]] = {}
    for name, raw in hosts:
        check_no_reserved(name, raw)
        g = raw.get("sglang_group")
        if g:
            by_group.setdefault(str(g), []).append((name, raw))
    return {g: _one(g, members) for g, members in by_group.items()}


def _ranks(gname: str, members: list[tuple[str, Mapping[str, Any]]]) -> list[tuple[int, str]]:
    """(rank, node) of a group's MEMBERS, rank order: `sglang_node_rank` set on every node
    (0..N-1, each once) or on none (inventory order)."""
    given = {name: raw.get("sglang_node_rank") for name, raw in members}
    unset = [n for n, r in given.items() if r is None]
    if unset and len(unset) != len(members):
        set_on = ", ".join(f"{n}={r}" for n, r in given.items() if r is not None)
        raise DataError(key="sglang_node_rank",
                        what=f"`sglang_node_rank` on every node of group `{gname}` or on none",
                        found=f"set on {set_on}; not on {', '.join(unset)}",
                        fix=f"set it on {', '.join(unset)} too, or remove it from every node "
                            "(then the ranks follow inventory order)")
    ranks = sorted((i if r is None else int(r), n) for i, (n, r) in enumerate(given.items()))
    if [r for r, _ in ranks] != list(range(len(members))):
        raise DataError(key="sglang_node_rank",
                        what=f"the ranks of group `{gname}` to be 0..{len(members) - 1}, each once",
                        found=", ".join(f"{n}={r}" for r, n in ranks),
                        fix="give each node of the group its own `sglang_node_rank`, 0 to "
                            f"{len(members) - 1}, or remove it from every node (then the ranks "
                            "follow inventory order)")
    return ranks


def _one(gname: str, members: list[tuple[str, Mapping[str, Any]]]) -> Group:
    names = [n for n, _ in members]
    if len(members) < 2:
        raise DataError(key="sglang_group", what=f"at least two hosts in group `{gname}`",
                        found=f"only {names[0]}",
                        fix="add the other nodes to the group, or remove `sglang_group` from "
                            "a host that serves alone")
    ranks = _ranks(gname, members)
    data = dict(members)
    first = ranks[0][1]
    for key in SAME:
        want = _key(data[first], key)
        for _, other in ranks[1:]:
            found = _key(data[other], key)
            if found != want:
                raise DataError(
                    key=key, what=f"the same `{key}` on every node of group `{gname}`",
                    found=f"{first}: {want!r}; {other}: {found!r}",
                    fix=f"set `{key}` once for the group (group_data/ or the group's inventory "
                        "data), not per host")
    flags = _key(data[first], "sglang_flags") or {}
    gpus = int(_key(data[first], "gpu_expected_count"))
    tp, pp = _parallel(flags, "tp-size", "tp"), _parallel(flags, "pp-size", "pp")
    if tp * pp != len(members) * gpus:
        raise DataError(
            key="sglang_flags",
            what=f"tp-size{' x pp-size' if pp > 1 else ''} of group `{gname}` to equal its "
                 f"nodes x GPUs per node ({len(members)} x {gpus} = {len(members) * gpus})",
            found=f"tp-size {tp}" + (f" x pp-size {pp} = {tp * pp}" if pp > 1 else ""),
            fix=f"set `tp-size` to {len(members) * gpus // pp} in the group's `sglang_flags` "
                "(or change the group's nodes or `gpu_expected_count`)")
    addr_raw = data[first].get("sglang_dist_init_addr") or data[first].get("ssh_hostname") \
        or first
    addr = _ipv4(str(addr_raw))
    if addr is None:
        raise DataError(
            key="sglang_dist_init_addr",
            what=f"an IPv4 address of group `{gname}`'s rank 0 ({first}) that the other nodes "
                 "reach (IPv6 and names hang until the distributed timeout: sglang#7478)",
            found=repr(addr_raw),
            fix=f"set `sglang_dist_init_addr = \"A.B.C.D\"` on {first} (or its `ssh_hostname` "
                "to its IPv4 address)")
    return Group(gname, tuple(Node(n, r) for r, n in ranks), addr,
                 int(_key(data[first], "sglang_dist_init_port")))


def group_flags(group: Group, host: str) -> dict[str, Any]:
    """The flags a node of GROUP gets on top of the group's ``sglang_flags``."""
    return {"nnodes": group.nnodes, "node-rank": group.rank_of(host),
            "dist-init-addr": group.dist_init_addr}


def group_environment(ifname: str | None) -> dict[str, str]:
    """NCCL's and gloo's interface for the group's traffic (none: their own choice)."""
    return {"NCCL_SOCKET_IFNAME": ifname, "GLOO_SOCKET_IFNAME": ifname} if ifname else {}


def group_of(groups: Mapping[str, Group], host: str) -> Group | None:
    return next((g for g in groups.values() if host in g.members()), None)


def units(groups: Mapping[str, Group]) -> dict[str, list[str]]:
    """Each node of GROUPS -> its group's nodes in rank order: the unit a rollout and a
    rebuild act on."""
    return {h: g.members() for g in groups.values() for h in g.members()}


def check_limit(groups: Mapping[str, Group], selected: Iterable[str],
                allow_partial: bool = False) -> None:
    """A selection (``--limit``) that names part of a group is refused unless ALLOW_PARTIAL:
    a node restarted alone leaves the others waiting for it."""
    chosen = set(selected)
    for g in groups.values():
        inside = [n for n in g.members() if n in chosen]
        if inside and len(inside) != g.nnodes and not allow_partial:
            missing = [n for n in g.members() if n not in chosen]
            raise UsageError(
                what=f"every node of group `{g.name}` or none of them ({', '.join(g.members())})",
                found=f"the selection names {', '.join(inside)} but not {', '.join(missing)}",
                fix=f"add `--limit {' --limit '.join(missing)}`, or name the whole group: "
                    f"`--limit {g.name}`; to act on part of the group on purpose, say so: "
                    "add `--data '_sglang_deploy_run={\"partial_group\": true}'` (the run "
                    "spec, core/runspec.py)")


# ------------------------------------------------------------------ the group pre-flight
#: how long the rendezvous waits for every node (seconds): the nodes start it together
RENDEZVOUS_TIMEOUT_S = 30.0
#: the largest clock difference between two nodes the group pre-flight accepts (seconds):
#: logs compared across nodes, TLS and token lifetimes need clocks that agree
CLOCK_SKEW_MAX_S = 5.0
#: NCCL's bootstrap root listens on a port of rank 0's ephemeral range (Linux's default)
EPHEMERAL = (32768, 60999)


def probe_port(group: Group, seed: int) -> int:
    """A port of the ephemeral range, not the dist-init port, chosen once per run (SEED): the
    rendezvous proves that the other nodes reach rank 0 there, as NCCL's bootstrap must."""
    lo, hi = EPHEMERAL
    port = lo + (seed % (hi - lo))
    return port + 1 if port == group.port else port


def card(node: str, rank: int, release: str, flags: Mapping[str, Any], driver: str | None
         ) -> dict[str, Any]:
    """What a node tells the others in the rendezvous: its release, its flags' hash (without
    the per-node ones: ``PER_NODE_FLAGS``) and its driver version (``clock``: by the tool)."""
    import hashlib
    import json

    same = {k: v for k, v in flags.items()
            if k.lstrip("-").replace("_", "-") not in PER_NODE_FLAGS}
    digest = hashlib.sha256(json.dumps(same, sort_keys=True, default=str).encode()).hexdigest()
    return {"node": node, "rank": rank, "release": release, "flags": digest[:16],
            "driver": driver}


def rendezvous_argv(group: Group, host: str, tool: str, card_: Mapping[str, Any],
                    probe: int, python: str = "python3",
                    timeout_s: float = RENDEZVOUS_TIMEOUT_S) -> list[str]:
    """The rendezvous command of HOST: rank 0 listens on its address, the others connect.
    Cards are exchanged on the PROBE port; the dist-init port is only reached (a TCP connect:
    rank 0's running server may hold it, and torch's store must not be written to)."""
    import json

    words = [python, tool]
    if group.rank_of(host) == 0:
        words += ["listen", "--bind", group.addr, "--peers", str(group.nnodes - 1)]
    else:
        words += ["connect", "--addr", group.addr]
    words += ["--reach", str(group.port), "--port", str(probe)]
    return words + ["--card", json.dumps(dict(card_), sort_keys=True), "--timeout", f"{timeout_s:g}"]


@dataclass(frozen=True)
class Problem:
    """One failure of the group pre-flight: between which nodes, what, and the fix."""

    nodes: tuple[str, ...]
    message: str
    fix: str

    def text(self) -> str:
        return f"{' <-> '.join(self.nodes)}: {self.message}"


def _port_fix(group: Group, port: int, kind: str) -> str:
    return (f"open TCP {port} on {group.rank0} ({group.addr}) to the group's nodes ({kind}): "
            "nftables/ufw/iptables on rank 0 and any firewall between the hosts; check "
            "`sglang_dist_init_addr` is rank 0's address on the network the nodes share")


def judge_rendezvous(group: Group, results: Mapping[str, Mapping[str, Any] | None],
                     cards: Mapping[str, Mapping[str, Any]], rank0_running: bool = False,
                     clock_skew_max_s: float = CLOCK_SKEW_MAX_S) -> list[Problem]:
    """Pure: the group pre-flight's verdict. RESULTS: node -> the rendezvous tool's JSON (None
    when the node gave none); CARDS: node -> its card (``card``). Every node must share rank
    0's release, flags and driver, have reached rank 0 on every port, and keep its clock
    within CLOCK_SKEW_MAX_S of rank 0's. RANK0_RUNNING: rank 0's unit runs (or is starting),
    so its dist-init port in use is its own server's. Returns the problems, each naming its
    nodes and fix."""
    problems: list[Problem] = []
    r0 = group.rank0
    want = cards.get(r0) or {}
    for node in group.members()[1:]:
        c = cards.get(node) or {}
        for key, label, fix in (
                ("release", "releases", "deploy the same `sglang_lock` to every node (one deploy "
                                        "of all the group's nodes converges them)"),
                ("flags", "launch flags", "set `sglang_flags` once for the group"),
                ("driver", "NVIDIA driver versions",
                 "install the same driver on every node's host: NCCL across nodes needs the same "
                 "CUDA/NCCL stack")):
            if c.get(key) != want.get(key):
                problems.append(Problem((node, r0), f"{label} differ: {node} has {c.get(key)!r}, "
                                                    f"{r0} has {want.get(key)!r}", fix))
    mine = results.get(r0)
    if mine is None:
        problems.append(Problem((r0,), "rank 0's rendezvous gave no result",
                                f"read {r0}'s error above"))
    else:
        for port, entry in sorted((mine.get("ports") or {}).items()):
            error = entry.get("error")
            if error in (None, "timeout") or (error == "in use" and int(port) == group.port
                                              and rank0_running):
                continue  # the dist-init port held by rank 0's own server: the others reach it
            problems.append(Problem(
                (r0,), f"rank 0 cannot listen on {group.addr}:{port}: {error}",
                f"free TCP {port} on {r0} (`ss -ltnp 'sport = :{port}'`) or set "
                f"`sglang_dist_init_port`; if {group.addr} is not {r0}'s address, fix "
                "`sglang_dist_init_addr`"))
    for node in group.members()[1:]:
        out = results.get(node)
        if out is None:
            problems.append(Problem((node, r0), "the node gave no rendezvous result",
                                    f"read {node}'s error above"))
            continue
        for port, entry in sorted((out.get("ports") or {}).items(), key=lambda kv: int(kv[0])):
            kind = ("torch's rendezvous store, --dist-init-addr" if int(port) == group.port
                    else "NCCL's bootstrap port range, the kernel's ephemeral ports")
            if entry.get("error"):
                problems.append(Problem(
                    (node, r0), f"{node} cannot reach {group.addr}:{port} ({kind}): "
                                f"{entry['error']} after {entry.get('attempts', '?')} attempt(s)",
                    _port_fix(group, int(port), kind)))
                continue
            off = entry.get("offset_s")
            if off is not None and abs(off) > clock_skew_max_s:
                problems.append(Problem(
                    (node, r0), f"clocks differ by {abs(off):.1f}s (bound {clock_skew_max_s:g}s)",
                    "run NTP (chrony or systemd-timesyncd) on every node of the group"))
    return problems


# ------------------------------------------------------------------ the group's results
#: what a node observes of itself while its group's run executes (``Observation.kind``)
RENDEZVOUS, VERIFIED, FAILED = "rendezvous", "verified", "failed"
#: the kinds that share one slot per node: a node is verified or failed, once
_SLOT = {RENDEZVOUS: RENDEZVOUS, VERIFIED: "verification", FAILED: "verification"}


@dataclass(frozen=True)
class Observation:
    """One node's own observation: its rendezvous result (VALUE: the tool's JSON, None when it
    gave none), its verification (VALUE: its summary) or its failure (VALUE: its error)."""

    node: str
    kind: str
    value: Any = None


class Results:
    """What a group's nodes observe while one run executes, append-only: each node appends its
    own observations, one per slot (its rendezvous result; its verification, passed or
    failed); nothing is replaced or removed. Every verdict is judged from ``log()`` by the
    node that asks (``rendezvous_verdict``, ``peer_failed``, ``verdict``)."""

    def __init__(self) -> None:
        self._log: list[Observation] = []

    def append(self, node: str, kind: str, value: Any = None) -> Observation:
        """NODE's own observation of KIND; a second one in the same slot is a bug (raises)."""
        if kind not in _SLOT:
            raise ValueError(f"an observation of a group's node is one of {sorted(_SLOT)}, "
                             f"not {kind!r}")
        taken = [o for o in self._log if o.node == node and _SLOT[o.kind] == _SLOT[kind]]
        if taken:
            raise ValueError(f"node {node} already observed its {_SLOT[kind]} "
                             f"({taken[0].kind}) in this run: results are append-only")
        obs = Observation(node, kind, value)
        self._log.append(obs)
        return obs

    def log(self) -> tuple[Observation, ...]:
        """Every observation so far, in the order they were appended."""
        return tuple(self._log)


def rendezvous_verdict(group: Group, log: Sequence[Observation],
                       cards: Mapping[str, Mapping[str, Any]], rank0_running: bool = False
                       ) -> list[Problem]:
    """Pure: the group pre-flight's verdict from the nodes' rendezvous results in LOG (a node
    with none: None) and CARDS (``judge_rendezvous``): every node judges it for itself, from
    the same results, so every node gives the same verdict."""
    results = {o.node: o.value for o in log if o.kind == RENDEZVOUS}
    return judge_rendezvous(group, results, cards, rank0_running=rank0_running)


def _why(error: BaseException) -> str:
    text = getattr(error, "found", None) or getattr(error, "what", None) or str(error)
    return str(text).splitlines()[0] if str(text).strip() else type(error).__name__


def first_failure(log: Sequence[Observation]) -> tuple[str, str] | None:
    """(node, why) of the first node whose verification failed in LOG (its error's first
    line of what was found), None when none failed: the group's cause."""
    return next(((o.node, _why(o.value)) for o in log if o.kind == FAILED), None)


def peer_failed(group: Group, log: Sequence[Observation], node: str) -> VerifyError | None:
    """Pure: the error NODE stops with because another node of GROUP failed first (None: no
    node failed, or NODE itself is the cause and reports its own error)."""
    failed = first_failure(log)
    if failed is None or failed[0] == node:
        return None
    return VerifyError(
        what=f"every node of group {group.name} starts ({', '.join(group.members())})",
        found=f"node {failed[0]} failed: {failed[1]}; {node} was stopped with the "
              "group, not left waiting for the distributed timeout",
        fix=f"read {failed[0]}'s error (above, or `sglang-deploy logs INVENTORY {failed[0]}`"
            " and `sglang-deploy explain-log`); fix it and re-run the deploy: the group "
            "starts again as one")


@dataclass(frozen=True)
class Verdict:
    """A node's verdict on its group once every node was verified: READY with this node's
    SUMMARY (its record is kept), else the ERROR it stops and fails with."""

    ready: bool
    summary: Mapping[str, Any] | None = None
    error: Exception | None = None


def verdict(group: Group, log: Sequence[Observation], node: str) -> Verdict:
    """Pure: NODE's verdict on GROUP from every node's verification in LOG, judged by each
    node for itself (the same on every node): ready when every node was verified and none
    failed; else the node that failed first fails with its own error, every other node with
    that node's name and cause, and when none failed, every node names those that gave no
    verdict (dropped from the run earlier)."""
    verified = {o.node: o.value for o in log if o.kind == VERIFIED}
    failed = first_failure(log)
    if failed is None and all(n in verified for n in group.members()):
        return Verdict(True, summary=verified[node])
    others = [n for n in group.members() if n != node]
    own = next((o.value for o in log if o.kind == FAILED and o.node == node), None)
    if own is not None and failed is not None and failed[0] == node:
        error = copy.copy(own)  # the node's own error, the observation left as it was
        error.fix = (getattr(own, "fix", None) or "") + (
            f"\n{node} was stopped, and with it the group's other node(s) {', '.join(others)}")
        return Verdict(False, error=error)
    abort = peer_failed(group, log, node)
    if abort is not None:
        return Verdict(False, error=abort)
    missing = [n for n in group.members() if n not in verified]
    return Verdict(False, error=VerifyError(
        what=f"every node of group {group.name} verified in this run "
             f"({', '.join(group.members())})",
        found=f"node(s) {', '.join(missing)} gave no verdict (dropped from the run earlier); "
              f"{node} was stopped with the group",
        fix="read the errors above; fix them and re-run the deploy: the group starts again "
            "as one"))
