"""GPU pre-flight checks: parsed facts + expectations -> list of :class:`Check` (pure).

Nothing here runs a command. Callers (pyinfra facts on a host, ``sglang-deploy doctor``
on the local machine) gather the raw outputs, parse them with :mod:`sglang_deploy.core.nvsmi`
and pass them in. Every failing check says what was expected, what was found and how to
fix it, with the LXC-specific causes spelled out (the container shares the host's kernel
module, sees only the device nodes the host bind-mounts and the device cgroup allows).
"""

from __future__ import annotations

import re
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Literal, Mapping, Sequence

from .errors import PreflightError
from .nvsmi import (
    QUERY_FIELDS,
    ParseError,
    SmiFailure,
    TopoMatrix,
    classify_smi_error,
    driver_version_tuple,
    gpus_from_query,
    parse_p2p_matrix,
    parse_query_csv,
    parse_smi_table,
    parse_topo_matrix,
)

__all__ = [
    "Status",
    "Check",
    "DevNode",
    "parse_dev_listing",
    "parse_open_results",
    "check_smi",
    "check_device_nodes",
    "check_open_results",
    "required_node",
    "classify_open",
    "check_cuda_probe",
    "diagnose_cuda_error",
    "check_p2p",
    "render_p2p_matrix",
    "Expectations",
    "SNAPSHOT_FILES",
    "evaluate",
    "check_model",
    "summarise",
    "raise_for",
    "SMI_DIAGNOSES",
    "NVIDIA_MAJOR",
]

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
    """[0,1,2,5] -> '0-2,5'"""
    nums = sorted(set(indices))
    parts: list[str] = []
    start = prev = None
    for n in nums:
        if start is None:
            start = prev = n
        elif n == prev + 1:  # type: ignore[operator]
            prev = n
        else:
            parts.append(f"{start}-{prev}" if start != prev else f"{start}")
            start = prev = n
    if start is not None:
        parts.append(f"{start}-{prev}" if start != prev else f"{start}")
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
# nvidia-smi


SMI_DIAGNOSES: dict[SmiFailure, tuple[str, str]] = {
    SmiFailure.DRIVER_LIBRARY_MISMATCH: (
        "NVML driver/library version mismatch: the container's NVIDIA userspace libraries are "
        "a different version than the kernel module loaded on the host",
        HOST_VERSION_HINT + "\n" + USERSPACE_FIX,
    ),
    SmiFailure.NO_DRIVER: (
        "nvidia-smi cannot talk to the kernel driver: /dev/nvidiactl or the GPU nodes are "
        "missing in the container or denied by its device cgroup, or the host has no NVIDIA "
        "module loaded",
        "On the host: `nvidia-smi` must work and `lsmod | grep nvidia` must list the module "
        "(Blackwell GPUs need the open kernel modules: dmesg says 'requires use of the NVIDIA "
        "open kernel modules' otherwise).\n" + gpu_nodes_fix(["/dev/nvidia0"], include_ctl=True),
    ),
    SmiFailure.NVML_UNKNOWN: (
        "NVML initialisation failed with 'Unknown Error' (999): the nodes exist but opening "
        "them is denied (device cgroup) or the host driver state is stale",
        cgroup_fix([NVIDIA_MAJOR, "<uvm-major>"])
        + "\nIf the rules are in place, reload the host driver state "
        "(`rmmod nvidia_uvm && modprobe nvidia_uvm` on the host with no GPU users) or reboot it.",
    ),
    SmiFailure.NO_DEVICES: (
        "the driver answers but finds no GPU: no /dev/nvidiaN usable in the container",
        gpu_nodes_fix(["..."]),
    ),
    SmiFailure.NOT_FOUND: (
        "nvidia-smi is not installed in the container",
        "Install the NVIDIA userspace driver (it ships nvidia-smi and libcuda) of exactly the "
        "host's version. " + USERSPACE_FIX,
    ),
    SmiFailure.NVML_LIBRARY_MISSING: (
        "libnvidia-ml.so (NVML) is missing in the container",
        USERSPACE_FIX,
    ),
    SmiFailure.PERMISSION: (
        "insufficient permissions on the NVIDIA device nodes",
        "Run the check as root, or fix the node modes (`crw-rw-rw-`) on the host before the "
        "bind mount; in unprivileged containers the nodes appear as nobody:nogroup.",
    ),
    SmiFailure.GPU_LOST: (
        "a GPU has fallen off the bus / needs a reset",
        "A host problem: check the host's `dmesg` for Xid 79/NVRM errors, reset the GPU "
        "(`nvidia-smi -r -i <n>` on the host with no users) or reboot the host; check power "
        "and PCIe seating if it repeats.",
    ),
    SmiFailure.UNKNOWN: (
        "nvidia-smi failed",
        "Run `nvidia-smi` inside the container and on the host and compare; see the output above.",
    ),
}


def _first_lines(text: str, n: int = 3) -> str:
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    return " / ".join(lines[:n]) if lines else "(no output)"


