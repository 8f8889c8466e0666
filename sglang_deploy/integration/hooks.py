"""pyinfra hooks of deploy.py (installed by config.py): data validation before any connection,
the host-side deploy lock held for the whole connection, a clear message for a lost connection,
and each host's outcome record (``integration/outcomes.py``) for the commands that ran pyinfra.

``install`` is ``INTEGRATION.install``: the one object that does everything done to pyinfra
(``integration/integration.py``: the speed-ups, the wrapped ``State.init``, gevent's hub, the log
records), given this module's parts: the run object of a run that starts (``begin``: the
spec, the journal and its outcome recorder, the groups' runs, the hosts' reads; the check
gives it the run's Fleet; add a new per-run part to ``integration.ThisRun`` and make it in
``new_run``), the run's callback handlers (``handlers``), the ``--limit`` of a group
(``_group_limit``) and the checks before any connection (``check_run``).

pyinfra's CLI loads ``config.py`` before it builds the inventory, and ``State.init`` runs
after that: as soon as the inventory exists, the data of EVERY host is checked and a
``DataError`` stops the run there, before ``connect_all`` starts any connection (the CLI
prints it as a pyinfra error, no traceback). The same place refuses what pyinfra itself lets
pass with exit status 0 having done nothing: an inventory with no host (pyinfra only warns
for a missing file) and a ``--limit`` pattern that matches no host (``check_selection``).

pyinfra reads ``config.py`` from the current folder only: run from another folder, none of
this is installed. deploy.py, rollback.py and preflight.py therefore call
``require_checked`` first, which stops such a run before any operation (``UsageError``).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from pathlib import Path

from pyinfra import logger
from pyinfra.api.state import BaseStateCallback

from sglang_deploy.controller import lockedflags, routing, yamldata
from sglang_deploy.controller.inventory import match, no_host, no_inventory_file, with_group_limits
from sglang_deploy.controller.lockfiles import read as read_lock
from sglang_deploy.core import data as datamod
from sglang_deploy.core import errors, jit
from sglang_deploy.core.errors import UsageError
from sglang_deploy.core.runspec import RunSpec
from sglang_deploy.hostops.facts import HostReads
from sglang_deploy.integration import deploylock, journal, outcomes
from sglang_deploy.integration.integration import (
    PyinfraIntegration,
    ReleaseRun,
    RunStart,
    ThisRun,
    cli_params,
    is_checked,
    run_of,
)
from sglang_deploy.integration.pyinfraerror import for_pyinfra
from sglang_deploy.stages.group import groupops


def _pyinfra_warning(text: str) -> None:
    logger.warning(f"sglang-deploy: {text}")


def once(warn: Callable[[str], None]) -> Callable[[str], None]:
    """WARN, each text told once (one call of ``validate_inventory``: once a run)."""
    told: set[str] = set()

    def warn_once(text: str) -> None:
        if text not in told:
            told.add(text)
            warn(text)

    return warn_once


def locate(exc: errors.DataError, sources: dict) -> None:
    """EXC's ``where``: the YAML file and line that set its key (a launch flag's own line,
    and ``sglang_flags.FLAG`` as its key), from the host's SOURCES (``controller/yamldata.py``;
    none: pyinfra's own data, the error left as it is)."""
    if not sources or exc.where is not None:
        return
    from sglang_deploy.core.ansibledata import where

    flag = exc.details.get("key") if exc.details.get("data_key") == exc.key else None
    exc.where = where(sources, exc.key, flag)
    if flag is not None and exc.key and "." not in exc.key:
        exc.key = f"{exc.key}.{flag}"


