"""Which of the unit's hardening is really in force on a host (pure).

systemd applies some [Service] properties only where the kernel and the container let it,
and ignores the rest without a word: DevicePolicy= needs BPF device programs (cgroup v2) or a
writable v1 devices cgroup, which an unprivileged LXC container does not have (systemd issue
23198; lxc issues 3199, 4347), so ``systemd-analyze security`` counts protection that is not
there. The release smoke, run under the unit's own properties before the switch
(``remote/release_smoke.py``, its ``sandbox`` step), reads what its process really got; this
module judges that observation, property by property, into the host's record
(``Layout.hardening_record``) that ``status`` and ``report`` show, and names the nodes the
server needs that the sandbox refuses (``NEEDED``; the smoke itself then fails before the
switch, naming the node).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from sglang_deploy.core.hostrecords import Hardening

if TYPE_CHECKING:
    from sglang_deploy.core.smoke import SmokeError

#: the device nodes a CUDA server opens: GPUs, the control node, unified memory
NEEDED = re.compile(r"^/dev/nvidia(\d+|ctl|-uvm|-uvm-tools)$")

DEVICE_FIX = ("let the container's systemd apply device rules (a privileged container, or "
              "systemd with cgroup v2 and BPF device programs), or restrict the container on "
              "the LXC host to the GPU nodes (lxc.cgroup2.devices.allow / Proxmox dev0: lines), "
              "so that the container's own device cgroup does what DevicePolicy would")
WHY_DEVICES = ("the container's systemd cannot apply DevicePolicy= (no BPF device programs or "
               "a read-only devices cgroup: an unprivileged container; systemd issue 23198, lxc "
               "issues 3199 and 4347)")

#: property -> (what is in force, why it may not be, what the operator can do)
PROPERTIES: dict[str, tuple[str, str, str]] = {
    "NoNewPrivileges": (
        "no_new_privs set (NoNewPrivs: 1)",
        "the process runs without no_new_privs",
        "check the container's systemd (`systemd-analyze security sglang`) and its kernel"),
    "SystemCallFilter": (
        "a seccomp filter (Seccomp: 2)",
        ("no seccomp filter on the process: the container's kernel or its LXC seccomp policy "
         "does not let systemd install one"),
        ("allow seccomp filters in the container (a kernel with CONFIG_SECCOMP_FILTER; LXC: "
         "lxc.seccomp.allow_nesting = 1)")),
    "CapabilityBoundingSet": (
        "an empty capability bounding set (CapBnd: 0)",
        "the process keeps capabilities in its bounding set",
        ("check that the unit's CapabilityBoundingSet= is empty and the container's systemd "
         "applies it")),
    "DevicePolicy": (
        "device nodes outside DeviceAllow refused",
        WHY_DEVICES,
        DEVICE_FIX),
    "ProtectSystem": (
        "a write outside ReadWritePaths refused by a read-only mount (EROFS)",
        ("a write outside ReadWritePaths was not refused by a read-only mount: the container's "
         "systemd cannot set up the service's mount namespace"),
        ("allow mount namespaces for the container's systemd (LXC: features: nesting=1, or an "
         "AppArmor profile that allows the mounts)")),
}


def smoke_devices(listing: str | None) -> list[str]:
    """The /dev/nvidia* character nodes of the pre-flight's ``ls -l`` listing (``dev-nvidia.txt``),
    in the listing's order: the nodes the smoke opens under the unit's sandbox."""
    out = []
    for line in (listing or "").splitlines():
        fields = line.split()
        if len(fields) >= 2 and fields[0].startswith("c") and fields[-1].startswith("/dev/nvidia"):
            out.append(fields[-1])
    return out


def _cap_empty(value: str | None) -> bool | None:
    if not value:
        return None
    try:
        return int(value, 16) == 0
    except ValueError:
        return None


def _devices(sandbox: Mapping[str, Any]) -> tuple[bool | None, str]:
    outside = dict(sandbox.get("outside") or {})
    if not outside:
        return None, "no device node outside DeviceAllow that opens without the sandbox"
    opened = sorted(d for d, seen in outside.items() if seen == "ok")
    if opened:
        return False, f"{', '.join(opened)} opened although DeviceAllow does not list it"
    return True, "; ".join(f"{d} {seen}" for d, seen in sorted(outside.items()))


def _writes(sandbox: Mapping[str, Any]) -> tuple[bool | None, str]:
    w = sandbox.get("write_outside") or {}
    result, path = w.get("result"), w.get("path", "?")
    if result is None:
        return None, "no write tried"
    if result == "refused-readonly":
        return True, f"a write in {path} refused (read-only file system)"
    return False, f"a write in {path}: {result}"


def judge(sandbox: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One entry per property of ``PROPERTIES``: ``name``, ``in_force`` (True, False, or None:
    cannot tell), ``found`` (what the smoke saw) and, when not in force, ``why`` and ``fix``."""
    status = sandbox.get("status") or {}
    seen: dict[str, tuple[bool | None, str]] = {
        "NoNewPrivileges": (None if "NoNewPrivs" not in status else status["NoNewPrivs"] == "1",
                            f"NoNewPrivs: {status.get('NoNewPrivs', '?')}"),
        "SystemCallFilter": (None if "Seccomp" not in status else status["Seccomp"] == "2",
                             f"Seccomp: {status.get('Seccomp', '?')}"),
        "CapabilityBoundingSet": (_cap_empty(status.get("CapBnd")),
                                  f"CapBnd: {status.get('CapBnd', '?')}"),
        "DevicePolicy": _devices(sandbox),
        "ProtectSystem": _writes(sandbox),
    }
    out = []
    for name, (good, why, fix) in PROPERTIES.items():
        in_force, found = seen[name]
        entry = {"name": name, "in_force": in_force, "found": found}
        if in_force is False:
            entry.update(why=why, fix=fix)
        elif in_force:
            entry["what"] = good
        out.append(entry)
    return out


