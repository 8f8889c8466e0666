"""How a unit is started or restarted on a host (pure: the shell command's text).

``systemctl start|restart`` waits for systemd's start job. When it fails, the command does
not end with systemctl's generic "the control process exited with error code": it reads the
unit's ``Result`` and ``ExecMainStatus`` and says what the status means, the fix, and the
unit journal's last lines.

One failure is retried: status 219/CGROUP, systemd could not move the new process into the
unit's cgroup. The process never ran (no model was loaded, no GPU touched). In containers this
happens right after a stop, while the old cgroup is being removed (systemd issues 20939 and
23164; seen on the testbed's cgroup v1 containers about once in 30 restarts). The unit's
failed state and start counter are reset first (``reset-failed``), so the retries do not use
up ``StartLimitBurst``.
"""

from __future__ import annotations

import shlex

#: the status systemd's child exits with when it cannot join the unit's cgroup
CGROUP = 219
#: starts in all (the first and the retries of a 219/CGROUP)
ATTEMPTS = 3
#: seconds between attempts: the old cgroup's removal is asynchronous
RETRY_PAUSE_S = 1
#: the unit journal's lines shown with a failure
JOURNAL_LINES = 15

#: systemd's exit statuses of a service process that failed before it ran ExecStart
#: (systemd.exec(5), "Process exit codes"): name, what it means for this unit, the fix
PRE_EXEC_STATUSES: dict[int, tuple[str, str, str]] = {
    200: ("CHDIR", "WorkingDirectory= does not exist",
          "re-run the deploy (it creates the service user's home)"),
    203: ("EXEC",
          ("the ExecStart program could not be run (a release's python missing or not "
           "executable)"),
          "re-run the deploy: the release is checked and reinstalled"),
    216: ("GROUP", "the unit's Group= does not exist", "re-run the deploy (it creates the group)"),
    217: ("USER", "the unit's User= does not exist", "re-run the deploy (it creates the user)"),
    218: ("CAPABILITIES", "the container refused the unit's capability settings",
          ("let the container's systemd drop capabilities (LXC: do not drop sys_admin for "
           "systemd), or remove the setting from the unit")),
    CGROUP: ("CGROUP",
             "systemd could not put the new process into the unit's cgroup; it never ran",
             ("re-run the deploy; if it persists, the container's cgroup file system is not "
              "writable by its systemd")),
    226: ("NAMESPACE",
          ("the sandbox's mount namespace could not be set up (a ReadWritePaths= folder "
           "missing, or the container forbids mount namespaces)"),
          ("read the journal lines below for the path; on LXC allow nesting (features: "
           "nesting=1) so that systemd can sandbox services")),
    227: ("NO_NEW_PRIVILEGES", "the container refused NoNewPrivileges=",
          "allow the container's systemd to set no_new_privs"),
    228: ("SECCOMP", "the container refused the unit's SystemCallFilter=",
          ("allow seccomp filters in the container (LXC: no seccomp profile that blocks "
           "seccomp(2))")),
    232: ("ADDRESS_FAMILIES", "the container refused RestrictAddressFamilies=",
          "allow seccomp filters in the container"),
}


def start_command(verb: str, unit: str, *, attempts: int = ATTEMPTS) -> str:
    """The shell command that runs ``systemctl VERB UNIT`` (``start`` or ``restart``): a
    219/CGROUP failure is tried again (up to ATTEMPTS starts, the unit's failed state reset
    before each retry); any failure left ends the command non-zero after saying what the
    status means, the fix and the unit journal's last lines."""
    if verb not in ("start", "restart"):
        raise ValueError(f"verb must be start or restart, not {verb!r}")
    u = shlex.quote(unit)
    status = f"$(systemctl show -p ExecMainStatus --value {u})"
    again = (f"{unit}: status {CGROUP}/CGROUP: systemd could not put the new process into the "
             "unit cgroup (a race in containers right after a stop; the process never ran): "
             "starting it again")
    retry = (f"[ \"$st\" = {CGROUP} ] && [ $n -lt {attempts} ] || break; "
             f"echo {shlex.quote(again)} >&2; "
             f"systemctl reset-failed {u} || true; sleep {RETRY_PAUSE_S}; ")
    loop = (f"ok=0; n=0; while [ $n -lt {attempts} ]; do n=$((n+1)); "
            f"if systemctl {verb} {u}; then ok=1; break; fi; st={status}; {retry}done")
    return f"{loop}; [ $ok = 1 ] || {{ {_diagnosis(unit)}; false; }}"


def _diagnosis(unit: str) -> str:
    """Shell that prints why UNIT did not start (its Result and exit status ``$st``, their
    meaning and fix, its journal's last lines) to stderr."""
    u = shlex.quote(unit)
    cases = " ".join(
        f"{code}) echo {shlex.quote(f'status {code}/{name}: {meaning}. Fix: {fix}.')} >&2;;"
        for code, (name, meaning, fix) in sorted(PRE_EXEC_STATUSES.items()))
    generic = shlex.quote("the process ran and exited (or was killed) before the start "
                          "completed: read the journal lines below. Fix: correct what they "
                          "name and re-run the deploy.")
    return (
        f"echo \"{unit} did not start: systemd result $(systemctl show -p Result --value {u}), "
        f"exit status $st\" >&2; "
        f"case \"$st\" in {cases} "
        f"*) echo {generic} >&2;; esac; "
        f"echo {shlex.quote(f'the last {JOURNAL_LINES} lines of its journal:')} >&2; "
        # the unit's own lines and systemd's about it, the forked child's included (its
        # "Failed at step USER spawning ...: No such process" names the cause; `-u` omits it)
        f"journalctl -n {JOURNAL_LINES} --no-pager -o cat UNIT={u} + _SYSTEMD_UNIT={u} >&2 "
        f"|| true"
    )