def check_smi(
    rows: list[Mapping[str, str | None]] | None,
    expected_count: int | None,
    expected_model: str | None = None,
    min_driver: str | None = None,
    *,
    error_text: str | None = None,
    exit_code: int | None = 0,
) -> list[Check]:
    """Checks from the deploy's ``--query-gpu`` (rows from :func:`nvsmi.parse_query_csv`).

    Pass ``rows=None`` with ``error_text``/``exit_code`` when the call failed or its output
    did not parse: the failure is classified (:func:`nvsmi.classify_smi_error`) and the
    count/model/driver checks are skipped. ``expected_model`` matches a GPU name
    case-insensitively as a whole or as a part ("RTX PRO 6000 Blackwell" accepts every
    edition, the full name only that one).
    """
    checks: list[Check] = []
    names = ("gpu-count", "gpu-model", "driver-version")
    failure = classify_smi_error(error_text or "", exit_code) if (rows is None or exit_code) else None
    if rows is None or failure is not None:
        kind = failure or SmiFailure.UNKNOWN
        message, fix = SMI_DIAGNOSES[kind]
        checks.append(
            _fail(
                "nvidia-smi",
                message,
                expected="nvidia-smi lists the GPUs",
                found=f"exit code {exit_code if exit_code is not None else '?'}: {_first_lines(error_text or '')}",
                fix=fix,
                kind=kind.value,
            )
        )
        checks += [Check(n, "skipped", "nvidia-smi did not answer") for n in names]
        return checks
    checks.append(Check("nvidia-smi", "pass", f"nvidia-smi answered ({len(rows)} GPU rows)"))

    indices = []
    for pos, row in enumerate(rows):
        try:
            indices.append(int(row.get("index") or pos))
        except ValueError:
            indices.append(pos)
    count = len(rows)
    if expected_count is None:
        if count == 0:
            checks.append(_fail("gpu-count", "no GPU listed", expected="at least 1 GPU",
                                found="0 GPUs", fix=SMI_DIAGNOSES[SmiFailure.NO_DEVICES][1]))
        else:
            checks.append(Check("gpu-count", "pass", f"{count} GPUs ({_ranges(indices)})",
                                details={"count": count}))
    elif count < expected_count:
        missing = [f"/dev/nvidia{i}" for i in range(expected_count) if i not in indices]
        checks.append(
            _fail(
                "gpu-count",
                f"{count} of {expected_count} GPUs visible",
                expected=f"{expected_count} GPUs",
                found=f"{count} GPUs" + (f" (indices {_ranges(indices)})" if indices else ""),
                fix=gpu_nodes_fix(missing or [f"/dev/nvidia{count}"]),
                count=count,
            )
        )
    elif count > expected_count:
        checks.append(
            Check(
                "gpu-count",
                "warn",
                f"{count} GPUs visible, {expected_count} expected: the server uses "
                f"{expected_count}; set the expected count if the others are meant for it",
                expected=f"{expected_count} GPUs",
                found=f"{count} GPUs ({_ranges(indices)})",
                details={"count": count},
            )
        )
    else:
        checks.append(Check("gpu-count", "pass", f"{count} GPUs ({_ranges(indices)})",
                            details={"count": count}))

    gpu_names = [row.get("name") or "?" for row in rows]
    if expected_model:
        want = " ".join(expected_model.split()).lower()
        wrong = [(i, n) for i, n in zip(indices, gpu_names) if want not in " ".join(n.split()).lower()]
        if wrong:
            found = "; ".join(f"GPU{i}: {n}" for i, n in wrong)
            checks.append(
                _fail(
                    "gpu-model",
                    f"{len(wrong)} GPU(s) are not {expected_model}",
                    expected=f"every GPU is {expected_model}",
                    found=found,
                    fix="Deploy to a host with the expected GPUs, or change the expected model "
                    "(and the launch profile that was sized for it).",
                    names=sorted(set(gpu_names)),
                )
            )
        else:
            checks.append(Check("gpu-model", "pass", f"all GPUs are {sorted(set(gpu_names))[0]}"
                                if len(set(gpu_names)) == 1 else f"GPUs match {expected_model}"))
    else:
        checks.append(Check("gpu-model", "pass", ", ".join(sorted(set(gpu_names))) or "no GPUs",
                            details={"names": sorted(set(gpu_names))}))

    versions = sorted({row.get("driver_version") or "?" for row in rows})
    if min_driver:
        try:
            floor = driver_version_tuple(min_driver)
        except ValueError:
            floor = None
        bad = []
        for v in versions:
            try:
                if floor is not None and driver_version_tuple(v) < floor:
                    bad.append(v)
            except ValueError:
                bad.append(v)
        if bad or floor is None:
            checks.append(
                _fail(
                    "driver-version",
                    f"driver {', '.join(versions)} is older than {min_driver}"
                    if floor is not None else f"cannot compare driver versions with {min_driver!r}",
                    expected=f"NVIDIA driver >= {min_driver}",
                    found=", ".join(versions),
                    fix="Upgrade the driver on the LXC host (the kernel module is the host's), "
                    "then install the same version's userspace in the container. " + USERSPACE_FIX,
                )
            )
        else:
            checks.append(Check("driver-version", "pass", f"driver {', '.join(versions)} >= {min_driver}"))
    elif len(versions) > 1:
        checks.append(Check("driver-version", "warn", f"GPUs report different drivers: {', '.join(versions)}",
                            found=", ".join(versions)))
    else:
        checks.append(Check("driver-version", "pass", f"driver {versions[0]}"))
    return checks


# ---------------------------------------------------------------------------------------
# device nodes


@dataclass(frozen=True)
class DevNode:
    path: str
    kind: str  # 'c' char device, 'd' directory, '-' regular file, 'l' link, ...
    major: int | None = None
    minor: int | None = None
    mode: str | None = None
    owner: str | None = None
    group: str | None = None


_LS_LINE = re.compile(
    r"^(?P<mode>[-bcdlps][-rwxsStT]{9})[.+@]?\s+\d+\s+(?P<owner>\S+)\s+(?P<group>\S+)\s+"
    r"(?:(?P<major>\d+),\s*(?P<minor>\d+)|\d+)\s+(?P<rest>.+)$"
)


def parse_dev_listing(text: str) -> dict[str, DevNode]:
    """Parse ``ls -l /dev/nvidia*`` (files first, then ``dir:`` sections for directories)."""
    nodes: dict[str, DevNode] = {}
    directory: str | None = None
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("total "):
            continue
        if stripped.endswith(":") and stripped.startswith("/"):
            directory = stripped[:-1]
            continue
        m = _LS_LINE.match(stripped)
        if not m:
            continue
        rest = m.group("rest")
        name = rest.split(" -> ")[0].split()[-1]
        path = name if name.startswith("/") else f"{directory or '/dev'}/{name}"
        nodes[path] = DevNode(
            path=path,
            kind=m.group("mode")[0],
            major=int(m.group("major")) if m.group("major") else None,
            minor=int(m.group("minor")) if m.group("minor") else None,
            mode=m.group("mode"),
            owner=m.group("owner"),
            group=m.group("group"),
        )
    return nodes


def parse_open_results(text: str) -> dict[str, str | None]:
    """Parse lines ``<path> ok`` / ``<path> <ERRNO> <message>`` -> ``{path: None|'ERRNO message'}``."""
    out: dict[str, str | None] = {}
    for line in text.splitlines():
        parts = line.split(None, 1)
        if not parts or not parts[0].startswith("/"):
            continue
        status = parts[1].strip() if len(parts) > 1 else ""
        out[parts[0]] = None if status.lower() in ("ok", "") else status
    return out


def _coerce_nodes(listing: str | Mapping[str, Any]) -> dict[str, DevNode]:
    if isinstance(listing, str):
        return parse_dev_listing(listing)
    nodes = {}
    for path, value in listing.items():
        if isinstance(value, DevNode):
            nodes[path] = value
        elif isinstance(value, Mapping):
            nodes[path] = DevNode(path=path, kind=value.get("kind", "c"), major=value.get("major"),
                                  minor=value.get("minor"), mode=value.get("mode"),
                                  owner=value.get("owner"), group=value.get("group"))
        else:  # (major, minor)
            major, minor = value
            nodes[path] = DevNode(path=path, kind="c", major=major, minor=minor)
    return nodes


_GPU_NODE = re.compile(r"^/dev/nvidia(\d+)$")
SKIPPED_MOUNT = (
    "{path} is an empty regular file, not a character device: the `optional` bind mount was "
    "skipped at container start (the host had no {path} then) and `create=file` left a placeholder"
)


def uvm_major_of(nodes: Mapping[str, DevNode]) -> int | None:
    for name in ("/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"):
        node = nodes.get(name)
        if node and node.kind == "c" and node.major is not None:
            return node.major
    return None


