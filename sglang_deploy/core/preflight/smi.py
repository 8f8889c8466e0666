"""nvidia-smi and the device nodes (pure): parsed outputs -> checks, with the LXC causes."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sglang_deploy.core.nvsmi import (
    SmiFailure,
    classify_smi_error,
    driver_version_tuple,
)
from sglang_deploy.core.preflight.checks import (
    HOST_VERSION_HINT,
    NVIDIA_MAJOR,
    NVIDIACTL_MINOR,
    USERSPACE_FIX,
    Check,
    _fail,
    _ranges,
    cgroup_fix,
    gpu_nodes_fix,
    uvm_fix,
)
from sglang_deploy.core.topo import plain_text

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
    """The first N non-blank lines of an output, as plain text (no terminal escapes)."""
    lines = [ln.strip() for ln in plain_text(text).splitlines() if ln.strip()]
    return " / ".join(lines[:n]) if lines else "(no output)"


def _older(version: str, floor: tuple[int, ...]) -> bool:
    """Is VERSION below FLOOR (an unreadable version counts as older)?"""
    try:
        return driver_version_tuple(version) < floor
    except ValueError:
        return True


def check_smi(
    rows: Sequence[Mapping[str, str | None]] | None,
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
    count/model/driver checks are skipped. ``expected_model`` is the exact name every GPU
    must report (runs of white space aside): "RTX PRO 6000 Blackwell" accepts no edition.
    """
    failure = classify_smi_error(error_text or "", exit_code) if (rows is None or exit_code) else None
    if rows is None or failure is not None:
        return _smi_failed(failure or SmiFailure.UNKNOWN, error_text, exit_code)
    indices = []
    for pos, row in enumerate(rows):
        try:
            indices.append(int(row.get("index") or pos))
        except ValueError:
            indices.append(pos)
    return [Check("nvidia-smi", "pass", f"nvidia-smi answered ({len(rows)} GPU row{'s' * (len(rows) != 1)})"),
            _count_check(indices, expected_count),
            _model_check(indices, [row.get("name") or "?" for row in rows], expected_model),
            _driver_check(sorted({row.get("driver_version") or "?" for row in rows}), min_driver)]


def _smi_failed(kind: SmiFailure, error_text: str | None, exit_code: int | None) -> list[Check]:
    """nvidia-smi did not answer: its failure, named, and the checks that needed it skipped."""
    message, fix = SMI_DIAGNOSES[kind]
    found = f"exit code {exit_code if exit_code is not None else '?'}: {_first_lines(error_text or '')}"
    return [_fail("nvidia-smi", message, expected="nvidia-smi lists the GPUs", found=found,
                  fix=fix, kind=kind.value)] + [
        Check(n, "skipped", "nvidia-smi did not answer")
        for n in ("gpu-count", "gpu-model", "driver-version")]


def _count_check(indices: list[int], expected_count: int | None) -> Check:
    """``gpu-count``: fewer GPUs than expected fail (with the nodes to pass in, or the profile
    to shrink); more only warn."""
    count = len(indices)
    if expected_count is None and count == 0:
        return _fail("gpu-count", "no GPU listed", expected="at least 1 GPU",
                     found="0 GPUs", fix=SMI_DIAGNOSES[SmiFailure.NO_DEVICES][1])
    if expected_count is not None and count < expected_count:
        missing = [f"/dev/nvidia{i}" for i in range(expected_count) if i not in indices]
        return _fail(
            "gpu-count",
            f"{count} of {expected_count} GPUs visible",
            expected=f"{expected_count} GPUs",
            found=f"{count} GPUs" + (f" (indices {_ranges(indices)})" if indices else ""),
            fix=gpu_nodes_fix(missing or [f"/dev/nvidia{count}"]) + (
                f"\nIf the host has only {count} GPUs, the profile does not fit it: set "
                f"`gpu_expected_count = {count}` and a `tp-size` of at most {count} in "
                "`sglang_flags` (group_data/all.py, or the host's data in the inventory), "
                "and a model that fits them" if count else ""),
            count=count,
        )
    if expected_count is not None and count > expected_count:
        return Check(
            "gpu-count",
            "warn",
            f"{count} GPUs visible, {expected_count} expected: the server uses "
            f"{expected_count}; set the expected count if the others are meant for it",
            expected=f"{expected_count} GPUs",
            found=f"{count} GPUs ({_ranges(indices)})",
            details={"count": count},
        )
    return Check("gpu-count", "pass", f"{count} GPU{'s' * (count != 1)} ({_ranges(indices)})",
                 details={"count": count})