def validate_inventory(inventory, cwd: str | None = None, warn=_pyinfra_warning,
                       fleet: routing.Fleet | None = None,
                       recorder: outcomes.Recorder | None = None,
                       ) -> dict[str, datamod.Settings]:
    """Resolve every host's data (a routed fleet's workers as ``routing.settings`` gives
    them), check that its lock file exists on the controller and, for a server, that the lock
    pins the JIT's compiler (``jit.check_lock``) and that its launch flags are flags of the
    sglang version that lock pins (``lockedflags``; WARN says when that cannot be checked
    here); raise the first ``DataError``, naming the host (recorded as its failed outcome by
    RECORDER, the run's: None outside a run, as ``sglang-deploy data`` checks). Returns each
    host's Settings (host name -> Settings): the run resolves them once, here (in FLEET: the
    run's)."""
    resolved: dict[str, datamod.Settings] = {}
    fleet = fleet if fleet is not None else routing.fleet_of(inventory)
    warn = once(warn)  # a warning shared by hosts (a missing wheel) is told once
    for each in inventory:
        try:
            settings = fleet.settings(each.name)
            key = "router_lock" if routing.is_router(each) else "sglang_lock"
            lock = Path(cwd or ".") / getattr(settings, key)
            if not lock.is_file():
                raise errors.DataError(
                    key=key, what=f"the lock file named by `{key}` exists",
                    found=f"no file {lock}",
                    fix=f"fix `{key}` (see locks/*.txt) or make the lock with "
                        "`sglang-deploy lock locks/NAME.in`")
            if not routing.is_router(each):  # a server's lock and flags, not the router's
                jit.check_lock(read_lock(lock).text, settings.sglang_lock,
                               settings.sglang_env)
                lockedflags.check(settings, cwd or ".", warn)
        except errors.DataError as exc:
            data_failed(each, exc, recorder)
            raise
        resolved[each.name] = settings
    return resolved


def check_group_selection(inventory, resolved: dict[str, datamod.Settings],
                          initial_limit, fleet: routing.Fleet | None = None,
                          allow_partial: bool = False) -> None:
    """A ``--limit`` that names part of a multi-node group is refused before any connection
    (its nodes start and stop as one), unless the run's spec says so on purpose
    (ALLOW_PARTIAL: ``RunSpec.partial_group``)."""
    if initial_limit is None or not any(s.sglang_group for s in resolved.values()):
        return
    from sglang_deploy.core import group

    groups = (fleet if fleet is not None else routing.fleet_of(inventory)).groups
    group.check_limit(groups, [h.name for h in initial_limit],
                      allow_partial=allow_partial)


def check_group_modes(inventory, resolved: dict[str, datamod.Settings], initial_limit,
                      params: dict) -> None:
    """Refuse, before any connection, a pyinfra mode that splits a multi-node group of the
    selection: ``--serial`` and ``--no-wait`` run one host's operations without waiting for
    the others (its nodes rendezvous, stop, all-reduce, start and are verified one operation
    at a time, on every node). Any pool size works (PARALLEL, ``--parallel N``): no
    operation of a group waits for another host's."""
    selected = [h.name for h in (initial_limit if initial_limit is not None else inventory)]
    nodes = [n for n in selected if resolved.get(n) and resolved[n].sglang_group]
    if not nodes:
        return
    group = resolved[nodes[0]].sglang_group
    for flag, key in (("--serial", "serial"), ("--no-wait", "no_wait")):
        if params.get(key):
            raise UsageError(
                what=f"no {flag} for a selection with a multi-node group (group {group}: "
                     f"{', '.join(n for n in nodes if resolved[n].sglang_group == group)})",
                found=f"{flag}: pyinfra runs each host's operations without waiting for the "
                      "others, and a group's nodes rendezvous, stop, start and are verified "
                      "one operation at a time on every node; nothing was run",
                fix=f"drop {flag} (any `--parallel N` works), or `--exclude` the group's nodes "
                    "to run the other hosts that way")


