"""Fault matrix (issue 5): what the user sees when things go wrong, and that nothing is lost.

Every case injects one fault on the testbed, runs the real deploy (pyinfra + deploy.py over
SSH), removes the fault and runs the deploy again, then asserts the contract. What it
observed (exit code, the error's first lines, other hosts untouched, previous release still
serving, re-run converged) is also written to the fault records (helpers.RECORDS,
`.sglang-deploy/faults/`); `python scripts/faults_table.py` renders docs/faults.md from them
as a step of its own: no test reads a record or needs the table.

Hosts (TESTBED_PREFIX, default tb): SERVING (1) serves a verified server; faults hit a
re-deploy of it with NEW data (the other launch flag set than the one it runs, or a new
release: a lock that differs by a comment line). UNTOUCHED (2) is in the same runs, converged
on its own data: its systemd invocation, unit and release must not change. SPARE (3): a host
that is not serving (port taken) and the changed SSH host key. The `fleet` fixture puts
SERVING and UNTOUCHED in that state before each case, from whatever state they are in.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import time
from pathlib import Path

import pytest

from .helpers import (
    FAULT_INVENTORY,
    GPU_SCENARIOS,
    REPO,
    SEED_FLAGS,
    TB1,
    TB2,
    TB3,
    both,
    fault_deploy,
    fault_env,
    keep_output,
    record,
    view,
    write_record,
)

WATCH = Path(__file__).with_name("fault_watch.py")
LOCKS = REPO / ".sglang-deploy" / "fault-locks"
SERVING, UNTOUCHED, SPARE = TB1, TB2, TB3
BOTH = (SERVING, UNTOUCHED)
UV_SYNC = "^/opt/sglang/tools/venv/bin/uv pip sync"
FLAG_SETS = [SEED_FLAGS, {**SEED_FLAGS, "enable-metrics": False}]  # metrics on, off
deploy = fault_deploy


def new_release(tag: str) -> tuple[str, str]:
    """A lock that differs from the testbed's by a comment line: a new release id."""
    text = (REPO / "locks" / "testbed.txt").read_text() + f"# fault case: {tag} {time.time()}\n"
    path = LOCKS / f"{tag}.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return str(path), hashlib.sha256(text.encode()).hexdigest()[:16]


def next_flags(testbed) -> dict:
    """The other flag set than the one SERVING runs now, read from its unit (a change = a
    restart)."""
    unit = testbed.ssh(SERVING, "cat /etc/systemd/system/sglang.service", check=True).stdout
    return {"sglang_flags": FLAG_SETS[1 if "--enable-metrics" in unit else 0]}


def push(testbed, host: str, path: str, text: str) -> None:
    subprocess.run(testbed.ssh_argv(host, f"cat > {path}"), input=text, text=True, check=True,
                   capture_output=True, timeout=60)


def watch(testbed, host: str, action: str, pattern: str, unit: str) -> str:
    """Start fault_watch.py on HOST (detached from SSH); return its report's path."""
    report = f"/root/{unit}.json"
    push(testbed, host, "/root/fault_watch.py", WATCH.read_text())
    testbed.ssh(host, f"rm -f {report}; systemd-run --unit={unit} --collect python3 "
                      f"/root/fault_watch.py {action} '{pattern}' 300 {report}", check=True)
    return report


def hold_lock(testbed, host: str, owner: dict, unit: str) -> None:
    """A deploy lock held on HOST by OWNER, as a deploy from another shell holds it."""
    testbed.ssh(host, (
        f"mkdir -p /run/sglang-deploy; rm -f /run/{unit}.pid; systemd-run --unit={unit} "
        f"--collect sh -c 'exec 9>>/run/sglang-deploy/lock; flock -n 9 || exit 1; "
        f"echo $$$$ > /run/{unit}.pid; exec sleep infinity'"), check=True)  # systemd: $$ -> $
    pid = testbed.wait_for(f"{unit} holds the lock", lambda: testbed.ssh(
        host, f"cat /run/{unit}.pid").stdout.strip(), timeout=30)
    push(testbed, host, "/run/sglang-deploy/owner.json",
         json.dumps({**owner, "holder_pid": int(pid)}) + "\n")


def dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def run_case(testbed, case: str, category: str, fault: str, *, inject, clear, data: dict,
             words: list[str], target: str = SERVING, hosts=(SERVING,),
             keeps_serving: bool = True, rerun_data: dict | None = None, env: dict | None = None,
             args: tuple = (), expect_ok: bool = False, notes: str = "",
             not_serving: bool = False) -> dict:
    """Inject, deploy, clear, re-deploy; record what was seen; then assert the contract."""
    watched = [SERVING, UNTOUCHED] + ([SPARE] if target == SPARE else [])
    before = {h: view(testbed, h) for h in watched}
    try:
        inject()
        r = deploy({target: data}, *args, hosts=hosts, env=env)
    finally:
        clear()
    keep_output(case, category, r)
    after = {h: view(testbed, h) for h in watched}
    others = all(after[h] == before[h] for h in watched if h != target)
    was_serving = before[target].get("health") == "200" and not not_serving
    serving = (after[target] == before[target]) if was_serving else None
    if expect_ok and was_serving:  # the deploy went through: the host serves the NEW data
        serving = None
        notes = f"serving the new data afterwards: {after[target].get('health') == '200'}. " + notes
    r2 = deploy({target: rerun_data if rerun_data is not None else data}, *args, hosts=hosts,
                env=env)
    final = view(testbed, target)
    converged = r2.returncode == 0 and final.get("health") == "200"
    same_run = [h for h in hosts if h != target]
    notes = (f"untouched: {', '.join(same_run)} in the same run. " if same_run else
             f"untouched: {', '.join(h for h in watched if h != target)} outside the run. ") + notes
    rec = record(case, category, fault, r, others_untouched=others, serving=serving,
                 converged=converged, notes=notes.strip(), expect_ok=expect_ok)
    out = both(r)
    if expect_ok:
        assert r.returncode == 0, out[-4000:]
    else:
        assert r.returncode != 0, out[-4000:]
        assert rec["error"], out[-3000:]
    for w in words:
        assert w.lower() in out.lower(), (w, out[-4000:])
    assert others, (before, after)
    if keeps_serving and was_serving:
        assert serving, (before[target], after[target], out[-3000:])
    assert converged, both(r2)[-4000:]
    return rec


# ------------------------------------------------------------------------------- fleet
@pytest.fixture
def fleet(testbed, deployed_host, serving_host):
    """UNTOUCHED converged on the fault suite's default data; SERVING serving a verified
    server (any of the configurations the cases leave; the default data if it does not)."""
    deployed_host(UNTOUCHED, inventory=FAULT_INVENTORY, env=fault_env())
    serving_host(SERVING, inventory=FAULT_INVENTORY, env=fault_env())


# ------------------------------------------------------------------------------- input
INPUT_CASES = {
    # case: (args, env, words the message must hold)
    "unknown data key": (["--data", "sglang_portt=1"], {}, ["sglang_portt", "did you mean `sglang_port`"]),
    "wrong type": (["--data", "gpu_expected_count=eight"], {}, ["gpu_expected_count", "fix"]),
    "empty model path": (["--data", "sglang_model_path="], {}, ["sglang_model_path", "absolute path"]),
    "negative number": (["--data", "sglang_port=-1"], {}, ["sglang_port", "fix"]),
    "malformed launch flags": (["--data", 'sglang_flags={"tp-size": [[8]]}'], {}, ["sglang_flags"]),
    "non-existent profile (lock file)": (["--data", "sglang_lock=locks/no-such-profile.txt"], {},
                                         ["sglang_lock", "no-such-profile.txt"]),
    "secret missing": (["--data", "sglang_api_key_env=FAULT_NO_SUCH_VAR"], {},
                       ["FAULT_NO_SUCH_VAR", "export"]),
    "secret with a newline": (["--data", "sglang_api_key_env=FAULT_NL_KEY"],
                              {"FAULT_NL_KEY": "s3cr3t-one\ns3cr3t-two"}, ["newline"]),
    "public bind without an API key": (["--data", "sglang_host=0.0.0.0"], {},
                                       ["sglang_allow_public_without_key"]),
}
# The bad-input records' "converged" column is the run of
# test_after_bad_input_a_rerun_converges_without_change (scripts/faults_table.py joins them).
INPUT_RERUN = "input-rerun-after-bad-input"