def record(sandbox: Mapping[str, Any], release: str, checked_at: str) -> dict[str, Any]:
    """The host's record of what the smoke of RELEASE saw at CHECKED_AT."""
    return {"release": release, "checked_at": checked_at, "properties": judge(sandbox),
            "cuda": dict(sandbox.get("cuda") or {})}


def summary(rec: Hardening | None) -> dict[str, Any] | None:
    """For ``status --json``: ``in_force``, ``not_in_force`` (name, why, fix, found),
    ``unknown`` and when it was checked; None when no smoke ran under the sandbox yet."""
    if rec is None:
        return None
    props = rec.properties
    return {"checked_at": rec.checked_at, "release": rec.release,
            "in_force": [p.name for p in props if p.in_force is True],
            "not_in_force": [{"name": p.name, "found": p.found, "why": p.why, "fix": p.fix}
                             for p in props if p.in_force is False],
            "unknown": [p.name for p in props if p.in_force is None]}


def lines(host: str, hardening: Mapping[str, Any] | None) -> list[str]:
    """Text lines for ``status``/``report``: one per property not in force (why, fix)."""
    if not hardening:
        return []
    return [f"{host}: {p['name']} not in force: {p['why']} ({p['found']}); fix: {p['fix']}"
            for p in hardening.get("not_in_force") or []]


def required_error(rec: Mapping[str, Any], required: list[str], host: str
                   ) -> SmokeError | None:
    """The error when a property of REQUIRED (``sglang_hardening_required``) is not proven in
    force on HOST by the smoke's record REC (not in force, or cannot tell); None when all are."""
    from sglang_deploy.core.smoke import SmokeError

    props = {p["name"]: p for p in rec.get("properties") or []}
    short = [props.get(n) or {"name": n, "in_force": None, "found": "not observed"}
             for n in required if (props.get(n) or {}).get("in_force") is not True]
    if not short:
        return None
    found = [f"{p['name']}: " + (f"not in force: {p.get('why')} ({p['found']})"
                                 if p["in_force"] is False else f"cannot tell ({p['found']})")
             for p in short]
    fixes = [f"{p['name']}: {PROPERTIES[p['name']][2]}" for p in short]
    return SmokeError(
        what=f"the hardening `sglang_hardening_required` names is in force under the unit's "
             f"sandbox on host {host}",
        found="\n".join(found),
        fix="\n".join(fixes) + "\n(or drop the property from `sglang_hardening_required`)")
