"""The passthrough lines a plain-LXC or Proxmox container should have (pure), from the
host's facts: one device rule per NVIDIA major that is passed, one bind mount per node,
or, on Proxmox VE 8.1 and newer, one ``devN:`` entry per node.

The lines are ``Directive`` values (key, value), rendered per dialect by ``render``; the
index of a Proxmox ``devN`` is chosen when merging into the file (``confmerge``), so that
the operator's own ``devN`` stay where they are.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sglang_deploy.core.errors import LxcHostError
from sglang_deploy.core.lxchost.facts import DevNode, HostFacts, check_host

#: the dialects whose config is a file this package writes lines into
FILE_DIALECTS = ("lxc", "proxmox")
#: a Proxmox ``devN`` directive's key (its index is chosen by ``confmerge``)
DEV = "dev"
MOUNT = "lxc.mount.entry"
#: the device-rule key per cgroup version
RULE_KEY = {1: "lxc.cgroup.devices.allow", 2: "lxc.cgroup2.devices.allow"}
#: a node's mode in the container when the listing has none (devN's own default is 0660,
#: which would keep the service's non-root user from the GPUs)
DEFAULT_MODE = {"gpu": "0666", "ctl": "0666", "uvm": "0666", "cap": "0444"}


@dataclass(frozen=True)
class Directive:
    """One config line's key and value: ``lxc.cgroup2.devices.allow`` / ``c 195:* rwm``,
    ``lxc.mount.entry`` / ``/dev/nvidia0 dev/nvidia0 none bind,optional,create=file``, or
    ``dev`` / ``/dev/nvidia0,mode=0666`` (a Proxmox ``devN``, its N chosen at merge)."""

    key: str
    value: str


def render(directive: Directive, dialect: str, index: int | None = None) -> str:
    """The config line of DIRECTIVE in DIALECT's syntax, without a newline: plain LXC
    ``key = value``, Proxmox ``key: value`` (``devINDEX: value`` for a ``dev``)."""
    if directive.key == DEV:
        if dialect != "proxmox" or index is None:
            raise ValueError("a dev directive is a Proxmox devN: give its index")
        return f"dev{index}: {directive.value}"
    return f"{directive.key} = {directive.value}" if dialect == "lxc" \
        else f"{directive.key}: {directive.value}"


def select_gpus(facts: HostFacts, gpus: Sequence[int] | None) -> tuple[int, ...]:
    """The GPU numbers (N of /dev/nvidiaN) to pass: all the host has when GPUS is None,
    else GPUS in order. Raises ``LxcHostError`` naming those the host does not have."""
    have = facts.gpu_minors
    if gpus is None:
        return have
    missing = [n for n in gpus if n not in have]
    if missing:
        raise LxcHostError(
            "the GPUs the container's `gpus` names on the LXC host",
            found=f"no /dev/nvidia{missing[0]}" + (f" (nor {missing[1:]})" if missing[1:] else "")
            + f"; the host has GPUs {list(have)}",
            fix="name only GPUs the host has in `gpus` (the N of /dev/nvidiaN), or leave "
                "`gpus` out to pass them all")
    return tuple(gpus)


def _passed_nodes(facts: HostFacts, minors: Sequence[int]) -> list[DevNode]:
    gpus = {f"/dev/nvidia{n}": n for n in minors}
    by_path = {n.path: n for n in facts.nodes}
    nodes = [by_path[p] for p in gpus if p in by_path]
    nodes += [n for role in ("ctl", "uvm") for n in facts.by_role(role)]
    return nodes


def device_rules(facts: HostFacts, minors: Sequence[int]) -> list[Directive]:
    """One ``c MAJOR:* rwm`` rule per passed major (gpu, uvm, caps when its folder exists);
    when only some GPUs are passed, the GPU major gets one rule per passed minor and one
    for nvidiactl (255) instead, so that the cgroup itself keeps the others out."""
    key, majors = RULE_KEY[facts.cgroup], facts.majors
    if set(minors) == set(facts.gpu_minors):
        rules = [f"c {majors.gpu}:* rwm"]
    else:
        rules = [f"c {majors.gpu}:{n} rwm" for n in minors] + [f"c {majors.gpu}:255 rwm"]
    if majors.uvm is not None:
        rules.append(f"c {majors.uvm}:* rwm")
    if majors.caps is not None and facts.by_role("caps-dir"):
        rules.append(f"c {majors.caps}:* rwm")
    return [Directive(key, r) for r in rules]


def mount_entries(facts: HostFacts, minors: Sequence[int]) -> list[Directive]:
    """One bind mount per passed node (GPUs, nvidiactl, nvidia-uvm, nvidia-uvm-tools) and
    one for the ``/dev/nvidia-caps`` folder when it exists; ``optional`` so that a node
    missing at start does not keep the container from starting."""
    out = [Directive(MOUNT, f"{n.path} {n.path[1:]} none bind,optional,create=file")
           for n in _passed_nodes(facts, minors)]
    out += [Directive(MOUNT, f"{d.path} {d.path[1:]} none bind,optional,create=dir")
            for d in facts.by_role("caps-dir")]
    return out


def dev_entries(facts: HostFacts, minors: Sequence[int]) -> list[Directive]:
    """Proxmox ``devN`` values: one per passed node and per capability node, each with the
    host node's mode (``DEFAULT_MODE`` when unknown)."""
    nodes = _passed_nodes(facts, minors) + list(facts.by_role("cap"))
    return [Directive(DEV, f"{n.path},mode={n.mode or DEFAULT_MODE[n.role]}") for n in nodes]


def desired_directives(dialect: str, facts: HostFacts, gpus: Sequence[int] | None = None,
                       *, dev_entries_ok: bool = False) -> tuple[Directive, ...]:
    """The passthrough a plain-LXC (``lxc``) or Proxmox (``proxmox``) container should have:
    ``devN`` entries on Proxmox when DEV_ENTRIES_OK (``pve.PveVersion.dev_entries``), else
    device rules then bind mounts. Raises ``LxcHostError`` when the host cannot pass its
    GPUs (``facts.check_host``) or lacks a GPU GPUS names."""
    if dialect not in FILE_DIALECTS:
        raise ValueError(f"dialect {dialect!r} has no config file lines (incus/lxd: incus.py)")
    check_host(facts)
    minors = select_gpus(facts, gpus)
    if dialect == "proxmox" and dev_entries_ok:
        return tuple(dev_entries(facts, minors))
    return tuple(device_rules(facts, minors) + mount_entries(facts, minors))