def check_device_nodes(
    listing: str | Mapping[str, Any],
    expected_count: int | None,
    open_errors: Mapping[str, str | None] | None = None,
) -> list[Check]:
    """Checks of the NVIDIA device nodes inside the container.

    ``listing`` is ``ls -l /dev/nvidia*`` output or ``{path: DevNode | {kind, major, minor}
    | (major, minor)}``. ``open_errors`` (optional, :func:`parse_open_results`) tells whether
    each node could be opened: ``EPERM`` means the device cgroup denies it.
    """
    nodes = _coerce_nodes(listing)
    checks: list[Check] = []
    uvm_major = uvm_major_of(nodes)

    gpu_nodes = {int(m.group(1)): n for p, n in nodes.items() if (m := _GPU_NODE.match(p))}
    good = sorted(i for i, n in gpu_nodes.items() if n.kind == "c")
    placeholders = sorted(i for i, n in gpu_nodes.items() if n.kind != "c")
    want = range(expected_count) if expected_count else range(max(1, len(gpu_nodes)))
    missing = [i for i in want if i not in good]
    if missing:
        found = f"{len(good)} GPU nodes" + (f" (/dev/nvidia{{{_ranges(good)}}})" if good else "")
        if placeholders:
            found += "; " + "; ".join(SKIPPED_MOUNT.format(path=f"/dev/nvidia{i}") for i in placeholders)
        checks.append(_fail(
            "dev-nvidia-gpus",
            f"missing GPU device nodes: {', '.join(f'/dev/nvidia{i}' for i in missing)}",
            expected=f"/dev/nvidia0../dev/nvidia{want[-1]} as character devices {NVIDIA_MAJOR}:N",
            found=found,
            fix=gpu_nodes_fix([f"/dev/nvidia{i}" for i in missing]),
            missing=missing,
        ))
    else:
        wrong_major = [i for i in good if gpu_nodes[i].major not in (None, NVIDIA_MAJOR)]
        if wrong_major:
            checks.append(Check("dev-nvidia-gpus", "warn",
                                f"GPU nodes with a major other than {NVIDIA_MAJOR}: {wrong_major}",
                                expected=f"major {NVIDIA_MAJOR}", found=str(wrong_major)))
        else:
            checks.append(Check("dev-nvidia-gpus", "pass", f"{len(good)} GPU nodes (/dev/nvidia{{{_ranges(good)}}})"))

    ctl = nodes.get("/dev/nvidiactl")
    if ctl is None or ctl.kind != "c":
        checks.append(_fail(
            "dev-nvidiactl",
            "/dev/nvidiactl is missing" if ctl is None else SKIPPED_MOUNT.format(path="/dev/nvidiactl"),
            expected=f"/dev/nvidiactl, character device {NVIDIA_MAJOR}:{NVIDIACTL_MINOR}",
            found="absent" if ctl is None else f"{ctl.mode}",
            fix=gpu_nodes_fix(["/dev/nvidiactl"]),
        ))
    else:
        checks.append(Check("dev-nvidiactl", "pass", f"/dev/nvidiactl {ctl.major}:{ctl.minor}"))

    uvm = nodes.get("/dev/nvidia-uvm")
    if uvm is None or uvm.kind != "c":
        why = ("/dev/nvidia-uvm is missing: CUDA cannot initialise without it (cuInit returns "
               "999 CUDA_ERROR_UNKNOWN) although nvidia-smi works"
               if uvm is None else SKIPPED_MOUNT.format(path="/dev/nvidia-uvm"))
        checks.append(_fail(
            "dev-nvidia-uvm",
            why,
            expected="/dev/nvidia-uvm, a character device (major of nvidia-uvm)",
            found="absent" if uvm is None else f"{uvm.mode} (regular file)",
            fix=uvm_fix(uvm_major),
        ))
    else:
        checks.append(Check("dev-nvidia-uvm", "pass", f"/dev/nvidia-uvm {uvm.major}:{uvm.minor}"))

    tools = nodes.get("/dev/nvidia-uvm-tools")
    if tools is None or tools.kind != "c":
        checks.append(Check(
            "dev-nvidia-uvm-tools", "warn",
            "/dev/nvidia-uvm-tools is missing (CUDA runs without it; profilers and some "
            "tools need it)",
            fix="\n".join(uvm_fix(uvm_major).splitlines()[:4]),
            expected="/dev/nvidia-uvm-tools", found="absent" if tools is None else "regular file",
        ))
    else:
        checks.append(Check("dev-nvidia-uvm-tools", "pass", f"/dev/nvidia-uvm-tools {tools.major}:{tools.minor}"))

    if not open_errors:
        checks.append(Check("dev-cgroup", "skipped",
                            "open test not run" if open_errors is None else "no node to open"))
        return checks
    checks.append(check_open_results(open_errors, nodes, expected_count))
    return checks


#: errno names of an open() that the device cgroup refused (cgroup v1 and v2 BPF: EPERM)
CGROUP_DENIED = ("EPERM", "1")
#: errno names of an open() the cgroup PERMITTED but no driver instance answered
#: (no such device behind the node: stale node after a driver reload, or no kernel driver)
NO_DEVICE = ("ENXIO", "ENODEV", "6", "19")


def classify_open(error: str | None) -> str:
    """'ok' | 'denied' (device cgroup) | 'access' (mode/owner) | 'missing' | 'no-device' | 'other'."""
    if not error:
        return "ok"
    name = error.split()[0]
    if name in CGROUP_DENIED:
        return "denied"
    if name in ("EACCES", "13"):
        return "access"
    if name in ("ENOENT", "2"):
        return "missing"
    if name in NO_DEVICE:
        return "no-device"
    return "other"


def required_node(path: str, expected_count: int | None = None) -> bool:
    """Nodes CUDA needs: nvidiactl, nvidia-uvm and the expected GPUs' nodes (not uvm-tools,
    modeset, nvswitch... nor GPUs beyond the expected count)."""
    if path in ("/dev/nvidiactl", "/dev/nvidia-uvm"):
        return True
    m = _GPU_NODE.match(path)
    return bool(m) and (expected_count is None or int(m.group(1)) < expected_count)


