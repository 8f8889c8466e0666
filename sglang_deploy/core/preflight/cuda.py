"""The CUDA driver-API probe (pure): its JSON -> checks, and the diagnosis of CUDA errors in a
container."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sglang_deploy.core.preflight.checks import (
    HOST_VERSION_HINT,
    NVIDIA_MAJOR,
    USERSPACE_FIX,
    Check,
    _fail,
    cgroup_fix,
    gpu_nodes_fix,
    uvm_fix,
)
from sglang_deploy.core.preflight.smi import (
    SKIPPED_MOUNT,
    DevNode,
    parse_dev_listing,
    uvm_major_of,
)

#: (why, fix) by CUresult code, for the codes whose diagnosis needs nothing but the code
_CODE_DIAGNOSES: dict[int, tuple[str, str]] = {
    803: ("The container's libcuda (userspace driver) is not the version of the host's kernel "
          "module", HOST_VERSION_HINT + "\n" + USERSPACE_FIX),
    804: ("CUDA forward-compatibility libraries (cuda-compat) are in use on a GPU that does not "
          "support them",
          "Remove the compat directory (e.g. /usr/local/cuda/compat) from LD_LIBRARY_PATH and "
          "/etc/ld.so.conf.d, run `ldconfig`, so that the driver's own libcuda.so.1 is used."),
    35: ("Insufficient driver: the libcuda.so.1 in the container is older than the CUDA version "
         "in use, or it is not the version of the host's kernel module",
         HOST_VERSION_HINT + "\nIf they match, the host driver is too old for this CUDA build: "
         "upgrade the host driver and then the container userspace to the same version. "
         + USERSPACE_FIX),
    34: ("The CUDA toolkit's stub libcuda was loaded instead of the driver",
         "Remove the toolkit's `stubs` directory from LD_LIBRARY_PATH / ld.so.conf and run "
         "`ldconfig`; install the driver userspace if no real libcuda.so.1 exists."),
    100: ("The driver sees no usable GPU: /dev/nvidiaN are missing in the container, denied by "
          "its device cgroup, or CUDA_VISIBLE_DEVICES hides them",
          gpu_nodes_fix(["..."], include_ctl=True)
          + "\nAlso check that CUDA_VISIBLE_DEVICES is unset or lists the GPUs."),
    46: ("The GPU is busy or in exclusive-process compute mode",
         "Stop the other GPU process (`nvidia-smi` lists it) or set the default compute mode on "
         "the host: `nvidia-smi -c DEFAULT`."),
    2: ("GPU memory is taken", "Stop the processes `nvidia-smi` lists on the GPUs."),
}


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
    if code == 304:
        return (
            f"{label}. An operating-system call inside the driver failed: typically a device node "
            "could not be opened or mapped (permissions, device cgroup) or the userspace does not "
            "match the kernel module",
            cgroup_fix([NVIDIA_MAJOR, uvm_major_of(nodes) or "<uvm-major>"]) + "\n" + HOST_VERSION_HINT,
        )
    if code in _CODE_DIAGNOSES:
        why, fix = _CODE_DIAGNOSES[code]
        return f"{label}. {why}", fix
    return (label, "Run the probe by hand (`python3 cuda_probe.py`) and compare with the host; "
            + HOST_VERSION_HINT)


def check_cuda_probe(
    probe: Mapping[str, Any] | None,
    expected_count: int | None,
    listing: str | None = None,
) -> list[Check]:
    """Checks from the CUDA probe's JSON object (see ``remote/cuda_probe.py``).

    ``listing`` (``ls -l /dev/nvidia*``, optional) sharpens the diagnosis of 999.
    """
    if probe is None:
        return [Check("cuda-init", "skipped", "CUDA probe not run"),
                Check("cuda-devices", "skipped", "CUDA probe not run")]
    node_map = parse_dev_listing(listing) if listing is not None else None
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
        checks.append(Check("cuda-devices", "pass", f"{count} CUDA device{'s' * (count != 1)}: {summary}",
                            details={"count": count}))
    return checks


def _error_found(error: Mapping[str, Any]) -> str:
    parts = [str(error.get("call"))]
    if error.get("name") or error.get("code") is not None:
        parts.append(f"{error.get('name') or ''} ({error.get('code')})".strip())
    if error.get("message"):
        parts.append(str(error.get("message")))
    return ": ".join(parts)


