"""Host data: every key this tool reads, its type, default and meaning (pure).

The data table of docs/data-keys.md is generated from ``KEYS`` (``sglang-deploy data-table``,
``scripts/readme_table.py``) and a test keeps the two equal. ``RULES``, beside them, declare
what a value must be beyond its type and what one key asks of another (``datarules``).
``resolve(raw, environ)`` checks a host's merged data and returns a ``Settings`` object; it
raises ``DataError`` naming the key for anything wrong, before any host is contacted
(``config.py`` calls it from pyinfra's before-connect hook).
"""

from __future__ import annotations

import copy
import difflib
import functools
import operator
from collections.abc import Mapping
from dataclasses import dataclass, field, make_dataclass
from typing import TYPE_CHECKING, Any

from sglang_deploy.core import datarules as rules
from sglang_deploy.core.errors import DataError

# Data keys that belong to pyinfra itself or its connectors: passed through unchecked.
FOREIGN_PREFIXES = ("ssh_", "_", "local_", "docker_", "chroot_", "winrm_", "terraform_", "vagrant_")

@dataclass(frozen=True)
class Key:
    name: str
    types: tuple[type, ...]
    default: Any
    doc: str
    choices: tuple[str, ...] | None = None
    minimum: float | None = None
    required: bool = False


def _k(name: str, types: type | tuple[type, ...], default: Any, doc: str, **kw: Any) -> Key:
    return Key(name, types if isinstance(types, tuple) else (types,), default, doc, **kw)


NONE = type(None)

