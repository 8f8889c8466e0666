"""sglang-deploy on the LXC host: the GPU containers' passthrough, done by the tool (issue 38).

    pyinfra inventory/lxc_hosts.py lxc_host.py          # apply
    pyinfra inventory/lxc_hosts.py lxc_host.py --dry    # show what would change

Run against the machines that run the containers (Proxmox VE, LXD/Incus or plain LXC), not
against the containers (those are deploy.py's). For each container of the host's
`lxc_containers` data, idempotently:

1. nvidia_uvm loaded now and at every boot, its nodes made (`nvidia-modprobe -u -c=0`, a
   oneshot unit enabled by its symlink);
2. the container created from its `base_image` when it is missing, not started yet (plain
   LXC from a rootfs folder or tarball, Proxmox `pct create` from a template, LXD/Incus
   `init` from an image alias);
3. every NVIDIA node passed in: the majors read from /proc/devices, one device rule per
   major, one bind mount per node, merged into the config (the operator's lines kept byte
   for byte; the tool's replaced after a driver update); Proxmox `devN:` entries where its
   version has them; LXD/Incus a `gpu` device and `nvidia.runtime` through their CLI;
4. the container's driver user space checked against the host's module (the fix reported,
   never installed);
5. the restart: a stopped container is started, one that serves nothing is restarted, one
   that serves is left running with "restart needed" and the command unless its data says
   `restart: now`; then, when its data names the server it holds (`serves`), the router
   of that fleet drains it first, and the fleet's deploy verifies it before it is put back
   (lxchost/serving.py).

Every check (the data, the NVIDIA module, hand-written conflicting lines, a missing container
without a base image) is made before anything is changed. A second run changes nothing.
"""

from sglang_deploy.integration import hooks
from sglang_deploy.lxchost.operations import lxc_host_stage

hooks.require_checked(__file__)

lxc_host_stage()
