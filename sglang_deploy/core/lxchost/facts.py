"""The LXC host's NVIDIA facts, parsed (pure): which char-device majors the driver holds,
which ``/dev/nvidia*`` nodes exist (and which are stale), the kernel module's version, the
cgroup layout and the GPUs' PCI addresses.

The shell runs the commands below on the LXC host (not in a container) and hands their
stdout to the parsers; ``host_facts`` puts them together, ``check_host`` raises one
``LxcHostError`` listing everything that keeps the GPUs from being passed in.

Which NVIDIA majors are passed into a container, and why:

- ``nvidia`` (``nvidia-frontend`` before driver 550.40): 195, fixed; the GPUs
  (``/dev/nvidiaN``), ``/dev/nvidiactl`` and ``/dev/nvidia-modeset``. Passed.
- ``nvidia-uvm``: assigned when ``nvidia_uvm`` loads, so it can change with a kernel or
  driver update; ``/dev/nvidia-uvm`` and ``-tools``. CUDA cannot start without it. Passed.
- ``nvidia-caps``: the capability nodes under ``/dev/nvidia-caps`` (MIG config and
  monitor). Passed when present: nvidia-smi reads them for MIG.
- everything else ``nvidia-*`` is seen and reported, not passed (``NOT_PASSED``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from sglang_deploy.core.errors import LxcHostError

#: what the shell runs for ``parse_dev_nodes``: one line per node, ``path|type|major|minor|mode``
#: (major and minor in hex, as stat prints them; mode in octal)
NODES_COMMAND = ("stat -c '%n|%F|%t|%T|%a' /dev/nvidia* /dev/nvidia-caps/* 2>/dev/null "
                 "|| true")
#: what the shell runs for ``parse_proc_devices``
PROC_DEVICES_COMMAND = "cat /proc/devices"
#: what the shell runs for ``parse_module_version`` (empty when no module is loaded)
MODULE_VERSION_COMMAND = "cat /proc/driver/nvidia/version 2>/dev/null || true"
#: what the shell runs for ``parse_cgroup_fstype``
CGROUP_COMMAND = "stat -fc %T /sys/fs/cgroup"
#: what the shell runs for ``parse_gpu_information`` (every GPU's block, one after another)
GPUS_COMMAND = "cat /proc/driver/nvidia/gpus/*/information 2>/dev/null || true"

#: the GPU and control major's names in /proc/devices: 550.40 renamed `nvidia-frontend`
GPU_MAJOR_NAMES = ("nvidia", "nvidia-frontend")
#: names on the GPU major besides those (the same 195, listed again from 550.40 on)
SAME_AS_GPU = ("nvidiactl", "nvidia-modeset")
UVM = "nvidia-uvm"
CAPS = "nvidia-caps"
#: NVIDIA char devices a container is not given, and why
NOT_PASSED = {
    "nvidia-nvswitch": ("the NVSwitch nodes belong to the host's Fabric Manager (HGX "
                        "systems); CUDA in a container never opens them"),
    "nvidia-nvlink": "the NVLink core's node, used by the host's Fabric Manager, not by CUDA",
    "nvidia-caps-imex-channels": (
        "IMEX channels share GPU memory between the nodes of a multi-node NVLink domain "
        "(GB200 NVL72); one host's server does not use them"),
}
_DRIVER_FIX = ("install the NVIDIA driver on the LXC host (not only in the container) and "
               "load it: `modprobe nvidia && nvidia-modprobe -u -c=0`; then `nvidia-smi` "
               "on the host lists the GPUs")
_UVM_FIX = ("load the unified-memory module on the LXC host and keep it loaded at boot: "
            "`nvidia-modprobe -u -c=0 && echo nvidia_uvm > /etc/modules-load.d/nvidia-uvm.conf`")


@dataclass(frozen=True)
class DriverMajors:
    """The NVIDIA driver's char-device majors on the LXC host (``parse_proc_devices``).

    ``gpu`` holds the GPUs, nvidiactl and nvidia-modeset (``gpu_name``: ``nvidia``, or
    ``nvidia-frontend`` before 550.40); ``uvm`` and ``caps`` are None when their module is
    not loaded; ``others`` are the other ``nvidia-*`` entries (not passed: ``NOT_PASSED``);
    ``char_majors`` every char major the kernel has registered, any driver's."""

    gpu: int
    gpu_name: str
    uvm: int | None = None
    caps: int | None = None
    others: tuple[tuple[str, int], ...] = ()
    char_majors: frozenset[int] = frozenset()

    @property
    def passed(self) -> tuple[int, ...]:
        """The majors a container is given a device rule for: gpu, uvm, caps (those
        loaded), in that order."""
        return tuple(m for m in (self.gpu, self.uvm, self.caps) if m is not None)

    @property
    def nvidia(self) -> frozenset[int]:
        """Every major an NVIDIA driver holds on this host (passed or not)."""
        return frozenset(self.passed) | {m for _, m in self.others}

    def not_passed(self) -> list[str]:
        """One line per NVIDIA char device seen and not passed, with the reason."""
        return [f"{name} (major {major}): "
                + NOT_PASSED.get(name, "not a device CUDA opens; pass it by hand if needed")
                for name, major in self.others]


