"""Prometheus for real: the servers' and the router's metrics scraped on the testbed.

One serving host and the router host (`python -m testbed up --hosts 1 --router`; the router
host is removed when the module ends), deployed with the router's metrics on the router's
address (`router_prometheus_host=0.0.0.0`: they bind loopback by default), and the watchdog
(`watchdog=report`) serving its metrics on `watchdog_metrics_port`. Then
`sglang-deploy metrics-targets` writes the file_sd JSON, Debian's `prometheus` (started here
on 127.0.0.1, with the shipped example configuration and alert rules) scrapes it, and the
test asks Prometheus's own API: every target up, with its labels; every metric name of the
dashboard and the rules that SGLang and SMG serve present in what was scraped; the router's
`smg_worker_health{worker}` joined with the server's `worker` label (the host-out-of-router
rule's join); the rules loaded and healthy, none firing.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from sglang_deploy.core import metricnames

from .helpers import BIN, REPO, run_testbed

PYINFRA = str(BIN / "pyinfra")
#: the watchdog on (report: it acts on nothing here) with its metrics on WATCHDOG_PORT
WATCHDOG_PORT = 9400
DATA = ["router_prometheus_host=0.0.0.0", "gpu_p2p_min_gbps=0.05", "watchdog=report",
        f"watchdog_metrics_port={WATCHDOG_PORT}"]
#: deadline for Prometheus to see every target up (scrapes every second)
UP_DEADLINE_S = 120


def _data_args() -> list[str]:
    return [a for d in DATA for a in ("--data", d)]


@pytest.fixture(scope="module")
def routed_one(testbed):
    """One server and the router host, deployed; the router host goes when the module ends."""
    try:
        run_testbed("up", "--hosts", "1", "--router", timeout=900)
        testbed.reload()
        r = subprocess.run([PYINFRA, "-y", str(testbed.inventory), "deploy.py", *_data_args()],
                           cwd=REPO, capture_output=True, text=True, timeout=1800, check=False)
        testbed.log.append(r)
        assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
        yield testbed
    finally:
        run_testbed("down", "--router", timeout=300, check=False)
        testbed.reload()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _api(base: str, path: str, **params) -> dict:
    url = f"{base}{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
    with urllib.request.urlopen(url, timeout=10) as resp:
        doc = json.loads(resp.read())
    assert doc.get("status") == "success", doc
    return doc["data"]


@pytest.fixture
def prometheus(tmp_path):
    """start(targets_file) -> the API base URL of a Prometheus scraping every second."""
    procs = []

    def start(targets: Path) -> str:
        conf = yaml.safe_load((metricnames.MONITORING / "prometheus.example.yml").read_text())
        conf["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
        conf["scrape_configs"][0]["scrape_timeout"] = "1s"
        conf["scrape_configs"][0]["file_sd_configs"] = [{"files": [str(targets)]}]
        shutil.copy(metricnames.RULES_FILE, tmp_path / "alerts.yml")
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(conf))
        check = subprocess.run(["promtool", "check", "config", "prometheus.yml"], cwd=tmp_path,
                               capture_output=True, text=True, timeout=60, check=False)
        assert check.returncode == 0, check.stdout + check.stderr
        port = _free_port()
        log = (tmp_path / "prometheus.log").open("w")
        procs.append(subprocess.Popen(
            ["prometheus", "--config.file=prometheus.yml", f"--storage.tsdb.path={tmp_path}/tsdb",
             f"--web.listen-address=127.0.0.1:{port}"], cwd=tmp_path, stdout=log, stderr=log))
        return f"http://127.0.0.1:{port}"

    yield start
    for p in procs:
        p.terminate()
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _wait_all_up(base: str, want: int) -> list[dict]:
    """Prometheus's active targets once WANT of them are up."""
    def probe():
        try:
            active = _api(base, "/api/v1/targets")["activeTargets"]
        except OSError as exc:  # not listening yet
            return False, repr(exc)
        return len(active) == want and all(t["health"] == "up" for t in active), active

    return _poll(f"{want} targets up", probe)


def _poll(what: str, probe, deadline_s: float = UP_DEADLINE_S):
    """PROBE() until it returns (ok, observation) with ok true; the last observation at the
    deadline fails the test."""
    deadline, last = time.monotonic() + deadline_s, None
    while time.monotonic() < deadline:
        ok, last = probe()
        if ok:
            return last
        time.sleep(0.5)
    raise AssertionError(f"{what}: not within {deadline_s} s; last seen: {last}")


