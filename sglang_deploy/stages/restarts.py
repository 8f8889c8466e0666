"""A server's restart in the service stage (``stages.service_stage``): the one restart
decision (``core.restart``) made from the host's facts, said with ``-v``, and the operations
that follow it: a single server's start or restart, a group's node stopped and started with
its group; before either, when the pre-flight skipped the peer copies (a server ran on the
GPUs), the server stopped and P2P retested as an operation (``p2pretest``), in the run and in
the dry run alike.
"""

from __future__ import annotations

import dataclasses

from pyinfra import host, logger, state

from sglang_deploy.core import restart
from sglang_deploy.core.hostplan import HostPlan
from sglang_deploy.core.verify import check_serving
from sglang_deploy.hostops import operations as ops
from sglang_deploy.hostops.facts import serving_poll
from sglang_deploy.stages import allreduce, p2pretest
from sglang_deploy.stages.group import groupops, groupprep, groupstage


def decide(hp: HostPlan, unit_text: str) -> restart.Decision:
    """A single host's restart decision from its plan (HP: its facts, what this run gives it)
    for the UNIT_TEXT this run renders (``HostPlan.wanted``, as a group's node's): its poll
    (``ServingProbe``) is read only when a running server no deploy verified must be
    judged."""
    facts = hp.restart_facts()
    serves = None
    if restart.needs_poll(facts):
        poll = serving_poll(host, hp.settings)
        serves = bool(poll) and check_serving(poll, hp.settings.served_model_name,
                                              False).kind == "ready"
    return restart.decide(facts, hp.wanted(unit_text), serves=serves)


def decided(hp: HostPlan, unit_text: str) -> HostPlan:
    """HP with its restart decision (``HostPlan.restart``): a single host's (``decide``), or
    its group's (``group_decision``), made once per run from every node's facts
    (``groupprep.decide``: the same on every node)."""
    if hp.group is None:
        return dataclasses.replace(hp, restart=decide(hp, unit_text))
    prepared = groupprep.decide(state, hp.group, hp.release)
    return dataclasses.replace(hp, restart=prepared.decision, group_decision=prepared)


def own(hp: HostPlan) -> tuple[restart.Decision, str, bool]:
    """This host's own decision in HP's (a group's node: its entry of the group's), the
    reasons in words and whether its server (re)starts (a group's node: its group)."""
    made = hp.restart
    if isinstance(made, restart.GroupDecision):
        return made.decisions[host.name], made.why(), made.restart
    return made, made.why(), bool(made.reasons)


def say(why: str, restarts: bool) -> None:
    """``-v``: the decision and its reasons, while the run is prepared (before anything
    restarts)."""
    if state.print_noop_info and why:
        verb = "restart" if restarts else "no restart"
        logger.info(f"{host.print_prefix}{verb}: {why}")


def start_or_restart(hp: HostPlan, unit, secrets, decision: restart.Decision) -> HostPlan:
    """A single server's start, or its restart when one of the DECISION's reasons' operations
    changes (or it runs a never-verified invocation that does not serve): HP with the
    (started, restarted) operations. When the pre-flight skipped the peer copies (a server
    ran), the server is stopped first and P2P retested on the free GPUs (``p2pretest``)."""
    s = hp.settings
    reasons = decision.triggers
    triggers = {"unit": unit, "secrets": secrets, **hp.ops.triggers}
    action = decision.action

    def due() -> bool:  # the restart's condition, once the operations before it have run
        return action == restart.RESTART or any(triggers[r].did_change() for r in reasons)

    stopped = retested = None

    def due_or_stopped() -> bool:  # a server stopped for the retest always starts again
        return due() or (stopped is not None and stopped.did_change())

    if decision.retest:  # never beside a server that runs: stopped first (drained or not)
        stopped = ops.service_stopped(
            name=f"Stop {s.sglang_service} for the P2P retest", service=s.sglang_service,
            **({} if decision.start else {"_if": due}))
        retested = p2pretest.add_retest(hp, _if=stopped.did_change)
        if decision.start:  # the GPUs free at last: the all-reduce check of a first start
            allreduce.add_allreduce_check(hp)
    started = ops.enabled_and_started(s.sglang_service, unit)
    # Gated operations are added only when a trigger may fire, so that a converged host shows
    # no change at all, not even a conditional one, in --dry.
    restarted = None
    if reasons and not started.will_change:
        restarted = ops.service_restarted(
            name=f"Restart {s.sglang_service} ({', '.join(reasons)} changed)",
            service=s.sglang_service, _if=due_or_stopped)
    elif action == restart.RESTART:
        restarted = ops.service_restarted(
            name=f"Restart {s.sglang_service} (running, never verified)", service=s.sglang_service)
    elif decision.retest and not started.will_change:  # a unit coming up, stopped for the retest
        restarted = ops.service_restarted(
            name=f"Restart {s.sglang_service} (stopped for the P2P retest)",
            service=s.sglang_service, _if=due_or_stopped)
    return dataclasses.replace(
        hp, verify_running=action == restart.VERIFY,
        ops=dataclasses.replace(hp.ops, started=started, restarted=restarted, retest=retested))


def group_node(hp: HostPlan, unit, run: groupops.GroupRun | None) -> None:
    """A group's node (HP): enabled, never started alone; when its group restarts (RUN),
    stopped with it, then its P2P retest (every node adds it; it runs where the copies were
    skipped while a server ran), the optional NCCL all-reduce across the group
    (``gpu_allreduce_check``: every GPU free), and started with it."""
    s, g, gd = hp.settings, hp.group, hp.restart
    ops.enabled_and_started(s.sglang_service, unit, start=False)
    if run is None:
        return
    groupstage.add_stop(run, s.sglang_service, "restarts as one")
    p2pretest.add_retest(hp, _if=groupops.Decided(gd.retest(host.name)))
    allreduce.add_allreduce_check(hp, group=g, when=groupops.Decided())
    groupstage.add_start(run, s.sglang_service, f"Start {s.sglang_service} with group {g.name}")
