"""The host's watchdog script (remote/watchdog.py) against a wedged stand-in server on
loopback: the wedge is recorded with its evidence, and the never-act conditions hold
(deploy lock held, never verified, report mode). No restart is attempted here."""

from __future__ import annotations

import fcntl
import importlib.util
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _tool():
    spec = importlib.util.spec_from_file_location("watchdog_tool", ROOT / "sglang_deploy" / "remote" / "watchdog.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def wedged():
    """/health 200, /metrics: 2 requests running and a counter that never moves, /generate
    hangs until the test ends."""
    release = threading.Event()

    class H(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def _send(self, status, body=b""):
            self.send_response(status)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            if self.path == "/health":
                return self._send(200)
            if self.path == "/metrics":
                return self._send(200, b'sglang:num_running_reqs{tp_rank="0"} 2.0\n'
                                       b'sglang:num_queue_reqs{tp_rank="0"} 0.0\n'
                                       b'sglang:generation_tokens_total{tp_rank="0"} 500.0\n')
            return self._send(404)

        def do_POST(self):
            release.wait(30)
            try:
                self._send(200, b"{}")
            except OSError:  # the probe gave up long ago
                pass

    ThreadingHTTPServer.daemon_threads = True
    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv.server_address[1]
    release.set()
    srv.shutdown()
    srv.server_close()


def _cfg(tmp_path, port, **kw):
    return {"host": "127.0.0.1", "port": port, "service": "sglang-test-none", "mode": "restart",
            "probe_timeout_s": 0.2, "probe_failures": 2, "stall_s": 3600,
            "state_dir": str(tmp_path / "state"), "lock_file": str(tmp_path / "run" / "lock"),
            "last_verified": str(tmp_path / "last-verified.json"), "host_name": "h1", **kw}


def _ticks(tool, cfg, n):
    return [tool.tick(cfg) for _ in range(n)]


def test_a_wedge_while_the_deploy_lock_is_held_is_reported_not_restarted(tmp_path, wedged):
    tool = _tool()
    cfg = _cfg(tmp_path, wedged)
    (tmp_path / "run").mkdir()
    with open(tmp_path / "run" / "lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        (tmp_path / "run" / "owner.json").write_text(json.dumps(
            {"user": "ops", "controller": "laptop", "command": "sglang-deploy rollout"}))
        events = _ticks(tool, cfg, 2)
    assert events[0] is None
    ev = events[1]
    assert ev["verdict"] == "wedged" and ev["action"] == "report"
    assert "deploy lock is held (ops@laptop `sglang-deploy rollout`)" in ev["reason"]
    assert any("failed 2 time(s)" in e for e in ev["evidence"])
    recorded = [json.loads(x) for x in (tmp_path / "state" / "events.jsonl").read_text().splitlines()]
    assert recorded == [ev]
    state = json.loads((tmp_path / "state" / "state.json").read_text())
    assert state["busy"] == 2 and state["tokens"] == 500.0


def test_a_server_never_verified_is_left_alone(tmp_path, wedged):
    tool = _tool()
    ev = _ticks(tool, _cfg(tmp_path, wedged), 2)[1]
    assert ev["action"] == "report" and "never verified" in ev["reason"]
    assert not (tmp_path / "run" / "owner.json").exists()  # the lock was only tried, not kept


def test_report_mode_reports_with_evidence(tmp_path, wedged):
    tool = _tool()
    ev = _ticks(tool, _cfg(tmp_path, wedged, mode="report"), 2)[1]
    assert ev["action"] == "report" and ev["outcome"] == "reported"
    assert ev["reason"] == "watchdog=report: reported only"


def test_a_router_that_does_not_answer_does_not_stop_the_restart(tmp_path, wedged):
    """The router is down (its port closed): the host is restarted without being taken out
    of it, and not put back (the router still lists it and checks it itself). What the
    restart ends is counted first: the wedged server's 2 requests in flight."""
    import socket

    tool = _tool()
    with socket.socket() as s:  # a free port, closed again: connection refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    a = tool.Acting({"router_url": f"http://127.0.0.1:{port}", "host": "127.0.0.1",
                     "port": wedged, "worker_url": "http://127.0.0.1:30000"},
                    tool.wj.Config(), None)
    a.out_of_router()
    assert a.in_flight == {"server": 2}
    assert a.router is None
    assert "the router does not answer" in a.steps[0] and "restarting without" in a.steps[0]
    a.back_in_router()  # nothing to do: no second wait on a router that is down
    assert len(a.steps) == 1


# ------------------------------------------------------------------ metrics


