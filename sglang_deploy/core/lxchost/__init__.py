"""The LXC host's GPU passthrough, pure (issue 38): what ``lxc_host.py`` (the deploy run
against the machines that run the containers) reads, decides and writes, without touching
a host.

One module per concern; the shell fetches the facts, calls these functions and applies what
they return:

- ``facts``: ``/proc/devices`` (the NVIDIA driver's char-device majors), the host's
  ``/dev/nvidia*`` nodes (``NODES_COMMAND``'s listing; stale nodes), the kernel module's
  version (``/proc/driver/nvidia/version``), the cgroup layout, the GPUs' PCI addresses;
  ``host_facts`` puts them together and ``check_host`` says what is missing, typed.
- ``containers``: the data per container (``parse_containers``: name, dialect, CTID, GPUs,
  restart policy, base image, privilege) and the command that creates a missing one.
- ``pve``: the Proxmox VE version (``pveversion``) and whether its containers take
  ``devN:`` entries (pve-container 5.0.7, Proxmox VE 8.1).
- ``desired``: the passthrough lines a container should have, per dialect (plain LXC,
  Proxmox ``lxc.*:`` lines or ``devN:`` entries).
- ``confmerge``: those lines merged into the current config file (idempotent; the
  operator's lines kept byte for byte; the tool's own lines known by a ``Record``).
- ``incus``: LXD/Incus: the ``gpu`` device and ``nvidia.runtime`` from ``config show``'s
  YAML, as the exact argv lists to run.
- ``userspace``: the container's driver libraries against the host's module version, and
  the exact fix.
- ``restart``: whether and how a changed container restarts (``RestartDecision``).

Errors are ``LxcHostError`` (a host fact or config the tool cannot act on) and
``DataError`` (bad data), each with what was expected, what was found and the fix.
"""