KEYS: dict[str, Key] = {k.name: k for k in [
    # --- pre-flight -------------------------------------------------------------------------
    _k("gpu_expected_count", int, 8, "Number of GPUs the host must show (nvidia-smi and CUDA).",
       minimum=1),
    _k("gpu_expected_model", (str, NONE), "NVIDIA RTX PRO 6000 Blackwell Server Edition",
       "Exact GPU name every GPU must report; null accepts any."),
    _k("gpu_min_driver", (str, NONE), "580.0",
       "Lowest acceptable NVIDIA driver version (nvidia-smi `driver_version`)."),
    _k("gpu_p2p_policy", str, "require",
       "`require`: any GPU pair without working P2P fails. `adapt`: set `NCCL_P2P_DISABLE=1` "
       "for the service and go on. Corrupt peer copies fail either way.",
       choices=("require", "adapt")),
    _k("gpu_p2p_min_gbps", (int, float), 10.0,
       "Lowest acceptable measured peer-copy bandwidth per GPU pair, GB/s.", minimum=0),
    _k("gpu_p2p_test_mib", int, 64, "Size of each verified peer copy in the P2P test, MiB.",
       minimum=1),
    _k("gpu_p2p_test", str, "auto",
       "`auto`: run the data-verified peer copies unless the service is running and this "
       "deploy will not restart it: then reuse the verdict of the last full test recorded on "
       "the host (and skip the CUDA probe while it serves the invocation a deploy verified). "
       "`always`: probe and copy on every deploy.", choices=("auto", "always")),
    _k("gpu_allreduce_check", bool, False,
       "Before the server (re)starts (its GPUs free), run a short NCCL all-reduce "
       "(torch.distributed in the release venv, one process per GPU) over the host's GPUs, "
       "and across the nodes of a multi-node group together: it must complete with the right "
       "sum, and its bus bandwidth (nccl-tests' busbw) meet `gpu_allreduce_min_busbw_gbps`. A "
       "group's rank 0 hosts its rendezvous on `sglang_dist_init_port` + 1."),
    _k("gpu_allreduce_min_busbw_gbps", (int, float, NONE), None,
       "Lowest acceptable all-reduce bus bandwidth, GB/s (nccl-tests' busbw, "
       "`all_reduce_perf`'s column); null: only that the all-reduce completes.", minimum=0),
    _k("gpu_allreduce_mib", int, 256, "Size of the all-reduced tensor (float32) per GPU, MiB.",
       minimum=1),
    _k("gpu_allreduce_env", dict, {},
       "Extra environment of the all-reduce check (over the service's), e.g. "
       "`{\"NCCL_DEBUG\": \"INFO\"}` or `NCCL_IB_HCA`. The testbed puts its torch stand-in "
       "here (a TCP sum, no NCCL)."),
    _k("gpu_allreduce_timeout_s", (int, float), 120,
       "Deadline of the whole all-reduce check on a host (torch import, rendezvous, NCCL set-up, "
       "the all-reduces), seconds.", minimum=10),
    _k("gpu_health_policy", dict, {},
       "Severity per GPU health finding code over the defaults (docs/operations.md, GPU "
       "health): `fatal` refuses a (re)start onto the host, `warning` and `unknown` are "
       "shown, `ignore` is left out. E.g. `{\"xid-48\": \"warning\"}` after resetting the GPU "
       "(the Xid stays in the kernel log until a reboot), `{\"query-failed\": \"fatal\"}` to "
       "refuse a start when the health cannot be read."),
    # --- runtime ----------------------------------------------------------------------------
    _k("sglang_lock", str, "locks/glm5-blackwell.txt",
       "Lock file (on the controller, relative to the deploy folder): the exact packages, with "
       "hashes, of the release venv. The release id is the hash of this file."),
    _k("sglang_wheelhouse", (str, NONE), None,
       "Folder ON THE HOST holding every wheel of the lock (and uv): install offline from it, "
       "without an index. `sglang-deploy wheelhouse` fills one."),
    _k("sglang_index_url", (str, NONE), None, "Package index for the host when not offline."),
    _k("sglang_uv_version", str, "0.13.9", "uv version brought onto the host (tool venv)."),
    _k("sglang_system_python", str, "/usr/bin/python3",
       "Python on the host used for the probe, the tool venv and release venvs."),
    _k("sglang_root", str, "/opt/sglang", "Releases (`releases/<id>/venv`), `current` link, tools."),
    _k("sglang_cache_dir", str, "/var/cache/sglang",
       "Persistent cache (SGLANG_CACHE_DIR, FlashInfer workspace): survives reinstalls."),
    _k("sglang_cache_seed", (str, NONE), None,
       "Archive ON THE CONTROLLER (from `sglang-deploy cache save`) unpacked into an EMPTY "
       "cache folder, so a rebuilt host reuses autotune and JIT results instead of paying again."),
    _k("sglang_home", str, "/var/lib/sglang", "Home and working directory of the service user."),
    _k("sglang_user", str, "sglang", "Unprivileged user the service runs as."),
    _k("sglang_service", str, "sglang", "systemd unit name (without `.service`)."),
    _k("sglang_autotune_patch", bool, True,
       "Apply the FlashInfer autotune patch (enable `flashinfer_cutlass` in the allow-list)."),
    _k("sglang_keep_releases", int, 3, "Release venvs kept on the host (current + rollbacks).",
       minimum=1),
    # --- model ------------------------------------------------------------------------------
    _k("sglang_model_path", str, None, "Model directory on the host (Hugging Face layout).",
       required=True),
    _k("sglang_served_model_name", (str, NONE), None,
       "Name served by the API (`--served-model-name`); default: the model path."),
    _k("sglang_model_repo", (str, NONE), None,
       "Hugging Face repo id to download into the model path when `sglang_model_download`."),
    _k("sglang_model_download", bool, False,
       "Download the model (huggingface_hub, token from `sglang_hf_token_env`) if shards are missing."),
    _k("sglang_model_revision", str, "main",
       "Revision of `sglang_model_repo` to download: a branch, tag or (to pin it) a commit hash; "
       "another revision than the downloaded folder's is downloaded beside it, `PATH@REV`."),
    _k("sglang_hf_endpoint", (str, NONE), None,
       "Hugging Face endpoint the host downloads from (a mirror, as `HF_ENDPOINT`); null: "
       "https://huggingface.co."),
    _k("sglang_model_download_timeout_s", int, 86400,
       "Deadline of the model download, seconds (it then fails, naming what arrived).", minimum=1),
    _k("sglang_model_warm", bool, True,
       "Before the server (re)starts, read the model's shards into the host's page cache while "
       "the old server still serves (a rollout: in its staging run, before the first drain), "
       "at I/O priority idle, when they are not there already and fit "
       "(`sglang_model_warm_margin_pct`); the restart then loads them from memory. Never in a "
       "read-only run (`status`, `--dry`)."),
    _k("sglang_model_warm_margin_pct", (int, float), 10,
       "Memory the warm leaves free, in percent of the host's MemTotal: it reads the shard "
       "bytes not yet in the page cache only when they plus this margin fit in MemAvailable "
       "(else it says why, with the figures, and the server loads from disk).", minimum=0),
    _k("sglang_model_warm_timeout_s", (int, float), 1800,
       "Deadline of the warm, seconds: it then stops where it is (what it read stays in the "
       "page cache) and the deploy goes on.", minimum=1),
    # --- service ----------------------------------------------------------------------------
    _k("sglang_flags", dict, {},
       "Launch flags: `{flag: value}`; `true` -> bare flag, `false`/null -> omitted, "
       "list -> `--flag a b` (sglang's list options take several values). Full flag names only; `--host`, `--port`, `--api-key`, "
       "`--model-path`, `--served-model-name` come from their own keys."),
    _k("sglang_config_file", (str, NONE), None,
       "An SGLang YAML config file (what `--config` reads: `tp-size: 8` lines) ON THE "
       "CONTROLLER, relative to the deploy folder: its flags are launch flags under "
       "`sglang_flags` (a flag set in both takes `sglang_flags`' value, as sglang's command "
       "line wins over its config file), checked and rendered into the unit as every flag; "
       "`--config` itself is never passed."),
    _k("sglang_host", str, "127.0.0.1", "Address the server binds."),
    _k("sglang_port", int, 30000, "Port the server listens on.", minimum=1),
    _k("sglang_allow_public_without_key", bool, False,
       "Allow binding a non-loopback address without an API key."),
    _k("sglang_api_key_env", (str, NONE), None,
       "Name of the CONTROLLER environment variable holding the API key (never the key itself)."),
    _k("sglang_hf_token_env", (str, NONE), None,
       "Name of the controller environment variable holding the Hugging Face token."),
    _k("sglang_env", dict, {},
       "Extra, non-secret environment variables of the service. Secret names (`HF_TOKEN`, "
       "`HUGGING_FACE_HUB_TOKEN`, `*_KEY`, `*_TOKEN`, `*_SECRET`, `*_PASSWORD`) are refused: "
       "use `sglang_api_key_env` / `sglang_hf_token_env`."),
    _k("sglang_launch_command", list, ["-m", "sglang.launch_server"],
       "What the release venv's python runs, before the flags."),
    _k("sglang_smoke", list, ["import", "flags", "entrypoints"],
       "The release smoke run on each host before a new release or new flags go live (and by "
       "`lock --check`): `import` sglang, its own parser on the launch `flags`, the server's "
       "`entrypoints` imported. `import` always runs."),
    _k("sglang_smoke_env", dict, {},
       "Extra environment of the release smoke on the hosts only (over the unit's). Production "
       "needs none; the testbed puts its import stand-ins for torch here."),
    _k("sglang_hardening_required", list, [],
       "Properties of the unit's sandbox that must be in force on the host (of "
       "NoNewPrivileges, SystemCallFilter, CapabilityBoundingSet, DevicePolicy, ProtectSystem): "
       "the release smoke fails before the switch, naming the property, where one is not, e.g. "
       "`[\"DevicePolicy\"]` on a host whose container's systemd cannot apply it. Default: "
       "shown by `status`, not enforced."),
    _k("sglang_stop_timeout_s", int, 120, "TimeoutStopSec of the unit.", minimum=1),
    _k("sglang_restart_sec", int, 30, "RestartSec of the unit (Restart=always).", minimum=0),
    # --- multi-node groups ------------------------------------------------------------------
    _k("sglang_group", (str, NONE), None,
       "Name of the multi-node group this host belongs to: the hosts with the same name serve "
       "one model together (`--nnodes`, `--node-rank`, `--dist-init-addr` are rendered); "
       "only rank 0 serves HTTP. null: a single-host server."),
    _k("sglang_node_rank", (int, NONE), None,
       "This host's `--node-rank` in its group, set on every node of the group or on none; "
       "null on all: their positions in inventory order.", minimum=0),
    _k("sglang_dist_init_addr", (str, NONE), None,
       "The IPv4 address of the group's rank-0 host that the other nodes reach "
       "(`--dist-init-addr`); null: rank 0's `ssh_hostname` when it is an IPv4 address."),
    _k("sglang_dist_init_port", int, 50000,
       "The port of `--dist-init-addr` (torch's rendezvous store on rank 0).", minimum=1),
    _k("sglang_nccl_socket_ifname", (str, NONE), None,
       "NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME of a group's nodes; null: the interface "
       "that carries the route to `--dist-init-addr` on each node, found on the host."),
    # --- verify -----------------------------------------------------------------------------
    _k("verify_timeout_s", (int, float), 3600, "Overall deadline for the server to become ready.",
       minimum=1),
    _k("verify_phase_timeouts", dict,
       {"starting": 600, "loading": 2400, "kv_cache": 600, "autotune": 1800, "capture": 900,
        "http": 300, "warmup": 600},
       "Deadline per startup phase, seconds (a stall fails naming the phase)."),
    _k("verify_poll_s", (int, float), 0.5, "Poll interval of the verifier, seconds.", minimum=0.05),
    _k("verify_generate", bool, True, "Require a real one-token generation before ready."),
    _k("verify_promote_known_good", bool, True,
       "Make what just passed verification the host's known-good configuration (rollback "
       "target). `rollout --min-throughput-ratio` turns it off and promotes after the gate."),
    _k("verify_converged", bool, False,
       "Also check a server that was not restarted (health, models, a generation); "
       "`sglang-deploy rollout` sets it so converged hosts are verified, not assumed."),
    # --- watchdog (after ready) --------------------------------------------------------------
    _k("watchdog", str, "report",
       "The serving host's watchdog (`sglang-watchdog.service`): `report` judges the server by "
       "a 1-token generation and its token counter and records a wedge; `restart` also takes a "
       "wedged single host out of the router, restarts, verifies and puts it back (never while "
       "the deploy lock is held, a fatal GPU or past the cap); a group's rank 0 only reports "
       "(a group restarts as one); `off` removes it.", choices=("off", "report", "restart")),
    _k("watchdog_interval_s", (int, float), 15, "Seconds between two watchdog observations.",
       minimum=1),
    _k("watchdog_probe_timeout_s", (int, float), 30,
       "Deadline of the watchdog's 1-token generation, seconds.", minimum=1),
    _k("watchdog_probe_failures", int, 3,
       "Failed probes in a row, with the token counter flat, that make a wedge.", minimum=1),
    _k("watchdog_stall_s", (int, float), 120,
       "Requests waiting while the token counter stays flat this long make one failed probe "
       "a wedge, seconds.", minimum=1),
    _k("watchdog_journal_silence_s", (int, float), 120,
       "Without metrics: a journal silent this long while requests wait counts as a stall, "
       "seconds.", minimum=1),
    _k("watchdog_max_restarts_per_hour", int, 2,
       "Restarts the watchdog makes on one host per hour at most; past it, it reports only.",
       minimum=0),
    _k("watchdog_verify_timeout_s", (int, float), 600,
       "Deadline for a server the watchdog restarted to serve again (health, model, a "
       "1-token generation), seconds.", minimum=1),
    # --- router -----------------------------------------------------------------------------
    _k("router_host", str, "127.0.0.1",
       "Address the router (SMG, on the hosts of the inventory group `routers`) binds. A "
       "non-loopback address needs `router_api_key_env`."),
    _k("router_port", int, 30000, "Port the router listens on.", minimum=1),
    _k("router_api_key_env", (str, NONE), None,
       "Name of the CONTROLLER environment variable holding the router's API key. Clients "
       "send it; the router passes it through to the serving hosts, which therefore use the "
       "same key (their `sglang_api_key_env` follows it when a `routers` group exists)."),
    _k("router_policy", str, "round_robin",
       "Load-balancing policy of the router (`--policy`).",
       choices=("round_robin", "random", "power_of_two", "cache_aware", "least_load")),
    _k("router_lock", str, "locks/router.txt",
       "Lock file (on the controller) of the router's release venv (`smg` and its dependencies)."),
    _k("router_root", str, "/opt/smg", "Router releases (`releases/<id>/venv`), `current`, tools."),
    _k("router_service", str, "smg", "systemd unit name of the router (without `.service`)."),
    _k("router_user", str, "smg", "Unprivileged user the router runs as."),
    _k("router_prometheus_port", int, 29000,
       "Port of the router's Prometheus metrics (`/metrics`).", minimum=1),
    _k("router_prometheus_host", str, "127.0.0.1",
       "Address the router's Prometheus metrics bind. SMG serves them without a key: bind "
       "an address other than loopback only where Prometheus must reach it "
       "(`sglang-deploy metrics-targets` leaves a loopback-bound router out)."),
    _k("router_worker_address", (str, NONE), None,
       "Per serving host: the address the router reaches it at; null: its `ssh_hostname`, "
       "else its inventory name. Behind a router, a server whose `sglang_host` is loopback "
       "binds this address instead."),
    _k("router_verify_timeout_s", (int, float), 300,
       "Deadline for the router to list every worker healthy and route a generation to each.",
       minimum=1),
    _k("rollout_drain_timeout_s", (int, float), 300,
       "`sglang-deploy rollout`: deadline for a host taken out of the router to finish the "
       "requests in flight on it before its restart.", minimum=1),
    _k("rollout_drain_until", str, "idle",
       "`sglang-deploy rollout`: when a host's drain ends. `idle`: once the router routes no "
       "new request to it (SMG lists it `draining`, or has forgotten it) and neither the "
       "router nor the server counts a request in flight. `removed`: also until the router "
       "has forgotten it (SMG's fixed `drain_settle_secs`, 5 s, whatever is in flight): the "
       "behaviour before, kept as the bench's baseline.", choices=("idle", "removed")),
    # --- metrics ----------------------------------------------------------------------------
    _k("watchdog_metrics_port", (int, NONE), None,
       "Port of the watchdog's Prometheus metrics (`/metrics`) on each serving host, at the "
       "server's address; null: no watchdog target. `sglang-deploy metrics-targets` lists "
       "it; the alert rules read its restarts, GPU health and deploy-lock metrics "
       "(docs/operations.md, Metrics).", minimum=1),
    # --- bench ------------------------------------------------------------------------------
    _k("bench_concurrency", list, [256, 512, 1024],
       "`sglang-deploy bench`: concurrency levels (`--max-concurrency` of "
       "`python -m sglang.bench_serving`), one run each."),
    _k("bench_num_prompts", (int, NONE), None,
       "Requests per concurrency level; null: 4 x the level.", minimum=1),
    _k("bench_input_len", int, 1024, "Input tokens per request (`--random-input-len`).", minimum=1),
    _k("bench_output_len", int, 1024, "Output tokens per request (`--random-output-len`).",
       minimum=1),
    _k("bench_dataset", str, "random-ids",
       "`random-ids`: random token ids, nothing to download. `random`: ShareGPT text, which "
       "bench_serving downloads from the Hugging Face Hub (the host needs that access).",
       choices=("random-ids", "random")),
    _k("bench_request_rate", (int, float, NONE), None,
       "Requests per second (Poisson arrivals); null: all at once, bounded by the concurrency.",
       minimum=0),
    _k("bench_timeout_s", (int, float), 3600, "Deadline of one concurrency level, seconds.",
       minimum=1),
    _k("bench_env", dict, {},
       "Extra, non-secret environment variables of the benchmark client on the host."),
]}

