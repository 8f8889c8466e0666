"""The router in front of the fleet (SMG, `smg launch`): pure decisions.

The inventory group ``routers`` holds the hosts that run the router; every other host of the
inventory is a serving host (a worker of the router). This module decides, without touching
a host:

* what a worker's data becomes when a router fronts it (``routed_data``): the bind address
  and API key follow from the inventory, loopback is kept where no router is used;
* the router's addresses, its launch argv and its systemd unit (``templates/smg.service.j2``);
* how the router's ``GET /workers`` answer maps onto the inventory's hosts (``worker_states``);
* when a drained worker is out of routing and idle (``drain_step``), what the put back does
  while the router still holds it (``put_back_step``), and when the router routes to every
  worker again (``routing_missing``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sglang_deploy.core import lockfile
from sglang_deploy.core.data import KEYS, is_loopback
from sglang_deploy.core.errors import DataError
from sglang_deploy.core.unit import _compiled, spec_vars, systemd_quote

ROUTER_GROUP = "routers"
WILDCARD = ("0.0.0.0", "::")
TEMPLATE = Path(__file__).resolve().parent.parent.parent / "templates" / "smg.service.j2"
#: the header SMG sets on every proxied answer: the URL of the worker that served it
ROUTED_HEADER = "x-smg-routed-worker-id"


def worker_address(raw: dict[str, Any], name: str) -> str:
    """The address the router reaches a worker at: ``router_worker_address``, else the
    inventory's SSH address, else the host name."""
    return raw.get("router_worker_address") or raw.get("ssh_hostname") or name


def http_url(address: str, port: int) -> str:
    return f"http://[{address}]:{port}" if ":" in address else f"http://{address}:{port}"


def routed_data(raw: dict[str, Any], name: str, routed: bool) -> dict[str, Any]:
    """A host's data as the deploy uses it. A worker behind a router (ROUTED) binds the
    address the router reaches it at when its data says loopback, and uses the router's API
    key (SMG passes the client's key through to the worker); without a router, unchanged."""
    if not routed:
        return raw
    out = dict(raw)
    host = out.get("sglang_host", KEYS["sglang_host"].default)
    router_key = raw.get("router_api_key_env")
    own_key = raw.get("sglang_api_key_env")
    if isinstance(host, str) and is_loopback(host):
        out["sglang_host"] = worker_address(raw, name)
        if router_key is None and own_key is None and not raw.get("sglang_allow_public_without_key"):
            # said here: the data check would blame the loopback `sglang_host` the operator
            # wrote, and name `sglang_api_key_env`, which a worker takes from the router's
            raise DataError(
                key="router_api_key_env",
                what=f"[{name}] a key for the router and its workers: with a `routers` group "
                     f"every serving host is a worker and binds the address the router "
                     f"reaches it at ({out['sglang_host']}), which needs an API key",
                found="no `router_api_key_env` in the data",
                fix="set `router_api_key_env` for every host (group_data/all.py or "
                    "group_vars/all.yml, with the other router keys: docs/operations.md, "
                    "\"The router in front of the fleet\") to the name of a controller "
                    "environment variable holding the key")
    if own_key is None:
        out["sglang_api_key_env"] = router_key
    elif router_key is not None and own_key != router_key:
        raise DataError(key="sglang_api_key_env",
                        what="a worker behind the router uses the router's API key (the router "
                             "passes the client's key through to the worker)",
                        found=f"sglang_api_key_env={own_key!r} but router_api_key_env={router_key!r}",
                        fix="remove `sglang_api_key_env` from the serving hosts' data (it then "
                            "follows `router_api_key_env`) or set both to the same variable")
    return out


def router_address(router_host: str, raw: dict[str, Any], name: str) -> str:
    """Where clients (and the controller) reach the router: its bind address, or for a
    wildcard bind the host's inventory address."""
    if router_host in WILDCARD:
        return raw.get("ssh_hostname") or name
    return router_host


