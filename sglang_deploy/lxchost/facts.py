"""pyinfra facts of the LXC host (no decisions here: ``core.lxchost`` parses and decides).

Two round trips per run and container at most: ``LxcHostState`` (the NVIDIA driver's majors,
nodes, module version, cgroup layout, GPUs, the container managers) once per host, and
``LxcContainerState`` (exists, config bytes, the tool's record, running, serving, the driver
libraries inside) once per container. Config files and records travel base64-encoded, so
that their bytes are compared exactly.
"""

from __future__ import annotations

import base64
import shlex
from dataclasses import dataclass

from pyinfra.api import FactBase

from sglang_deploy.core.lxchost import containers, facts, incus, userspace

MARK = "@@lxc-host:"
#: where the tool keeps each container's Record JSON on the LXC host (data: lxc_record_dir)
RECORD_DIR = "/var/lib/sglang-deploy/lxc-host"
#: the container manager's client per dialect (LXD's is `lxc`)
_CLIENT = incus.CLIENT


def sections(output: list[str]) -> dict[str, str]:
    """The output of a command made of ``echo MARK<name>`` sections -> name -> text."""
    out: dict[str, list[str]] = {}
    current = None
    for line in output:
        if line.startswith(MARK):
            current = line[len(MARK):].strip()
            out[current] = []
        elif current is not None:
            out[current].append(line)
    return {k: "\n".join(v) + ("\n" if v else "") for k, v in out.items()}


def _section(name: str, command: str) -> str:
    return f"echo '{MARK}{name}'; {command}"


#: the host's part, each command as core.lxchost names it
HOST_SECTIONS = (
    ("proc-devices", facts.PROC_DEVICES_COMMAND),
    ("nodes", facts.NODES_COMMAND),
    ("version", facts.MODULE_VERSION_COMMAND),
    ("cgroup", facts.CGROUP_COMMAND),
    ("gpus", facts.GPUS_COMMAND),
    ("managers", containers.DETECT_COMMAND),
    ("pveversion", "command -v pveversion >/dev/null && pveversion -v 2>/dev/null; true"),
)


class LxcHostState(FactBase):
    """The raw text of each ``HOST_SECTIONS`` command (name -> stdout), in one round trip.
    ``nvidia-modprobe -u -c=0`` runs first where it exists: it loads nvidia_uvm and makes its
    nodes (what the driver does on a GPU's first use, and what the boot unit does), so that
    the majors read are the ones the containers will see."""

    def command(self) -> str:
        load = "command -v nvidia-modprobe >/dev/null && nvidia-modprobe -u -c=0 >/dev/null 2>&1"
        return "; ".join([f"{{ {load}; true; }}"] + [_section(n, c) for n, c in HOST_SECTIONS])

    def process(self, output: list[str]) -> dict[str, str]:
        return sections(output)


@dataclass(frozen=True)
class ContainerCommands:
    """The shell commands that read one container on the LXC host, per dialect."""

    dialect: str
    name: str
    ctid: int | None = None
    lxc_path: str = containers.LXC_PATH

    @property
    def config_path(self) -> str | None:
        """The config file the tool edits (None for LXD/Incus: their CLI edits it)."""
        if self.dialect == "lxc":
            return f"{self.lxc_path}/{self.name}/config"
        if self.dialect == "proxmox":
            return f"/etc/pve/lxc/{self.ctid}.conf"
        return None

    @property
    def exec_prefix(self) -> str:
        """The command line prefix that runs a command in the running container."""
        q = shlex.quote
        if self.dialect == "lxc":
            return f"lxc-attach -P {q(self.lxc_path)} -n {q(self.name)} --"
        if self.dialect == "proxmox":
            return f"pct exec {self.ctid} --"
        return f"{_CLIENT[self.dialect]} exec {q(self.name)} --"

    @property
    def exists(self) -> str:
        """Succeeds when the container exists."""
        if self.config_path:
            return f"test -f {shlex.quote(self.config_path)}"
        return f"{_CLIENT[self.dialect]} info {shlex.quote(self.name)} >/dev/null 2>&1"

    @property
    def state(self) -> str:
        """Prints RUNNING when the container runs (anything else: it does not)."""
        q = shlex.quote
        if self.dialect == "lxc":
            return f"lxc-info -P {q(self.lxc_path)} -n {q(self.name)} -sH 2>/dev/null"
        if self.dialect == "proxmox":
            return (f"pct status {self.ctid} 2>/dev/null | sed -n 's/^status: running$/RUNNING/p'")
        return (f"{_CLIENT[self.dialect]} list {q(self.name)} -c s -f csv 2>/dev/null "
                "| tr a-z A-Z")

    @property
    def show_config(self) -> str:
        """Prints the config, base64 (file dialects) or as YAML (LXD/Incus)."""
        if self.config_path:
            return f"base64 -w0 {shlex.quote(self.config_path)} 2>/dev/null; echo"
        return shlex.join(incus.config_show_command(self.dialect, self.name)) + " 2>/dev/null"


class LxcContainerState(FactBase):
    """One container on the LXC host: ``exists`` (bool), ``config`` (the file's exact text,
    or LXD/Incus ``config show``'s YAML; None when missing), ``record`` (the tool's Record
    JSON text, None without), ``running``, ``init`` (its init PID, plain LXC), ``serving`` (its SGLang unit is active: ``systemctl
    is-active SERVICE`` inside), ``libraries`` and ``os_release`` (read inside a running
    container; None when it is not running)."""

    def command(self, dialect: str, container: str, ctid: int | None = None,
                lxc_path: str = containers.LXC_PATH, record_path: str = "",
                service: str = "sglang") -> str:
        c = ContainerCommands(dialect, container, ctid, lxc_path)
        inside = c.exec_prefix
        running = f'[ "$({c.state})" = RUNNING ]'
        unit = shlex.quote(f"{service}.service")
        parts = [
            _section("exists", f"{c.exists} && echo yes || echo no"),
            _section("config-b64" if c.config_path else "config-yaml", c.show_config),
            _section("record", f"base64 -w0 {shlex.quote(record_path)} 2>/dev/null; echo"),
            _section("running", f"{running} && echo yes || echo no"),
            f"if {running}; then "
            + (_section("init", f"lxc-info -P {shlex.quote(lxc_path)} -n {shlex.quote(container)}"
                                " -pH 2>/dev/null") + "; " if dialect == "lxc" else "")
            + _section("serving", f"{inside} systemctl is-active {unit} 2>/dev/null; true") + "; "
            + _section("libraries", f"{inside} sh -c {shlex.quote(userspace.LIBS_COMMAND)}; true")
            + "; "
            + _section("os-release", f"{inside} {userspace.OS_RELEASE_COMMAND} 2>/dev/null; true")
            + "; fi",
        ]
        return "; ".join(parts)

    def process(self, output: list[str]) -> dict:
        s = sections(output)
        exists = s.get("exists", "").strip() == "yes"

        def b64(key: str) -> str | None:
            raw = s.get(key, "").strip()
            return base64.b64decode(raw).decode() if raw else None

        config = (b64("config-b64") or "") if "config-b64" in s else s.get("config-yaml")
        running = s.get("running", "").strip() == "yes"
        return {
            "exists": exists,
            "config": config if exists else None,
            "record": b64("record"),
            "running": running,
            "init": (s.get("init") or "").strip() or None if running else None,
            "serving": running and s.get("serving", "").strip() == "active",
            "libraries": s.get("libraries") if running else None,
            "os_release": s.get("os-release") if running else None,
        }