PHASES = ("starting", "loading", "kv_cache", "autotune", "capture", "http", "warmup")

#: the addresses that keep a server (or the router) off the network
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def is_loopback(address: str) -> bool:
    return address in LOOPBACK or address.startswith("127.")


_FLAG_KEYS_OWNED = {
    "--host": "sglang_host", "--port": "sglang_port", "--api-key": "sglang_api_key_env",
    "--model-path": "sglang_model_path", "--served-model-name": "sglang_served_model_name",
}

#: What the values must be beyond their types, and what one key asks of another, checked in
#: this order after every key's type (``datarules.check``; ansible's argument_spec).
def _hardening_names(name: str, value: list[str], default: Any = None) -> None:
    """Every name is a sandbox property the release smoke judges (``core.hardening``)."""
    from sglang_deploy.core import hardening

    unknown = [n for n in value if n not in hardening.PROPERTIES]
    if unknown:
        raise DataError(key=name, what=f"properties of {', '.join(hardening.PROPERTIES)}",
                        found=repr(unknown), fix='e.g. ["DevicePolicy"]')


def _gpu_health_policy(name: str, value: dict[str, Any], default: Any = None) -> None:
    """Finding codes of ``core.gpuhealth`` mapped to its severities."""
    from sglang_deploy.core import gpuhealth

    problem = gpuhealth.policy_problem(value)
    if problem:
        raise DataError(key=name, what=f"`{name}` to map {problem[0]}", found=problem[1],
                        fix='e.g. {"xid-48": "warning", "query-failed": "fatal"}')


