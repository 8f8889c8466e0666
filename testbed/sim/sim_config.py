"""The simulator's configuration and the model directory it serves.

/etc/testbed/sim.env (or $TESTBED_SIM_ENV), KEY=VALUE lines:
  SCENARIO=healthy|autotune-crash|load-hang|oom|slow-start (and the failures of sim_faults.py)
                        (and node-capture-crash|node-dies-serving of a group: sim_group.py)
  SCENARIO_WHEN=        "--flag value": the scenario hits only a server launched with those
                        arguments (a configuration that fails), any other launch is healthy
  TIME_SCALE=0.05       multiplies the real-ish durations below (slow-start: x5 more)
  TOKENS_PER_S=5000     simulated output throughput of one request (re-read while running)
  SLOW_WHEN=, SLOW_FACTOR=0.5  rates x SLOW_FACTOR when launched with the SLOW_WHEN arguments
                        (a configuration slower than the previous one: the benchmark gate's test)
  MAX_TOKENS_PER_S=0    aggregate output throughput cap of the server, 0 = none (re-read
                        while running): throughput = min(concurrency x TOKENS_PER_S, cap)
  READY_FILE=$SGLANG_CACHE_DIR/sglang-sim/ready.json   wall-clock ready moment, written atomically
                        (default under the cache dir: the unit's ProtectSystem=strict leaves it writable)
  EXIT_FILE=<beside READY_FILE>/exit.json   wall-clock moment of a crash exit (autotune-crash, oom)
  WARMUP_GATE=          optional path: warmup (health 503) lasts until this file exists
  HANG_AT_SHARD=        load-hang: shard index where progress stops (default: half)
  GPU_MEMORY_MIB=       simulated GPU memory (default: GPU_MEMORY_MIB of /etc/testbed/gpu.env, else 97887)
  LOG_SEED=0            the order the ranks' lines interleave in (seeded: the same each start)

Serving scenarios (after ready; SCENARIO is re-read while running, sim_faults.SERVING):
  wedge           HTTP stays up (/health 200), every generation of THIS process hangs from the
                  moment the scenario is set; a server started after that serves (a restart cures it)
  leak            every process hangs its generations after LEAK_AFTER requests (default 20):
                  a restart cures it for LEAK_AFTER more requests
  slow-progress   every request waits PROGRESS_DELAY_S (default 2, not scaled) before its first
                  token and then runs at a tenth of TOKENS_PER_S: slow, but requests finish
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path

REAL_DURATIONS = {          # seconds on a real 8-GPU host, multiplied by TIME_SCALE
    "dist_init": 6.0,
    "per_shard": 4.0,
    "kv_alloc": 3.0,
    "autotune": 120.0,
    "autotune_cached": 6.0,  # every rank finds its tactics in SGLANG_CACHE_DIR: no profiling
    "autotune_fail": 40.0,
    "graph": 60.0,
    "http_start": 2.0,
    "warmup": 3.0,
    "drain_poll": 5.0,       # sigterm_watchdog polls every 5 s
    "warmup_retry": 120.0,   # _execute_server_warmup tries /model_info 120 times, 1 s apart
}


def _launched_with(args: str) -> bool:
    """Whether this server's command line contains ARGS ("--flag value")."""
    return f" {args} " in " " + " ".join(sys.argv[1:]) + " "


def read_env_file(path: str) -> dict:
    out = {}
    try:
        for line in Path(path).read_text().splitlines():
            line = "" if line.lstrip().startswith("#") else re.sub(r"\s+#.*$", "", line).strip()
            if "=" in line:
                k, v = line.split("=", 1)
                out[k.strip()] = v.strip().strip('"').strip("'")
    except OSError:
        pass
    return out


