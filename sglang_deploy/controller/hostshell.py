"""Live SSH sessions to one host, for `logs`, `cache save` and the rollout's promotion.

A fabric ``Connection`` built from the host's pyinfra inventory data (what the deploy
connects with: see ``core.sshtarget``) on top of what fabric itself reads: ``~/.ssh/config``
(Host aliases, User, Port, IdentityFile, ProxyJump, ProxyCommand, ConnectTimeout) and the SSH
agent. Host keys are checked against the inventory's known-hosts file under its
``ssh_strict_host_key_checking`` policy, on every hop (fabric alone would accept any key).
Output is streamed as bytes from the channel, so a followed journal or a tar archive never
accumulates in memory.
"""

from __future__ import annotations

import contextlib
import io
import os
import random
import select
import signal
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import paramiko
from fabric import Config, Connection

from sglang_deploy.controller import runner
from sglang_deploy.core import data as datamod
from sglang_deploy.core.errors import UsageError
from sglang_deploy.core.sshtarget import (
    CONNECT_TIMEOUT_S,
    NO_INVOCATION,
    HostShellError,
    SshTarget,
    journal_since_last_start_command,
    split_side_lines,
    target_from_data,
)

#: seconds between keepalive messages, unless ~/.ssh/config sets ServerAliveInterval
KEEPALIVE_S = 30
#: seconds a short command (run) may take
RUN_TIMEOUT_S = 120

def host_data(inventory: str, name: str, cwd: str = ".") -> dict:
    """The merged inventory data of host NAME, read as pyinfra reads it (no connection).
    A missing inventory or a NAME that is not one of its hosts is a UsageError (exit 2)
    naming the hosts there are, before any connection."""
    hosts = dict(runner.inventory_hosts(inventory, cwd))  # a missing file: UsageError
    if name not in hosts:
        nodes = [h for h, d in hosts.items() if str(d.get("sglang_group") or "") == name]
        if nodes:  # a multi-node group's name: each node has its own journal
            raise UsageError(what=f"HOST: one host of the inventory {inventory}",
                             found=f"{name!r} is a multi-node group (sglang_group) of "
                                   f"{len(nodes)} nodes",
                             fix=f"name one of its nodes: {', '.join(nodes)}")
        raise UsageError(what=f"HOST: one host of the inventory {inventory}",
                         found=f"{name!r} is not in the inventory",
                         fix=f"use one of the hosts: {', '.join(hosts) or '(none)'}")
    return hosts[name]


def setting(data: dict, key: str):
    return data.get(key, datamod.KEYS[key].default)


def target(inventory: str, name: str, cwd: str = ".") -> tuple[SshTarget, dict]:
    data = host_data(inventory, name, cwd)
    return target_from_data(name, data, str(Path(cwd).resolve())), data


# ------------------------------------------------------------------------- host keys
class UnknownHostKey(Exception):
    def __init__(self, hostname: str, key) -> None:
        super().__init__(hostname)
        self.hostname, self.key = hostname, key


def _fingerprint(key) -> str:
    return f"{key.get_name()} {key.fingerprint}"


class _Policy(paramiko.MissingHostKeyPolicy):
    """What an unknown host key gets under ssh_strict_host_key_checking MODE."""

    def __init__(self, mode: str, known_hosts: str) -> None:
        self.mode, self.known_hosts = mode, known_hosts

    def missing_host_key(self, client, hostname, key):
        if self.mode == "strict":
            raise UnknownHostKey(hostname, key)
        if self.mode == "accept-new":
            path = Path(self.known_hosts)
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "a") as fh:
                fh.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")
            print(f"warning: recorded the new host key of {hostname} ({_fingerprint(key)}) "
                  f"in {path} (ssh_strict_host_key_checking=accept-new)", file=sys.stderr)
        else:
            print(f"warning: host key of {hostname} ({_fingerprint(key)}) not checked "
                  "(ssh_strict_host_key_checking=no)", file=sys.stderr)


