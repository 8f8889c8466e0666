"""pyinfra operations of sglang-deploy (files, folders, secrets, the service, the pre-flight
gate, the rollback's restore; a release's own are in ``releaseops``): each reads what it needs
first and yields nothing when the host already matches (``host.noop``). Decisions come from the
pure modules.

Each operation fetches what it compares itself, as pyinfra's ``systemd.service`` reads
``SystemdStatus``: through the run's store of reads (``facts.service_state``,
``facts.path_state``, ``facts.secrets_sha256``), which answers from this run's host-state
read when it reported the unit or the path (no round trip), else reads the operation's own
fact once (``ServiceStatus``, ``PathStatus``): a path the read left out is compared, not
uploaded blindly."""

from __future__ import annotations

import functools
import hashlib
import json
import posixpath
import shlex
from io import StringIO
from pathlib import Path

from pyinfra import host, logger
from pyinfra.api import operation
from pyinfra.api.command import FileUploadCommand, QuoteString, StringCommand
from pyinfra.api.exceptions import NestedOperationError
from pyinfra.operations import files

from sglang_deploy.core import unitstart
from sglang_deploy.core.errors import PreflightError, SglangDeployError
from sglang_deploy.core.hoststate import PathState
from sglang_deploy.hostops import facts
from sglang_deploy.integration import outcomes


def reported(function):
    """Wrap a function run on the host's turn (``python.call``, ``FunctionCommand``): a
    tool error is logged as its own message (expected / found / fix), not as a Python
    traceback, and fails the operation. Either error, typed or not, is the host's error in its
    outcome record (``outcomes.note_error``)."""

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except SglangDeployError as exc:
            outcomes.note_error(host.name, exc)
            logger.error("\n".join(f"{host.print_prefix}{line}" if i == 0 else f"    {line}"
                                   for i, line in enumerate(exc.message.splitlines())))
            raise NestedOperationError(exc.headline()) from exc
        except NestedOperationError:
            raise
        except Exception as exc:
            outcomes.note_error(host.name, exc)
            raise

    return wrapper


def _sh(*words: str) -> str:
    return " ".join(shlex.quote(w) for w in words)


def _found_suffix(check, limit: int = 200) -> str:
    """` (what was found)` when the message does not already say it, shortened."""
    found = str(getattr(check, "found", None) or "")
    if not found or found in check.message:
        return ""
    return f" ({found if len(found) <= limit else found[:limit - 1] + '…'})"


def preflight_gate(checks: list, title: str = "pre-flight",
                   before: str = "before anything is installed") -> None:
    """
    Report pre-flight checks and stop the deploy (while operations are still being prepared,
    so before anything runs on any host) if any failed.

    + checks: list of ``preflight.Check`` from the pure evaluation
    + title: heading of the report
    + before: when it must pass, for the error (the P2P retest's: before the server starts
      again)

    **Example:**

    .. code:: python

        preflight_gate(checks, title="GPU pre-flight")
    """
    failed = [c for c in checks if c.status == "fail"]
    for c in checks:
        if c.status in ("warn", "fail"):
            logger.warning(f"{host.print_prefix}{title}: {c.status.upper()} {c.name}: {c.message}")
    if failed:
        raise PreflightError(
            what=f"{title} passes on {host.name} {before}",
            found="\n".join(f"{c.name}: {c.message}" + _found_suffix(c) for c in failed),
            fix="\n".join(f"{c.name}: {c.fix}" for c in failed if getattr(c, "fix", None))
            or "see the checks above",
        )
    warns = sum(c.status == "warn" for c in checks)
    logger.info(f"{host.print_prefix}{title}: {len(checks)} checks passed"
                + (f" ({warns} warnings)" if warns else ""))


def private_upload(content: str, path: str):
    """The commands that write CONTENT to PATH, a file made 0600 before any byte is written
    (the content goes over SFTP: never in argv or pyinfra's output)."""
    yield f"umask 077 && : > {shlex.quote(path)} && chmod 600 {shlex.quote(path)}"
    yield FileUploadCommand(StringIO(content), path, remote_temp_filename=None)


@operation()
def secret_file(path: str, content: str):
    """
    Write the service's secrets (root:root 0600) without ever printing or diffing them;
    compared by sha256 with the host's file (``facts.secrets_sha256``: the run's host-state
    read made with ``secrets=PATH``, else the file's own ``PathStatus``).

    + path: the EnvironmentFile path (its folder is root-only, 0700)
    + content: the file body

    **Example:**

    .. code:: python

        secret_file(path="/etc/sglang/secrets.env", content=body)
    """
    digest = hashlib.sha256(content.encode()).hexdigest()
    if facts.secrets_sha256(host, path) == digest:
        host.noop(f"{path} is up to date")
        return
    tmp = f"{path}.tmp"
    yield from private_upload(content, tmp)
    yield f"chown root:root {shlex.quote(tmp)} && chmod 600 {shlex.quote(tmp)} && mv -f {shlex.quote(tmp)} {shlex.quote(path)}"


