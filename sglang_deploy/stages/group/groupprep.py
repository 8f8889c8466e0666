"""A multi-node group's decision, made while its nodes are prepared (``core.restart``).

The first node of a group that pyinfra prepares reads every node's facts (its own and its
peers', ``peer.get_fact``) and makes the group's decision, once per run (kept on the group's
run, ``groupops.GroupRun.decision``): each node's plan from its host state and its Settings
(``node_view``: ``core.hostplan.plan``, the very function a node's own pre-flight makes its
plan with), its restart reasons from that plan (the same ``restart.decide`` a single host's
follows), the group restarting when any node has one, every node's card for the rendezvous
and the nodes whose GPU health is fatal (``Prepared``). Each node's view is computed once,
by that first node; every other node gets the very same ``Prepared``, none computes a view
again. So every node adds the same operations with static conditions, whatever order
pyinfra prepares them in.

pyinfra 3.10 caches no fact (every ``get_fact`` is a round trip), so each fact a group's
decision reads is read once per host in one run, whichever node asks first, through
``facts.read_host_state`` (kept for the run in the run object, where the operations find the
host state too); ``fact`` reads the CUDA probe and the patch status afresh once the operations
execute (a retest is never an answer kept from the preparation).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pyinfra.api.state import StateStage

from sglang_deploy.core import data as datamod
from sglang_deploy.core import gpuhealth, hostplan, nvsmi, restart, service, watchdogunit
from sglang_deploy.core import group as groupmod
from sglang_deploy.core.errors import GroupPreflightError, RuntimeSetupError
from sglang_deploy.core.hostplan import HostPlan, Prepared, Release
from sglang_deploy.core.hoststate import HostState
from sglang_deploy.core.service import Layout
from sglang_deploy.hostops.facts import (
    CudaProbe,
    HostSnapshot,
    SglangHostState,
    Snapshot,
    read_host_state,
)
from sglang_deploy.hostops.facts import patch_status as patch_status_of
from sglang_deploy.integration import plan
from sglang_deploy.integration.integration import run_of
from sglang_deploy.stages import gpugate, staging
from sglang_deploy.stages.group import groupops


def fact(h, cls, **kwargs):
    """H's fact CLS(KWARGS), read once per run while the operations are prepared (a peer's
    fact read by another node's preparation is not read again by its own); while they
    execute, read afresh."""
    if h.state.current_stage >= StateStage.Execute:
        return h.get_fact(cls, **kwargs)
    return read_host_state(h, cls, **kwargs)  # the run's one store of reads (its run object)


def snapshot(h, s: datamod.Settings, release_id: str) -> Snapshot:
    """H's ``HostSnapshot`` (the pre-flight's one round trip), for Settings S and the release:
    read once in H's run (``facts.read_host_state``, where the operations find it too)."""
    lay = Layout.of(s)
    return read_host_state(h, HostSnapshot, root=s.sglang_root, service=s.sglang_service,
                model=s.sglang_model_path, secrets=lay.secrets_file,
                python=s.sglang_system_python, cache=s.sglang_cache_dir,
                paths=(*lay.state_paths(release_id), staging.record_path(lay, release_id),
                       *watchdogunit.managed_paths(s.sglang_root)),
                route_to=s.sglang_dist_init_addr if s.sglang_group else None,
                watchdog=watchdogunit.STATE_DIR)


def probe(h, s: datamod.Settings, kind: str):
    """H's CUDA probe of KIND ("p2p" or "basic"; ``preflight.probe_plan``)."""
    return fact(h, CudaProbe, python=s.sglang_system_python, p2p=kind == "p2p",
                mib=s.gpu_p2p_test_mib)


def patch_status(h, s: datamod.Settings, hs: HostState, release_id: str) -> dict | None:
    """The autotune patch's status on H's release, as its operation finds it
    (``facts.patch_status``, read once in H's run: ``stages.autotune_patch`` and
    ``releaseops.autotune_patch`` find the same): its record when the file is still the one
    it describes, else read on the host; None: no venv yet."""
    lay = Layout.of(s)
    return patch_status_of(h, s.sglang_root, release_id, lay.venv_python(release_id),
                           lay.site(release_id, hs.platform.python), lay.tool("patch_tool.py"))


def driver(gpu: Mapping[str, Any]) -> str | None:
    """The driver version the snapshot's ``nvidia-smi --query-gpu`` section names."""
    query = (gpu.get("query-gpu.csv") or {}).get("out") or ""
    rows = nvsmi.parse_query_csv(query) if query.strip() else []
    return rows[0].get("driver_version") if rows else None