RULES = (
    rules.Each(("gpu_health_policy",), _gpu_health_policy),
    rules.Each(("sglang_model_path", "sglang_root", "sglang_cache_dir", "sglang_home",
                "sglang_wheelhouse", "sglang_system_python", "router_root"), rules.absolute_path),
    rules.Each(("sglang_env",), rules.env_mapping),
    rules.Each(("sglang_env",), rules.no_secrets),
    rules.Each(("bench_env", "sglang_smoke_env", "gpu_allreduce_env"), rules.env_mapping),
    rules.Each(("gpu_allreduce_env", "sglang_smoke_env"), rules.no_secrets),
    rules.Each(("sglang_smoke",), rules.elements_in("import", "flags", "entrypoints")),
    rules.Each(("sglang_hardening_required",), _hardening_names),
    rules.Each(("bench_concurrency",), rules.distinct_positive_ints),
    rules.Each(("sglang_user", "sglang_service", "router_user", "router_service"),
               rules.plain_name),
    rules.Each(("sglang_launch_command",), rules.non_empty_strings),
    rules.Each(("verify_phase_timeouts",), rules.phase_timeouts(PHASES)),
    rules.Each(("sglang_flags",), rules.launch_flags(_FLAG_KEYS_OWNED)),
    # the router's key first: a worker behind the router takes it as its own
    # (core/router.routed_data), so a missing one is named by the key the operator set
    rules.Secrets((("router_api_key_env", "ROUTER_API_KEY"),
                   ("sglang_api_key_env", "SGLANG_API_KEY"), ("sglang_hf_token_env", "HF_TOKEN"))),
    rules.RequiredIf(
        "sglang_host", when=lambda host: host not in LOOPBACK,
        one_of=("secret:SGLANG_API_KEY", "sglang_allow_public_without_key"),
        what="binding {value} exposes the API to the network",
        found="no API key (`sglang_api_key_env` is not set)",
        fix="set `sglang_api_key_env`, bind 127.0.0.1, or set "
            "`sglang_allow_public_without_key: true` deliberately"),
    # the router's key is the router's secret, not the server's (its own secrets file)
    rules.RequiredIf(
        "router_host", when=lambda host: not is_loopback(host), one_of=("secret:ROUTER_API_KEY",),
        what="binding the router to {value} exposes the API to the network only with a key",
        found="no API key (`router_api_key_env` is not set)",
        fix="set `router_api_key_env` to the name of a controller environment variable holding "
            "the key, or bind `router_host: 127.0.0.1`"),
    rules.Each(("sglang_hf_endpoint",), rules.http_url),
    rules.RequiredIf(
        "sglang_model_download", when=bool, one_of=("sglang_model_repo",),
        what="downloading needs a repo id",
        found="sglang_model_download is true but sglang_model_repo is not set",
        fix="set `sglang_model_repo` (e.g. org/model) or turn the download off",
        names="sglang_model_repo"),
)


