"""`sglang-deploy logs` and `sglang-deploy cache save`: live SSH sessions to one host.

They connect with the inventory's own SSH data (``ssh_hostname``, ``ssh_user``, ``ssh_port``,
``ssh_key``, ``ssh_known_hosts_file``) through paramiko (pyinfra's own SSH library), with
the same strict host-key check as the deploy, and stream: the journal as it is written, or
a tar archive of the service's cache folder. Neither changes the host.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from sglang_deploy.core import data as datamod
from sglang_deploy.shell import runner
from sglang_deploy.core.errors import SglangDeployError


class HostShellError(SglangDeployError):
    title = "cannot reach the host"


def host_data(inventory: str, name: str, cwd: str = ".") -> dict:
    hosts = dict(runner.inventory_hosts(inventory, cwd))
    if name not in hosts:
        raise HostShellError(what=f"a host of {inventory}", found=f"no host named {name}",
                             fix=f"use one of: {', '.join(hosts)}")
    return hosts[name]


def setting(data: dict, key: str):
    return data.get(key, datamod.KEYS[key].default)


def connect(name: str, data: dict):
    import paramiko

    client = paramiko.SSHClient()
    known = data.get("ssh_known_hosts_file")
    if known:
        client.load_host_keys(str(Path(known).expanduser()))
    else:
        client.load_system_host_keys()
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    address = data.get("ssh_hostname") or name
    try:
        client.connect(hostname=address, port=int(data.get("ssh_port") or 22),
                       username=data.get("ssh_user"), key_filename=data.get("ssh_key"),
                       timeout=15, banner_timeout=15, auth_timeout=15)
    except paramiko.BadHostKeyException as exc:
        raise HostShellError(what=f"the SSH host key of {name} ({address}) recorded in {known}",
                             found=f"a different key ({exc.key.get_name()})",
                             fix="if the host was rebuilt on purpose, replace its line in the "
                                 "known-hosts file; otherwise stop: something else answers") from exc
    except (paramiko.SSHException, OSError) as exc:
        raise HostShellError(what=f"an SSH connection to {name} ({address})",
                             found=f"{type(exc).__name__}: {exc}",
                             fix="check the host is up and the inventory's ssh_* data") from exc
    return client


def stream(client, command: str, out) -> int:
    """Run COMMAND, copy its stdout to OUT (binary) as it comes; return its exit status."""
    chan = client.get_transport().open_session()
    chan.exec_command(command)
    try:
        while True:
            chunk = chan.recv(65536)
            if not chunk:
                break
            out.write(chunk)
            out.flush()
    except KeyboardInterrupt:
        chan.close()
        return 130
    err = chan.recv_stderr(65536).decode("utf-8", "replace")
    status = chan.recv_exit_status()
    if status and err:
        sys.stderr.write(err)
    return status


def journal_command(service: str, lines: int, follow: bool) -> str:
    args = ["journalctl", "-u", f"{service}.service", "--no-pager", "-o", "short-iso", "-n", str(lines)]
    if follow:
        args.append("-f")
    return shlex.join(args)


def run_logs(args) -> int:
    data = host_data(args.inventory, args.host)
    client = connect(args.host, data)
    try:
        return stream(client, journal_command(setting(data, "sglang_service"), args.lines, args.follow),
                      sys.stdout.buffer)
    finally:
        client.close()


def run_cache_save(args) -> int:
    data = host_data(args.inventory, args.host)
    cache = setting(data, "sglang_cache_dir")
    client = connect(args.host, data)
    target = Path(args.file)
    tmp = target.with_name(target.name + ".part")
    try:
        with open(tmp, "wb") as fh:
            status = stream(client, f"tar -C {shlex.quote(cache)} -czf - .", fh)
    finally:
        client.close()
    if status != 0:
        tmp.unlink(missing_ok=True)
        print(f"error: `tar` of {cache} on {args.host} failed (status {status})", file=sys.stderr)
        return 1
    tmp.rename(target)
    print(f"saved {cache} of {args.host} to {target} ({target.stat().st_size} bytes); restore it on a "
          f"blank host with: sglang-deploy rebuild {args.inventory} HOST --cache {target}")
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("logs", help="the service's journal on one host (--follow to stream)")
    p.add_argument("host")
    p.add_argument("--inventory", "-i", default="inventory/prod.py")
    p.add_argument("--follow", "-f", action="store_true")
    p.add_argument("--lines", "-n", type=int, default=100)
    p.set_defaults(_hostshell="logs")
    c = sub.add_parser("cache", help="save a host's autotune/JIT cache (restore: rebuild --cache)")
    csub = c.add_subparsers(dest="cache_command", required=True)
    save = csub.add_parser("save", help="archive the service's cache folder of HOST into FILE")
    save.add_argument("inventory")
    save.add_argument("host")
    save.add_argument("file")
    c.set_defaults(_hostshell="cache")


def run(args) -> int:
    try:
        return run_logs(args) if args._hostshell == "logs" else run_cache_save(args)
    except SglangDeployError as exc:
        print(exc.message, file=sys.stderr)
        return 2
