"""Which CUDA probe a deploy runs, from the host state (pure), and the checks that stand in
for the probe when a verified server serves (or a read-only command leaves the GPUs of a unit
that is up alone). Whether P2P is retested before a restart: ``core.restart``."""

from __future__ import annotations

from sglang_deploy.core.hostrecords import LastVerified, P2PVerified
from sglang_deploy.core.hoststate import ServiceState
from sglang_deploy.core.preflight.checks import Check


def probe_plan(service: ServiceState, last_verified: LastVerified | None,
               p2p_verified: P2PVerified | None, p2p_test: str,
               read_only: bool = False) -> str:
    """Which CUDA probe the pre-flight runs, from the host-state read:

    - ``"none"`` first of all when READ_ONLY (``status``, ``rollout --dry``, ``report``,
      ``deploy.py --dry``) and the unit is up (active, activating or reloading: it serves,
      starts, or waits to restart after a crash): a read-only command never touches the GPUs
      a server holds or is about to take, whatever ``gpu_p2p_test`` says; the run retests P2P
      once that server has stopped, when it replaces it (``restart.Decision.retest``);
    - ``"basic"``: init and devices: the unit is up but does not serve (activating: starting,
      or a crash loop), whatever is recorded, unless ``gpu_p2p_test: always``: the copies
      wait for the retest, after the stop;
    - ``"p2p"``: init, devices and the data-verified peer copies: ``gpu_p2p_test: always``,
      or the unit is not up (no server on the GPUs), or no full P2P test has passed on this
      host yet;
    - ``"basic"``: init and devices: the service serves and the last P2P verdict stands, but
      the running server was never verified by a deploy (e.g. started at boot);
    - ``"none"``: the service serves the very invocation a deploy verified
      (``last_verified.invocation`` is its ``InvocationID``). That server initialised CUDA on
      these GPUs and serves from them, which proves more than the probe does; a run that
      replaces it retests first, with the peer copies, once it has stopped.

    ``service``: the unit's state; ``last_verified``/``p2p_verified``: the host's records
    (None when absent)."""
    if read_only and service.up:
        return "none"
    if p2p_test != "always" and service.up and not service.serving:
        return "basic"
    if p2p_test == "always" or not (service.up and p2p_verified):
        return "p2p"
    invocation = service.invocation_id
    if invocation and last_verified is not None and last_verified.invocation == invocation:
        return "none"
    return "basic"


RETEST_NOTE = "P2P will be retested before the restart"
CUDA_PROBE_CHECKS = ("cuda-init", "cuda-devices")
P2P_COPY_CHECKS = ("p2p-data", "p2p-bandwidth")


def use_verified_server(checks: list[Check], service: str,
                        last_verified: LastVerified | None,
                        p2p_verified: P2PVerified | None = None,
                        read_only: bool = False) -> list[Check]:
    """Checks when the CUDA probe did not run (``probe_plan`` said ``"none"``): SERVICE serves
    a verified invocation, whose server stands for the probe's init and device checks, or
    (READ_ONLY) a read-only command left a serving host's GPUs alone. Without a recorded P2P
    verdict (P2P_VERIFIED None) the copy checks say when they will run."""
    kept = [c for c in checks if c.name not in CUDA_PROBE_CHECKS]
    verified = last_verified or LastVerified()
    invocation = verified.invocation or "?"
    if read_only:
        kept.append(Check("cuda-init", "pass",
                          f"CUDA probe not run: a read-only command leaves the GPUs of the "
                          f"serving {service} alone; {RETEST_NOTE}"))
    else:
        kept.append(Check("cuda-init", "pass",
                          f"CUDA probe skipped while {service} serves invocation {invocation[:12]}, "
                          f"verified at {verified.verified_at or '?'}: its "
                          f"server runs CUDA on these GPUs; the probe runs, with the peer copies, "
                          f"before any restart"))
    if read_only and p2p_verified is None:
        kept = [c for c in kept if c.name not in P2P_COPY_CHECKS]
        kept.append(Check("p2p-data", "pass",
                          f"peer copies not run while {service} serves (no P2P test recorded on "
                          f"this host yet); {RETEST_NOTE}"))
    return kept


