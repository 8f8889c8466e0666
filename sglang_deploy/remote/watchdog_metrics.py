"""The watchdog's Prometheus metrics (stdlib only; shipped beside ``watchdog.py``, which
serves them from its ``run`` process when ``metrics_port`` is set).

``GET /metrics`` on ``metrics_host`` (the server's bind) : ``metrics_port``, Prometheus text
format, read at each scrape: its restarts (``state.json``), the host's GPU health as the last
deploy judged it (``gpu_health_file``) and whether the deploy lock is held (``METRICS``).
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOCK_FILE = "/run/sglang-deploy/lock"


def load_json(path: str, default=None):
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return default


def gpu_report(cfg: dict) -> dict:
    """The host's GPU health report as the last deploy recorded it (``core.gpuhealth``'s
    ``Report.to_dict``: ``verdict``, ``findings``); {} when there is none."""
    doc = load_json(cfg.get("gpu_health_file") or "", {})
    return doc if isinstance(doc, dict) else {}


def lock_held(lock_file: str) -> float | None:
    """1: someone holds the deploy lock (a non-blocking try fails); 0: free, or no lock folder
    (nothing ever took it since boot); None: the lock file cannot be opened."""
    if not os.path.isdir(os.path.dirname(lock_file)):
        return 0.0
    try:
        fh = open(lock_file, "a")  # noqa: SIM115 (closed below: closing frees the flock)
    except OSError:
        return None
    with fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return 1.0
    return 0.0


#: what ``/metrics`` serves: name -> (type, help). The contract is the controller's
#: ``core/metricnames.WATCHDOG`` (a unit test holds the two equal).
METRICS = {
    "sglang_deploy_watchdog_restarts_total":
        ("counter", "Restarts of the server the watchdog made on this host."),
    "sglang_deploy_gpu_health_fatal":
        ("gauge", ("1 when the host's GPU health (as the last deploy judged it) is fatal, "
                   "0 when not; absent when nvidia-smi could not be read.")),
    "sglang_deploy_lock_held":
        ("gauge", ("1 while a deploy, rollout, rebuild or the watchdog's own restart holds "
                   "the host's deploy lock, else 0.")),
}


def gpu_fatal_value(report: dict) -> float | None:
    """1: the report judges the host fatal; 0: it does not, and nvidia-smi was read; None
    (no sample): no report, or nvidia-smi itself unread (``query-failed``, a field unreadable).
    A kernel log an unprivileged container may not read (``unknown`` for that source only)
    does not hide what nvidia-smi said."""
    findings = [f for f in report.get("findings") or [] if isinstance(f, dict)]
    if report.get("verdict") == "fatal" or any(f.get("severity") == "fatal" for f in findings):
        return 1.0
    if not report or report.get("verdict") in (None, "") or any(
            f.get("severity") == "unknown" and f.get("source") == "nvidia-smi" for f in findings):
        return None
    return 0.0


def metrics_text(cfg: dict) -> str:
    """The watchdog's metrics now, read at each scrape (state.json, the GPU report, the lock):
    a sample left out is one the watchdog cannot read (never a healthy 0)."""
    saved = load_json(os.path.join(cfg["state_dir"], "state.json"), {}) or {}
    values: dict[str, float | None] = {
        "sglang_deploy_watchdog_restarts_total": float(saved.get("restarts_total") or 0)}
    values["sglang_deploy_gpu_health_fatal"] = gpu_fatal_value(gpu_report(cfg))
    values["sglang_deploy_lock_held"] = lock_held(cfg.get("lock_file", LOCK_FILE))
    lines = []
    for name, (kind, text) in METRICS.items():
        lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}"]
        if values.get(name) is not None:
            lines.append(f"{name} {values[name]:g}")
    return "\n".join(lines) + "\n"


def metrics_server(cfg: dict) -> ThreadingHTTPServer | None:
    """``/metrics`` on ``metrics_host``:``metrics_port``, served from a daemon thread (None
    when ``metrics_port`` is null)."""
    port = cfg.get("metrics_port")
    if not port:
        return None

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # scrapes are not news
            pass

        def do_GET(self):
            if self.path.split("?", 1)[0] != "/metrics":
                body, status, ctype = b"not found: GET /metrics\n", 404, "text/plain"
            else:
                try:
                    body, status = metrics_text(cfg).encode(), 200
                except OSError as exc:
                    body, status = f"cannot read the state: {exc}\n".encode(), 500
                ctype = "text/plain; version=0.0.4; charset=utf-8"
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    host = cfg.get("metrics_host") or "127.0.0.1"
    cls = type("Server", (ThreadingHTTPServer,), {
        "daemon_threads": True,
        "address_family": socket.AF_INET6 if ":" in host else socket.AF_INET})
    srv = cls((host, int(port)), Handler)
    threading.Thread(target=srv.serve_forever, name="metrics", daemon=True).start()
    return srv
