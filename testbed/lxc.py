"""The testbed's hosts as plain-LXC containers (LXC 5, `lxc-start -P LXCPATH -n NAME`).

Each host is a container in the testbed's own lxcpath (``$TESTBED_DIR/lxc``: parallel
testbeds never collide), named as the host, its config at ``LXCPATH/NAME/config``:

- **unprivileged** by default, as Proxmox makes them: ``lxc.idmap = u 0 100000 65536`` (and
  g), root's ranges in /etc/subuid and /etc/subgid (``ensure_subids``); **privileged** on
  request (``up --privileged``, ``TESTBED_PRIVILEGED=1``, or ``python -m testbed kind HOST
  privileged``).
- The root file system is the host's overlay, as with nspawn. An idmapped mount of it
  (``lxc.rootfs.options = idmap=container``) is refused by the kernel (overlayfs cannot be
  idmapped: EINVAL, measured here on 6.18), so an unprivileged host's overlay lies over a
  uid-shifted copy of the base (``shifted_base``: made once per base, cached beside it) and
  what the testbed writes into it is owned by the container's root (``own``), as
  Proxmox's own unprivileged containers are stored (shifted on disk).
- Network: a veth on the testbed's bridge, configured by LXC
  (``lxc.net.0.*``: address, gateway, the fixed MAC); the container's network namespace is
  then named after the host (``ip netns attach``) so ``ip -n HOST`` works as before.
- The GPU device nodes come from this machine (``testbed/lxchost.py``'s simulated driver)
  through the config lines that the product's ``lxc_host.py`` merges into the config
  (``passthrough``); the scenarios that take nodes
  away or put them back act on the container's mount namespace from here
  (``testbed/lxcnodes.py``) and on its devices cgroup (``deny_devices``).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

from testbed import TestbedError, log

#: the unprivileged containers' id range on this machine (Proxmox's)
ID_BASE, ID_COUNT = 100000, 65536
LXC_SHARE = Path("/usr/share/lxc/config")
NODES_HELPER = Path(__file__).resolve().parent / "lxcnodes.py"


def lxc_path(state: dict) -> str:
    return str(Path(state["state_dir"]) / "lxc")


def privileged(h: dict) -> bool:
    return bool(h.get("privileged"))


def root_id(h: dict) -> int:
    """The id on this machine of the container's root (uid and gid)."""
    return 0 if privileged(h) else ID_BASE


def kind(h: dict) -> str:
    return "privileged" if privileged(h) else "unprivileged"


# --------------------------------------------------------------------------- ids and rootfs

def ensure_subids(files: tuple[Path, ...] = (Path("/etc/subuid"), Path("/etc/subgid"))) -> None:
    """root:ID_BASE:ID_COUNT in /etc/subuid and /etc/subgid (newuidmap refuses the map
    without them), added once; other lines kept."""
    want = f"root:{ID_BASE}:{ID_COUNT}"
    for f in files:
        lines = f.read_text().splitlines() if f.exists() else []
        if want not in (ln.strip() for ln in lines):
            f.write_text("".join(ln + "\n" for ln in [*lines, want]))


def shift_tree(root: Path, offset: int, via: Path | None = None) -> None:
    """Move the owner and group of everything under ROOT (not following links) by OFFSET:
    +ID_BASE moves the ids of a privileged container (0..ID_COUNT-1) to the unprivileged
    range, -ID_BASE back; ids already on the far side (an overlay's copied-up folder) are
    left. Set-id bits are kept (chown clears them). VIA: change each path through that
    folder instead (an overlay's merged folder when ROOT is its upper folder and the overlay
    is mounted: changed behind its back, the overlay would keep the old owner)."""
    def moved(i: int) -> int:
        if offset > 0 and i < ID_COUNT or offset < 0 and -offset <= i < -offset + ID_COUNT:
            return i + offset
        return i

    def shift(p: str) -> None:
        st = os.lstat(p)
        uid, gid = moved(st.st_uid), moved(st.st_gid)
        if (uid, gid) == (st.st_uid, st.st_gid):
            return
        if via is not None:
            p = str(via / os.path.relpath(p, root))
        os.lchown(p, uid, gid)
        if not stat.S_ISLNK(st.st_mode) and st.st_mode & 0o6000:
            os.chmod(p, stat.S_IMODE(st.st_mode))

    if offset == 0:
        return
    for d, dirs, files in os.walk(root):
        shift(d)
        for name in files:
            shift(os.path.join(d, name))
        for name in dirs:
            if os.path.islink(os.path.join(d, name)):
                shift(os.path.join(d, name))


