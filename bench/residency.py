"""The model in the page cache at a restart: the simulated server's restart-to-ready and its
weights' read with the shards evicted (cold: posix_fadvise DONTNEED on the host, as after a
boot) against the same restart with them in the page cache (warm), alternating run by run on
one host; and the deploy's own warm (`model_warm.py`) of the evicted model.

The host gets a larger model beside the testbed's own (`BENCH_MODEL_MIB`, default 4096 MiB in
8 shards, at /srv/models/GLM-5-bench, written once by the simulator's own `make_model_dir`),
and the deploy serves it. The warm-to-cold ratio is the model's read against the simulator's
fixed startup: a real model's read (hundreds of GB) dominates its restart far more than these
4 GiB do; 1024 MiB gave 0.69x (bench/results/20261203T050435Z.json). The simulator's load maps every shard and touches every page
(testbed/sim/launch_server.py), so its read follows the page cache, as a real server's does;
the rest of its startup is the simulator's fixed durations (TIME_SCALE). A restart is
`systemctl restart sglang` on the host; ready is the simulator's ready record (`ready_at`,
and `load_read_s`: the weights' read). The host goes back to the testbed's model at the end.
"""

from __future__ import annotations

import os
import shlex
import time

from bench.common import Figure, converge, deploy, ensure_hosts, log, read_json_on, ssh

SIM_DIR = "/var/cache/sglang/sglang-sim"
MODEL = "/srv/models/GLM-5-bench"
SHARDS = 8
TOOL = "/opt/sglang/tools/model_warm.py"
READY_TIMEOUT_S = 300.0

DROP = (f"python3 -c 'import glob, os\nfor f in glob.glob(\"{MODEL}/*.safetensors\"):\n"
        "    fd = os.open(f, os.O_RDONLY); os.fsync(fd)\n"
        "    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)'")
READ = f"cat {MODEL}/*.safetensors > /dev/null"


def model_mib() -> int:
    return int(os.environ.get("BENCH_MODEL_MIB", "4096"))


def make_model(host: str, mib: int) -> None:
    """The bench's model on HOST (written once: kept while its size is the one asked)."""
    code = (f"from model import make_model_dir; "
            f"make_model_dir({MODEL!r}, {SHARDS}, {mib * (1 << 20) // SHARDS})")
    ssh(host, f"test \"$(cat {MODEL}/.bench-mib 2>/dev/null)\" = {mib} || "
              f"{{ rm -rf {MODEL} && cd /opt/sglang-sim && python3 -c {shlex.quote(code)} && "
              f"echo {mib} > {MODEL}/.bench-mib; }}", timeout=600)


def restart(host: str) -> tuple[float, float]:
    """One restart: (seconds from `systemctl restart` to the simulator's ready moment, the
    seconds its load spent reading the weights)."""
    t0 = time.time()
    # back-to-back restarts would meet systemd's start rate limit: its counter reset first
    ssh(host, "systemctl reset-failed sglang.service; systemctl restart sglang.service",
        timeout=300)
    deadline = time.monotonic() + READY_TIMEOUT_S
    ready: dict = {}
    while time.monotonic() < deadline:
        ready = read_json_on(host, f"{SIM_DIR}/ready.json") or {}
        if (ready.get("ready_at") or 0) > t0:
            return ready["ready_at"] - t0, float(ready.get("load_read_s") or 0.0)
        time.sleep(0.2)
    raise RuntimeError(f"no fresh ready record on {host} within {READY_TIMEOUT_S:.0f}s: {ready}")


def warm_once(host: str) -> dict:
    """The deploy's warm of the evicted model, as the operation runs it."""
    import json

    ssh(host, DROP)
    out = ssh(host, f"python3 {TOOL} warm --model {MODEL} --every 60", timeout=600)
    result = json.loads(out.strip().splitlines()[-1])
    if not result.get("ok"):
        raise RuntimeError(f"model_warm.py failed on {host}: {result}")
    return result


def run(cfg) -> list[Figure]:
    host = ensure_hosts(1)[0]
    converge([host])
    mib = model_mib()
    make_model(host, mib)
    data = {"sglang_model_path": MODEL, "sglang_served_model_name": "glm-5"}
    deploy([host], extra_data=data)  # serves the bench's model (verified)
    cold_ready, warm_ready, cold_load, warm_load, rates = [], [], [], [], []
    try:
        for i in range(cfg.runs):
            ssh(host, DROP)
            r, load = restart(host)
            cold_ready.append(r)
            cold_load.append(load)
            ssh(host, READ)
            r, load = restart(host)
            warm_ready.append(r)
            warm_load.append(load)
            result = warm_once(host)
            rates.append(result["read_bytes"] / result["seconds"] / 1e9)
            log(f"residency run {i + 1}/{cfg.runs}: restart to ready cold {cold_ready[-1]:.2f}s "
                f"(weights read {cold_load[-1]:.2f}s), warm {warm_ready[-1]:.2f}s "
                f"({warm_load[-1]:.2f}s); the deploy's warm {rates[-1]:.2f} GB/s")
    finally:
        converge([host])  # back to the testbed's model
    size = f"{mib} MiB model in {SHARDS} shards"
    return [
        Figure(key="residency_ready", unit="s", samples=warm_ready,
               name=f"Restart to ready, model in the page cache ({size})",
               baseline_name="the same restart, model evicted (same runs)",
               baseline_samples=cold_ready,
               notes="`systemctl restart` to the simulator's ready moment; the simulator's "
                     "fixed startup durations (TIME_SCALE) are in both, so the ratio follows the "
                     "model's size (1024 MiB: 0.69x); cold: the shards dropped with "
                     "posix_fadvise(DONTNEED) first, warm: read just before"),
        Figure(key="residency_load", unit="s", samples=warm_load,
               name=f"Weights read at restart, model in the page cache ({size})",
               baseline_name="model evicted (same runs)", baseline_samples=cold_load,
               notes="the simulator's load maps every shard and touches every page "
                     "(`load_read_s` of its ready record); this machine's disk, not a real "
                     "host's NVMe"),
        Figure(key="residency_warm_rate", unit="GB/s", samples=rates,
               name=f"The deploy's warm of the evicted model ({size})",
               notes="`model_warm.py warm` (fadvise WILLNEED + sequential read, I/O priority "
                     "idle), read bytes / its seconds"),
    ]