def _char_section(text: str) -> list[tuple[int, str]]:
    entries, in_char = [], False
    for line in text.splitlines():
        s = line.strip()
        if s.endswith(":"):
            in_char = s == "Character devices:"
            continue
        fields = s.split()
        if in_char and len(fields) == 2 and fields[0].isdigit():
            entries.append((int(fields[0]), fields[1]))
    return entries


def parse_proc_devices(text: str) -> DriverMajors:
    """``/proc/devices`` -> the NVIDIA majors (its "Block devices" ignored). Raises
    ``LxcHostError`` when the text has no character section, or no ``nvidia`` /
    ``nvidia-frontend`` entry (the driver is not loaded on the LXC host), or the two
    names disagree."""
    if "Character devices:" not in text:
        raise LxcHostError("the LXC host's /proc/devices (a 'Character devices:' section)",
                           found=(text.strip()[:200] or "nothing"),
                           fix="run `cat /proc/devices` on the LXC host itself")
    entries = _char_section(text)
    by_name: dict[str, set[int]] = {}
    for major, name in entries:
        by_name.setdefault(name, set()).add(major)
    gpu_majors = {n: by_name[n] for n in GPU_MAJOR_NAMES if n in by_name}
    found = sorted({m for ms in gpu_majors.values() for m in ms})
    if not found:
        listed = ", ".join(f"{n} ({min(m)})" for n, m in sorted(by_name.items())
                           if n.startswith("nvidia")) or "no nvidia entry"
        raise LxcHostError(
            "the NVIDIA kernel module loaded on the LXC host (an `nvidia` or "
            "`nvidia-frontend` entry in /proc/devices)", found=listed, fix=_DRIVER_FIX)
    if len(found) > 1:
        raise LxcHostError("one GPU major in /proc/devices",
                           found=", ".join(f"{n}: {sorted(m)}" for n, m in gpu_majors.items()),
                           fix="reboot the LXC host: two NVIDIA drivers are registered")
    name = "nvidia" if "nvidia" in gpu_majors else "nvidia-frontend"
    one = {n: min(ms) for n, ms in by_name.items()}
    skip = set(GPU_MAJOR_NAMES) | set(SAME_AS_GPU) | {UVM, CAPS}
    others = tuple(sorted((n, m) for n, m in one.items()
                          if n.startswith("nvidia") and n not in skip))
    return DriverMajors(gpu=found[0], gpu_name=name, uvm=one.get(UVM), caps=one.get(CAPS),
                        others=others, char_majors=frozenset(m for m, _ in entries))


@dataclass(frozen=True)
class DevNode:
    """One node of the LXC host's ``/dev/nvidia*`` listing (``parse_dev_nodes``): ``kind``
    is ``char``, ``dir`` or ``other``; major and minor only for char nodes; ``mode`` the
    octal permissions (``"0666"``) when the listing has them."""

    path: str
    kind: str
    major: int | None = None
    minor: int | None = None
    mode: str | None = None

    @property
    def role(self) -> str:
        """What the node is: ``gpu``, ``ctl``, ``uvm``, ``caps-dir``, ``cap``, or
        ``other`` (modeset, nvswitch, nvlink, imex channels...: not passed)."""
        return node_role(self.path)


def node_role(path: str) -> str:
    """The role of a ``/dev/nvidia*`` path (see ``DevNode.role``)."""
    if re.fullmatch(r"/dev/nvidia\d+", path):
        return "gpu"
    if path == "/dev/nvidiactl":
        return "ctl"
    if path in ("/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"):
        return "uvm"
    if path == "/dev/nvidia-caps":
        return "caps-dir"
    if re.fullmatch(r"/dev/nvidia-caps/nvidia-cap\d+", path):
        return "cap"
    return "other"


