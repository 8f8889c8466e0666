"""pyinfra operations of ``lxc_host.py``: what ``core.lxchost.hostplan`` planned, applied.

``lxc_host_stage`` reads the facts, plans every container of the host (each check before
anything changes), then adds the operations: nvidia_uvm at boot, each container's creation
(plain LXC, ``pct create``, ``incus init`` / ``lxc init``: none starts it), its passthrough
(the config file; a new Proxmox container's ``pct set --devN`` or lines appended to pct's
file), record, LXD/Incus device commands, and its restart as ``restart.decide`` says (a
new container: started, waited for, its SSH host key fingerprint printed). A restart that
is due but not done is told with its command (``restart needed``). A serving container
whose data names its server restarts through the router's drain and the fleet's deploy
(``serving``).
"""

from __future__ import annotations

import shlex
from io import StringIO

from pyinfra import host, logger
from pyinfra.operations import files, python, server

from sglang_deploy.core import errors
from sglang_deploy.core.lxchost import hostplan, restart
from sglang_deploy.core.lxchost.hostplan import ContainerPlan, HostInfo
from sglang_deploy.integration.pyinfraerror import for_pyinfra
from sglang_deploy.lxchost import serving
from sglang_deploy.lxchost.facts import ContainerCommands, LxcContainerState, LxcHostState

MODULES_LOAD = "/etc/modules-load.d/nvidia-uvm.conf"
UNIT_NAME = "nvidia-uvm-nodes.service"
UNIT_PATH = f"/etc/systemd/system/{UNIT_NAME}"
UNIT_LINK = f"/etc/systemd/system/multi-user.target.wants/{UNIT_NAME}"
#: the oneshot unit that makes the nvidia-uvm nodes at every boot (the module alone makes
#: none until CUDA's first use: a container started before that would find no node to bind)
UNIT_TEXT = """\
# written by sglang-deploy (lxc_host.py): the nvidia-uvm device nodes at boot, before any
# container with GPUs starts
[Unit]
Description=NVIDIA unified-memory module and device nodes (for GPU containers)
After=systemd-modules-load.service
Before=lxc.service pve-guests.service incus.service snap.lxd.daemon.service

[Service]
Type=oneshot
ExecStart=/usr/bin/nvidia-modprobe -u -c=0
RemainAfterExit=yes

[Install]
WantedBy=multi-user.target
"""
#: how long a started container may take to run systemd (running or degraded)
BOOT_DEADLINE_S = 180
FINGERPRINT = "ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub"


def _tag(name: str) -> str:
    return f"{host.print_prefix}[{name}] "


def plan_host() -> tuple[HostInfo, list[ContainerPlan], dict[str, list]]:
    """Every container of this host planned, with the routers that front the server of
    each that restarts now while serving and names its server (container name ->
    ``routerctl.Router``s; the serving inventory is read only then), or the first typed
    error (nothing changed)."""
    try:
        info = hostplan.read_host(host.data.dict(), host.get_fact(LxcHostState))
        plans, fronts = [], {}
        for spec in info.specs:
            state = host.get_fact(LxcContainerState, dialect=spec.dialect, container=spec.name,
                                  ctid=spec.ctid, lxc_path=info.lxc_path,
                                  record_path=hostplan.record_path(spec, info.record_dir),
                                  service=str(host.data.get("sglang_service") or "sglang"))
            plan = hostplan.plan_container(spec, info, state)
            if plan.restart.verify:  # a serving restart now: the server's routers, if any
                fronts[spec.name] = serving.fronting(spec.serves)
                if fronts[spec.name]:
                    plan = hostplan.plan_container(spec, info, state, behind_router=True)
            plans.append(plan)
    except errors.SglangDeployError as exc:
        if not exc.what.startswith(f"[{host.name}] "):
            exc.what = f"[{host.name}] {exc.what}"
        raise for_pyinfra(exc) from exc
    return info, plans, fronts


def boot_operations() -> None:
    """nvidia_uvm loaded at every boot and its nodes made by the oneshot unit (enabled by its
    symlink: no systemctl, so that a host without systemd as PID 1 takes it too)."""
    files.put(name="nvidia_uvm loaded at boot (modules-load.d)", src=StringIO("nvidia_uvm\n"),
              dest=MODULES_LOAD, mode="644")
    files.put(name=f"{UNIT_NAME}: the nvidia-uvm nodes at boot", src=StringIO(UNIT_TEXT),
              dest=UNIT_PATH, mode="644")
    files.link(name=f"{UNIT_NAME} enabled", path=UNIT_LINK, target=UNIT_PATH)


def _wait_command(c: ContainerCommands, deadline_s: int) -> str:
    """Polls until the container runs systemd (running or degraded), DEADLINE_S at most;
    on the deadline it fails with the last observation."""
    return (f"end=$(( $(date +%s) + {deadline_s} )); while :; do "
            f"s=$({c.state}); r=$({c.exec_prefix} systemctl is-system-running 2>/dev/null); "
            'case "$r" in running|degraded) echo "$s, systemd $r"; exit 0;; esac; '
            'if [ "$(date +%s)" -ge "$end" ]; then '
            f"echo \"{c.name} not booted within {deadline_s} s: last seen state=${{s:-none}} "
            "systemd=${r:-no answer}\" >&2; exit 1; fi; sleep 1; done")