def _known_hosts_files(t: SshTarget, ssh_config: dict) -> list[str]:
    if t.known_hosts:
        return [t.known_hosts]
    configured = ssh_config.get("userknownhostsfile")
    if configured:
        return [os.path.expanduser(p) for p in configured.split()]
    return [os.path.expanduser("~/.ssh/known_hosts")]


def _check_host_keys(cxn, t: SshTarget, extra: list[str] = ()) -> None:
    """Replace fabric's accept-anything policy on CXN and on every ProxyJump hop before it."""
    files = _known_hosts_files(t, cxn.ssh_config) + list(extra)
    present = [f for f in files if Path(f).is_file()]
    if t.host_key_policy == "strict" and not present:
        scan = (f"check the host's fingerprint and record it: `ssh-keyscan -p {cxn.port} {cxn.host} "
                f">> {files[0]}`")
        raise HostShellError(
            what=f"the SSH host keys of {cxn.original_host} in {' or '.join(files)}",
            found="no such file",
            fix=(f"{scan}, or run the deploy once with ssh_strict_host_key_checking=accept-new"
                 if t.known_hosts else
                 f"set ssh_known_hosts_file in the inventory to the deploy's known-hosts file, or {scan}"))
    for f in present:
        cxn.client.load_host_keys(f)
    cxn.client.set_missing_host_key_policy(_Policy(t.host_key_policy, files[0]))
    if cxn.gateway and not isinstance(cxn.gateway, str):
        hop = cxn.gateway
        # a jump host's keys: its own known-hosts file from ~/.ssh/config, or the user's
        _check_host_keys(hop, SshTarget(name=hop.original_host, hostname=hop.host,
                                        host_key_policy=t.host_key_policy),
                         extra=[t.known_hosts] if t.known_hosts else [])


# ----------------------------------------------------------------------- connections
def connection(t: SshTarget):
    """An unopened fabric Connection for T, host keys checked (see ``connect``)."""
    if t.ssh_config_file and not Path(t.ssh_config_file).is_file():
        raise HostShellError(what=f"the SSH config file {t.ssh_config_file} (ssh_config_file of {t.name})",
                             found="no such file", fix="correct ssh_config_file in the inventory")
    config = Config(runtime_ssh_path=t.ssh_config_file) if t.ssh_config_file else Config()
    if config.timeouts.connect is None:
        config.timeouts.connect = CONNECT_TIMEOUT_S
    kwargs = {"allow_agent": t.allow_agent, "look_for_keys": t.look_for_keys, **t.connect_kwargs}
    if t.key_filename:
        kwargs["key_filename"] = [t.key_filename]
    if t.passphrase:
        kwargs["passphrase"] = t.passphrase
    if t.password:
        kwargs["password"] = t.password
    cxn = Connection(t.hostname, user=t.user, port=t.port, config=config, connect_kwargs=kwargs)
    _check_host_keys(cxn, t)
    return cxn


def _no_auth_method(exc: BaseException) -> bool:
    return "no authentication methods available" in str(exc).lower()


