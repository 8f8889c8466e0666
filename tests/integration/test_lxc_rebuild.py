"""A serving testbed host destroyed outright (`lxc-destroy -f`, its rootfs gone) and brought
back to verified serving by the documented commands only (issue 38, item 3;
docs/operations.md, "A lost container: from nothing back to serving"):

1. `sglang-deploy cache save` while it serves (before the loss);
2. `lxc_host.py` against the LXC host (the testbed's `@local` passthrough run) with the
   container's `base_image` and `config` data: it creates, passes the GPUs, boots it and
   prints the new SSH host key's fingerprint;
3. the fingerprint checked against the container's console and the key scanned into the
   known-hosts file as docs/quickstart.md step 3 says (the old key removed first); before
   that, the deploy refuses the changed key;
4. `sglang-deploy rebuild INVENTORY HOST --cache FILE`.

The operator's base image (the admin's key baked in, host keys made at first boot, the
driver's user space: here the testbed's stand-ins) and the container's data come from the
testbed helpers of testbed/lostcontainer.py; the product knows nothing of the testbed.
"""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest

from testbed import lostcontainer, lxc, lxchost
from testbed.fleet import find_host

from .helpers import BIN, REPO, TB1, both

pytestmark = pytest.mark.slow

CLI = str(BIN / "sglang-deploy")


def cli(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([CLI, *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, check=False, stdin=subprocess.DEVNULL)


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, check=check, timeout=120)


def fingerprint(text: str) -> str:
    """The first `SHA256:...` fingerprint in TEXT."""
    m = re.search(r"SHA256:[A-Za-z0-9+/]+", text)
    assert m, text
    return m.group(0)


def test_a_destroyed_container_comes_back_serving_by_the_documented_commands(
        testbed, serving_host, tmp_path):
    serving_host(TB1)
    state = testbed.reload()
    h = find_host(state, TB1)
    address, kh = h["address"], state["known_hosts"]
    old_line = next(ln for ln in Path(kh).read_text().splitlines()
                    if ln.startswith(address + " "))

    # before the loss: the caches of the healthy host; the site's base image and share
    archive = tmp_path / f"{TB1}-cache.tar.gz"
    r = cli("cache", "save", str(testbed.inventory), TB1, str(archive))
    assert r.returncode == 0 and archive.stat().st_size > 0, both(r)
    try:
        image = lostcontainer.operator_image(state, tmp_path / "base-image")
        data = lostcontainer.container_data(state, h, image, lostcontainer.share(state))
        lostcontainer.destroy(state, h)
        assert sh("lxc-info", "-P", lxc.lxc_path(state), "-n", TB1, check=False).returncode != 0
        assert not lxc.config_path(state, h).parent.exists(), "its rootfs and config are gone"
        assert testbed.ssh(TB1, "true", timeout=30).returncode != 0

        t0 = time.monotonic()
        # 1. lxc_host.py on the LXC host: created from the base image, GPUs passed, booted
        made = lxchost.passthrough(lxc.lxc_path(state), [data])
        out = both(made)
        t_created = time.monotonic() - t0
        assert f"create {TB1} from {image}" in out, out[-3000:]
        printed = fingerprint(out[out.index("new SSH host key"):])
        config = lxc.config_path(state, h).read_text()
        assert "# BEGIN sglang-deploy" in config and "lxc.cgroup.devices.allow = c 195:* rwm" \
            in config, config
        assert f"lxc.rootfs.path = dir:{lxc.lxc_path(state)}/{TB1}/rootfs" in config
        lostcontainer.adopt(TB1)  # testbed bookkeeping: scenario, wipe and down act on it

        # 2. the key: the printed fingerprint is the container's (its console) and the one
        # sshd answers with; the known-hosts file still has the old key, and the deploy
        # refuses to talk to the new one until the operator replaces it
        console = sh("lxc-attach", "-P", lxc.lxc_path(state), "-n", TB1, "--",
                     "ssh-keygen", "-lf", "/etc/ssh/ssh_host_ed25519_key.pub").stdout
        assert fingerprint(console) == printed
        scanned = sh("ssh-keyscan", "-t", "ed25519", address).stdout
        assert scanned.split()[1:3] != old_line.split()[1:3], "a new host key"
        assert fingerprint(subprocess.run(["ssh-keygen", "-lf", "-"], input=scanned, check=True,
                                          capture_output=True, text=True).stdout) == printed
        refused = cli("rebuild", str(testbed.inventory), TB1)
        assert refused.returncode != 0, both(refused)[-3000:]
        assert f"{TB1}'s SSH host key is not the one recorded for {address}" in both(refused) \
            and "nothing was run" in both(refused), both(refused)[-3000:]
        nothing = sh("lxc-attach", "-P", lxc.lxc_path(state), "-n", TB1, "--", "sh", "-c",
                     "ls /opt/sglang /etc/sglang 2>/dev/null | wc -l").stdout.strip()
        assert nothing == "0", "the refused deploy changed nothing"
        assert testbed.ssh(TB1, "true", timeout=30).returncode != 0, "the old key still refuses"
        # the operator, as docs/operations.md says: the old key out, the new one scanned in,
        # its fingerprint compared with the one lxc_host.py printed
        t1 = time.monotonic()
        sh("ssh-keygen", "-f", kh, "-R", address)
        with open(kh, "a") as f:
            f.write(sh("ssh-keyscan", "-t", "ed25519", address).stdout)
        assert fingerprint(sh("ssh-keygen", "-lf", kh, "-F", address).stdout) == printed
        assert testbed.ssh(TB1, "true", timeout=30).returncode == 0

        # 3. rebuild with the saved caches: pre-flight (GPUs), install, start, verify
        r = cli("rebuild", str(testbed.inventory), TB1, "--cache", str(archive))
        t_rebuild = time.monotonic() - t1
        # the documented steps only (not the test's checks between them: the refused deploy)
        took, total = t_created + t_rebuild, time.monotonic() - t0
        testbed.log.append(r)
        assert r.returncode == 0, both(r)[-4000:]
        s = testbed.host_state(TB1)
        assert s.get("health") == "200" and s.get("invocation") \
            and s.get("invocation") == s.get("verified"), s
        models = testbed.ssh(TB1, "curl -sf http://127.0.0.1:30000/v1/models", timeout=30)
        assert models.returncode == 0 and '"data"' in models.stdout, models.stdout
        opened = sh("lxc-attach", "-P", lxc.lxc_path(state), "-n", TB1, "--", "python3", "-c",
                    "import errno,os\ntry: os.open('/dev/nvidia0', os.O_RDWR)\n"
                    "except OSError as e: print(errno.errorcode[e.errno])").stdout.strip()
        assert opened == "ENXIO", "the GPU node is passed and allowed (no driver behind it)"
        line = (f"lost container to verified serving: {took:.1f} s in the documented steps "
                f"(lxc_host.py to booted with GPUs and SSH {t_created:.1f} s; known-hosts "
                f"and rebuild --cache {t_rebuild:.1f} s); {total:.1f} s with the test's checks")
        print(line)
        testbed.log.append(line)
    finally:
        lostcontainer.unshare(state)
        testbed.wipe(TB1)  # an ordinary testbed host again (its overlay, the testbed's key)