@pytest.mark.parametrize("case", list(INPUT_CASES))
def test_bad_input_stops_before_any_host_is_contacted(testbed, case):
    args, env, words = INPUT_CASES[case]
    before = {h: view(testbed, h) for h in (SERVING, UNTOUCHED)}
    r = deploy(None, *args, hosts=(), env=env)  # the whole inventory
    out = both(r)
    after = {h: view(testbed, h) for h in (SERVING, UNTOUCHED)}
    record(case, "Input", " ".join(args), r, others_untouched=after == before,
                 serving=after[SERVING] == before[SERVING],
                 notes="no host contacted (`Connected` absent); re-run: one run without the bad "
                       "value (test_after_bad_input_a_rerun_converges_without_change)",
                 rerun_record=INPUT_RERUN)
    assert r.returncode == 2, out[-2000:]  # an input error's status, as the commands'
    assert "Connected" not in out, "validation must happen before any connection"
    for w in words:
        assert w in out, (w, out[-2000:])
    assert "s3cr3t" not in out
    assert after == before


def test_after_bad_input_a_rerun_converges_without_change(testbed, deployed_host):
    deployed_host(SERVING, UNTOUCHED, inventory=FAULT_INVENTORY, env=fault_env())
    before = view(testbed, SERVING)
    r = deploy()
    ok = r.returncode == 0 and view(testbed, SERVING) == before
    write_record(INPUT_RERUN, {"case": "re-run after bad input", "category": "Input",
                               "rerun_converged": ok, "join_only": True, "recorded_at": time.time()})
    assert ok, both(r)[-3000:]


# ------------------------------------------------------------------------------- GPU
@pytest.mark.parametrize("scenario", sorted(GPU_SCENARIOS))
def test_gpu_fault_stops_the_redeploy_and_the_host_keeps_serving(testbed, fleet, scenario):
    """A GPU fault the pre-flight finds stops the re-deploy with the host still serving; a
    P2P fault is found by the retest before the restart, which runs on GPUs no server
    holds: the server was stopped for it, and stays stopped (a new one would not serve on
    those GPUs either) until the re-run without the fault."""
    p2p = scenario in ("p2p-corrupt", "p2p-slow")  # found by the peer copies alone
    data = next_flags(testbed)
    if scenario == "p2p-slow":  # 2 GB/s simulated: below a 3 GB/s floor whatever the load
        data = {**data, "gpu_p2p_min_gbps": 3.0}
    run_case(testbed, scenario, "GPU", f"testbed scenario `{scenario}` during a re-deploy "
             "with other launch flags", inject=lambda: testbed.scenario(SERVING, scenario),
             clear=lambda: testbed.scenario(SERVING, "healthy"), data=data,
             rerun_data={**data, "gpu_p2p_min_gbps": 0.05},
             words=[*GPU_SCENARIOS[scenario], "fix"], keeps_serving=not p2p,
             notes="stopped for the P2P retest (never beside a running server), which "
                   "failed: left stopped." if p2p else "")


# ------------------------------------------------------------------------------- server
def test_model_directory_missing_a_shard(testbed, fleet):
    shard = "/srv/models/GLM-5-NVFP4/model-00002-of-00005.safetensors"
    run_case(testbed, "model directory missing a shard", "Server",
             "one shard moved out of the model folder during a re-deploy with other flags",
             inject=lambda: testbed.ssh(SERVING, f"mv {shard} /root/", check=True),
             clear=lambda: testbed.ssh(SERVING, f"mv /root/{shard.rsplit('/', 1)[1]} {shard}",
                                       check=True),
             data=next_flags(testbed), words=["model-00002-of-00005.safetensors", "missing", "fix"])


