"""Whether a container restarts for a passthrough change, and how (pure).

A container config change takes effect only when the container starts again, which stops
the server in it. ``decide`` weighs what changed against what it would interrupt and the
container's ``restart`` data key (``containers.RESTART_POLICIES``).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from sglang_deploy.core.errors import LxcHostError
from sglang_deploy.core.lxchost.containers import LXC_PATH, Serves

#: the actions of a RestartDecision
NOTHING, NEEDED, START, RESTART, DRAIN = "nothing", "needed", "start", "restart", "drain"
#: the steps of a restart, in order (``RestartDecision.steps``): out of the router, the
#: container's restart, its boot, its server verified by the fleet's deploy, back in
DRAIN_STEP, RESTART_STEP, BOOT_STEP, VERIFY_STEP, PUT_BACK_STEP = (
    "drain", "restart", "boot", "verify", "put-back")


def _lxc(command: str, name: str, lxc_path: str) -> tuple[str, ...]:
    """A plain-LXC command on NAME, with ``-P LXC_PATH`` when that is not LXC's default."""
    return (command, *(() if lxc_path == LXC_PATH else ("-P", lxc_path)), "-n", name)


def start_argv(dialect: str, name: str, ctid: int | None = None, *,
               lxc_path: str = LXC_PATH) -> tuple[tuple[str, ...], ...]:
    """The argv that starts a stopped container of DIALECT (Proxmox: by CTID; plain LXC:
    in LXC_PATH)."""
    return {"lxc": (_lxc("lxc-start", name, lxc_path),),
            "proxmox": (("pct", "start", str(ctid)),),
            "incus": (("incus", "start", name),),
            "lxd": (("lxc", "start", name),)}[dialect]


def restart_argv(dialect: str, name: str, ctid: int | None = None, *,
                 lxc_path: str = LXC_PATH) -> tuple[tuple[str, ...], ...]:
    """The argv (in order) that restart a running container of DIALECT: plain LXC stops and
    starts it (``lxc-stop -n NAME``, ``lxc-start -n NAME``), Proxmox ``pct reboot CTID``,
    Incus ``incus restart NAME``, LXD ``lxc restart NAME``."""
    return {"lxc": (_lxc("lxc-stop", name, lxc_path), _lxc("lxc-start", name, lxc_path)),
            "proxmox": (("pct", "reboot", str(ctid)),),
            "incus": (("incus", "restart", name),),
            "lxd": (("lxc", "restart", name),)}[dialect]


@dataclass(frozen=True)
class RestartDecision:
    """``action``: ``nothing``; ``needed`` (a restart is due but not done: ``command`` says
    how); ``start`` (stopped: start it); ``restart`` (now); ``drain`` (restart now, through
    the router's drain of this server first). ``reason`` says why; ``argv`` is what to run
    for the action, or for ``needed`` what the operator runs."""

    action: str
    reason: str
    argv: tuple[tuple[str, ...], ...] = ()
    #: a serving container's restart whose server is verified by the fleet's deploy after
    #: its boot (the container's data names the server it holds: ``serves``)
    verify: bool = False

    @property
    def steps(self) -> tuple[str, ...]:
        """What the run does, in order: ``drain`` (out of the router), ``restart`` (or the
        start), ``boot``, ``verify`` (the fleet's deploy of that host), ``put-back``; none
        for ``nothing`` and ``needed``."""
        if self.action not in (START, RESTART, DRAIN):
            return ()
        steps = (RESTART_STEP, BOOT_STEP) + ((VERIFY_STEP,) if self.verify else ())
        return (DRAIN_STEP, *steps, PUT_BACK_STEP) if self.action == DRAIN else steps

    @property
    def command(self) -> str:
        """The argv as one shell command line (``lxc-stop -n c1 && lxc-start -n c1``)."""
        return " && ".join(shlex.join(a) for a in self.argv)


