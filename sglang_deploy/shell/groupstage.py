"""The group parts of the deploy's and the rollback's stages (``stages``): the operations a
node of a multi-node group adds, the same on every node and in the same order, each gated by
the group's decision (``groupops.Gate``), none waiting for another host's operation.

    every node, one operation at a time (a barrier between operations):
    rendezvous started -> collected (own host) -> judged (all) -> stop -> [all-reduce] -> start
    -> workers verified -> rank 0 verified -> the group ready as one (all)
"""

from __future__ import annotations

import functools

from pyinfra import host, state
from pyinfra.operations import python

from sglang_deploy.core import data as datamod
from sglang_deploy.core import group as groupmod
from sglang_deploy.core import nvsmi, preflight, service
from sglang_deploy.core.hoststate import HostState
from sglang_deploy.core.service import Layout
from sglang_deploy.shell import groupops, plan
from sglang_deploy.shell import operations as ops
from sglang_deploy.shell.verified import record_verified, verified_summary, verify_and_record


def register(run: groupops.GroupRun, hoststate: HostState, reasons: list[str], card: dict,
             extra: list[str] = ()) -> None:
    """Register this node's wish to (re)start (REASONS, EXTRA, and its unit's state), whether
    it runs, and its CARD with its group's run."""
    svc = hoststate.service
    wants = [*reasons, *extra]
    if not svc.unit_active:
        wants.append("not running")
    elif not wants and service.runs_unverified(svc, hoststate.last_verified, False):
        wants.append("running, never verified")
    running = svc.up
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


# ------------------------------------------------------------------ the stages' group parts
def group_interface(s: datamod.Settings, route_dev: str | None) -> tuple[preflight.Check, dict]:
    """The interface a group's node uses for NCCL/gloo: ``sglang_nccl_socket_ifname``, else
    the one that carries rank 0's address on this host (none: the node cannot reach it)."""
    ifname = s.sglang_nccl_socket_ifname or route_dev
    addr = f"{s.sglang_dist_init_addr}:{s.sglang_dist_init_port}"
    if not ifname:
        return preflight.Check(
            name="group-interface", status="fail",
            message=f"no interface of this host carries a route to rank 0's {addr} "
                    f"(group {s.sglang_group})",
            fix="give the node a route to rank 0's address (same subnet or a gateway), or set "
                "`sglang_dist_init_addr` to an address of rank 0 it reaches"), {}
    how = "sglang_nccl_socket_ifname" if s.sglang_nccl_socket_ifname else "the route to rank 0"
    return preflight.Check(name="group-interface", status="pass",
                           message=f"group {s.sglang_group}: NCCL/gloo over {ifname} ({how}), "
                                   f"--dist-init-addr {addr}"), groupmod.group_environment(ifname)


def registered(ctx, reasons: list[str]) -> groupops.GroupRun:
    """Register this node (CTX: its ``stages.Context``) with its group's run: its wish to
    (re)start (REASONS, ``register``) and its card."""
    query = ((ctx.gpu_snapshot or {}).get("query-gpu.csv") or {}).get("out") or ""
    rows = nvsmi.parse_query_csv(query) if query.strip() else []
    run = groupops.run_of(state, ctx.group)
    register(run, ctx.hoststate, reasons, groupmod.card(
        host.name, ctx.group.rank_of(host.name), ctx.release_id, service.flag_map(ctx.settings),
        rows[0].get("driver_version") if rows else None))
    return run


def group_checks(ctx, serving_poll) -> tuple:
    """A group's node: verified with its group when the group restarts (the three checks of
    ``groupstage.verify_as_one``, every node's the same, fail-fast), else checked as it runs
    when ``verify_converged`` (the fourth; None when off). SERVING_POLL(): the serving
    fact of the plan's record (``status``)."""
    s, g = ctx.settings, ctx.group
    run = groupops.run_of(state, g)
    if plan.planning():
        plan.record(state, host, ctx, serving_poll(), extra=groupops.group_fields(run, host.name))
    was_active = ctx.hoststate.service.unit_active
    params = ctx.verify_params()
    checks = verify_as_one(
        run, s.sglang_service, lambda watch: verified_summary(
            s, params, "restarted" if was_active else "started", watch),
        lambda summary: record_verified(s, params, summary), " as one")
    running = None
    if s.verify_converged:
        running = (f"Verify the running node (group {g.name}, not restarted)",
                   lambda: verify_and_record(s, params, "converged",
                                             groupops.Watch(run, host.name)),
                   {"_if": groupops.Gate(run, "idle")})
    return (*checks, running)


def rollback_group_node(s: datamod.Settings, g: groupmod.Group, hs: HostState, rb) -> None:
    """A group's node goes back with its group: when any node restores something or does not
    run, the group's pre-flight (the same rendezvous as a deploy's, the cards naming the
    known-good release), then every node stops, then starts, on its known-good configuration,
    and the group is verified as one (fail-fast); else each node is checked as it runs."""
    run = groupops.run_of(state, g)
    card = groupmod.card(host.name, g.rank_of(host.name), rb.params["release"], {}, None)
    register(run, hs, ["known-good restored"] if rb.restart else [], card)
    add_preflight(run, Layout.of(s).tool("rendezvous.py"), s.sglang_system_python)
    add_restart(run, s.sglang_service, "goes back as one",
                           f"Start {s.sglang_service} on the known-good configuration with "
                           f"group {g.name}")
    add_verify_as_one(
        run, s.sglang_service,
        lambda watch: verified_summary(s, rb.params, "rolled-back", watch),
        lambda summary: record_verified(s, rb.params, summary), " on its known-good configuration")
    python.call(name="Verify the known-good configuration serves (group not restarted)",
                function=ops.reported(lambda: verify_and_record(
                    s, rb.params, "unchanged", groupops.Watch(run, host.name))),
                _if=groupops.Gate(run, "idle"))
