"""Which CUDA probe a deploy runs, from the host state (pure), and the checks that stand in for
the probe when a verified server serves."""

from __future__ import annotations

from typing import Any, Mapping

from sglang_deploy.core.preflight.checks import Check


def probe_plan(service: Mapping[str, Any], last_verified: Mapping[str, Any] | None,
               p2p_verified: Mapping[str, Any] | None, p2p_test: str) -> str:
    """Which CUDA probe the pre-flight runs, from the host-state read:

    - ``"p2p"``: init, devices and the data-verified peer copies: ``gpu_p2p_test: always``,
      or the service is not serving, or no full P2P test has passed on this host yet;
    - ``"basic"``: init and devices: the service serves and the last P2P verdict stands, but
      the running server was never verified by a deploy (e.g. started at boot);
    - ``"none"``: the service serves the very invocation a deploy verified
      (``last_verified.invocation`` is its ``InvocationID``). That server initialised CUDA on
      these GPUs and serves from them, which proves more than the probe does; a run that
      would restart it probes first, with the peer copies (``stages.full_p2p_check``).

    ``service``: the ``systemctl show`` properties; ``last_verified``/``p2p_verified``: the
    host's records (None when absent)."""
    serving = service.get("ActiveState") == "active" and service.get("SubState") == "running"
    if p2p_test == "always" or not (serving and p2p_verified):
        return "p2p"
    invocation = service.get("InvocationID")
    if invocation and (last_verified or {}).get("invocation") == invocation:
        return "none"
    return "basic"


CUDA_PROBE_CHECKS = ("cuda-init", "cuda-devices")


def use_verified_server(checks: list[Check], service: str,
                        last_verified: Mapping[str, Any]) -> list[Check]:
    """Checks when the CUDA probe did not run because SERVICE serves a verified invocation
    (``probe_plan`` said ``"none"``): its server stands for the probe's init and device checks."""
    kept = [c for c in checks if c.name not in CUDA_PROBE_CHECKS]
    invocation = str(last_verified.get("invocation") or "?")
    kept.append(Check("cuda-init", "pass",
                      f"CUDA probe skipped while {service} serves invocation {invocation[:12]}, "
                      f"verified at {last_verified.get('verified_at', '?')}: its server runs CUDA "
                      f"on these GPUs; the probe runs, with the peer copies, before any restart"))
    return kept


