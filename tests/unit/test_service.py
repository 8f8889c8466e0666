"""The service decisions (sglang_deploy.core.service), table by table: layout, launch command,
environment, restarts, servers no deploy verified, verifier parameters, rollback."""

import pytest

from sglang_deploy.core import data, service
from sglang_deploy.core import flags as flagmod
from sglang_deploy.core.errors import DataError, RollbackError
from sglang_deploy.core.hoststate import HostState
from sglang_deploy.core.service import Layout

BASE = {"sglang_model_path": "/srv/models/m", "_sudo": False}


def settings(**over):
    return data.resolve({**BASE, **over}, environ={"KEY": "s3cret"})


# ---- layout --------------------------------------------------------------------------------

def test_layout_defines_every_path_once_from_the_data():
    lay = Layout.of(settings(sglang_root="/opt/x", sglang_service="llm",
                             sglang_cache_dir="/var/cache/x"))
    assert lay.unit_file == "/etc/systemd/system/llm.service"
    assert lay.secrets_file == "/etc/sglang/secrets.env"
    assert lay.release_dir("abc") == "/opt/x/releases/abc"
    assert lay.venv_python("abc") == "/opt/x/releases/abc/venv/bin/python"
    assert lay.site("abc", "3.11") == "/opt/x/releases/abc/venv/lib/python3.11/site-packages"
    assert lay.release_lock("abc") == "/opt/x/releases/abc/requirements.lock"
    assert lay.patch_record("abc") == "/opt/x/releases/abc/autotune-patch.json"
    assert (lay.known_good(), lay.known_good(promote=False)) == \
        ("/opt/x/known-good", "/opt/x/known-good.candidate")
    assert lay.tool("launch.py") == "/opt/x/tools/launch.py"
    assert (lay.current, lay.p2p_record, lay.last_verified) == \
        ("/opt/x/current", "/opt/x/p2p-verified.json", "/opt/x/last-verified.json")


def test_layout_folders_owners_and_modes():
    lay = Layout.of(settings(sglang_user="svc", sglang_home="/var/lib/svc"))
    folders = {p: (o, m) for p, o, m in lay.folders()}
    assert folders["/etc/sglang"] == ("root", "700")       # secrets: root only
    assert folders["/var/cache/sglang"] == ("svc", "750")  # the service writes its caches
    assert folders["/var/lib/svc"] == ("svc", "750")
    assert folders["/opt/sglang/uv-cache"] == ("root", "700")


def test_state_paths_cover_folders_tools_and_the_release_files():
    lay = Layout.of(settings())
    paths = lay.state_paths("r1")
    assert set(p for p, _, _ in lay.folders()) <= set(paths)
    assert {lay.tool(t) for t in service.TOOLS} <= set(paths)
    assert {lay.release_lock("r1"), lay.unit_file, lay.current, lay.p2p_record} <= set(paths)


# ---- release -------------------------------------------------------------------------------

LOCK = "sglang==0.5.12.post1 \\\n    --hash=sha256:" + "a" * 64 + "\n"


@pytest.mark.parametrize("text, error", [
    (LOCK, None),
    ("torch==2.9.1 --hash=sha256:" + "a" * 64 + "\n", "no sglang pin"),
    ("sglang==0.5.12.post1\n", "sglang has none"),
])
def test_release_of_lock(text, error):
    if error:
        with pytest.raises(DataError, match=error):
            service.release_of_lock(text, "locks/x.txt")
    else:
        rid, version = service.release_of_lock(text, "locks/x.txt")
        assert version == "0.5.12.post1" and len(rid) == 16
        assert service.release_of_lock(text + "# more\n", "x")[0] != rid  # new text, new release


# ---- launch command and environment --------------------------------------------------------

def test_one_flag_map_for_argv_and_check():
    s = settings(sglang_flags={"tp-size": 8, "disable-cuda-graph": True},
                 sglang_served_model_name="glm", sglang_api_key_env="KEY")
    fm = service.flag_map(s)
    assert fm == {"tp-size": 8, "disable-cuda-graph": True, "model-path": "/srv/models/m",
                  "host": "127.0.0.1", "port": 30000, "served-model-name": "glm",
                  "enable-metrics": True}
    checked = service.flag_map(s, with_api_key=True)
    assert checked["api-key"] == "<secret>" and "s3cret" not in str(checked)
    assert "api-key" not in service.flag_map(settings(), with_api_key=True)


@pytest.mark.parametrize("flags, on", [
    ({}, True),  # on by default
    ({"enable-metrics": True}, True),
    ({"enable-metrics": False}, False),  # the operator turns it off
    ({"enable_metrics": None}, False),  # any spelling of the flag is the operator's choice
    ({"--enable-metrics": False}, False),
])
def test_metrics_are_on_unless_the_flags_turn_them_off(flags, on):
    s = settings(sglang_flags={"tp-size": 8, **flags})
    argv = flagmod.render_flags(service.flag_map(s))
    assert ("--enable-metrics" in argv) is on and service.metrics_on(s) is on
    assert argv.count("--enable-metrics") <= 1