def _model_check(indices: list[int], gpu_names: list[str], expected_model: str | None) -> Check:
    """``gpu-model``: every GPU reports EXPECTED_MODEL (runs of white space aside)."""
    models = sorted(set(gpu_names))
    if not expected_model:
        return Check("gpu-model", "pass", ", ".join(models) or "no GPUs", details={"names": models})
    want = " ".join(expected_model.split())
    wrong = [(i, n) for i, n in zip(indices, gpu_names) if " ".join(n.split()) != want]
    if not wrong:
        return Check("gpu-model", "pass", f"all GPUs are {models[0]}"
                     if len(models) == 1 else f"GPUs match {expected_model}")
    return _fail(
        "gpu-model",
        f"{len(wrong)} GPU(s) are not {expected_model}",
        expected=f"every GPU is {expected_model}",
        found="; ".join(f"GPU{i}: {n}" for i, n in wrong),
        fix="Deploy to a host with the expected GPUs, or change the profile: "
        "`gpu_expected_model` (the exact name nvidia-smi reports; None accepts any) "
        "and the launch profile sized for the old GPUs (`sglang_flags`, the "
        "model) in group_data/all.py or the host's data in the inventory.",
        names=models,
    )


def _driver_check(versions: list[str], min_driver: str | None) -> Check:
    """``driver-version``: every GPU's driver at least MIN_DRIVER; without one, the same
    driver on every GPU (a warning otherwise)."""
    listed = ", ".join(versions)
    if not versions:
        return Check("driver-version", "skipped", "no GPU listed")
    if not min_driver:
        if len(versions) > 1:
            return Check("driver-version", "warn", f"GPUs report different drivers: {listed}",
                         found=listed)
        return Check("driver-version", "pass", f"driver {versions[0]}")
    try:
        floor = driver_version_tuple(min_driver)
    except ValueError:
        floor = None
    if floor is not None and not any(_older(v, floor) for v in versions):
        return Check("driver-version", "pass", f"driver {listed} >= {min_driver}")
    return _fail(
        "driver-version",
        f"driver {listed} is older than {min_driver}"
        if floor is not None else f"cannot compare driver versions with {min_driver!r}",
        expected=f"NVIDIA driver >= {min_driver}",
        found=listed,
        fix="Upgrade the driver on the LXC host (the kernel module is the host's), "
        "then install the same version's userspace in the container. " + USERSPACE_FIX,
    )


# ---------------------------------------------------------------------------------------
# device nodes


@dataclass(frozen=True)
class DevNode:
    path: str
    kind: str  # 'c' char device, 'd' directory, '-' regular file, 'l' link, ...
    major: int | None = None
    minor: int | None = None
    mode: str | None = None


