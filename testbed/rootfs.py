"""The testbed's base root file system: a cached, read-only Debian bookworm tree.

One base, many hosts: every testbed host boots from its own overlay whose lower dir is
this tree. The base is built once with debootstrap and cached under
``~/.cache/sglang-deploy/rootfs/<recipe-hash>/`` (override: env ``TESTBED_CACHE``).
It is rebuilt only when the recipe changes: the suite, the package list, ROOTFS_VERSION
or the content of the files baked in (all of them feed the hash).

Per-host things (SSH host keys, authorized key, hostname, machine-id, GPU stand-ins,
model stand-in) are NOT baked in: they go into each host's overlay upper dir.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

from testbed import log

ROOTFS_VERSION = 2
SUITE = "bookworm"
ARCH = "amd64"
PACKAGES = (
    "systemd", "systemd-sysv", "dbus", "openssh-server", "python3", "python3-venv",
    "sudo", "iproute2", "ca-certificates", "procps", "curl", "less",
    # the C++ compiler a GPU host needs for the JIT (nvcc's host compiler and the linker driver)
    "g++",
)
FALLBACK_MIRROR = "http://deb.debian.org/debian"

# Units that slow the boot, fail in a container, or are useless here.
MASKED_UNITS = (
    "console-getty.service", "getty@.service", "getty.target",
    "systemd-networkd.service", "systemd-networkd.socket", "systemd-networkd-wait-online.service",
    "systemd-resolved.service", "systemd-timesyncd.service",
    "apt-daily.timer", "apt-daily-upgrade.timer", "dpkg-db-backup.timer",
    "e2scrub_all.timer", "e2scrub_reap.service", "fstrim.timer", "man-db.timer",
    "systemd-hwdb-update.service", "systemd-remount-fs.service",
    "sys-kernel-debug.mount",  # debugfs: not mountable in an LXC container
)

# Baked into the base at the same path: an sshd drop-in. (The GPU device nodes are no part
# of the base: they come from the LXC host, this machine, by the container's config.)
BASE_FILES = Path(__file__).resolve().parent / "base"


def baked_files() -> dict[str, tuple[str, int]]:
    """Path in the base -> (content, mode: 0755 if executable)."""
    files = {}
    for f in sorted(BASE_FILES.rglob("*")):
        if f.is_file():
            text = f.read_text()
            mode = 0o755 if os.access(f, os.X_OK) else 0o644
            files[str(f.relative_to(BASE_FILES))] = (text, mode)
    return files


def mirror() -> str:
    """The Debian mirror apt on this machine uses (first `URIs:` of a debian suite)."""
    src = Path("/etc/apt/sources.list.d/debian.sources")
    if src.exists():
        for stanza in src.read_text().split("\n\n"):
            fields = dict(line.split(":", 1) for line in stanza.splitlines()
                          if ":" in line and not line.lstrip().startswith("#"))
            if SUITE in fields.get("Suites", "").split() and fields.get("URIs", "").strip():
                return fields["URIs"].split()[0]
    lst = Path("/etc/apt/sources.list")
    for line in lst.read_text().splitlines() if lst.exists() else []:
        parts = re.sub(r"\[.*?\]", "", line).split()  # without options such as [arch=amd64]
        if len(parts) >= 3 and parts[0] == "deb" and parts[2] == SUITE:
            return parts[1]
    return FALLBACK_MIRROR


def recipe() -> dict:
    return {
        "version": ROOTFS_VERSION, "suite": SUITE, "arch": ARCH, "variant": "minbase",
        "packages": list(PACKAGES), "masked": list(MASKED_UNITS),
        "files": {p: [hashlib.sha256(c.encode()).hexdigest(), m]
                  for p, (c, m) in baked_files().items()},
    }


def recipe_hash() -> str:
    blob = json.dumps(recipe(), sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def cache_dir() -> Path:
    return Path(os.environ.get("TESTBED_CACHE") or "~/.cache/sglang-deploy/rootfs").expanduser()


def base_path() -> Path:
    return cache_dir() / recipe_hash()


def _customise(root: Path) -> None:
    for rel, (content, mode) in baked_files().items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(content)
        p.chmod(mode)
    (root / "etc/systemd/system").mkdir(parents=True, exist_ok=True)
    for unit in MASKED_UNITS:
        p = root / "etc/systemd/system" / unit
        p.unlink(missing_ok=True)
        p.symlink_to("/dev/null")
    # Per-host identity lives in each host's overlay: no host keys, no machine-id, no hostname.
    for key in (root / "etc/ssh").glob("ssh_host_*"):
        key.unlink()
    (root / "etc/machine-id").write_text("")
    (root / "var/lib/dbus/machine-id").unlink(missing_ok=True)
    (root / "etc/hostname").unlink(missing_ok=True)
    (root / "etc/testbed").mkdir(exist_ok=True)
    (root / "root/.ssh").mkdir(mode=0o700, exist_ok=True)
    # Smaller base: the package lists and the .deb cache are not needed (no network inside).
    for d in ("var/cache/apt/archives", "var/lib/apt/lists"):
        for f in (root / d).glob("*"):
            if f.is_file():
                f.unlink()
    (root / ".testbed-recipe.json").write_text(json.dumps(recipe(), indent=1, sort_keys=True))


def ensure_base(force: bool = False) -> Path:
    """Return the cached base rootfs, building it (once, under a lock) if needed."""
    final = base_path()
    if final.is_dir() and not force:
        return final
    cache = cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / f".{final.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another builder of the same recipe: wait for it
        if final.is_dir() and not force:
            return final
        for stale in cache.glob(f".{final.name}.tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        tmp = cache / f".{final.name}.tmp-{os.getpid()}"
        t0 = time.monotonic()
        src = mirror()
        log(f"building base rootfs {final.name} ({SUITE}, minbase) from {src} ...")
        cmd = [
            "debootstrap", "--variant=minbase", f"--arch={ARCH}",
            "--include=" + ",".join(PACKAGES), SUITE, str(tmp), src,
        ]
        build_log = cache / f"{final.name}.build.log"
        with open(build_log, "w") as out:
            r = subprocess.run(cmd, check=False, stdout=out, stderr=subprocess.STDOUT)
        if r.returncode != 0:
            tail = build_log.read_text(errors="replace").splitlines()[-20:]
            shutil.rmtree(tmp, ignore_errors=True)
            raise RuntimeError(
                f"debootstrap failed (exit {r.returncode}); log: {build_log}\n" + "\n".join(tail)
            )
        _customise(tmp)
        if force and final.exists():
            old = cache / f".{final.name}.old-{os.getpid()}"
            final.rename(old)
            shutil.rmtree(old, ignore_errors=True)
        os.rename(tmp, final)
        log(f"base rootfs ready in {time.monotonic() - t0:.1f}s: {final}")
        return final