def _annotation(types: tuple[type, ...]) -> Any:
    """The type annotation of a key's field: its types joined (``str | None``)."""
    return functools.reduce(operator.or_, types)


def _field(key: Key) -> tuple[Any, ...]:
    """One key's field of ``Settings``: required keys have no default, mutable defaults are
    copied per instance (the table's own value is never shared)."""
    if key.required:
        return key.name, _annotation(key.types)
    if isinstance(key.default, (dict, list)):
        return key.name, _annotation(key.types), field(
            default_factory=functools.partial(copy.deepcopy, key.default))
    return key.name, _annotation(key.types), field(default=key.default)


def _served_model_name(self: Settings) -> str:
    name: str = self.sglang_served_model_name or self.sglang_model_path
    return name


def _api_key(self: Settings) -> str | None:
    return self.secrets.get("SGLANG_API_KEY")


if TYPE_CHECKING:
    from sglang_deploy.core.settingstype import Settings
else:
    #: Resolved data for one host: one typed field per key of ``KEYS`` (its name, type and
    #: default are the table's), plus the secrets read from the controller's environment.
    #: Made by ``resolve``; frozen: a stage reads it, never changes it.
    Settings = make_dataclass(
        "Settings",
        [*(_field(key) for key in KEYS.values()),
         ("secrets", dict[str, str], field(default_factory=dict, repr=False)),
         ("router_key", str | None, field(default=None, repr=False))],
        namespace={"__doc__": "Resolved data for one host "
                              "(attributes = key names without changes).",
                   "__module__": __name__,
                   "served_model_name": property(_served_model_name),
                   "api_key": property(_api_key)},
        frozen=True, kw_only=True)