def check_open_results(open_errors: Mapping[str, str | None],
                       nodes: Mapping[str, DevNode] | None = None,
                       expected_count: int | None = None) -> Check:
    """The ``dev-cgroup`` check from the open test (``dev-open.txt``: each /dev/nvidia* node
    opened read-write, non-blocking).

    EPERM: the container's device cgroup denies the node (fail, with the allow lines for the
    real majors). EACCES: the node's mode/owner (or, on some kernels, the cgroup) refuses
    it. ENOENT: the node vanished. ENXIO/ENODEV: the cgroup PERMITTED the open and no driver
    instance answered: not a cgroup problem (whether CUDA works is the CUDA probe's verdict).
    Nodes CUDA does not need (:func:`required_node`: uvm-tools, modeset, GPUs beyond the
    expected count) only warn.
    """
    nodes = nodes or {}
    kinds: dict[str, list[str]] = {}
    for path, error in sorted(open_errors.items()):
        kinds.setdefault(classify_open(error), []).append(path)
    listed = "; ".join
    found_of = lambda paths: listed(f"{p}: {open_errors[p]}" for p in paths)  # noqa: E731
    uvm_major = uvm_major_of(nodes)
    expected = "every /dev/nvidia* node can be opened (read-write)"
    if kinds.get("denied") or kinds.get("access"):
        denied = kinds.get("denied", []) + kinds.get("access", [])
        majors: list[int | str] = []
        for path in denied:
            node = nodes.get(path)
            major = node.major if node and node.major is not None else (
                NVIDIA_MAJOR if _GPU_NODE.match(path) or path == "/dev/nvidiactl" else "<uvm-major>")
            if major not in majors:
                majors.append(major)
        # the container needs both families; the uvm major is read from the node itself
        for major in (NVIDIA_MAJOR, uvm_major):
            if major is not None and major not in majors:
                majors.append(major)
        if kinds.get("denied"):
            message = ("the container's device cgroup denies opening "
                       + ", ".join(kinds["denied"]) + " (EPERM)")
            fix = cgroup_fix(sorted(majors, key=str))
            if kinds.get("access"):
                message += "; permission denied (EACCES) on " + ", ".join(kinds["access"])
        else:
            message = ("opening " + ", ".join(kinds["access"]) + " is refused (EACCES): the "
                       "node's mode/owner, or the container's device cgroup")
            fix = ("EACCES: give the nodes mode `crw-rw-rw-` on the LXC host before the bind "
                   "mount (unprivileged containers see them as nobody:nogroup, which is fine "
                   "with that mode); if the mode is right, the device cgroup refuses them:\n"
                   + cgroup_fix(sorted(majors, key=str)))
        details = {"denied": sorted(kinds.get("denied", [])),
                   "refused": sorted(kinds.get("access", []))}
        if not any(required_node(p, expected_count) for p in denied):
            return Check("dev-cgroup", "warn", message + " (nodes CUDA does not need)",
                         fix=fix, expected=expected, found=found_of(denied), details=details)
        return _fail("dev-cgroup", message, expected=expected, found=found_of(denied), fix=fix,
                     **details)
    if kinds.get("missing"):
        return _fail("dev-cgroup", "NVIDIA device nodes vanished while being opened (ENOENT)",
                     expected=expected, found=found_of(kinds["missing"]),
                     fix=gpu_nodes_fix(kinds["missing"]), missing=kinds["missing"])
    if kinds.get("other"):
        return Check("dev-cgroup", "warn", "some NVIDIA device nodes fail to open for another "
                     "reason: " + found_of(kinds["other"]), expected=expected,
                     found=found_of(kinds["other"]),
                     fix="compare `ls -l /dev/nvidia*` inside the container and on the host")
    permitted = len(open_errors)
    no_device = kinds.get("no-device", [])
    if no_device:
        return Check("dev-cgroup", "pass",
                     f"the device cgroup permits all {permitted} nodes; {len(no_device)} answer "
                     "ENXIO/ENODEV (no driver instance behind them: the CUDA probe decides)",
                     details={"no_device": no_device})
    return Check("dev-cgroup", "pass", f"all {permitted} nodes open read-write")


# ---------------------------------------------------------------------------------------
# CUDA probe


def diagnose_cuda_error(error: Mapping[str, Any], nodes: Mapping[str, DevNode] | None = None) -> tuple[str, str]:
    """(message, fix) for the ``error`` object of the CUDA probe."""
    call = error.get("call") or "?"
    code = error.get("code")
    name = error.get("name") or ""
    text = error.get("message") or ""
    label = f"{call} failed with {name or 'error'}" + (f" ({code})" if code is not None else "") + (
        f": {text}" if text else "")
    nodes = nodes or {}
    uvm_node = nodes.get("/dev/nvidia-uvm")
    if call == "dlopen":
        return (
            f"libcuda.so.1 cannot be loaded ({text}): the container has no NVIDIA userspace driver",
            USERSPACE_FIX,
        )
    if call == "dlsym":
        return (f"{text}: the container's libcuda is too old", HOST_VERSION_HINT + "\n" + USERSPACE_FIX)
    if name == "TIMEOUT":
        return (
            f"the CUDA probe hung in {call} ({text}); a GPU-to-GPU copy that never finishes is "
            "the same fault that makes NCCL hang on its first all_reduce",
            "Run with p2p policy 'adapt' (sets NCCL_P2P_DISABLE=1), or fix P2P on the host: "
            "IOMMU off or in passthrough (`iommu=pt`), ACS disabled on the PCIe switches/root "
            "ports, BIOS 'Above 4G decoding'/'Re-size BAR' enabled; check the host's dmesg.",
        )
    if code == 999:
        if nodes and uvm_node is None:
            why = "/dev/nvidia-uvm is missing in the container"
        elif uvm_node is not None and uvm_node.kind != "c":
            why = SKIPPED_MOUNT.format(path="/dev/nvidia-uvm")
        else:
            why = ("most often /dev/nvidia-uvm is missing, denied by the device cgroup, or the "
                   "host's nvidia_uvm is stale after a driver change")
        return (
            f"{label}. CUDA_ERROR_UNKNOWN at initialisation in an LXC container: {why}",
            uvm_fix(uvm_major_of(nodes)) + "\nIf the node is there and allowed, reload nvidia_uvm "
            "on the host (`rmmod nvidia_uvm && modprobe nvidia_uvm` with no GPU users) or reboot it.",
        )
    if code == 803:
        return (
            f"{label}. The container's libcuda (userspace driver) is not the version of the host's "
            "kernel module",
            HOST_VERSION_HINT + "\n" + USERSPACE_FIX,
        )
    if code == 804:
        return (
            f"{label}. CUDA forward-compatibility libraries (cuda-compat) are in use on a GPU that "
            "does not support them",
            "Remove the compat directory (e.g. /usr/local/cuda/compat) from LD_LIBRARY_PATH and "
            "/etc/ld.so.conf.d, run `ldconfig`, so that the driver's own libcuda.so.1 is used.",
        )
    if code == 304:
        return (
            f"{label}. An operating-system call inside the driver failed: typically a device node "
            "could not be opened or mapped (permissions, device cgroup) or the userspace does not "
            "match the kernel module",
            cgroup_fix([NVIDIA_MAJOR, uvm_major_of(nodes) or "<uvm-major>"]) + "\n" + HOST_VERSION_HINT,
        )
    if code == 35:
        return (
            f"{label}. Insufficient driver: the libcuda.so.1 in the container is older than the "
            "CUDA version in use, or it is not the version of the host's kernel module",
            HOST_VERSION_HINT + "\nIf they match, the host driver is too old for this CUDA build: "
            "upgrade the host driver and then the container userspace to the same version. "
            + USERSPACE_FIX,
        )
    if code == 34:
        return (
            f"{label}. The CUDA toolkit's stub libcuda was loaded instead of the driver",
            "Remove the toolkit's `stubs` directory from LD_LIBRARY_PATH / ld.so.conf and run "
            "`ldconfig`; install the driver userspace if no real libcuda.so.1 exists.",
        )
    if code == 100:
        return (
            f"{label}. The driver sees no usable GPU: /dev/nvidiaN are missing in the container, "
            "denied by its device cgroup, or CUDA_VISIBLE_DEVICES hides them",
            gpu_nodes_fix(["..."], include_ctl=True)
            + "\nAlso check that CUDA_VISIBLE_DEVICES is unset or lists the GPUs.",
        )
    if code == 46:
        return (
            f"{label}. The GPU is busy or in exclusive-process compute mode",
            "Stop the other GPU process (`nvidia-smi` lists it) or set the default compute "
            "mode on the host: `nvidia-smi -c DEFAULT`.",
        )
    if code == 2:
        return (f"{label}. GPU memory is taken", "Stop the processes `nvidia-smi` lists on the GPUs.")
    return (label, "Run the probe by hand (`python3 cuda_probe.py`) and compare with the host; "
            + HOST_VERSION_HINT)


