"""Plan records: what a ``--dry`` deploy would change on each host, and where it stands.

In a plan run (the run spec's mode ``plan``, ``core/runspec.py``: ``sglang-deploy status``,
``doctor`` and ``rollout --dry`` start one) the stages record, while pyinfra prepares the
operations, each host's ``plan`` in the run journal (``integration/journal.py``): the operations
that would change something (the drift), the pre-flight failures, and the host's state as
read by the facts; and its ``preflight``: every pre-flight check. Nothing is written to any
host.
"""

from __future__ import annotations

import json

from sglang_deploy.core import hardening, residency, restart, watchdog
from sglang_deploy.core import journal as shape
from sglang_deploy.core.hostrecords import LastRestart
from sglang_deploy.core.hoststate import HostState, ServiceState
from sglang_deploy.integration import journal
from sglang_deploy.integration.integration import this_run


def planning() -> bool:
    """Whether this pyinfra run is a plan run (its spec, ``integration.this_run``)."""
    return this_run().spec.planning


def read_only() -> bool:
    """Whether this pyinfra run only plans: ``--dry`` (``deploy.py --dry``, ``rollout --dry``)
    or a plan run (``status``, ``doctor``: ``planning``). A read-only run never touches a
    serving host's GPUs (``preflight.probe_plan``)."""
    return this_run().read_only


def preflight(name: str, checks: list, nccl_env: dict | None = None,
              matrix: str | None = None, gpu_health: dict | None = None) -> None:
    """Record the pre-flight: every check as the host's ``preflight`` (what ``doctor
    INVENTORY`` shows), and a failing one as its ``plan`` (the deploy would stop there), with
    the host's GPU_HEALTH (``gpugate.report``'s, which `status` shows either way)."""
    if not planning():
        return
    journal.record(name, shape.PREFLIGHT, {
        "host": name, "checks": [c.to_dict() for c in checks], "nccl_env": nccl_env or {},
        "p2p_matrix": matrix})
    failed = [c for c in checks if c.status == "fail"]
    if not failed:
        return
    journal.record(name, shape.PLAN, {
        "host": name, "preflight": "fail", "changes": None, "gpu_health": gpu_health,
        "failed": [{"name": c.name, "message": c.message, "fix": c.fix} for c in failed]})


def changes(state, host) -> list[str]:
    """Names of the host's operations that would change something, in order."""
    out = []
    for op_hash, data in state.ops.get(host, {}).items():
        if getattr(data.global_arguments.get("_if"), "group_gate", False):
            continue  # a group's decision (``groupops.Decided``): its nodes' reasons are recorded
        if data.operation_meta.will_change:
            names = sorted(state.op_meta[op_hash].names)
            # "Stage | Operation" -> "Operation"
            out.append(names[0].split(" | ", 1)[-1] if names else op_hash)
    return out


def status_fields(hs: HostState, serving: dict | None, release_id: str) -> dict:
    """Pure: the status row's fields from the typed host state HS and one serving poll
    (SERVING: its ``service``, ``health`` and ``models``; the unit as polled, when it was)."""
    polled = (serving or {}).get("service")
    unit = ServiceState.from_json(polled) if polled else hs.service
    current = hs.releases.current
    rel = hs.releases.get(current or "")
    uptime = None
    try:
        entered = int(unit.active_enter_monotonic or 0)
        if entered and unit.unit_active:
            uptime = round(float(hs.monotonic_now) - entered / 1e6)
    except (TypeError, ValueError):
        uptime = None
    health = ((serving or {}).get("health") or {}).get("status")
    models = []
    body = ((serving or {}).get("models") or {}).get("body")
    if body:
        try:
            models = [m.get("id") for m in json.loads(body).get("data", [])]
        except (ValueError, AttributeError):
            models = []
    verified = hs.last_verified
    return {
        "unit": unit.state_text,
        "uptime_s": uptime,
        "release": current,
        "release_wanted": release_id,
        "sglang_version": rel.sglang_version if rel is not None else None,
        "patch_state": rel.patch.state if rel is not None and rel.patch is not None else None,
        "health": health,
        "models": models,
        "last_verified": verified.verified_at if verified is not None else None,
        # the last (re)start and why (``core.restart.last_restart``, kept by the verifier)
        "last_restart": last_restart(verified.last_restart if verified is not None else None),
        # what the last release smoke saw of the unit's sandbox (``core.hardening``)
        "hardening": hardening.summary(hs.hardening),
        # the served model's shards in the page cache, and the host's memory
        "model_memory": model_memory(hs),
        # the watchdog after ready (``core.watchdog.status_doc``): None when none runs there
        "watchdog": watchdog.status_doc(hs.watchdog),
    }


def last_restart(entry: LastRestart | None) -> dict | None:
    """Pure: the last restart as ``status`` shows it: ``at``, ``action``, ``why``,
    ``reasons`` and the line (``text``); None when no restart was recorded."""
    if entry is None:
        return None
    return {"at": entry.at, "action": entry.action, "why": entry.why,
            "reasons": list(entry.reasons), "text": restart.last_restart_text(entry.raw)}


def model_memory(hs: HostState) -> dict | None:
    """Pure: the served model's shards in the page cache (``core.residency``): bytes, percent,
    MemAvailable/MemTotal and the line ``status`` shows; None without a shard on the host."""
    res = residency.Residency.of(hs.model, hs.memory)
    return None if res is None else {**res.as_json(), "text": res.text()}


def record(state, host, hp, serving: dict | None, extra: dict | None = None) -> None:
    """Record the host's drift and state from its plan HP (``core.hostplan.HostPlan``) and
    its poll (``ServingProbe``: SERVING); EXTRA: more fields (a group's node:
    ``groupops.group_fields``)."""
    journal.record(host.name, shape.PLAN, {
        "host": host.name, "preflight": "pass", "changes": changes(state, host),
        # the model folder the deploy serves (a new revision's: ``hostplan.model_revision``)
        **status_fields(hp.hoststate, serving, hp.release_id),
        # the GPU health read, judged (``core.gpuhealth``: the plan's, ``HostPlan.gpu_report``)
        "gpu_health": hp.gpu_report, **(extra or {})})
