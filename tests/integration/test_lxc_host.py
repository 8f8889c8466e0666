"""lxc_host.py on real LXC on this machine (issue 38): the product's GPU passthrough into
plain-LXC containers made from the testbed's base rootfs, against the simulated NVIDIA
driver of testbed/lxchost.py (nodes in /dev, fake /proc/devices in a mount namespace).

No systemd-nspawn testbed: each test makes its own containers in its own lxcpath and its
own driver namespace (tmp_path), and removes them. "Serving" on the LXC host is the
container's SGLang unit active (`systemctl is-active sglang.service` inside): a stand-in
sglang.service running `sleep infinity` is that here.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from testbed import rootfs
from testbed.lxchost import DEFAULT_UVM, SimDriver

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
PREFIX = os.environ.get("TESTBED_PREFIX", "tb")
COMMON_CONF = "/usr/share/lxc/config/common.conf"
#: a char major no driver holds here: a node of it, bound in by hand, must be refused
PROBE_MAJOR = 507
NODES = [f"/dev/nvidia{n}" for n in range(8)] + ["/dev/nvidiactl", "/dev/nvidia-uvm",
                                                 "/dev/nvidia-uvm-tools"]
OPEN = """python3 -c '
import errno, os, sys
for p in sys.argv[1:]:
    try:
        os.close(os.open(p, os.O_RDWR)); print(p, "OPEN")
    except OSError as e:
        print(p, errno.errorcode[e.errno])
' """


