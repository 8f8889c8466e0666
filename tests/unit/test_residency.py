"""The served model in the page cache: the host-side measure (mincore over real files), the
warm script, and the pure decision of whether to read the shards in before a restart."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from sglang_deploy.core import progress, residency
from sglang_deploy.core.hostrecords import Memory, ModelState
from sglang_deploy.core.residency import NONE, SKIP, WARM, Residency, warm_decision
from testbed.sim.model import make_model_dir

REMOTE = Path(__file__).resolve().parents[2] / "sglang_deploy" / "remote"
sys.path.insert(0, str(REMOTE))
import hoststate

MiB = 1 << 20
GB = 1000 ** 3


def drop(path) -> None:
    """Evict PATH's pages from the page cache (written back first: a dirty page stays)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


@contextlib.contextmanager
def locked(path):
    """PATH's pages read in and locked in memory (mmap + mlock) while the block runs: a machine
    may page idle memory out by itself (DAMON reclaim), and a locked page stays resident."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    libc.mlock.argtypes = libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    fd = os.open(path, os.O_RDONLY)
    size = os.fstat(fd).st_size
    addr = libc.mmap(None, size, 1, 1, fd, 0)  # PROT_READ, MAP_SHARED
    os.close(fd)
    assert addr not in (None, ctypes.c_void_p(-1).value), os.strerror(ctypes.get_errno())
    try:
        assert libc.mlock(addr, size) == 0, os.strerror(ctypes.get_errno())
        yield
    finally:
        libc.munmap(addr, size)


@pytest.fixture
def disk_dir():
    """A folder on a disk file system (tmpfs pages cannot be dropped: /var/tmp, not /tmp)."""
    path = tempfile.mkdtemp(prefix="residency-", dir="/var/tmp")
    yield Path(path)
    shutil.rmtree(path, ignore_errors=True)


# ------------------------------------------------------------------ the host-side measure
def test_a_file_just_written_on_tmpfs_is_all_resident():
    with tempfile.NamedTemporaryFile(dir="/dev/shm") as fh:
        fh.write(os.urandom(3 * MiB + 123))  # not a whole number of pages
        fh.flush()
        assert hoststate.resident_bytes(fh.name) == 3 * MiB + 123


def test_a_dropped_file_reads_as_not_resident_and_a_read_brings_it_back(disk_dir):
    path = disk_dir / "shard.bin"
    path.write_bytes(os.urandom(16 * MiB))
    drop(path)
    assert hoststate.resident_bytes(str(path)) == 0
    with open(path, "rb") as fh:
        fh.read()
    assert hoststate.resident_bytes(str(path)) == 16 * MiB


def test_an_empty_or_missing_file():
    with tempfile.NamedTemporaryFile(dir="/var/tmp") as fh:
        assert hoststate.resident_bytes(fh.name) == 0
    assert hoststate.resident_bytes("/nonexistent/shard.safetensors") is None


def test_meminfo_reports_available_and_total_in_bytes():
    mem = hoststate.meminfo()
    assert 0 < mem["available"] <= mem["total"]
    assert mem["total"] > 64 * MiB  # kB were turned into bytes


def test_the_state_read_reports_each_shards_residency_and_the_memory(disk_dir):
    model = make_model_dir(disk_dir / "m", n_shards=2, shard_bytes=3 * MiB)
    shards = sorted(model.glob("*.safetensors"))
    drop(shards[0])
    with locked(shards[1]):
        out = subprocess.run([sys.executable, str(REMOTE / "hoststate.py"), "state", "--root",
                              str(disk_dir / "root"), "--service", "none-such", "--model",
                              str(model)], capture_output=True, text=True, check=True)
    state = json.loads(out.stdout)
    found = state["model"]["shards"]
    size = found[shards[0].name]["size"]
    # the header the read itself parsed is back in the cache: one page at most
    assert found[shards[0].name]["resident"] <= os.sysconf("SC_PAGE_SIZE")
    assert found[shards[1].name]["resident"] == size
    res = of(state["model"], state["memory"])
    assert res.shards == 2 and res.shard_bytes == 2 * size
    assert 49 <= res.percent <= 51 and res.mem_available == state["memory"]["available"]


def of(model, memory) -> Residency | None:
    """``Residency.of`` the typed records of the wire form MODEL and MEMORY."""
    return Residency.of(ModelState.from_json(model), Memory.from_json(memory))


# ------------------------------------------------------------------ the warm script
def run_warm(model, *args: str) -> tuple[list[dict], dict]:
    out = subprocess.run([sys.executable, str(REMOTE / "model_warm.py"), "warm", "--model",
                          str(model), "--every", "0.001", *args], capture_output=True, text=True,
                         check=False)
    lines = out.stdout.strip().splitlines()
    samples = [s for s in map(progress.parse, lines) if s is not None]
    return samples, json.loads(lines[-1])


def test_warm_reads_what_is_missing_and_reports_bytes_and_rate(disk_dir):
    model = make_model_dir(disk_dir / "m", n_shards=3, shard_bytes=3 * MiB)
    shards = sorted(model.glob("*.safetensors"))
    for shard in shards[:2]:
        drop(shard)
    with locked(shards[2]):  # in the page cache, and kept there
        samples, result = run_warm(model)
    assert result["ok"] and result["stopped"] is None
    sizes = [s.stat().st_size for s in shards]
    # only the two dropped shards were read (each one window), the third was in the cache
    assert result["read_bytes"] == result["to_read_bytes"] == sizes[0] + sizes[1]
    # measured by the warm right after its read
    assert result["shard_bytes"] == result["resident_after"] == sum(sizes)
    last = samples[-1]
    assert last["kind"] == "warm" and last["done_bytes"] == last["total_bytes"]
    assert last["files_done"] == last["files_total"] == 2
    assert progress.describe(last).startswith("model into the page cache: ")
    assert "model warm: read " in residency.result_text(result)


def test_warm_stops_when_memory_falls_below_the_margin(disk_dir):
    model = make_model_dir(disk_dir / "m", n_shards=1, shard_bytes=3 * MiB)
    drop(next(model.glob("*.safetensors")))
    _, result = run_warm(model, "--keep-available", str(1 << 60))
    assert result["ok"] and result["read_bytes"] == 0
    assert "MemAvailable fell to" in result["stopped"]
    assert "stopped early: MemAvailable" in residency.result_text(result)


def test_measure_prints_the_model_and_the_memory(disk_dir):
    model = make_model_dir(disk_dir / "m", n_shards=1, shard_bytes=MiB)
    out = subprocess.run([sys.executable, str(REMOTE / "model_warm.py"), "measure", "--model",
                          str(model)], capture_output=True, text=True, check=True)
    doc = json.loads(out.stdout)
    assert of(doc["model"], doc["memory"]).shard_bytes > MiB


# ------------------------------------------------------------------ the pure decision
def shards(*pairs) -> dict:
    return {"shards": {f"s{i}": {"exists": True, "size": size, "resident": res}
                       for i, (size, res) in enumerate(pairs)}}


MEM = {"available": 200 * GB, "total": 512 * GB}


def decide(model, memory=MEM, **kw):
    args = {"enabled": True, "restart_coming": True, "margin_pct": 10}
    return warm_decision(of(model, memory), **{**args, **kw})


def test_residency_percent_and_text():
    res = of(shards((300 * GB, 300 * GB), (100 * GB, 88 * GB)), MEM)
    assert res.shard_bytes == 400 * GB and res.missing_bytes == 12 * GB and res.percent == 97
    assert res.text() == "97% in memory (388.0 GB of 400.0 GB; MemAvailable 200.0 GB)"
    assert of({"shards": {}}, MEM) is None
    assert of(shards((GB, None)), MEM).percent is None


def test_warm_when_missing_bytes_and_margin_fit():
    d = decide(shards((100 * GB, 0), (100 * GB, 100 * GB)))
    assert d.action == WARM and d.read_bytes == 100 * GB
    assert d.keep_available == int(512 * GB * 0.10)
    assert "100.0 GB of 200.0 GB not in memory" in d.reason


def test_skip_with_the_figures_when_they_do_not_fit():
    d = decide(shards((180 * GB, 0)))  # 180 GB + 51.2 GB margin > 200 GB available
    assert d.action == SKIP
    for figure in ("180.0 GB to read", "51.2 GB margin", "10% of MemTotal 512.0 GB",
                   "231.2 GB > MemAvailable 200.0 GB", "sglang_model_warm_margin_pct"):
        assert figure in d.reason
    assert decide(shards((180 * GB, 0)), margin_pct=0).action == WARM


def test_nothing_to_do_off_no_restart_or_already_in_memory():
    cold = shards((100 * GB, 0))
    assert decide(cold, enabled=False).action == NONE
    assert "sglang_model_warm" in decide(cold, enabled=False).reason
    assert decide(cold, restart_coming=False).action == NONE
    warm = decide(shards((100 * GB, 100 * GB)))
    assert warm.action == NONE and warm.reason.startswith("already 100% in memory")
    assert decide(None).action == NONE


def test_a_download_in_this_run_warms_and_decides_on_the_host():
    assert decide({"shards": {}}, pending=True).action == WARM


def test_unknown_residency_or_memory_is_a_skip_that_says_so():
    assert decide(shards((GB, None))).action == SKIP
    d = decide(shards((GB, 0)), memory={})
    assert d.action == SKIP and "MemAvailable" in d.reason


# ------------------------------------------------------------------ what status and report show
def test_status_and_the_report_show_the_model_in_memory():
    import io

    from sglang_deploy.commands import htmlreport, status
    from sglang_deploy.core import fleetreport
    from sglang_deploy.core.hoststate import HostState
    from sglang_deploy.integration import plan

    hs = HostState.from_json({"model": shards((300 * GB, 300 * GB), (100 * GB, 88 * GB)),
                              "memory": MEM})
    fields = plan.status_fields(hs, None, "r1")
    assert fields["model_memory"]["percent"] == 97
    assert fields["model_memory"]["mem_available"] == 200 * GB
    row = {"host": "h1", "reachable": True, "in_sync": True, "healthy": True, **fields}
    out = io.StringIO()
    status.render_model_memory([row, {"host": "h2", "model_memory": None}], out)
    assert out.getvalue() == \
        "h1: model: 97% in memory (388.0 GB of 400.0 GB; MemAvailable 200.0 GB)\n"
    doc = fleetreport.build("inv.py", ["h1"], [row], {}, {}, {}, "now")
    assert doc["hosts"][0]["status"]["model_memory"]["percent"] == 97
    page = htmlreport.render_html(doc)
    assert '<td data-field="model_memory" title="97% in memory (388.0 GB of 400.0 GB; ' \
           'MemAvailable 200.0 GB)">97%</td>' in page


def test_the_typed_host_state_carries_the_memory_beside_the_model():
    from sglang_deploy.core.hoststate import HostState

    hs = HostState.from_json({"model": shards((GB, GB)), "memory": MEM})
    assert hs.memory == Memory(available=MEM["available"], total=MEM["total"])
    assert Residency.of(hs.model, hs.memory).percent == 100
    assert HostState.from_json({}).memory is None
