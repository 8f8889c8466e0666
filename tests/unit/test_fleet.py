"""One ``Fleet`` per pyinfra run (``controller.routing``): built once by the hooks, attached to the
run's State and released at its end; every host's data resolved once and every group planned
once, however many hosts, stages, router stages and router lookups read them."""

from __future__ import annotations

import collections
from types import SimpleNamespace

from pyinfra.api import Config, Inventory, State

from sglang_deploy.controller import routerctl, routing
from sglang_deploy.core import data as datamod
from sglang_deploy.core import group
from sglang_deploy.integration import hooks
from sglang_deploy.stages.group import groupops

NODE = {"sglang_model_path": "/srv/models/m", "sglang_lock": "locks/l.txt",
        "sglang_allow_public_without_key": True,
        "sglang_group": "g1", "sglang_flags": {"tp-size": 16}}


def _inventory() -> Inventory:
    return Inventory((
        [("n0", {**NODE, "ssh_hostname": "10.0.0.10"}), ("n1", {**NODE, "ssh_hostname": "10.0.0.11"}),
         ("solo", {"sglang_model_path": "/srv/models/m", "sglang_lock": "locks/l.txt",
                   "sglang_allow_public_without_key": True,
                   "sglang_flags": {"tp-size": 8}, "ssh_hostname": "10.0.0.12"}),
         ("r1", {"sglang_lock": "locks/l.txt", "sglang_model_path": "/srv/models/m",
                 "ssh_hostname": "10.0.0.2"})], {}),
        routers=(["r1"], {}))


def test_one_fleet_per_run_resolves_each_host_once_and_plans_each_group_once(monkeypatch):
    counts = collections.Counter()
    real_resolve, real_plan = datamod.resolve, group.plan

    def resolve(raw, environ):
        counts["resolve", raw.get("ssh_hostname")] += 1
        return real_resolve(raw, environ)

    def plan(hosts):
        counts["plan", tuple(n for n, _ in hosts)] += 1
        return real_plan(hosts)

    monkeypatch.setattr(datamod, "resolve", resolve)
    monkeypatch.setattr(group, "plan", plan)
    inventory = _inventory()
    state = State(inventory, Config())
    fleet = routing.fleet_of(inventory)      # as hooks.check_run does before connecting
    run = SimpleNamespace(state=state, settings={})
    routing.attach(state, fleet)
    for each in hooks.PER_RUN:               # the run's per-run objects, as at its start
        if each.name in ("group runs", "fleet"):
            each.attach(run)
    for _ in range(3):                       # every stage of every host reads it, often
        for h in inventory:
            s = routing.settings_of(h, state)
            assert s is routing.fleet_of_state(state).settings(h.name)
            routing.fleet_of_state(state).group_of(h.name)
        routing.router_workers(routing.fleet_of_state(state))
        [router] = routerctl.routers_of(routing.fleet_of_state(state))
    assert router.host == "r1" and set(router.workers) == {"n0", "solo"}   # rank 0 only
    assert routing.fleet_of_state(state) is fleet
    assert {k: v for k, v in counts.items() if k[0] == "resolve"} == {
        ("resolve", f"10.0.0.{i}"): 1 for i in (10, 11, 12, 2)}
    assert counts["plan", ("n0", "n1")] == 1   # the group, planned once for the run
    assert routing.settings_of(SimpleNamespace(name="n1"), state).sglang_flags["node-rank"] == 1
    for each in hooks.PER_RUN:               # the run ended: nothing of it stays
        if each.release is not None:
            each.release(state)
    assert not hasattr(state, routing.FLEET_ATTR) and not hasattr(state, groupops._ATTR)


def test_a_fleet_seeded_with_settings_resolved_elsewhere_resolves_none_again(monkeypatch):
    inventory = _inventory()
    first = routing.fleet_of(inventory)
    resolved = {h.name: first.settings(h.name) for h in inventory}
    monkeypatch.setattr(datamod, "resolve", lambda *a, **k: (_ for _ in ()).throw(
        AssertionError("resolved a second time")))
    again = routing.fleet_of(inventory, resolved)
    assert all(again.settings(n) is s for n, s in resolved.items())