def check_selection(inventory, initial_limit, params: dict, cwd: str | None = None) -> None:
    """Raise a ``UsageError`` where pyinfra would act on no host, or on fewer than asked, and
    exit 0: INVENTORY has no host (pyinfra makes an empty inventory of a missing file), a
    ``--limit`` pattern of PARAMS matches no host (``hosts.match``: the hosts and groups
    there are), or the ``--limit`` / ``--exclude`` selection (INITIAL_LIMIT) is empty."""
    name = str(params.get("inventory") or "the inventory")
    if not list(inventory):
        path = Path(name) if os.path.isabs(name) else Path(cwd or ".", name)
        if not path.is_file():
            raise no_inventory_file(name, path)
        raise no_host(name)
    limit = [str(p) for p in params.get("limit") or ()]
    if limit:
        match(inventory, limit)
    if initial_limit is not None and not list(initial_limit):
        raise UsageError(
            what="--limit / --exclude options that leave at least one host to act on",
            found=f"--exclude {' '.join(map(str, params.get('exclude') or ())) or '...'} "
                  "leaves no host",
            fix=f"choose among the hosts: {', '.join(h.name for h in inventory)}")


def require_checked(deploy_file: str) -> None:
    """Stop a deploy file (before any operation) that runs without this project's
    ``config.py``: pyinfra loads ``config.py`` from the current folder only, so from another
    folder no host's data is checked (a launch flag typo goes to the host) and nothing of
    ``install`` is in place (the deploy lock, FAIL_PERCENT=0): the run's State holds no
    checked run object (``integration.is_checked``)."""
    from pyinfra import state  # the run's State (pyinfra's context); none outside a run

    if is_checked(state):
        return
    project = Path(deploy_file).resolve().parent
    raise for_pyinfra(UsageError(
        what=f"pyinfra run from the project folder {project}, so that its config.py checks "
             "every host's data (keys, types, secrets, launch flags) before the deploy",
        found=f"config.py was not loaded (pyinfra reads ./config.py of the current folder, "
              f"{os.getcwd()}): nothing was checked and nothing was run",
        fix=f"run the same command from {project} (`cd {project}`), or add "
            f"`--chdir {project}` to the pyinfra command line"))


def connection_lost(host) -> bool:
    """True when HOST's SSH connection is known to be closed (paramiko transport gone)."""
    client = getattr(host.connector, "client", None)
    if client is None or not hasattr(client, "get_transport"):
        return False
    transport = client.get_transport()
    return transport is None or not transport.is_active()


def lost_connection_message(host_name: str, address: str, operation: str) -> str:
    return (f"sglang-deploy: the SSH connection to {host_name} was lost during `{operation}`\n"
            f"  found:    the connection closed under the running command (sshd killed, network "
            f"down or host rebooted); nothing after it ran on {host_name}, and the service keeps "
            f"the release it had (a half-made release has no .complete marker and is never used)\n"
            f"  fix:      check that `ssh root@{address} true` works, then re-run the deploy: it "
            f"continues from where it stopped")


def host_key_message(host_name: str, address: str, known_hosts: str | None) -> str:
    where = known_hosts or "~/.ssh/known_hosts"
    return (f"sglang-deploy: {host_name}'s SSH host key is not the one recorded for {address} "
            f"in {where}\n"
            f"  found:    the host presented a different key: nothing was run on {host_name}\n"
            f"  fix:      if {host_name} was really reinstalled, check its new key out of band "
            f"(console: `ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub`), then replace the "
            f"entry: `ssh-keygen -R {address} -f {where}` and add the new key: "
            f"`ssh-keyscan -t ed25519 {address} >> {where}`; otherwise stop and find out who "
            f"answers at {address}")