def _error(t: SshTarget, cxn, exc: BaseException) -> HostShellError:
    where = f"{t.name} ({cxn.user}@{cxn.host}:{cxn.port})"
    if isinstance(exc, UnknownHostKey):
        files = " or ".join(_known_hosts_files(t, cxn.ssh_config))
        return HostShellError(
            what=f"the SSH host key of {exc.hostname} recorded in {files}",
            found=f"no entry for {exc.hostname} (it offers {_fingerprint(exc.key)})",
            fix=(f"check that fingerprint on the host (`ssh-keygen -lf /etc/ssh/ssh_host_*.pub`), "
                 f"then `ssh-keyscan -p {cxn.port} {cxn.host} >> {files.split(' or ')[0]}`, or run "
                 "the deploy once with ssh_strict_host_key_checking=accept-new"))
    if isinstance(exc, paramiko.BadHostKeyException):
        return HostShellError(
            what=f"the SSH host key of {exc.hostname} recorded in the known-hosts file",
            found=f"a different key ({_fingerprint(exc.key)}; recorded: "
                  f"{_fingerprint(exc.expected_key)})",
            fix=(f"if {t.name} was rebuilt on purpose, `ssh-keygen -R {exc.hostname} -f FILE` and "
                 "record its new key; otherwise stop: something else answers at that address"))
    if isinstance(exc, paramiko.PasswordRequiredException):
        return HostShellError(
            what=f"a usable SSH key for {where}", found=f"the key is encrypted ({exc})",
            fix="set ssh_key_password in the inventory data, or load the key into the SSH agent "
                "(`ssh-add KEY`)")
    if isinstance(exc, paramiko.AuthenticationException) or _no_auth_method(exc):
        key = t.key_filename or "keys from ~/.ssh/config, the agent and ~/.ssh/id_*"
        return HostShellError(
            what=f"SSH authentication as {cxn.user} on {where}",
            found=f"{exc} (tried {key})",
            fix="check ssh_user/ssh_key/ssh_key_password in the inventory, or `ssh-add` the key")
    if isinstance(exc, socket.gaierror):
        return HostShellError(what=f"an address for {cxn.host}", found=f"DNS: {exc}",
                              fix="check ssh_hostname in the inventory or HostName in ~/.ssh/config")
    return HostShellError(what=f"an SSH connection to {where}",
                          found=f"{type(exc).__name__}: {exc}",
                          fix="check that the host is up and answers SSH, and the inventory's ssh_* data")


def connect(t: SshTarget):
    """An open fabric Connection to T, retried ``ssh_connect_retries`` times like the deploy."""
    retries = t.connect_retries
    while True:
        cxn = connection(t)
        try:
            cxn.open()
            # a silent peer (host gone, network cut) shows up as an error, not an endless wait
            cxn.transport.set_keepalive(int(cxn.ssh_config.get("serveraliveinterval", KEEPALIVE_S)))
            return cxn
        except (UnknownHostKey, paramiko.BadHostKeyException, paramiko.AuthenticationException,
                socket.gaierror) as exc:
            cxn.close()
            raise _error(t, cxn, exc) from None
        except (paramiko.SSHException, OSError, EOFError) as exc:
            cxn.close()
            if retries <= 0 or _no_auth_method(exc):
                raise _error(t, cxn, exc) from None
            retries -= 1
            time.sleep(random.uniform(0.1, 0.5))


@contextlib.contextmanager
def _ctrl_c_pipe():
    """A pipe that becomes readable on Ctrl-C, instead of KeyboardInterrupt raised in
    whichever thread runs then: under pyinfra's gevent that is often paramiko's transport,
    whose trace gevent prints (and the wait on the channel never ends). None outside the
    main thread, where Ctrl-C is not ours to take."""
    try:
        read_end, write_end = os.pipe()
        previous = signal.signal(signal.SIGINT, lambda *_: os.write(write_end, b"\0"))
    except ValueError:  # not the main thread
        os.close(read_end)
        os.close(write_end)
        yield None
        return
    try:
        yield read_end
    finally:
        signal.signal(signal.SIGINT, previous)
        os.close(read_end)
        os.close(write_end)


def stream(cxn, command: str, out: BinaryIO, err: BinaryIO | None = None,
           timeout: float | None = None) -> tuple[int, bytes]:
    """Run COMMAND (no pty), copy its stdout to OUT as it comes; (exit status, stderr tail).

    TIMEOUT: seconds the command may take in all (None: as long as it runs, e.g. a follower);
    past it, HostShellError with the last output seen.

    Stderr is drained in the same loop (so neither stream can stall the channel's window)
    and copied to ERR when given. One thread only: reading the inventory imports pyinfra's
    CLI, which monkey-patches threads with gevent, and joining a thread does not return
    then. Ctrl-C ends the session (status 130); a closed OUT (`| head`) ends it quietly
    (status 0); either way the remote command sees its output closed and exits.
    """
    chan = cxn.create_session()
    tail = bytearray()

    def take_stderr() -> None:
        while chan.recv_stderr_ready():
            chunk = chan.recv_stderr(65536)
            tail.extend(chunk)
            del tail[:-8192]
            if err is not None:
                err.write(chunk)
                err.flush()

    deadline = None if timeout is None else time.monotonic() + timeout
    with _ctrl_c_pipe() as ctrl_c:
        try:
            return _copy(chan, command, out, take_stderr, deadline, ctrl_c, cxn, timeout), \
                bytes(tail)
        except KeyboardInterrupt:
            return 130, bytes(tail)
        except BrokenPipeError:
            return 0, bytes(tail)
        finally:
            chan.close()