def check_cuda_probe(
    probe: Mapping[str, Any] | None,
    expected_count: int | None,
    nodes: str | Mapping[str, Any] | None = None,
) -> list[Check]:
    """Checks from the CUDA probe's JSON object (see ``remote/cuda_probe.py``).

    ``nodes`` (the device listing, optional) sharpens the diagnosis of 999.
    """
    if probe is None:
        return [Check("cuda-init", "skipped", "CUDA probe not run"),
                Check("cuda-devices", "skipped", "CUDA probe not run")]
    node_map = _coerce_nodes(nodes) if nodes is not None else None
    error = probe.get("error")
    count = probe.get("device_count")
    checks: list[Check] = []
    if error and (count is None or error.get("call") in ("dlopen", "dlsym", "cuInit", "cuDriverGetVersion")):
        message, fix = diagnose_cuda_error(error, node_map)
        checks.append(_fail("cuda-init", message, expected="cuInit(0) succeeds",
                            found=_error_found(error), fix=fix, error=dict(error)))
        checks.append(Check("cuda-devices", "skipped", "CUDA did not initialise"))
        return checks
    version = probe.get("driver_version")
    vtext = f"{version // 1000}.{version % 1000 // 10}" if isinstance(version, int) else "?"
    checks.append(Check("cuda-init", "pass", f"CUDA driver API {vtext} ({probe.get('library')})",
                        details={"driver_version": version}))
    if error:
        message, fix = diagnose_cuda_error(error, node_map)
        checks.append(_fail("cuda-probe", message, expected="the CUDA probe completes",
                            found=_error_found(error), fix=fix, error=dict(error)))
    devices = probe.get("devices") or []
    count = count if count is not None else len(devices)
    summary = ", ".join(sorted({f"{d.get('name')} (cc {d.get('cc')}, {d.get('total_mem_mib')} MiB)"
                                for d in devices})) or "no devices"
    if expected_count is not None and count < expected_count or count == 0:
        checks.append(_fail(
            "cuda-devices", f"CUDA sees {count} of {expected_count or 'at least 1'} GPUs",
            expected=f"{expected_count or 'at least 1'} CUDA devices", found=f"{count}: {summary}",
            fix=gpu_nodes_fix([f"/dev/nvidia{i}" for i in range(count, expected_count or 1)])
            + "\nAlso check that CUDA_VISIBLE_DEVICES is unset or lists every GPU.",
            count=count))
    else:
        checks.append(Check("cuda-devices", "pass", f"{count} CUDA devices: {summary}",
                            details={"count": count}))
    return checks


def _error_found(error: Mapping[str, Any]) -> str:
    parts = [str(error.get("call"))]
    if error.get("name") or error.get("code") is not None:
        parts.append(f"{error.get('name') or ''} ({error.get('code')})".strip())
    if error.get("message"):
        parts.append(str(error.get("message")))
    return ": ".join(parts)


# ---------------------------------------------------------------------------------------
# P2P

P2P_FIX = (
    "Enable P2P on the host: IOMMU off or passthrough (`iommu=pt` / `amd_iommu=pt`), ACS "
    "disabled on the PCIe switches and root ports, BIOS 'Above 4G decoding' and 'Re-size BAR' "
    "on; GeForce cards report GNS and cannot be fixed. Or set the p2p policy to 'adapt' to run "
    "with NCCL_P2P_DISABLE=1 (all-reduce through host memory, slower)."
)


def render_p2p_matrix(
    n: int,
    p2p_read: Mapping[tuple[int, int], str] | None = None,
    probe_p2p: Sequence[Mapping[str, Any]] | None = None,
) -> str:
    """Text matrix, one cell per ordered pair: ``<topo code|peer|host> <ok|BAD|ERR|-> <GB/s|->``."""
    by_pair = {(int(e["src"]), int(e["dst"])): e for e in probe_p2p or []}
    cells: dict[tuple[int, int], str] = {}
    for i in range(n):
        for j in range(n):
            if i == j:
                cells[(i, j)] = "X"
                continue
            entry = by_pair.get((i, j))
            code = (p2p_read or {}).get((i, j))
            if code is None and entry is not None and entry.get("can_access") is not None:
                code = "peer" if entry.get("can_access") else "host"
            verified = "-"
            gbps = "-"
            if entry is not None:
                if entry.get("verified") is True:
                    verified = "ok"
                elif entry.get("verified") is False:
                    verified = "BAD"
                elif entry.get("error"):
                    verified = "ERR"
                if entry.get("gbps") is not None:
                    gbps = f"{float(entry['gbps']):.1f}"
            cells[(i, j)] = f"{code or '?'} {verified} {gbps}"
    width = max([len(c) for c in cells.values()] + [6]) + 2
    lines = ["src\\dst".ljust(8) + "".join(f"GPU{j}".ljust(width) for j in range(n))]
    for i in range(n):
        lines.append(f"GPU{i}".ljust(8) + "".join(cells[(i, j)].ljust(width) for j in range(n)))
    lines.append("cell: nvidia-smi topo -p2p r code (or peer/host from CUDA), data check "
                 "(ok/BAD/ERR), GB/s")
    return "\n".join(line.rstrip() for line in lines)


def _pairs_text(pairs: Iterable[tuple[int, int]], extra: Mapping[tuple[int, int], str] | None = None) -> str:
    out = []
    for i, j in sorted(pairs):
        tail = f" ({extra[(i, j)]})" if extra and (i, j) in extra else ""
        out.append(f"GPU{i}->GPU{j}{tail}")
    return ", ".join(out)


