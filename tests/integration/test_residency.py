"""The served model in the page cache, on a testbed host: `status` reports how much of it is
there, a deploy that restarts reads it in before the stop (or says why not, with the
figures), and a read-only command never reads it.

Each test first drops the model's shards from the host's page cache (posix_fadvise DONTNEED
on the host, as after a reboot), so that what it sees comes from the run under test.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import subprocess
import uuid
from pathlib import Path

from sglang_deploy.core import runspec
from sglang_deploy.core.runspec import RunSpec

from .helpers import BIN, REPO, TB1, both, changed, pyinfra_deploy

MODEL = "/srv/models/GLM-5-NVFP4"
SERVICE = "Service: launch flags, secrets, systemd unit, (re)start"
WARM_OP = f"{SERVICE} | Model {MODEL} into the page cache, before the server (re)starts"

# on the host: every shard written back and dropped from the page cache
DROP = (f"python3 -c 'import glob, os\nfor f in glob.glob(\"{MODEL}/*.safetensors\"):\n"
        "    fd = os.open(f, os.O_RDONLY); os.fsync(fd)\n"
        "    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)'")


def status(testbed, *args: str) -> subprocess.CompletedProcess:
    r = subprocess.run([str(BIN / "sglang-deploy"), "status", str(testbed.inventory), "--limit",
                        TB1, *args], cwd=REPO, capture_output=True, text=True, timeout=600,
                       check=False, stdin=subprocess.DEVNULL)
    testbed.log.append(r)
    return r


def model_memory(testbed) -> dict:
    r = status(testbed, "--json")
    assert r.stdout, both(r)[-3000:]
    (row,) = json.loads(r.stdout)["hosts"]
    return row["model_memory"]


def cold(testbed) -> None:
    testbed.ssh(TB1, DROP, check=True)


@contextlib.contextmanager
def held_in_memory(testbed):
    """The host's shards read into the page cache and locked there (mmap + mlock, from this
    machine, as root, on the host's own files under its root folder) while the block runs:
    this machine pages idle memory out by itself (DAMON reclaim), so a page read seconds
    before a figure is taken may be gone by then; a locked one stays."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    libc.mlock.argtypes = libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    held = []
    try:
        for shard in sorted(Path(testbed.host(TB1)["merged"], MODEL.lstrip("/")).glob(
                "*.safetensors")):
            fd = os.open(shard, os.O_RDONLY)
            size = os.fstat(fd).st_size
            addr = libc.mmap(None, size, 1, 1, fd, 0)  # PROT_READ, MAP_SHARED
            os.close(fd)
            assert addr not in (None, ctypes.c_void_p(-1).value), os.strerror(ctypes.get_errno())
            held.append((addr, size))
            assert libc.mlock(addr, size) == 0, os.strerror(ctypes.get_errno())
        yield
    finally:
        for addr, size in held:
            libc.munmap(addr, size)


def restart_data(*data: str) -> list[str]:
    """--data that changes the unit (a new environment variable: a restart) and DATA."""
    env = json.dumps({"RESIDENCY_TEST": uuid.uuid4().hex[:8]})
    return [a for d in (f"sglang_env={env}", *data) for a in ("--data", d)]


def test_status_reports_how_much_of_the_model_is_in_memory(testbed, deployed_host):
    deployed_host(TB1)
    cold(testbed)
    found = model_memory(testbed)
    assert found["percent"] == 0 and found["shard_bytes"] >= 64 << 20
    assert 0 < found["mem_available"] <= found["mem_total"]
    with held_in_memory(testbed):
        found = model_memory(testbed)
        assert found["percent"] == 100 and found["resident_bytes"] == found["shard_bytes"]
        r = status(testbed)
    assert f"{TB1}: model: 100% in memory (" in r.stdout, both(r)[-3000:]
    assert "MemAvailable" in r.stdout