def shifted_base(base: Path) -> Path:
    """BASE with every id moved up by ID_BASE (the unprivileged containers' lower dir),
    copied once and cached beside BASE."""
    final = base.with_name(f"{base.name}-u{ID_BASE}")
    if final.is_dir():
        return final
    with open(base.parent / f".{final.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if final.is_dir():
            return final
        t0 = time.monotonic()
        tmp = base.with_name(f".{final.name}.tmp-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        subprocess.run(["cp", "-a", str(base), str(tmp)], check=True)
        shift_tree(tmp, ID_BASE)
        os.rename(tmp, final)
        log(f"base rootfs for unprivileged containers ready in {time.monotonic() - t0:.1f}s: {final}")
    return final


def lower_dir(state: dict, h: dict) -> str:
    return state["base"] if privileged(h) else str(shifted_base(Path(state["base"])))


# --------------------------------------------------------------------------- config

def config_text(state: dict, h: dict) -> str:
    """The container's base config (the passthrough block is merged in by ``passthrough``)."""
    from testbed import net

    lines = [
        "# testbed host (python -m testbed); the GPU passthrough block below is lxc_host.py's",
        f"lxc.uts.name = {h['name']}",
        f"lxc.rootfs.path = dir:{h['merged']}",
        f"lxc.include = {LXC_SHARE}/common.conf",
    ]
    if not privileged(h):
        lines += [f"lxc.include = {LXC_SHARE}/userns.conf",
                  f"lxc.idmap = u 0 {ID_BASE} {ID_COUNT}",
                  f"lxc.idmap = g 0 {ID_BASE} {ID_COUNT}"]
        # userns.conf clears common.conf's device rules (`lxc.cgroup.devices.deny =`): a plain
        # unprivileged container would open any node bound into it. They are set again, as
        # Proxmox does for its unprivileged containers, so that lxc_host.py's device rules are
        # what lets the GPUs open, and a wrong rule fails the suite
        lines += [x for x in Path(LXC_SHARE, "common.conf").read_text().splitlines()
                  if x.startswith("lxc.cgroup.devices.")]
    lines += [
        "lxc.apparmor.profile = unconfined",
        "lxc.init.cmd = /sbin/init",
        "lxc.signal.halt = SIGRTMIN+3",
        "lxc.net.0.type = veth",
        f"lxc.net.0.link = {state['bridge']}",
        f"lxc.net.0.veth.pair = {h['veth']}",
        "lxc.net.0.name = eth0",
        "lxc.net.0.flags = up",
        f"lxc.net.0.hwaddr = {net.host_mac(h['address'])}",
        f"lxc.net.0.ipv4.address = {h['address']}/24",
        f"lxc.net.0.ipv4.gateway = {state['gateway']}",
        f"lxc.console.logfile = {h['console']}",
        # /dev/fuse, as Proxmox's `features: fuse=1` passes it: a world-usable node outside
        # every DeviceAllow, by which the release smoke tells whether DevicePolicy is in force
        "lxc.cgroup.devices.allow = c 10:229 rwm",
        "lxc.mount.entry = /dev/fuse dev/fuse none bind,create=file 0 0",
    ]
    return "".join(ln + "\n" for ln in lines)


def config_path(state: dict, h: dict) -> Path:
    return Path(lxc_path(state)) / h["name"] / "config"


def write_config(state: dict, h: dict) -> Path:
    path = config_path(state, h)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(config_text(state, h))
    return path


# --------------------------------------------------------------------------- GPU passthrough

def passthrough(state: dict, hosts: list[dict]) -> None:
    """The product's GPU passthrough (``pyinfra @local lxc_host.py``, through
    ``testbed/lxchost.py``: this machine as the LXC host with its simulated driver) for
    HOSTS' containers: their configs get its lines, or the run fails the testbed. A stopped
    container whose lines it changed is started by it; a running one is left running
    (``restart: never``)."""
    from testbed import lxchost

    sim = lxchost.SimDriver()

    def drop_namespace() -> None:
        # lxc_host.py (and the containers it starts) run in lxchost's namespace, a private
        # copy of this machine's mounts made when it is made: made afresh for each run, it
        # sees the hosts' overlays as they are now; dropped after, it holds none of them
        # (a kept copy of an overlay would keep its work dir busy for the next mount)
        if sim.mntns.exists() and subprocess.run(["findmnt", "-rn", str(sim.mntns)],
                                                 capture_output=True, check=False).returncode == 0:
            subprocess.run(["umount", str(sim.mntns)], capture_output=True, check=False)

    drop_namespace()
    try:
        lxchost.passthrough(lxc_path(state), [
            {"name": h["name"], "dialect": "lxc", "unprivileged": not privileged(h),
             "restart": "never"} for h in hosts])
    except TestbedError as e:
        raise TestbedError(f"{', '.join(h['name'] for h in hosts)}: the GPU passthrough "
                           f"failed: {e}") from None
    finally:
        drop_namespace()


def passed_nodes(state: dict, h: dict) -> list[str]:
    """The node paths the container's config bind-mounts (its ``lxc.mount.entry`` lines for
    /dev/nvidia*)."""
    out = []
    for line in config_path(state, h).read_text().splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "lxc.mount.entry" and value.split()[0].startswith("/dev/nvidia"):
            out.append(value.split()[0])
    return out


def denied_majors(state: dict, h: dict) -> list[int]:
    """The majors the config's device rules allow for the passed nodes."""
    majors = set()
    for path in passed_nodes(state, h):
        with contextlib.suppress(OSError):
            st = os.stat(path)
            if stat.S_ISCHR(st.st_mode):
                majors.add(os.major(st.st_rdev))
    return sorted(majors)


def sync_nodes(h: dict, present: list[str], absent: list[str]) -> dict:
    """Put PRESENT nodes (bind mounts of this machine's) into the running container and take
    ABSENT ones away (``lxcnodes.py``)."""
    r = subprocess.run([sys.executable, "-I", str(NODES_HELPER), str(h["pid"]),
                        json.dumps({"present": present, "absent": absent})],
                       capture_output=True, text=True, timeout=30, check=False)
    if r.returncode != 0:
        raise TestbedError(f"{h['name']}: could not set its /dev/nvidia* nodes from the LXC "
                           f"host (rc={r.returncode}): {r.stderr.strip()[-500:]}")
    return json.loads(r.stdout)


# --------------------------------------------------------------------------- devices cgroup

DEVICES_CGROUP = Path(os.environ.get("TESTBED_DEVICES_CGROUP", "/sys/fs/cgroup/devices"))


def payload_cgroup(pid: int, controller: str, root: Path) -> Path:
    """The container's own cgroup (``lxc.payload.NAME``) of CONTROLLER (v1), from its init
    PID's placement."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, ctrls, path = line.split(":", 2)
        if controller in ctrls.split(","):
            parts = [p for p in path.split("/") if p]
            for i, part in enumerate(parts):
                if part.startswith("lxc.payload"):
                    return root.joinpath(*parts[: i + 1])
    raise TestbedError(f"pid {pid} is in no LXC container's {controller} cgroup")


def _cgroups_below(top: Path) -> list[Path]:
    """TOP and every cgroup under it, parents first."""
    return [top, *sorted((p.parent for p in top.rglob("devices.list") if p.parent != top),
                         key=lambda p: len(p.parts))]


def deny_devices(state: dict, h: dict) -> None:
    """The container's devices cgroup refuses the NVIDIA majors (as a config without its
    device rules): a rule on its payload cgroup, which the kernel hands down to every cgroup
    below it. The allow-lists of the cgroups below that list the majors themselves (a
    privileged container's units under DevicePolicy) are kept to put back."""
    if not (DEVICES_CGROUP / "devices.deny").exists():
        raise TestbedError(
            f"the cgroup-denied scenario needs the cgroup v1 devices controller at "
            f"{DEVICES_CGROUP} (this machine has none); on a cgroup v2 host the equivalent "
            "is the container's config without its lxc.cgroup2.devices.allow lines")
    top = payload_cgroup(h["pid"], "devices", DEVICES_CGROUP)
    majors = denied_majors(state, h)
    saved = {}
    for cg in _cgroups_below(top):
        with contextlib.suppress(OSError):
            lines = (cg / "devices.list").read_text().splitlines()
            mine = [ln for ln in lines if any(f" {m}:" in ln for m in majors)]
            if mine:
                saved[str(cg.relative_to(top))] = mine
    (Path(h["dir"]) / "devices-saved.json").write_text(json.dumps(
        {"majors": majors, "saved": saved}))
    for m in majors:
        (top / "devices.deny").write_text(f"c {m}:* rwm\n")


def allow_devices(state: dict, h: dict) -> None:
    """Undo ``deny_devices``: the majors allowed again on the payload and on every cgroup
    below that allows everything else, and the saved allow-lists put back."""
    saved_file = Path(h["dir"]) / "devices-saved.json"
    if not saved_file.exists() or not h.get("pid"):
        return
    data = json.loads(saved_file.read_text())
    top = payload_cgroup(h["pid"], "devices", DEVICES_CGROUP)
    for cg in _cgroups_below(top):
        with contextlib.suppress(OSError):
            lines = (cg / "devices.list").read_text().splitlines()
            rel = str(cg.relative_to(top))
            if lines[:1] == ["a *:* rwm"] or cg == top:
                for m in data["majors"]:
                    (cg / "devices.allow").write_text(f"c {m}:* rwm\n")
            for ln in data["saved"].get(rel, []):
                (cg / "devices.allow").write_text(ln + "\n")
    saved_file.unlink()


# --------------------------------------------------------------------------- run

def _lxc(cmd: str, state: dict, h: dict, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([cmd, "-P", lxc_path(state), "-n", h["name"], *args],
                          capture_output=True, text=True, timeout=timeout, check=False,
                          stdin=subprocess.DEVNULL)


def init_pid(state: dict, h: dict) -> int | None:
    r = _lxc("lxc-info", state, h, "-pH", timeout=10)
    out = r.stdout.strip()
    return int(out) if r.returncode == 0 and out.isdigit() else None


CGROUP_ROOT = Path("/sys/fs/cgroup")


def clear_stale_cgroups(name: str, root: Path = CGROUP_ROOT) -> int:
    """The empty cgroups a container NAME left when it was killed with its monitor (LXC did
    not get to remove them), removed deepest first, in every hierarchy (cgroup v1's
    controllers, v2's unified): a new start then gets ``lxc.payload.NAME`` again, not
    ``NAME-1``. A cgroup that still holds a process is left (rmdir refuses it). The count
    removed."""
    tops = [root / f"lxc.{kind}.{name}" for kind in ("payload", "monitor")]
    with contextlib.suppress(OSError):
        tops += [d / f"lxc.{kind}.{name}" for d in root.iterdir() if d.is_dir()
                 for kind in ("payload", "monitor")]
    removed = 0
    for top in tops:
        if not top.is_dir():
            continue
        for folder, _, _ in os.walk(top, topdown=False):
            with contextlib.suppress(OSError):
                os.rmdir(folder)
                removed += 1
    return removed


def start(state: dict, h: dict) -> int:
    """lxc-start the host's container (daemonised) unless the passthrough started it; name
    its netns; its init's PID."""
    log_file = Path(h["dir"]) / "lxc.log"
    r = subprocess.CompletedProcess([], 0, "", "")
    if init_pid(state, h) is None:
        r = _lxc("lxc-start", state, h, "-l", "WARN", "-o", str(log_file))
    if r.returncode != 0:
        raise TestbedError(f"{h['name']}: lxc-start failed (rc={r.returncode}): "
                           f"{r.stderr.strip()[-800:]}\nlxc log tail:\n{tail(log_file)}")
    pid = init_pid(state, h)
    if pid is None:
        raise TestbedError(f"{h['name']}: started but lxc-info has no init pid; lxc log tail:\n"
                           f"{tail(log_file)}")
    subprocess.run(["ip", "netns", "delete", h["netns"]], capture_output=True, check=False)
    r = subprocess.run(["ip", "netns", "attach", h["netns"], str(pid)], capture_output=True,
                       text=True, check=False)
    if r.returncode != 0:
        raise TestbedError(f"{h['name']}: ip netns attach {h['netns']} {pid}: {r.stderr.strip()}")
    return pid


def stop(state: dict, h: dict, timeout: float) -> bool:
    """lxc-stop: the halt signal (an orderly poweroff), killed after TIMEOUT. True if it
    stopped in time without the kill."""
    r = _lxc("lxc-stop", state, h, "-t", str(int(timeout)), timeout=timeout + 30)
    if r.returncode != 0 and init_pid(state, h) is not None:
        _lxc("lxc-stop", state, h, "-k", timeout=30)
    subprocess.run(["ip", "netns", "delete", h["netns"]], capture_output=True, check=False)
    return r.returncode == 0


def tail(path: Path | str, n: int = 25) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(none)"
