"""The pre-flight's common ground (pure): the :class:`Check` result, the fix texts for the
LXC host side that several checks share, and the status of a list of checks."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Status = Literal["pass", "fail", "warn", "skipped"]
STATUSES = ("pass", "fail", "warn", "skipped")

#: character-device major of /dev/nvidia0..N and /dev/nvidiactl (fixed by the driver)
NVIDIA_MAJOR = 195
NVIDIACTL_MINOR = 255


@dataclass
class Check:
    name: str
    status: Status
    message: str
    fix: str | None = None
    expected: str | None = None
    found: str | None = None
    details: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"Check status must be one of {STATUSES}, not {self.status!r}")

    @property
    def failed(self) -> bool:
        return self.status == "fail"

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        return {k: v for k, v in data.items() if v not in (None, {}) or k in ("name", "status", "message")}


def _fail(name: str, message: str, *, expected: str, found: str, fix: str, **details: Any) -> Check:
    return Check(name, "fail", message, fix=fix, expected=expected, found=found, details=details)


def _ranges(indices: Iterable[int]) -> str:
    """[0,1,2,5] -> '0-2,5' (a run of consecutive numbers keeps one offset from its position)"""
    parts = []
    for _, run in itertools.groupby(enumerate(sorted(set(indices))), lambda p: p[1] - p[0]):
        nums = [n for _, n in run]
        parts.append(f"{nums[0]}-{nums[-1]}" if len(nums) > 1 else f"{nums[0]}")
    return ",".join(parts)


# ---------------------------------------------------------------------------------------
# shared fix texts (LXC host side)

LXC_CONF = "the container's LXC config (Proxmox: /etc/pve/lxc/<id>.conf)"
HOST_VERSION_HINT = (
    "Compare the kernel module version (`cat /proc/driver/nvidia/version`, the same inside "
    "the container and on the host) with the container's userspace "
    "(`ls /usr/lib/x86_64-linux-gnu/libcuda.so.* /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.*`)."
)
USERSPACE_FIX = (
    "Install exactly the host's driver version in the container without the kernel module "
    "(`sh NVIDIA-Linux-x86_64-<version>.run --no-kernel-module`, or the distribution's packages "
    "of that exact version). Repeat this in every container after each host driver update; if "
    "the host's own userspace was upgraded without reloading the module, reboot the host."
)


def uvm_fix(uvm_major: int | str | None = None) -> str:
    major = uvm_major if uvm_major is not None else "<uvm-major>"
    lines = [
        "On the LXC host run `nvidia-modprobe -u -c=0` (creates /dev/nvidia-uvm and "
        "/dev/nvidia-uvm-tools; a container cannot create them), make it persistent (load "
        "`nvidia_uvm` at boot, e.g. `echo nvidia_uvm > /etc/modules-load.d/nvidia-uvm.conf`, "
        "and run `nvidia-modprobe -u -c=0` before the container starts), then bind-mount both "
        f"nodes into the container via {LXC_CONF}:",
        "  lxc.mount.entry: /dev/nvidia-uvm dev/nvidia-uvm none bind,optional,create=file",
        "  lxc.mount.entry: /dev/nvidia-uvm-tools dev/nvidia-uvm-tools none bind,optional,create=file",
        f"  lxc.cgroup2.devices.allow: c {major}:* rwm",
    ]
    if uvm_major is None:
        lines.append(
            "  (<uvm-major> is the nvidia-uvm major on the host: `grep nvidia-uvm /proc/devices` "
            "or `ls -l /dev/nvidia-uvm`; it can change with each host kernel)"
        )
    lines.append("Restart the container afterwards (pct stop/start <id>, lxc-stop/lxc-start).")
    return "\n".join(lines)


def gpu_nodes_fix(missing: Sequence[str], include_ctl: bool = False) -> str:
    lines = [
        "On the LXC host check the nodes exist (`ls -l /dev/nvidia*`; the host's `nvidia-smi` "
        f"must list every GPU), then add to {LXC_CONF} and restart the container:",
        f"  lxc.cgroup2.devices.allow: c {NVIDIA_MAJOR}:* rwm",
    ]
    paths = list(missing)
    if include_ctl and "/dev/nvidiactl" not in paths:
        paths.append("/dev/nvidiactl")
    for path in paths:
        if path == "...":
            lines.append("  lxc.mount.entry: /dev/nvidiaN dev/nvidiaN none bind,optional,create=file"
                         "   (one line per GPU, N = 0, 1, ...)")
            continue
        name = path.removeprefix("/dev/")
        lines.append(f"  lxc.mount.entry: {path} dev/{name} none bind,optional,create=file")
    return "\n".join(lines)


def cgroup_fix(majors: Sequence[int | str]) -> str:
    lines = [
        "The device cgroup of the container does not allow these nodes. Add to "
        f"{LXC_CONF} (cgroup v2; `lxc.cgroup.devices.allow` on cgroup v1 hosts) and restart "
        "the container:"
    ]
    for major in majors:
        lines.append(f"  lxc.cgroup2.devices.allow: c {major}:* rwm")
    lines.append(
        "(per-minor rules such as `c 195:0 rwm` must list every GPU minor and 255 for "
        "/dev/nvidiactl; majors other than 195 are assigned per host kernel: "
        "`grep nvidia /proc/devices` on the host)"
    )
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------


def summarise(checks: Iterable[Check]) -> Status:
    """'fail' if any failed, else 'warn' if any warned, else 'pass'; 'skipped' if nothing ran."""
    statuses = {c.status for c in checks}
    for status in ("fail", "warn", "pass"):
        if status in statuses:
            return status
    return "skipped"