def test_launch_argv_runs_the_launcher_with_the_release_python_and_no_secret():
    s = settings(sglang_api_key_env="KEY", sglang_flags={"tp-size": 8},
                 sglang_launch_command=["{python}", "-m", "sglang.launch_server"])
    lay = Layout.of(s)
    argv = service.launch_argv(s, lay, "r1")
    py = "/opt/sglang/releases/r1/venv/bin/python"
    assert argv[:5] == [py, "/opt/sglang/tools/launch.py", py, "-m", "sglang.launch_server"]
    assert "--tp-size" in argv and "--model-path" in argv
    assert "s3cret" not in argv and "--api-key" not in argv


def test_service_environment_caches_nccl_then_operator_env_wins():
    s = settings(sglang_env={"NCCL_P2P_LEVEL": "SYS", "FOO": 1})
    env = dict(service.service_environment(s, {"NCCL_P2P_DISABLE": "1", "NCCL_P2P_LEVEL": "NVL"}))
    assert env["SGLANG_CACHE_DIR"] == env["FLASHINFER_WORKSPACE_BASE"] == "/var/cache/sglang"
    assert env["NCCL_P2P_DISABLE"] == "1"
    assert env["NCCL_P2P_LEVEL"] == "SYS"  # the operator's sglang_env wins
    assert env["FOO"] == "1" and env["HF_HUB_OFFLINE"] == "1"
    assert list(env) == sorted(env)  # deterministic unit text


@pytest.mark.parametrize("state, in_unit", [
    ("applied", "applied"), ("already-applied", "applied"), ("enabled-upstream", "enabled-upstream"),
    ("disabled", "disabled"),
])
def test_unit_patch_state_does_not_change_between_runs(state, in_unit):
    assert service.unit_patch_state(state) == in_unit


@pytest.mark.parametrize("bind, addr", [("0.0.0.0", "127.0.0.1"), ("::", "127.0.0.1"),
                                        ("127.0.0.1", "127.0.0.1"), ("10.0.0.5", "10.0.0.5")])
def test_probe_address(bind, addr):
    assert service.probe_address(bind) == addr


# ---- verifier parameters ----------------------------------------------------------------

@pytest.mark.parametrize("flags, patch_state, expect", [
    ({"moe-runner-backend": "flashinfer_cutlass"}, "applied", True),
    ({"moe-runner-backend": "flashinfer_cutlass"}, "already-applied", True),
    ({"moe-runner-backend": "flashinfer_cutlass"}, "enabled-upstream", True),
    ({"moe-runner-backend": "flashinfer_cutlass"}, "disabled", False),
    ({"moe-runner-backend": "flashinfer_cutlass", "disable-flashinfer-autotune": True}, "applied", False),
    ({"moe-runner-backend": "triton"}, "applied", False),
    ({}, "applied", False),
])
def test_expect_autotune(flags, patch_state, expect):
    assert service.expect_autotune(flags, patch_state) is expect


def test_verify_params_are_what_a_rollback_verifies_by():
    s = settings(sglang_flags={"moe-runner-backend": "flashinfer_cutlass", "disable-cuda-graph": True},
                 sglang_served_model_name="glm")
    p = service.verify_params(s, release_id="r1", sglang_version="0.5.12.post1",
                              patch_state="applied", nccl_env={"NCCL_P2P_DISABLE": "1"})
    assert p == {"release": "r1", "sglang_version": "0.5.12.post1", "patch_state": "applied",
                 "served_model_name": "glm", "expect_autotune": True, "cuda_graph": False,
                 "nccl_env": {"NCCL_P2P_DISABLE": "1"}}


# ---- rollback ------------------------------------------------------------------------------

KG = {"record": {"release": "r1"}, "unit_sha256": "u1", "secrets_sha256": "s1"}
RUNNING = {"ActiveState": "active", "SubState": "running"}


def hoststate(**over):
    return HostState.from_json({
        "known_good": KG, "releases": {"r1": {"complete": True}}, "unit_sha256": "u1",
        "secrets_sha256": "s1", "current": "r1", "service": RUNNING, **over})


@pytest.mark.parametrize("over, restore, restart", [
    ({}, (), False),                                             # runs its known-good: check only
    ({"service": {"ActiveState": "failed", "SubState": "failed"}}, (), True),
    ({"unit_sha256": "u2"}, ("unit",), True),
    ({"secrets_sha256": "s2", "current": "r2"}, ("secrets", "current"), True),
    ({"known_good": {**KG, "secrets_sha256": None}}, ("no-secrets",), True),
])
def test_rollback_plan(over, restore, restart):
    plan = service.rollback_plan("h1", hoststate(**over), "/opt/sglang")
    assert (plan.restore, plan.restart) == (restore, restart)
    assert plan.params == KG["record"]


@pytest.mark.parametrize("over, found", [
    ({"known_good": None}, "never passed verification"),
    ({"releases": {"r1": {"complete": False}}}, "missing or incomplete"),
    ({"releases": {}}, "missing or incomplete"),
])
def test_rollback_plan_refuses_with_the_fix(over, found):
    with pytest.raises(RollbackError) as exc:
        service.rollback_plan("h1", hoststate(**over), "/opt/sglang")
    assert found in exc.value.found and exc.value.fix
