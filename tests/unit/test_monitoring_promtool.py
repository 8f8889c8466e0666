"""The shipped Prometheus files through Prometheus's own tool (Debian's `prometheus`
package, scripts/setup.sh): the example configuration with targets from
`metrics-targets` (service discovery and relabelling really run), the alert rules, and
`promtool test rules` on synthetic series (tests/fixtures/monitoring/alerts_test.yml),
including that the rules' guard against a rollout's own drains is what keeps them quiet."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from sglang_deploy.core import metricnames
from sglang_deploy.core import metricstargets as mt

REPO = Path(__file__).resolve().parents[2]
MONITORING = metricnames.MONITORING
RULE_TESTS = REPO / "tests/fixtures/monitoring/alerts_test.yml"
GUARD = "\n          unless on(host) (sglang_deploy_lock_held == 1)"


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["promtool", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, check=False)


def test_the_example_config_discovers_the_targets_metrics_targets_writes(tmp_path):
    for name in ("prometheus.example.yml", "alerts.yml"):
        shutil.copy(MONITORING / name, tmp_path / name)
    groups, _ = mt.target_groups([
        mt.Host(name="gpu1", router=False, bind="10.0.0.11", port=30000,
                ssh_address="10.0.0.11", release="abc", model="glm-5",
                worker_url="http://10.0.0.11:30000", watchdog_port=9400),
        mt.Host(name="rt", router=True, bind="0.0.0.0", port=29000, ssh_address="10.0.0.10",
                release="smg1")])
    (tmp_path / "sglang-targets.json").write_text(json.dumps(groups))
    r = promtool("check", "config", "prometheus.example.yml", cwd=tmp_path)
    assert r.returncode == 0 and "SUCCESS: 7 rules found" in r.stdout, r.stdout + r.stderr
    # promtool reports what discovery found within --timeout (file_sd reads the file at once)
    r = promtool("check", "service-discovery", "--timeout=5s", "prometheus.example.yml",
                 "sglang-deploy", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    found = json.loads(r.stdout)
    labels = sorted((t["labels"]["component"], t["labels"]["instance"], t["labels"]["job"])
                    for t in found)
    assert labels == [("router", "10.0.0.10:29000", "sglang-deploy"),
                      ("server", "10.0.0.11:30000", "sglang-deploy"),
                      ("watchdog", "10.0.0.11:9400", "sglang-deploy")]
    server = next(t["labels"] for t in found if t["labels"]["component"] == "server")
    assert {k: server[k] for k in ("host", "group", "release", "model", "worker")} == {
        "host": "gpu1", "group": "gpu1", "release": "abc", "model": "glm-5",
        "worker": "http://10.0.0.11:30000"}


def test_the_rules_pass_promtools_check():
    r = promtool("check", "rules", str(MONITORING / "alerts.yml"))
    assert r.returncode == 0 and "SUCCESS: 7 rules found" in r.stdout, r.stdout + r.stderr


def test_the_rules_on_synthetic_series():
    r = promtool("test", "rules", str(RULE_TESTS))
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr


def test_without_the_deploy_lock_guard_a_rollouts_restart_would_alert(tmp_path):
    """The same synthetic series against the rules without their guard: the rollout's restart
    and drain cases fail, so the guard is what keeps the rules quiet there."""
    rules = (MONITORING / "alerts.yml").read_text()
    assert rules.count(GUARD) == 4
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules/alerts.yml").write_text(rules.replace(GUARD, ""))
    tests = RULE_TESTS.read_text().replace("../../../sglang_deploy/monitoring/alerts.yml",
                                           "rules/alerts.yml")
    (tmp_path / "alerts_test.yml").write_text(tests)
    r = promtool("test", "rules", "alerts_test.yml", cwd=tmp_path)
    assert r.returncode != 0, r.stdout + r.stderr
    assert "alertname: SGLangServerDown, time: 40m" in r.stdout + r.stderr
