"""How a testbed host's container boots with respect to device control (``cgroup`` in its
record; ``python -m testbed cgroup HOST MODE``).

- ``legacy`` (the default): nspawn gives the container this machine's cgroup v1
  controllers read-only; the container's systemd cannot write a devices cgroup and cannot
  load BPF device programs, so it does not apply ``DevicePolicy=``/``DeviceAllow=`` and says
  nothing, exactly as in an unprivileged LXC container (systemd issue 23198; lxc issues 3199,
  4347). Every other property of the unit is applied.
- ``unified``: the container boots on the cgroup v2 hierarchy with CAP_BPF and the ``bpf``
  system call allowed, so its systemd applies ``DevicePolicy=closed`` with BPF device programs:
  a node outside ``DeviceAllow`` is refused (EPERM), as on a privileged container or a
  machine.

Production code never knows which: the release smoke reads what the sandbox really does.
"""

from __future__ import annotations

import os

MODES = ("legacy", "unified")


def mode(h: dict) -> str:
    return h.get("cgroup") or "legacy"


def nspawn_env(h: dict) -> dict:
    """nspawn's environment for host H."""
    env = {k: v for k, v in os.environ.items() if k != "SYSTEMD_NSPAWN_UNIFIED_HIERARCHY"}
    if mode(h) == "unified":
        env["SYSTEMD_NSPAWN_UNIFIED_HIERARCHY"] = "1"
    return env


def nspawn_options(h: dict) -> list[str]:
    """nspawn's extra options for host H: a "unified" host may load BPF programs (nspawn drops
    CAP_BPF and filters bpf() otherwise)."""
    if mode(h) != "unified":
        return []
    return ["--capability=CAP_BPF,CAP_PERFMON", "--system-call-filter=bpf"]