class Config:
    def __init__(self):
        self.path = os.environ.get("TESTBED_SIM_ENV", "/etc/testbed/sim.env")
        env = read_env_file(self.path)
        gpu = read_env_file(os.environ.get("TESTBED_GPU_ENV", "/etc/testbed/gpu.env"))
        self.scenario = env.get("SCENARIO", "healthy") or "healthy"
        when = env.get("SCENARIO_WHEN", "")
        if when and not _launched_with(when):
            self.scenario = "healthy"
        self.time_scale = float(env.get("TIME_SCALE", "0.05") or 0.05)
        if self.scenario == "slow-start":
            self.time_scale *= 5
        self._rates_checked = 0.0
        self._rates_mtime = None
        self._apply_rates(env)
        cache = os.environ.get("SGLANG_CACHE_DIR") or os.path.expanduser("~/.cache/sglang")
        self.ready_file = env.get("READY_FILE") or os.path.join(cache, "sglang-sim", "ready.json")
        self.exit_file = env.get("EXIT_FILE") or os.path.join(os.path.dirname(self.ready_file), "exit.json")
        self.warmup_gate = env.get("WARMUP_GATE", "")
        self.hang_at = env.get("HANG_AT_SHARD", "")
        self.log_seed = int(env.get("LOG_SEED", "0") or 0)
        self.gpu_mib = int(env.get("GPU_MEMORY_MIB") or gpu.get("GPU_MEMORY_MIB") or 97887)
        self.started = time.time()
        self.live_scenario = self.scenario   # SCENARIO as sim.env says now (serving scenarios)
        self.live_since = 0.0                # mtime of sim.env when it was read
        self._apply_serving(env, start=True)

    def _apply_serving(self, env: dict, start: bool = False) -> None:
        scen = env.get("SCENARIO", "healthy") or "healthy"
        when = env.get("SCENARIO_WHEN", "")
        if when and not _launched_with(when):
            scen = "healthy"
        self.live_scenario = scen
        try:
            self.live_since = os.stat(self.path).st_mtime
        except OSError:
            self.live_since = 0.0
        self.leak_after = int(env.get("LEAK_AFTER", "20") or 20)
        self.progress_delay_s = float(env.get("PROGRESS_DELAY_S", "2") or 2)

    def serving_scenario(self) -> str:
        """The serving scenario in force for this process now: a `wedge` set before this
        process started does not strike it (sim.env's mtime against the start)."""
        scen = self.live_scenario
        if scen == "wedge" and self.live_since <= self.started:
            return "healthy"
        return scen

    def _apply_rates(self, env: dict) -> None:
        self.tokens_per_s = float(env.get("TOKENS_PER_S", "5000") or 5000)
        self.max_tokens_per_s = float(env.get("MAX_TOKENS_PER_S", "0") or 0)
        when = env.get("SLOW_WHEN", "")
        if when and _launched_with(when):
            factor = float(env.get("SLOW_FACTOR", "0.5") or 0.5)
            self.tokens_per_s *= factor
            self.max_tokens_per_s *= factor

    def refresh_rates(self) -> None:
        """TOKENS_PER_S / MAX_TOKENS_PER_S follow sim.env while running (checked at most 2x/s)."""
        now = time.monotonic()
        if now - self._rates_checked < 0.5:
            return
        self._rates_checked = now
        try:
            mtime = os.stat(self.path).st_mtime_ns
        except OSError:
            return
        if mtime != self._rates_mtime:
            self._rates_mtime = mtime
            env = read_env_file(self.path)
            self._apply_rates(env)
            self._apply_serving(env)

    def sleep(self, what: str, factor: float = 1.0):
        time.sleep(REAL_DURATIONS[what] * self.time_scale * factor)


def read_model(model_path: str) -> dict:
    p = Path(model_path)
    info = {"arch": "LlamaForCausalLM", "shards": 1, "total_size": 0, "quant": "", "ctx": 4096,
            "model_type": None, "shard_files": []}
    try:
        cfg = json.loads((p / "config.json").read_text())
        info["arch"] = (cfg.get("architectures") or [info["arch"]])[0]
        info["ctx"] = int(cfg.get("max_position_embeddings") or info["ctx"])
        info["model_type"] = cfg.get("model_type")
        q = cfg.get("quantization_config") or {}
        if q:
            s = f"quant={q.get('quant_method', 'quantized')}"
            for field in ("bits", "quant_algo", "fmt"):
                if field in q:
                    s += f", {field}={q[field]}"
            info["quant"] = s + ", "
    except (OSError, ValueError):
        pass
    try:
        idx = json.loads((p / "model.safetensors.index.json").read_text())
        info["shard_files"] = sorted(set(idx.get("weight_map", {}).values()))
        info["shards"] = max(1, len(info["shard_files"]))
        info["total_size"] = int((idx.get("metadata") or {}).get("total_size") or 0)
    except (OSError, ValueError):
        info["shard_files"] = sorted(f.name for f in p.glob("*.safetensors"))
        info["shards"] = max(1, len(info["shard_files"]))
    return info


