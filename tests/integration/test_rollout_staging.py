"""Rollouts that stage before they drain, and a controller that dies mid-rollout: the router
(SMG) in front of 3 testbed hosts, under a steady load through it (bench/router_load.py).

Uses test_router.py's `routed` (the router host booted, the fleet deployed) and `fleet` (the
3 servers converged on the module's configuration, every worker ready in the router)
fixtures: each test here starts from `fleet` and passes alone (`pytest -k NAME`).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import uuid
from pathlib import Path

from bench import router_load
from testbed.hfmirror import Repo
from testbed.sim.model import make_model_dir

from .helpers import REPO, broken_lock
from .hubmirror import HF_REPO, TOKEN, download_data, mirror  # noqa: F401  (`mirror`: a fixture)
from .routedfleet import (  # noqa: F401  (`routed` and `fleet` are fixtures)
    BIN,
    DATA,
    fleet,
    rollout,
    routed,
    router_of,
    servers,
    tool,
    wait_all_workers_ready,
)


def new_release(tmp_path: Path) -> Path:
    """A lock that differs from the testbed's by a comment line: a new release id (installed
    offline from the wheelhouse, as the testbed's)."""
    path = tmp_path / f"release-{uuid.uuid4().hex[:8]}.txt"
    path.write_text((REPO / "locks/testbed.txt").read_text() + f"# staged rollout {path.name}\n")
    return path


def serving_state(testbed) -> dict:
    """Per server: the release behind `current` and the server's MainPID."""
    return {h: testbed.ssh(h, "readlink /opt/sglang/current; systemctl show -p MainPID --value "
                              "sglang", check=True).stdout.split() for h in servers(testbed)}


def test_a_host_that_fails_staging_stops_the_rollout_before_any_drain(fleet, tmp_path):
    """Needs: `fleet`. A release that installs and does not import (its smoke fails on every
    host while staging): the rollout stops before any drain. Leaves the fleet as it was."""
    before = serving_state(fleet)
    r, doc = rollout(fleet, data=[f"sglang_lock={broken_lock(tmp_path)}"])
    out = r.stdout + r.stderr
    assert r.returncode == 1, out[-4000:]
    assert "staging FAILED" in out and "No module named 'pybase64'" in out
    assert "draining" not in out  # no host left the router
    assert "rollout stopped before any drain" in doc["verdict"]
    assert [h["router"] for h in doc["hosts"]] == [None] * 3
    assert all(h["status"] == "failed" and h["message"].startswith("staging failed")
               for h in doc["hosts"]), doc["hosts"]
    assert serving_state(fleet) == before  # same release, same server process on each
    rc, st = status_json(fleet)  # in sync, and the router counts every worker ready
    assert rc == 0 and [w["state"] for w in st["router"]["workers"]] == ["ready"] * 3, st


def test_a_new_release_is_staged_everywhere_then_rolled_under_load(fleet, tmp_path):
    """Needs: `fleet`. Leaves the fleet on a new release (the next `fleet` deploys it back)."""
    url, key, _ = router_of(fleet)
    lock = new_release(tmp_path)
    result, (r, doc) = router_load.run_through(
        url, key, "glm-5", lambda: rollout(fleet, data=[f"sglang_lock={lock}"]))
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    s = result.summary()
    assert s["during"]["requests"] > 0 and s["during"]["failed"] == 0, s
    # every host staged, in one run, before the first drain
    assert out.index("staged in") < out.index("draining")
    assert len({h["stage_seconds"] for h in doc["hosts"]}) == 1
    assert [(h["status"], h["router"]) for h in doc["hosts"]] == [("done", "back")] * 3
    assert all(h["out_of_router_s"] for h in doc["hosts"])
    # the rolling runs found the release installed and its smoke proven
    batch = Path(doc["hosts"][0]["log"]).with_name("batch1-deploy.log").read_text()
    assert "Release smoke" not in batch and "JIT toolchain" not in batch
    # each rolling run started with its drain and waited at its gate before the P2P retest
    assert batch.index("drained by the rollout (waited") < batch.index("P2P before restarting")
    assert (Path(doc["hosts"][0]["log"]).with_name("batch1.gate").read_text() == "drained\n")
    assert all(h["prepared_while_draining_s"] > 0 for h in doc["hosts"]), doc["hosts"]
    for i, h in enumerate(doc["hosts"], 1):
        assert out.index(f"[{i}] deploying {h['host']} ... (started with the drain") \
            < out.index(f"{h['host']}: drained in")