def test_flag_unknown_to_the_installed_version(testbed, fleet):
    good = next_flags(testbed)
    bad = {"sglang_flags": {**good["sglang_flags"], "cuda-graph-max-bsz": 8}}
    run_case(testbed, "flag unknown to the installed version", "Server",
             "`cuda-graph-max-bsz` (a typo of --cuda-graph-max-bs) added to the flags",
             inject=lambda: None, clear=lambda: None, data=bad, rerun_data=good,
             words=["--cuda-graph-max-bsz", "0.5.12.post1"],
             notes="re-run: the flags without the typo")


SERVER_FAULTS = {
    # case: (scenario, extra data, words, expect_ok)
    "autotune crash": ("autotune-crash", {}, ["Ninja build failed", "phase reached: autotune"], False),
    "out of memory": ("oom", {}, ["Not enough memory", "mem-fraction-static"], False),
    "load hang": ("load-hang", {"verify_phase_timeouts": {"loading": 8}},
                  ["stalled", "loading"], False),
    "slow start beyond the deadline": ("slow-start", {"verify_timeout_s": 2},
                                       ["not ready after", "verify_timeout_s"], False),
    "slow start within the deadline": ("slow-start", {}, [f"READY {SERVING}"], True),
}


@pytest.mark.parametrize("case", list(SERVER_FAULTS))
def test_server_fault_in_the_new_start(testbed, fleet, case):
    scenario, extra, words, ok = SERVER_FAULTS[case]
    data = next_flags(testbed)
    run_case(testbed, case, "Server", f"testbed scenario `{scenario}` in the server started by a "
             "re-deploy with other flags", inject=lambda: testbed.scenario(SERVING, scenario),
             clear=lambda: testbed.scenario(SERVING, "healthy"), data={**data, **extra},
             rerun_data=data, words=words, keeps_serving=False, expect_ok=ok,
             notes="" if ok else "no automatic rollback: the failed start replaced the running "
             "server (rollback is the lead's `rollout`); the re-run restarts the never-verified "
             "server and verifies it")


def test_port_already_taken_by_another_process(testbed, fleet):
    squat = ("systemd-run --unit=fault-squatter --collect python3 -m http.server 30000 "
             "--bind 127.0.0.1 --directory /var/empty")

    def inject():
        testbed.ssh(SPARE, "systemctl stop sglang.service 2>/dev/null; mkdir -p /var/empty; "
                    + squat, check=True)
        testbed.wait_for("the squatter listens", lambda: testbed.ssh(
            SPARE, "curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:30000/").stdout
            not in ("", "000"))

    run_case(testbed, "port already taken by another process", "Server",
             "`python3 -m http.server 30000` started on the (stopped) host before the deploy",
             inject=inject, clear=lambda: testbed.ssh(SPARE, "systemctl stop fault-squatter"),
             data={}, target=SPARE, hosts=(SPARE, UNTOUCHED), not_serving=True,
             words=["address already in use", "ss -ltnp", "sglang_port"],
             notes="sglang 0.5.12.post1 binds the port only after loading; the verifier stops at "
                   "uvicorn's bind error instead of waiting for the 120 s warmup timeout")


# ------------------------------------------------------------------------------- host/network
def test_ssh_connection_dropped_during_the_venv_install(testbed, fleet):
    lock, _ = new_release("ssh-drop")
    report = {}

    def inject():
        report["path"] = watch(testbed, SERVING, "drop-ssh", UV_SYNC, "fault-drop-ssh")

    run_case(testbed, "SSH connection dropped during the venv install", "Host and network",
             "the host kills the deploy's sshd session while `uv pip sync` runs",
             inject=inject, clear=lambda: None, hosts=BOTH, data={"sglang_lock": lock},
             words=["SSH connection to", "was lost", "| Release", "re-run"])
    seen = json.loads(testbed.ssh(SERVING, f"cat {report['path']}", check=True).stdout)
    assert seen["found"] and seen["killed_sshd"], seen


def test_install_process_killed_half_way(testbed, fleet):
    lock, rel = new_release("install-killed")
    report = {}

    def inject():
        report["path"] = watch(testbed, SERVING, "kill", UV_SYNC, "fault-kill-uv")

    run_case(testbed, "install process killed half-way", "Host and network",
             "`kill -9` of `uv pip sync` on the host", inject=inject, clear=lambda: None,
             hosts=BOTH, data={"sglang_lock": lock},
             words=[f"installing release {rel} failed", "never used", "re-run"])
    assert json.loads(testbed.ssh(SERVING, f"cat {report['path']}", check=True).stdout)["found"]
    # the half-made release never became complete, the finished one did
    assert testbed.ssh(SERVING, f"test -e /opt/sglang/releases/{rel}/.complete").returncode == 0


