"""Make a running LXC container's /dev/nvidia* nodes what a scenario wants, from the LXC
host (run as its own process: it enters the container's mount namespace).

    python3 -I testbed/lxcnodes.py PID SPEC_JSON

SPEC_JSON: {"present": ["/dev/nvidia0", ...], "absent": ["/dev/nvidia7", ...]}. A present
node that the container lacks is bind-mounted from this machine's node of the same path, as
the container's `lxc.mount.entry` line does at start (a clone of the host's node, made here
with open_tree, moved into the container's /dev with move_mount: no mknod inside, which an
unprivileged container cannot open anyway, its /dev being nodev). An absent node is
unmounted and removed, as on an LXC host whose config or driver does not pass it. Prints
one JSON line: what it did.
"""

from __future__ import annotations

import ctypes
import json
import os
import stat
import sys

SYS_OPEN_TREE, SYS_MOVE_MOUNT = 428, 429  # x86_64
AT_FDCWD, AT_RECURSIVE, OPEN_TREE_CLONE, OPEN_TREE_CLOEXEC = -100, 0x8000, 1, 0o2000000
MOVE_MOUNT_F_EMPTY_PATH = 0x4
MNT_DETACH = 2
CLONE_NEWNS = 0x00020000

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _check(rc: int, what: str) -> int:
    if rc < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return rc


def clone_node(path: str) -> int:
    """A detached bind mount of the host's PATH (a file descriptor)."""
    return _check(_libc.syscall(SYS_OPEN_TREE, AT_FDCWD, path.encode(),
                                OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC), f"open_tree {path}")


def attach(fd: int, target: str) -> None:
    _check(_libc.syscall(SYS_MOVE_MOUNT, fd, b"", AT_FDCWD, target.encode(),
                         MOVE_MOUNT_F_EMPTY_PATH), f"move_mount {target}")


def _is_char(path: str) -> bool:
    try:
        return stat.S_ISCHR(os.stat(path).st_mode)
    except OSError:
        return False


def _exists(path: str) -> bool:
    return os.path.lexists(path)


def _outside_root(id_map: str) -> int:
    """The id on this machine of the container's id 0 (0 for a privileged container)."""
    with open(id_map) as f:
        text = f.read()
    for line in text.splitlines():
        inside, outside, _count = (int(x) for x in line.split())
        if inside == 0:
            return outside
    return 0


def remove(path: str) -> bool:
    """Unmount (every bind stacked on it) and unlink PATH; True if it was there."""
    was = _exists(path)
    while os.path.ismount(path) or _is_char(path):
        if _libc.umount2(path.encode(), MNT_DETACH) != 0:
            break
    if _exists(path):
        os.unlink(path)
    return was


def main(argv: list[str]) -> int:
    pid, spec = int(argv[1]), json.loads(argv[2])
    present, absent = spec.get("present", []), spec.get("absent", [])
    root_uid, root_gid = (_outside_root(f"/proc/{pid}/{m}") for m in ("uid_map", "gid_map"))
    clones = {p: clone_node(p) for p in present}  # in this machine's mount namespace
    with open(f"/proc/{pid}/ns/mnt") as ns:
        _check(_libc.setns(ns.fileno(), CLONE_NEWNS), f"setns into pid {pid}'s mounts")
    os.chdir("/")
    done = {"added": [], "removed": []}
    for path in absent:
        if remove(path):
            done["removed"].append(path)
    for path, fd in clones.items():
        if _is_char(path) and os.path.ismount(path):
            continue
        remove(path)  # a left-over plain file would open as a node that works
        _libc.setfsgid(root_gid)  # a file the container's root owns (host root has no id there)
        _libc.setfsuid(root_uid)
        os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o666))
        _libc.setfsuid(0)
        _libc.setfsgid(0)
        attach(fd, path)
        done["added"].append(path)
    print(json.dumps(done))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
