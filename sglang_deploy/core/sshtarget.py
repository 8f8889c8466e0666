"""What `logs` and `cache save` connect to and what they run there (pure: no I/O).

The SSH settings come from the host's pyinfra inventory data, the same keys the deploy
connects with (``ssh_hostname``, ``ssh_user``, ``ssh_port``, ``ssh_key``,
``ssh_key_password``, ``ssh_password``, ``ssh_known_hosts_file``,
``ssh_strict_host_key_checking``, ``ssh_config_file``, ``ssh_allow_agent``,
``ssh_look_for_keys``, ``ssh_paramiko_connect_kwargs``, ``ssh_connect_retries``); what the
inventory leaves unset, ``~/.ssh/config`` and the SSH agent provide, as fabric does.
"""

from __future__ import annotations

import json
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sglang_deploy.core.errors import SglangDeployError

#: how long a connection attempt may take when neither the inventory nor ~/.ssh/config say
CONNECT_TIMEOUT_S = 15


class HostShellError(SglangDeployError):
    """A live session to one host (logs, cache save) failed. Printed as ONE line."""

    title = "cannot reach the host"
    exit_status = 2

    def lines(self) -> list[str]:
        return [self.one_line()]


@dataclass(frozen=True)
class SshTarget:
    """Everything needed to open the SSH connection the deploy opens to one host."""

    name: str                        # the inventory's host name
    hostname: str                    # ssh_hostname, else the name (~/.ssh/config may map it)
    user: str | None = None          # None: ~/.ssh/config's User, else the local user
    port: int | None = None          # None: ~/.ssh/config's Port, else 22
    key_filename: str | None = None
    passphrase: str | None = field(default=None, repr=False)
    password: str | None = field(default=None, repr=False)
    known_hosts: str | None = None   # None: ~/.ssh/config's UserKnownHostsFile, else ~/.ssh/known_hosts
    host_key_policy: str = "strict"  # strict | accept-new | off
    ssh_config_file: str | None = None
    allow_agent: bool = True
    look_for_keys: bool = True
    connect_kwargs: dict[str, Any] = field(default_factory=dict)
    connect_retries: int = 0

    @property
    def address(self) -> str:
        return self.hostname if self.port in (None, 22) else f"{self.hostname}:{self.port}"


def host_key_policy(value: object) -> str:
    """The inventory's ``ssh_strict_host_key_checking`` as the policy for unknown host keys.

    ``yes`` (and unset or ``ask``: nobody is there to answer) refuse a host whose key is not in
    the known-hosts file; ``accept-new`` records it there, as the deploy does; ``no``/``off``
    accept it. A key that differs from the recorded one is refused under every policy.
    """
    text = "" if value is None else str(value).strip().lower()
    if text in ("", "yes", "ask", "true"):
        return "strict"
    if text == "accept-new":
        return "accept-new"
    if text in ("no", "off", "false"):
        return "off"
    raise HostShellError(what="ssh_strict_host_key_checking: yes, accept-new, no or off",
                         found=repr(value), fix="correct the inventory's ssh_strict_host_key_checking")


def _path(value: object, cwd: str) -> str | None:
    if not value:
        return None
    path = Path(os.path.expanduser(str(value)))
    return str(path if path.is_absolute() else Path(cwd) / path)


def target_from_data(name: str, data: dict[str, Any], cwd: str = ".") -> SshTarget:
    """The SSH target of host NAME from its merged inventory DATA (relative paths: to CWD)."""
    port = data.get("ssh_port")
    try:
        port = int(port) if port not in (None, "", 0) else None
    except (TypeError, ValueError):
        raise HostShellError(what="ssh_port: a TCP port number", found=repr(port),
                             fix=f"correct ssh_port of {name} in the inventory") from None
    extra = data.get("ssh_paramiko_connect_kwargs") or {}
    if not isinstance(extra, dict):
        raise HostShellError(what="ssh_paramiko_connect_kwargs: a dict", found=repr(extra),
                             fix=f"correct ssh_paramiko_connect_kwargs of {name} in the inventory")
    return SshTarget(
        name=name,
        hostname=str(data.get("ssh_hostname") or name),
        user=data.get("ssh_user") or None,
        port=port,
        key_filename=_path(data.get("ssh_key"), cwd),
        passphrase=data.get("ssh_key_password") or None,
        password=data.get("ssh_password") or None,
        known_hosts=_path(data.get("ssh_known_hosts_file"), cwd),
        host_key_policy=host_key_policy(data.get("ssh_strict_host_key_checking")),
        ssh_config_file=_path(data.get("ssh_config_file"), cwd),
        allow_agent=bool(data.get("ssh_allow_agent", True)),
        look_for_keys=bool(data.get("ssh_look_for_keys", True)),
        connect_kwargs=dict(extra),
        connect_retries=int(data.get("ssh_connect_retries") or 0),
    )


