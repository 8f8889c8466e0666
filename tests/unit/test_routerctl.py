"""Drain and put back against a scripted router API (controller/routerctl.py, HTTP replaced)."""

import json

import pytest

from sglang_deploy.controller import routerctl
from sglang_deploy.core.errors import RouterError

W1, W2 = "http://10.0.0.1:30000", "http://10.0.0.2:30000"


class FakeSMG:
    """Just enough of SMG's worker API, as the real one answers (tests/fixtures/router/
    smg-1.13.0/drain.json): DELETE turns the worker `draining` at once, its load falls as
    ROUTER_LOADS says (one value per poll), and the router forgets it only after SETTLE
    reads (its fixed settle); a re-add while it drains is refused (409)."""

    def __init__(self, settle=2, server_reqs=(0,), routed=(W2, W1), router_loads=(0,)):
        self.workers = {"a": {"id": "a", "url": W1, "status": "ready", "load": 1},
                        "b": {"id": "b", "url": W2, "status": "ready", "load": 0}}
        self.settle, self.server_reqs, self.routed = settle, list(server_reqs), list(routed)
        self.router_loads = list(router_loads)
        self.calls = []

    def _settling(self, wid):
        """One read of a draining worker: the settle runs down; at its end it is gone."""
        w = self.workers[wid]
        self.settle -= 1
        if self.settle < 0:
            del self.workers[wid]
            return None
        w["load"] = self.router_loads.pop(0) if len(self.router_loads) > 1 else self.router_loads[0]
        return w

    def __call__(self, method, url, key, body=None, timeout=10.0):
        path = url.split("30000", 1)[1] if url.startswith("http://10.0.0.9") else url
        self.calls.append((method, path))
        if url.startswith(W1) and path.endswith("/v1/loads?include=core"):
            n = self.server_reqs.pop(0) if len(self.server_reqs) > 1 else self.server_reqs[0]
            return routerctl.Answer(200, {}, json.dumps({"aggregate": {"total_reqs": n}}))
        if method == "GET" and path == "/workers":
            for wid in [k for k, w in self.workers.items() if w["status"] == "draining"]:
                self._settling(wid)
            return routerctl.Answer(200, {}, json.dumps({"workers": list(self.workers.values())}))
        if path.startswith("/workers/"):
            wid = path.rsplit("/", 1)[1]
            w = self.workers.get(wid)
            if method == "DELETE":
                w["status"] = "draining"
                return routerctl.Answer(202, {}, "{}")
            if w is not None and w["status"] == "draining":
                w = self._settling(wid)
            if w is None:
                return routerctl.Answer(404, {}, "{}")
            return routerctl.Answer(200, {}, json.dumps(w))
        if method == "POST" and path == "/workers":
            if any(w["url"] == body["url"] for w in self.workers.values()):
                return routerctl.Answer(409, {}, '{"code": "WORKER_ALREADY_EXISTS"}')
            self.workers["c"] = {"id": "c", "url": body["url"], "status": "ready", "load": 0}
            return routerctl.Answer(202, {}, "{}")
        if method == "POST" and path == "/v1/completions":
            to = self.routed.pop(0) if len(self.routed) > 1 else self.routed[0]
            return routerctl.Answer(200, {"x-smg-routed-worker-id": to}, "{}")
        return routerctl.Answer(404, {}, path)


def router(fake, monkeypatch, drain_timeout=5.0, until="idle"):
    monkeypatch.setattr(routerctl, "http", fake)
    return routerctl.Router(host="r", url="http://10.0.0.9:30000", key="k", model="m",
                            workers={"gpu-1": W1, "gpu-2": W2}, drain_timeout_s=drain_timeout,
                            verify_timeout_s=5.0, poll_s=0.0, drain_until=until)


def test_drain_ends_when_out_of_routing_and_idle_while_the_router_still_settles(monkeypatch):
    fake = FakeSMG(settle=10, router_loads=(2, 1, 0), server_reqs=(2, 1, 0))
    watch = router(fake, monkeypatch).drain("gpu-1")
    assert (watch.router_state, watch.router_load, watch.worker_reqs) == ("draining", 0, 0)
    assert not watch.removed and "a" in fake.workers  # the router still holds it
    assert ("DELETE", "/workers/a") in fake.calls
    assert sum(c == ("GET", "/workers/a") for c in fake.calls) == 3