def _scrape(port: int, path: str = "/metrics") -> tuple[int, str]:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _series(text: str) -> dict[str, float]:
    return {line.split()[0]: float(line.split()[1]) for line in text.splitlines()
            if line and not line.startswith("#")}


@pytest.fixture
def served(tmp_path):
    import socket

    tool = _tool()
    cfg = _cfg(tmp_path, 1, metrics_host="127.0.0.1", metrics_port=None,
               gpu_health_file=str(tmp_path / "gpu-health.json"))
    assert tool.metrics_server(cfg) is None  # null: nothing served
    (tmp_path / "state").mkdir()

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        cfg["metrics_port"] = s.getsockname()[1]
    server = tool.metrics_server(cfg)
    yield tool, cfg, server.server_address[1]
    server.shutdown()
    server.server_close()


def test_served_names_are_the_contract(served):
    from sglang_deploy.core import metricnames

    _, cfg, port = served
    (Path(cfg["gpu_health_file"])).write_text(json.dumps({"verdict": "healthy", "findings": []}))
    status, text = _scrape(port)
    assert status == 200
    declared = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}
    assert declared == set(metricnames.WATCHDOG) == set(_series(text))
    kinds = {line.split()[2]: line.split()[3] for line in text.splitlines() if line.startswith("# TYPE ")}
    assert {n: k for n, k in kinds.items()} == {
        n: metricnames.WATCHDOG[n].split(":", 1)[0] for n in metricnames.WATCHDOG}
    assert _scrape(port, "/other")[0] == 404


def test_metrics_read_the_restarts_the_gpu_report_and_the_lock(served):
    _, cfg, port = served
    state = Path(cfg["state_dir"]) / "state.json"
    state.write_text(json.dumps({"restarts_total": 3}))
    Path(cfg["gpu_health_file"]).write_text(json.dumps(
        {"verdict": "fatal", "findings": [{"severity": "fatal", "code": "gpu-lost"}]}))
    got = _series(_scrape(port)[1])
    assert got == {"sglang_deploy_watchdog_restarts_total": 3.0,
                   "sglang_deploy_gpu_health_fatal": 1.0, "sglang_deploy_lock_held": 0.0}
    Path(cfg["lock_file"]).parent.mkdir(exist_ok=True)
    with open(cfg["lock_file"], "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert _series(_scrape(port)[1])["sglang_deploy_lock_held"] == 1.0
    assert _series(_scrape(port)[1])["sglang_deploy_lock_held"] == 0.0


QUERY_FAILED = {"code": "query-failed", "source": "nvidia-smi", "severity": "unknown"}
KERNEL_UNREADABLE = {"code": "kernel-log-unreadable", "source": "kernel-log", "severity": "unknown"}


@pytest.mark.parametrize("doc", [None, {"verdict": "unknown", "findings": [QUERY_FAILED]},
                                 {"verdict": "unknown", "findings": [QUERY_FAILED, KERNEL_UNREADABLE]},
                                 {}])
def test_an_unknown_gpu_health_is_no_sample_never_a_healthy_0(served, doc):
    _, cfg, port = served
    if doc is not None:
        Path(cfg["gpu_health_file"]).write_text(json.dumps(doc))
    status, text = _scrape(port)
    assert status == 200 and "# TYPE sglang_deploy_gpu_health_fatal gauge" in text
    assert "sglang_deploy_gpu_health_fatal" not in _series(text)


def test_a_restart_counts_and_a_report_does_not(tmp_path, wedged):
    tool = _tool()
    cfg = _cfg(tmp_path, wedged, mode="report")
    _ticks(tool, cfg, 3)
    assert json.loads((tmp_path / "state" / "state.json").read_text())["restarts_total"] == 0


@pytest.mark.parametrize(("doc", "want"), [
    ({"verdict": "unknown", "findings": [KERNEL_UNREADABLE]}, 0.0),  # an LXC guest's dmesg
    ({"verdict": "warning", "findings": [{"code": "remap-pending", "source": "nvidia-smi",
                                          "severity": "warning"}]}, 0.0),
    ({"verdict": "unknown", "findings": [KERNEL_UNREADABLE, {
        "code": "gpu-lost", "source": "nvidia-smi", "severity": "fatal"}]}, 1.0),
])
def test_the_gpu_gauge_says_what_nvidia_smi_said(served, doc, want):
    _, cfg, port = served
    Path(cfg["gpu_health_file"]).write_text(json.dumps(doc))
    assert _series(_scrape(port)[1])["sglang_deploy_gpu_health_fatal"] == want