def check_p2p(
    topo: TopoMatrix | None,
    p2p_read: Mapping[tuple[int, int], str] | None,
    p2p_write: Mapping[tuple[int, int], str] | None,
    probe_p2p: Sequence[Mapping[str, Any]] | None,
    policy: Literal["require", "adapt"] = "require",
    min_gbps: float | None = None,
    expected_count: int | None = None,
) -> tuple[list[Check], dict[str, str]]:
    """Decide P2P from every source available; returns (checks, NCCL environment).

    * ``p2p-data`` - any pair whose copied bytes differ fails, whatever the policy; a pair
      whose copy errored fails too (nvidia-smi's "OK" and CUDA's "can access peer" prove
      nothing: real hosts hang or corrupt behind them).
    * ``p2p-support`` - pairs where nvidia-smi (read/write) says anything but OK, or CUDA
      cannot access/enable the peer: ``require`` fails; ``adapt`` warns and returns
      ``{"NCCL_P2P_DISABLE": "1"}``.
    * ``p2p-bandwidth`` - measured pairs below ``min_gbps`` fail, named.
    * ``p2p-matrix`` - informational, ``details["matrix"]`` holds :func:`render_p2p_matrix`.

    The GPUs are those the inputs name (a missing GPU is the count checks' business);
    ``expected_count`` is accepted for symmetry and recorded in the matrix check.
    """
    if policy not in ("require", "adapt"):
        raise ValueError(f"p2p policy must be 'require' or 'adapt', not {policy!r}")
    checks: list[Check] = []
    env: dict[str, str] = {}
    probe_p2p = list(probe_p2p or [])
    gpu_ids: set[int] = set()
    if topo is not None:
        gpu_ids.update(topo.gpu_indices)
    for matrix in (p2p_read, p2p_write):
        for i, j in (matrix or {}):
            gpu_ids.update((i, j))
    for e in probe_p2p:
        gpu_ids.update((int(e["src"]), int(e["dst"])))
    n = max([len(gpu_ids), max(gpu_ids) + 1 if gpu_ids else 0])
    if topo is not None:
        checks.append(Check("topology", "pass",
                            f"{topo.gpu_count} GPUs; links: "
                            + (", ".join(f"{k} x{v}" for k, v in topo.link_counts().items()) or "none"),
                            details={"links": topo.link_counts(), "nics": topo.nics}))
    else:
        checks.append(Check("topology", "skipped", "no `nvidia-smi topo -m` output"))

    if n < 2:
        reason = "fewer than two GPUs" if gpu_ids else "no P2P information (topo -m/-p2p or CUDA probe)"
        for name in ("p2p-support", "p2p-data", "p2p-bandwidth"):
            checks.append(Check(name, "skipped", reason))
        return checks, env
    pairs = [(i, j) for i in range(n) for j in range(n) if i != j]

    # --- support
    unsupported: dict[tuple[int, int], str] = {}
    sources = []
    for label, matrix in (("read", p2p_read), ("write", p2p_write)):
        if matrix is None:
            continue
        sources.append(f"topo -p2p {label[0]}")
        for pair in pairs:
            code = matrix.get(pair)
            if code != "OK":
                unsupported.setdefault(pair, f"{label} {code or 'missing'}")
    by_pair = {(int(e["src"]), int(e["dst"])): e for e in probe_p2p}
    if probe_p2p:
        sources.append("CUDA")
        for pair, e in by_pair.items():
            if e.get("can_access") is False:
                unsupported.setdefault(pair, "CUDA: no peer access")
            elif e.get("error") and "cuCtxEnablePeerAccess" in str(e.get("error")):
                unsupported.setdefault(pair, "CUDA: enabling peer access failed")
    smi_ok = {p for p in pairs if (p2p_read or {}).get(p) == "OK"} if p2p_read is not None else set()
    cuda_no = {p for p, e in by_pair.items() if e.get("can_access") is False}
    disagree = sorted(smi_ok & cuda_no)
    if not sources:
        checks.append(Check("p2p-support", "skipped", "no P2P information (topo -p2p or CUDA probe)"))
    elif unsupported:
        found = _pairs_text(unsupported, unsupported)
        if policy == "require":
            checks.append(_fail(
                "p2p-support", f"P2P unavailable on {len(unsupported)} of {len(pairs)} GPU pairs",
                expected="P2P between every GPU pair (policy 'require')", found=found, fix=P2P_FIX,
                pairs=[list(p) for p in sorted(unsupported)]))
        else:
            env["NCCL_P2P_DISABLE"] = "1"
            checks.append(Check(
                "p2p-support", "warn",
                f"P2P unavailable on {len(unsupported)} of {len(pairs)} GPU pairs: running with "
                "NCCL_P2P_DISABLE=1 (policy 'adapt'; all-reduce goes through host memory)",
                expected="P2P between every GPU pair", found=found, fix=P2P_FIX,
                details={"pairs": [list(p) for p in sorted(unsupported)], "nccl_env": dict(env)}))
    else:
        checks.append(Check("p2p-support", "pass",
                            f"P2P reported on all {len(pairs)} pairs ({', '.join(sources)})"))
    if disagree:
        checks.append(Check("p2p-consistency", "warn",
                            "nvidia-smi reports P2P OK but CUDA cannot access the peer on "
                            + _pairs_text(disagree),
                            found=_pairs_text(disagree)))

    # --- data
    if not probe_p2p:
        checks.append(Check("p2p-data", "skipped", "CUDA probe did not run the P2P copy test"))
    else:
        bad = sorted(p for p, e in by_pair.items() if e.get("verified") is False)
        errored = {p: str(e.get("error")) for p, e in by_pair.items()
                   if e.get("verified") is None and e.get("error")}
        untested = sorted(p for p in pairs if p not in by_pair)
        if bad or errored or untested:
            parts = []
            if bad:
                parts.append("data differs after copy: " + _pairs_text(bad))
            if errored:
                parts.append("copy failed: " + _pairs_text(errored, errored))
            if untested:
                parts.append("not tested (probe stopped): " + _pairs_text(untested))
            checks.append(_fail(
                "p2p-data",
                f"GPU-to-GPU copies are broken on {len(bad) + len(errored) + len(untested)} pairs"
                + (" (silent corruption)" if bad else ""),
                expected="bytes copied GPU->GPU arrive unchanged on every pair",
                found="; ".join(parts),
                fix="Do not serve from this host: corrupt or failing peer copies break tensor "
                "parallelism whatever NCCL does. " + P2P_FIX.split(" Or set")[0]
                + " Check the host's dmesg for IOMMU/AER errors.",
                corrupt=[list(p) for p in bad], failed=[list(p) for p in errored],
                untested=[list(p) for p in untested]))
        else:
            checks.append(Check("p2p-data", "pass", f"data verified on all {len(by_pair)} pairs"))

    # --- bandwidth
    measured = {p: float(e["gbps"]) for p, e in by_pair.items() if e.get("gbps") is not None}
    if not measured:
        checks.append(Check("p2p-bandwidth", "skipped", "no bandwidth measured"))
    else:
        values = sorted(measured.values())
        stats = {"min": values[0], "median": statistics.median(values), "max": values[-1]}
        stat_text = f"min {stats['min']:.1f}, median {stats['median']:.1f}, max {stats['max']:.1f} GB/s"
        slow = {p: v for p, v in measured.items() if min_gbps is not None and v < min_gbps}
        if slow:
            paths = {p: f"{v:.1f} GB/s" + ("" if by_pair[p].get("can_access") else ", via host")
                     for p, v in slow.items()}
            checks.append(_fail(
                "p2p-bandwidth", f"{len(slow)} pairs below {min_gbps:g} GB/s",
                expected=f">= {min_gbps:g} GB/s on every pair", found=_pairs_text(slow, paths),
                fix="Check the PCIe links on the host (`nvidia-smi -q | grep -A3 'Link Width'`, "
                "`lspci -vv` LnkSta: degraded width/speed), that P2P is really used (a 'CAN access "
                "peer' GPU pair can still copy slowly when IOMMU/ACS force traffic through the root "
                "complex), or lower the minimum if the hardware cannot do better.",
                slow=[list(p) for p in sorted(slow)], **stats))
        else:
            checks.append(Check("p2p-bandwidth", "pass", stat_text + (
                f" (>= {min_gbps:g})" if min_gbps is not None else ""), details=stats))

    if probe_p2p or p2p_read is not None:
        checks.append(Check("p2p-matrix", "pass", f"{n}x{n} pair matrix in details",
                            details={"matrix": render_p2p_matrix(n, p2p_read, probe_p2p),
                                     "gpus": n, "expected_count": expected_count}))
    return checks, env


