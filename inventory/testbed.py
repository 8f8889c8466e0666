"""pyinfra inventory of the local testbed (`python -m testbed up --hosts N`).

Reads the testbed state (`.testbed/state.json` at the repo root, or `$TESTBED_DIR/state.json`).
Connections are checked strictly against the testbed's own known_hosts file (the testbed
writes each host's key there when it creates or wipes the host).

TESTBED_DATA is the ONLY place where the testbed differs from a production inventory.
"""

import ast
import json
import os
from pathlib import Path

# Every other piece of data comes from group_data/ exactly as in production.
TESTBED_DATA = {
    # The SGLang simulator stands in for `python -m sglang.launch_server` (same argv after it):
    # the release venv's python runs it, beside the real sglang wheel installed in that venv.
    "sglang_launch_command": ["/opt/sglang-sim/launch_server.py"],
    # No watchdog by default: 2 CPU cores are shared by every host; the tests about it
    # (tests/integration/test_watchdog.py) set `watchdog` themselves.
    "watchdog": "off",
    # Containers have no route to the package index: install from the read-only bind mount.
    "sglang_wheelhouse": "/srv/wheelhouse",
    # The real sglang wheel of the pinned version, without its GPU dependencies.
    "sglang_lock": "locks/testbed.txt",
    "sglang_model_path": "/srv/models/GLM-5-NVFP4",
    # Simulated peer copies are real host memcpy (paced), so their speed follows this
    # machine's load: healthy 15-27 GB/s idle, a few GB/s on a busy 2-core machine; the
    # p2p-slow scenario 0.4 GB/s.
    "gpu_p2p_min_gbps": 1.0,
    # ...and each copy costs this machine's CPU (56 pairs x 4 copies, plus the host-side
    # write and read-back of the data check): 8 MiB keeps the full test (first pre-flight,
    # and before each restart) near 1 s here, as 64 MiB copies take on real GPUs.
    "gpu_p2p_test_mib": 8,
    # `sglang-deploy bench`: this machine has 2 CPU cores shared by the client and the
    # simulator, so small levels and short requests (the simulator's rate, not the CPU, sets
    # the figure: TOKENS_PER_S / MAX_TOKENS_PER_S in /etc/testbed/sim.env).
    "bench_concurrency": [2, 4],
    "bench_num_prompts": 32,
    "bench_input_len": 32,
    "bench_output_len": 128,
    # a level takes seconds here: a stuck one fails in minutes, not the default hour
    "bench_timeout_s": 300,
    # The benchmark client imports torch/triton/torchvision (through sglang/__init__.py) but
    # never uses them; the testbed's release venv has no GPU stack, so import-only stand-ins.
    "bench_env": {"PYTHONPATH": "/opt/sglang-sim/standins"},
    # The release smoke before each switch: the testbed's release has no torch, so only
    # `import sglang` runs (with the same stand-ins); sglang's own flag parser and the
    # server's entry modules need the real GPU stack (`sglang-deploy lock --check` runs them
    # on the production lock, and the suite runs that under the unit's sandbox).
    "sglang_smoke": ["import"],
    "sglang_smoke_env": {"PYTHONPATH": "/opt/sglang-sim/standins"},
    # The all-reduce check (`gpu_allreduce_check`, off unless a test turns it on): no NCCL
    # here, so a torch stand-in whose all-reduce is a real TCP sum between the ranks, across
    # the group's hosts too (testbed/sim/allreduce_standin).
    "gpu_allreduce_env": {"PYTHONPATH": "/opt/sglang-sim/allreduce_standin"},
}


def _state_path() -> Path:
    env = os.environ.get("TESTBED_DIR")
    if env:
        return Path(env).expanduser().resolve() / "state.json"
    return Path(__file__).resolve().parent.parent / ".testbed" / "state.json"


# With a router host (`python -m testbed up --router`): every host gets the router keys (the
# serving hosts then bind their testbed address and use the router's key), and the key is
# the testbed's own, kept root-only in its state folder (router-key); production exports it.
ROUTER_KEY_ENV = "TESTBED_ROUTER_KEY"
ROUTER_DATA = {
    "router_host": "0.0.0.0",
    "router_port": 30000,
    "router_api_key_env": ROUTER_KEY_ENV,
    # a rollout's drain waits for the load test's requests: seconds here
    "rollout_drain_timeout_s": 60,
    "router_verify_timeout_s": 120,
}


# A multi-node group (`python -m testbed up --hosts 3 --group 2`): its hosts get
# `sglang_group` and the seed's flags (group_data/all.py) with tp-size = nodes x GPUS_PER_HOST;
# the rank, dist-init address and port follow the deploy side's defaults (inventory order,
# rank 0's ssh_hostname, 50000).
GPUS_PER_HOST = 8


def _seed_flags() -> dict:
    """group_data/all.py's `sglang_flags` literal (read, not imported: it is pyinfra's data)."""
    path = Path(__file__).resolve().parent.parent / "group_data" / "all.py"
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "sglang_flags"
                                                for t in node.targets):
            return dict(ast.literal_eval(node.value))
    return {}


def group_data(group: dict) -> dict:
    return {"sglang_group": group["name"],
            "sglang_flags": {**_seed_flags(), "tp-size": GPUS_PER_HOST * len(group["hosts"])}}


def _load_hosts():
    path = _state_path()
    try:
        state = json.loads(path.read_text())
    except FileNotFoundError:
        msg = f"no testbed is up: run `python -m testbed up --hosts 1` (no {path})"
        try:
            from pyinfra.api.exceptions import InventoryError
        except ImportError:  # pragma: no cover
            raise RuntimeError(msg) from None
        raise InventoryError(msg) from None
    routed = any(h.get("role") == "router" for h in state["hosts"])
    if routed and not os.environ.get(ROUTER_KEY_ENV):
        os.environ[ROUTER_KEY_ENV] = (Path(state["state_dir"]) / "router-key").read_text().strip()
    in_group = {name: group_data(g) for g in state.get("groups", []) for name in g["hosts"]}
    hosts, routers = [], []
    for h in sorted(state["hosts"], key=lambda h: h["index"]):
        (routers if h.get("role") == "router" else hosts).append((h["name"], {
            "ssh_hostname": h["address"],
            "ssh_user": "root",
            "ssh_key": state["key"],
            "ssh_known_hosts_file": state["known_hosts"],
            "ssh_strict_host_key_checking": "yes",
            "ssh_connect_retries": 3,
            **TESTBED_DATA,
            **(ROUTER_DATA if routed else {}),
            **in_group.get(h["name"], {}),
        }))
    return hosts, routers


testbed, _routers = _load_hosts()
if _routers:
    routers = _routers