@operation()
def service_enabled(service: str):
    """
    Enable the unit at boot, unless its ``UnitFileState`` is ``enabled`` (``systemctl show``:
    ``facts.service_state``, the run's host-state read of that unit, else ``ServiceStatus``).

    + service: unit name without ``.service``

    **Example:**

    .. code:: python

        service_enabled(service="sglang")
    """
    if facts.service_state(host, service).enabled:
        host.noop(f"{service}.service is enabled")
        return
    yield _sh("systemctl", "enable", f"{service}.service")


@operation()
def service_started(service: str):
    """
    Start the service if it is not running (the verifier then waits for it), as its
    ``systemctl show`` was when the deploy began (``facts.service_state``: the run's
    host-state read of that unit, else ``ServiceStatus``). A unit waiting to be restarted
    after a crash (``activating/auto-restart``) counts as not running.

    + service: unit name without ``.service``

    **Example:**

    .. code:: python

        service_started(service="sglang")
    """
    svc = facts.service_state(host, service)
    if svc.started:
        host.noop(f"{service}.service is {svc.active_state}/{svc.sub_state}")
        return
    yield _sh("systemctl", "reset-failed", f"{service}.service") + " || true"
    yield unitstart.start_command("start", f"{service}.service")


@operation()
def service_restarted(service: str):
    """
    Restart the service (gate it with ``_if`` on the changes that affect the server).

    + service: unit name without ``.service``

    **Example:**

    .. code:: python

        service_restarted(service="sglang", _if=any_changed(unit, secrets, patch))
    """
    yield unitstart.start_command("restart", f"{service}.service")


@operation()
def service_stopped(service: str):
    """
    Stop the service (gate it with ``_if``): before the P2P retest of a server about to be
    replaced, whose copies need GPUs no server holds (``p2pretest``).

    + service: unit name without ``.service``

    **Example:**

    .. code:: python

        service_stopped(service="sglang", _if=restart_due)
    """
    yield f"systemctl stop {service}.service"


@operation()
def daemon_reload():
    """
    ``systemctl daemon-reload`` (gate it with ``_if=unit.did_change``).

    **Example:**

    .. code:: python

        daemon_reload(_if=unit.did_change)
    """
    yield "systemctl daemon-reload"


def enabled_and_started(service: str, unit, start: bool = True):
    """What every unit the deploy keeps gets: enabled at boot, systemd reloaded when its unit
    file (UNIT, the ``file_content`` operation) changes or systemd runs another than the one
    on disk, started when not running (unless START is false: a group's node starts with its
    group). Returns the start operation (None: not START)."""
    service_enabled(name=f"Enable {service}", service=service)
    # a unit file an earlier run wrote and never loaded
    if facts.service_state(host, service).need_daemon_reload:
        daemon_reload(name="systemd daemon-reload (the unit file on disk is not loaded)")
    elif unit.will_change:
        daemon_reload(name="systemd daemon-reload", _if=unit.did_change)
    if not start:
        return None
    return service_started(name=f"Start {service}", service=service)


@operation()
def known_good_restored(layout, release: str, restore: tuple[str, ...]):
    """
    Put the host back on its last known-good configuration (kept in ``ROOT/known-good/`` by
    the verifier): what RESTORE names of the unit file, the secrets file (``secrets``, or
    ``no-secrets`` when the known-good configuration had none) and the ``current`` link; then
    ``daemon-reload``. Yields nothing when RESTORE is empty.

    + layout: the host's ``service.Layout``
    + release: the known-good release id
    + restore: from ``service.rollback_plan``

    **Example:**

    .. code:: python

        plan = service.rollback_plan(host.name, hoststate, settings.sglang_root)
        known_good_restored(layout=Layout.of(settings), release=plan.params["release"],
                            restore=plan.restore)
    """
    if not restore:
        host.noop(f"the host runs its known-good configuration (release {release})")
        return
    kg, q = layout.known_good(), shlex.quote
    steps = {
        "unit": f"install -m 644 {q(kg + '/unit.service')} {q(layout.unit_file)}",
        "secrets": f"install -m 600 -o root -g root {q(kg + '/secrets.env')} {q(layout.secrets_file)}",
        "no-secrets": f"rm -f {q(layout.secrets_file)}",
        "current": f"ln -sfn {q(layout.release_dir(release))} {q(layout.current)}",
    }
    yield from (steps[name] for name in restore)
    yield "systemctl daemon-reload"


def _mode(mode) -> str:
    return f"{int(str(mode), 8):o}"


def path_state(path: str) -> PathState | None:
    """PATH on this host (None: absent): as this run's host-state read found it, else by its
    own ``PathStatus`` read (``facts.path_state``)."""
    return facts.path_state(host, path)


def _dir_matches(present: PathState | None, owner: str, mode: str) -> bool:
    return present is not None and present.is_dir(owner, mode)