def missing_known_hosts_message(host_name: str, address: str, known_hosts: str | None) -> str:
    """pyinfra's `Could not connect ([Errno 2] No such file or directory: '~/.ssh/known_hosts')`
    for a host whose data names no known-hosts file (or one that does not exist)."""
    where = known_hosts or "~/.ssh/known_hosts"
    unset = "" if known_hosts else " (its data sets no `ssh_known_hosts_file`)"
    return (f"sglang-deploy: {host_name}'s SSH host key cannot be checked: the known-hosts file "
            f"{where} does not exist{unset}\n"
            f"  found:    nothing was run on {host_name}\n"
            f"  fix:      give {host_name} the inventory's known-hosts settings "
            f"(`ssh_known_hosts_file`, `ssh_strict_host_key_checking: yes`, as the serving "
            f"hosts' group has them: a `routers` group needs its own), and record its key "
            f"there once, checked out of band: `ssh-keyscan -t ed25519 {address} >> FILE` "
            f"(docs/quickstart.md, step 3)")


class ExplainConnectErrors(BaseStateCallback):
    """A changed host key: name the host, the inventory's known-hosts file and the fix
    (pyinfra suggests `ssh-keygen -R` on the default file, not the inventory's). A missing
    known-hosts file: say so (pyinfra prints only the errno)."""

    def host_connect_error(self, state, host, error):  # type: ignore[override]
        text = str(error)
        address = host.data.get("ssh_hostname") or host.name
        known_hosts = host.data.get("ssh_known_hosts_file")
        if "known_hosts" in text and "No such file or directory" in text or (
                known_hosts and known_hosts in text and "No such file" in text):
            logger.error(host.print_prefix + missing_known_hosts_message(
                host.name, address, known_hosts))
            return
        if "host key" not in text.lower():
            return
        logger.error(host.print_prefix + host_key_message(host.name, address, known_hosts))


class ExplainLostConnection(BaseStateCallback):
    """When an operation fails because the SSH connection dropped, say so (pyinfra only says
    `Error: executed N commands` and `No hosts remaining!`)."""

    def operation_host_error(self, state, host, op_hash, retry_attempt=0, max_retries=0):  # type: ignore[override]
        if not connection_lost(host):
            return
        # the names of one operation hash span hosts (e.g. each host's own release id)
        names = sorted(state.get_op_meta(op_hash).names) or [op_hash]
        if len(names) > 1:
            common = os.path.commonprefix(names)
            names = [common.rsplit(" ", 1)[0] + " …" if " " in common else " / ".join(names)]
        address = host.data.get("ssh_hostname") or host.name
        message = lost_connection_message(host.name, address, names[0])
        logger.error(host.print_prefix + message)
        outcomes.note_error(host.name, {"type": "ConnectionLost", "message": message})


def no_delay(client) -> bool:
    """Send each SSH packet of CLIENT's connection at once (TCP_NODELAY). With Nagle's
    algorithm on, a command's request waits for the host's delayed ACK of the one before it,
    on every command's round trip. False when there is no TCP socket to set."""
    transport = client.get_transport() if hasattr(client, "get_transport") else None
    sock = getattr(transport, "sock", None)
    if sock is None or getattr(sock, "family", None) not in (socket.AF_INET, socket.AF_INET6):
        return False
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return True


class NoDelay(BaseStateCallback):
    """Right after connecting (before the deploy lock's command), turn off Nagle's algorithm
    on the host's SSH connection (``no_delay``)."""

    def host_connect(self, state, host):  # type: ignore[override]
        client = getattr(host.connector, "client", None)
        if client is not None:
            no_delay(client)


