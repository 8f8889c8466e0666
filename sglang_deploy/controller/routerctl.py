"""The controller's side of the router: its HTTP API (SMG), drain and put back.

Used by ``rollout`` (drain each host before its restart), ``status`` (the router object) and
``rebuild`` (put a rebuilt host back once verified). The router is reached at its address
(``router_host``; for a wildcard bind, the router host's inventory address) with the key of
``router_api_key_env``. Decisions come from ``core.router``; every wait has a deadline and
reports its last observation.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field

from sglang_deploy.controller import routing
from sglang_deploy.controller.inventory import parse_data
from sglang_deploy.core import router as routermod
from sglang_deploy.core.errors import RouterError


@dataclass
class Answer:
    status: int | None
    headers: dict
    text: str

    def json(self):
        try:
            return json.loads(self.text)
        except ValueError:
            return None


def http(method: str, url: str, key: str | None, body: dict | None = None,
         timeout: float = 10.0) -> Answer:
    payload = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=payload, method=method)
    if payload is not None:
        req.add_header("Content-Type", "application/json")
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return Answer(resp.status, dict(resp.headers), resp.read().decode("utf-8", "replace"))
    except urllib.error.HTTPError as exc:
        return Answer(exc.code, dict(exc.headers or {}), exc.read(4096).decode("utf-8", "replace"))
    except (OSError, ValueError) as exc:
        return Answer(None, {}, f"{type(exc).__name__}: {exc}")


@dataclass
class Router:
    """One router of the inventory, and the serving hosts it fronts."""

    host: str
    url: str
    key: str | None
    model: str
    workers: dict[str, str]          # host name -> worker URL
    drain_timeout_s: float
    verify_timeout_s: float
    poll_s: float = 0.2
    drain_until: str = "idle"        # ``rollout_drain_until`` (core.router.DRAIN_UNTIL)
    #: host -> (its URL, why) of the inventory's serving hosts that are not its workers (a
    #: group's node of rank >= 1: the router may still list it from before it joined)
    others: dict[str, tuple[str, str]] = field(default_factory=dict)

    def call(self, method: str, path: str, body: dict | None = None, timeout: float = 10.0) -> Answer:
        if routermod.is_loopback(self.url.split("//", 1)[1].rsplit(":", 1)[0].strip("[]")):
            raise RouterError(what=f"the router on {self.host} reachable from the controller",
                              found=f"it binds loopback ({self.url} would be this machine)",
                              fix="bind it to an address (`router_host`, with `router_api_key_env`)")
        return http(method, self.url + path, self.key, body, timeout)

    def listed(self) -> list[routermod.Worker]:
        """``GET /workers`` (raises RouterError when the router does not answer it)."""
        got = self.call("GET", "/workers")
        if got.status != 200 or not isinstance(got.json(), dict):
            raise RouterError(what=f"the router {self.url} (on {self.host}) to answer GET /workers",
                              found=f"{got.status}: {got.text[:300]}",
                              fix=f"check `systemctl status smg` on {self.host}, that the "
                                  "controller reaches router_host:router_port and that "
                                  "router_api_key_env names the router's key")
        return routermod.parse_workers(got.json())

    def states(self) -> list[dict]:
        return routermod.worker_states(list(self.workers.items()), self.listed(),
                                       {url: (h, why) for h, (url, why) in self.others.items()})

    def strays(self, names: list[str]) -> list[str]:
        """Those of NAMES that are no workers of this router but that it lists (it still
        routes to them, or drains them)."""
        mine = [n for n in names if n in self.others]
        if not mine:
            return []
        listed = self.listed()
        return [n for n in mine if routermod.find_worker(listed, self.others[n][0])]

    def drain(self, name: str, say=lambda text: None) -> routermod.DrainWatch:
        """Take NAME out of the router and wait until the router routes no new request to it
        and nothing is in flight on it (``core.router.drain_step``; raises RouterError with
        the last observation at the deadline). The router may still hold the worker in its
        settle when this returns: ``put_back`` waits for that."""
        url = self.workers[name] if name in self.workers else self.others[name][0]
        entry = routermod.find_worker(self.listed(), url)
        watch = routermod.DrainWatch(url=url, worker_id=entry.id if entry else None,
                                     until=self.drain_until)
        if entry is None:
            watch.removed, watch.router_state = True, "removed"
            say(f"    {name}: not in the router ({url}); waiting for its own requests only")
        elif entry.status in routermod.OUT_OF_ROUTING:
            # drained before and not yet forgotten (a rollout killed after its drain, run
            # again within the router's settle): its removal is pending, nothing to ask
            watch.router_load, watch.router_state = entry.load, entry.status
            say(f"    {name}: already {entry.status} in the router ({entry.load} in flight)")
        else:
            watch.router_load = entry.load
            got = self.call("DELETE", f"/workers/{entry.id}")
            if got.status not in (200, 202):
                raise RouterError(what=f"the router to start draining {name} ({url})",
                                  found=f"DELETE /workers/{entry.id}: {got.status} {got.text[:300]}",
                                  fix="check the router's journal (`journalctl -u smg`)")
            say(f"    {name}: draining in the router ({entry.load} in flight)")
        t0 = time.monotonic()
        while True:
            if not watch.removed:
                got = self.call("GET", f"/workers/{watch.worker_id}")
                watch.observe(got.status, got.json())
            # the server's count after the router's: once the router routes nothing to it,
            # a request the server does not count yet is one the router still counts
            watch.worker_reqs = self.server_requests(url)
            verdict = routermod.drain_step(watch, time.monotonic() - t0, self.drain_timeout_s)
            if verdict == "done":
                watch.drained_s = round(time.monotonic() - t0, 2)
                say(f"    {name}: drained in {watch.drained_s:.1f}s ({watch.last()})")
                return watch
            if verdict == "timeout":
                raise RouterError(
                    what=f"{name}'s requests in flight to finish within "
                         f"rollout_drain_timeout_s={self.drain_timeout_s:g}s",
                    found=f"last: {watch.last()}",
                    fix="raise `rollout_drain_timeout_s` above the longest request, or find "
                        "what keeps the server busy; the host was not restarted")
            time.sleep(self.poll_s)

    def server_requests(self, url: str) -> int | None:
        """The server's own running + waiting requests (SGLang ``/v1/loads``), None if it
        cannot say (no such route, not answering)."""
        got = http("GET", url + "/v1/loads?include=core", self.key, timeout=5.0)
        doc = got.json() if got.status == 200 else None
        if not isinstance(doc, dict):
            return None
        total = (doc.get("aggregate") or {}).get("total_reqs")
        if total is None:
            total = sum(int(x.get("num_running_reqs", 0)) + int(x.get("num_waiting_reqs", 0))
                        for x in doc.get("loads") or [])
        return int(total)

    def put_back(self, name: str, say=lambda text: None) -> PutBack:
        """Add NAME back and confirm the router routes a generation to it (raises RouterError
        at the deadline). While the router still holds the worker from its drain (SMG's fixed
        settle), it waits for the router to forget it first: a re-add is refused then, and a
        replace would be undone by the pending removal (``core.router.put_back_step``)."""
        url = self.workers[name]
        t0 = time.monotonic()
        deadline = t0 + self.verify_timeout_s
        done = PutBack()
        last = ""
        while time.monotonic() < deadline:
            entry = routermod.find_worker(self.listed(), url)
            step = routermod.put_back_step(entry.status if entry else None)
            if step != (done.steps[-1] if done.steps else None):
                done.steps.append(step)
            if step == "add":
                got = self.call("POST", "/workers", {"url": url, "api_key": self.key})
                last = f"POST /workers: {got.status} {got.text[:200]}"
                if got.status not in (200, 201, 202, 409):
                    raise RouterError(what=f"the router to take {name} ({url}) back",
                                      found=last, fix="check the router's journal (`journalctl -u smg`)")
                time.sleep(self.poll_s)
                continue
            if step == "wait-removal":
                if done.removal_wait_s is None:
                    say(f"    {name}: the router still holds it from the drain ({entry.status}); "
                        "waiting for it to forget it before adding it back")
                done.removal_wait_s = round(time.monotonic() - t0, 2)
                last = f"router lists it as {entry.status} (its removal is pending)"
                time.sleep(self.poll_s)
                continue
            if step == "wait-ready":
                last = f"router lists it as {entry.status}"
                time.sleep(self.poll_s)
                continue
            done.tries += 1
            got = self.call("POST", "/v1/completions",
                            {"model": self.model, "prompt": f"put back {name} {done.tries}",
                             "max_tokens": 1}, timeout=60.0)
            routed = routermod.routed_url(got.headers)
            last = f"generation {done.tries}: {got.status}, routed to {routed}"
            if got.status == 200 and routed == url:
                say(f"    {name}: back in the router, routed to it after {done.tries} "
                    f"generation(s) ({time.monotonic() - t0:.1f}s"
                    + (f", of which {done.removal_wait_s:.1f}s waiting for the router to "
                       "forget its drain" if done.removal_wait_s is not None else "") + ")")
                return done
            if done.tries >= 16 * max(1, len(self.workers)):
                break
        raise RouterError(what=f"the router to route a generation to {name} ({url}) again",
                          found=f"last: {last}",
                          fix=f"check `sglang-deploy status` and the router's journal; {name} "
                              "was verified before it was put back")


@dataclass
class PutBack:
    """What a put back went through: its steps in order (``core.router.put_back_step``),
    how long it waited for the router to forget the drained worker (None: it never had to),
    the generations it took to see one routed to the worker."""

    steps: list = field(default_factory=list)
    removal_wait_s: float | None = None
    tries: int = 0


def routers(inventory: str, cwd: str = ".", data: list[str] | None = None) -> list[Router]:
    """The routers of INVENTORY (none when it has no ``routers`` group)."""
    return routers_of(routing.fleet(inventory, cwd, data=parse_data(data or [])))


def routers_of(fl: routing.Fleet, settings: dict | None = None) -> list[Router]:
    """The routers of a fleet already read (``routing.fleet_of``: its Settings, each resolved
    once); SETTINGS: the hosts' Settings resolved elsewhere (host name -> Settings)."""
    out = []
    workers = {w: routing.worker_url(w, wraw) for w, wraw in routing.router_workers(fl)}
    others = {w: (routing.worker_url(w, wraw), routing.not_worker_why(wraw))
              for w, wraw in fl.workers if w not in workers}
    for name, raw in fl.routers:
        s = (settings or {}).get(name) or fl.settings(name)
        address = routermod.router_address(s.router_host, raw, name)
        out.append(Router(host=name, url=routermod.http_url(address, s.router_port),
                          key=s.router_key, model=s.served_model_name, workers=dict(workers),
                          drain_timeout_s=float(s.rollout_drain_timeout_s),
                          verify_timeout_s=float(s.router_verify_timeout_s),
                          drain_until=s.rollout_drain_until, others=others))
    return out

