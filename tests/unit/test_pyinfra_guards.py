"""The path the README recommends, plain `pyinfra INVENTORY deploy.py`, never reports success
having done nothing (config.py's hooks, integration/hooks.py): a `--limit` that matches no host, a
missing inventory, or a run from another folder (config.py not loaded) is a non-zero exit
that names the cause and the fix, before any connection. And an `sglang-deploy` command run
from another folder says that no group_data/ was found (controller/hosts.py).

pyinfra really runs, as a subprocess; the inventory's hosts point at 127.0.0.1 port 9, where
nothing listens, or are `@local`, and none of these cases gets as far as a connection.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_deploy.core.runspec import DATA_KEY, RunSpec

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
NOWHERE = {"ssh_hostname": "127.0.0.1", "ssh_port": 9}

INVENTORY = f'''
_data = {{**{NOWHERE!r}, "sglang_model_path": "/srv/models/m", "sglang_lock": "locks/testbed.txt"}}
gpu_hosts = ([("gpu-node-1", _data), ("gpu-node-2", _data)], {{}})
'''


@pytest.fixture
def inv(tmp_path) -> str:
    path = tmp_path / "inv.py"
    path.write_text(INVENTORY)
    return str(path)


def env(tmp_path) -> dict:
    """No wheel download from anywhere but loopback (the data check of a run that gets that
    far warns instead), an empty flag cache, no pip.conf."""
    return {**os.environ, "SGLANG_DEPLOY_CACHE": str(tmp_path / "cache"),
            "SGLANG_DEPLOY_WHEEL_CACHE": str(tmp_path / "wheels"), "PIP_CONFIG_FILE": "/dev/null",
            "PIP_INDEX_URL": "http://127.0.0.1:9/simple", "PIP_FIND_LINKS": "",
            "PYINFRA_PROGRESS": "off"}


def pyinfra(tmp_path, *argv: str, cwd: Path = REPO, journal: Path | None = None,
            **extra: str) -> subprocess.CompletedProcess:
    """pyinfra ARGV with the run's journal at JOURNAL (default: in TMP_PATH), named by its
    run spec (``core/runspec.py``), as the commands name it."""
    spec = tmp_path / "run.json"
    spec.write_text(RunSpec(journal=str(journal or tmp_path / "journal.json")).to_json())
    r = subprocess.run([str(BIN / "pyinfra"), "-y", "--data", f"{DATA_KEY}={spec}", *argv],
                       cwd=cwd, env={**env(tmp_path), **extra},
                       capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=300,
                       check=False)
    r.both = r.stdout + r.stderr  # type: ignore[attr-defined]
    return r


@pytest.mark.parametrize("deploy", ["deploy.py", "rollback.py", "preflight.py"])
def test_a_limit_that_matches_no_host_fails_naming_the_hosts(tmp_path, inv, deploy):
    r = pyinfra(tmp_path, inv, deploy, "--limit", "gpu-node-9")
    assert r.returncode != 0, r.both
    assert "nothing matches 'gpu-node-9'" in r.both
    assert "use one of the hosts: gpu-node-1, gpu-node-2; or groups: gpu_hosts, inv" in r.both
    assert "Connecting to hosts" not in r.both


def test_one_pattern_of_several_that_matches_nothing_fails_too(tmp_path, inv):
    # pyinfra warns and deploys gpu-node-1 alone: the operator believes both were deployed
    r = pyinfra(tmp_path, inv, "deploy.py", "--limit", "gpu-node-1", "--limit", "gpu-node-9")
    assert r.returncode != 0, r.both
    assert "nothing matches 'gpu-node-9'" in r.both
    assert "Connecting to hosts" not in r.both


def test_an_exclude_that_leaves_no_host_fails(tmp_path, inv):
    r = pyinfra(tmp_path, inv, "rollback.py", "--exclude", "gpu-*")
    assert r.returncode != 0, r.both
    assert "--exclude gpu-* leaves no host" in r.both
    assert "choose among the hosts: gpu-node-1, gpu-node-2" in r.both


@pytest.mark.parametrize("deploy", ["deploy.py", "rollback.py"])
def test_a_missing_inventory_fails_naming_it(tmp_path, deploy):
    r = pyinfra(tmp_path, "inv/nope.py", deploy)
    assert r.returncode != 0, r.both
    assert "expected an inventory file" in r.both and "no file inv/nope.py" in r.both
    assert "pass the path of an existing inventory file" in r.both


def test_a_limit_that_matches_gets_past_the_checks_to_the_connection(tmp_path, inv):
    """The guard stops only what matches nothing: the host named is checked and contacted
    (port 9: refused), the other one is not."""
    r = pyinfra(tmp_path, inv, "deploy.py", "--limit", "gpu-node-1")
    assert r.returncode != 0, r.both
    assert "[gpu-node-1] Could not connect" in r.both and "gpu-node-2] Could not" not in r.both
    assert "nothing matches" not in r.both and "config.py was not loaded" not in r.both


@pytest.mark.parametrize("deploy", ["deploy.py", "rollback.py", "preflight.py"])
def test_a_run_from_another_folder_refuses_before_any_operation(tmp_path, deploy):
    """pyinfra reads config.py from the current folder only: from elsewhere no host's data is
    checked (a flag typo would reach the host). The deploy file stops at once, naming the
    project folder and the fix. (`@local`: deploy files run after a connection; this one
    needs no network. The lock path does not resolve from here, so even the old code runs no
    stage: it fails on the lock instead.)"""
    other = tmp_path / "elsewhere"
    other.mkdir()
    (other / "local.py").write_text(
        'gpu_hosts = ([("@local", {"sglang_model_path": "/srv/models/m", '
        '"sglang_lock": "locks/testbed.txt", "sglang_flags": {"tp-sizee": 8}})], {})\n')
    r = pyinfra(tmp_path, "--dry", "local.py", str(REPO / deploy), cwd=other)
    assert r.returncode != 0, r.both
    assert "config.py was not loaded" in r.both
    assert f"run the same command from {REPO}" in r.both and f"--chdir {REPO}" in r.both
    assert "Traceback" not in r.both


@pytest.mark.parametrize("deploy", ["deploy.py", "rollback.py", "preflight.py"])
def test_from_the_project_folder_the_deploy_file_runs(tmp_path, deploy):
    """With config.py loaded the deploy file gets past its guard into its first stage, whose
    first read on the host (`@local`, --dry) runs a Python that does not exist: nothing runs
    anywhere, and the error comes from the stage itself."""
    (tmp_path / "local.py").write_text(
        'gpu_hosts = ([("@local", {"sglang_model_path": "/srv/models/m", '
        '"sglang_lock": "locks/testbed.txt", "sglang_system_python": "/nonexistent/python3"})],'
        ' {})\n')
    r = pyinfra(tmp_path, "--dry", str(tmp_path / "local.py"), deploy)
    assert r.returncode != 0, r.both
    assert "/nonexistent/python3: not found" in r.both
    assert "config.py was not loaded" not in r.both


def test_the_chdir_fix_works(tmp_path, inv):
    """The fix the refusal gives: `--chdir PROJECT` loads the project's config.py (its checks
    then run: here the --limit check)."""
    r = pyinfra(tmp_path, "--chdir", str(REPO), inv, "deploy.py", "--limit", "gpu-node-9",
                cwd=tmp_path)
    assert r.returncode != 0, r.both
    assert "nothing matches 'gpu-node-9'" in r.both and "config.py was not loaded" not in r.both


def test_a_command_from_another_folder_says_no_group_data_was_found(tmp_path):
    """`sglang-deploy status inventory/prod.py` from another folder: the data of group_data/
    is missing, and the error says that, not "sglang_model_path is required"."""
    project, other = tmp_path / "project", tmp_path / "elsewhere"
    (project / "group_data").mkdir(parents=True)
    (project / "inventory").mkdir()
    other.mkdir()
    (project / "deploy.py").write_text("")
    (project / "group_data" / "all.py").write_text('sglang_model_path = "/srv/models/m"\n')
    (project / "inventory" / "prod.py").write_text(f"gpu_hosts = [('gpu-node-1', {NOWHERE!r})]\n")
    r = subprocess.run([str(BIN / "sglang-deploy"), "status", str(project / "inventory" / "prod.py")],
                       cwd=other, env=env(tmp_path), capture_output=True, text=True,
                       stdin=subprocess.DEVNULL, timeout=300, check=False)
    assert r.returncode == 2, r.stderr
    line = r.stderr.strip()
    assert line.count("\n") == 0, line
    assert line.startswith("sglang-deploy status: invalid command line: expected a group_data/")
    assert f"no group_data/ in {other} nor {project / 'inventory'}" in line
    assert "`sglang_model_path` is required" in line  # what the data check found, after that
    assert ("run sglang-deploy from the project folder (the one with deploy.py and "
            f"group_data/): cd {project}") in line


def test_an_inventory_with_all_its_data_needs_no_group_data(tmp_path, monkeypatch):
    """No group_data/ is not an error by itself: an inventory may hold every value."""
    from sglang_deploy.controller import hosts

    (tmp_path / "locks").mkdir()
    (tmp_path / "locks" / "testbed.txt").write_text((REPO / "locks" / "testbed.txt").read_text())
    (tmp_path / "inv.py").write_text(INVENTORY)
    for key, value in env(tmp_path).items():
        monkeypatch.setenv(key, value)
    chosen = hosts.select("inv.py", ["gpu-node-2"], cwd=tmp_path)
    assert chosen.hosts == ["gpu-node-2"]


# ------------------------------------------------------------------ outcome records

def outcome_records(path: Path) -> dict[str, dict]:
    """Each host's outcome record in the run's journal at PATH (``journal.read``)."""
    from sglang_deploy.integration import journal

    ran = journal.read(path)
    return {name: ran.part(name, "outcome") for name in sorted(ran.hosts)
            if ran.part(name, "outcome") is not None}


def test_a_host_that_cannot_be_reached_leaves_an_unreachable_record(tmp_path, inv):
    """The connection's failure is the host's record (``Recorder.host_connect_error``); a
    host outside --limit gets none."""
    r = pyinfra(tmp_path, inv, "deploy.py", "--limit", "gpu-node-1",
                journal=tmp_path / "o.json")
    assert r.returncode != 0, r.both
    records = outcome_records(tmp_path / "o.json")
    assert list(records) == ["gpu-node-1"]
    rec = records["gpu-node-1"]
    assert (rec["outcome"], rec["stage"], rec["error"]["type"]) == ("unreachable", "connect", "unreachable")
    assert "port 9 on 127.0.0.1" in rec["error"]["message"]


def test_a_stage_that_fails_leaves_its_typed_error_and_the_stage(tmp_path):
    (tmp_path / "local.py").write_text(
        'gpu_hosts = ([("@local", {"sglang_model_path": "/srv/models/m", '
        '"sglang_lock": "locks/testbed.txt", "sglang_system_python": "/nonexistent/python3"})],'
        ' {})\n')
    r = pyinfra(tmp_path, "--dry", str(tmp_path / "local.py"), "deploy.py",
                journal=tmp_path / "o.json")
    assert r.returncode != 0, r.both
    rec = outcome_records(tmp_path / "o.json")["@local"]
    assert (rec["outcome"], rec["stage"], rec["phase"], rec["dry"]) == ("failed", "preflight", "prepare", True)
    assert rec["error"]["type"] == "RuntimeSetupError"
    assert "/nonexistent/python3: not found" in rec["error"]["found"]
    assert rec["error"]["message"].startswith("runtime setup failed: expected the host-state read")


def test_a_finished_run_leaves_passed_and_a_failed_command_its_output(tmp_path):
    """Any pyinfra run with the project's config.py (here `exec`, as rollout's reachability
    check): passed once every operation ran; a command that fails: its operation and output."""
    (tmp_path / "local.py").write_text(
        'gpu_hosts = ([("@local", {"sglang_model_path": "/srv/models/m", '
        '"sglang_lock": "locks/testbed.txt"})], {})\n')
    ok = pyinfra(tmp_path, str(tmp_path / "local.py"), "exec", "--", "true",
                 journal=tmp_path / "ok.json")
    assert ok.returncode == 0, ok.both
    rec = outcome_records(tmp_path / "ok.json")["@local"]
    assert (rec["outcome"], rec["phase"], rec["error"]) == ("passed", "done", None)
    bad = pyinfra(tmp_path, str(tmp_path / "local.py"), "exec", "--", "echo boom >&2; false",
                  journal=tmp_path / "bad.json")
    assert bad.returncode != 0, bad.both
    rec = outcome_records(tmp_path / "bad.json")["@local"]
    assert (rec["outcome"], rec["phase"], rec["error"]["type"]) == ("failed", "execute", "OperationError")
    assert rec["error"]["message"].endswith("failed on the host\nboom")