def lock_version(text: str, package: str = "smg") -> str | None:
    return lockfile.Lock.of(text).version(package)


# ------------------------------------------------------------------------------ unit

def launch_argv(*, python: str, launcher: str, host: str, port: int, policy: str,
                workers: list[str], prometheus_port: int,
                prometheus_host: str = "127.0.0.1") -> list[str]:
    """``smg launch`` through the key-reading launcher: every secret stays out of argv."""
    return [python, launcher, "launch", "--host", host, "--port", str(port),
            "--worker-urls", *workers, "--policy", policy, "--disable-tokenizer-autoload",
            "--prometheus-host", prometheus_host, "--prometheus-port", str(prometheus_port),
            "--health-check-interval-secs", "10", "--log-level", "info"]


@dataclass(frozen=True)
class RouterUnitSpec:
    release_id: str
    version: str
    user: str
    home: str
    secrets_file: str
    argv: tuple[str, ...]
    workers: tuple[str, ...]
    stop_timeout_s: int = 60


def render_unit(spec: RouterUnitSpec) -> str:
    return _compiled(TEMPLATE.read_text()).render(
        **spec_vars(spec), exec_start=" ".join(systemd_quote(a) for a in spec.argv))


# ------------------------------------------------------------------------------ workers

@dataclass(frozen=True)
class Worker:
    """One entry of the router's ``GET /workers``."""

    id: str
    url: str
    status: str
    load: int


def parse_workers(doc: dict[str, Any]) -> list[Worker]:
    out = []
    for w in (doc or {}).get("workers") or []:
        status = w.get("status") or ("ready" if w.get("is_healthy") else "not_ready")
        out.append(Worker(id=str(w.get("id")), url=str(w.get("url", "")).rstrip("/"),
                          status=str(status), load=int(w.get("load") or 0)))
    return out


def worker_states(expected: list[tuple[str, str]], listed: list[Worker],
                  others: dict[str, tuple[str, str]] | None = None) -> list[dict[str, Any]]:
    """``{"host", "url", "state"}`` per inventory worker (EXPECTED: host, url), state as the
    router reports it (ready, not_ready, draining...) or ``absent``; workers the router
    lists that are not workers of the inventory follow: with the inventory host and why it is
    not a worker (``"not_worker"``) where OTHERS (url -> (host, why)) knows the URL (a
    group's node of rank >= 1, which a deploy of the router then removes), else host
    ``null``."""
    by_url = {w.url: w for w in listed}
    rows: list[dict[str, Any]] = [
        {"host": h, "url": u, "state": by_url[u].status if u in by_url else "absent"}
        for h, u in expected]
    known = {u for _, u in expected}
    for w in listed:
        if w.url in known:
            continue
        host, why = (others or {}).get(w.url, (None, None))
        rows.append({"host": host, "url": w.url, "state": w.status,
                     **({"not_worker": why} if why else {})})
    return rows


def find_worker(listed: list[Worker], url: str) -> Worker | None:
    return next((w for w in listed if w.url == url.rstrip("/")), None)


# ------------------------------------------------------------------------------ drain
#
# What SMG does with a DELETEd worker (read in its source, smg-project/smg `drain_workers.rs`,
# and seen on the testbed with the pinned wheel, tests/fixtures/router/smg-1.13.0/drain.json):
# the worker turns `draining` at once (no policy selects it again: only `ready` is routable),
# its `load` (the router's requests in flight to it) falls as they finish, and the router
# forgets it (404 on its id) only after a FIXED sleep, `drain_settle_secs` (5 s by default,
# not exposed by `smg launch`), whatever is in flight. While it drains, a re-add is refused
# (409 WORKER_ALREADY_EXISTS) and a replace (PUT) turns it `ready` only until the pending
# removal takes it anyway (it removes by URL). So the drain ends when the router routes no
# new request to the worker and nothing is in flight; the put back waits for the forget.

