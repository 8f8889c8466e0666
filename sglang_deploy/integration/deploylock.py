"""The host-side deploy lock: two deploys of one host never interleave.

pyinfra runs each operation as its own command, so a lock taken by one operation and freed
by another would be left behind by any failure in between, and would show as a change in
every ``--dry`` run. Instead the lock lives as long as the deploy's SSH connection: right
after connecting, a process on the host takes ``flock`` on ``/run/sglang-deploy/lock`` and
holds it while its stdin (a channel of that connection) stays open. When the deploy ends,
fails, is killed or loses its connection, sshd closes the channel and the kernel frees the
lock: a lock FILE left behind by an earlier run is harmless by construction.

What can still be stale: a holder whose controller process is gone while sshd has not yet
noticed the dead connection (a laptop put to sleep, a killed controller behind a NAT).
``owner.json`` names the holder (controller host, pid, user, start, holder pid on the host);
``decide`` is the pure rule: the same controller machine with a dead pid -> stale, taken
over with a warning (the holder process on the host is killed); anything else -> live, the
deploy stops naming the owner.
"""

from __future__ import annotations

import getpass
import json
import os
import socket
import time
from dataclasses import dataclass

from sglang_deploy.core.errors import SglangDeployError

LOCK_DIR = "/run/sglang-deploy"
LOCK_FILE = f"{LOCK_DIR}/lock"
OWNER_FILE = f"{LOCK_DIR}/owner.json"


class DeployLockError(SglangDeployError):
    title = "host is being deployed by someone else"

    def headline(self) -> str:
        return f"{self.title}: {self.what}"


def me(command: str = "pyinfra deploy") -> dict:
    """Who this controller process is (written into owner.json on the host)."""
    return {"controller": socket.gethostname(), "pid": os.getpid(), "user": getpass.getuser(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "command": command}


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, owned by another user
        pass
    return True


@dataclass(frozen=True)
class Verdict:
    kind: str  # "stale" | "live"
    message: str


def describe(owner: dict | None) -> str:
    if not owner:
        return "an unknown holder (no owner.json)"
    return (f"{owner.get('user', '?')}@{owner.get('controller', '?')} pid {owner.get('pid', '?')} "
            f"(`{owner.get('command', '?')}`, since {owner.get('started', '?')}; holder pid "
            f"{owner.get('holder_pid', '?')} on the host)")


def decide(owner: dict | None, mine: dict, alive=pid_alive) -> Verdict:
    """Is the lock held by OWNER stale (its controller process is gone) or live?"""
    who = describe(owner)
    if (owner and owner.get("controller") == mine["controller"]
            and isinstance(owner.get("pid"), int) and not alive(owner["pid"])):
        return Verdict("stale", f"took over a stale deploy lock of {who}: that controller "
                                "process no longer exists")
    return Verdict("live", who)


def holder_command(owner: dict) -> str:
    """Shell run on the host in its own SSH channel: take the lock without waiting, write the
    owner (plus the holder's pid on the host), say LOCKED and hold the lock until stdin
    closes; or say BUSY and print the owner."""
    rest = json.dumps(owner, sort_keys=True)[1:].replace("'", "'\\''")
    return (
        f"umask 022; {{ [ -d {LOCK_DIR} ] || mkdir -p {LOCK_DIR}; }} && exec 9>>{LOCK_FILE} || exit 3; "
        f"if flock -n 9; then "
        f"printf '{{\"holder_pid\": %s, %s\\n' \"$$\" '{rest}' > {OWNER_FILE}.tmp "
        f"&& mv -f {OWNER_FILE}.tmp {OWNER_FILE} && echo LOCKED && exec cat > /dev/null; "
        f"else echo BUSY; cat {OWNER_FILE} 2>/dev/null || echo null; fi"
    )


def parse_busy(lines: list[str]) -> dict | None:
    """The owner printed after BUSY (None when unreadable)."""
    line = next((ln for ln in map(str.strip, lines) if ln.startswith("{")), "null")
    try:
        return json.loads(line)
    except ValueError:
        return None


def live_error(host: str, owner: dict | None) -> DeployLockError:
    holder = (owner or {}).get("holder_pid")
    return DeployLockError(
        what=f"no other deploy holds {host}'s deploy lock ({LOCK_FILE})",
        found=f"held by {describe(owner)}",
        fix=("wait for that deploy to finish and re-run; if it is dead, end its holder on the "
             f"host (`kill {holder}` there) and re-run" if holder else
             f"wait for that deploy to finish and re-run; if it is dead, end the `flock` "
             f"holder of {LOCK_FILE} on the host and re-run"),
    )