def test_drain_waits_for_the_router_s_count_even_when_the_server_counts_none(monkeypatch):
    """A request the router has sent but the server has not queued yet: only the router
    counts it."""
    fake = FakeSMG(settle=10, router_loads=(1, 1, 0), server_reqs=(0,))
    watch = router(fake, monkeypatch).drain("gpu-1")
    assert watch.router_load == 0 and sum(c == ("GET", "/workers/a") for c in fake.calls) == 3


def test_a_worker_already_draining_is_not_deleted_again_only_watched(monkeypatch):
    """A rollout run again within the router's settle after one killed after its drain."""
    fake = FakeSMG(settle=10, router_loads=(1, 0))
    fake.workers["a"]["status"] = "draining"
    watch = router(fake, monkeypatch).drain("gpu-1")
    assert ("DELETE", "/workers/a") not in fake.calls
    assert (watch.router_state, watch.router_load) == ("draining", 0)


def test_drain_until_removed_waits_for_the_router_to_forget_the_worker(monkeypatch):
    fake = FakeSMG(settle=3, server_reqs=(2, 1, 0))
    watch = router(fake, monkeypatch, until="removed").drain("gpu-1")
    assert watch.removed and watch.worker_reqs == 0 and "a" not in fake.workers


def test_drain_timeout_names_the_last_observation(monkeypatch):
    fake = FakeSMG(settle=10**9, router_loads=(1,))
    with pytest.raises(RouterError) as exc:
        router(fake, monkeypatch, drain_timeout=0.05).drain("gpu-1")
    assert "rollout_drain_timeout_s" in exc.value.what
    assert "router: draining, router in-flight 1" in exc.value.found


def test_put_back_adds_the_worker_and_waits_for_a_generation_routed_to_it(monkeypatch):
    fake = FakeSMG(routed=(W2, W2, W1))
    del fake.workers["a"]
    back = router(fake, monkeypatch).put_back("gpu-1")
    assert back.tries == 3 and back.steps == ["add", "verify"] and back.removal_wait_s is None
    assert fake.calls.count(("POST", "/workers")) == 1


def test_put_back_while_the_router_still_drains_the_worker_waits_for_its_removal(monkeypatch):
    """The drain ended before the router's settle; the host is ready again before the router
    forgot it: the put back neither re-adds (refused) nor replaces (the pending removal would
    take it) until the router has forgotten the worker, then adds it."""
    fake = FakeSMG(settle=10, router_loads=(0,), routed=(W1,))
    r = router(fake, monkeypatch)
    r.drain("gpu-1")
    assert fake.workers["a"]["status"] == "draining"
    back = r.put_back("gpu-1")
    assert back.steps == ["wait-removal", "add", "verify"] and back.removal_wait_s is not None
    puts = [i for i, c in enumerate(fake.calls) if c in (("POST", "/workers"), ("PUT", "/workers/a"))]
    assert [fake.calls[i] for i in puts] == [("POST", "/workers")]  # one add, no replace
    assert "a" not in fake.workers and fake.workers["c"]["url"] == W1


def test_put_back_gives_up_at_its_bound_saying_where_requests_went(monkeypatch):
    fake = FakeSMG(routed=(W2,))
    with pytest.raises(RouterError) as exc:
        router(fake, monkeypatch).put_back("gpu-1")
    assert W2 in exc.value.found


def test_a_router_that_does_not_answer_is_an_error(monkeypatch):
    monkeypatch.setattr(routerctl, "http", lambda *a, **k: routerctl.Answer(None, {}, "ConnectionRefusedError"))
    r = routerctl.Router(host="r", url="http://10.0.0.9:30000", key="k", model="m",
                         workers={"gpu-1": W1}, drain_timeout_s=1, verify_timeout_s=1)
    with pytest.raises(RouterError) as exc:
        r.states()
    assert "ConnectionRefused" in exc.value.found


def test_a_loopback_router_is_never_called_from_the_controller(monkeypatch):
    monkeypatch.setattr(routerctl, "http", lambda *a, **k: pytest.fail("called"))
    r = routerctl.Router(host="r", url="http://127.0.0.1:30000", key="k", model="m",
                         workers={"gpu-1": W1}, drain_timeout_s=1, verify_timeout_s=1)
    with pytest.raises(RouterError) as exc:
        r.states()
    assert "loopback" in exc.value.found