# ------------------------------------------------------------------ what runs on the host
def journal_command(unit: str, lines: int, follow: bool) -> str:
    """The unit's last LINES journal lines (and, with FOLLOW, every line written after them).

    ``-u`` matches the unit, not one run of it, so a follower keeps streaming across
    restarts. journalctl flushes its output after each batch when following, so lines reach
    the SSH channel as they are written even without a terminal.
    """
    if lines < 0:
        raise HostShellError(what="-n/--lines: 0 or more lines", found=str(lines),
                             fix="pass a line count such as -n 100")
    args = ["journalctl", "-u", unit, "--no-pager", "-o", "short-iso", "-n", str(lines)]
    if follow:
        args.append("-f")
    return shlex.join(args)


#: exit status of journal_since_last_start_command when the unit has no run to show
NO_INVOCATION = 3


#: the lines ``journal_since_last_start_command`` prints before the journal when it is asked
#: for the watchdog's events too (a journal line never starts so: short-iso starts with a date)
SIDE_MARK = "#sglang-deploy "
#: the watchdog's last events it prints (the events file keeps 500)
WATCHDOG_EVENTS_TAIL = 50


def journal_since_last_start_command(unit: str, watchdog_events: str | None = None) -> str:
    """The unit's journal from its last start: its lines and systemd's lines about it.

    ``journalctl --invocation=0`` does this from systemd 257 on; this is its equivalent for
    older hosts (Debian 12 has systemd 252): the last start's invocation id, the cursor of
    systemd's first message with that id, then ``-u UNIT`` from that cursor.

    WATCHDOG_EVENTS (the watchdog's ``events.jsonl``): first, in the same round trip, the
    invocation id and the file's last events, each line starting with ``SIDE_MARK``
    (``split_side_lines`` takes them apart); nothing when the file is absent.
    """
    q = shlex.quote(unit)
    side = ""
    if watchdog_events:
        w = shlex.quote(watchdog_events)
        side = (f'printf "{SIDE_MARK}invocation %s\\n" "$id"; '
                f"if [ -r {w} ]; then tail -n {WATCHDOG_EVENTS_TAIL} {w} | "
                f"sed 's/^/{SIDE_MARK}watchdog /'; fi; ")
    return (
        f"id=$(systemctl show -p InvocationID --value {q}) && "
        f'[ -n "$id" ] || {{ echo "{unit} has not been started since the host booted" >&2; '
        f"exit {NO_INVOCATION}; }}; " + side +
        'cursor=$(journalctl --no-pager -q -r -o cat --show-cursor _PID=1 "INVOCATION_ID=$id" '
        "| sed -n 's/^-- cursor: //p' | tail -n 1); "
        f'if [ -n "$cursor" ]; then exec journalctl -u {q} --no-pager -o short-iso --cursor="$cursor"; '
        f'else exec journalctl --no-pager -o short-iso "_SYSTEMD_INVOCATION_ID=$id"; fi'
    )


def split_side_lines(text: str) -> tuple[str, str, list[dict[str, Any]]]:
    """(journal, invocation id, watchdog events) of ``journal_since_last_start_command``'s
    output with WATCHDOG_EVENTS (an event line that is no JSON object is skipped)."""
    journal, invocation, events = [], "", []
    for line in text.splitlines(keepends=True):
        if not line.startswith(SIDE_MARK):
            journal.append(line)
            continue
        kind, _, rest = line[len(SIDE_MARK):].rstrip("\n").partition(" ")
        if kind == "invocation":
            invocation = rest.strip()
        elif kind == "watchdog":
            try:
                doc = json.loads(rest)
            except ValueError:
                continue
            if isinstance(doc, dict):
                events.append(doc)
    return "".join(journal), invocation, events


def cache_archive_command(cache_dir: str) -> str:
    """A gzip'd tar of CACHE_DIR's contents on stdout."""
    return f"tar -C {shlex.quote(cache_dir)} -czf - ."
