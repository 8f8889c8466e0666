"""The testbed's LXC host: this machine, with a simulated NVIDIA driver (issue 38).

The only place that knows the LXC host is simulated. ``SimDriver`` gives this machine what an
LXC host with 8 NVIDIA GPUs has, as far as the GPU passthrough reads and uses it:

- **Real char device nodes in this machine's /dev**: ``/dev/nvidia0``..``/dev/nvidia7``
  (major 195, minors 0-7), ``/dev/nvidiactl`` (195:255), ``/dev/nvidia-uvm`` (UVM:0) and
  ``/dev/nvidia-uvm-tools`` (UVM:1), mode 0666, made by the stand-in ``nvidia-modprobe``
  (``testbed/lxchost-nvidia-modprobe``). UVM is 511 (``DEFAULT_UVM``); ``driver_update``
  moves it. No driver sits behind them: an open that the device cgroup permits answers
  ENXIO, one it refuses EPERM (what the testbed's libcuda stand-in reads: ENXIO present,
  EPERM denied, ENOENT missing). The nodes are shared by every testbed on this machine
  (one /dev): a ``driver_update`` is seen by all until ``driver_update(DEFAULT_UVM)``.
- **A persistent mount namespace** (``STATE/mntns``, STATE = ``$TESTBED_DIR/lxchost``) in
  which ``/proc/devices`` is the real file's text with ``195 nvidia``, ``195 nvidiactl``
  and ``UVM nvidia-uvm`` in its character section, ``/proc/driver/nvidia/version`` holds a
  580.95.05 module line (the version the testbed's nvidia-smi and libcuda stand-ins report)
  and ``/proc/driver/nvidia/gpus/*/information`` one block per GPU; and ``/etc`` is an
  overlay whose writes land in ``STATE/etc-upper`` (what lxc_host.py writes to the LXC
  host's /etc: modules-load.d, the boot unit), never in this machine's /etc.
  ``module_loaded(False)`` takes the fake lines away (a host without the NVIDIA module).
- ``passthrough(containers, lxc_path=...)`` runs the product's own ``pyinfra @local
  lxc_host.py`` in that namespace, the stand-ins first on PATH: ``nvidia-modprobe``, and
  ``lxc-start`` (``testbed/lxchost-lxc-start``: the kernel refuses an unprivileged
  container's proc mount under the fakes, so it starts containers with them unmounted).

Containers started by lxc_host.py run in a copy of that namespace without the fakes; lxc-start
run outside the namespace works as well: the nodes and the containers' configs are the same.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from testbed import TestbedError, log

REPO = Path(__file__).resolve().parent.parent
#: the stand-ins on PATH in the namespace (name -> file in testbed/)
STANDINS = {"nvidia-modprobe": "lxchost-nvidia-modprobe", "lxc-start": "lxchost-lxc-start"}
GPU_MAJOR = 195
DEFAULT_UVM = 511
GPU_COUNT = 8
#: the module line of /proc/driver/nvidia/version, in the format of a real one
#: (tests/fixtures/lxchost/version/open-570.txt), at the stand-ins' driver version
DRIVER_VERSION = "580.95.05"
VERSION_LINE = (f"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {DRIVER_VERSION}  "
                "Release Build  (dvs-builder@U22-I3-B14-02-1)  Tue Sep 23 09:54:03 UTC 2025\n"
                "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n")
GPU_NAME = "NVIDIA RTX PRO 6000 Blackwell Server Edition"


def state_dir() -> Path:
    """``$TESTBED_DIR/lxchost`` (``.testbed/lxchost`` in the repository by default)."""
    base = Path(os.environ.get("TESTBED_DIR") or REPO / ".testbed").expanduser().resolve()
    return base / "lxchost"


def _run(argv: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(argv, check=False, capture_output=True, text=True, **kw)


def fake_proc_devices(real: str, uvm: int | None, loaded: bool = True) -> str:
    """REAL /proc/devices with the NVIDIA driver's entries in its character section (sorted
    by major, as the kernel lists them); REAL unchanged when not LOADED."""
    if not loaded:
        return real
    head, sep, rest = real.partition("Character devices:\n")
    if not sep:
        raise TestbedError("this machine's /proc/devices has no 'Character devices:' section")
    block, blank, tail = rest.partition("\n\n")
    entries = [ln for ln in block.splitlines() if ln.strip()]
    add = [(GPU_MAJOR, "nvidia"), (GPU_MAJOR, "nvidiactl")]
    if uvm is not None:
        add.append((uvm, "nvidia-uvm"))
    taken = {int(ln.split()[0]) for ln in entries}
    clash = [m for m, _ in add if m in taken]
    if clash:
        raise TestbedError(f"major {clash[0]} is already a driver's on this machine "
                           "(/proc/devices): pick another for the simulated NVIDIA driver")
    rows = [(int(ln.split()[0]), ln) for ln in entries] + [(m, f"{m:3d} {n}") for m, n in add]
    rows.sort(key=lambda r: r[0])
    return head + sep + "\n".join(r for _, r in rows) + blank + tail


def gpu_information(minor: int) -> str:
    """One GPU's /proc/driver/nvidia/gpus/BUS/information block."""
    return (f"Model: \t\t {GPU_NAME}\nIRQ:   \t\t {200 + minor}\n"
            f"GPU UUID: \t GPU-5a1e0000-0000-4000-8000-00000000000{minor}\n"
            "Video BIOS: \t 98.02.2e.00.05\nBus Type: \t PCIe\nDMA Size: \t 52 bits\n"
            f"DMA Mask: \t 0xfffffffffffff\nBus Location: \t {bus(minor)}\n"
            f"Device Minor: \t {minor}\nGPU Excluded: \t No\n")