def _type_name(types: tuple[type, ...]) -> str:
    names = {str: "string", int: "integer", float: "number", bool: "true/false", dict: "mapping",
             list: "list", NONE: "null"}
    return " or ".join(names.get(t, t.__name__) for t in types)


def _check_type(key: Key, value: Any) -> None:
    ok = isinstance(value, key.types)
    if isinstance(value, bool) and bool not in key.types:
        ok = False  # bool is an int in Python: never accept True for a number
    if not ok:
        raise DataError(
            key=key.name,
            what=f"`{key.name}` must be {_type_name(key.types)}",
            found=f"{type(value).__name__} {value!r}",
            fix=f"set `{key.name}` in group_data/ or the inventory to a {_type_name(key.types)}",
        )
    if key.choices and value not in key.choices:
        raise DataError(key=key.name, what=f"`{key.name}` must be one of {', '.join(key.choices)}",
                        found=repr(value), fix=f"set `{key.name}` to one of {key.choices}")
    if key.minimum is not None and isinstance(value, (int, float)) and value < key.minimum:
        raise DataError(key=key.name, what=f"`{key.name}` must be >= {key.minimum}",
                        found=repr(value), fix=f"set `{key.name}` to a value >= {key.minimum}")


def unknown_keys(raw: dict[str, Any]) -> list[str]:
    return sorted(k for k in raw if k not in KEYS and not k.startswith(FOREIGN_PREFIXES))