def decide(dialect: str, name: str, *, changed: bool, running: bool, serving: bool,
           policy: str = "when-idle", behind_router: bool = False, serves: bool = False,
           ctid: int | None = None, lxc_path: str = LXC_PATH) -> RestartDecision:
    """The decision for container NAME whose passthrough CHANGED (or not). A stopped
    container is started; a running one that serves nothing is restarted; a serving one is
    restarted only under POLICY ``now`` (through the router's drain when BEHIND_ROUTER,
    its server then verified by the fleet's deploy when the data names it: SERVES), else
    (``when-idle``, ``never``) the restart is reported as needed with its command.
    ``never`` also leaves a running container that serves nothing alone. BEHIND_ROUTER
    without SERVES is not possible: the router is the one that fronts the server named."""
    argv = restart_argv(dialect, name, ctid, lxc_path=lxc_path)
    if not changed:
        return RestartDecision(NOTHING, "the GPU passthrough is unchanged")
    if not running:
        return RestartDecision(START, "the container is stopped; it starts with the new GPU "
                                      "passthrough",
                              start_argv(dialect, name, ctid, lxc_path=lxc_path))
    if policy == "never":
        return RestartDecision(NEEDED, "the GPU passthrough changed; restart: never keeps the "
                                       "running container as it is until you restart it", argv)
    if not serving:
        return RestartDecision(RESTART, "the GPU passthrough changed and the container serves "
                                        "nothing: restarting it now", argv)
    if policy == "now" and behind_router and serves:
        return RestartDecision(DRAIN, "the GPU passthrough changed (restart: now): the router "
                                      "drains this server, then the container restarts, its "
                                      "server is verified and put back", argv, verify=True)
    if policy == "now":
        return RestartDecision(RESTART, "the GPU passthrough changed (restart: now): restarting "
                                        "the serving container; its server stops meanwhile"
                                        + (", then is verified" if serves else ""), argv,
                               verify=serves)
    return RestartDecision(NEEDED, "the GPU passthrough changed but the container is serving "
                                   "(restart: when-idle): restart it when convenient", argv)


def step_failed(container: str, serves: Serves, step: str, found: str,
                routed: bool) -> LxcHostError:
    """The error of a serving restart (``RestartDecision.steps``) that failed at STEP (FOUND:
    what was seen), for SERVES' host, which stays out of its router when ROUTED: what was
    expected, what was found, and how it goes back (``sglang-deploy rebuild``: the fleet's
    deploy of that host, then the put back, only once verified)."""
    host, back = serves.host, serves.rebuild_command()
    out = (f"; {host} stays out of the router (drained) until then" if routed else "")
    expected = {
        DRAIN_STEP: f"{host} drained out of its router before {container} restarts",
        RESTART_STEP: f"the container {container} restarted",
        BOOT_STEP: f"the container {container} booted again (systemd running)",
        VERIFY_STEP: f"{host}'s server verified serving in the restarted container {container} "
                     f"(`{serves.deploy_command()}`)",
        PUT_BACK_STEP: f"{host} back in its router, routed to again",
    }[step]
    fix = {
        DRAIN_STEP: f"{container} was not restarted. Find what keeps {host}'s requests running "
                    "(or raise `rollout_drain_timeout_s`), then run lxc_host.py again (the "
                    f"restart is still due), or put {host} back as it is with `{back}`",
        RESTART_STEP: f"check the container (its manager's status and console log), start it, "
                      f"then `{back}` verifies {host} and puts it back",
        BOOT_STEP: f"check why {container} does not boot (its console log), then `{back}` "
                   f"verifies {host} and puts it back",
        VERIFY_STEP: f"fix what the deploy reported above, then `{back}` verifies {host} "
                     "and puts it back",
        PUT_BACK_STEP: f"{host} is verified serving; check the router (`sglang-deploy status`, "
                       f"its journal), then `{back}` puts it back",
    }[step]
    return LxcHostError(expected, found=found, fix=fix + out)
