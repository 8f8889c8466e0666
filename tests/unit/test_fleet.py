"""One ``Fleet`` per pyinfra run (``controller.routing``): built once by the hooks' data check, a part
of the run object on the run's State, released at its end; every host's data resolved once and every group planned
once, however many hosts, stages, router stages and router lookups read them."""

from __future__ import annotations

import collections
from types import SimpleNamespace

import pytest
import runobj
from pyinfra.api import Config, Inventory, State

from sglang_deploy.controller import routerctl, routing
from sglang_deploy.core import data as datamod
from sglang_deploy.core import group
from sglang_deploy.core.errors import UsageError
from sglang_deploy.integration import hooks, integration

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
    run = runobj.start(state, fleet=fleet)   # the check gives it to the run object
    for _ in range(3):                       # every stage of every host reads it, often
        for h in inventory:
            s = integration.run_of(state).fleet.settings(h.name)
            assert s is run.fleet.settings(h.name)
            integration.run_of(state).fleet.group_of(h.name)
        routing.router_workers(integration.run_of(state).fleet)
        [router] = routerctl.routers_of(integration.run_of(state).fleet)
    assert router.host == "r1" and set(router.workers) == {"n0", "solo"}   # rank 0 only
    assert integration.run_of(state).fleet is fleet
    assert {k: v for k, v in counts.items() if k[0] == "resolve"} == {
        ("resolve", f"10.0.0.{i}"): 1 for i in (10, 11, 12, 2)}
    assert counts["plan", ("n0", "n1")] == 1   # the group, planned once for the run
    assert run.fleet.settings("n1").sglang_flags["node-rank"] == 1
    integration.release_run(state)            # the run ended: nothing of it stays
    with pytest.raises(UsageError):
        integration.run_of(state)


def test_the_check_returns_the_runs_fleet_holding_the_settings_it_resolved(tmp_path,
                                                                            monkeypatch):
    """``hooks.check_run`` resolves each host once and hands that Fleet to the run object;
    a stage reads those Settings, never a second resolve."""
    from sglang_deploy.core.runspec import RunSpec
    from sglang_deploy.integration.integration import RunStart

    resolved = {"h1": SimpleNamespace(sglang_group=None)}  # Settings, as checked
    monkeypatch.setattr(hooks, "check_selection", lambda *a, **k: None)
    monkeypatch.setattr(hooks, "validate_inventory",
                        lambda inventory, cwd, fleet, recorder: (
                            fleet._settings.update(resolved) or dict(resolved)))
    inventory = Inventory((["h1"], {}))
    state = State(inventory, Config())
    run = runobj.start(state, checked=False, cwd=tmp_path)
    fleet = hooks.check_run(RunStart(state, inventory, None, str(tmp_path), dry=False,
                                     spec=RunSpec()))
    run.checked(fleet)
    monkeypatch.setattr(datamod, "resolve", lambda *a, **k: pytest.fail("resolved again"))
    assert integration.run_of(state).fleet.settings("h1") is resolved["h1"]


def test_a_fleet_seeded_with_settings_resolved_elsewhere_resolves_none_again(monkeypatch):
    inventory = _inventory()
    first = routing.fleet_of(inventory)
    resolved = {h.name: first.settings(h.name) for h in inventory}
    monkeypatch.setattr(datamod, "resolve", lambda *a, **k: (_ for _ in ()).throw(
        AssertionError("resolved a second time")))
    again = routing.fleet_of(inventory, resolved)
    assert all(again.settings(n) is s for n, s in resolved.items())
