"""The group parts of the deploy's and the rollback's stages (``stages``): the operations a
node of a multi-node group adds, the same on every node and in the same order, their
conditions static: the group's decision is made once while the nodes are prepared, from every
node's facts (``groupprep.decide``, ``core.restart``), and none of the operations waits for
another host's.

    every node, one operation at a time (a barrier between operations), when the group restarts:
    rendezvous started -> collected (own host) -> judged (all) -> stop -> [P2P retest]
    -> [all-reduce] -> start
    -> workers verified -> rank 0 verified -> the group ready as one (all)
"""

from __future__ import annotations

import functools

from pyinfra import host, state
from pyinfra.operations import python

from sglang_deploy.core import data as datamod
from sglang_deploy.core import group as groupmod
from sglang_deploy.core import restart
from sglang_deploy.core.hostplan import HostPlan
from sglang_deploy.core.restart import GroupDecision
from sglang_deploy.core.service import Layout
from sglang_deploy.hostops import operations as ops
from sglang_deploy.hostops.facts import serving_poll
from sglang_deploy.integration import plan
from sglang_deploy.stages import gpugate
from sglang_deploy.stages.group import groupops, groupprep
from sglang_deploy.stages.verified import record_verified, verified_summary, verify_and_record


def add_preflight(run: groupops.GroupRun, decision: GroupDecision, cards: dict, tool: str,
                  python_path: str) -> None:
    """The group pre-flight, three operations on every node (the group restarts): the
    rendezvous tool started in the background, this node's result collected, every node's
    result judged with every node's CARDS (a failure fails every node before any server
    stops)."""
    g, node = run.group, host.name
    argv = groupmod.rendezvous_argv(g, node, tool, cards.get(node) or {}, run.probe,
                                    python=python_path)
    groupops.rendezvous_started(
        name=f"Group pre-flight: rendezvous of group {g.name} started on every node",
        argv=argv, out=run.result_file(node), _if=groupops.Decided())
    python.call(name=f"Group pre-flight: rendezvous result of group {g.name}",
                function=ops.reported(functools.partial(groupops.rendezvous_collect, run)),
                _if=groupops.Decided())
    judge = functools.partial(groupops.rendezvous_judge, run, dict(cards),
                              decision.running.get(g.rank0, False))
    python.call(name=f"Group pre-flight: rendezvous of group {g.name} judged",
                function=ops.reported(judge), _if=groupops.Decided())


def add_stop(run: groupops.GroupRun, service_name: str, why: str) -> None:
    """Every node's unit stopped (the group restarts; its pre-flight passed, else every node
    failed in it). What runs while the group is down comes next (a deploy's node: its P2P
    retest and the all-reduce, ``restarts.group_node``), then ``add_start``."""
    groupops.group_service(name=f"Stop {service_name}: group {run.group.name} {why}",
                           service=service_name, action="stop", _if=groupops.Decided())


def add_start(run: groupops.GroupRun, service_name: str, start_name: str) -> None:
    """Every node's unit started (after ``add_stop``)."""
    groupops.group_service(name=start_name, service=service_name, action="start",
                           _if=groupops.Decided())


def add_restart(run: groupops.GroupRun, service_name: str, why: str, start_name: str) -> None:
    """Every node's unit stopped, then every node's started, nothing between (the rollback)."""
    add_stop(run, service_name, why)
    add_start(run, service_name, start_name)


