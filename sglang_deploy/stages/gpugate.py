"""The GPU health gate: a deploy, a rollout and a rollback refuse to (re)start a server onto a
GPU its health read judges fatal (``core.gpuhealth``).

The read is part of the host's one state read (``hoststate.py state --gpu-health``, in the
pre-flight's ``HostSnapshot`` and the rollback's ``SglangHostState``): no round trip of its
own. The gate raises while pyinfra prepares the operations, so nothing of the run has
executed: the serving server is never stopped for a restart that would be refused. A plan run
(``status``, ``doctor``, ``rollout --dry``) never raises: it records the report instead
(``plan``). A multi-node group restarts as one, so each node checks every node's GPUs: every
node refuses together, none is stopped for a peer that cannot start.
"""

from __future__ import annotations

from sglang_deploy.core import data as datamod
from sglang_deploy.core import gpuhealth
from sglang_deploy.core import group as groupmod
from sglang_deploy.core.hoststate import HostState
from sglang_deploy.integration import plan
from sglang_deploy.stages.group import groupprep


def report(s: datamod.Settings, hs: HostState | None) -> gpuhealth.Report:
    """The GPU health of a host with Settings S from its host state HS."""
    return gpuhealth.evaluate(hs.gpu_health if hs is not None else None,
                              s.gpu_expected_count, s.gpu_health_policy)


def check(name: str, s: datamod.Settings, hs: HostState | None, action: str) -> None:
    """Refuse ACTION on host NAME when its GPU health is fatal (``GpuHealthError``); a plan
    run only records."""
    if plan.planning():
        return
    gpuhealth.gate(report(s, hs), name, action)


def check_nodes(nodes: list[tuple[str, datamod.Settings, HostState | None]], group: str,
                action: str) -> None:
    """Refuse ACTION of GROUP when any of its NODES (name, Settings, host state) has a fatal
    GPU: every node raises the same error, naming the node."""
    for name, s, hs in nodes:
        check(name, s, hs, f"{action} (group {group} restarts as one)")


def before_start(name: str, s: datamod.Settings, hs: HostState, reasons: list[str]) -> None:
    """The deploy's gate (the service stage, the rollout's staging run too): host NAME starts
    (its unit is not active) or restarts (for REASONS) only onto GPUs not judged fatal."""
    active = hs.service.unit_active
    if active and not reasons:
        return
    check(name, s, hs, f"{'restart' if active else 'start'} {s.sglang_service} "
                       f"({', '.join(reasons) or 'not running'})")


def before_group_start(state, g: groupmod.Group | None, restart: bool, release_id: str,
                       service: str) -> None:
    """A group's node, once its group's decision is made: when group G RESTARTs, every node's
    GPUs (each node's pre-flight read, ``groupprep.node_states``) before any node stops."""
    if g is None or not restart:
        return
    check_nodes(groupprep.node_states(state, g, release_id), g.name, f"restart {service}")
