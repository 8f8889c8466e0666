"""The old revision's FlashInfer autotune cache carried to a new model revision's key
(``core.autotunekey``), before the restart that starts the new revision.

While the operations are prepared, ``add_carry`` decides from the run's facts alone
(``autotunekey.precheck``: the serving unit's ``--model-path`` and key flags against this
run's) whether to add the operation ``autotune_cache_carried``: in a rollout's staging run
(before its first drain) and before a plain deploy's restart; not in a staged rollout's rolling
run (its staging run carried it). A dry run lists the operation; only a run that changes
the host executes it (never a read-only command). When it executes, the operation asks the
host what is there (``remote/autotune_cache.py scan``, fed to the system python on stdin: the
cache folders, both config.json), decides (``autotunekey.decide``, self-verifying) and copies (``autotune_cache.py copy``). A
copy that cannot be made is a warning: the new revision then tunes at its first start, as it
did before.
"""

from __future__ import annotations

import json
import shlex

from pyinfra import host, logger
from pyinfra.api import FunctionCommand, operation

from sglang_deploy.core import autotunekey, restart, service
from sglang_deploy.core import flags as flagmod
from sglang_deploy.hostops.facts import REMOTE
from sglang_deploy.hostops.operations import reported
from sglang_deploy.stages import staging
from sglang_deploy.stages.group import groupops

TOOL = "autotune_cache.py"
#: the host-side script, fed to the host's python on stdin (nothing installed for it)
SOURCE = REMOTE / TOOL
EOF_MARK = "SGLANG_DEPLOY_AUTOTUNE_CACHE_EOF"


def tool_command(python: str, *args: str) -> str:
    """A shell command that runs ``autotune_cache.py ARGS`` with PYTHON, the script on its
    stdin (a here-document)."""
    text = SOURCE.read_text()
    assert EOF_MARK not in text
    words = " ".join(shlex.quote(a) for a in args)
    return f"{shlex.quote(python)} - {words} <<'{EOF_MARK}'\n{text}{EOF_MARK}"


def cache_dir(s) -> str:
    """The server's ``SGLANG_CACHE_DIR`` (the operator's ``sglang_env`` wins, as in the unit)."""
    return str((s.sglang_env or {}).get("SGLANG_CACHE_DIR") or s.sglang_cache_dir)


def flags_now(hp) -> tuple[str | None, dict | None, dict]:
    """(the serving unit's model path, its flags (None: no unit ran), this run's flags)."""
    words = restart.exec_argv(hp.hoststate.service.show.get("ExecStart"))
    old = restart.argv_flags(words) if words is not None else None
    new = restart.argv_flags(flagmod.render_flags(service.flag_map(hp.settings)))
    return (old or {}).get("model-path"), old, new


def add_carry(hp, restart_coming: bool, gate: dict | None = None) -> None:
    """Add ``autotune_cache_carried`` for HP's host when a restart is coming and its facts
    leave a carry possible (GATE: a group's node's ``_if``)."""
    s = hp.settings
    if not restart_coming or staging.trusts_record():
        return
    old_path, old, new = flags_now(hp)
    early = autotunekey.precheck(old_path, s.sglang_model_path, old, new)
    if early is not None:
        if old_path and old_path != s.sglang_model_path:
            host.noop(f"autotune cache: {early.reason}")
        return
    autotune_cache_carried(
        name=f"FlashInfer autotune cache of {old_path} carried to {s.sglang_model_path}",
        old_path=old_path, new_path=s.sglang_model_path, old_flags=old, new_flags=new,
        cache=cache_dir(s), python=s.sglang_system_python, **(gate or {}))


def before_restart(hp, active: bool, reasons: list[str], group_restarts: bool) -> None:
    """The service stage's carry: a single server's when it (re)starts (not ACTIVE, or
    REASONS), a group's node's when its group restarts (gated by the group's decision)."""
    if hp.group is None:
        add_carry(hp, restart_coming=not active or bool(reasons))
    elif group_restarts:
        add_carry(hp, restart_coming=True, gate={"_if": groupops.Decided()})


def _run_json(command: str) -> tuple[bool, dict | None, str]:
    ok, output = host.run_shell_command(command, print_output=False)
    lines = output.stdout.strip().splitlines()
    try:
        value = json.loads(lines[-1]) if lines else None
    except ValueError:
        value = None
    return ok, (value if isinstance(value, dict) else None), "\n".join(output.stderr_lines[-5:])


def _carry_on_host(old_path: str, new_path: str, old_flags: dict, new_flags: dict, cache: str,
                   python: str) -> None:
    prefix = host.print_prefix
    _, scan, err = _run_json(tool_command(python, "scan", "--cache", cache, "--old", old_path,
                                          "--new", new_path))
    if scan is None:
        logger.warning(f"{prefix}autotune cache not carried: `{TOOL} scan` printed no result "
                       f"({err or 'no output'}); the new revision tunes at its first start")
        return
    found = autotunekey.decide(old_path, new_path, old_flags, new_flags, scan.get("old_config"),
                               scan.get("new_config"), scan.get("folders") or {})
    if found.action != autotunekey.COPY:
        (logger.warning if found.action == autotunekey.SKIP else logger.info)(
            f"{prefix}autotune cache: {found.reason}")
        return
    for c in found.copies:
        ok, result, err = _run_json(tool_command(python, "copy", "--cache", cache, "--parent",
                                                 c.parent, "--from", c.source, "--to", c.dest))
        if not ok or not result or not result.get("ok"):
            error = (result or {}).get("error") or err or "no output"
            logger.warning(f"{prefix}autotune cache not carried ({c.parent}): {error}; the new "
                           "revision tunes at its first start")
            return
    logger.info(f"{prefix}autotune cache: {found.reason}")


@operation()
def autotune_cache_carried(old_path: str, new_path: str, old_flags: dict, new_flags: dict,
                           cache: str, python: str):
    """
    Copy the FlashInfer autotune cache SGLang keyed by OLD_PATH to the key it computes for
    NEW_PATH, when the two revisions' config.json and key flags are the same and the old key,
    rebuilt, names a folder on the host (``core.autotunekey.decide``).

    + old_path: the serving unit's ``--model-path``
    + new_path: this run's ``--model-path``
    + old_flags: the serving unit's launch flags (``--name`` -> value)
    + new_flags: this run's launch flags
    + cache: the server's ``SGLANG_CACHE_DIR``
    + python: the host's system python (``remote/autotune_cache.py``, stdlib only, is fed to it
      on stdin)
    """
    yield FunctionCommand(reported(_carry_on_host),
                          (old_path, new_path, old_flags, new_flags, cache, python), {})