def status_json(testbed) -> tuple[int, dict]:
    r = tool("status", str(testbed.inventory), "--json", *[a for d in DATA for a in ("--data", d)])
    return r.returncode, json.loads(r.stdout) if r.stdout.strip().startswith("{") else {}


def rollout_killed_after_first_drain(testbed, argv: list[str]) -> str:
    """Start the rollout, SIGKILL it (its whole process group: the controller is gone, its
    pyinfra child too) as soon as it says its first host is drained; its output."""
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if "drained in" in line:
                os.killpg(proc.pid, signal.SIGKILL)
                break
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    return "".join(lines)


def test_a_rollout_killed_after_its_first_drain_is_seen_and_converges_on_a_rerun(fleet):
    """Needs: `fleet`. Under load: the rollout is killed right after its first drain; `status`
    then exits 1 and names that host out of the router (draining or absent); the same rollout run again
    converges (every host back, every worker ready); no request fails. Leaves the fleet on a
    new `sglang_env` value (the next `fleet` deploys it back)."""
    url, key, _ = router_of(fleet)
    env = f'sglang_env={{"ROLL": "{uuid.uuid4().hex[:6]}"}}'
    argv = [str(BIN / "sglang-deploy"), "rollout", str(fleet.inventory)]
    for d in [*DATA, env]:
        argv += ["--data", d]
    first = servers(fleet)[0]
    seen = {}

    def killed_then_rerun():
        seen["killed"] = rollout_killed_after_first_drain(fleet, argv)
        seen["status"] = status_json(fleet)
        return rollout(fleet, data=[env])

    result, (r, doc) = router_load.run_through(url, key, "glm-5", killed_then_rerun)
    assert f"{first}: drained in" in seen["killed"], seen["killed"][-3000:]
    rc, st = seen["status"]
    assert rc == 1, st
    workers = {w["host"]: w["state"] for w in (st.get("router") or {}).get("workers") or []}
    # out of the router: still `draining` (its drain ended before the router's settle, which
    # the killed rollout never waited for) or already forgotten
    assert workers.get(first) in ("draining", "absent"), st.get("router")
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    assert [h["router"] for h in doc["hosts"]] == ["back"] * 3
    wait_all_workers_ready(fleet, deadline_s=60)
    s = result.summary()
    assert s["during"]["requests"] > 0 and s["during"]["failed"] == 0, s


def test_a_new_model_is_downloaded_on_every_host_before_the_first_drain(
        fleet, mirror, tmp_path, monkeypatch):
    """Needs: `fleet`. A rollout to a new `sglang_model_path`, downloaded (the stand-in Hub of
    test_model_download.py): the staging run fetches it on every host, with its progress,
    before any host leaves the router; the old model's folder stays. Leaves the fleet on the
    new model path (the next `fleet` deploys it back)."""
    monkeypatch.setenv("TB_HF_TOKEN", TOKEN)
    old = serving_model(fleet)
    path = f"/srv/models/staged-{uuid.uuid4().hex[:6]}/GLM-5-NVFP4"
    r, doc = rollout(fleet, data=model_data(mirror, path))
    downloaded_while_staging(fleet, r, doc)
    for h in servers(fleet):
        assert fleet.ssh(h, f"test -f {path}/model-00004-of-00004.safetensors").returncode == 0
        assert fleet.ssh(h, f"test -d {old[h]}").returncode == 0  # the old model is kept
    assert [(h["status"], h["router"]) for h in doc["hosts"]] == [("done", "back")] * 3


