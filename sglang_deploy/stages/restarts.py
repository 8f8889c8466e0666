"""A server's restart in the service stage (``stages.service_stage``): the one restart
decision (``core.restart``) made from the host's facts, said with ``-v``, and the operations
that follow it: a single server's start or restart, a group's node stopped and started with
its group; before either, when the pre-flight skipped the peer copies (a server ran on the
GPUs), the server stopped and P2P retested as an operation (``p2pretest``), in the run and in
the dry run alike.
"""

from __future__ import annotations

from pyinfra import host, logger, state

from sglang_deploy.core import data as datamod
from sglang_deploy.core import restart, service
from sglang_deploy.core.verify import check_serving
from sglang_deploy.hostops import operations as ops
from sglang_deploy.hostops.facts import ServingProbe
from sglang_deploy.stages import allreduce, p2pretest
from sglang_deploy.stages.group import groupops, groupprep, groupstage


def serving_poll(s: datamod.Settings):
    """One read-only poll of the server (``ServingProbe``: its unit, /health, /v1/models)."""
    return host.get_fact(ServingProbe, service=s.sglang_service, port=s.sglang_port,
                         host_addr=service.probe_address(s.sglang_host),
                         secrets=service.SECRETS_FILE, python=s.sglang_system_python)


def decide(ctx, unit_text: str) -> restart.Decision:
    """A single host's restart decision (CTX: its ``stages.Context``) from its facts, for the
    UNIT_TEXT this run renders (its secrets: ``groupprep.wanted``, as a group's node's): its
    poll (``ServingProbe``) is read only when a running server no deploy verified must be
    judged."""
    s, hs = ctx.settings, ctx.hoststate
    facts = restart.Facts.of(hs, ctx.layout.unit_file)
    changes = groupprep.changing(s, hs, ctx.release_id, ctx.patch_status)
    wanted = groupprep.wanted(s, (ctx.release_id, ctx.sglang_version, ctx.lock_text), unit_text,
                              changes, ctx.p2p_skipped)
    serves = None
    if restart.needs_poll(facts):
        poll = serving_poll(s)
        serves = bool(poll) and check_serving(poll, s.served_model_name, False).kind == "ready"
    return restart.decide(facts, wanted, serves=serves)


def say(why: str, restarts: bool) -> None:
    """``-v``: the decision and its reasons, while the run is prepared (before anything
    restarts)."""
    if state.print_noop_info and why:
        verb = "restart" if restarts else "no restart"
        logger.info(f"{host.print_prefix}{verb}: {why}")


def start_or_restart(ctx, unit, secrets, decision: restart.Decision) -> tuple:
    """A single server's start, or its restart when one of the DECISION's reasons' operations
    changes (or it runs a never-verified invocation that does not serve): (started,
    restarted) operations. When the pre-flight skipped the peer copies (a server ran), the
    server is stopped first and P2P retested on the free GPUs (``p2pretest``)."""
    s = ctx.settings
    reasons = decision.triggers
    triggers = {"unit": unit, "secrets": secrets, **ctx.ops.triggers}
    action = decision.action

    def due() -> bool:  # the restart's condition, once the operations before it have run
        return action == restart.RESTART or any(triggers[r].did_change() for r in reasons)

    stopped = None

    def due_or_stopped() -> bool:  # a server stopped for the retest always starts again
        return due() or (stopped is not None and stopped.did_change())

    if decision.retest:  # never beside a server that runs: stopped first (drained or not)
        stopped = ops.service_stopped(
            name=f"Stop {s.sglang_service} for the P2P retest", service=s.sglang_service,
            **({} if decision.start else {"_if": due}))
        p2pretest.add_retest(ctx, _if=stopped.did_change)
        if decision.start:  # the GPUs free at last: the all-reduce check of a first start
            allreduce.add_allreduce_check(ctx)
    started = ops.enabled_and_started(s.sglang_service, unit)
    # Gated operations are added only when a trigger may fire, so that a converged host shows
    # no change at all, not even a conditional one, in --dry.
    ctx.verify_running = action == restart.VERIFY
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
    return started, restarted


def group_node(ctx, unit, run: groupops.GroupRun | None, gd: restart.GroupDecision) -> None:
    """A group's node (CTX): enabled, never started alone; when its group restarts (RUN),
    stopped with it, then its P2P retest (every node adds it; it runs where the copies were
    skipped while a server ran), the optional NCCL all-reduce across the group
    (``gpu_allreduce_check``: every GPU free), and started with it."""
    s = ctx.settings
    ops.enabled_and_started(s.sglang_service, unit, start=False)
    if run is None:
        return

    def between(when) -> None:
        p2pretest.add_retest(ctx, _if=groupops.Decided(gd.retest(host.name)))
        allreduce.add_allreduce_check(ctx, group=ctx.group, when=when)

    groupstage.add_restart(run, s.sglang_service, "restarts as one",
                           f"Start {s.sglang_service} with group {ctx.group.name}",
                           between=between)