_LS_LINE = re.compile(
    r"^(?P<mode>[-bcdlps][-rwxsStT]{9})[.+@]?\s+\d+\s+\S+\s+\S+\s+"  # links, owner, group
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
        major, minor = m.group("major"), m.group("minor")
        nodes[path] = DevNode(path, m.group("mode")[0], major=int(major) if major else None,
                              minor=int(minor) if minor else None, mode=m.group("mode"))
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


def check_device_nodes(listing: str, expected_count: int | None,
                       open_errors: Mapping[str, str | None] | None = None) -> list[Check]:
    """Checks of the NVIDIA device nodes inside the container, from ``ls -l /dev/nvidia*``.

    ``open_errors`` (optional, :func:`parse_open_results`) tells whether each node could be
    opened: ``EPERM`` means the device cgroup denies it.
    """
    nodes = parse_dev_listing(listing)
    uvm_major = uvm_major_of(nodes)
    checks = [_gpu_nodes_check(nodes, expected_count), _ctl_check(nodes.get("/dev/nvidiactl")),
              _uvm_check(nodes.get("/dev/nvidia-uvm"), uvm_major),
              _uvm_tools_check(nodes.get("/dev/nvidia-uvm-tools"), uvm_major)]
    if not open_errors:
        checks.append(Check("dev-cgroup", "skipped",
                            "open test not run" if open_errors is None else "no node to open"))
        return checks
    checks.append(check_open_results(open_errors, nodes, expected_count))
    return checks


def _gpu_nodes_check(nodes: Mapping[str, DevNode], expected_count: int | None) -> Check:
    """``dev-nvidia-gpus``: /dev/nvidia0..N-1 are character devices (an empty file is a
    skipped bind mount's placeholder)."""
    gpu_nodes = {int(m.group(1)): n for p, n in nodes.items() if (m := _GPU_NODE.match(p))}
    good = sorted(i for i, n in gpu_nodes.items() if n.kind == "c")
    placeholders = sorted(i for i, n in gpu_nodes.items() if n.kind != "c")
    want = range(expected_count) if expected_count else range(max(1, len(gpu_nodes)))
    missing = [i for i in want if i not in good]
    if missing:
        found = f"{len(good)} GPU nodes" + (f" (/dev/nvidia{{{_ranges(good)}}})" if good else "")
        if placeholders:
            found += "; " + "; ".join(SKIPPED_MOUNT.format(path=f"/dev/nvidia{i}") for i in placeholders)
        return _fail(
            "dev-nvidia-gpus",
            f"missing GPU device nodes: {', '.join(f'/dev/nvidia{i}' for i in missing)}",
            expected=f"/dev/nvidia0../dev/nvidia{want[-1]} as character devices {NVIDIA_MAJOR}:N",
            found=found,
            fix=gpu_nodes_fix([f"/dev/nvidia{i}" for i in missing]),
            missing=missing,
        )
    wrong_major = [i for i in good if gpu_nodes[i].major not in (None, NVIDIA_MAJOR)]
    if wrong_major:
        return Check("dev-nvidia-gpus", "warn",
                     f"GPU nodes with a major other than {NVIDIA_MAJOR}: {wrong_major}",
                     expected=f"major {NVIDIA_MAJOR}", found=str(wrong_major))
    return Check("dev-nvidia-gpus", "pass", f"{len(good)} GPU node{'s' * (len(good) != 1)} "
                 f"(/dev/nvidia{{{_ranges(good)}}})")


def _ctl_check(ctl: DevNode | None) -> Check:
    if ctl is not None and ctl.kind == "c":
        return Check("dev-nvidiactl", "pass", f"/dev/nvidiactl {ctl.major}:{ctl.minor}")
    return _fail(
        "dev-nvidiactl",
        "/dev/nvidiactl is missing" if ctl is None else SKIPPED_MOUNT.format(path="/dev/nvidiactl"),
        expected=f"/dev/nvidiactl, character device {NVIDIA_MAJOR}:{NVIDIACTL_MINOR}",
        found="absent" if ctl is None else f"{ctl.mode}",
        fix=gpu_nodes_fix(["/dev/nvidiactl"]),
    )


def _uvm_check(uvm: DevNode | None, uvm_major: int | None) -> Check:
    if uvm is not None and uvm.kind == "c":
        return Check("dev-nvidia-uvm", "pass", f"/dev/nvidia-uvm {uvm.major}:{uvm.minor}")
    why = ("/dev/nvidia-uvm is missing: CUDA cannot initialise without it (cuInit returns "
           "999 CUDA_ERROR_UNKNOWN) although nvidia-smi works"
           if uvm is None else SKIPPED_MOUNT.format(path="/dev/nvidia-uvm"))
    return _fail(
        "dev-nvidia-uvm",
        why,
        expected="/dev/nvidia-uvm, a character device (major of nvidia-uvm)",
        found="absent" if uvm is None else f"{uvm.mode} (regular file)",
        fix=uvm_fix(uvm_major),
    )


def _uvm_tools_check(tools: DevNode | None, uvm_major: int | None) -> Check:
    if tools is not None and tools.kind == "c":
        return Check("dev-nvidia-uvm-tools", "pass",
                     f"/dev/nvidia-uvm-tools {tools.major}:{tools.minor}")
    return Check(
        "dev-nvidia-uvm-tools", "warn",
        "/dev/nvidia-uvm-tools is missing (CUDA runs without it; profilers and some "
        "tools need it)",
        fix="\n".join(uvm_fix(uvm_major).splitlines()[:4]),
        expected="/dev/nvidia-uvm-tools", found="absent" if tools is None else "regular file",
    )


#: errno (name or number) of a failed open() -> its kind. EPERM: the device cgroup refused
#: it (cgroup v1 and v2 BPF). ENXIO/ENODEV: the cgroup PERMITTED it but no driver instance
#: answered (stale node after a driver reload, or no kernel driver).
_OPEN_ERRNO = {
    "EPERM": "denied", "1": "denied", "EACCES": "access", "13": "access",
    "ENOENT": "missing", "2": "missing",
    "ENXIO": "no-device", "ENODEV": "no-device", "6": "no-device", "19": "no-device",
}


def classify_open(error: str | None) -> str:
    """'ok' | 'denied' (device cgroup) | 'access' (mode/owner) | 'missing' | 'no-device' | 'other'."""
    return _OPEN_ERRNO.get(error.split()[0], "other") if error else "ok"


def required_node(path: str, expected_count: int | None = None) -> bool:
    """Nodes CUDA needs: nvidiactl, nvidia-uvm and the expected GPUs' nodes (not uvm-tools,
    modeset, nvswitch... nor GPUs beyond the expected count)."""
    if path in ("/dev/nvidiactl", "/dev/nvidia-uvm"):
        return True
    m = _GPU_NODE.match(path)
    return m is not None and (expected_count is None or int(m.group(1)) < expected_count)


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
    expected = "every /dev/nvidia* node can be opened (read-write)"
    if kinds.get("denied") or kinds.get("access"):
        return _refused_check(kinds, open_errors, nodes, expected_count)
    if kinds.get("missing"):
        return _fail("dev-cgroup", "NVIDIA device nodes vanished while being opened (ENOENT)",
                     expected=expected, found=_open_found(open_errors, kinds["missing"]),
                     fix=gpu_nodes_fix(kinds["missing"]), missing=kinds["missing"])
    if kinds.get("other"):
        found = _open_found(open_errors, kinds["other"])
        return Check("dev-cgroup", "warn", "some NVIDIA device nodes fail to open for another "
                     "reason: " + found, expected=expected, found=found,
                     fix="compare `ls -l /dev/nvidia*` inside the container and on the host")
    permitted = len(open_errors)
    no_device = kinds.get("no-device", [])
    if no_device:
        return Check("dev-cgroup", "pass",
                     f"the device cgroup permits all {permitted} nodes; {len(no_device)} answer "
                     "ENXIO/ENODEV (no driver instance behind them: the CUDA probe decides)",
                     details={"no_device": no_device})
    return Check("dev-cgroup", "pass", f"all {permitted} nodes open read-write")


def _open_found(open_errors: Mapping[str, str | None], paths: list[str]) -> str:
    return "; ".join(f"{p}: {open_errors[p]}" for p in paths)


def _refused_check(kinds: Mapping[str, list[str]], open_errors: Mapping[str, str | None],
                   nodes: Mapping[str, DevNode], expected_count: int | None) -> Check:
    """EPERM (the device cgroup) or EACCES (mode/owner, or the cgroup): the allow lines for
    the real majors; a warning when CUDA needs none of the refused nodes."""
    expected = "every /dev/nvidia* node can be opened (read-write)"
    denied = kinds.get("denied", []) + kinds.get("access", [])
    # the container needs both families; the uvm major is read from the node itself
    uvm_major = uvm_major_of(nodes)
    majors: set[int | str] = {NVIDIA_MAJOR} if uvm_major is None else {NVIDIA_MAJOR, uvm_major}
    for path in denied:
        node = nodes.get(path)
        majors.add(node.major if node and node.major is not None else (
            NVIDIA_MAJOR if _GPU_NODE.match(path) or path == "/dev/nvidiactl" else "<uvm-major>"))
    allow = cgroup_fix(sorted(majors, key=str))
    if kinds.get("denied"):
        message = ("the container's device cgroup denies opening "
                   + ", ".join(kinds["denied"]) + " (EPERM)")
        fix = allow
        if kinds.get("access"):
            message += "; permission denied (EACCES) on " + ", ".join(kinds["access"])
    else:
        message = ("opening " + ", ".join(kinds["access"]) + " is refused (EACCES): the "
                   "node's mode/owner, or the container's device cgroup")
        fix = ("EACCES: give the nodes mode `crw-rw-rw-` on the LXC host before the bind "
               "mount (unprivileged containers see them as nobody:nogroup, which is fine "
               "with that mode); if the mode is right, the device cgroup refuses them:\n"
               + allow)
    details = {"denied": sorted(kinds.get("denied", [])),
               "refused": sorted(kinds.get("access", []))}
    found = _open_found(open_errors, denied)
    if not any(required_node(p, expected_count) for p in denied):
        return Check("dev-cgroup", "warn", message + " (nodes CUDA does not need)",
                     fix=fix, expected=expected, found=found, details=details)
    return _fail("dev-cgroup", message, expected=expected, found=found, fix=fix, **details)