def test_disk_full_while_installing(testbed, fleet):
    lock, rel = new_release("disk-full")
    where = f"/opt/sglang/releases/{rel}"
    run_case(testbed, "disk full while installing", "Host and network",
             f"a 3 MiB tmpfs mounted on the new release's folder ({where})",
             inject=lambda: testbed.ssh(SERVING, f"mkdir -p {where} && mount -t tmpfs -o size=3m "
                                                 f"tmpfs {where}", check=True),
             clear=lambda: testbed.ssh(SERVING, f"umount {where}", check=True),
             hosts=BOTH, data={"sglang_lock": lock},
             words=["No space left on device", f"installing release {rel} failed", "free disk space"])


def test_stale_deploy_lock_is_taken_over_with_a_warning(testbed, fleet):
    owner = {"controller": socket.gethostname(), "pid": dead_pid(), "user": "root",
             "started": "2026-01-01T00:00:00Z", "command": "pyinfra deploy (killed earlier run)"}
    run_case(testbed, "stale deploy lock left by an earlier run", "Host and network",
             "a lock holder on the host whose controller process (same machine) is dead",
             inject=lambda: hold_lock(testbed, SERVING, owner, "fault-stale-lock"),
             clear=lambda: testbed.ssh(SERVING, "systemctl stop fault-stale-lock 2>/dev/null; true"),
             hosts=BOTH, data=next_flags(testbed), words=["took over a stale deploy lock", str(owner["pid"])],
             expect_ok=True, keeps_serving=False,
             notes="the deploy goes on (exit 0) with a warning; the host then serves the NEW flags")


def test_live_deploy_lock_stops_the_deploy_naming_the_owner(testbed, fleet):
    owner = {"controller": socket.gethostname(), "pid": os.getpid(), "user": "root",
             "started": "2026-01-01T00:00:00Z", "command": "pyinfra deploy (another shell)"}
    run_case(testbed, "deploy lock held by a live deploy", "Host and network",
             "a lock holder on the host whose controller process is alive",
             inject=lambda: hold_lock(testbed, SERVING, owner, "fault-live-lock"),
             clear=lambda: testbed.ssh(SERVING, "systemctl stop fault-live-lock"),
             hosts=BOTH, data=next_flags(testbed), words=["being deployed by someone else", f"pid {os.getpid()}",
                                       "kill "])


def test_changed_ssh_host_key_stops_the_deploy(testbed, fleet, tmp_path):
    known = Path(testbed.state["known_hosts"])
    key = tmp_path / "k"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    fake = key.with_suffix(".pub").read_text().split()[:2]
    addr = testbed.address(SPARE)
    lines = [" ".join([p[0], *fake]) if p and p[0] == addr else " ".join(p)
             for p in (x.split() for x in known.read_text().splitlines())]
    changed = tmp_path / "known_hosts.changed"
    changed.write_text("\n".join(lines) + "\n")
    before = view(testbed, SPARE)
    r = deploy({SPARE: {"ssh_known_hosts_file": str(changed)}}, hosts=(SPARE, UNTOUCHED))
    r2 = deploy({}, hosts=(SPARE, UNTOUCHED))
    out = both(r)
    rec = record("SSH host key changed", "Host and network",
                 f"{SPARE}'s line in the inventory's known-hosts file replaced by another key",
                 r, others_untouched=view(testbed, UNTOUCHED).get("health") == "200",
                 serving=view(testbed, SPARE) == before if before.get("health") == "200" else None,
                 converged=r2.returncode == 0,
                 notes="re-run: the known-hosts file with the host's real key")
    assert r.returncode != 0
    for w in (SPARE, str(changed), f"ssh-keygen -R {addr} -f {changed}"):
        assert w in out, (w, out[-3000:])
    assert rec["error"] and r2.returncode == 0, both(r2)[-3000:]