def test_a_read_only_command_never_reads_the_model_in(testbed, deployed_host):
    deployed_host(TB1)
    cold(testbed)
    r = status(testbed)  # drift: none; nothing would restart
    assert "into the page cache" not in both(r)
    dry = subprocess.run([str(BIN / "pyinfra"), str(testbed.inventory), "deploy.py", "--limit",
                          TB1, *restart_data(), "--dry"], check=False, cwd=REPO,
                         capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    testbed.log.append(dry)
    assert dry.returncode == 0, both(dry)[-4000:]
    # the dry run plans what the run does (issue 39): the warm is named, and nothing is read
    assert "Restart sglang" in both(dry) and "into the page cache" in both(dry)
    # what the reads themselves bring in: the shards' headers, a few pages each
    assert model_memory(testbed)["percent"] <= 5


def test_a_restart_reads_the_model_in_before_the_stop(testbed, deployed_host):
    deployed_host(TB1)
    cold(testbed)
    r = pyinfra_deploy([TB1], *restart_data(), inventory=testbed.inventory)
    testbed.log.append(r)
    out = both(r)
    assert r.returncode == 0, out[-4000:]
    ops = changed(out)
    assert WARM_OP in ops, ops
    assert ops.index(WARM_OP) < ops.index(f"{SERVICE} | Restart sglang (unit changed)")
    # pyinfra's output, in the order the operations ran: the warm ended before the stop
    started = [line for line in out.splitlines() if "--> Starting operation" in line]
    warm_at = next(i for i, line in enumerate(started) if "into the page cache" in line)
    restart_at = next(i for i, line in enumerate(started) if "Restart sglang" in line)
    assert warm_at < restart_at, started
    assert "model warm: read " in out and "I/O priority idle" in out
    # measured by the warm itself, right after its read
    assert "now 100% in memory" in out, out[-4000:]


def test_a_restart_skips_the_warm_with_the_figures_when_it_does_not_fit(testbed, deployed_host):
    deployed_host(TB1)
    cold(testbed)
    r = pyinfra_deploy([TB1], *restart_data("sglang_model_warm_margin_pct=100"),
                       inventory=testbed.inventory)
    testbed.log.append(r)
    out = both(r)
    assert r.returncode == 0, out[-4000:]
    assert WARM_OP not in changed(out)
    assert "model warm skipped: does not fit: " in out, out[-4000:]
    for figure in ("to read", "margin (100% of MemTotal", "> MemAvailable",
                   "sglang_model_warm_margin_pct"):
        assert figure in out


def test_warming_off_reads_nothing_in(testbed, deployed_host):
    deployed_host(TB1)
    cold(testbed)
    r = pyinfra_deploy([TB1], *restart_data("sglang_model_warm=false"),
                       inventory=testbed.inventory)
    testbed.log.append(r)
    out = both(r)
    assert r.returncode == 0, out[-4000:]
    assert "into the page cache" not in out and "model warm" not in out


def test_a_rollouts_staging_run_reads_the_model_in_and_restarts_nothing(testbed, deployed_host):
    """The rollout's staging run (every host at once, before the first drain) reads the model
    in while the server serves: the restart that follows finds it in memory."""
    deployed_host(TB1)
    before = testbed.host_state(TB1)["invocation"]
    cold(testbed)
    r = pyinfra_deploy([TB1], *restart_data(), inventory=testbed.inventory,
                       spec=RunSpec(mode=runspec.STAGE))
    testbed.log.append(r)
    out = both(r)
    assert r.returncode == 0, out[-4000:]
    assert WARM_OP in changed(out) and "now 100% in memory" in out, out[-4000:]
    assert "Restart sglang" not in out
    assert testbed.host_state(TB1)["invocation"] == before  # still the same server


def test_a_rebuilt_host_reads_the_model_in_before_its_first_start(testbed, fresh_host):
    fresh_host(TB1)
    cold(testbed)
    r = subprocess.run([str(BIN / "sglang-deploy"), "rebuild", str(testbed.inventory), TB1],
                       cwd=REPO, capture_output=True, text=True, timeout=900, check=False,
                       stdin=subprocess.DEVNULL)
    testbed.log.append(r)
    out = both(r)
    assert r.returncode == 0, out[-4000:]
    started = [line for line in out.splitlines() if "--> Starting operation" in line]
    warm_at = next(i for i, line in enumerate(started) if "into the page cache" in line)
    start_at = next(i for i, line in enumerate(started) if line.rstrip().endswith("| Start sglang"))
    assert warm_at < start_at, started
    assert "now 100% in memory" in out, out[-4000:]
