"""The optional model download, end to end: the real deploy.py downloads with the real
huggingface_hub (in the release venv) from a stand-in Hugging Face endpoint that the
controller serves on the testbed bridge (testbed/hfmirror.py), then serves the model.

One host (the first of the testbed): a refused token fails with cause and fix (on a blank
host); the right token downloads into an empty model folder and the server becomes READY;
a second run on the host deployed that way changes nothing. Each test sets up its host with
conftest's fixtures. The token must never show in pyinfra's
output (-vvv), in any process's argv on the host, nor in any world-readable file there.
"""

from __future__ import annotations

import os
import re
import subprocess
import time

from sglang_deploy.core import progress
from testbed.hfmirror import Mirror

from .helpers import PYINFRA, REPO, TB1
from .hubmirror import HF_REPO, MODEL_PATH, TOKEN, download_data, mirror  # noqa: F401

HOST = TB1
def data_args(mirror: Mirror) -> list[str]:
    return [arg for d in download_data(mirror) for arg in ("--data", d)]


def deploy_cmd(testbed, mirror, *extra: str) -> list[str]:
    return [PYINFRA, "-y", str(testbed.inventory), "deploy.py", "--limit", HOST,
            *data_args(mirror), *extra]


def run_deploy(testbed, mirror, token: str, *extra: str) -> subprocess.CompletedProcess:
    r = subprocess.run(deploy_cmd(testbed, mirror, *extra), cwd=REPO, capture_output=True,
                       text=True, timeout=900, check=False, stdin=subprocess.DEVNULL,
                       env={**os.environ, "TB_HF_TOKEN": token})
    testbed.log.append(r)
    return r


def changed(out: str) -> list[str]:
    rows = []
    for line in out.splitlines():
        m = re.match(r"\s{4}(.+?)\s{2,}(\d+)\s+([\d-]+)\s+([\d-]+)\s+([\d-]+)\s*$", line)
        if m and m.group(1).strip() != "Grand total" and m.group(3) not in ("-", "0"):
            rows.append(m.group(1).strip())
    return rows


def test_a_refused_token_fails_naming_cause_and_fix(testbed, fresh_host, mirror):
    fresh_host(HOST)  # no model, no token file, the service never started
    wrong = "hf_WrongT0kenAbc123"
    r = run_deploy(testbed, mirror, wrong)
    out = r.stdout + r.stderr
    assert r.returncode != 0, out[-3000:]
    assert "model download failed" in out, out[-3000:]
    assert "401" in out and "Invalid credentials" in out
    assert "refused the token" in out and "TB_HF_TOKEN" in out  # cause and the variable to fix
    assert wrong not in out
    # the wrong token reached the endpoint only in the Authorization header
    seen = [q for q in mirror.requests if q["authorization"] == f"Bearer {wrong}"]
    assert seen and all(wrong not in q["path"] for q in mirror.requests)
    # nothing of the model was written, the token file is gone, the service never started
    state = testbed.ssh(HOST, f"ls -A {MODEL_PATH}; test -e /etc/sglang/.hf-token && echo LEFT; "
                              "systemctl is-active sglang.service").stdout
    assert ".safetensors" not in state and "LEFT" not in state
    assert state.strip().splitlines()[-1] != "active"


