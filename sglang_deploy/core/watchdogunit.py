"""The watchdog as the deploy installs it (pure): its files on the host, its configuration and
its hardened unit (``sglang-watchdog.service``, a long-running service that ticks every
``watchdog_interval_s``; ``remote/watchdog.py run``).

A long-running service rather than a timer: the judgement keeps a streak across ticks
(``state.json`` holds it across restarts too), a tick is seconds apart, and one python
process per host costs less than one started every 15 seconds.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sglang_deploy.core import service
from sglang_deploy.core.unit import _compiled, systemd_quote

if TYPE_CHECKING:
    from sglang_deploy.core.settingstype import Settings

TEMPLATE = Path(__file__).resolve().parent.parent.parent / "templates" / "sglang-watchdog.service.j2"

SERVICE = "sglang-watchdog"
UNIT_FILE = f"/etc/systemd/system/{SERVICE}.service"
CONFIG_DIR = "/etc/sglang-watchdog"
CONFIG_FILE = f"{CONFIG_DIR}/config.json"
STATE_NAME = SERVICE
STATE_DIR = f"/var/lib/{STATE_NAME}"
#: the host's GPU health report as the deploy judged it (``gpuhealth.Report.to_dict``): the
#: watchdog's ``sglang_deploy_gpu_health_fatal`` and its never-act-on-a-fatal-GPU read it
GPU_HEALTH_FILE = f"{CONFIG_DIR}/gpu-health.json"
#: the router's key, root only (0600) in the secrets folder (0700): only with mode restart
#: on a host behind a router whose key is set
ROUTER_KEY_FILE = f"{service.SECRETS_DIR}/watchdog-router.key"
LOCK_DIR = "/run/sglang-deploy"
LOCK_FILE = f"{LOCK_DIR}/lock"
#: the tools (ROOT/tools/NAME) and their source in this package (``remote/``, ``core/``)
TOOLS = (("watchdog.py", "remote/watchdog.py"), ("watchdog_judge.py", "core/watchdog.py"),
         ("watchdog_metrics.py", "remote/watchdog_metrics.py"))
#: data keys -> the watchdog's ``core.watchdog.Config`` fields
CONFIG_KEYS = {"watchdog": "mode", "watchdog_interval_s": "interval_s",
               "watchdog_probe_timeout_s": "probe_timeout_s",
               "watchdog_probe_failures": "probe_failures", "watchdog_stall_s": "stall_s",
               "watchdog_journal_silence_s": "journal_silence_s",
               "watchdog_max_restarts_per_hour": "max_restarts_per_hour",
               "watchdog_verify_timeout_s": "verify_timeout_s"}


def tool_paths(root: str) -> tuple[str, ...]:
    return tuple(f"{root}/tools/{name}" for name, _ in TOOLS)


def managed_paths(root: str) -> tuple[str, ...]:
    """The files the watchdog stage keeps (the host-state read reports them, so a converged
    host costs no round trip per file)."""
    return (*tool_paths(root), UNIT_FILE, CONFIG_FILE, GPU_HEALTH_FILE, ROUTER_KEY_FILE)


@dataclass(frozen=True)
class Placement:
    """Whether this host gets a watchdog, and what it watches (``placement``)."""

    install: bool
    group_nodes: int = 1       # nnodes of the group whose server it judges (1: a single host)
    group: str | None = None   # the group's name
    why: str = ""              # why none is installed (the operation's name says it)


def placement(mode: str, group_name: str | None, nnodes: int, rank: int | None) -> Placement:
    """Where a watchdog runs: on a single host; on a multi-node group's rank 0 only (it serves
    the group's API, so it judges the group's server; it never acts there: a group restarts as
    one, ``core.watchdog.decide``); none on a node of rank >= 1 (no API to probe: rank 0's
    watchdog judges the server they all make up). None anywhere with ``watchdog: off``."""
    if mode == "off":
        return Placement(False, why="watchdog: off")
    if group_name is None or nnodes <= 1:
        return Placement(True)
    if rank == 0:
        return Placement(True, group_nodes=nnodes, group=group_name)
    return Placement(False, group_nodes=nnodes, group=group_name,
                     why=f"node {rank} of group {group_name}: rank 0's watchdog judges the group")


@dataclass(frozen=True)
class Router:
    """The router in front of this host, as the watchdog reaches it."""

    url: str
    worker_url: str
    key: str | None = None


def config(settings: Settings, host_name: str, group_nodes: int = 1,
           router: Router | None = None, group: str | None = None) -> dict[str, Any]:
    """The watchdog's configuration (``config.json``: no secret in it) from the host's data.
    On a group's rank 0 (GROUP_NODES > 1) it never acts, so it gets no router."""
    s, lay = settings, service.Layout.of(settings)
    doc = {field: getattr(s, key) for key, field in CONFIG_KEYS.items()}
    doc.update({
        "host": service.probe_address(s.sglang_host), "port": s.sglang_port,
        "service": s.sglang_service, "served_model_name": s.served_model_name,
        "host_name": host_name, "group_nodes": group_nodes, "group": group,
        "state_dir": STATE_DIR,
        "last_verified": lay.last_verified, "lock_file": LOCK_FILE,
        "gpu_health_file": GPU_HEALTH_FILE,
        # /metrics bound as the server's API is (loopback unless the operator exposes it)
        "metrics_host": s.sglang_host, "metrics_port": s.watchdog_metrics_port,
        "router_url": None, "worker_url": None})
    if router is not None and s.watchdog == "restart" and group_nodes <= 1:
        doc.update({"router_url": router.url, "worker_url": router.worker_url})
    return doc


def config_text(doc: dict[str, Any]) -> str:
    return json.dumps(doc, sort_keys=True, indent=1) + "\n"


def gpu_health_text(report: dict[str, Any] | None) -> str:
    """``GPU_HEALTH_FILE``: the deploy's GPU health report of this host (its verdict and
    findings; no time in it, so a host whose health did not change gets no change)."""
    doc = report or {}
    return json.dumps({"verdict": doc.get("verdict") or "unknown",
                       "findings": list(doc.get("findings") or [])}, sort_keys=True, indent=1) + "\n"


def router_key(settings: Settings, router: Router | None) -> str | None:
    """The router key the watchdog gets as a credential: only when it acts (mode restart)
    through a router that has a key."""
    if settings.watchdog != "restart" or router is None:
        return None
    return router.key


def render_unit(settings: Settings, with_router_key: bool) -> str:
    s = settings
    root = s.sglang_root
    argv = [s.sglang_system_python, f"{root}/tools/watchdog.py", "run", "--config", CONFIG_FILE]
    credentials = [("server-secrets", service.SECRETS_FILE)]
    if with_router_key:
        credentials.append(("router-key", ROUTER_KEY_FILE))
    return _compiled(TEMPLATE.read_text()).render(
        mode=s.watchdog, service=s.sglang_service, lock_dir=LOCK_DIR,
        exec_start=" ".join(systemd_quote(a) for a in argv), credentials=credentials,
        state_name=STATE_NAME, writable_paths=(LOCK_DIR, root))