#: worker states in which the router routes no new request to it and a removal is pending
OUT_OF_ROUTING = ("draining",)
#: ``rollout_drain_until``: ``idle`` ends the drain once out of routing and idle; ``removed``
#: also waits for the router to forget the worker (its fixed settle: the old behaviour)
DRAIN_UNTIL = ("idle", "removed")


@dataclass
class DrainWatch:
    """What a drain has seen of one worker so far."""

    url: str
    worker_id: str | None
    router_load: int | None = None      # the router's in-flight count while it listed the worker
    removed: bool = False                # the router has forgotten the worker (404 on its id)
    worker_reqs: int | None = None       # the server's own running + waiting requests
    router_state: str | None = None      # the router's state of the worker (draining, ready...)
    until: str = "idle"                  # DRAIN_UNTIL
    drained_s: float | None = None       # how long the wait took, once done

    def last(self) -> str:
        state = "removed" if self.removed else (self.router_state or "listed")
        return (f"router: {state}"
                + (f", router in-flight {self.router_load}"
                   if self.router_load is not None and not self.removed else "")
                + (f", server requests {self.worker_reqs}" if self.worker_reqs is not None
                   else ", server requests unknown (no /v1/loads)"))

    def observe(self, status: int | None, doc: dict[str, Any] | None) -> None:
        """The router's answer to ``GET /workers/{id}``: 404 is forgotten; 200 its state and
        its in-flight count. Anything else (the router busy, unreachable) changes nothing."""
        if status == 404:
            self.removed, self.router_state = True, "removed"
        elif status == 200 and isinstance(doc, dict):
            self.router_state = str(doc.get("status") or ("ready" if doc.get("is_healthy")
                                                         else "not_ready"))
            self.router_load = int(doc.get("load") or 0)


def out_of_routing(watch: DrainWatch) -> bool:
    """The router routes no new request to the worker: forgotten, or listed as draining."""
    return watch.removed or watch.router_state in OUT_OF_ROUTING


def idle(watch: DrainWatch) -> bool:
    """Nothing in flight: the router counts none to it (while it lists it) and the server
    runs and queues none (when the server cannot say: the router's last count is the word)."""
    router_idle = watch.removed or watch.router_load == 0
    server_idle = watch.worker_reqs == 0 or (watch.worker_reqs is None and not watch.router_load)
    return router_idle and server_idle


def drain_step(watch: DrainWatch, elapsed_s: float, timeout_s: float) -> str:
    """``done`` once the router routes no new request to the worker (``draining``, or
    forgotten) and nothing is in flight on it (``idle``); with ``until="removed"``, only once
    the router has also forgotten it. ``timeout`` past the deadline; else ``wait``."""
    if out_of_routing(watch) and idle(watch) and (watch.until != "removed" or watch.removed):
        return "done"
    if elapsed_s >= timeout_s:
        return "timeout"
    return "wait"


def put_back_step(status: str | None) -> str:
    """What the put back does with the router's current state of the worker (None: not
    listed): ``add`` (POST it), ``wait-removal`` (it is still draining: a re-add is refused
    and a replace would be undone by the pending removal, so wait until the router forgets
    it), ``wait-ready`` (added, not yet healthy), ``verify`` (ready: route a generation)."""
    if status is None:
        return "add"
    if status in OUT_OF_ROUTING:
        return "wait-removal"
    if status == "ready":
        return "verify"
    return "wait-ready"


def routing_missing(expected: list[str], seen: dict[str, int]) -> list[str]:
    """The worker URLs no routed answer has come from yet."""
    return [u.rstrip("/") for u in expected if not seen.get(u.rstrip("/"))]


def routed_url(headers: dict[str, Any]) -> str | None:
    """The worker URL of a proxied answer (SMG's ``x-smg-routed-worker-id``)."""
    return next((v.rstrip("/") for k, v in headers.items() if k.lower() == ROUTED_HEADER), None)
