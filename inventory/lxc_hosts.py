"""Example inventory of LXC hosts (the machines that run the GPU containers), for
lxc_host.py (copy and edit):

    pyinfra inventory/lxc_hosts.py lxc_host.py --dry    # what would change
    pyinfra inventory/lxc_hosts.py lxc_host.py          # pass the GPUs in

Each host's `lxc_containers` lists its GPU containers; each item's keys
(sglang_deploy/core/lxchost/containers.py, docs/data-keys.md "LXC host data"):
name, dialect (lxc | proxmox | incus | lxd; left out: what the host has), ctid (Proxmox),
gpus (default all), restart (when-idle | now | never), base_image (create it when missing),
unprivileged (default true), adopt_passthrough_lines, config (for a container created from
base_image: plain LXC its config lines, Proxmox its `pct create` options as `KEY: VALUE`
lines). Host keys: `lxc_path` (plain LXC, default /var/lib/lxc), `lxc_record_dir` (default
/var/lib/sglang-deploy/lxc-host).
"""

from pathlib import Path

_KNOWN_HOSTS = str(Path(__file__).with_name("lxc_hosts_known_hosts"))

lxc_hosts = (
    [
        ("pve-1.example.internal", {"lxc_containers": [
            {"name": "gpu-node-1", "dialect": "proxmox", "ctid": 101,
             # disaster recovery: `pct create` from this template when CT 101 does not exist
             "base_image": "local:vztmpl/debian-12-standard_12.7-1_amd64.tar.zst",
             "config": ["net0: name=eth0,bridge=vmbr0,ip=dhcp", "rootfs: local-lvm:64",
                        "memory: 262144", "cores: 64"]},
        ]}),
        ("lxc-1.example.internal", {"lxc_containers": [
            {"name": "gpu-node-2", "dialect": "lxc",
             # disaster recovery: created from this rootfs tarball when it does not exist
             "base_image": "/srv/images/debian12-gpu-node.tar.zst",
             "config": ["lxc.net.0.type = veth", "lxc.net.0.link = br0",
                        "lxc.net.0.flags = up", "lxc.net.0.hwaddr = 02:00:0a:00:00:02"]},
        ]}),
    ],
    {
        "ssh_user": "root",
        "ssh_known_hosts_file": _KNOWN_HOSTS,
        "ssh_strict_host_key_checking": "yes",
    },
)