def serving_model(testbed) -> dict:
    """Per server: the --model-path of its unit."""
    out = {}
    for h in servers(testbed):
        unit = testbed.ssh(h, "cat /etc/systemd/system/sglang.service", check=True).stdout
        out[h] = re.search(r"--model-path (\S+)", unit).group(1)
    return out


def downloaded_while_staging(testbed, r, doc) -> None:
    """The rollout R (its report DOC) passed, its staging run downloaded the model on every
    server (its progress to 100 %), and it did so before any host was drained."""
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    assert out.index("staged in") < out.index("draining")
    staging = Path(doc["hosts"][0]["log"]).with_name("stage.log").read_text()
    for h in servers(testbed):
        assert re.search(rf"\[{h}\]\s+model download: .*\(100\.0%\)", staging), staging[-3000:]


def started_with_carried_cache(testbed, doc) -> None:
    """The staging run of DOC's rollout copied each server's autotune cache to the new
    revision's key, and the server that now runs found it there (SGLang's own log line names
    the folder) and tuned nothing."""
    staging = Path(doc["hosts"][0]["log"]).with_name("stage.log").read_text()
    for h in servers(testbed):
        m = re.search(rf"\[{h}\]\s+autotune cache: same architecture and key flags: the old "
                      rf"revision's autotune cache [0-9a-f]{{16}} copied to ([0-9a-f]{{16}})", staging)
        assert m, staging[-3000:]
        journal = this_start_journal(testbed, h)
        assert f"/{m.group(1)}/rank_tp0_pp0_dp0.json" in journal, journal[-3000:]
        assert "[AutoTuner]: Tuning" not in journal, journal[-3000:]


def this_start_journal(testbed, h: str) -> str:
    """The server's journal since its current start (its invocation)."""
    return testbed.ssh(h, "journalctl -u sglang -o cat _SYSTEMD_INVOCATION_ID=$(systemctl show "
                          "-p InvocationID --value sglang)", check=True).stdout


def model_data(mirror, path: str, *extra: str) -> list[str]:
    """The download's data (the stand-in Hub) with the model at PATH."""
    return [*[d for d in download_data(mirror) if d.startswith(("sglang_model", "sglang_hf"))],
            f"sglang_model_path={path}", *extra]


def test_a_new_revision_is_staged_beside_the_files_that_serve(fleet, mirror, tmp_path,
                                                             monkeypatch):
    """Needs: `fleet`. The fleet serves a downloaded model (revision `main`); the Hub gets a
    new commit and the rollout names it (`sglang_model_revision`): the staging run downloads
    it on every host, with its progress, into its own folder beside the one that serves
    (complete, before the first drain); each host then serves it under the same name, the
    old revision's files kept. Leaves the fleet on that model (the next `fleet` deploys its
    own back)."""
    monkeypatch.setenv("TB_HF_TOKEN", TOKEN)
    path = f"/srv/models/rev-{uuid.uuid4().hex[:6]}/GLM-5-NVFP4"
    r, doc = rollout(fleet, data=model_data(mirror, path))
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    first = mirror.repo
    src = make_model_dir(tmp_path / "GLM-5-NVFP4", n_shards=4, shard_bytes=128 * 1024)
    mirror.repo = Repo(HF_REPO, src, TOKEN)  # the same repo, a new commit
    try:
        commit = mirror.repo.commit
        r, doc = rollout(fleet, data=model_data(mirror, path, f"sglang_model_revision={commit}"))
    finally:
        mirror.repo = first
    downloaded_while_staging(fleet, r, doc)
    # the same architecture: the old revision's FlashInfer tactics are the new one's
    started_with_carried_cache(fleet, doc)
    for h in servers(fleet):
        assert serving_model(fleet)[h] == f"{path}@{commit}"
        unit = fleet.ssh(h, "cat /etc/systemd/system/sglang.service", check=True).stdout
        assert "--served-model-name glm-5" in unit  # clients keep the name they use
        record = json.loads(fleet.ssh(h, f"cat {path}@{commit}/.sglang-deploy-fetched.json",
                                      check=True).stdout)
        assert record["revision"] == commit
        # the old revision's files stay for a rollback
        assert fleet.ssh(h, f"test -f {path}/model-00004-of-00004.safetensors").returncode == 0
    assert [(h["status"], h["router"]) for h in doc["hosts"]] == [("done", "back")] * 3


