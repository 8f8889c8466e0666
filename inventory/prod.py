"""Example production inventory (copy and edit).

    export SGLANG_API_KEY=...            # only if sglang_api_key_env is set below
    pyinfra inventory/prod.py deploy.py

Hosts are LXC containers with the 8 GPUs passed through: docs/quickstart.md, step 2, says
how to set one up (Proxmox or LXD), and step 5 (`sglang-deploy doctor inventory/prod.py`)
checks it. Group data comes from group_data/all.py (the seed's profile) and
group_data/<group>.py; per-host values go in the tuple's dict. SSH host keys are checked
against the known-hosts file kept with this inventory (prod_known_hosts), made with
`ssh-keyscan -t ed25519 HOST >> inventory/prod_known_hosts` and checked out of band
(docs/quickstart.md, step 3): a changed key stops the deploy.
"""

from pathlib import Path

_KNOWN_HOSTS = str(Path(__file__).with_name("prod_known_hosts"))

gpu_hosts = (
    [
        ("gpu-node-1.example.internal", {"ssh_user": "root"}),
        ("gpu-node-2.example.internal", {"ssh_user": "root"}),
    ],
    {
        "ssh_known_hosts_file": _KNOWN_HOSTS,
        "ssh_strict_host_key_checking": "yes",
        # Expose the API beyond loopback only with a key, read from the controller's env:
        # "sglang_host": "0.0.0.0", "sglang_api_key_env": "SGLANG_API_KEY",
    },
)
