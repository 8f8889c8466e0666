"""Whether a container restarts for a passthrough change, and how (pure).

A container config change takes effect only when the container starts again, which stops
the server in it. ``decide`` weighs what changed against what it would interrupt and the
container's ``restart`` data key (``containers.RESTART_POLICIES``).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from sglang_deploy.core.lxchost.containers import LXC_PATH

#: the actions of a RestartDecision
NOTHING, NEEDED, START, RESTART, DRAIN = "nothing", "needed", "start", "restart", "drain"


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

    @property
    def command(self) -> str:
        """The argv as one shell command line (``lxc-stop -n c1 && lxc-start -n c1``)."""
        return " && ".join(shlex.join(a) for a in self.argv)


def decide(dialect: str, name: str, *, changed: bool, running: bool, serving: bool,
           policy: str = "when-idle", behind_router: bool = False,
           ctid: int | None = None, lxc_path: str = LXC_PATH) -> RestartDecision:
    """The decision for container NAME whose passthrough CHANGED (or not). A stopped
    container is started; a running one that serves nothing is restarted; a serving one is
    restarted only under POLICY ``now`` (through the router's drain when BEHIND_ROUTER),
    else (``when-idle``, ``never``) the restart is reported as needed with its command.
    ``never`` also leaves a running container that serves nothing alone."""
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
    if policy == "now" and behind_router:
        return RestartDecision(DRAIN, "the GPU passthrough changed (restart: now): the router "
                                      "drains this server, then the container restarts", argv)
    if policy == "now":
        return RestartDecision(RESTART, "the GPU passthrough changed (restart: now): restarting "
                                        "the serving container; its server stops meanwhile", argv)
    return RestartDecision(NEEDED, "the GPU passthrough changed but the container is serving "
                                   "(restart: when-idle): restart it when convenient", argv)