_KINDS = {"character special file": "char", "directory": "dir"}


def parse_dev_nodes(text: str) -> tuple[DevNode, ...]:
    """``NODES_COMMAND``'s output -> the nodes, sorted by path (GPUs in number order).
    Empty output (no node at all) gives ``()``. Raises ``LxcHostError`` naming a line that
    is not ``path|type|major|minor[|mode]``."""
    nodes = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        fields = line.split("|")
        if len(fields) not in (4, 5) or not fields[0].startswith("/dev/"):
            raise LxcHostError("the node listing of `" + NODES_COMMAND + "`",
                               found=f"line {number}: {line!r}",
                               fix="run exactly that command on the LXC host")
        kind = _KINDS.get(fields[1], "other")
        try:
            major, minor = (int(fields[2], 16), int(fields[3], 16)) if kind == "char" \
                else (None, None)
        except ValueError:
            raise LxcHostError("hex major and minor in the node listing",
                               found=f"line {number}: {line!r}",
                               fix="run exactly `" + NODES_COMMAND + "`") from None
        mode = fields[4].strip().rjust(4, "0") if len(fields) == 5 else None
        nodes.append(DevNode(fields[0], kind, major, minor, mode))
    return tuple(sorted(nodes, key=_node_order))


def _node_order(node: DevNode) -> tuple[str, int]:
    m = re.fullmatch(r"(.*?)(\d+)", node.path)
    return (m.group(1), int(m.group(2))) if m else (node.path, -1)


@dataclass(frozen=True)
class ModuleVersion:
    """The loaded kernel module (``/proc/driver/nvidia/version``): its version, whether it
    is the open kernel module, and the architecture its line names (None if it names
    none)."""

    version: str
    open: bool
    arch: str | None


_NVRM = re.compile(
    r"NVRM version: NVIDIA UNIX (?:(?P<open>Open )?Kernel Module for (?P<arch1>\S+)"
    r"|(?P<arch2>\S+) Kernel Module)\s+(?P<version>\d+(?:\.\d+)+)")


def parse_module_version(text: str) -> ModuleVersion:
    """``/proc/driver/nvidia/version`` -> the module's version. Raises ``LxcHostError``
    when it is empty (no module loaded) or has no ``NVRM version:`` line."""
    m = _NVRM.search(text)
    if not m:
        raise LxcHostError("the NVIDIA kernel module loaded on the LXC host "
                           "(an `NVRM version:` line in /proc/driver/nvidia/version)",
                           found=(text.strip().splitlines() or ["nothing"])[0][:200],
                           fix=_DRIVER_FIX)
    return ModuleVersion(m.group("version"), bool(m.group("open")),
                         m.group("arch1") or m.group("arch2"))


def parse_cgroup_fstype(text: str) -> int:
    """``stat -fc %T /sys/fs/cgroup`` -> 2 (``cgroup2fs``: the unified hierarchy, device
    rules are ``lxc.cgroup2.devices.allow``) or 1 (``tmpfs``: cgroup v1 or hybrid, whose
    devices controller is v1: ``lxc.cgroup.devices.allow``). Raises ``LxcHostError`` on
    anything else."""
    fstype = text.strip()
    if fstype == "cgroup2fs":
        return 2
    if fstype == "tmpfs":
        return 1
    raise LxcHostError("`cgroup2fs` or `tmpfs` from `" + CGROUP_COMMAND + "`",
                       found=repr(fstype), fix="run that command on the LXC host itself")


def parse_gpu_information(text: str) -> tuple[tuple[int, str], ...]:
    """``GPUS_COMMAND``'s output (each GPU's ``information`` block) -> (device minor, PCI
    address) per GPU, by minor. A block without ``Device Minor`` (drivers before 384 left
    it out) is skipped."""
    found: list[tuple[int, str]] = []
    minor: int | None = None
    bus: str | None = None
    for line in text.splitlines() + ["Model:"]:
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key == "Model":
            if minor is not None and bus:
                found.append((minor, bus.lower()))
            minor, bus = None, None
        elif key == "Device Minor" and value.isdigit():
            minor = int(value)
        elif key == "Bus Location":
            bus = value
    return tuple(sorted(found))