def verify_as_one(run: groupops.GroupRun, service_name: str, verify, record,
                  what: str) -> list[tuple[str, object, dict]]:
    """The group verified as one, three operations as (name, function, global arguments):
    the workers (rank >= 1), then rank 0, each on its own host (VERIFY(watch) gives the
    node's summary); then the group's verdict on every node (RECORD(summary) keeps a
    verified node's record). Every node adds all three; the first two run on their ranks."""
    g, node = run.group, host.name
    worker = g.rank_of(node) > 0
    checks = [(f"Verify group {g.name}{what}: {label}",
               functools.partial(groupops.verify_node, run, service_name, verify),
               {"_if": groupops.Decided(worker == (rank == "workers"))})
              for rank, label in (("workers", "its nodes of rank >= 1 up"),
                                  ("rank0", "rank 0 serves"))]
    return [*checks, (f"Verify group {g.name}{what}: every node verified, ready as one",
                      functools.partial(groupops.group_ready, run, service_name, record),
                      {"_if": groupops.Decided()})]


def add_verify_as_one(run: groupops.GroupRun, service_name: str, verify, record,
                      what: str) -> None:
    """The operations of ``verify_as_one``, added."""
    for name, function, gate in verify_as_one(run, service_name, verify, record, what):
        python.call(name=name, function=ops.reported(function), **gate)


# ------------------------------------------------------------------ the stages' group parts
def condition(hp: HostPlan) -> dict:
    """The global arguments of an operation a node adds because its group restarts: the
    group's decision (``groupops.Decided``); none for a single host's."""
    return {"_if": groupops.Decided()} if hp.group is not None else {}


def group_checks(hp: HostPlan) -> tuple:
    """A group's node: verified with its group when the group restarts (the three checks of
    ``groupstage.verify_as_one``, every node's the same, fail-fast), else checked as it runs
    when ``verify_converged`` (the fourth; None when off). The plan's record (``status``)
    gets the node's serving fact (``facts.serving_poll``)."""
    s, g = hp.settings, hp.group
    decision = hp.group_decision.decision
    run = groupops.run_of(state, g)
    if plan.planning():
        plan.record(state, host, hp, serving_poll(host, s),
                    extra=groupops.group_fields(g, host.name, decision.own(host.name)))
    params = hp.verify_params()
    previous = hp.hoststate.previous_restart
    if decision.restart:
        action = "restarted" if hp.hoststate.service.unit_active else "started"
        last = restart.last_restart(action, restart.record(decision, host.name), previous)
        checks = verify_as_one(
            run, s.sglang_service, lambda watch: verified_summary(
                s, params, action, watch, last),
            lambda summary: record_verified(s, params, summary), " as one")
        return (*checks, None)
    running = None
    if s.verify_converged:
        running = (f"Verify the running node (group {g.name}, not restarted)",
                   lambda: verify_and_record(s, params, "converged",
                                             groupops.Watch(run, host.name), previous), {})
    return None, None, None, running


def rollback_group_node(s: datamod.Settings, g: groupmod.Group, rb) -> None:
    """A group's node goes back with its group: when any node restores something or does not
    run (decided from every node's facts, ``groupprep.decide_rollback``), the group's
    pre-flight (the same rendezvous as a deploy's, the cards naming the known-good release),
    then every node stops, then starts, on its known-good configuration, and the group is
    verified as one (fail-fast); else each node is checked as it runs."""
    run = groupops.run_of(state, g)
    prepared = groupprep.decide_rollback(state, g)
    decision = prepared.decision
    if not decision.restart:
        python.call(name="Verify the known-good configuration serves (group not restarted)",
                    function=ops.reported(lambda: verify_and_record(
                        s, rb.params, "unchanged", groupops.Watch(run, host.name))))
        return
    gpugate.check_group(g.name, prepared.fatal,
                        f"restart {s.sglang_service} on its known-good configuration")
    add_preflight(run, decision, prepared.cards, Layout.of(s).tool("rendezvous.py"),
                  s.sglang_system_python)
    add_restart(run, s.sglang_service, "goes back as one",
                f"Start {s.sglang_service} on the known-good configuration with group {g.name}")
    add_verify_as_one(
        run, s.sglang_service,
        lambda watch: verified_summary(s, rb.params, "rolled-back", watch),
        lambda summary: record_verified(s, rb.params, summary), " on its known-good configuration")