def _after_boot(plan: ContainerPlan, c: ContainerCommands, info: HostInfo):
    """The new container's SSH host key fingerprint (to check, never accepted silently) and
    its driver user space against the module, read once it runs."""
    def call() -> None:
        name = plan.spec.name
        if plan.create:
            ok, out = host.run_shell_command(f"{c.exec_prefix} {FINGERPRINT}")
            key = out.stdout.strip() if ok else "none yet (" + out.stderr.strip()[:200] + ")"
            logger.warning(
                f"{_tag(name)}new container, new SSH host key: {key}\n"
                "    check this fingerprint (on the container's console: `" + FINGERPRINT
                + "`) before you trust it, then add the key to your known-hosts file as "
                "docs/quickstart.md step 3 says; nothing was written to any known-hosts file")
        if info.facts.module and plan.spec.dialect in ("lxc", "proxmox"):
            from sglang_deploy.core.lxchost import userspace

            _, libs = host.run_shell_command(f"{c.exec_prefix} sh -c "
                                             + shlex.quote(userspace.LIBS_COMMAND))
            _, osr = host.run_shell_command(f"{c.exec_prefix} {userspace.OS_RELEASE_COMMAND}")
            _report_userspace(name, userspace.check(libs.stdout, osr.stdout, info.facts.module))
    return call


def _report_userspace(name: str, finding) -> None:
    if finding is not None and not finding.ok:
        logger.warning(f"{_tag(name)}{finding.summary()}: the driver user space does not match "
                       "the module (CUDA fails with a driver/library mismatch); fix (not done by "
                       "lxc_host.py):\n    " + finding.fix.replace("\n", "\n    "))


def container_operations(plan: ContainerPlan, info: HostInfo, routers: list = ()) -> None:
    """One container's operations, in order: create, passthrough (config file, pct set or
    lines appended), record, LXD/Incus commands, the restart (or its report): through
    ROUTERS' drain and the fleet's deploy when the container's data names its server
    (``serving``)."""
    spec = plan.spec
    c = ContainerCommands(spec.dialect, spec.name, spec.ctid, info.lxc_path)
    for line in plan.warnings:
        logger.warning(f"{_tag(spec.name)}{line}")
    if plan.create:
        server.shell(name=f"[{spec.name}] create from {spec.base_image} (not started)",
                     commands=[" && ".join(shlex.join(a) for a in plan.create.argv)])
    if plan.pct_set:
        server.shell(name=f"[{spec.name}] GPU passthrough: devN entries by pct set",
                     commands=[shlex.join(plan.pct_set)])
    if plan.append_lines and plan.config_path:
        server.shell(name=f"[{spec.name}] GPU passthrough appended to {plan.config_path} "
                          "(after pct's own lines)",
                     commands=[hostplan.append_command(plan.config_path, plan.append_lines)])
    if plan.new_config is not None and plan.config_path:
        files.put(name=f"[{spec.name}] GPU passthrough in {plan.config_path}",
                  src=StringIO(plan.new_config), dest=plan.config_path)
    if plan.new_record is not None and plan.record_path:
        files.directory(name="the passthrough records' folder", path=info.record_dir,
                        mode="700")
        files.put(name=f"[{spec.name}] passthrough record", src=StringIO(plan.new_record),
                  dest=plan.record_path, mode="600")
    for argv in plan.incus_argv:
        server.shell(name=f"[{spec.name}] {shlex.join(argv[2:])}", commands=[shlex.join(argv)])
    decision = plan.restart
    for line in plan.changes:
        logger.info(f"{_tag(spec.name)}{line}")
    if restart.VERIFY_STEP in decision.steps:
        serving.serving_operations(plan, list(routers), decision.command,
                                   _wait_command(c, BOOT_DEADLINE_S), _after_boot(plan, c, info))
    elif decision.action in (restart.START, restart.RESTART):
        server.shell(name=f"[{spec.name}] {decision.action}: {decision.reason}",
                     commands=[decision.command])
        server.shell(name=f"[{spec.name}] booted (systemd running, {BOOT_DEADLINE_S} s at most)",
                     commands=[_wait_command(c, BOOT_DEADLINE_S)])
        python.call(name=f"[{spec.name}] after boot: host key, driver user space",
                    function=_after_boot(plan, c, info))
    elif decision.action == restart.NEEDED:
        logger.warning(f"{_tag(spec.name)}restart needed: {decision.reason}; "
                       f"run `{decision.command}`")
    if not decision.steps:
        _report_userspace(spec.name, plan.userspace)


def lxc_host_stage() -> None:
    """The whole run on this LXC host (``lxc_host.py``)."""
    info, plans, fronts = plan_host()
    boot_operations()
    for plan in plans:
        container_operations(plan, info, fronts.get(plan.spec.name, ()))