@dataclass(frozen=True)
class HostFacts:
    """Everything the passthrough is planned from: the majors, the nodes, the module, the
    cgroup version (1 or 2) and the GPUs' PCI addresses by minor (may be empty)."""

    majors: DriverMajors
    nodes: tuple[DevNode, ...]
    module: ModuleVersion | None = None
    cgroup: int = 2
    gpu_pci: tuple[tuple[int, str], ...] = field(default=())

    def by_role(self, role: str) -> tuple[DevNode, ...]:
        return tuple(n for n in self.nodes if n.role == role)

    @property
    def gpu_minors(self) -> tuple[int, ...]:
        """The GPUs' numbers N of ``/dev/nvidiaN``, in order."""
        return tuple(int(n.path[len("/dev/nvidia"):]) for n in self.by_role("gpu"))

    def expected_major(self, node: DevNode) -> int | None:
        """The major /proc/devices says the node's driver holds now (None: not loaded, or
        a node that is not passed)."""
        return {"gpu": self.majors.gpu, "ctl": self.majors.gpu, "uvm": self.majors.uvm,
                "cap": self.majors.caps}.get(node.role)

    def stale_nodes(self) -> tuple[DevNode, ...]:
        """Passed char nodes whose major is not the one /proc/devices gives their driver
        now (left from before a driver or kernel update, or their module unloaded)."""
        return tuple(n for n in self.nodes if n.kind == "char"
                     and n.role in ("gpu", "ctl", "uvm", "cap")
                     and n.major != self.expected_major(n))


def host_facts(proc_devices: str, nodes: str, module_version: str | None = None,
               cgroup_fstype: str = "cgroup2fs", gpu_information: str = "") -> HostFacts:
    """The commands' outputs (``PROC_DEVICES_COMMAND``, ``NODES_COMMAND``,
    ``MODULE_VERSION_COMMAND``, ``CGROUP_COMMAND``, ``GPUS_COMMAND``) -> ``HostFacts``.
    Raises what the parsers raise (no NVIDIA module: ``LxcHostError``)."""
    module = parse_module_version(module_version) if module_version is not None else None
    return HostFacts(parse_proc_devices(proc_devices), parse_dev_nodes(nodes), module,
                     parse_cgroup_fstype(cgroup_fstype), parse_gpu_information(gpu_information))


def host_problems(facts: HostFacts) -> list[tuple[str, str]]:
    """(what is wrong, its fix) for each thing that keeps the GPUs from being passed in:
    nvidia_uvm not loaded or its nodes missing, no GPU node, no nvidiactl, stale nodes."""
    out = []
    if facts.majors.uvm is None:
        out.append((("no `nvidia-uvm` in /proc/devices: the nvidia_uvm module is not loaded, "
                    "CUDA cannot start"), _UVM_FIX))
    elif len(facts.by_role("uvm")) < 2:
        out.append((("/dev/nvidia-uvm or /dev/nvidia-uvm-tools is missing (the module creates "
                    "them only when first used)"), _UVM_FIX))
    if not facts.by_role("gpu"):
        out.append(("no /dev/nvidiaN node on the LXC host",
                    ("run `nvidia-smi` on the LXC host once (it creates the nodes), or "
                    "`nvidia-modprobe -c=N` for each GPU N")))
    if not facts.by_role("ctl"):
        out.append(("no /dev/nvidiactl on the LXC host", "run `nvidia-smi` on the LXC host"))
    for node in facts.stale_nodes():
        out.append(((f"{node.path} is stale: major {node.major}, but /proc/devices gives its "
                    f"driver {facts.expected_major(node)}"),
                    (f"remove it and let the driver create it again: `rm {node.path} && "
                    "nvidia-modprobe -u -c=0` (or reboot the LXC host)")))
    return out


def check_host(facts: HostFacts) -> None:
    """Raises one ``LxcHostError`` listing every ``host_problems`` entry (found) and their
    fixes; returns None when the host can pass its GPUs in."""
    problems = host_problems(facts)
    if problems:
        fixes = list(dict.fromkeys(fix for _, fix in problems))
        raise LxcHostError(
            "the NVIDIA device nodes ready on the LXC host (GPUs, nvidiactl, nvidia-uvm, "
            "nvidia-uvm-tools, each with the major /proc/devices gives its driver)",
            found="\n".join(what for what, _ in problems), fix="\n".join(fixes),
            details={"problems": [what for what, _ in problems]})