def bus(minor: int) -> str:
    return f"0000:{0x18 + 0x10 * minor:02x}:00.0"


@dataclass
class SimDriver:
    """The simulated driver of one testbed's LXC host (its STATE folder; see the module)."""

    state: Path = field(default_factory=state_dir)
    uvm: int = DEFAULT_UVM
    gpus: int = GPU_COUNT
    loaded: bool = True

    @property
    def mntns(self) -> Path:
        return self.state / "mntns"

    @property
    def bin(self) -> Path:
        return self.state / "bin"

    @property
    def etc_upper(self) -> Path:
        """Where the LXC host's /etc writes land (lxc_host.py's modules-load.d, unit)."""
        return self.state / "etc-upper"

    def _ns_mounted(self) -> bool:
        return _run(["findmnt", "-rn", "-o", "FSTYPE", str(self.mntns)]).stdout.strip() == "nsfs"

    def _write_fakes(self) -> None:
        loaded = self.loaded
        text = Path("/proc/devices").read_text()  # this process is outside the namespace
        if "nvidia" in text:  # read inside a namespace by mistake: never stack fakes
            raise TestbedError("the real /proc/devices already lists nvidia: not a machine "
                               "for the simulated driver")
        devices = self.state / "proc-devices"
        with devices.open("r+" if devices.exists() else "w") as f:  # same inode: the bind sees it
            f.truncate(0)
            f.write(fake_proc_devices(text, self.uvm, loaded))
        driver = self.state / "proc-driver"
        shutil.rmtree(driver / "nvidia", ignore_errors=True)
        driver.mkdir(parents=True, exist_ok=True)
        if loaded:
            (driver / "nvidia").mkdir()
            (driver / "nvidia" / "version").write_text(VERSION_LINE)
            for n in range(self.gpus):
                d = driver / "nvidia" / "gpus" / bus(n)
                d.mkdir(parents=True)
                (d / "information").write_text(gpu_information(n))

    def up(self) -> SimDriver:
        """Idempotent: the namespace with its fakes, the stand-in on PATH there, the nodes
        in /dev (``nvidia-modprobe -c=N`` per GPU and ``-u``)."""
        self.state.mkdir(parents=True, exist_ok=True)
        self.bin.mkdir(exist_ok=True)
        for name, file in STANDINS.items():
            target = self.bin / name
            if not target.exists():
                target.symlink_to(Path(__file__).resolve().parent / file)
        self._write_fakes()
        if not self._ns_mounted():
            self.mntns.touch()
            for d in ("etc-upper", "etc-work"):
                (self.state / d).mkdir(exist_ok=True)
            r = _run(["unshare", f"--mount={self.mntns}", "--propagation", "private", "true"])
            if r.returncode:
                raise TestbedError(f"unshare --mount={self.mntns}: {r.stderr.strip()}")
            self.ns_shell(
                f"mount --bind {self.state}/proc-devices /proc/devices && "
                f"mount --bind {self.state}/proc-driver /proc/driver && "
                f"mount -t overlay overlay -o lowerdir=/etc,upperdir={self.etc_upper},"
                f"workdir={self.state}/etc-work /etc")
            log(f"LXC host namespace {self.mntns}: simulated NVIDIA driver {DRIVER_VERSION}, "
                f"uvm major {self.uvm}")
        if self.loaded:
            self.modprobe("-u", *[f"-c={n}" for n in range(self.gpus)])
        return self

    def ns_shell(self, command: str, check: bool = True, env: dict | None = None,
                 cwd: Path | None = None) -> subprocess.CompletedProcess:
        """COMMAND (sh -c) in the namespace; raises TestbedError on failure when CHECK."""
        e = dict(os.environ, **(env or {}))
        e["PATH"] = f"{self.bin}:{e.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}"
        r = _run(["nsenter", f"--mount={self.mntns}", f"--wd={cwd or REPO}", "--",
                  "sh", "-c", command], env=e)
        if check and r.returncode:
            raise TestbedError(f"in the LXC host namespace: {command}\n{r.stdout}{r.stderr}")
        return r

    def modprobe(self, *args: str) -> None:
        """The stand-in nvidia-modprobe with ARGS, in the namespace."""
        self.ns_shell("nvidia-modprobe " + " ".join(args))

    def driver_update(self, new_uvm_major: int) -> None:
        """A driver or kernel update that moves nvidia-uvm to NEW_UVM_MAJOR: /proc/devices
        says so, and /dev/nvidia-uvm* are made again with it (the old nodes are replaced, as
        after a reboot). ``driver_update(DEFAULT_UVM)`` undoes it. The containers' configs
        keep the old major until lxc_host.py runs."""
        self.uvm = new_uvm_major
        self._write_fakes()
        self.modprobe("-u")

    def module_loaded(self, loaded: bool) -> None:
        """False: a host without the NVIDIA module (no nvidia lines in /proc/devices, no
        /proc/driver/nvidia); True puts them back. The nodes in /dev stay as they are."""
        self.loaded = loaded
        self._write_fakes()

    def down(self) -> None:
        """The namespace unmounted and STATE removed (the nodes in /dev stay: other
        testbeds on this machine may use them; ``remove_nodes`` takes them away)."""
        if self._ns_mounted():
            _run(["umount", str(self.mntns)])
        shutil.rmtree(self.state, ignore_errors=True)

    def remove_nodes(self) -> None:
        for p in Path("/dev").glob("nvidia*"):
            if p.is_char_device():
                p.unlink()

    def inventory(self, containers: list[dict], lxc_path: str | Path, **data) -> Path:
        """The generated inventory of this LXC host (``@local``) with CONTAINERS as its
        ``lxc_containers``, LXC_PATH as ``lxc_path``, records in STATE/records."""
        data = {"lxc_containers": containers, "lxc_path": str(lxc_path),
                "lxc_record_dir": str(self.state / "records"), **data}
        path = self.state / "inventory.py"
        path.write_text('"""The testbed\'s LXC host (written by testbed/lxchost.py)."""\n'
                        "import json\n\n"
                        f"lxc_hosts = [('@local', json.loads({json.dumps(json.dumps(data))}))]\n")
        return path

    def passthrough(self, containers: list[dict], lxc_path: str | Path, *,
                    restart: str | None = None, args: tuple[str, ...] = (),
                    check: bool = True, timeout: float = 900) -> subprocess.CompletedProcess:
        """Run the product's ``pyinfra -y INVENTORY lxc_host.py`` on this machine (@local)
        in the namespace, for CONTAINERS (``lxc_containers`` items: ``name``, ``dialect``
        (``lxc``), ``unprivileged``, ``restart``, ``base_image``, ``config``...; RESTART, when
        given, for those without their own) in LXC_PATH. Returns the finished process (its
        stdout and stderr); with CHECK, raises ``TestbedError`` with the output when it
        fails. Guarantees on success: each container's config holds exactly the tool's
        passthrough block for this host's majors (its other lines byte for byte), nvidia_uvm
        is set to load at boot (in STATE/etc-upper), and each container was started or
        restarted as lxc_host.py decides (``restart: now`` restarts even a serving one)."""
        self.up()
        items = [dict(c) for c in containers]
        for c in items:
            c.setdefault("dialect", "lxc")
            if restart is not None:
                c.setdefault("restart", restart)
        inv = self.inventory(items, lxc_path)
        cmd = [sys.executable, "-m", "pyinfra", "-y", str(inv), "lxc_host.py", *args]
        r = subprocess.run(["nsenter", f"--mount={self.mntns}", f"--wd={REPO}", "--", *cmd],
                           check=False,
                           cwd=REPO, capture_output=True, text=True, timeout=timeout,
                           env=dict(os.environ, PATH=f"{self.bin}:{os.environ.get('PATH', '')}"))
        if check and r.returncode:
            raise TestbedError(f"lxc_host.py failed ({r.returncode}):\n{r.stdout}{r.stderr}")
        return r


def passthrough(lxc_path: str | Path, containers: list[dict], *, restart: str | None = None,
                check: bool = True) -> subprocess.CompletedProcess:
    """``SimDriver().up().passthrough(...)`` for this testbed (``$TESTBED_DIR``); see there."""
    return SimDriver().passthrough(containers, lxc_path, restart=restart, check=check)