def test_empty_model_path_downloads_then_serves_without_leaking_the_token(testbed, mirror):
    # the model folder is empty: nothing of the model is on the host yet
    testbed.ssh(HOST, f"rm -rf {MODEL_PATH}", check=True)
    mirror.requests.clear()
    proc = subprocess.Popen(deploy_cmd(testbed, mirror, "-vvv"), cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, env={**os.environ, "TB_HF_TOKEN": TOKEN})
    # While the deploy runs, watch every process's argv on the host from another SSH session.
    listings = []
    reader = _Reader(proc)
    deadline = time.monotonic() + 900
    while proc.poll() is None:
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"the deploy did not end within 900 s; last output:\n"
                                 f"{reader.text()[-3000:]}")
        listings.append(testbed.ssh(HOST, "ps -eww -o args", timeout=30).stdout)
        reader.wait(0.3)  # poll interval; returns at once when the deploy's output ends
    out = reader.text()
    testbed.log.append(out)
    assert proc.returncode == 0, out[-5000:]
    assert f"READY {HOST}" in out
    # the download's progress, measured on the host against the repo's file list: complete
    total = sum(size for size, _, _ in mirror.repo.files.values())
    shown = re.findall(rf"\[{HOST}\] model download: .* of (.*?) \(([\d.]+)%\)", out)
    assert shown and shown[-1] == (progress.size(total), "100.0"), shown
    assert TOKEN not in out, "the token must not appear in pyinfra's -vvv output"
    # -vvv shows the download's command line: it names the token FILE, never the token
    fetch_lines = [ln for ln in out.splitlines() if "model_fetch.py --repo" in ln]
    assert fetch_lines and all("--token-file /etc/sglang/.hf-token" in ln for ln in fetch_lines)
    assert len(listings) >= 2 and not any(TOKEN in ps for ps in listings)
    # every request came with the token in the Authorization header, never in the URL
    assert mirror.requests and all(q["authorization"] == f"Bearer {TOKEN}" for q in mirror.requests)
    assert all(TOKEN not in q["path"] for q in mirror.requests)
    assert any("/resolve/" in q["path"] and q["method"] == "GET" for q in mirror.requests)
    # every shard arrived whole and the service user can read them
    for i in range(1, 5):
        shard = f"{MODEL_PATH}/model-{i:05d}-of-00004.safetensors"
        testbed.ssh(HOST, f"runuser -u sglang -- cmp {shard} {shard}", check=True)
    size = testbed.ssh(HOST, f"stat -c %s {MODEL_PATH}/model-00004-of-00004.safetensors",
                       check=True).stdout.strip()
    assert int(size) == (mirror.repo.root / "model-00004-of-00004.safetensors").stat().st_size
    # the server was started on the downloaded folder
    unit = testbed.ssh(HOST, "cat /etc/systemd/system/sglang.service", check=True).stdout
    assert f"--model-path {MODEL_PATH}" in unit
    # no token file left, and the token is in no world-readable file on the host
    assert testbed.ssh(HOST, "test -e /etc/sglang/.hf-token").returncode != 0
    found = testbed.ssh(
        HOST, f"find / -xdev -type f -perm -o=r -size -64M -print0 2>/dev/null "
              f"| xargs -0 grep -l -F -- {TOKEN} 2>/dev/null; true", timeout=600).stdout
    assert found.strip() == "", found
    mode = testbed.ssh(HOST, "stat -c '%a %U' /etc/sglang/secrets.env", check=True).stdout.strip()
    assert mode == "600 root"


def test_second_run_downloads_nothing_and_changes_nothing(testbed, deployed_host, mirror):
    deployed_host(HOST, data=download_data(mirror), env={"TB_HF_TOKEN": TOKEN})
    before = testbed.ssh(HOST, "systemctl show -p InvocationID --value sglang.service",
                         check=True).stdout.strip()
    mirror.requests.clear()
    r = run_deploy(testbed, mirror, TOKEN)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    assert changed(out) == []
    assert mirror.requests == []  # not even asked
    after = testbed.ssh(HOST, "systemctl show -p InvocationID --value sglang.service",
                        check=True).stdout.strip()
    assert after == before


class _Reader:
    """Collects a child's output in a thread so the test can poll while it runs."""

    def __init__(self, proc: subprocess.Popen):
        import threading

        self.chunks: list[str] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(proc,), daemon=True)
        self.thread.start()

    def _run(self, proc):
        for line in proc.stdout:
            self.chunks.append(line)
        self.done.set()

    def wait(self, seconds: float) -> None:
        self.done.wait(seconds)

    def text(self) -> str:
        self.thread.join(timeout=60)
        return "".join(self.chunks)
