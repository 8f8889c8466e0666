"""What Prometheus scrapes of a fleet: file_sd target groups (pure).

``sglang-deploy metrics-targets`` (``commands/metricstargets.py``) builds one ``Host`` per
inventory host from its data and the release its host-state read found, and ``target_groups``
turns them into Prometheus's file_sd JSON (the same list-of-groups document http_sd serves):
one group per target, each labelled

* ``component``: ``server`` (SGLang's ``/metrics``, on the API's own address and port),
  ``router`` (SMG's ``--prometheus-host``/``--prometheus-port``) or ``watchdog``
  (``watchdog_metrics_port``, at the server's address);
* ``host`` (the inventory name), ``group`` (``sglang_group``; a single host is its own
  group), ``release`` (the release id ``current`` points to on the host; ``unknown`` when it
  could not be read), ``model`` (the served model name);
* ``worker`` on a server the router lists (its URL as the router knows it, the
  ``worker`` label of SMG's ``smg_worker_health``: the alert rules join on it);
* ``node_rank`` on a node of a multi-node group.

A target bound to loopback is reachable only from its own host, as the API is: it is left out
(``LeftOut``, with the fix) unless INCLUDE_LOOPBACK (a Prometheus on that host). A server whose
flags turn ``/metrics`` off (``enable-metrics: false``) is left out too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sglang_deploy.core.data import is_loopback

WILDCARD = ("0.0.0.0", "::", "")
UNKNOWN = "unknown"


@dataclass(frozen=True)
class Host:
    """One inventory host, as its data and its host-state read describe it."""

    name: str
    router: bool                  # in the inventory group `routers`
    bind: str                     # the address the server (or the router's metrics) binds
    port: int                     # the server's port, or the router's prometheus port
    ssh_address: str              # where the host is reached (ssh_hostname, else its name)
    release: str | None           # the release id of `current`; None: not read
    model: str | None = None
    group: str | None = None      # sglang_group
    node_rank: int | None = None
    worker_url: str | None = None  # the URL the router lists it at (routed fleets)
    metrics_on: bool = True
    watchdog_port: int | None = None


@dataclass(frozen=True)
class LeftOut:
    host: str
    component: str
    why: str
    fix: str


def scrape_address(bind: str, ssh_address: str) -> str | None:
    """Where Prometheus reaches a listener bound to BIND: a wildcard bind at the host's own
    address, loopback not at all (None)."""
    if bind in WILDCARD:
        return ssh_address
    if is_loopback(bind):
        return None
    return bind


def _hostport(address: str, port: int) -> str:
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def _labels(h: Host, component: str) -> dict[str, str]:
    out = {"component": component, "host": h.name, "release": h.release or UNKNOWN}
    if not h.router:
        out["group"] = h.group or h.name
        if h.model:
            out["model"] = h.model
        if h.group is not None and h.node_rank is not None:
            out["node_rank"] = str(h.node_rank)
    return out


def target_groups(hosts: list[Host], include_loopback: bool = False,
                  ) -> tuple[list[dict[str, Any]], list[LeftOut]]:
    """(file_sd target groups, the targets left out and why) of HOSTS, in their order."""
    groups: list[dict[str, Any]] = []
    left: list[LeftOut] = []
    for h in hosts:
        component = "router" if h.router else "server"
        address = scrape_address(h.bind, h.ssh_address)
        if address is None and include_loopback:
            address = "127.0.0.1"
        if address is None:
            key = "router_prometheus_host" if h.router else "sglang_host"
            left.append(LeftOut(h.name, component, f"its metrics bind {h.bind} (loopback)",
                                f"set `{key}` to an address Prometheus reaches, or run "
                                f"Prometheus on {h.name} with --include-loopback"))
            continue
        if not h.metrics_on:
            left.append(LeftOut(h.name, component, "its flags turn /metrics off "
                                "(`enable-metrics: false` in sglang_flags)",
                                "remove `enable-metrics` from sglang_flags (on by default)"))
        else:
            labels = _labels(h, component)
            if h.worker_url and not h.router:
                labels["worker"] = h.worker_url
            groups.append({"targets": [_hostport(address, h.port)], "labels": labels})
        if h.watchdog_port and not h.router:
            groups.append({"targets": [_hostport(address, h.watchdog_port)],
                           "labels": _labels(h, "watchdog")})
    return groups, left


def release_command(root: str) -> str:
    """The host-state read of one host for its labels: the release `current` points to."""
    from shlex import quote

    return f"readlink -- {quote(root.rstrip('/') + '/current')} || true"


def release_of(output: str) -> str | None:
    """The release id out of ``release_command``'s OUTPUT (None: no `current` link)."""
    link = output.strip().rstrip("/")
    return link.rsplit("/", 1)[-1] or None if link else None