def test_a_new_model_of_another_architecture_tunes_again(fleet):
    """Needs: `fleet`. A new model folder on every host whose config.json differs from the
    served one's (hidden_size): the staging run copies no autotune cache and says why; each
    server then tunes at its start. Leaves the fleet on that model (the next `fleet` deploys
    its own back)."""
    path = f"/srv/models/arch-{uuid.uuid4().hex[:6]}"
    code = (f"import json; from model import make_model_dir; p = make_model_dir({path!r}, 2, 4096)"
            " / 'config.json'; c = json.loads(p.read_text()); c['hidden_size'] = 7168; "
            "p.write_text(json.dumps(c))")
    for h in servers(fleet):
        fleet.ssh(h, f"cd /opt/sglang-sim && python3 -c {json.dumps(code)}", check=True)
    try:
        r, doc = rollout(fleet, data=[f"sglang_model_path={path}"])
        assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
        staging = Path(doc["hosts"][0]["log"]).with_name("stage.log").read_text()
        for h in servers(fleet):
            assert re.search(rf"\[{h}\]\s+autotune cache: the architecture changed \(config\.json: "
                             r"[^\n]*hidden_size 6144 -> 7168[^\n]*\): the new revision tunes again", staging), \
                staging[-3000:]
            journal = this_start_journal(fleet, h)
            assert "[AutoTuner]: Tuning" in journal, journal[-3000:]
    finally:
        for h in servers(fleet):
            fleet.ssh(h, f"rm -rf {path}")


def test_a_host_short_of_space_for_the_new_model_stops_the_rollout_before_any_drain(
        fleet, mirror, monkeypatch):
    """Needs: `fleet`. The last host's model disk is a 64 MiB file system: the new model's
    missing bytes and the 2 GiB headroom do not fit; the staging run fails there with the
    figures and the fix (and stops there), and the rollout stops before any drain, every host
    serving as before. Leaves the fleet as it was."""
    monkeypatch.setenv("TB_HF_TOKEN", TOKEN)
    short = servers(fleet)[-1]
    disk = f"/srv/models/small-{uuid.uuid4().hex[:6]}"
    fleet.ssh(short, f"mkdir -p {disk} && mount -t tmpfs -o size=64m tmpfs {disk}", check=True)
    before = serving_state(fleet)
    try:
        r, doc = rollout(fleet, data=model_data(mirror, f"{disk}/GLM-5-NVFP4"))
    finally:
        fleet.ssh(short, f"umount {disk}", check=True)
    out = r.stdout + r.stderr
    assert r.returncode == 1, out[-4000:]
    assert "draining" not in out and "rollout stopped before any drain" in doc["verdict"]
    failed = {h["host"]: h for h in doc["hosts"] if h["status"] == "failed"}
    assert list(failed) == [short], doc["hosts"]
    # pyinfra stops a run at a host's failure: the others' staging did not finish either
    assert all(f"the run stopped when {short} failed" in h["message"]
               for h in doc["hosts"] if h["host"] != short), doc["hosts"]
    message = failed[short]["message"]
    assert re.search(r"0\.0 GiB free \(\d+\.\d GiB short\)|\d+\.\d GiB free \(\d+\.\d GiB short\)",
                     message), message
    assert "free " in message and "nothing was drained" in message, message
    assert serving_state(fleet) == before  # same release, same server process on each
    rc, st = status_json(fleet)
    assert rc == 0 and [w["state"] for w in st["router"]["workers"]] == ["ready"] * 3, st
