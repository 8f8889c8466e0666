"""Per-host deploy summary: what runs, in what state, and how long startup took (pure).

Writing it (and the P2P matrix) to the controller's report folders: ``controller/reports.py``."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sglang_deploy.core.verify import Decision


def host_summary(name: str, params: dict[str, Any], decision: Decision) -> dict[str, Any]:
    """The summary of one verification: PARAMS (``service.verify_params``) and the verifier's
    decision."""
    d = decision.details
    return {
        "host": name,
        "release": params["release"],
        "sglang_version": params["sglang_version"],
        "patch_state": params.get("patch_state"),
        "served_model_name": params["served_model_name"],
        "invocation": d.get("invocation"),
        "phase_durations_s": {k: round(v, 2) for k, v in (d.get("phase_durations") or {}).items()},
        "time_to_ready_s": d.get("time_to_ready_s"),
        # wall clock (epoch s) of the ready decision on the controller, for latency measurements
        "verified_epoch_s": round(time.time(), 3),
        "nccl_env": params.get("nccl_env") or {},
    }


def format_summary(summary: dict[str, Any]) -> str:
    if summary.get("node_rank"):  # a group's node of rank >= 1: up, it serves through rank 0
        how = ("not restarted" if summary.get("action") in ("converged", "unchanged")
               else f"up after {summary['time_to_ready_s']}s")
        return (f"UP {summary['host']}: node {summary['node_rank']} of group "
                f"{summary['group']}, sglang {summary['sglang_version']} (release "
                f"{summary['release']}), autotune patch {summary['patch_state']}; {how} "
                "(unit running, /health 200; the API is served by rank 0)")
    if summary.get("action") in ("converged", "unchanged"):
        return (f"SERVING {summary['host']}: sglang {summary['sglang_version']} (release "
                f"{summary['release']}), autotune patch {summary['patch_state']}, serving "
                f"`{summary['served_model_name']}`; not restarted (health, models and a "
                "generation checked)")
    phases = ", ".join(f"{k} {v:.1f}s" for k, v in summary["phase_durations_s"].items())
    return (f"READY {summary['host']}: sglang {summary['sglang_version']} (release "
            f"{summary['release']}), autotune patch {summary['patch_state']}, serving "
            f"`{summary['served_model_name']}`; phases: {phases or 'n/a'}; time to ready "
            f"{summary['time_to_ready_s']}s"
            + (f"; NCCL env {summary['nccl_env']}" if summary["nccl_env"] else ""))
