"""docs/quickstart.md is true: its tested commands, run in order on a testbed host.

Every ``console`` block after a ``<!-- quickstart-test[: expect="..."] -->`` marker is run,
command by command (``$ `` lines), with bash in a fresh copy of this checkout; each must
exit 0 and the block's output must hold every ``expect`` text. What differs from a real
site, and only that: the host name ``gpu-node-1.example.internal`` becomes a freshly wiped
testbed host's address, ``ssh`` gets the testbed's key, and ``inventory/prod.py`` becomes a
small inventory that takes prod.py's own group data (its known-hosts file, strict host key
checking) and adds the testbed's data (inventory/testbed.py TESTBED_DATA).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "quickstart.md"
HOST = "gpu-node-1.example.internal"
MARKER = re.compile(r"<!-- quickstart-test(?::(?P<opts>[^>]*))? -->\s*```console\n(?P<body>.*?)```",
                    re.DOTALL)

INVENTORY = '''"""inventory/prod.py's group data with a testbed host (written by test_quickstart)."""
import runpy
from pathlib import Path

_here = Path(__file__).resolve().parent
_hosts, _group = runpy.run_path(str(_here / "prod.py"))["gpu_hosts"]
_testbed = runpy.run_path(str(_here / "testbed.py"))["TESTBED_DATA"]
# the simulated peer copies' speed follows this shared machine's load
gpu_hosts = ([({address!r}, {{"ssh_user": "root", "ssh_key": {key!r}}})],
             {{**_group, **_testbed, "gpu_p2p_min_gbps": 0.1}})
'''


def blocks(text: str) -> list[tuple[list[str], list[str]]]:
    """(commands, expected texts) of every tested block, in document order."""
    out = []
    for m in MARKER.finditer(text):
        commands = [line[2:] for line in m.group("body").splitlines() if line.startswith("$ ")]
        out.append((commands, re.findall(r'expect="([^"]*)"', m.group("opts") or "")))
    return out


def substitute(command: str, address: str, key: str) -> str:
    command = command.replace(HOST, address).replace("inventory/prod.py", "inventory/quickstart_testbed.py")
    if command.startswith("ssh "):
        command = f"ssh -i {key} -o IdentitiesOnly=yes -o BatchMode=yes " + command[4:]
    return command


def checkout_copy(dest: Path) -> Path:
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO,
                           capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, files):
        src = REPO / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


def test_the_doc_marks_every_step_it_promises():
    found = blocks(DOC.read_text())
    commands = [c for cmds, _ in found for c in cmds]
    assert len(found) >= 8
    for word in ("uv sync", "ssh-keyscan", "ssh-keygen -lf", "doctor", "--dry", "deploy.py", "status"):
        assert any(word in c for c in commands), word


def test_quickstart_commands_run_on_a_testbed_host(testbed, tmp_path):
    name = testbed.hosts[0]
    testbed.wipe(name)  # a first deploy, and a host key nobody has recorded yet
    address, key = testbed.address(name), testbed.state["key"]
    work = checkout_copy(tmp_path / "checkout")
    (work / "inventory" / "quickstart_testbed.py").write_text(INVENTORY.format(address=address, key=key))
    # the copy has no .testbed/ of its own: inventory/testbed.py finds this testbed's state
    env = {**os.environ, "TESTBED_DIR": testbed.state["state_dir"]}
    for commands, expects in blocks(DOC.read_text()):
        output = ""
        for command in commands:
            command = substitute(command, address, key)
            r = subprocess.run(["bash", "-c", command], check=False, cwd=work, capture_output=True, text=True,
                               timeout=900, stdin=subprocess.DEVNULL, env=env)
            testbed.log.append(r)
            output += r.stdout + r.stderr
            assert r.returncode == 0, f"`{command}` exited {r.returncode}:\n{output[-4000:]}"
        for text in expects:
            assert text.replace(HOST, address) in output, f"{commands}: no {text!r} in\n{output[-4000:]}"
        if any(c.startswith("ssh-keygen -lf") for c in commands):
            # the out-of-band comparison the doc asks for, through the testbed's own channel
            real = testbed.ssh(name, "ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub", check=True)
            assert real.stdout.split()[1] in output, (real.stdout, output)