class HoldDeployLock(BaseStateCallback):
    """Right after connecting, take the host's deploy lock (``deploylock``) in a channel of
    the connection that stays open until the connection ends. A live holder stops the run
    (naming it); a stale one is taken over with a warning."""

    timeout_s = 15.0

    def __init__(self) -> None:
        self.held: dict[str, tuple] = {}

    def host_connect(self, state, host):  # type: ignore[override]
        try:
            self.hold(host)
        except errors.SglangDeployError as exc:
            outcomes.failed(host.name, exc, "connect")
            raise for_pyinfra(exc) from exc

    def hold(self, host) -> None:
        client = getattr(host.connector, "client", None)
        if client is None or not hasattr(client, "exec_command"):
            return  # not SSH (e.g. @local): nothing to hold
        mine = deploylock.me()
        for attempt in (1, 2):
            stdin, stdout, _ = client.exec_command(deploylock.holder_command(mine),
                                                   timeout=self.timeout_s)
            first = stdout.readline().strip()
            if first == "LOCKED":
                stdout.channel.settimeout(None)
                self.held[host.name] = (stdin, stdout)
                return
            if first != "BUSY":
                raise deploylock.DeployLockError(
                    what=f"the deploy lock {deploylock.LOCK_FILE} can be taken on {host.name}",
                    found=f"the lock command answered {first!r}",
                    fix="check that `flock` (util-linux) exists on the host and /run is writable")
            owner = deploylock.parse_busy(stdout.read().decode(errors="replace").splitlines())
            verdict = deploylock.decide(owner, mine)
            holder = (owner or {}).get("holder_pid")
            if verdict.kind != "stale" or attempt == 2 or not isinstance(holder, int):
                raise deploylock.live_error(host.name, owner)
            _, out, _ = client.exec_command(
                f"kill {holder}; for i in $(seq 100); do flock -n {deploylock.LOCK_FILE} true "
                f"&& exit 0; sleep 0.1; done; exit 1", timeout=self.timeout_s)
            out.channel.recv_exit_status()
            logger.warning(f"{host.print_prefix}{verdict.message}")


def _select(inventory, initial_limit):
    """The YAML data layered onto the inventory's hosts (``yamldata.apply``: a YAML
    inventory's, group_vars/ and host_vars/ beside the inventory), then ``_group_limit``."""
    from sglang_deploy.integration.inputerror import InputError

    name = cli_params().get("inventory")
    if name and Path(str(name)).is_file():
        try:
            yamldata.apply(inventory, str(name))
        except errors.DataError as exc:
            raise InputError(exc) from exc
    return _group_limit(inventory, initial_limit)


def _group_limit(inventory, initial_limit):
    """``--limit GROUP`` of a multi-node group's name (``sglang_group``) selects its nodes,
    as ``sglang-deploy --limit`` does (``inventory.with_group_limits``)."""
    params = cli_params()
    limit = [str(p) for p in params.get("limit") or ()]
    if not limit:
        return initial_limit
    exclude = [str(p) for p in params.get("exclude") or ()]
    return with_group_limits(inventory, initial_limit, limit, exclude)


#: the deploy file run against LXC hosts (the machines that run the containers)
LXC_HOST_DEPLOY = "lxc_host.py"


def lxc_host_run(params: dict | None = None) -> bool:
    """Whether this pyinfra run is ``lxc_host.py`` (its hosts are LXC hosts: their data is
    ``lxc_containers``, not a server's)."""
    ops = (params if params is not None else cli_params()).get("operations") or ()
    return any(Path(str(op)).name == LXC_HOST_DEPLOY for op in ops)


def data_failed(each, exc: errors.DataError, recorder: outcomes.Recorder | None) -> None:
    """EXC, a bad value of host EACH's data: its YAML file and line where known, the host's
    name in front, recorded as the host's failed outcome by RECORDER (the run's; None: a
    check outside a run, nothing to record); the caller raises it."""
    locate(exc, each.data.dict().get(yamldata.SOURCES_KEY) or {})
    if not exc.what.startswith(f"[{each.name}] "):
        exc.what = f"[{each.name}] {exc.what}"
    if recorder is not None:
        recorder.failed(each.name, exc, "data")


def check_lxc_hosts(inventory, recorder: outcomes.Recorder | None = None) -> None:
    """Every LXC host's data (``lxc_containers``, ``lxc_path``, ``lxc_record_dir``) before
    any connection; the first ``DataError`` names the host (RECORDER: ``data_failed``)."""
    from sglang_deploy.core.lxchost import hostplan

    for each in inventory:
        try:
            hostplan.check_data(each.data.dict())
        except errors.DataError as exc:
            data_failed(each, exc, recorder)
            raise


