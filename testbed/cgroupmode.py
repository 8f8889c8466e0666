"""A testbed host's container kind, and what it means for device control (``privileged`` in
its record; ``python -m testbed up --privileged``, ``TESTBED_PRIVILEGED=1``, ``python -m
testbed kind HOST KIND``).

- ``unprivileged`` (the default, as Proxmox makes them): the container's root is uid 100000
  on this machine. Its systemd sees its own devices cgroup (LXC delegates it) but may not
  write device rules there (the v1 devices controller wants CAP_SYS_ADMIN on the machine),
  so it does not apply ``DevicePolicy=``/``DeviceAllow=`` and says nothing (systemd issue
  23198). Every other property of the unit is applied.
- ``privileged``: the container's root is this machine's root; its systemd writes the
  device rules of ``DevicePolicy=closed`` into its units' devices cgroups: a node outside
  ``DeviceAllow`` is refused (EPERM), as on a machine.

Production code never knows which: the release smoke reads what the sandbox really does.
"""

from __future__ import annotations

KINDS = ("unprivileged", "privileged")
