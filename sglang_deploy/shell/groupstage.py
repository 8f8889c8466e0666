"""The group parts of the deploy's and the rollback's stages (``stages``): the operations a
node of a multi-node group adds, the same on every node and in the same order, each gated by
the group's decision (``groupops.Gate``), none waiting for another host's operation.

    every node, one operation at a time (a barrier between operations):
    rendezvous started -> collected (own host) -> judged (all) -> stop -> [all-reduce] -> start
    -> workers verified -> rank 0 verified -> the group ready as one (all)
"""

from __future__ import annotations

import functools

from pyinfra import host
from pyinfra.operations import python

from sglang_deploy.core import group as groupmod
from sglang_deploy.core import service
from sglang_deploy.shell import groupops
from sglang_deploy.shell import operations as ops


def register(run: groupops.GroupRun, hoststate: dict, reasons: list[str], card: dict,
             extra: list[str] = ()) -> None:
    """Register this node's wish to (re)start (REASONS, EXTRA, and its unit's state), whether
    it runs, and its CARD with its group's run."""
    svc = hoststate.get("service") or {}
    wants = [*reasons, *extra]
    if svc.get("ActiveState") != "active":
        wants.append("not running")
    elif not wants and service.runs_unverified(svc, hoststate.get("last_verified"), False):
        wants.append("running, never verified")
    running = svc.get("ActiveState") in ("active", "activating", "reloading")
    run.register(host.name, wants, running, card)


def add_preflight(run: groupops.GroupRun, tool: str, python_path: str) -> None:
    """The group pre-flight, three operations on every node (when the group restarts): the
    rendezvous tool started in the background, this node's result collected, every node's
    result judged (a failure fails every node before any server stops)."""
    g, node = run.group, host.name
    restart = groupops.Gate(run, "restart")
    argv = groupmod.rendezvous_argv(g, node, tool, run.cards.get(node) or {}, run.probe,
                                    python=python_path)
    groupops.rendezvous_started(
        name=f"Group pre-flight: rendezvous of group {g.name} started on every node",
        argv=argv, out=run.result_file(node), _if=restart)
    python.call(name=f"Group pre-flight: rendezvous result of group {g.name}",
                function=ops.reported(functools.partial(groupops.rendezvous_collect, run)),
                _if=restart)
    python.call(name=f"Group pre-flight: rendezvous of group {g.name} judged",
                function=ops.reported(functools.partial(groupops.rendezvous_judge, run)),
                _if=restart)


def add_restart(run: groupops.GroupRun, service_name: str, why: str, start_name: str,
                between=None) -> None:
    """Every node's unit stopped, then (BETWEEN(gate) adds what runs while the group is
    down) every node's started, when the group goes (``Gate(run, "go")``)."""
    go = groupops.Gate(run, "go")
    groupops.group_service(name=f"Stop {service_name}: group {run.group.name} {why}",
                           service=service_name, action="stop", _if=go)
    if between is not None:
        between(go)
    groupops.group_service(name=start_name, service=service_name, action="start", _if=go)


def verify_as_one(run: groupops.GroupRun, service_name: str, verify, record,
                  what: str) -> list[tuple[str, object, dict]]:
    """The group verified as one, three operations as (name, function, global arguments):
    the workers (rank >= 1), then rank 0, each on its own host (VERIFY(watch) gives the
    node's summary); then the group's verdict on every node (RECORD(summary) keeps a
    verified node's record)."""
    g, node = run.group, host.name
    checks = [(f"Verify group {g.name}{what}: {label}",
               functools.partial(groupops.verify_node, run, service_name, verify),
               {"_if": groupops.Gate(run, "go", rank=rank, node=node)})
              for rank, label in (("workers", "its nodes of rank >= 1 up"),
                                  ("rank0", "rank 0 serves"))]
    return [*checks, (f"Verify group {g.name}{what}: every node verified, ready as one",
                      functools.partial(groupops.group_ready, run, service_name, record),
                      {"_if": groupops.Gate(run, "go")})]


def add_verify_as_one(run: groupops.GroupRun, service_name: str, verify, record,
                      what: str) -> None:
    """The operations of ``verify_as_one``, added."""
    for name, function, gate in verify_as_one(run, service_name, verify, record, what):
        python.call(name=name, function=ops.reported(function), **gate)
