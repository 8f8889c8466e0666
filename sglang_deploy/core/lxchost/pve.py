"""Proxmox VE's version, and what its container configs accept (pure).

``devN:`` entries (``dev0: /dev/nvidia0,mode=0666``) came with pve-container 5.0.7
("allow passing raw device nodes through to containers", 21 November 2023: commit
ce1976b "Add device passthrough"), the package of Proxmox VE 8.1. At every container
start Proxmox creates such a node with the major and minor the host's node has *then*,
and allows exactly that major:minor in the container's cgroup: a new ``nvidia-uvm`` major
after a kernel or driver update needs no config change. Older Proxmox VE needs the
``lxc.cgroup2.devices.allow:`` and ``lxc.mount.entry:`` lines, whose majors the tool
rewrites when they change.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sglang_deploy.core.errors import LxcHostError

#: what the shell runs on a Proxmox VE host for ``parse_pveversion`` (``-v``: the packages)
PVEVERSION_COMMAND = "pveversion -v"
#: the first pve-container with ``devN:`` entries, and the Proxmox VE release that has it
DEV_ENTRIES_CONTAINER = (5, 0, 7)
DEV_ENTRIES_MANAGER = (8, 1)


@dataclass(frozen=True)
class PveVersion:
    """The versions ``pveversion`` (or ``pveversion -v``) gives: pve-manager's (always) and
    pve-container's (only ``-v`` lists it), as tuples of ints."""

    manager: tuple[int, ...]
    container: tuple[int, ...] | None = None

    @property
    def dev_entries(self) -> bool:
        """Whether this Proxmox VE's containers take ``devN:`` entries (pve-container
        5.0.7 or newer; without its version, pve-manager 8.1 or newer)."""
        if self.container is not None:
            return self.container >= DEV_ENTRIES_CONTAINER
        return self.manager[:2] >= DEV_ENTRIES_MANAGER


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", text))


def parse_pveversion(text: str) -> PveVersion:
    """``pveversion`` (``pve-manager/8.2.4/faa83925c9641325 (running kernel: ...)``) or
    ``pveversion -v`` (``pve-manager: 8.2.2 (running version: ...)``, ``pve-container:
    5.0.12``) -> ``PveVersion``. Raises ``LxcHostError`` when there is no pve-manager
    version (not a Proxmox VE host)."""
    manager = re.search(r"^pve-manager[/:]\s*(\d+(?:\.\d+)*)", text, re.MULTILINE)
    if not manager:
        raise LxcHostError("a Proxmox VE host (`pveversion` naming pve-manager)",
                           found=(text.strip().splitlines() or ["nothing"])[0][:200],
                           fix="set the container's `dialect` to `lxc`, `incus` or `lxd` "
                               "if this host is not Proxmox VE")
    container = re.search(r"^pve-container:\s*(\d+(?:\.\d+)*)", text, re.MULTILINE)
    return PveVersion(_version(manager.group(1)),
                      _version(container.group(1)) if container else None)
