"""Plan records: what a ``--dry`` deploy would change on each host, and where it stands.

In a plan run (the run spec's mode ``plan``, ``core/runspec.py``: ``sglang-deploy status``,
``doctor`` and ``rollout --dry`` start one) the stages record, while pyinfra prepares the
operations, each host's ``plan`` in the run journal (``shell/journal.py``): the operations
that would change something (the drift), the pre-flight failures, and the host's state as
read by the facts; and its ``preflight``: every pre-flight check. Nothing is written to any
host.
"""

from __future__ import annotations

import json

from sglang_deploy.core import hardening, residency, restart, watchdog
from sglang_deploy.core import journal as shape
from sglang_deploy.core.hoststate import ServiceState
from sglang_deploy.shell import journal
from sglang_deploy.shell.integration import this_run


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


def status_fields(hoststate: dict, serving: dict | None, release_id: str) -> dict:
    """Pure: the status row's fields from the host state and one serving poll."""
    svc = (serving or {}).get("service") or hoststate.get("service") or {}
    unit = ServiceState.from_json(svc)
    current = hoststate.get("current")
    rel = (hoststate.get("releases") or {}).get(current or "", {})
    uptime = None
    try:
        entered = int(svc.get("ActiveEnterTimestampMonotonic") or 0)
        if entered and unit.unit_active:
            uptime = round(float(hoststate["monotonic_now"]) - entered / 1e6)
    except (KeyError, TypeError, ValueError):
        uptime = None
    health = ((serving or {}).get("health") or {}).get("status")
    models = []
    body = ((serving or {}).get("models") or {}).get("body")
    if body:
        try:
            models = [m.get("id") for m in json.loads(body).get("data", [])]
        except (ValueError, AttributeError):
            models = []
    verified = hoststate.get("last_verified") or {}
    return {
        "unit": unit.state_text,
        "uptime_s": uptime,
        "release": current,
        "release_wanted": release_id,
        "sglang_version": rel.get("sglang_version"),
        "patch_state": (rel.get("patch") or {}).get("state"),
        "health": health,
        "models": models,
        "last_verified": verified.get("verified_at"),
        # the last (re)start and why (``core.restart.last_restart``, kept by the verifier)
        "last_restart": last_restart(verified.get("last_restart")),
        # what the last release smoke saw of the unit's sandbox (``core.hardening``)
        "hardening": hardening.summary(hoststate.get("hardening")),
        # the served model's shards in the page cache, and the host's memory
        "model_memory": model_memory(hoststate),
        # the watchdog after ready (``core.watchdog.status_doc``): None when none runs there
        "watchdog": watchdog.status_doc(hoststate.get("watchdog")),
    }


def last_restart(entry: dict | None) -> dict | None:
    """Pure: the last restart as ``status`` shows it: ``at``, ``action``, ``why``,
    ``reasons`` and the line (``text``); None when no restart was recorded."""
    if not entry:
        return None
    return {"at": entry.get("at"), "action": entry.get("action"), "why": entry.get("why") or "",
            "reasons": list(entry.get("reasons") or []),
            "text": restart.last_restart_text(entry)}


def model_memory(hoststate: dict) -> dict | None:
    """Pure: the served model's shards in the page cache (``core.residency``): bytes, percent,
    MemAvailable/MemTotal and the line ``status`` shows; None without a shard on the host."""
    res = residency.Residency.of(hoststate.get("model"), hoststate.get("memory"))
    return None if res is None else {**res.as_json(), "text": res.text()}


def record(state, host, ctx, serving: dict | None, extra: dict | None = None) -> None:
    """Record the host's drift and state (``ServingProbe``: SERVING); EXTRA: more fields (a
    group's node: ``groupops.group_fields``)."""
    journal.record(host.name, shape.PLAN, {
        "host": host.name, "preflight": "pass", "changes": changes(state, host),
        # the model folder the deploy serves (a new revision's: ``staging.model_revision``)
        **status_fields({**ctx.hoststate.raw, "model": ctx.hoststate.model}, serving,
                        ctx.release_id),
        # the GPU health read, judged (``core.gpuhealth``: the pre-flight's ``gpugate.report``)
        "gpu_health": getattr(ctx, "gpu_report", None), **(extra or {})})