# ---------------------------------------------------------------------------------------
# everything at once (the deploy's pre-flight stage and `doctor` both use this)


@dataclass
class Expectations:
    """What the host must offer (group data ``gpu_*`` keys)."""

    count: int | None = None
    model: str | None = None
    min_driver: str | None = None
    p2p_policy: Literal["require", "adapt"] = "require"
    min_gbps: float | None = None


#: raw outputs by file name (the names of a ``doctor --collect`` folder)
SNAPSHOT_FILES = {
    "table": "nvidia-smi.txt",
    "query": "query-gpu.csv",
    "topo": "topo-m.txt",
    "p2p_r": "topo-p2p-r.txt",
    "p2p_w": "topo-p2p-w.txt",
    "dev": "dev-nvidia.txt",
    "open": "dev-open.txt",
}


def _section(snapshot: Mapping[str, Any], key: str) -> tuple[str | None, int | None]:
    """(text, exit code) of one raw output; a plain string counts as text with unknown rc."""
    value = snapshot.get(SNAPSHOT_FILES[key])
    if value is None:
        return None, None
    if isinstance(value, str):
        return value, None
    return value.get("out") or "", value.get("rc")


def _head(text: str, n: int = 2) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return " / ".join(lines[:n]) or "(empty)"


def _smi_section_checks(snapshot: Mapping[str, Any], expect: Expectations,
                        facts: dict[str, Any]) -> list[Check]:
    names = ("nvidia-smi", "gpu-count", "gpu-model", "driver-version")
    table_text, table_rc = _section(snapshot, "table")
    query_text, query_rc = _section(snapshot, "query")
    table = parse_smi_table(table_text) if table_text is not None else None
    if table is not None:
        facts["driver_version"] = table.driver_version
        facts["cuda_version"] = table.cuda_version
    args = (expect.count, expect.model, expect.min_driver)
    if query_text is not None:
        rows = None
        if not query_rc:
            try:
                rows = parse_query_csv(query_text, QUERY_FIELDS)
            except ParseError:
                rows = None
            if rows is not None and classify_smi_error(query_text, None) is not None:
                rows = None
        if rows is not None:
            facts["gpus"] = [asdict(g) for g in gpus_from_query(rows)]
            return check_smi(rows, *args)
        return check_smi(None, *args, error_text=query_text, exit_code=query_rc)
    if table_text is None or table is None:
        return [Check(n, "skipped", f"no {SNAPSHOT_FILES['query']} or {SNAPSHOT_FILES['table']}")
                for n in names]
    if table_rc or not table.gpus or classify_smi_error(table_text, None) is not None:
        return check_smi(None, *args, error_text=table_text, exit_code=table_rc)
    rows = [{"index": str(g.index), "name": g.name, "driver_version": table.driver_version,
             "memory.total": str(g.memory_total_mib) if g.memory_total_mib else None}
            for g in table.gpus]
    checks = check_smi(rows, *args)
    if any(g.name_truncated for g in table.gpus) and expect.model:
        checks = [Check("gpu-model", "skipped", "the nvidia-smi table truncates GPU names; the "
                        "--query-gpu output is needed to check the model")
                  if c.name == "gpu-model" else c for c in checks]
    return checks


def evaluate(
    snapshot: Mapping[str, Any],
    probe: Mapping[str, Any] | None,
    expect: Expectations,
    facts: dict[str, Any] | None = None,
) -> tuple[list[Check], dict[str, str], str | None]:
    """Every GPU check from raw outputs: returns (checks, NCCL env, P2P matrix text or None).

    ``snapshot`` maps the file names of :data:`SNAPSHOT_FILES` (``query-gpu.csv``,
    ``nvidia-smi.txt``, ``topo-m.txt``, ``topo-p2p-r.txt``, ``topo-p2p-w.txt``,
    ``dev-nvidia.txt``, ``dev-open.txt``) to ``{"out": text, "rc": exit code}`` or to plain
    text; absent names make their checks ``skipped``. ``probe`` is the CUDA probe's JSON
    object (None: not run). ``facts``, when given, receives what was parsed (driver, GPUs,
    topology) for reports.
    """
    facts = facts if facts is not None else {}
    checks = _smi_section_checks(snapshot, expect, facts)

    dev_text, _ = _section(snapshot, "dev")
    open_text, _ = _section(snapshot, "open")
    if dev_text is None:
        checks += [Check(n, "skipped", f"no {SNAPSHOT_FILES['dev']}") for n in
                   ("dev-nvidia-gpus", "dev-nvidiactl", "dev-nvidia-uvm", "dev-nvidia-uvm-tools",
                    "dev-cgroup")]
    else:
        open_errors = parse_open_results(open_text) if open_text is not None else None
        checks += check_device_nodes(dev_text, expect.count, open_errors)

    if probe is not None:
        facts["cuda_probe"] = {k: probe.get(k) for k in ("library", "driver_version", "device_count")}
    checks += check_cuda_probe(probe, expect.count, dev_text)
    _blame_the_cgroup(checks)

    def smi_failed(text: str, rc: int | None) -> bool:
        return bool(rc) or classify_smi_error(text, None) is not None

    topo = None
    extra: list[Check] = []
    topo_text, topo_rc = _section(snapshot, "topo")
    if topo_text is not None and smi_failed(topo_text, topo_rc):
        extra.append(Check("topology", "skipped", f"`nvidia-smi topo -m` failed: {_head(topo_text, 1)}"))
    elif topo_text is not None:
        try:
            topo = parse_topo_matrix(topo_text)
            facts["topology"] = {"gpus": topo.gpus, "links": topo.link_counts(), "nics": topo.nics}
        except ParseError as exc:
            extra.append(Check("topology", "warn", f"cannot read `nvidia-smi topo -m`: {exc}",
                               found=_head(topo_text)))
    matrices: dict[str, dict[tuple[int, int], str] | None] = {"p2p_r": None, "p2p_w": None}
    for key in matrices:
        text, rc = _section(snapshot, key)
        if text is None:
            continue
        label = f"topo-p2p-{key[-1]}"
        if smi_failed(text, rc):
            extra.append(Check(label, "skipped", f"`nvidia-smi topo -p2p {key[-1]}` failed: {_head(text, 1)}"))
            continue
        try:
            matrices[key] = parse_p2p_matrix(text)
        except ParseError as exc:
            extra.append(Check(label, "warn", f"cannot read `nvidia-smi topo -p2p {key[-1]}`: {exc}",
                               found=_head(text)))
    p2p_pairs = probe.get("p2p") if probe else None
    p2p_checks, env = check_p2p(topo, matrices["p2p_r"], matrices["p2p_w"], p2p_pairs,
                                policy=expect.p2p_policy, min_gbps=expect.min_gbps,
                                expected_count=expect.count)
    if topo is None and any(c.name == "topology" for c in extra):
        p2p_checks = [c for c in p2p_checks if c.name != "topology"]
    checks += extra + p2p_checks
    matrix = next((c.details.get("matrix") for c in checks if c.name == "p2p-matrix"), None)
    return checks, env, matrix