def _typed_values(raw: dict[str, Any]) -> dict[str, Any]:
    """Every key's value (the raw one, else its default), each of the key's type."""
    for name in unknown_keys(raw):
        close = difflib.get_close_matches(name, KEYS, n=1)
        hint = f"did you mean `{close[0]}`?" if close else "see the data table in docs/data-keys.md"
        raise DataError(key=name, what="every data key must be one this tool knows",
                        found=f"unknown data key `{name}`", fix=f"remove or rename it: {hint}")
    values: dict[str, Any] = {}
    for key in KEYS.values():
        if key.name in raw:
            value = raw[key.name]
        elif key.required:
            raise DataError(key=key.name, what=f"`{key.name}` is required",
                            found="not set", fix=f"set `{key.name}` in group_data/ or the inventory")
        else:
            value = key.default
        if not (value is None and NONE in key.types):
            _check_type(key, value)
        values[key.name] = value
    return values


def resolve(raw: dict[str, Any], environ: Mapping[str, str]) -> Settings:
    """Check one host's merged data and return its Settings (raises DataError). ENVIRON: the
    controller's environment, where the secrets that ``*_env`` keys name are read."""
    values = _typed_values(raw)
    secrets = rules.check(RULES, values, environ, {k.name: k.default for k in KEYS.values()})
    router_key = secrets.pop("ROUTER_API_KEY", None)
    return Settings(**values, secrets=secrets, router_key=router_key)


def markdown_table() -> str:
    rows = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for key in KEYS.values():
        default = "(required)" if key.required else f"`{key.default!r}`"
        doc = key.doc.replace("|", "\\|")
        if isinstance(key.default, dict) and len(repr(key.default)) > 40:
            default = "see meaning"
            doc += " Default: " + ", ".join(f"{k} {v}" for k, v in key.default.items()) + "."
        rows.append(f"| `{key.name}` | {_type_name(key.types)} | {default} | {doc} |")
    return "\n".join(rows)
