"""Testbed helpers for a testbed host lost outright and brought back by the documented
commands (issue 38, item 3; docs/operations.md, "A lost container").

Testbed-only: production code never imports this. What a real operator has ready before a
container is lost, made here from the testbed's own pieces:

- ``operator_image``: the site's **base image** for its GPU containers, a rootfs folder
  (what ``base_image`` names for plain LXC): the testbed's base rootfs with the admin's
  public key baked in (``/root/.ssh/authorized_keys``: here the testbed controller's key),
  sshd making its host keys at first boot (``ssh-keygen -A``: every container gets its own,
  none is in the image), the site's ``/etc/hosts``, and what a real image carries as the
  driver's user space and the site's files: the testbed's GPU stand-ins (``nvidia-smi``,
  ``libcuda``, ``/etc/testbed/gpu.env``), the simulator, its ``sim.env`` and the model
  folder. No hostname, machine-id or host key: they are per container.
- ``container_data``: the container's entry of the LXC host's data (``lxc_containers``):
  ``name``, ``base_image`` and ``config``, the lines the testbed's own config gives it
  besides rootfs, name and id map (network, console log, ``/dev/fuse``), plus the
  wheelhouse as a read-only bind mount of a shared folder (``share``).
- ``share``: the controller's wheelhouse bound read-only at a folder every container's
  root may traverse (``$TESTBED_DIR/dr-share/wheelhouse``; the wheelhouse itself lies under
  ``/root``, which an unprivileged container's root cannot reach): a site's shared folder.
- ``destroy``: ``lxc-destroy -f`` of the host's container (it stops it and deletes its
  rootfs' files; it cannot remove the testbed's mount points, the overlay and the read-only
  binds on it), then the rest of what it would delete (the overlay unmounted, the host's
  folder and its LXC folder removed): nothing of the container is left.
- ``adopt``: the re-created container (made by ``lxc_host.py``, its rootfs in the lxcpath)
  recorded as the host in ``state.json`` (its init PID, its netns named), so that the
  testbed's ``scenario``, ``wipe`` and ``down`` act on it; ``python -m testbed wipe HOST``
  then makes it an ordinary testbed host again.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from testbed import TestbedError, fleet, lxc
from testbed.gpu import build as gpu_build

#: the lines of the testbed's config that lxc_host.py writes itself for a created container
_PLAN_KEYS = ("lxc.uts.name", "lxc.rootfs.path", "lxc.include", "lxc.idmap", "lxc.rootfs.options")
HOST_KEY_DROPIN = ("[Service]\nExecStartPre=\nExecStartPre=/usr/bin/ssh-keygen -A\n"
                   "ExecStartPre=/usr/sbin/sshd -t\n")


def _sh(*argv: str) -> subprocess.CompletedProcess:
    r = subprocess.run(argv, capture_output=True, text=True, check=False)
    if r.returncode:
        raise TestbedError(f"{' '.join(argv)} (rc {r.returncode}): {r.stderr.strip()[-800:]}")
    return r


def operator_image(state: dict, dest: Path) -> Path:
    """The site's base image at DEST (a folder, made afresh; see the module)."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    _sh("cp", "-a", "--", state["base"], str(dest))
    libcuda = gpu_build.build_libcuda(Path(state["state_dir"]) / "gpu-build")
    # the testbed's per-host files, written as for a host (owner root: the image is stored
    # unshifted; lxc_host.py's unprivileged container maps it), then its identity taken out
    fleet._populate(state, {"name": "image", "address": "127.0.1.1", "merged": str(dest),
                            "privileged": True}, libcuda)
    for rel in ("etc/hostname", "etc/machine-id", "etc/ssh/ssh_host_ed25519_key",
                "etc/ssh/ssh_host_ed25519_key.pub"):
        (dest / rel).unlink(missing_ok=True)
    hosts = "".join(f"{h['address']}\t{h['name']}\n" for h in state["hosts"])
    (dest / "etc/hosts").write_text(
        "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
        f"{state['gateway']}\ttestbed-controller\n{hosts}")
    dropin = dest / "etc/systemd/system/ssh.service.d"
    dropin.mkdir(parents=True, exist_ok=True)
    (dropin / "host-keys.conf").write_text(HOST_KEY_DROPIN)
    return dest