def _scraping(testbed, prometheus, tmp_path) -> tuple[str, dict, dict]:
    """metrics-targets, then Prometheus scraping its file with every target up: (API base,
    the server host, the router host) of the testbed state."""
    st = testbed.state
    server = next(h for h in st["hosts"] if h.get("role") != "router")
    router = next(h for h in st["hosts"] if h.get("role") == "router")
    targets = tmp_path / "sglang-targets.json"
    r = subprocess.run([str(BIN / "sglang-deploy"), "metrics-targets", str(testbed.inventory),
                        "--out", str(targets), *_data_args(),
                        # the server and the router this test scrapes (the suite's testbed
                        # may hold more servers: metrics-targets' unit tests cover several)
                        "--limit", server["name"], "--limit", router["name"]],
                       cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    groups = json.loads(targets.read_text())
    release = testbed.ssh(server["name"], "readlink /opt/sglang/current",
                          check=True).stdout.strip().rsplit("/", 1)[-1]
    assert sorted((g["targets"][0], g["labels"]["component"]) for g in groups) == sorted([
        (f"{server['address']}:30000", "server"), (f"{router['address']}:29000", "router"),
        (f"{server['address']}:{WATCHDOG_PORT}", "watchdog")])
    srv = next(g["labels"] for g in groups if g["labels"]["component"] == "server")
    assert srv["release"] == release and srv["worker"] == _worker(server) and srv["model"]
    base = prometheus(targets)
    active = _wait_all_up(base, want=3)
    assert {t["labels"]["component"]: t["labels"]["host"] for t in active} == {
        "server": server["name"], "router": router["name"], "watchdog": server["name"]}
    return base, server, router


def _worker(server: dict) -> str:
    return f"http://{server['address']}:30000"


def _query(base: str, expr: str) -> list[dict]:
    return _api(base, "/api/v1/query", query=expr)["result"]


#: the host-out-of-router rule's condition (without its `for:`)
OUT_OF_ROUTER = 'up{component="server", worker!=""} == 1 unless on(worker) (smg_worker_health == 1)'
IN_ROUTER = 'up{component="server"} == 1 and on(worker) (smg_worker_health == 1)'


def test_prometheus_scrapes_every_target_of_metrics_targets(routed_one, prometheus, tmp_path):
    st = routed_one.state
    router = next(h for h in st["hosts"] if h.get("role") == "router")
    # one generation through the router first, so that its request counter exists
    key = (Path(st["state_dir"]) / "router-key").read_text().strip()
    req = urllib.request.Request(
        f"http://{router['address']}:30000/generate",
        data=json.dumps({"text": "hi", "sampling_params": {"max_new_tokens": 2}}).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        assert resp.status == 200
    base, server, _ = _scraping(routed_one, prometheus, tmp_path)

    # every name of the dashboard and the rules is in what was scraped: SGLang's, SMG's and
    # the watchdog's
    used = {u.name for u in metricnames.shipped_uses()}
    assert used & set(metricnames.WATCHDOG) == set(metricnames.WATCHDOG)

    def scraped():
        missing = used - set(_api(base, "/api/v1/label/__name__/values"))
        return not missing, sorted(missing)

    _poll("every SGLang, SMG and watchdog name of the dashboard and rules scraped", scraped)
    # the watchdog's values, labelled with the server's host (the rules join on(host))
    got = {x["metric"]["__name__"]: (x["metric"]["host"], x["value"][1]) for x in _query(
        base, '{component="watchdog"}') if x["metric"]["__name__"] in metricnames.WATCHDOG}
    assert got == {"sglang_deploy_watchdog_restarts_total": (server["name"], "0"),
                   "sglang_deploy_gpu_health_fatal": (server["name"], "0"),
                   "sglang_deploy_lock_held": (server["name"], "0")}, got

    # the router's view of the worker joins the server's `worker` label, healthy
    joined = _query(base, IN_ROUTER)
    assert [x["metric"]["host"] for x in joined] == [server["name"]], joined
    assert _query(base, OUT_OF_ROUTER) == []

    rules = [r for g in _api(base, "/api/v1/rules")["groups"] for r in g["rules"]]
    assert len(rules) == 7 and all(r["health"] == "ok" for r in rules), rules
    # none pending or firing once the rules were evaluated on every target's scrape (a rule
    # evaluated between the server's first scrape and the router's holds a moment: an alert
    # whose condition really holds stays pending for its `for:`, and fails this wait)
    _poll("no alert pending or firing", lambda: (
        not (got := _api(base, "/api/v1/alerts")["alerts"]), got), deadline_s=30)


def test_a_host_drained_out_of_the_router_reads_as_out_of_it(routed_one, prometheus, tmp_path):
    """The rollout's own drain (controller.routerctl, DELETE /workers/ID on the real SMG): the
    router no longer reads smg_worker_health == 1 for the worker, so the out-of-router condition
    holds for that host until it is put back (the rule's `for:` and the deploy-lock guard
    keep a rollout's drain from firing it: tests/fixtures/monitoring/alerts_test.yml)."""
    from sglang_deploy.controller import routerctl

    base, server, _ = _scraping(routed_one, prometheus, tmp_path)
    _poll("the worker healthy in the router", lambda: (
        bool(got := _query(base, IN_ROUTER)), got))
    router = routerctl.routers(str(routed_one.inventory), cwd=str(REPO), data=DATA)[0]
    router.drain(server["name"])
    health = f'smg_worker_health{{worker="{_worker(server)}"}}'

    def out_of_router():
        got = _query(base, OUT_OF_ROUTER)
        hosts = [x["metric"].get("host") for x in got]
        return hosts == [server["name"]], {"out": got, "router's series": _query(base, health)}

    try:
        seen = _poll("the drained host out of the router in Prometheus", out_of_router)
        assert seen["out"][0]["metric"]["worker"] == _worker(server)
    finally:
        router.put_back(server["name"])
    _poll("the host back in the router", lambda: (not (got := _query(base, OUT_OF_ROUTER)), got))