def check_run(run: RunStart) -> routing.Fleet:
    """The selection and every host's data, before any connection (a host's bad data is its
    failed outcome, recorded by the run object's recorder); returns the run's one ``Fleet``,
    holding each host's Settings, resolved once here: what the stages read (the run
    object's ``fleet``). A run of ``lxc_host.py`` checks its LXC hosts' data instead
    (``check_lxc_hosts``; a Fleet with no Settings resolved)."""
    inventory, initial_limit = run.inventory, run.initial_limit
    recorder = run_of(run.state).recorder
    check_selection(inventory, initial_limit, cli_params(), run.cwd)
    if lxc_host_run():
        check_lxc_hosts(inventory, recorder)
        return routing.fleet_of(inventory, {})
    fleet = routing.fleet_of(inventory)  # the run's one Fleet
    resolved = validate_inventory(inventory, run.cwd, fleet=fleet, recorder=recorder)
    check_group_selection(inventory, resolved, initial_limit, fleet,
                          allow_partial=run.spec.partial_group)
    check_group_modes(inventory, resolved, initial_limit, cli_params())
    return fleet


# ------------------------------------------------------------------ the run object
def _plan_mode(run: RunStart) -> None:
    """A plan run (``status``, ``doctor``, ``rollout --dry``) reports every host: no host's
    failure stops it (config.py's FAIL_PERCENT=0 is for runs that act), unless pyinfra's own
    ``--fail-percent`` says otherwise."""
    if run.spec.planning and cli_params().get("fail_percent") is None:
        run.state.config.FAIL_PERCENT = None


def new_run(spec: RunSpec, dry: bool = False, cwd: str | None = None, state=None) -> ThisRun:
    """A run object (``integration.ThisRun``) with its parts made, as a run's start makes it
    (``begin``): the run journal (``journal.journal_path``: SPEC's, else the default under
    CWD) and the recorder of each host's outcome in it (on STATE), the groups' runs, the
    hosts' reads. Its Fleet comes with the check (``check_run``, ``ThisRun.checked``)."""
    writer = journal.Writer(journal.journal_path(spec, cwd))
    return ThisRun(spec=spec, dry=dry, journal=writer,
                   recorder=outcomes.Recorder(writer, dry=dry, state=state),
                   groups=groupops.GroupRuns(), reads=HostReads())


def begin(run: RunStart) -> ThisRun:
    """The run object of a run that starts (``new_run``, with the run's spec, ``--dry``,
    folder and State); a plan run also reports every host (``_plan_mode``)."""
    _plan_mode(run)
    return new_run(run.spec, dry=run.dry, cwd=run.cwd, state=run.state)


def handlers(release: ReleaseRun, run: RunStart) -> list[BaseStateCallback]:
    """The run's callback handlers (RELEASE: the run object's release), in order:
    TCP_NODELAY and then the deploy lock after each connection, clear messages for a changed
    host key and a lost connection."""
    out = [ExplainConnectErrors(), ExplainLostConnection(), NoDelay(), release]
    if not run.spec.planning:  # a read-only plan (status, rollout --dry) takes no lock
        out.append(HoldDeployLock())
    return out


#: everything done to pyinfra (``integration/integration.py``), with this module's parts
INTEGRATION = PyinfraIntegration(handlers=handlers, begin=begin, select=_select,
                                 check=check_run)


def install(state) -> None:
    """Install every hook on ``state`` (config.py, before ``State.init``): ``INTEGRATION``
    (the module docstring); an empty inventory or a --limit matching no host stops the run
    (``check_selection``), and deploy files may then run (``require_checked``)."""
    INTEGRATION.install(state)