@operation()
def directories(dirs: list):
    """
    Folders with owner, group and mode, checked against the run's host-state read (no round
    trip per folder when it reported them and they match); a folder that differs is handed
    to ``files.directory``.

    + dirs: list of ``(path, owner, mode)``; the group is the owner's name

    **Example:**

    .. code:: python

        directories(dirs=[("/opt/sglang", "root", "755")])
    """
    todo = [(path, owner, mode) for path, owner, mode in dirs
            if not _dir_matches(path_state(path), owner, _mode(mode))]
    if not todo:
        host.noop(f"{len(dirs)} folders exist with their owner and mode")
        return
    for path, owner, mode in todo:
        yield from files.directory._inner(path=path, user=owner, group=owner, mode=mode)


def _content_matches(src, dest: str, mode: str) -> bool:
    data = src.getvalue() if hasattr(src, "getvalue") else Path(src).read_bytes()
    data = data.encode() if isinstance(data, str) else data
    present = path_state(dest)
    return present is not None and present.is_file(hashlib.sha256(data).hexdigest(), _mode(mode))


def _upload(src, dest: str, mode: str):
    """Upload SRC to DEST (a temp file, then a rename) and set its mode. The caller found
    that the file differs, so pyinfra's ``File``/``Directory``/``Sha1File`` round trips
    (``files.put`` reads them while preparing and again while executing) are not needed."""
    yield StringCommand("mkdir", "-p", QuoteString(posixpath.dirname(dest)))
    yield FileUploadCommand(src, dest, remote_temp_filename=host.get_temp_filename(dest))
    yield StringCommand("chmod", mode, QuoteString(dest))


@operation()
def file_content(src, dest: str, mode: str):
    """
    A file with exact content and mode, checked against the run's host-state read (sha256):
    no round trip when it reported DEST and it matches; otherwise it is uploaded (temp file,
    rename, chmod).

    + src: local path or file-like object (``StringIO``) with the content
    + dest: path on the host
    + mode: octal mode, e.g. ``"644"``

    **Example:**

    .. code:: python

        file_content(src=StringIO(unit_text), dest="/etc/systemd/system/sglang.service",
                     mode="644")
    """
    if _content_matches(src, dest, mode):
        host.noop(f"{dest} is up to date")
        return
    yield from _upload(src, dest, mode)


@operation()
def files_content(sources: list, mode: str):
    """
    Several files with exact content and one mode (the shipped tools), as one operation:
    checked against the run's host-state read; only the files that differ are uploaded.

    + sources: list of ``(local path, path on the host)``
    + mode: octal mode of every file, e.g. ``"755"``

    **Example:**

    .. code:: python

        files_content(sources=[("sglang_deploy/core/patch.py", "/opt/sglang/tools/patch.py")],
                      mode="755")
    """
    todo = [(src, dest) for src, dest in sources if not _content_matches(src, dest, mode)]
    if not todo:
        host.noop(f"{len(sources)} files are up to date")
        return
    for src, dest in todo:
        yield from _upload(src, dest, mode)


@operation()
def symlink(path: str, target: str):
    """
    A symbolic link to TARGET, checked against the run's host-state read: no round trip when
    it reported PATH as that link; otherwise ``files.link`` makes it.

    + path: the link
    + target: what it points to

    **Example:**

    .. code:: python

        symlink(path="/opt/sglang/current", target="/opt/sglang/releases/0123abcd")
    """
    present = path_state(path)
    if present is not None and present.links_to(target):
        host.noop(f"{path} -> {target}")
        return
    yield from files.link._inner(path=path, target=target)


def write_json_record(path: str, record: dict) -> None:
    """On the host's turn (a ``python.call`` or ``FunctionCommand``): RECORD as JSON in PATH
    (0644, replaced atomically), like the deploy's other records under its root."""
    write_text(path, json.dumps(record, sort_keys=True) + "\n")


def write_text(path: str, text: str, mode: str = "644") -> None:
    """On the host's turn: TEXT, byte for byte, in PATH (MODE, replaced atomically); raises
    ``SglangDeployError`` with the host's error when it cannot."""
    q = shlex.quote
    tmp = q(path + ".tmp")
    ok, out = host.run_shell_command(f"set -e; printf '%s' {q(text)} > {tmp}; "
                                     f"chmod {mode} {tmp}; mv -f {tmp} {q(path)}",
                                     print_output=False)
    if not ok:
        raise SglangDeployError(what=f"{path} written on {host.name}",
                                found=(out.stderr if out is not None else "")[-500:] or "no output",
                                fix=f"check that {posixpath.dirname(path)} is writable by root "
                                    "on the host (disk full, read-only file system) and run "
                                    "the deploy again")


def server_files(lay, release_id: str, unit_text: str, secrets_text: str):
    """The server's secrets file, unit file and ``current`` link (LAY: ``core.service.Layout``):
    their operations, in that order."""
    secrets = secret_file(name=f"Secrets {lay.secrets_file} (0600, root)",
                          path=lay.secrets_file, content=secrets_text)
    unit = file_content(name=f"Unit {lay.unit_file}", src=StringIO(unit_text),
                        dest=lay.unit_file, mode="644")
    link = symlink(name=f"{lay.current} -> release {release_id}", path=lay.current,
                   target=lay.release_dir(release_id))
    return unit, secrets, link
