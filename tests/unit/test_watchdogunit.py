"""The watchdog as the deploy installs it: configuration and hardened unit (pure)."""

import json

import pytest

from sglang_deploy.core import data as datamod
from sglang_deploy.core import watchdog as wj
from sglang_deploy.core import watchdogunit as wu

KEY = "s3cr3t-router-key"


def settings(**over):
    raw = {"sglang_model_path": "/srv/models/m", "sglang_host": "0.0.0.0",
           "sglang_api_key_env": "K", "router_api_key_env": "RK", **over}
    return datamod.resolve(raw, {"K": "server-key", "RK": KEY})


ROUTER = wu.Router(url="http://10.0.0.2:30000", worker_url="http://10.0.0.5:30000", key=KEY)


def test_data_keys_reach_the_judge_config():
    s = settings(watchdog="restart", watchdog_probe_failures=5, watchdog_stall_s=60)
    cfg = wj.Config.from_dict(wu.config(s, "h1"))
    assert (cfg.mode, cfg.probe_failures, cfg.stall_s) == ("restart", 5, 60)
    assert cfg.max_restarts_per_hour == datamod.KEYS["watchdog_max_restarts_per_hour"].default


def test_config_names_where_the_watchdog_probes_and_keeps_state():
    doc = wu.config(settings(), "h1", group_nodes=2)
    assert doc["host"] == "127.0.0.1"  # a wildcard bind answers on loopback
    assert doc["port"] == 30000 and doc["service"] == "sglang" and doc["host_name"] == "h1"
    assert doc["group_nodes"] == 2 and doc["state_dir"] == wu.STATE_DIR
    assert doc["last_verified"] == "/opt/sglang/last-verified.json"
    assert doc["lock_file"] == "/run/sglang-deploy/lock"


@pytest.mark.parametrize("mode", ["report", "restart"])
def test_no_secret_in_the_config(mode):
    text = wu.config_text(wu.config(settings(watchdog=mode), "h1", router=ROUTER))
    assert KEY not in text and "server-key" not in text
    json.loads(text)


def test_router_only_when_the_watchdog_acts():
    report = wu.config(settings(watchdog="report"), "h1", router=ROUTER)
    assert report["router_url"] is None and wu.router_key(settings(watchdog="report"), ROUTER) is None
    restart = wu.config(settings(watchdog="restart"), "h1", router=ROUTER)
    assert restart["router_url"] == ROUTER.url and restart["worker_url"] == ROUTER.worker_url
    assert wu.router_key(settings(watchdog="restart"), ROUTER) == KEY
    assert wu.router_key(settings(watchdog="restart"), None) is None


def test_unit_loads_secrets_as_credentials_only():
    unit = wu.render_unit(settings(watchdog="restart"), with_router_key=True)
    assert "LoadCredential=server-secrets:/etc/sglang/secrets.env" in unit
    assert f"LoadCredential=router-key:{wu.ROUTER_KEY_FILE}" in unit
    assert "EnvironmentFile" not in unit and KEY not in unit and "server-key" not in unit
    without = wu.render_unit(settings(), with_router_key=False)
    assert "router-key" not in without and "LoadCredential=server-secrets" in without


def test_unit_runs_the_shipped_tool_as_a_long_running_hardened_service():
    unit = wu.render_unit(settings(), with_router_key=False)
    assert "ExecStart=/usr/bin/python3 /opt/sglang/tools/watchdog.py run --config " \
           f"{wu.CONFIG_FILE}" in unit
    for line in ("Restart=always", "NoNewPrivileges=yes", "ProtectSystem=strict",
                 "ProtectHome=yes", "CapabilityBoundingSet=", "MemoryDenyWriteExecute=yes",
                 "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6", "DevicePolicy=closed",
                 "ReadWritePaths=/run/sglang-deploy /opt/sglang",
                 f"StateDirectory={wu.STATE_NAME}"):
        assert line in unit.splitlines(), line
    assert unit == wu.render_unit(settings(), with_router_key=False)  # deterministic


def test_managed_paths_are_the_files_it_ships():
    paths = wu.managed_paths("/opt/sglang")
    assert "/opt/sglang/tools/watchdog.py" in paths and "/opt/sglang/tools/watchdog_judge.py" in paths
    assert wu.UNIT_FILE in paths and wu.CONFIG_FILE in paths


def test_bad_mode_is_a_data_error():
    with pytest.raises(datamod.DataError, match="watchdog"):
        settings(watchdog="sometimes")


def test_metrics_are_bound_as_the_server_and_off_without_a_port():
    assert wu.config(settings(), "h1")["metrics_port"] is None
    doc = wu.config(settings(sglang_host="10.0.0.5", watchdog_metrics_port=9400), "h1")
    assert (doc["metrics_host"], doc["metrics_port"]) == ("10.0.0.5", 9400)
    assert wu.config(settings(sglang_host="127.0.0.1", watchdog_metrics_port=9400),
                     "h1")["metrics_host"] == "127.0.0.1"
    assert doc["gpu_health_file"] == wu.GPU_HEALTH_FILE in wu.managed_paths("/opt/sglang")


def test_the_gpu_health_file_keeps_the_verdict_and_findings_only():
    report = {"verdict": "fatal", "findings": [{"code": "gpu-lost", "severity": "fatal"}],
              "notes": ["n"], "gpus": 8}
    assert json.loads(wu.gpu_health_text(report)) == {"verdict": "fatal",
                                                     "findings": report["findings"]}
    assert json.loads(wu.gpu_health_text(None))["verdict"] == "unknown"


@pytest.mark.parametrize("mode, group, nnodes, rank, install, nodes", [
    ("report", None, 1, None, True, 1),      # a single host
    ("restart", "g", 2, 0, True, 2),         # a group's rank 0: judges the group's server
    ("restart", "g", 3, 2, False, 3),        # rank >= 1: no API to probe
    ("restart", "g", 2, 1, False, 2),
    ("off", None, 1, None, False, 1),
    ("off", "g", 2, 0, False, 1),
])
def test_placement_a_single_host_and_a_groups_rank_0_only(mode, group, nnodes, rank, install, nodes):
    where = wu.placement(mode, group, nnodes, rank)
    assert (where.install, where.group_nodes) == (install, nodes), where
    if not install:
        assert where.why  # the removal operation names why
    if rank:
        assert f"node {rank} of group {group}" in where.why


def test_a_groups_rank_0_gets_no_router_and_never_acts():
    """On rank 0 the watchdog only reports: no router in its config (nor a key), the group named."""
    s = settings(watchdog="restart")
    doc = wu.config(s, "h1", group_nodes=2, router=ROUTER, group="g1")
    assert doc["router_url"] is None and doc["worker_url"] is None
    assert (doc["group"], doc["group_nodes"]) == ("g1", 2)
    assert wj.decide(wj.Verdict("wedged"), wj.Config.from_dict(doc),
                     wj.Context(group_nodes=doc["group_nodes"]), 0).kind == "report"
    assert wu.config(s, "h1", router=ROUTER)["router_url"] == ROUTER.url  # a single host acts
