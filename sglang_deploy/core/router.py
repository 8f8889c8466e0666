"""The router in front of the fleet (SMG, `smg launch`): pure decisions.

The inventory group ``routers`` holds the hosts that run the router; every other host of the
inventory is a serving host (a worker of the router). This module decides, without touching
a host:

* what a worker's data becomes when a router fronts it (``routed_data``): the bind address
  and API key follow from the inventory, loopback is kept where no router is used;
* the router's addresses, its launch argv and its systemd unit (``templates/smg.service.j2``);
* how the router's ``GET /workers`` answer maps onto the inventory's hosts (``worker_states``);
* when a drained worker is idle (``drain_step``) and when the router routes to every worker
  again (``routing_missing``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from sglang_deploy.core import lockfile
from sglang_deploy.core.data import KEYS, is_loopback
from sglang_deploy.core.errors import DataError
from sglang_deploy.core.unit import _compiled, spec_vars, systemd_quote

ROUTER_GROUP = "routers"
WILDCARD = ("0.0.0.0", "::")
TEMPLATE = Path(__file__).resolve().parent.parent.parent / "templates" / "smg.service.j2"
#: the header SMG sets on every proxied answer: the URL of the worker that served it
ROUTED_HEADER = "x-smg-routed-worker-id"


def worker_address(raw: dict, name: str) -> str:
    """The address the router reaches a worker at: ``router_worker_address``, else the
    inventory's SSH address, else the host name."""
    return raw.get("router_worker_address") or raw.get("ssh_hostname") or name


def http_url(address: str, port: int) -> str:
    return f"http://[{address}]:{port}" if ":" in address else f"http://{address}:{port}"


def routed_data(raw: dict, name: str, routed: bool) -> dict:
    """A host's data as the deploy uses it. A worker behind a router (ROUTED) binds the
    address the router reaches it at when its data says loopback, and uses the router's API
    key (SMG passes the client's key through to the worker); without a router, unchanged."""
    if not routed:
        return raw
    out = dict(raw)
    host = out.get("sglang_host", KEYS["sglang_host"].default)
    if isinstance(host, str) and is_loopback(host):
        out["sglang_host"] = worker_address(raw, name)
    router_key = raw.get("router_api_key_env")
    own_key = raw.get("sglang_api_key_env")
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


def router_address(router_host: str, raw: dict, name: str) -> str:
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


def parse_workers(doc: dict) -> list[Worker]:
    out = []
    for w in (doc or {}).get("workers") or []:
        status = w.get("status") or ("ready" if w.get("is_healthy") else "not_ready")
        out.append(Worker(id=str(w.get("id")), url=str(w.get("url", "")).rstrip("/"),
                          status=str(status), load=int(w.get("load") or 0)))
    return out


def worker_states(expected: list[tuple[str, str]], listed: list[Worker]) -> list[dict]:
    """``{"host", "url", "state"}`` per inventory worker (EXPECTED: host, url), state as the
    router reports it (ready, not_ready, draining...) or ``absent``; workers the router
    lists that are not in the inventory follow with host ``null``."""
    by_url = {w.url: w for w in listed}
    rows = [{"host": h, "url": u, "state": by_url[u].status if u in by_url else "absent"}
            for h, u in expected]
    known = {u for _, u in expected}
    rows += [{"host": None, "url": w.url, "state": w.status} for w in listed if w.url not in known]
    return rows


def find_worker(listed: list[Worker], url: str) -> Worker | None:
    return next((w for w in listed if w.url == url.rstrip("/")), None)


# ------------------------------------------------------------------------------ drain

@dataclass
class DrainWatch:
    """What a drain has seen of one worker so far."""

    url: str
    worker_id: str | None
    router_load: int | None = None      # the router's in-flight count while it listed the worker
    removed: bool = False                # the router has forgotten the worker (404 on its id)
    worker_reqs: int | None = None       # the server's own running + waiting requests
    history: list[str] = field(default_factory=list)

    def last(self) -> str:
        return (f"router: {'removed' if self.removed else 'draining'}"
                + (f", router in-flight {self.router_load}" if self.router_load is not None else "")
                + (f", server requests {self.worker_reqs}" if self.worker_reqs is not None
                   else ", server requests unknown (no /v1/loads)"))


def drain_step(watch: DrainWatch, elapsed_s: float, timeout_s: float) -> str:
    """``done`` when the router has forgotten the worker (so a re-add cannot race its drain)
    and the server itself runs no request (or, when the server cannot say, the router saw
    none in flight); ``timeout`` past the deadline; else ``wait``."""
    idle = watch.worker_reqs == 0 or (watch.worker_reqs is None and not watch.router_load)
    if watch.removed and idle:
        return "done"
    if elapsed_s >= timeout_s:
        return "timeout"
    return "wait"


def routing_missing(expected: list[str], seen: dict[str, int]) -> list[str]:
    """The worker URLs no routed answer has come from yet."""
    return [u.rstrip("/") for u in expected if not seen.get(u.rstrip("/"))]


def routed_url(headers: dict) -> str | None:
    """The worker URL of a proxied answer (SMG's ``x-smg-routed-worker-id``)."""
    return next((v.rstrip("/") for k, v in headers.items() if k.lower() == ROUTED_HEADER), None)