def _blame_the_cgroup(checks: list[Check]) -> None:
    """When the open test proved the device cgroup denies the nodes, nvidia-smi's and CUDA's
    failures are its consequence: say so and give the cgroup fix with the real majors."""
    cgroup = next((c for c in checks if c.name == "dev-cgroup" and c.status == "fail"
                   and c.details.get("denied")), None)
    if cgroup is None:
        return
    for c in checks:
        if c.status == "fail" and c.name in ("nvidia-smi", "cuda-init", "cuda-devices"):
            c.message += " -- the open test shows the cause: the container's device cgroup denies the nodes"
            c.fix = cgroup.fix


P2P_RECORD_CHECKS = ("p2p-data", "p2p-bandwidth")


def p2p_record(checks: Iterable[Check], env: Mapping[str, str], policy: str) -> dict | None:
    """What a passed, full P2P test leaves on the host for later runs (no figures that vary
    between runs, so the file only changes when the verdict does). None unless it passed."""
    by_name = {c.name: c for c in checks}
    if any(by_name.get(n) is None or by_name[n].status != "pass" for n in P2P_RECORD_CHECKS):
        return None
    matrix = by_name.get("p2p-matrix")
    return {"gpus": (matrix.details.get("gpus") if matrix else None), "policy": policy,
            "nccl_env": dict(sorted(env.items())), "verified": list(P2P_RECORD_CHECKS)}


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


def use_p2p_record(checks: list[Check], env: dict[str, str], record: Mapping[str, Any],
                   service: str) -> tuple[list[Check], dict[str, str]]:
    """Checks and NCCL env when the peer copies were skipped because SERVICE is serving:
    the last full test's verdict (RECORD) stands for the copy and bandwidth checks."""
    kept = [c for c in checks if c.name not in P2P_RECORD_CHECKS]
    kept.append(Check("p2p-data", "pass",
                      f"peer copies skipped while {service} serves on these GPUs; the last full "
                      f"test on this host passed ({record.get('gpus')} GPUs, policy "
                      f"{record.get('policy')}); set gpu_p2p_test: always to copy anyway"))
    return kept, {**dict(record.get("nccl_env") or {}), **env}


def check_model(model: Mapping[str, Any], path: str | None, download: bool = False) -> list[Check]:
    """Model folder check from ``hoststate.py state --model`` (``model`` key of its JSON).

    With ``download`` a missing or incomplete folder is a warning (the deploy fetches it);
    without, it fails.
    """
    path = path or model.get("path") or "?"
    fail_or_warn: Status = "warn" if download else "fail"
    fix = ("Copy the complete model (config.json, model.safetensors.index.json and every shard) "
           f"to {path} on the host, or set `sglang_model_download: true` and `sglang_model_repo`.")
    expected = f"a complete Hugging Face model folder at {path}"
    if not model or not model.get("exists"):
        return [Check("model", fail_or_warn,
                      f"no model folder at {path}" + (" (will be downloaded)" if download else ""),
                      fix=None if download else fix, expected=expected, found="absent")]
    problems = []
    if not model.get("config"):
        problems.append("no config.json")
    shards: Mapping[str, Mapping[str, Any]] = model.get("shards") or {}
    if not shards:
        problems.append("no model.safetensors.index.json and no model.safetensors")
    missing = sorted(n for n, info in shards.items() if not info.get("exists"))
    broken = sorted(n for n, info in shards.items() if info.get("exists") and info.get("error"))
    short = sorted(n for n, info in shards.items() if info.get("exists") and not info.get("error")
                   and info.get("expected_size") is not None
                   and info.get("size") != info.get("expected_size"))
    if missing:
        problems.append(f"{len(missing)} shards missing ({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''})")
    if broken:
        problems.append(f"{len(broken)} shards unreadable ({', '.join(broken[:3])}{', ...' if len(broken) > 3 else ''})")
    if short:
        problems.append(f"{len(short)} shards truncated ({', '.join(short[:3])}{', ...' if len(short) > 3 else ''})")
    if problems:
        return [Check("model", fail_or_warn,
                      f"model folder {path} is incomplete" + (" (will be downloaded)" if download else ""),
                      fix=None if download else fix, expected=expected, found="; ".join(problems),
                      details={"missing": missing, "unreadable": broken, "truncated": short})]
    total = sum(int(info.get("size") or 0) for info in shards.values())
    return [Check("model", "pass", f"{len(shards)} shards, {total / 2**30:.1f} GiB at {path}",
                  details={"shards": len(shards), "bytes": total})]


# ---------------------------------------------------------------------------------------


def summarise(checks: Iterable[Check]) -> Status:
    """'fail' if any failed, else 'warn' if any warned, else 'pass'; 'skipped' if nothing ran."""
    statuses = {c.status for c in checks}
    for status in ("fail", "warn", "pass"):
        if status in statuses:
            return status  # type: ignore[return-value]
    return "skipped"


def raise_for(checks: Iterable[Check], host: str | None = None) -> None:
    """Raise :class:`PreflightError` listing every failing check; return if none failed."""
    checks = list(checks)
    failed = [c for c in checks if c.status == "fail"]
    if not failed:
        return
    where = f" on {host}" if host else ""
    found = []
    fixes = []
    for c in failed:
        found.append(f"[{c.name}] {c.message}" + (f"\n  expected: {c.expected}" if c.expected else "")
                     + (f"\n  found: {c.found}" if c.found else ""))
        if c.fix:
            fixes.append(f"[{c.name}] {c.fix}")
    raise PreflightError(
        f"{len(failed)} check(s) failed{where}: {', '.join(c.name for c in failed)}",
        found="\n".join(found),
        fix="\n".join(fixes) or None,
        checks=failed,
    )