def _mounted(path: Path) -> bool:
    """A mount point (``os.path.ismount`` misses a bind mount from the same file system)."""
    return subprocess.run(["findmnt", "-rn", "--mountpoint", str(path)], capture_output=True,
                          check=False).returncode == 0


def share(state: dict) -> Path:
    """The wheelhouse, bound read-only at ``$TESTBED_DIR/dr-share/wheelhouse`` (idempotent)."""
    target = Path(state["state_dir"]) / "dr-share" / "wheelhouse"
    target.mkdir(parents=True, exist_ok=True)
    target.parent.chmod(0o755)
    if not _mounted(target):
        target.chmod(0o755)
        _sh("mount", "--bind", state["wheelhouse"], str(target))
        _sh("mount", "-o", "remount,bind,ro", str(target))
    return target


def unshare(state: dict) -> None:
    target = Path(state["state_dir"]) / "dr-share" / "wheelhouse"
    while _mounted(target):  # every stacked bind of it
        _sh("umount", str(target))


def container_data(state: dict, h: dict, image: Path, wheelhouse: Path) -> dict:
    """HOST's ``lxc_containers`` entry for lxc_host.py: name, base image, config lines."""
    config = []
    for line in lxc.config_text(state, h).splitlines():
        key = line.partition("=")[0].strip()
        if line.startswith("#") or not line.strip() or key in _PLAN_KEYS:
            continue
        if key == "lxc.console.logfile":  # the host's folder goes with the old storage
            line = f"lxc.console.logfile = {lxc.config_path(state, h).parent}/console.log"
        config.append(line)
    config.append(f"lxc.mount.entry = {wheelhouse} srv/wheelhouse none bind,ro,create=dir 0 0")
    return {"name": h["name"], "dialect": "lxc", "unprivileged": not lxc.privileged(h),
            "base_image": str(image), "config": config}


def destroy(state: dict, h: dict) -> None:
    """``lxc-destroy -f`` of HOST's container, then its storage gone (see the module)."""
    r = subprocess.run(["lxc-destroy", "-P", lxc.lxc_path(state), "-n", h["name"], "-f"],
                       capture_output=True, text=True, check=False)
    if r.returncode:
        # lxc-destroy stops the container and deletes its rootfs' files, but cannot remove
        # the testbed's mount points (the overlay itself, the read-only binds on it): only
        # those failures are the testbed's, the rest is done below
        failed = re.findall(r'Failed to delete "([^"]+)"', r.stderr)
        ours = all(f == h["merged"] or f.startswith(h["merged"] + "/") for f in failed)
        if not failed or not ours or lxc.init_pid(state, h) is not None:
            raise TestbedError(f"lxc-destroy -f {h['name']}: {r.stderr.strip()[-800:]}")
    fleet._umount_all(state, h)
    shutil.rmtree(h["dir"], ignore_errors=True)
    shutil.rmtree(Path(lxc.config_path(state, h)).parent, ignore_errors=True)
    subprocess.run(["ip", "netns", "delete", h["netns"]], capture_output=True, check=False)


def adopt(name: str) -> dict:
    """Record the running container NAME (re-created by lxc_host.py) as the testbed host."""
    with fleet.locked():
        state = fleet.current_state()
        h = fleet.find_host(state, name)
        pid = lxc.init_pid(state, h)
        if pid is None:
            raise TestbedError(f"{name}: no running container to adopt")
        subprocess.run(["ip", "netns", "delete", h["netns"]], capture_output=True, check=False)
        _sh("ip", "netns", "attach", h["netns"], str(pid))
        for k in ("upper", "work", "merged"):  # teardown expects the host's folders
            Path(h[k]).mkdir(parents=True, exist_ok=True)
        h["pid"] = pid
        fleet.save_state(state)
    return h
