"""The testbed fleet: real plain-LXC containers (testbed.lxc) standing in for the 8-GPU
containers of an LXC host (this machine is the LXC host).

Each host: an LXC container (unprivileged by default, privileged on request) on an overlay
over the cached base rootfs (testbed.rootfs), its own network namespace with one address on
the controller's bridge (a veth LXC makes; the namespace named after the host), per-host SSH host
key (known in advance: written to the testbed's known_hosts, so clients check strictly),
GPU stand-ins, the SGLang simulator and a model stand-in in its overlay upper dir, the
controller's wheelhouse bind-mounted read-only at /srv/wheelhouse, and the GPU device nodes
of this machine passed in by the config lines the product's LXC-host passthrough writes.

See testbed/README.md for commands and layout. Everything here runs as root.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from testbed import TestbedError, cgroupmode, cpushare, log, lxc, lxchost, net, procs, rootfs
from testbed.gpu import build as gpu_build
from testbed.sim.model import make_model_dir
from testbed.sim.sim_config import read_env_file

REPO = Path(__file__).resolve().parent.parent
SGLANG_VERSION = "0.5.12.post1"
STATE_VERSION = 1
# Several testbeds can run side by side with distinct TESTBED_PREFIX, TESTBED_SUBNET, TESTBED_DIR.
DEFAULT_PREFIX = os.environ.get("TESTBED_PREFIX", "tb")
SUBNET = os.environ.get("TESTBED_SUBNET", "10.213.0")  # /24, controller at .1, host i at .(10+i)
HOST_OFFSET = 10
MODEL_NAME = "GLM-5-NVFP4"
BOOT_TIMEOUT = float(os.environ.get("TESTBED_BOOT_TIMEOUT", "120"))
STOP_TIMEOUT = 30.0

GPU_SCENARIOS = (*gpu_build.SCENARIOS, "cgroup-denied")
SIM_SCENARIOS = ("healthy", "autotune-crash", "load-hang", "oom", "slow-start", "capture-oom",
                 "rank-fail", "nccl-watchdog", "warmup-502", "scheduler-exception",
                 # multi-node groups: act on a node with --node-rank >= 1 (testbed/sim/sim_group.py)
                 "node-capture-crash", "node-dies-serving",
                 # serving, for the watchdog (re-read while running: testbed/sim/sim_faults.py)
                 "wedge", "leak", "slow-progress")

# TOKENS_PER_S per request, MAX_TOKENS_PER_S for the whole server (the simulated decode
# throughput that `sglang-deploy bench` measures; low enough that this machine's CPUs are
# never the limit, so the figure follows these keys, not the load).
SIM_ENV_DEFAULT = "SCENARIO=healthy\nTIME_SCALE=0.02\nTOKENS_PER_S=400\nMAX_TOKENS_PER_S=1000\n"
# Keys `python -m testbed sim-env` may set (read by testbed/sim/launch_server.py).
SIM_ENV_KEYS = ("TIME_SCALE", "TOKENS_PER_S", "MAX_TOKENS_PER_S", "WARMUP_GATE", "HANG_AT_SHARD",
                "LEAK_AFTER", "PROGRESS_DELAY_S",
                "GPU_MEMORY_MIB", "SLOW_WHEN", "SLOW_FACTOR", "LOG_SEED")


def _wait(done, timeout: float, interval: float) -> bool:
    """Call DONE every INTERVAL seconds until it is true (True) or TIMEOUT passed (False)."""
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)
    return True


def _write(path: Path, content: str | bytes, mode: int = 0o644, owner: int | None = None) -> None:
    """Write PATH whole or not at all (readers such as the simulator never see half a file);
    OWNER: its uid and gid (a host's file: the container's root, ``lxc.root_id``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(content if isinstance(content, bytes) else content.encode())
    tmp.chmod(mode)
    if owner is not None:
        os.chown(tmp, owner, owner)
    tmp.rename(path)


# --------------------------------------------------------------------------- paths / state

def state_dir() -> Path:
    return Path(os.environ.get("TESTBED_DIR") or REPO / ".testbed").expanduser().resolve()


def state_file() -> Path:
    return state_dir() / "state.json"


def load_state() -> dict | None:
    try:
        return json.loads(state_file().read_text())
    except FileNotFoundError:
        return None


def current_state() -> dict:
    """The state of the testbed that is up (TestbedError when none is)."""
    state = load_state()
    if state is None:
        raise TestbedError("no testbed is up: run `python -m testbed up --hosts 1`")
    return state


def save_state(state: dict) -> None:
    state["hosts"].sort(key=lambda h: h["index"])
    _write(state_file(), json.dumps(state, indent=2) + "\n")


@contextlib.contextmanager
def locked():
    d = state_dir()
    d.mkdir(parents=True, exist_ok=True)
    with open(d / ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def new_state(prefix: str) -> dict:
    parts = SUBNET.split(".")
    if len(parts) != 3 or not all(p.isdigit() and int(p) < 256 for p in parts):
        raise TestbedError(f"TESTBED_SUBNET must be the first three numbers of a /24 (such as "
                           f"10.213.0); found {SUBNET!r}")
    d = state_dir()
    wheelhouse = os.environ.get("TESTBED_WHEELHOUSE") or "~/.cache/sglang-deploy/wheelhouse"
    return {
        "version": STATE_VERSION, "prefix": prefix, "state_dir": str(d),
        "bridge": f"{prefix}br0", "gateway": f"{SUBNET}.1", "subnet": f"{SUBNET}.0/24",
        "key": str(d / "id_ed25519"), "known_hosts": str(d / "known_hosts"),
        "wheelhouse": str(Path(wheelhouse).expanduser()), "base": str(rootfs.base_path()),
        "lxc_path": str(d / "lxc"),
        "sglang_version": SGLANG_VERSION, "hosts": [],
        # the scratch venvs of `sglang-deploy lock --check`, read-only at /srv/lockcheck: the
        # suite runs the production release's smoke under the unit's sandbox in a host
        "lockcheck": str(lockcheck_cache()),
    }


def lockcheck_cache() -> Path:
    from sglang_deploy.controller.releasecheck import cache_root

    return cache_root()


#: the router container (`up --router`): index 0, address SUBNET.10, inventory group `routers`
ROUTER_INDEX = 0


def host_record(state: dict, index: int, privileged: bool = False) -> dict:
    name = f"{state['prefix']}router" if index == ROUTER_INDEX else f"{state['prefix']}{index}"
    d = Path(state["state_dir"]) / name
    return {
        "name": name, "role": "router" if index == ROUTER_INDEX else "server", "index": index,
        "address": f"{SUBNET}.{HOST_OFFSET + index}", "netns": name, "veth": net.veth_name(name),
        "pid": None, "dir": str(d), "upper": str(d / "upper"), "work": str(d / "work"),
        "merged": str(d / "merged"), "console": str(d / "console.log"),
        "privileged": privileged, "lxc_config": str(Path(state["state_dir"]) / "lxc" / name / "config"),
    }


def find_host(state: dict, name: str) -> dict:
    for h in state["hosts"]:
        if h["name"] == name or h["address"] == name:
            return h
    raise TestbedError(f"no testbed host {name!r} (hosts: {', '.join(h['name'] for h in state['hosts'])})")


def host_alive(h: dict) -> bool:
    """The host's recorded PID is the running init of its LXC container."""
    try:
        cgroups = Path(f"/proc/{h.get('pid')}/cgroup").read_text()
    except OSError:
        return False
    # LXC names the cgroup NAME-1 (-2...) when a killed run's lxc.payload.NAME is still there
    return procs.pid_running(h["pid"]) and re.search(
        rf":/lxc\.payload\.{re.escape(h['name'])}(-\d+)?(/|$)", cgroups, re.MULTILINE) is not None


# --------------------------------------------------------------------------- ssh

def ssh_argv(state: dict, h: dict, *cmd: str) -> list[str]:
    options = {
        "BatchMode": "yes", "StrictHostKeyChecking": "yes",
        "UserKnownHostsFile": state["known_hosts"], "GlobalKnownHostsFile": "/dev/null",
        "IdentitiesOnly": "yes", "ConnectTimeout": 5, "LogLevel": "ERROR",
    }
    return ["ssh", "-q", *(arg for k, v in options.items() for arg in ("-o", f"{k}={v}")),
            "-i", state["key"], f"root@{h['address']}", *cmd]


def ssh(state: dict, h: dict, cmd: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(ssh_argv(state, h, cmd), check=False, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


_KH_LOCK = threading.Lock()


def _known_hosts_replace(state: dict, address: str, pubkey_line: str | None) -> None:
    """Replace (or drop) the known_hosts entry of ADDRESS (a replaced machine has a new key)."""
    kh = Path(state["known_hosts"])
    with _KH_LOCK:
        lines = kh.read_text().splitlines() if kh.exists() else []
        keep = [ln for ln in lines if ln.split(" ", 1)[0].split(",")[0] != address]
        if pubkey_line:
            keytype, key = pubkey_line.split()[:2]
            keep.append(f"{address} {keytype} {key}")
        _write(kh, "".join(ln + "\n" for ln in keep))


# --------------------------------------------------------------------------- controller-side assets

def _keygen(path: Path, comment: str) -> None:
    """A new ed25519 key pair PATH, PATH.pub (replacing any)."""
    for f in (path, path.with_suffix(".pub")):
        f.unlink(missing_ok=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
                   check=True)


def ensure_key(state: dict) -> None:
    if not Path(state["key"]).exists():
        _keygen(Path(state["key"]), "testbed-controller")


def uv_version() -> str:
    """The controller's uv version (env TESTBED_UV_VERSION overrides)."""
    if os.environ.get("TESTBED_UV_VERSION"):
        return os.environ["TESTBED_UV_VERSION"]
    uv = shutil.which("uv") or shutil.which("uv", path=str(Path(sys.executable).parent))
    if not uv:
        raise TestbedError("uv not found on the controller: install it or set TESTBED_UV_VERSION")
    out = subprocess.run([uv, "--version"], capture_output=True, text=True, check=True).stdout
    return out.split()[1]


def ensure_wheelhouse(state: dict, router: bool) -> None:
    """Every wheel of locks/testbed.txt (and locks/router.txt with a router: the real smg
    wheel) and the uv wheel, filled by the tool's own `sglang-deploy wheelhouse` code (the
    hosts install offline from it)."""
    from sglang_deploy.controller import wheelhouse

    wh = Path(state["wheelhouse"])
    for lock in ("testbed.txt", "router.txt") if router else ("testbed.txt",):
        try:
            result = wheelhouse.fill(REPO / "locks" / lock, wh, uv_version=uv_version())
        except Exception as e:
            raise TestbedError(
                f"could not fill the wheelhouse {wh} from locks/{lock} ({e}); fetch the wheels "
                f"by hand with `sglang-deploy wheelhouse locks/{lock} {wh}` or run `up --no-wheels`"
            ) from e
        if result["fetched"]:
            log(f"wheelhouse {wh}: added {', '.join(result['fetched'])}")


def ensure_router_key(state: dict) -> None:
    """The testbed router's API key, $TESTBED_DIR/router-key (0600), for inventory/testbed.py."""
    path = Path(state["state_dir"]) / "router-key"
    if not path.exists():
        with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as fh:
            fh.write(secrets.token_urlsafe(24) + "\n")


#: /usr/bin/nvidia-smi: imports the Python stand-in as a module (byte-compiled once, not per call)
SMI_LAUNCHER = """#!/usr/bin/python3 -I
# testbed stand-in for nvidia-smi: /usr/lib/testbed-gpu/nvidia_smi.py
import sys
sys.path.insert(0, "/usr/lib/testbed-gpu")
from nvidia_smi import main
sys.exit(main())
"""


# --------------------------------------------------------------------------- one host

def write_etc_hosts(state: dict, h: dict) -> None:
    """/etc/hosts: localhost, itself, the controller (bridge address) and the other hosts."""
    others = "".join(f"{o['address']}\t{o['name']}\n" for o in state["hosts"] if o["name"] != h["name"])
    _write(Path(h["merged"]) / "etc/hosts",
           "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
           f"{h['address']}\t{h['name']}\n{state['gateway']}\ttestbed-controller\n{others}",
           owner=lxc.root_id(h))


def _populate(state: dict, h: dict, libcuda: Path) -> str:
    """Write the per-host files into the (mounted) merged dir; returns the SSH host pubkey line."""
    root = Path(h["merged"])
    _write(root / "etc/hostname", h["name"] + "\n")
    write_etc_hosts(state, h)
    _write(root / "etc/machine-id", secrets.token_hex(16) + "\n", 0o444)
    # SSH: the controller's key, and this host's own host key (made here, so it is known
    # before the first connection: clients check strictly, no trust-on-first-use).
    (root / "root/.ssh").mkdir(mode=0o700, parents=True, exist_ok=True)
    _write(root / "root/.ssh/authorized_keys", Path(state["key"] + ".pub").read_text(), 0o600)
    hk = root / "etc/ssh/ssh_host_ed25519_key"
    _keygen(hk, f"root@{h['name']}")
    _write(root / "etc/ssh/sshd_config.d/20-testbed-hostkey.conf",
           "HostKey /etc/ssh/ssh_host_ed25519_key\n")
    # GPU stand-ins (design.md, "Inside a testbed host").
    _write(root / "etc/testbed/gpu.env", gpu_build.render_gpu_env())
    _write(root / "etc/testbed/sim.env", SIM_ENV_DEFAULT)
    _write(root / "var/log/testbed-gpu-peer-copies", "")  # libcuda's count of peer copies
    _write(root / "usr/lib/testbed-gpu/nvidia_smi.py", gpu_build.NVIDIA_SMI.read_bytes())
    _write(root / "usr/bin/nvidia-smi", SMI_LAUNCHER, 0o755)
    libdir = root / "usr/lib/x86_64-linux-gnu"
    _write(libdir / "libcuda.so.1", libcuda.read_bytes(), 0o755)
    (libdir / "libcuda.so").unlink(missing_ok=True)
    (libdir / "libcuda.so").symlink_to("libcuda.so.1")
    # The simulator, and import-only torch/triton/torchvision for the benchmark client
    # (sim/standins/_testbed_standin.py).
    sim = REPO / "testbed/sim"
    for f in sim.rglob("*.py"):
        _write(root / "opt/sglang-sim" / f.relative_to(sim), f.read_bytes(),
               0o755 if f.name == "launch_server.py" else 0o644)
    make_model_dir(root / "srv/models" / MODEL_NAME)
    return hk.with_suffix(".pub").read_text()


def _mount_overlay(state: dict, h: dict) -> None:
    subprocess.run(
        ["mount", "-t", "overlay", "overlay", "-o",
         f"lowerdir={lxc.lower_dir(state, h)},upperdir={h['upper']},workdir={h['work']}",
         h["merged"]],
        check=True, capture_output=True, text=True,
    )


def create_host(state: dict, h: dict, libcuda: Path) -> None:
    """Fresh overlay + files (not started: ``start_containers``). Any old one is torn down
    first."""
    if Path(h["dir"]).exists() or Path(h["lxc_config"]).parent.exists():
        teardown_host(state, h)
    for k in ("upper", "work", "merged"):
        Path(h[k]).mkdir(parents=True, exist_ok=True)
    _mount_overlay(state, h)
    pubkey = _populate(state, h, libcuda)
    # the container's root owns what we made (changed through the mounted overlay)
    lxc.shift_tree(Path(h["upper"]), lxc.root_id(h), via=Path(h["merged"]))
    _known_hosts_replace(state, h["address"], pubkey)


#: the controller's folders bind-mounted read-only into each host (mounted onto the overlay
#: before the start: the container's root could not reach them under /root to mount them)
def _binds(state: dict) -> list[tuple[str, str]]:
    return [(state["wheelhouse"], "srv/wheelhouse"), (_lockcheck_dir(state), "srv/lockcheck")]


def _mount_binds(state: dict, h: dict) -> None:
    for src, rel in _binds(state):
        target = Path(h["merged"]) / rel
        target.mkdir(parents=True, exist_ok=True)
        if not os.path.ismount(target):
            subprocess.run(["mount", "--bind", src, str(target)], check=True, capture_output=True)
            subprocess.run(["mount", "-o", "remount,bind,ro", str(target)], check=True,
                           capture_output=True)


def start_containers(state: dict, hosts: list[dict]) -> None:
    """Boot the hosts' LXC containers on their overlays (kept as they are): each config
    written (the base lines), the GPU passthrough merged in by the product's lxc_host.py
    (one run for all; it starts the containers whose passthrough it changed), any still
    stopped started, each netns named, the GPU nodes as gpu.env says."""
    for h in hosts:
        _mount_binds(state, h)
        lxc.write_config(state, h)
        if lxc.init_pid(state, h) is None:  # a killed run's cgroups would rename its cgroup
            lxc.clear_stale_cgroups(h["name"])
    lxc.passthrough(state, hosts)
    for h in hosts:
        h["pid"] = lxc.start(state, h)
        h["started"] = time.time()
        sync_gpu_nodes(state, h)
        log(f"{h['name']}: {lxc.kind(h)} LXC container, init pid {h['pid']}, {h['address']}")


def _lockcheck_dir(state: dict) -> str:
    path = Path(state.get("lockcheck") or lockcheck_cache())
    path.mkdir(parents=True, exist_ok=True)
    return str(path)


def wait_host(state: dict, h: dict, timeout: float = BOOT_TIMEOUT) -> float:
    """Until sshd answers with the key (strict host key check) and systemd is up."""
    t0 = time.monotonic()
    last = "not tried yet"
    while time.monotonic() < t0 + timeout:
        if not host_alive(h):
            raise TestbedError(f"{h['name']}: its container (init pid {h['pid']}) stopped during "
                               f"boot; console tail:\n{_tail(h['console'])}\nlxc log tail:\n"
                               f"{_tail(str(Path(h['dir']) / 'lxc.log'))}")
        try:
            r = ssh(state, h, "systemctl is-system-running", timeout=10)
        except subprocess.TimeoutExpired:
            last = "ssh timed out"
            continue
        out = r.stdout.strip()
        if out in ("running", "degraded"):
            return time.monotonic() - t0
        last = f"ssh rc={r.returncode} is-system-running={out!r} {r.stderr.strip()[-200:]}"
        time.sleep(0.3)
    raise TestbedError(f"{h['name']} ({h['address']}) not up after {timeout:.0f}s; last: {last}\n"
                       f"console tail:\n{_tail(h['console'])}")


def _tail(path: str, n: int = 25) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no console log)"


def stop_hosts(state: dict, hosts: list[dict], timeout: float = STOP_TIMEOUT) -> None:
    """lxc-stop each container (an orderly poweroff; killed after TIMEOUT), all at once."""
    live = [h for h in hosts if host_alive(h)]
    if live:
        with ThreadPoolExecutor(max_workers=len(live)) as pool:
            for h, clean in zip(live, pool.map(lambda h: lxc.stop(state, h, timeout), live)):
                if not clean:
                    log(f"{h['name']}: no orderly shutdown within {timeout:.0f}s, killed")
    for h in hosts:
        h["pid"] = None
        if lxc.init_pid(state, h) is None:  # what a killed container left behind
            lxc.clear_stale_cgroups(h["name"])


def _umount(path: str) -> None:
    """Unmount PATH (all the mounts stacked on it), lazily if it stays busy for 10 s."""
    def unmounted() -> bool:
        if os.path.ismount(path):
            subprocess.run(["umount", path], check=False, capture_output=True)
        return not os.path.ismount(path)

    if not _wait(unmounted, 10, 0.2):
        subprocess.run(["umount", "-l", path], check=False, capture_output=True)


def _umount_all(state: dict, h: dict) -> None:
    for _, rel in _binds(state):
        _umount(str(Path(h["merged"]) / rel))
    _umount(h["merged"])


def teardown_host(state: dict, h: dict) -> None:
    """Stop, unmount, drop the netns/veth, the container's lxc folder and the host dir
    (idempotent)."""
    stop_hosts(state, [h])
    for pid in procs.orphan_inits(h["upper"]):
        log(f"{h['name']}: killing orphaned container init (pid {pid})")
        procs.kill(pid)
        _wait(lambda pid=pid: not procs.pid_running(pid), 10, 0.05)
    _umount_all(state, h)
    net.delete_host_net(h["netns"])
    shutil.rmtree(Path(h["lxc_config"]).parent, ignore_errors=True)
    d = Path(h["dir"])
    if d.exists():
        if os.path.ismount(h["merged"]):
            raise TestbedError(f"{h['merged']} is still mounted; not deleting {d}")
        shutil.rmtree(d)


# --------------------------------------------------------------------------- commands

def group_record(prefix: str, n_hosts: int, size: int) -> dict:
    """`up --group SIZE`: the first SIZE server hosts form one multi-node group, named
    <prefix>g1 (inventory/testbed.py gives them `sglang_group` and the group's flags)."""
    if size < 2 or size > n_hosts:
        raise TestbedError(f"--group {size}: a group has 2 to --hosts ({n_hosts}) hosts")
    return {"name": f"{prefix}g1", "hosts": [f"{prefix}{i}" for i in range(1, size + 1)]}


def up(n_hosts: int, prefix: str = DEFAULT_PREFIX, wheels: bool = True,
       router: bool = False, group: int | None = None, privileged: bool | None = None) -> dict:
    """Boot the missing hosts. PRIVILEGED: new hosts' containers privileged (default: env
    TESTBED_PRIVILEGED=1, else unprivileged, as Proxmox makes them)."""
    if privileged is None:
        privileged = os.environ.get("TESTBED_PRIVILEGED", "") not in ("", "0")
    t0 = time.monotonic()
    with locked():
        state = load_state() or new_state(prefix)
        if state["prefix"] != prefix:
            raise TestbedError(f"a testbed with prefix {state['prefix']!r} is up in {state_dir()}; "
                               "`down` it first or use its prefix")
        if group is not None:  # recorded before any host boots: the inventory reads it
            state["groups"] = [group_record(prefix, n_hosts, group)] if group else []
        base = rootfs.ensure_base()
        lxc.ensure_subids()
        if state["base"] != str(base) and any(host_alive(h) for h in state["hosts"]):
            log(f"note: running hosts use an older base ({state['base']}); `down` + `up` to refresh")
        else:
            state["base"] = str(base)
        ensure_key(state)
        router = router or any(h.get("role") == "router" for h in state["hosts"])
        if router:
            ensure_router_key(state)
        if wheels:
            ensure_wheelhouse(state, router)
        Path(state["wheelhouse"]).mkdir(parents=True, exist_ok=True)
        net.ensure_bridge(state["bridge"], f"{state['gateway']}/24")

        by_index = {h["index"]: h for h in state["hosts"]}
        todo = []
        for i in ([ROUTER_INDEX] if router else []) + list(range(1, n_hosts + 1)):
            h = by_index.get(i)
            if h and host_alive(h):
                continue
            if h:
                log(f"{h['name']}: recorded but not running, recreating")
                state["hosts"].remove(h)
            h = host_record(state, i, privileged)
            state["hosts"].append(h)
            todo.append(h)
        if not todo:
            save_state(state)  # a changed --group
            log(f"all {n_hosts} hosts already up ({time.monotonic() - t0:.1f}s)")
            return state
        save_state(state)
        libcuda = gpu_build.build_libcuda(Path(state["state_dir"]) / "gpu-build")
        if not all(lxc.privileged(h) for h in todo):
            lxc.shifted_base(Path(state["base"]))  # once, before the hosts boot in parallel
        lock = threading.Lock()

        def create(h):
            create_host(state, h, libcuda)
            with lock:
                save_state(state)

        with ThreadPoolExecutor(max_workers=len(todo)) as pool:
            list(pool.map(create, todo))
        start_containers(state, todo)
        save_state(state)
        with ThreadPoolExecutor(max_workers=len(todo)) as pool:
            futures = {h["name"]: pool.submit(wait_host, state, h) for h in todo}
            errors = []
            for name, f in futures.items():
                try:
                    log(f"{name}: up ({f.result():.1f}s after start)")
                except Exception as e:  # noqa: BLE001
                    errors.append(f"{name}: {e}")
        save_state(state)
        if errors:
            raise TestbedError("testbed did not come up:\n" + "\n".join(errors))
        for h in state["hosts"]:  # every host knows every other one by name
            if os.path.ismount(h["merged"]):
                write_etc_hosts(state, h)
    log(f"up: {n_hosts} hosts ready in {time.monotonic() - t0:.1f}s "
        f"(state: {state_file()})")
    return state


def _remove(state: dict, hosts: list[dict], what: str) -> None:
    """Stop HOSTS, tear each down and forget its host key; the state keeps only those whose
    directory is left (TestbedError listing what failed)."""
    stop_hosts(state, hosts)
    errors = []
    for h in hosts:
        try:
            teardown_host(state, h)
            _known_hosts_replace(state, h["address"], None)
        except Exception as e:  # noqa: BLE001
            errors.append(f"{h['name']}: {e}")
    state["hosts"] = [h for h in state["hosts"] if h not in hosts or Path(h["dir"]).exists()]
    if errors:
        save_state(state)
        raise TestbedError(f"{what} incomplete:\n" + "\n".join(errors))


def down() -> None:
    t0 = time.monotonic()
    with locked():
        state = load_state()
        d = state_dir()
        if state is None:
            # Half-up without a state file: clean what looks like ours.
            state = new_state(DEFAULT_PREFIX)
            for p in sorted(d.glob("*/upper")):
                name = p.parent.name
                index = name[len(DEFAULT_PREFIX):]
                if name.startswith(DEFAULT_PREFIX) and index.isdigit():
                    log(f"no state file; cleaning up {name} found in {d}")
                    state["hosts"].append(host_record(state, int(index)))
                    state["hosts"][-1]["pid"] = lxc.init_pid(state, state["hosts"][-1])
        n = len(state["hosts"])
        try:
            _remove(state, list(state["hosts"]), "down")
        finally:
            net.delete_bridge(state["bridge"])
            lxchost.SimDriver().down()  # its namespace (the /dev nodes stay: shared)
        state_file().unlink(missing_ok=True)
    log(f"down: {n} hosts stopped and removed in {time.monotonic() - t0:.1f}s")


def cpu(name: str, cores: float) -> float | None:
    """Hold HOST to CORES of this machine's cores (``cpushare``; 0: no limit); the limit now."""
    state = current_state()
    h = find_host(state, name)
    if not host_alive(h):
        raise TestbedError(f"{name} is not running (python -m testbed up)")
    if cores:
        cpushare.limit(name, h["pid"], cores)
    else:
        cpushare.unlimit(name, h["pid"])
    return cpushare.cores_of(h["pid"])


def block(name: str, port: str) -> list[str]:
    """Drop TCP to PORT ("N" or "LOW-HIGH") arriving at HOST from the testbed network (a firewall's DROP rule on
    HOST: e.g. rank 0's dist-init port, so the group's other nodes cannot reach it; their
    connects time out). Returns HOST's blocked ports."""
    _, h = running_host(name)
    try:
        net.block_port(h["netns"], port)
    except ValueError as e:
        raise TestbedError(f"block {name}: {e}") from None
    return net.blocked_ports(h["netns"])


def unblock(name: str, port: str) -> list[str]:
    _, h = running_host(name)
    net.unblock_port(h["netns"], port)
    return net.blocked_ports(h["netns"])


def remove_router() -> bool:
    """Stop and remove the router host (`up --router`), keeping the servers: the inventory then
    has no `routers` group again. False when there was none."""
    with locked():
        state = load_state()
        routers = [h for h in (state or {}).get("hosts", []) if h.get("role") == "router"]
        if not routers:
            return False
        _remove(state, routers, "down --router")
        save_state(state)
    log(f"down --router: {', '.join(h['name'] for h in routers)} removed")
    return True


def status() -> dict:
    state = load_state()
    if state is None:
        return {"up": False, "state_dir": str(state_dir()), "hosts": []}

    def one(h):
        alive = host_alive(h)
        reach = False
        if alive:
            with contextlib.suppress(subprocess.TimeoutExpired):
                reach = ssh(state, h, "true", timeout=10).returncode == 0
        etc = Path(h["merged"]) / "etc/testbed"
        return {"name": h["name"], "address": h["address"], "pid": h["pid"], "alive": alive,
                "ssh": reach, "gpu_scenario": read_env_file(etc / "gpu.env").get("SCENARIO"),
                "sim_scenario": read_env_file(etc / "sim.env").get("SCENARIO"),
                "kind": lxc.kind(h),
                "blocked_ports": net.blocked_ports(h["netns"]) if alive else []}

    with ThreadPoolExecutor(max_workers=max(1, len(state["hosts"]))) as pool:
        hosts = list(pool.map(one, state["hosts"]))
    return {"up": True, "state_dir": state["state_dir"], "key": state["key"],
            "known_hosts": state["known_hosts"], "wheelhouse": state["wheelhouse"], "hosts": hosts,
            "groups": state.get("groups", [])}


def wipe(name: str) -> dict:
    """Replace HOST by a blank one (same name/address, new overlay, new SSH host key)."""
    t0 = time.monotonic()
    with locked():
        state = current_state()
        h = find_host(state, name)
        h["pid"] = h["pid"] if host_alive(h) else None
        create_host(state, h, gpu_build.build_libcuda(Path(state["state_dir"]) / "gpu-build"))
        start_containers(state, [h])
        save_state(state)
        wait_host(state, h)
    log(f"wipe: {h['name']} blank and up in {time.monotonic() - t0:.1f}s")
    return h


def kind(name: str, new_kind: str) -> dict:
    """Reboot HOST's container privileged or unprivileged (``cgroupmode``), its overlay
    (deployment, records) kept, its ids moved to the new owner; nothing happens when it
    already runs so."""
    if new_kind not in cgroupmode.KINDS:
        raise TestbedError(f"container kind {new_kind!r}: one of {', '.join(cgroupmode.KINDS)}")
    with locked():
        state = current_state()
        h = find_host(state, name)
        if lxc.kind(h) == new_kind and host_alive(h):
            return h
        stop_hosts(state, [h])
        _umount_all(state, h)
        old = lxc.root_id(h)
        h["privileged"] = new_kind == "privileged"
        lxc.shift_tree(Path(h["upper"]), lxc.root_id(h) - old)
        _mount_overlay(state, h)
        start_containers(state, [h])
        save_state(state)
        wait_host(state, h)
    return h


def _set_env_key(path: Path, key: str, value: str, owner: int | None = None) -> None:
    lines = path.read_text().splitlines() if path.exists() else []
    keep = [line for line in lines if line.split("=", 1)[0].strip() != key]
    _write(path, "\n".join([*keep, f"{key}={value}"]) + "\n", owner=owner)


def running_host(name: str) -> tuple[dict, dict]:
    """(testbed state, host record) of NAME, which must be up and running."""
    state = current_state()
    h = find_host(state, name)
    if not host_alive(h):
        raise TestbedError(f"{h['name']} is not running")
    return state, h


def scenario(name: str, scen: str, when: str = "") -> None:
    """Set a GPU scenario (gpu.env + device nodes) or a server scenario (sim.env). WHEN
    (server scenarios) limits it to servers launched with those arguments, e.g.
    "--mem-fraction-static 0.8": a configuration that fails while others still work."""
    state, h = running_host(name)
    etc = Path(h["merged"]) / "etc/testbed"
    owner = lxc.root_id(h)
    if scen in GPU_SCENARIOS and scen != "cgroup-denied":
        lxc.allow_devices(state, h)
    if scen in GPU_SCENARIOS:
        _set_env_key(etc / "gpu.env", "SCENARIO", scen, owner)
    if scen in SIM_SCENARIOS:
        _set_env_key(etc / "sim.env", "SCENARIO", scen, owner)
        _set_env_key(etc / "sim.env", "SCENARIO_WHEN", when, owner)
    sync_gpu_nodes(state, h)
    if scen == "cgroup-denied":
        lxc.deny_devices(state, h)


def gpu_nodes_wanted(passed: list[str], gpu_env: dict) -> tuple[list[str], list[str]]:
    """(present, absent): the passed nodes a host's container should have and lack for its
    gpu.env: GPUs below GPU_COUNT, less the last one in gpu-missing; no nvidia-uvm nodes in
    uvm-missing."""
    count = int(gpu_env.get("GPU_COUNT") or 8)
    scen = gpu_env.get("SCENARIO") or "healthy"
    present, absent = [], []
    for path in passed:
        keep = True
        m = re.fullmatch(r"/dev/nvidia(\d+)", path)
        if m:
            i = int(m.group(1))
            keep = i < count and not (scen == "gpu-missing" and i == count - 1)
        elif path.startswith("/dev/nvidia-uvm"):
            keep = scen != "uvm-missing"
        (present if keep else absent).append(path)
    return present, absent


def sync_gpu_nodes(state: dict, h: dict) -> dict:
    """The container's /dev/nvidia* as its gpu.env says: a node the LXC host's node missing
    from it (uvm-missing, gpu-missing) is taken away, one it should have put back (a bind
    mount of this machine's node, as its config's mount entry makes it)."""
    env = read_env_file(Path(h["merged"]) / "etc/testbed/gpu.env")
    present, absent = gpu_nodes_wanted(lxc.passed_nodes(state, h), env)
    return lxc.sync_nodes(h, present, absent)


def sim_env(name: str, settings: dict) -> dict:
    """Set KEY=VALUE lines of HOST's /etc/testbed/sim.env; returns the file's keys after it.

    The rate keys (TOKENS_PER_S, MAX_TOKENS_PER_S) take effect in a running simulator within
    half a second; the others at its next start.
    """
    bad = [k for k in settings if k not in SIM_ENV_KEYS]
    if bad:
        raise TestbedError(f"unknown sim.env key(s) {', '.join(bad)}; known: {', '.join(SIM_ENV_KEYS)}")
    _, h = running_host(name)
    path = Path(h["merged"]) / "etc/testbed/sim.env"
    for key, value in settings.items():
        if "\n" in str(value):
            raise TestbedError(f"{key}: the value must be one line")
        _set_env_key(path, key, str(value), lxc.root_id(h))
    return read_env_file(path)