def node_view(h, s: datamod.Settings, g: groupmod.Group, release: Release) -> HostPlan:
    """Node H's plan, from its facts alone: ``hostplan.plan``, as its own pre-flight makes it
    (the same reads: ``snapshot``, ``probe``), with the patch status its runtime stage reads
    (``patch_status``). What this run renders for the node (its unit), its restart reasons and
    its card come from it."""
    snap = snapshot(h, s, release[0])
    hs = snap.state
    if hs is None:
        raise RuntimeSetupError(
            what=f"the host state of {h.name}, node of group {g.name}, to decide the group's "
                 f"restart ({s.sglang_system_python} hoststate.py printing JSON)",
            found="\n".join((snap.output or "").strip().splitlines()[-5:]) or "no output",
            fix=f"check that `{s.sglang_system_python}` runs on {h.name} (its own error above)")
    status = patch_status(h, s, hs, release[0])
    kind = hostplan.probe_kind(s, hs, plan.read_only())
    result = probe(h, s, kind) if kind != "none" else None
    return hostplan.plan(s, release, hs, snap.gpu, result, group=g,
                         read_only=plan.read_only()).with_patch(status)


def peers(state, g: groupmod.Group) -> list:
    """The hosts of G's nodes in this run (a node outside the selection, on purpose:
    the run spec's ``partial_group``, is left out); a selected node that is not connected
    fails the node being prepared, naming it, unless the run only reads (``status``,
    ``--dry``: it is left out, and its own row says why it was not read; failing the node
    would stop the whole read, every other host's row with it)."""
    out = []
    for name in g.members():
        peer = state.inventory.get_host(name)
        if not state.is_host_in_limit(peer):
            continue
        if not peer.connected and plan.read_only():
            continue
        if not peer.connected:
            raise GroupPreflightError(
                what=f"every node of group {g.name} connected ({', '.join(g.members())}): "
                     "its decision to restart is made from every node's state",
                found=f"{name} is not connected (its connection failed: above); nothing of "
                      "the group was changed",
                fix=f"make {name} reachable (its own error above; `ssh "
                    f"{peer.data.get('ssh_hostname') or name}`) and re-run the deploy, or leave the "
                    f"whole group out of this run (`--exclude` each of its nodes)")
        out.append(peer)
    return out


def _fatal(nodes: list[tuple[str, datamod.Settings, HostState | None]]
           ) -> tuple[tuple[str, gpuhealth.Report], ...]:
    """(node, GPU health report) of NODES (name, Settings, host state) judged fatal."""
    reports = ((name, gpugate.report(s, hs)) for name, s, hs in nodes)
    return tuple((name, rep) for name, rep in reports if rep.fatal)


def decide(state, g: groupmod.Group, release: Release) -> Prepared:
    """The deploy's decision for G from every node's facts (each node's plan made once,
    ``node_view``): made once per run, by the first node prepared, and kept on G's run
    (``groupops.GroupRun.decision``), where every other node finds it."""

    def make() -> Prepared:
        fleet = run_of(state).fleet
        plans = {peer.name: node_view(peer, fleet.settings(peer.name), g, release)
                 for peer in peers(state, g)}
        order = [n for n in g.members() if n in plans]
        cards = {n: groupmod.card(n, g.rank_of(n), release[0], service.flag_map(p.settings),
                                  driver(p.gpu_snapshot)) for n, p in plans.items()}
        fatal = tuple((n, p.gpu_health) for n, p in plans.items() if p.gpu_health.fatal)
        return Prepared(restart.decide_group(
            order, {n: p.restart_facts() for n, p in plans.items()},
            {n: p.wanted() for n, p in plans.items()}), cards, fatal)

    return groupops.run_of(state, g).decision.get(make)


def rollback_hoststate(h, s: datamod.Settings) -> HostState:
    """H's host state as the rollback reads it (once in H's run: ``facts.read_host_state``)."""
    return read_host_state(h, SglangHostState, root=s.sglang_root, service=s.sglang_service,
                secrets=Layout.of(s).secrets_file, python=s.sglang_system_python,
                gpu_health=True)


def decide_rollback(state, g: groupmod.Group) -> Prepared:
    """The rollback's decision for G (a node that restores something or does not serve
    restarts the group), every node's card (its known-good release) and GPU health, from
    every node's facts; a node with nothing to roll back to fails the rollback
    (``RollbackError``). Made once per run, by the first node prepared."""

    def make() -> Prepared:
        restarts, running, cards, nodes = {}, {}, {}, []
        for peer in peers(state, g):
            s = run_of(state).fleet.settings(peer.name)
            hs = rollback_hoststate(peer, s)
            rb = service.rollback_plan(peer.name, hs, s.sglang_root)
            restarts[peer.name] = rb.restart
            running[peer.name] = hs.service.up
            cards[peer.name] = groupmod.card(peer.name, g.rank_of(peer.name),
                                             rb.params["release"], {}, None)
            nodes.append((peer.name, s, hs))
        order = [n for n in g.members() if n in restarts]
        return Prepared(restart.rollback_group(order, restarts, running), cards, _fatal(nodes))

    return groupops.run_of(state, g).decision.get(make)
