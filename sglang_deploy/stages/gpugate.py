"""The GPU health gate: a deploy, a rollout and a rollback refuse to (re)start a server onto a
GPU its health read judges fatal (``core.gpuhealth``).

The read is part of the host's one state read (``hoststate.py state --gpu-health``, in the
pre-flight's ``HostSnapshot`` and the rollback's ``SglangHostState``): no round trip of its
own. The gate raises while pyinfra prepares the operations, so nothing of the run has
executed: the serving server is never stopped for a restart that would be refused. A plan run
(``status``, ``doctor``, ``rollout --dry``) never raises: it records the report instead
(``plan``). A multi-node group restarts as one, so each node's GPUs are judged once, with its
group's decision (``hostplan.Prepared``), and every node refuses together when any node's
are fatal: none is stopped for a peer that cannot start.
"""

from __future__ import annotations

from sglang_deploy.core import data as datamod
from sglang_deploy.core import gpuhealth
from sglang_deploy.core.hoststate import HostState
from sglang_deploy.integration import plan


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


def before_start(name: str, s: datamod.Settings, hs: HostState, reasons: list[str]) -> None:
    """The deploy's gate (the service stage, the rollout's staging run too): host NAME starts
    (its unit is not active) or restarts (for REASONS) only onto GPUs not judged fatal."""
    active = hs.service.unit_active
    if active and not reasons:
        return
    check(name, s, hs, f"{'restart' if active else 'start'} {s.sglang_service} "
                       f"({', '.join(reasons) or 'not running'})")


def check_group(group: str, fatal, action: str) -> None:
    """Refuse ACTION of GROUP on this node when any of its nodes' GPUs are FATAL ((node,
    report), judged once with the group's decision: ``hostplan.Prepared.fatal``): every node
    raises the same error, naming the node; a plan run only records."""
    if plan.planning():
        return
    for name, rep in fatal:
        gpuhealth.gate(rep, name, f"{action} (group {group} restarts as one)")