def _copy(chan, command: str, out: BinaryIO, take_stderr, deadline: float | None,
          ctrl_c: int | None, cxn, timeout: float | None) -> tuple[int, bytes]:
    """``stream``'s loop: the command's exit status, 130 once CTRL_C is readable."""
    last = b""
    chan.exec_command(command)
    while True:
        wait = None if deadline is None else deadline - time.monotonic()
        if wait is not None and wait <= 0:
            raise HostShellError(
                what=f"`{command[:80]}` on {cxn.host} to finish within {timeout:.0f} s",
                found=f"still running; last output: {last[-200:].decode('utf-8', 'replace')!r}",
                fix="check the host's load and its journal")
        # the channel's pipe is ready on stdout, stderr or EOF (or Ctrl-C was pressed)
        ready, _, _ = select.select([chan] + ([ctrl_c] if ctrl_c is not None else []), [], [],
                                    wait)
        if ctrl_c is not None and ctrl_c in ready:
            return 130
        take_stderr()
        if chan.recv_ready():
            last = chan.recv(65536)
            out.write(last)
            out.flush()
        elif chan.eof_received or chan.closed:
            break
    take_stderr()
    return chan.recv_exit_status()


def run(cxn, command: str, timeout: float = RUN_TIMEOUT_S) -> tuple[int, str, str]:
    """Run COMMAND on the open connection CXN: (exit status, stdout, stderr tail)."""
    out = io.BytesIO()
    status, err = stream(cxn, command, out, timeout=timeout)
    return status, out.getvalue().decode("utf-8", "replace"), err.decode("utf-8", "replace")


def journal_since_last_start(inventory: str, host: str, cwd: str = ".") -> str:
    """The service's journal on HOST from its last start (systemd's lines about it included),
    as ``journalctl -o short-iso`` text. Raises HostShellError when it cannot be read."""
    return last_start(inventory, host, cwd).journal


@dataclass(frozen=True)
class LastStart:
    """The service's last start on a host: its journal (``journal_since_last_start``), its
    invocation id and the watchdog's last events (``core.watchdog.restart_of`` reads them)."""

    journal: str
    invocation: str = ""
    watchdog_events: tuple = ()


def last_start(inventory: str, host: str, cwd: str = ".") -> LastStart:
    """The journal since the last start and the watchdog's events, in one round trip."""
    from sglang_deploy.core import watchdogunit

    t, data = target(inventory, host, cwd)
    unit = f"{setting(data, 'sglang_service')}.service"
    with connect(t) as cxn:
        status, text, err = run(cxn, journal_since_last_start_command(
            unit, watchdog_events=f"{watchdogunit.STATE_DIR}/events.jsonl"))
    if status == NO_INVOCATION:
        raise HostShellError(what=f"a run of {unit} on {host}", found=err.strip(),
                             fix=f"deploy the host (`pyinfra {inventory} deploy.py --limit {host}`)")
    if status != 0:
        raise HostShellError(what=f"the journal of {unit} on {host}",
                             found=f"journalctl exited {status}: {err.strip()[-300:]}",
                             fix="check that the SSH user may read the system journal "
                                 "(root or the systemd-journal group)")
    journal, invocation, events = split_side_lines(text)
    return LastStart(journal=journal, invocation=invocation, watchdog_events=tuple(events))