def sh(*argv: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if check and r.returncode:
        raise AssertionError(f"{argv} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    return r


def both(r: subprocess.CompletedProcess) -> str:
    return r.stdout + r.stderr


@pytest.fixture
def work(request):
    """A folder of this test's own under $TESTBED_DIR/lxc-host-tests (not pytest's tmp_path:
    an unprivileged container's root, uid 100000 here, must reach its rootfs and bind-mount
    sources, and /tmp/pytest-of-root is 0700); removed afterwards."""
    base = Path(os.environ.get("TESTBED_DIR") or REPO / ".testbed") / "lxc-host-tests"
    path = base / re.sub(r"\W", "-", request.node.name)
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    for p in (path, *path.parents):
        if p.stat().st_mode & 0o005 != 0o005:
            p.chmod(p.stat().st_mode | 0o005)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def lxchost(work):
    """A simulated LXC host of its own: the driver namespace and an lxcpath in WORK.
    Its containers are stopped and destroyed afterwards."""
    if not all("root:100000:65536" in Path(f).read_text() for f in ("/etc/subuid", "/etc/subgid")):
        pytest.fail("unprivileged LXC needs `root:100000:65536` in /etc/subuid and /etc/subgid "
                    "(testbed-facts.md, 'LXC on this kind of machine'; scripts/setup.sh)")
    host = LxcHost(SimDriver(state=work / "lxchost").up(), work / "lxc")
    host.lxc_path.mkdir()
    try:
        yield host
    finally:
        for name in host.made:
            sh("lxc-stop", "-P", str(host.lxc_path), "-n", name, "-k", check=False)
            sh("lxc-destroy", "-P", str(host.lxc_path), "-n", name, check=False)
        if host.sim.uvm != DEFAULT_UVM:  # the nodes in /dev are every testbed's
            host.sim.driver_update(DEFAULT_UVM)
        host.sim.down()


class LxcHost:
    def __init__(self, sim: SimDriver, lxc_path: Path) -> None:
        self.sim, self.lxc_path, self.made = sim, lxc_path, []

    def config(self, name: str) -> Path:
        return self.lxc_path / name / "config"

    def base_lines(self, name: str, unprivileged: bool = True) -> list[str]:
        lines = [f"lxc.uts.name = {name}",
                 f"lxc.rootfs.path = dir:{self.lxc_path}/{name}/rootfs",
                 "lxc.net.0.type = empty",
                 "lxc.include = /usr/share/lxc/config/common.conf",
                 "lxc.apparmor.profile = unconfined",
                 "lxc.init.cmd = /sbin/init",
                 (f"lxc.mount.entry = {self.sim.state}/probe dev/probe none bind,optional,"
                  "create=file")]
        if unprivileged:
            # LXC's userns.conf clears common.conf's device rules (`lxc.cgroup.devices.deny =`
            # with no value): a plain unprivileged container has no device cgroup at all. They
            # are set again after it, as Proxmox does for its unprivileged containers, so that
            # the tool's device rules are what lets the GPUs open here too.
            rules = [x for x in Path(COMMON_CONF).read_text().splitlines()
                     if x.startswith("lxc.cgroup.devices.")]
            lines[4:4] = ["lxc.include = /usr/share/lxc/config/userns.conf",
                          "lxc.idmap = u 0 100000 65536", "lxc.idmap = g 0 100000 65536",
                          "lxc.rootfs.options = idmap=container", *rules]
        return lines

    def probe_node(self) -> None:
        probe = self.sim.state / "probe"
        if not probe.exists():
            os.mknod(probe, 0o20666, os.makedev(PROBE_MAJOR, 0))
            probe.chmod(0o666)

    def make(self, name: str, *, unprivileged: bool = True, rootfs_dir: bool = True,
             extra: tuple[str, ...] = (), serving: bool = False) -> str:
        """A container as an operator made it: the base rootfs copied, a hand-written config
        (its first line a comment); SERVING: a stand-in sglang.service enabled."""
        name = f"{PREFIX}{name}"
        self.made.append(name)
        self.probe_node()
        (self.lxc_path / name).mkdir()
        if rootfs_dir:
            prepare_rootfs(self.lxc_path / name / "rootfs", serving)
        text = "# made by hand\n" + "\n".join(self.base_lines(name, unprivileged)
                                             + list(extra)) + "\n"
        self.config(name).write_text(text)
        return name

    def run(self, containers: list[dict], check: bool = True, **kw) -> subprocess.CompletedProcess:
        return self.sim.passthrough(containers, self.lxc_path, check=check, **kw)

    def attach(self, name: str, command: str, check: bool = True) -> subprocess.CompletedProcess:
        return sh("lxc-attach", "-P", str(self.lxc_path), "-n", name, "--", "sh", "-c", command,
                  check=check)

    def init_pid(self, name: str) -> str:
        return sh("lxc-info", "-P", str(self.lxc_path), "-n", name, "-pH").stdout.strip()

    def opens(self, name: str, *paths: str) -> dict[str, str]:
        out = self.attach(name, OPEN + " ".join(paths)).stdout
        return dict(line.split() for line in out.splitlines())


def prepare_rootfs(dest: Path, serving: bool = False) -> None:
    """The testbed's base rootfs copied to DEST, its in-container node maker off (the nodes
    come from the LXC host here), SSH host keys made at boot; SERVING: sglang.service."""
    dest.mkdir()
    sh("cp", "-a", "--", f"{rootfs.ensure_base()}/.", f"{dest}/")
    wants = dest / "etc/systemd/system/multi-user.target.wants"
    (wants / "testbed-gpu-nodes.service").unlink(missing_ok=True)
    dropin = dest / "etc/systemd/system/ssh.service.d"
    dropin.mkdir(parents=True, exist_ok=True)
    (dropin / "host-keys.conf").write_text("[Service]\nExecStartPre=/usr/bin/ssh-keygen -A\n")
    if serving:
        (dest / "etc/systemd/system/sglang.service").write_text(
            "[Unit]\nDescription=stand-in server\n[Service]\nExecStart=/bin/sleep infinity\n"
            "[Install]\nWantedBy=multi-user.target\n")
        (wants / "sglang.service").symlink_to("/etc/systemd/system/sglang.service")


def block(text: str) -> list[str]:
    lines = text.splitlines()
    begin = next(i for i, x in enumerate(lines) if x.startswith("# BEGIN sglang-deploy"))
    end = next(i for i, x in enumerate(lines) if x.startswith("# END sglang-deploy"))
    return lines[begin:end + 1]


def outside(text: str) -> list[str]:
    """TEXT's lines outside the tool's block."""
    lines, b = text.splitlines(), block(text)
    start = lines.index(b[0])
    return lines[:start] + lines[start + len(b):]


def changed_ops(r: subprocess.CompletedProcess) -> list[str]:
    """The operations pyinfra reports as changed (``[@local] Success``)."""
    out, current = [], None
    for line in both(r).splitlines():
        if line.startswith("--> Starting operation:"):
            current = line.split(":", 1)[1].strip()
        elif "[@local] Success" in line and current:
            out.append(current)
    return out


def wait_systemd(host: LxcHost, name: str) -> None:
    deadline = time.monotonic() + 120
    last = ""
    while time.monotonic() < deadline:
        last = host.attach(name, "systemctl is-system-running", check=False).stdout.strip()
        if last in ("running", "degraded"):
            return
        time.sleep(0.5)
    raise AssertionError(f"{name}: systemd not up within 120 s (last: {last!r})")


@pytest.mark.parametrize("unprivileged", [True, False], ids=["unprivileged", "privileged"])
def test_passthrough_then_a_second_run_changes_nothing(lxchost, unprivileged):
    name = lxchost.make("lhu" if unprivileged else "lhp", unprivileged=unprivileged)
    before = lxchost.config(name).read_text()
    r = lxchost.run([{"name": name, "unprivileged": unprivileged}])
    text = lxchost.config(name).read_text()
    assert outside(text) == before.splitlines(), "the operator's lines are kept as they were"
    assert block(text)[1:3] == ["lxc.cgroup.devices.allow = c 195:* rwm",
                                f"lxc.cgroup.devices.allow = c {DEFAULT_UVM}:* rwm"]
    assert "booted" in " ".join(changed_ops(r))
    wait_systemd(lxchost, name)
    uid_map = lxchost.attach(name, "cat /proc/self/uid_map").stdout.split()
    assert uid_map == (["0", "100000", "65536"] if unprivileged else ["0", "0", "4294967295"])
    # every node is there and the device cgroup lets it open (ENXIO: no driver behind it);
    # a node of a major the tool did not pass is refused by the cgroup (EPERM)
    opened = lxchost.opens(name, *NODES, "/dev/probe")
    assert {p: opened[p] for p in NODES} == {p: "ENXIO" for p in NODES}, opened
    assert opened["/dev/probe"] == "EPERM", opened
    assert (lxchost.sim.etc_upper / "modules-load.d/nvidia-uvm.conf").read_text() == "nvidia_uvm\n"
    unit = lxchost.sim.etc_upper / "systemd/system/multi-user.target.wants/nvidia-uvm-nodes.service"
    assert os.readlink(unit) == "/etc/systemd/system/nvidia-uvm-nodes.service"
    record = (lxchost.sim.state / "records" / f"{name}.json").read_text()
    pid = lxchost.init_pid(name)

    again = lxchost.run([{"name": name, "unprivileged": unprivileged}])
    assert changed_ops(again) == [], again.stdout
    assert lxchost.config(name).read_text() == text
    assert (lxchost.sim.state / "records" / f"{name}.json").read_text() == record
    assert lxchost.init_pid(name) == pid, "a second run restarts nothing"


def test_driver_update_replaces_only_the_tools_lines(lxchost):
    name = lxchost.make("lhd", extra=("lxc.environment = KEEP=1",))
    lxchost.run([{"name": name}])
    wait_systemd(lxchost, name)
    first = lxchost.config(name).read_text()
    pid = lxchost.init_pid(name)

    lxchost.sim.driver_update(509)
    r = lxchost.run([{"name": name}])
    text = lxchost.config(name).read_text()
    assert outside(text) == outside(first)
    assert [x for x in block(text) if x not in block(first)] == [
        "lxc.cgroup.devices.allow = c 509:* rwm"]
    assert [x for x in block(first) if x not in block(text)] == [
        f"lxc.cgroup.devices.allow = c {DEFAULT_UVM}:* rwm"]
    # it served nothing: restarted at once, and the new major opens inside
    assert "restart" in " ".join(changed_ops(r)), r.stdout
    assert lxchost.init_pid(name) != pid
    wait_systemd(lxchost, name)
    assert lxchost.attach(name, "stat -c %t /dev/nvidia-uvm").stdout.strip() == "1fd"
    assert lxchost.opens(name, "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools") == {
        "/dev/nvidia-uvm": "ENXIO", "/dev/nvidia-uvm-tools": "ENXIO"}


def test_a_serving_container_is_not_restarted_unless_the_data_says_so(lxchost):
    name = lxchost.make("lhs", serving=True)
    lxchost.run([{"name": name}])
    wait_systemd(lxchost, name)
    assert lxchost.attach(name, "systemctl is-active sglang.service").stdout.strip() == "active"
    pid = lxchost.init_pid(name)

    lxchost.sim.driver_update(509)
    r = lxchost.run([{"name": name}])
    assert "restart needed" in both(r)
    assert f"lxc-stop -P {lxchost.lxc_path} -n {name} && lxc-start -P {lxchost.lxc_path} -n {name}" \
        in both(r)
    assert lxchost.init_pid(name) == pid, "the serving container kept running"
    assert "c 509:* rwm" in lxchost.config(name).read_text(), "the config is updated meanwhile"

    r = lxchost.run([{"name": name, "restart": "now"}])
    assert lxchost.init_pid(name) != pid, both(r)
    wait_systemd(lxchost, name)
    assert lxchost.opens(name, "/dev/nvidia-uvm") == {"/dev/nvidia-uvm": "ENXIO"}


def test_a_destroyed_container_is_created_from_its_base_image(lxchost, work):
    image = work / "base-image"
    prepare_rootfs(image)
    name = f"{PREFIX}lhr"
    lxchost.made.append(name)
    lxchost.probe_node()
    spec = {"name": name, "base_image": str(image),
            "config": ["lxc.net.0.type = empty", "lxc.apparmor.profile = unconfined",
                       "lxc.init.cmd = /sbin/init"]}
    t0 = time.monotonic()
    r = lxchost.run([spec])
    took = time.monotonic() - t0
    wait_systemd(lxchost, name)
    text = lxchost.config(name).read_text()
    assert "lxc.idmap = u 0 100000 65536" in text and block(text)
    assert lxchost.opens(name, *NODES) == {p: "ENXIO" for p in NODES}
    key = lxchost.attach(name, "ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub").stdout.split()
    assert f"new SSH host key: {' '.join(key)}" in both(r), both(r)
    assert "known-hosts" in both(r)
    scan = lxchost.attach(name, "ssh-keyscan -t ed25519 127.0.0.1 2>/dev/null").stdout
    assert key[1].split(":")[1] and "ssh-ed25519" in scan, "SSH answers with that key"
    print(f"from nothing to a booted container with GPUs and SSH: {took:.1f} s")

    sh("lxc-stop", "-P", str(lxchost.lxc_path), "-n", name, "-k")
    sh("lxc-destroy", "-P", str(lxchost.lxc_path), "-n", name)
    r = lxchost.run([spec])
    wait_systemd(lxchost, name)
    assert lxchost.opens(name, "/dev/nvidia0") == {"/dev/nvidia0": "ENXIO"}
    new = lxchost.attach(name, "ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub").stdout.split()
    assert new[1] != key[1] and f"new SSH host key: {' '.join(new)}" in both(r)


def _refused(lxchost, r, config: Path, before: str, *words: str) -> None:
    out = both(r)
    assert r.returncode != 0, out
    for w in words:
        assert w in out, out
    assert config.read_text() == before if config.exists() else True
    assert not (lxchost.sim.etc_upper / "modules-load.d").exists(), "nothing written"
    assert not (lxchost.sim.state / "records").exists()


def test_a_missing_container_without_a_base_image_is_refused(lxchost):
    r = lxchost.run([{"name": f"{PREFIX}lhnone"}], check=False)
    _refused(lxchost, r, lxchost.config(f"{PREFIX}lhnone"), "", "no such container",
             "base_image")
    assert not (lxchost.lxc_path / f"{PREFIX}lhnone").exists()


def test_a_host_without_the_nvidia_module_is_refused(lxchost):
    name = lxchost.make("lhm", rootfs_dir=False)
    before = lxchost.config(name).read_text()
    lxchost.sim.module_loaded(False)
    r = lxchost.run([{"name": name}], check=False)
    _refused(lxchost, r, lxchost.config(name), before, "NVIDIA kernel module", "modprobe nvidia")


def test_hand_written_conflicting_lines_are_refused(lxchost):
    name = lxchost.make("lhc", rootfs_dir=False, extra=(
        "lxc.cgroup.devices.allow = c 195:* rwm",
        "lxc.cgroup.devices.allow = c 508:* rwm",
        "lxc.mount.entry = /dev/nvidia0 dev/nvidia0 none bind,create=file"))
    before = lxchost.config(name).read_text()
    r = lxchost.run([{"name": name}], check=False)
    out = both(r)
    _refused(lxchost, r, lxchost.config(name), before, "not written by sglang-deploy",
             "adopt_passthrough_lines")
    n = len(before.splitlines())
    assert re.search(rf"line {n - 1}: lxc.cgroup.devices.allow = c 508", out), out
    assert re.search(rf"line {n}: lxc.mount.entry = /dev/nvidia0", out), out
