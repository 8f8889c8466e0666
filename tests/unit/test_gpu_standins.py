"""Unit tests of the GPU stand-ins (testbed/gpu): nvidia-smi script and libcuda.so.1.

No containers.  The nvidia-smi outputs are compared with REAL samples copied into
tests/fixtures/nvidia-smi/; the libcuda stand-in is built against the real cuda.h and
driven by a small C client (tests/fixtures/c/probe.c) linked with -lcuda.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from testbed.gpu import build as B

REPO = Path(__file__).resolve().parents[2]
FIX = REPO / "tests" / "fixtures"
SMI = REPO / "testbed" / "gpu" / "nvidia_smi.py"
PROBE_SRC = FIX / "c" / "probe.c"
WIDTH = 91


# --------------------------------------------------------------------------- helpers


def sample(name: str) -> list[str]:
    """Lines of a real sample (verbatim).  The fixture is either the raw output or the
    shared-collection form with a header and the output between '# BEGIN' and '# END'."""
    (path,) = (FIX / "nvidia-smi").glob(name + "*")
    lines = path.read_text().split("\n")
    if "# BEGIN" in lines:
        return lines[lines.index("# BEGIN") + 1: lines.index("# END")]
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def legend(lines: list[str]) -> list[str]:
    i = lines.index("Legend:")
    out = lines[i:]
    while out and out[-1] == "":
        out.pop()
    return out


class Host:
    """A fake host: gpu.env + a /dev root with (regular-file) device nodes."""

    def __init__(self, root: Path, **keys: str) -> None:
        self.root = root
        self.dev = root / "dev"
        self.dev.mkdir(parents=True, exist_ok=True)
        self.envfile = root / "gpu.env"
        self.keys = {"GPU_COUNT": "8", "SCENARIO": "healthy", "HOSTNAME": "tb-host-1"}
        self.keys.update(keys)
        self.write()
        for n in ["nvidiactl", "nvidia-uvm"] + [f"nvidia{i}" for i in range(8)]:
            (self.dev / n).touch()

    def write(self, **keys: str) -> None:
        self.keys.update(keys)
        body = "".join(f"{k}={v}\n" for k, v in self.keys.items())
        self.envfile.write_text("# testbed gpu.env\n" + body)

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["TESTBED_GPU_ENV"] = str(self.envfile)
        env["TESTBED_DEV_ROOT"] = str(self.dev)
        return env

    def smi(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(SMI), *args], env=self.env(),
                              capture_output=True, text=True, timeout=30, check=False)


@pytest.fixture
def host(tmp_path: Path) -> Host:
    return Host(tmp_path)


# --------------------------------------------------------------------------- nvidia-smi: table


def test_table_matches_real_layout(host: Host) -> None:
    r = host.smi()
    assert r.returncode == 0, r.stdout
    out = r.stdout.split("\n")
    assert out[-1] == ""
    out = out[:-1]
    real38, real40 = sample("38_"), sample("40_")
    # date line as in the real 580 sample ("Fri Dec 26 17:58:18 2025")
    date_re = re.compile(r"^\w{3} \w{3} [ \d]\d \d\d:\d\d:\d\d \d{4}$")
    assert date_re.match(real40[1]) and date_re.match(out[0])
    assert real40[2] == real38[0] == out[1] == "+" + "-" * 89 + "+"
    # version header: same pattern and column positions as the real ones
    head_re = re.compile(r"^\| NVIDIA-SMI (\S+) +Driver Version: (\S+) +CUDA Version: (\S+) +\|$")
    for real in (real38[1], real40[3]):
        assert head_re.match(real)
        assert real.index("Driver Version") == out[2].index("Driver Version")
        assert real.index("CUDA Version") == out[2].index("CUDA Version")
    assert head_re.match(out[2]).groups() == ("580.95.05", "580.95.05", "13.0")
    # 580 header block is byte-identical to the real 580 sample ('+---' under the version line)
    assert out[3:7] == real40[4:8]
    assert out[4:8] == real38[3:7]
    # per-GPU rows: 3 lines + separator, '|' at the same columns as in the real table
    gpu_lines = out[8:8 + 8 * 4]
    real_rows = real38[7:11]
    for k in range(8):
        block = gpu_lines[4 * k: 4 * k + 4]
        for ours, real in zip(block, real_rows):
            assert len(ours) == WIDTH
            assert [i for i, c in enumerate(ours) if c in "|+"] == \
                   [i for i, c in enumerate(real) if c in "|+"], (ours, real)
        assert re.match(rf"^\|\s+{k}  NVIDIA RTX PRO 6000 Blac\.\.\.\s+On  \|   "
                        r"00000000:[0-9A-F]{2}:00\.0 Off \|", block[0])
        assert re.search(r"\|\s+0MiB /  97887MiB \|", block[1])
    # name truncated exactly like the real tool (24 chars + '...')
    assert len("NVIDIA RTX PRO 6000 Blac...") == len("NVIDIA RTX 6000 Ada Gene...")
    # blank line + processes block identical to the real one
    assert out[8 + 32:] == real38[-8:]


def test_table_with_id_shows_one_gpu(host: Host) -> None:
    r = host.smi("-i", "3")
    assert r.returncode == 0
    rows = [ln for ln in r.stdout.splitlines() if re.match(r"^\|\s+\d+  NVIDIA", ln)]
    assert len(rows) == 1 and "00000000:61:00.0" in rows[0]


# --------------------------------------------------------------------------- nvidia-smi: query


def test_query_header_and_units_like_real(host: Host) -> None:
    real = sample("07_")
    r = host.smi("--query-gpu=index,name,temperature.gpu,power.draw,power.limit,"
                 "ecc.errors.corrected.volatile.total,ecc.errors.uncorrected.volatile.total",
                 "--format=csv")
    assert r.returncode == 0
    lines = r.stdout.splitlines()
    assert lines[0] == real[0]
    row_re = re.compile(r"^\d+, NVIDIA RTX PRO 6000 Blackwell Server Edition, \d+, "
                        r"\d+\.\d\d W, \d+\.\d\d W, 0, 0$")
    assert row_re.match(real[1]) and row_re.match(real[2])
    assert len(lines) == 9 and all(row_re.match(ln) for ln in lines[1:])


def test_query_uuid_driver_mem_mig_like_real(host: Host) -> None:
    real = sample("08_")
    r = host.smi("--query-gpu=index,name,uuid,driver_version,memory.total,mig.mode.current",
                 "--format=csv,noheader")
    assert r.returncode == 0
    row_re = re.compile(r"^(\d+), NVIDIA RTX PRO 6000 Blackwell Server Edition, "
                        r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}, "
                        r"\d+\.\d+\.\d+, 97887 MiB, (Enabled|Disabled)$")
    assert row_re.match(real[0]) and row_re.match(real[1])
    lines = r.stdout.splitlines()
    assert [int(row_re.match(ln).group(1)) for ln in lines] == list(range(8))
    uuids = [ln.split(", ")[2] for ln in lines]
    assert len(set(uuids)) == 8
    # stable: same host name -> same uuids; other host -> other uuids
    assert host.smi("--query-gpu=uuid", "--format=csv,noheader").stdout.split() == uuids
    host.write(HOSTNAME="tb-host-2")
    assert not set(host.smi("--query-gpu=uuid", "--format=csv,noheader").stdout.split()) & set(uuids)


def test_query_all_contract_fields(host: Host) -> None:
    fields = ("index,name,uuid,driver_version,memory.total,memory.used,memory.free,compute_cap,"
              "pci.bus_id,persistence_mode,mig.mode.current,power.draw,temperature.gpu,"
              "utilization.gpu,count")
    r = host.smi(f"--query-gpu={fields}", "--format=csv", "-i", "1")
    assert r.returncode == 0
    head, row = r.stdout.splitlines()
    assert head == ("index, name, uuid, driver_version, memory.total [MiB], memory.used [MiB], "
                    "memory.free [MiB], compute_cap, pci.bus_id, persistence_mode, "
                    "mig.mode.current, power.draw [W], temperature.gpu, utilization.gpu [%], count")
    v = row.split(", ")
    assert v[0] == "1" and v[3] == "580.95.05"
    assert v[4:7] == ["97887 MiB", "0 MiB", "97887 MiB"]
    assert v[7] == "12.0" and v[8] == "00000000:25:00.0"
    assert v[9] == "Enabled" and v[10] == "Disabled"
    assert re.match(r"^\d+\.\d\d W$", v[11]) and v[12].isdigit()
    assert v[13] == "0 %" and v[14] == "8"
    r = host.smi(f"--query-gpu={fields}", "--format=csv,noheader,nounits", "--id=0,7")
    rows = r.stdout.splitlines()
    assert [x.split(", ")[0] for x in rows] == ["0", "7"]
    v = rows[0].split(", ")
    assert v[4:7] == ["97887", "0", "97887"] and v[13] == "0" and re.match(r"^\d+\.\d\d$", v[11])


def test_query_accepts_separate_option_values(host: Host) -> None:
    r = host.smi("--query-gpu", "index,memory.total", "--format", "csv,noheader,nounits")
    assert r.returncode == 0 and r.stdout.splitlines()[0] == "0, 97887"


def test_query_unknown_field_real_error(host: Host) -> None:
    r = host.smi("--query-gpu=index,xyz", "--format=csv")
    assert r.returncode == 2
    assert r.stdout == 'Field "xyz" is not a valid field to query.\n\n'


def test_query_bad_id(host: Host) -> None:
    r = host.smi("--query-gpu=index", "--format=csv", "-i", "9")
    assert r.returncode == 6 and r.stdout == "No devices were found\n"


def test_list_and_version(host: Host) -> None:
    r = host.smi("-L")
    lines = r.stdout.splitlines()
    assert len(lines) == 8
    assert re.match(r"^GPU 0: NVIDIA RTX PRO 6000 Blackwell Server Edition \(UUID: GPU-[0-9a-f-]{36}\)$",
                    lines[0])
    r = host.smi("--version")
    assert "DRIVER version      : 580.95.05" in r.stdout and "CUDA Version        : 13.0" in r.stdout


# --------------------------------------------------------------------------- nvidia-smi: topo


def test_topo_m_like_real(host: Host) -> None:
    real = sample("01_")
    r = host.smi("topo", "-m")
    assert r.returncode == 0
    out = r.stdout.split("\n")
    # header: starts with a tab, same trailing columns as the real one
    assert real[0].startswith("\t") and out[0].startswith("\t")
    assert out[0].split("\t")[-3:] == real[0].split("\t")[-3:] == \
        ["CPU Affinity", "NUMA Affinity", "GPU NUMA ID"]
    assert out[0].split("\t")[1:9] == [f"GPU{i}" for i in range(8)]
    # rows: GPUn, cells, affinity, numa, '', 'N/A' -- like 'GPU0\t X \tPHB\t0-63\t0\t\tN/A'
    real_cells = real[1].split("\t")
    assert real_cells[1] == " X " and real_cells[-2:] == ["", "N/A"]
    for i in range(8):
        cells = out[1 + i].split("\t")
        assert cells[0] == f"GPU{i}" and len(cells) == 1 + 8 + 4
        assert cells[-2:] == ["", "N/A"]
        assert cells[1 + i] == " X "
        for j in range(8):
            if j != i:
                assert cells[1 + j] == ("NODE" if (i < 4) == (j < 4) else "SYS")
        assert cells[10] == str(i // 4)
        assert re.match(r"^\d+-\d+(,\d+-\d+)*$", cells[9])
    assert out[9] == ""
    assert legend(out) == legend(real)


def test_topo_p2p_like_real(host: Host) -> None:
    real = sample("02_")
    for args in (("topo", "-p2p", "r"), ("topo", "-p2pr"), ("topo", "-p2p", "w")):
        r = host.smi(*args)
        assert r.returncode == 0, args
        out = r.stdout.split("\n")
        # real: ' \tGPU0\tGPU1\t' / ' GPU0\tX\tGNS\t'
        assert real[0] == " \tGPU0\tGPU1\t" and real[1].startswith(" GPU0\tX\t")
        assert out[0] == " \t" + "".join(f"GPU{i}\t" for i in range(8))
        for i in range(8):
            cells = out[1 + i].split("\t")
            assert cells[0] == f" GPU{i}" and cells[-1] == "" and len(cells) == 10
            assert cells[1 + i] == "X"
            assert all(c == "OK" for j, c in enumerate(cells[1:9]) if j != i)
        assert out[9] == ""
        assert legend(out) == legend(real)
    r = host.smi("topo", "-p2p", "n")
    assert "OK" not in r.stdout.split("Legend")[0]


def test_topo_bad_capability(host: Host) -> None:
    assert host.smi("topo", "-p2p", "z").returncode != 0


# --------------------------------------------------------------------------- nvidia-smi: scenarios


def test_driver_mismatch_every_command(host: Host) -> None:
    real = sample("11_")
    host.write(SCENARIO="driver-mismatch")
    for args in ((), ("--query-gpu=index", "--format=csv"), ("topo", "-m"), ("topo", "-p2p", "r"),
                 ("-L",)):
        r = host.smi(*args)
        assert r.returncode == 18, args
        assert r.stdout.splitlines()[0] == real[-1] == \
            "Failed to initialize NVML: Driver/library version mismatch"
        assert r.stdout == ("Failed to initialize NVML: Driver/library version mismatch\n"
                            "NVML library version: 580.95\n")


def test_gpu_missing(host: Host) -> None:
    host.write(SCENARIO="gpu-missing")
    r = host.smi("--query-gpu=index,count", "--format=csv,noheader")
    assert r.stdout.splitlines() == [f"{i}, 7" for i in range(7)]
    assert len(host.smi("topo", "-m").stdout.split("\n\n")[0].splitlines()) == 1 + 7
    assert len(host.smi("topo", "-p2p", "r").stdout.split("\n\n")[0].splitlines()) == 1 + 7


def test_p2p_unsupported(host: Host) -> None:
    host.write(SCENARIO="p2p-unsupported")
    for cap in "rw":
        out = host.smi("topo", "-p2p", cap).stdout.split("\n\n")[0].splitlines()
        cells = [c for ln in out[1:] for c in ln.split("\t")[1:-1]]
        assert sorted(set(cells)) == ["NS", "X"]
    assert host.smi("topo", "-m").returncode == 0


def test_uvm_missing_nvidia_smi_still_works(host: Host) -> None:
    host.write(SCENARIO="uvm-missing")
    (host.dev / "nvidia-uvm").unlink()
    assert host.smi().returncode == 0
    assert host.smi("--query-gpu=count", "--format=csv,noheader").stdout.startswith("8\n")


def test_no_nvidiactl_cannot_communicate(host: Host) -> None:
    (host.dev / "nvidiactl").unlink()
    r = host.smi()
    assert r.returncode == 9
    assert r.stdout.splitlines() == sample("13_")[1:]


def test_config_change_takes_effect_without_restart(host: Host) -> None:
    assert host.smi("--query-gpu=count", "--format=csv,noheader").stdout.startswith("8\n")
    host.write(GPU_COUNT="4", GPU_MEMORY_MIB="49140", DRIVER_VERSION="570.172.08",
               CUDA_VERSION="12.8")
    r = host.smi("--query-gpu=count,memory.total,driver_version", "--format=csv,noheader")
    assert r.stdout.splitlines()[0] == "4, 49140 MiB, 570.172.08"
    table = host.smi().stdout
    assert "CUDA Version: 12.8" in table and "|-----------------------------------------+" in table


def test_env_comments_and_quotes(host: Host) -> None:
    host.envfile.write_text('GPU_COUNT=2      # two cards\nGPU_NAME="NVIDIA Test GPU"\n'
                            "SCENARIO=healthy\n")
    r = host.smi("--query-gpu=count,name", "--format=csv,noheader")
    assert r.stdout == "2, NVIDIA Test GPU\n2, NVIDIA Test GPU\n"


def test_replay_dir(host: Host, tmp_path: Path) -> None:
    rd = tmp_path / "replay"
    rd.mkdir()
    files = {
        "nvidia-smi.txt": ((), "\n".join(sample("40_")[1:]) + "\n"),
        "query-gpu.csv": (("--query-gpu=index,name", "--format=csv"), "\n".join(sample("07_")) + "\n"),
        "topo-m.txt": (("topo", "-m"), "\n".join(sample("01_")) + "\n"),
        "topo-p2p-r.txt": (("topo", "-p2p", "r"), "\n".join(sample("02_")) + "\n"),
    }
    for name, (_, text) in files.items():
        (rd / name).write_text(text)
    host.write(REPLAY_DIR=str(rd), SCENARIO="driver-mismatch")
    for name, (args, text) in files.items():
        r = host.smi(*args)
        assert (r.returncode, r.stdout) == (0, text), name
    # no topo-p2p-w.txt: behaves as normal (here: the scenario)
    assert host.smi("topo", "-p2p", "w").returncode == 18
    host.write(SCENARIO="healthy")
    assert host.smi("topo", "-p2p", "w").stdout.startswith(" \tGPU0\t")


def test_script_runs_via_shebang(host: Host, tmp_path: Path) -> None:
    first = SMI.read_text().splitlines()[0]
    assert first == "#!/usr/bin/python3"
    if not Path("/usr/bin/python3").exists():
        pytest.fail("/usr/bin/python3 missing")
    exe = tmp_path / "nvidia-smi"
    shutil.copy(SMI, exe)
    exe.chmod(0o755)
    r = subprocess.run([str(exe), "-L"], env=host.env(), capture_output=True, text=True, timeout=30, check=False)
    assert r.returncode == 0 and r.stdout.count("GPU ") == 8


# ------------------------------------------------------------------------ nvidia-smi: C fast path
#
# testbed/gpu/nvidia_smi_fast.c answers the requests it knows byte-identically to
# nvidia_smi.py and execs the Python stand-in for everything else.  The differential test
# runs the binary with $TESTBED_SMI_FALLBACK pointing at a sentinel script: a sentinel answer
# proves the fallback was taken (and with which arguments); any other answer must equal
# nvidia_smi.run() for the same gpu.env and device root, byte for byte, exit code included.

FALLBACK_MARK = "@@testbed-smi-fallback@@"
SMI_FIELDS = ["index", "name", "gpu_name", "uuid", "gpu_uuid", "driver_version", "count",
              "memory.total", "memory.used", "memory.free", "compute_cap", "pci.bus_id",
              "gpu_bus_id"]
SMI_FORMATS = ["csv", "csv,noheader", "csv,nounits", "csv,noheader,nounits"]


def deploy_smi_commands() -> list[list[str]]:
    """The nvidia-smi calls the deploy makes on every run (facts.GPU_SECTIONS)."""
    from sglang_deploy.shell.facts import GPU_SECTIONS

    cmds = [shlex.split(c) for c in GPU_SECTIONS.values() if c.startswith("nvidia-smi ")]
    assert all(c[0] == "nvidia-smi" for c in cmds)
    return [c[1:] for c in cmds]


def fast_args() -> list[list[str]]:
    """Requests the fast path must answer itself."""
    out = deploy_smi_commands()
    out += [[f"--query-gpu={','.join(SMI_FIELDS)}", f"--format={f}"] for f in SMI_FORMATS]
    out += [
        ["--query-gpu", "index,memory.total", "--format", "csv,noheader,nounits"],
        ["--format=csv", "--query-gpu=uuid,gpu_name"],
        ["--format", "nounits,csv", "--query-gpu", " index , memory.free ,"],
        ["--query-gpu=index,,index", "--format=csv, noheader"],
        ["--query-gpu=memory.used,gpu_bus_id", "--format=noheader,csv,noheader"],
        ["topo", "-m"], ["topo", "--matrix"],
        *[["topo", "-p2p", c] for c in "rwnap"],
        ["topo", "-p2pr"], ["topo", "-p2p=w"], ["topo", "--p2pstatus", "n"],
        ["topo", "--p2pstatus=a"], ["topo", "-p2p=", "p"],
    ]
    return out


SLOW_ARGS: list[list[str]] = [
    [], ["-L"], ["--list-gpus"], ["--version"], ["-h"], ["--foo"],
    ["--query-gpu=index", "--format=csv", "-i", "0"],
    ["-i", "1", "--query-gpu=uuid", "--format=csv"],
    ["--query-gpu=index", "--format=csv", "--id=0,7"],
    ["--query-gpu=index,xyz", "--format=csv"],
    ["--query-gpu=timestamp", "--format=csv"],
    ["--query-gpu=index,power.draw", "--format=csv"],
    ["--query-gpu=Index", "--format=csv"],
    ["--query-gpu=index"], ["--format=csv"], ["--query-gpu"],
    ["--query-gpu=index", "--format=json"], ["--query-gpu=index", "--format=csv,json"],
    ["--query-gpu=index", "--format=CSV"], ["--query-gpu=index", "--format="],
    ["--query-gpu=", "--format=csv"], ["--query-gpu=index", "--format=csv", "--query-gpu=name"],
    ["--query-gpuX=index", "--format=csv"], ["--query-gpu=index", "--format=csv", "-L"],
    ["topo"], ["topo", "-p2p", "z"], ["topo", "-p2p"], ["topo", "-p2pq"],
    ["topo", "-m", "-i", "0"], ["topo", "-p2p", "r", "-m"], ["topo", "-m", "extra"],
]

_H = "HOSTNAME=tb-host-1\n"
# name -> (gpu.env text or None (no file) or "<dir>", request kinds that must fall back)
SMI_ENVS: dict[str, tuple[str | None, tuple[str, ...]]] = {
    "healthy": ("# testbed gpu.env\nGPU_COUNT=8\nSCENARIO=healthy\n" + _H, ()),
    "rendered": (B.render_gpu_env(HOSTNAME="tb-host-1"), ()),
    "count1": (_H + "GPU_COUNT=1\n", ()),
    "count2": (_H + "GPU_COUNT=2\n", ()),
    "count0": (_H + "GPU_COUNT=0\n", ()),
    "count12": (_H + "GPU_COUNT=12\n", ()),
    "count-neg": (_H + "GPU_COUNT=-3\n", ()),
    "sockets1": (_H + "SOCKETS=1\n", ()),
    "sockets4": (_H + "SOCKETS=4\n", ()),
    "sockets3-of-10": (_H + "SOCKETS=3\nGPU_COUNT=10\n", ()),
    "sockets0": (_H + "SOCKETS=0\n", ()),
    "sockets16-of-4": (_H + "SOCKETS=16\nGPU_COUNT=4\n", ()),
    "cpus48": (_H + "CPUS_PER_SOCKET=48\n", ()),
    "cpus1-s4": (_H + "CPUS_PER_SOCKET=1\nSOCKETS=4\n", ()),
    "cpus0": (_H + "CPUS_PER_SOCKET=0\n", ()),
    "gpu-missing": (_H + "SCENARIO=gpu-missing\n", ()),
    "gpu-missing-s4": (_H + "SCENARIO=gpu-missing\nSOCKETS=4\nGPU_COUNT=6\n", ()),
    "gpu-missing-1": (_H + "SCENARIO=gpu-missing\nGPU_COUNT=1\n", ()),
    "p2p-unsupported": (_H + "SCENARIO=p2p-unsupported\n", ()),
    "p2p-corrupt": (_H + "SCENARIO=p2p-corrupt\n", ()),
    "uvm-missing": (_H + "SCENARIO=uvm-missing\n", ()),
    "unknown-scenario": (_H + "SCENARIO=whatever\n", ()),
    "driver-mismatch": (_H + "SCENARIO=driver-mismatch\n", ()),
    "driver-mismatch-nodot": (_H + "SCENARIO=driver-mismatch\nDRIVER_VERSION=570\n", ()),
    "driver-mismatch-4dots": (_H + "SCENARIO=driver-mismatch\nDRIVER_VERSION=1.2.3.4\n", ()),
    "driver-mismatch-count0": (_H + "SCENARIO=driver-mismatch\nGPU_COUNT=0\n", ()),
    "replay": (_H + "REPLAY_DIR={replay}\nSCENARIO=driver-mismatch\n", ()),
    "replay-slash": (_H + "REPLAY_DIR={replay}/\n", ()),
    "replay-links": (_H + "REPLAY_DIR={replay2}\nSCENARIO=p2p-unsupported\n", ()),
    "replay-absent-dir": (_H + "REPLAY_DIR=/nonexistent/replay\n", ()),
    "replay-nonascii": (_H + "REPLAY_DIR={replay_na}\n", ("query",)),
    "odd-format": ((
        "# a comment\n   # indented comment\n\n"
        'GPU_COUNT = "4"  # four cards\n'
        " SOCKETS\t=\t'2'\t# two sockets\n"
        'GPU_NAME = "NVIDIA H100 80GB HBM3" # name\n'
        "noequals line\n=orphan value\n"
        "GPU_CC=9.0#not-a-comment\n"
        "DRIVER_VERSION=570.172.08 #comment #more\n"
        "GPU COUNT=3\n"
        "HOSTNAME = tb-odd\t\n"), ()),
    "odd-hash": (_H + "GPU_NAME=A#B #C\nGPU_CC=#\nDRIVER_VERSION=x\t#y\n", ()),
    "odd-quotes": ((
        "GPU_NAME=\"'Quoted Twice'\"\n"
        "DRIVER_VERSION='\"580.1.2\"'\n"
        'GPU_CC=""12.0""\n'
        "HOSTNAME='tb-\"quote\"'\n"
        'GPU_MEMORY_MIB=" 4096 "\n'
        'SOCKETS="4"\nGPU_COUNT=2\nGPU_COUNT=6\n'), ()),
    "invalid-ints": (_H + "GPU_COUNT=four\nSOCKETS=-3\nCPUS_PER_SOCKET=1.5\n"
                     "GPU_MEMORY_MIB=0x100\n", ()),
    "underscores": (_H + "GPU_COUNT=+4\nGPU_MEMORY_MIB=1_024\nSOCKETS=0_2\n"
                    "CPUS_PER_SOCKET=1__6\n", ()),
    "bad-underscores": (_H + "GPU_COUNT=4_\nSOCKETS=_2\nGPU_MEMORY_MIB=-0\n"
                        "CPUS_PER_SOCKET=+-4\n", ()),
    "empty-values": ("GPU_COUNT=\nGPU_NAME=\nDRIVER_VERSION=\nGPU_CC=\nGPU_MEMORY_MIB=\n"
                     "SOCKETS=\nCPUS_PER_SOCKET=  # only a comment\nSCENARIO=\nREPLAY_DIR=\n"
                     + _H, ()),
    "empty-hostname": ("GPU_COUNT=2\nHOSTNAME=\n", ()),
    "crlf": ("GPU_COUNT=4\r\nGPU_NAME=\"CR LF\"\r\nHOSTNAME=tb-crlf\r\n", ()),
    "cr-only": ("GPU_COUNT=3\rHOSTNAME=tb-cr\r", ()),
    "ctrl-breaks": (("GPU_COUNT=5\x0bSOCKETS=4\x0cHOSTNAME=tb-ff\x1cGPU_CC=9.0\x1d\x1e"
                     "SCENARIO=gpu-missing"), ()),
    "unit-separator": (_H + "GPU_COUNT=\x1f6\x1f\nGPU_NAME=\x1fX Y\x1f\n", ()),
    "hostname2": ("HOSTNAME=tb-host-2\n", ()),
    "hostname-fqdn": ("HOSTNAME=gpu-07.dc1.example.com\nGPU_COUNT=3\n", ()),
    "no-hostname": ("GPU_COUNT=2\n", ()),
    "other-gpu": (_H + "GPU_NAME=NVIDIA H100 80GB HBM3\nDRIVER_VERSION=570.172.08\nGPU_CC=9.0\n"
                  "GPU_MEMORY_MIB=81559\nCUDA_VERSION=12.8\n", ()),
    "negative-mem": (_H + "GPU_MEMORY_MIB=-5\nGPU_NAME=A, B\n", ()),
    "no-file": (None, ()),
    "dir-file": ("<dir>", ()),
    # beyond the fast path: python's job
    "non-ascii": (_H + "GPU_NAME=NVIDIA T\u00ebsla\n", ("query", "topo")),
    "nul-byte": (_H + "GPU_NAME=A\x00B\n", ("query", "topo")),
    "huge-int": (_H + "GPU_MEMORY_MIB=12345678901234567890\n", ("query", "topo")),
    "many-gpus": (_H + "GPU_COUNT=1025\n", ("query", "topo")),
}
# slow arguments decide the fallback before gpu.env matters: a few envs are enough
SLOW_ARG_ENVS = ["healthy", "driver-mismatch", "count0", "replay", "non-ascii"]
# each field alone (all of them together are in fast_args(), for every env)
SINGLE_FIELD_ENVS = ["healthy", "gpu-missing", "odd-quotes", "empty-values", "other-gpu",
                     "no-hostname", "count0", "replay", "non-ascii"]


def _kind(args: list[str]) -> str:
    return "topo" if args[:1] == ["topo"] else "query"


@pytest.fixture(scope="session")
def smi_fast(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The fast path binary, a sentinel fallback, and the installed chain (fleet's launcher,
    paths moved into a temp dir, importing the repo's nvidia_smi.py)."""
    from testbed import fleet

    d = tmp_path_factory.mktemp("smi-fast")
    exe = B.build_nvidia_smi(d / "build")
    sentinel = d / "sentinel"
    sentinel.write_text(f"#!/bin/sh\nprintf '%s\\n' '{FALLBACK_MARK}' \"$@\"\nexit 97\n")
    sentinel.chmod(0o755)
    lib = d / "lib"
    lib.mkdir()
    shutil.copy(SMI, lib / "nvidia_smi.py")
    text = fleet.SMI_LAUNCHER.replace("/usr/lib/testbed-gpu", str(lib))
    text = text.replace("#!/usr/bin/python3 -I\n", f"#!{sys.executable} -I\n", 1)
    assert text.startswith(f"#!{sys.executable} -I\n") and f'"{lib}"' in text
    launcher = lib / "nvidia-smi.py"
    launcher.write_text(text)
    launcher.chmod(0o755)
    return {"dir": d, "exe": exe, "sentinel": sentinel, "launcher": launcher}


def _dev_roots(base: Path) -> dict[str, str]:
    """Device roots: nvidiactl a regular file, absent, a directory (EISDIR), a socket (ENXIO,
    like a char node with no driver), a dangling link, refused (EACCES) when possible."""
    roots: dict[str, str] = {}
    for name in ("ok", "absent", "dir", "socket", "dangling", "denied"):
        (base / name).mkdir(parents=True, exist_ok=True)
        roots[name] = str(base / name)
    (base / "ok" / "nvidiactl").touch()
    roots["ok/"] = str(base / "ok") + "/"
    (base / "dir" / "nvidiactl").mkdir(exist_ok=True)
    (base / "dangling" / "nvidiactl").symlink_to(base / "nowhere")
    sock_path = base / "socket" / "nvidiactl"
    if len(str(sock_path)) < 100:
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(sock_path))
        s.close()
    else:
        del roots["socket"]
    # EACCES: a mode-000 file (not as root), else a read-only sysfs attribute (even root)
    denied = base / "denied" / "nvidiactl"
    blocked = base / "blocked"
    blocked.touch()
    blocked.chmod(0)
    for target in (blocked, Path("/sys/devices/system/cpu/possible")):
        if denied.is_symlink():
            denied.unlink()
        denied.symlink_to(target)
        try:
            os.close(os.open(denied, os.O_RDWR | os.O_NONBLOCK))
        except PermissionError:
            break
        except OSError:
            pass
    else:
        del roots["denied"]
    return roots


def _smi_env_files(base: Path) -> dict[str, str]:
    """Write the SMI_ENVS files (and the replay folders they use); name -> gpu.env path."""
    replay, replay2, replay_na = base / "replay", base / "replay2", base / "replay-na"
    for d in (replay, replay2, replay_na):
        d.mkdir(parents=True, exist_ok=True)
    (replay / "topo-m.txt").write_text("\n".join(sample("01_")) + "\n")
    (replay / "query-gpu.csv").write_bytes(b"index, name\r\n0, Replayed GPU\r\n1, \tX")
    (replay / "topo-p2p-w.txt").write_text("recorded p2p w\n\n")
    # no topo-p2p-r.txt: as normal
    (replay2 / "topo-p2p-r.txt").mkdir(exist_ok=True)           # not a file: as normal
    (replay2 / "query-gpu.csv").symlink_to(replay / "query-gpu.csv")  # followed
    (replay2 / "topo-m.txt").symlink_to(replay2 / "nowhere")   # dangling: as normal
    (replay2 / "topo-p2p-w.txt").write_text("")                 # empty file: printed (nothing)
    (replay_na / "query-gpu.csv").write_text("index, name\n0, T\u00ebsla\n")
    (replay_na / "topo-m.txt").write_text("ascii topo\n")
    paths = {}
    for name, (text, _) in SMI_ENVS.items():
        p = base / "env" / name
        p.parent.mkdir(parents=True, exist_ok=True)
        if text == "<dir>":
            p.mkdir(exist_ok=True)
        elif text is not None:
            p.write_bytes(text.format(replay=replay, replay2=replay2, replay_na=replay_na)
                          .encode() if "{replay" in text else text.encode())
        paths[name] = str(p)
    return paths


def _run_c(exe: Path, env_file: str, dev: str, args: list[str],
           fallback: Path | str) -> tuple[int, bytes]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "TESTBED_GPU_ENV": env_file,
           "TESTBED_DEV_ROOT": dev, "TESTBED_SMI_FALLBACK": str(fallback)}
    r = subprocess.run([str(exe), *args], env=env, capture_output=True, timeout=30, check=False)
    return r.returncode, r.stdout


def _run_py(env_file: str, dev: str, args: list[str]) -> tuple[int, bytes]:
    """nvidia_smi.run() in this process (what main() writes, and its exit code)."""
    from testbed.gpu import nvidia_smi

    os.environ["TESTBED_GPU_ENV"] = env_file
    os.environ["TESTBED_DEV_ROOT"] = dev
    code, text = nvidia_smi.run(list(args))
    return code, text.encode()


SMI_CASES: dict[str, int] = {}


def test_fast_path_matches_python(smi_fast: dict[str, Path], tmp_path: Path,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TESTBED_GPU_ENV", "")
    monkeypatch.setenv("TESTBED_DEV_ROOT", "")
    roots = _dev_roots(tmp_path / "dev")
    envs = _smi_env_files(tmp_path)
    fast = fast_args()
    cases = []  # (env name, root name, args, must fall back)
    for e, (_, slow_kinds) in SMI_ENVS.items():
        for r in ("ok", "absent"):
            cases += [(e, r, a, _kind(a) in slow_kinds) for a in fast]
            if e in SINGLE_FIELD_ENVS:
                cases += [(e, r, [f"--query-gpu={f}", "--format=csv"], bool(slow_kinds))
                          for f in SMI_FIELDS]
    for e in SLOW_ARG_ENVS:
        for r in ("ok", "absent"):
            cases += [(e, r, a, True) for a in SLOW_ARGS]
    slow_core = [["-L"], ["--query-gpu=index", "--format=json"]]
    core = deploy_smi_commands() + [["topo", "-p2p", "n"]] + slow_core
    for e in ("healthy", "driver-mismatch", "count0", "replay", "gpu-missing"):
        for r in roots:
            if r not in ("ok", "absent"):
                cases += [(e, r, a, a in slow_core) for a in core]

    def run(case):
        e, r, a, _ = case
        return _run_c(smi_fast["exe"], envs[e], roots[r], a, smi_fast["sentinel"])

    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(run, cases))

    failures = []
    answered = fell_back = 0
    for (e, r, a, slow), (code, out) in zip(cases, results):
        where = f"env={e} dev={r} args={a}"
        if out.startswith(FALLBACK_MARK.encode() + b"\n"):
            fell_back += 1
            if not slow:
                failures.append(f"{where}: fell back, the fast path should answer")
            elif (code, out) != (97, "\n".join([FALLBACK_MARK, *a]).encode() + b"\n"):
                failures.append(f"{where}: fallback got other arguments: {out!r}")
            continue
        answered += 1
        if slow:
            failures.append(f"{where}: answered ({code}), should fall back")
            continue
        want = _run_py(envs[e], roots[r], a)
        if (code, out) != want:
            failures.append(f"{where}:\n  C:      {code} {out[:300]!r}\n"
                            f"  python: {want[0]} {want[1][:300]!r}")
    SMI_CASES.update(total=len(cases), answered=answered, fell_back=fell_back)
    print(f"\nnvidia-smi fast path: {len(cases)} cases, {answered} answered by C and equal to "
          f"python, {fell_back} fell back")
    assert not failures, f"{len(failures)} of {len(cases)} cases:\n" + "\n".join(failures[:20])
    assert answered > 2000 and fell_back > 200


def test_fast_path_outcomes_covered(smi_fast: dict[str, Path], tmp_path: Path) -> None:
    """The matrix reaches every exit of the fast path (not only exit 0)."""
    roots = _dev_roots(tmp_path / "dev")
    envs = _smi_env_files(tmp_path)
    q = deploy_smi_commands()[0]
    seen = {
        _run_c(smi_fast["exe"], envs[e], roots[r], a, "/nonexistent/fallback")[0]
        for e, r, a in [("healthy", "ok", q), ("healthy", "absent", q), ("count0", "ok", q),
                        ("driver-mismatch", "ok", q), ("replay", "ok", q),
                        ("healthy", "socket", q), ("healthy", "dir", q),
                        ("healthy", "denied" if "denied" in roots else "ok", q)]
    }
    assert {0, 6, 9, 18} <= seen and 127 not in seen
    if "denied" in roots:
        assert 255 in seen
        code, out = _run_c(smi_fast["exe"], envs["healthy"], roots["denied"], ["topo", "-m"],
                           "/nonexistent/fallback")
        assert (code, out) == (255, b"Failed to initialize NVML: Unknown Error\n")


def test_fast_path_serves_the_deploy_without_python(smi_fast: dict[str, Path], host: Host) -> None:
    """The deploy's four calls never reach the fallback (here: a path that does not exist)."""
    cmds = deploy_smi_commands()
    assert len(cmds) == 4
    assert cmds[0] == [("--query-gpu=index,name,uuid,driver_version,memory.total,compute_cap,"
                        "pci.bus_id"), "--format=csv,noheader,nounits"]
    assert cmds[1:] == [["topo", "-m"], ["topo", "-p2p", "r"], ["topo", "-p2p", "w"]]
    nowhere = "/nonexistent/fallback"
    for args in cmds:
        code, out = _run_c(smi_fast["exe"], str(host.envfile), str(host.dev), args, nowhere)
        r = host.smi(*args)
        assert (code, out.decode()) == (r.returncode, r.stdout) and code == 0, args
    # what the deploy parses: real ids and bus ids
    code, out = _run_c(smi_fast["exe"], str(host.envfile), str(host.dev), cmds[0], nowhere)
    assert out.decode().splitlines()[1].startswith(
        "1, NVIDIA RTX PRO 6000 Blackwell Server Edition, GPU-")
    # a request beyond it does try the fallback and says so
    r = subprocess.run([str(smi_fast["exe"]), "-L"],
                       env={**host.env(), "TESTBED_SMI_FALLBACK": nowhere},
                       capture_output=True, text=True, timeout=30, check=False)
    assert r.returncode == 127 and r.stdout == "" and "/nonexistent/fallback" in r.stderr


def test_fast_path_falls_back_to_the_launcher(smi_fast: dict[str, Path], host: Host) -> None:
    """The installed chain: binary -> fleet's launcher -> nvidia_smi.py, same answers as the
    script itself (the table's first line is the time)."""
    env = {**host.env(), "TESTBED_SMI_FALLBACK": str(smi_fast["launcher"])}
    for args in (["-L"], ["--version"], ["-i", "0", "--query-gpu=index,uuid", "--format=csv"],
                 ["--query-gpu=index,xyz", "--format=csv"], ["topo"], ["topo", "-m", "-i", "0"],
                 ["--query-gpu=index,power.draw", "--format=csv,nounits"], ["-i", "3"], []):
        r = subprocess.run([str(smi_fast["exe"]), *args], env=env, capture_output=True, text=True,
                           timeout=30, check=False)
        want = host.smi(*args)
        assert r.returncode == want.returncode, args
        if args in ([], ["-i", "3"]):
            assert r.stdout.split("\n")[1:] == want.stdout.split("\n")[1:]
            assert "NVIDIA-SMI" in r.stdout
        else:
            assert r.stdout == want.stdout, args
    # a gpu.env the fast path leaves to python, with the deploy's own query
    host.envfile.write_text("GPU_NAME=NVIDIA T\u00ebsla\nGPU_COUNT=2\nHOSTNAME=tb-host-1\n")
    q = deploy_smi_commands()[0]
    r = subprocess.run([str(smi_fast["exe"]), *q], env=env, capture_output=True, text=True,
                       timeout=30, check=False)
    assert r.returncode == 0 and r.stdout == host.smi(*q).stdout and "T\u00ebsla" in r.stdout


def test_fast_path_build(smi_fast: dict[str, Path]) -> None:
    from testbed import fleet

    exe = smi_fast["exe"]
    assert exe.name == "nvidia-smi" and os.access(exe, os.X_OK)
    before = exe.stat().st_mtime_ns
    assert B.build_nvidia_smi(exe.parent) == exe and exe.stat().st_mtime_ns == before
    # the launcher's place, compiled in, is where the fleet installs it
    assert fleet.SMI_FALLBACK == B.SMI_FALLBACK == "/usr/lib/testbed-gpu/nvidia-smi.py"
    assert B.SMI_FALLBACK.encode() + b"\0" in exe.read_bytes()
    # libc only, and it runs on Debian bookworm (glibc 2.36)
    dyn = subprocess.run(["readelf", "-d", str(exe)], capture_output=True, text=True,
                         check=True).stdout
    assert re.findall(r"\(NEEDED\).*\[(.*)\]", dyn) == ["libc.so.6"]
    syms = subprocess.run(["objdump", "-T", str(exe)], capture_output=True, text=True,
                          check=True).stdout
    versions = {tuple(int(x) for x in v.split(".")) for v in re.findall(r"GLIBC_([\d.]+)", syms)}
    assert versions and max(versions) <= (2, 36)


# --------------------------------------------------------------------------- libcuda stand-in


@pytest.fixture(scope="session")
def libdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("libcuda")
    B.build_libcuda(out)
    inc = B.find_cuda_include()
    subprocess.run(["gcc", "-std=gnu11", "-Wall", "-Werror", f"-I{inc}", "-o", str(out / "probe"),
                    str(PROBE_SRC), f"-L{out}", "-lcuda"], check=True, capture_output=True)
    return out


def probe(libdir: Path, host: Host, mib: int = 8) -> dict[str, str]:
    env = host.env()
    env["LD_LIBRARY_PATH"] = str(libdir)
    r = subprocess.run([str(libdir / "probe"), str(mib)], env=env, capture_output=True, text=True,
                       timeout=60, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    return dict(ln.split("=", 1) for ln in r.stdout.splitlines())


def test_a_change_to_any_input_rebuilds(tmp_path: Path) -> None:
    """The shared UUID header is an input of both builds: changing it (or the source, or the
    command) compiles again; nothing changed, nothing compiled."""
    src, header = tmp_path / "a.c", tmp_path / "gpu_uuid.h"
    src.write_text("source 1\n")
    header.write_text("header 1\n")
    out = tmp_path / "out" / "bin"
    out.parent.mkdir()

    def command(flag: str):
        return lambda dest: ["sh", "-c", f"cat {src} {header} > {dest}; echo {flag} >> {dest}"]

    assert B._cached_build(out, [src, header], command("x")) is True
    assert B._cached_build(out, [src, header], command("x")) is False
    header.write_text("header 2\n")
    assert B._cached_build(out, [src, header], command("x")) is True
    assert out.read_text() == "source 1\nheader 2\nx\n"
    assert B._cached_build(out, [src, header], command("y")) is True
    src.write_text("source 2\n")
    assert B._cached_build(out, [src, header], command("y")) is True
    assert B._cached_build(out, [src, header], command("y")) is False
    for source in (B.SOURCE, B.SMI_FAST_SOURCE):  # the header both builds hash is the one included
        assert f'#include "{B.UUID_HEADER.name}"' in source.read_text()


def test_build_is_cached_and_named(libdir: Path) -> None:
    lib = libdir / "libcuda.so.1"
    before = lib.stat().st_mtime_ns
    assert B.build_libcuda(libdir) == lib
    assert lib.stat().st_mtime_ns == before
    assert os.readlink(libdir / "libcuda.so") == "libcuda.so.1"
    dyn = subprocess.run(["readelf", "-d", str(lib)], capture_output=True, text=True, check=True).stdout
    assert "Library soname: [libcuda.so.1]" in dyn
    # runs on Debian bookworm (glibc 2.36)
    syms = subprocess.run(["objdump", "-T", str(lib)], capture_output=True, text=True,
                          check=True).stdout
    versions = {tuple(int(x) for x in v.split(".")) for v in re.findall(r"GLIBC_([\d.]+)", syms)}
    assert max(versions) <= (2, 36)


def test_install_into_rootfs(libdir: Path, tmp_path: Path) -> None:
    root = tmp_path / "rootfs"
    env = B.render_gpu_env(SCENARIO="p2p-slow", GPU_COUNT=4)
    paths = B.install_into_rootfs(root, libdir, env)
    assert (root / "usr/bin/nvidia-smi").read_bytes() == SMI.read_bytes()
    assert os.access(root / "usr/bin/nvidia-smi", os.X_OK)
    assert os.readlink(root / "usr/lib/x86_64-linux-gnu/libcuda.so") == "libcuda.so.1"
    text = (root / "etc/testbed/gpu.env").read_text()
    assert "SCENARIO=p2p-slow\n" in text and "GPU_COUNT=4\n" in text and "P2P_GBPS=40\n" in text
    assert len(paths) == 4
    with pytest.raises(ValueError):
        B.render_gpu_env(SCENARIO="nope")
    # the stand-ins parse the rendered file
    h = Host(tmp_path / "h")
    h.envfile.write_text(env)
    assert h.smi("--query-gpu=count", "--format=csv,noheader").stdout.startswith("4\n")


def test_probe_healthy(libdir: Path, host: Host) -> None:
    p = probe(libdir, host)
    assert p["driver_version"] == "13000"
    assert p["precount_rc"] == "3"
    assert p["init"] == "0 CUDA_SUCCESS no error"
    assert p["device_count"] == "8"
    for i in range(8):
        assert p[f"dev{i}.name"] == "NVIDIA RTX PRO 6000 Blackwell Server Edition"
        assert p[f"dev{i}.cc"] == "12.0"
        assert p[f"dev{i}.unified"] == "1"
        assert p[f"dev{i}.total_mib"] == "97887"
    assert p["dev1.bus"] == "37 0000:25:00.0"
    assert p["bad_device_rc"] == "101"
    assert (p["can_access_0_1"], p["can_access_0_0"], p["rank_0_last"]) == ("1", "0", "1")
    assert p["alloc_without_ctx_rc"] == "201"
    assert p["current_is_c0"] == "1 current_dev=0"
    assert p["meminfo_total_mib"].startswith("97887 used_delta=")
    assert int(p["meminfo_total_mib"].split("=")[1]) >= 8 << 20
    assert p["memset_ok"] == "1" and p["htod_bad_ptr_rc"] == "1" and p["popped_is_c1"] == "1"
    assert p["enable_peer"] == "0 CUDA_SUCCESS no error"
    assert p["enable_peer_again"].startswith("704 CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED")
    assert p["peer_ok"] == "1" and p["dtod_cross_ok"] == "1"
    assert p["unified_cross_ok"] == "1" and p["unified_local_ok"] == "1"
    assert p["disable_peer"].startswith("0 ")
    assert p["disable_peer_again"].startswith("705 CUDA_ERROR_PEER_ACCESS_NOT_ENABLED")
    assert p["created_is_current"] == "1" and p["after_destroy_current_is_c0"] == "1"
    assert p["double_free_rc"] == "1" and p["done"] == "1"
    assert float(p["peer_gbps"]) <= 40 * 1.05


def test_error_strings_are_the_real_ones(libdir: Path, host: Host) -> None:
    p = probe(libdir, host)
    assert p["err999"] == "999 CUDA_ERROR_UNKNOWN unknown error"
    assert p["err100"] == "100 CUDA_ERROR_NO_DEVICE no CUDA-capable device is detected"
    assert p["err803"] == ("803 CUDA_ERROR_SYSTEM_DRIVER_MISMATCH system has unsupported display "
                           "driver / cuda driver combination")
    assert p["err217"] == ("217 CUDA_ERROR_PEER_ACCESS_UNSUPPORTED peer access is not supported "
                           "between these two devices")
    assert p["err3"] == "3 CUDA_ERROR_NOT_INITIALIZED initialization error"
    assert p["err_bogus_rc"] == "1 null=1"


def test_uuid_matches_nvidia_smi(libdir: Path, host: Host) -> None:
    p = probe(libdir, host)
    smi = host.smi("--query-gpu=uuid", "--format=csv,noheader").stdout.split()
    assert [f"GPU-{u[:8]}-{u[8:12]}-{u[12:16]}-{u[16:20]}-{u[20:]}"
            for u in (p[f"dev{i}.uuid"] for i in range(8))] == smi


@pytest.mark.parametrize("mutate,code", [
    ("scenario:uvm-missing", "999 CUDA_ERROR_UNKNOWN unknown error"),
    ("rm:nvidia-uvm", "999 CUDA_ERROR_UNKNOWN unknown error"),
    ("scenario:driver-mismatch", ("803 CUDA_ERROR_SYSTEM_DRIVER_MISMATCH system has unsupported "
                                  "display driver / cuda driver combination")),
    ("rm:nvidiactl", "100 CUDA_ERROR_NO_DEVICE no CUDA-capable device is detected"),
    ("rm:gpus", "100 CUDA_ERROR_NO_DEVICE no CUDA-capable device is detected"),
])
def test_probe_init_failures(libdir: Path, host: Host, mutate: str, code: str) -> None:
    kind, what = mutate.split(":")
    if kind == "scenario":
        host.write(SCENARIO=what)
    elif what == "gpus":
        for i in range(8):
            (host.dev / f"nvidia{i}").unlink()
    else:
        (host.dev / what).unlink()
    p = probe(libdir, host)
    assert p["init"] == code
    assert p["after_failed_init_count_rc"] == "3"
    assert "device_count" not in p


def test_probe_gpu_missing_and_missing_node(libdir: Path, host: Host) -> None:
    host.write(SCENARIO="gpu-missing")
    assert probe(libdir, host)["device_count"] == "7"
    host.write(SCENARIO="healthy")
    (host.dev / "nvidia3").unlink()
    p = probe(libdir, host)
    assert p["device_count"] == "7"
    assert p["dev3.bus"] == "129 0000:81:00.0"  # ordinal 3 is /dev/nvidia4


def test_probe_p2p_unsupported(libdir: Path, host: Host) -> None:
    host.write(SCENARIO="p2p-unsupported")
    p = probe(libdir, host)
    assert p["can_access_0_1"] == "0"
    assert p["enable_peer"] == ("217 CUDA_ERROR_PEER_ACCESS_UNSUPPORTED peer access is not "
                                "supported between these two devices")
    assert p["peer_ok"] == "1"  # cuMemcpyPeer still works (staged), as on real hardware
    assert p["disable_peer"].startswith("705 ")


def test_probe_p2p_corrupt(libdir: Path, host: Host) -> None:
    host.write(SCENARIO="p2p-corrupt")
    p = probe(libdir, host)
    assert p["can_access_0_1"] == "1" and p["enable_peer"].startswith("0 ")
    assert p["peer_ok"] == "0" and p["dtod_cross_ok"] == "0" and p["unified_cross_ok"] == "0"
    assert p["unified_local_ok"] == "1" and p["memset_ok"] == "1"


def test_probe_pacing(libdir: Path, host: Host) -> None:
    host.write(P2P_GBPS="1")
    p = probe(libdir, host, mib=8)
    assert p["peer_ok"] == "1"
    assert float(p["peer_gbps"]) <= 1.0 * 1.02
    host.write(P2P_GBPS="10", SCENARIO="p2p-slow")
    p = probe(libdir, host, mib=8)
    assert p["peer_ok"] == "1"
    assert float(p["peer_gbps"]) <= 0.5 * 1.02


def test_probe_versions_from_env(libdir: Path, host: Host) -> None:
    host.write(CUDA_VERSION="12.8", GPU_CC="10.3", GPU_COUNT="2", GPU_MEMORY_MIB="81559",
               GPU_NAME="NVIDIA H100 80GB HBM3")
    p = probe(libdir, host)
    assert p["driver_version"] == "12080"
    assert p["device_count"] == "2"
    assert p["dev1.cc"] == "10.3" and p["dev1.total_mib"] == "81559"
    assert p["dev0.name"] == "NVIDIA H100 80GB HBM3"


# --------------------------------------------------------------------------- exported symbols

IMPLEMENTED = [
    "cuInit", "cuDriverGetVersion", "cuDeviceGetCount", "cuDeviceGet", "cuDeviceGetName",
    "cuDeviceGetAttribute", "cuDeviceTotalMem", "cuDeviceGetUuid", "cuDeviceGetPCIBusId",
    "cuDeviceCanAccessPeer", "cuDeviceGetP2PAttribute", "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease", "cuDevicePrimaryCtxReset", "cuDevicePrimaryCtxGetState",
    "cuCtxCreate", "cuCtxDestroy", "cuCtxSetCurrent", "cuCtxGetCurrent", "cuCtxPushCurrent",
    "cuCtxPopCurrent", "cuCtxSynchronize", "cuCtxGetDevice", "cuCtxEnablePeerAccess",
    "cuCtxDisablePeerAccess", "cuMemAlloc", "cuMemFree", "cuMemcpyHtoD", "cuMemcpyDtoH",
    "cuMemcpyDtoD", "cuMemcpyPeer", "cuMemcpy", "cuMemsetD8", "cuGetErrorString",
    "cuGetErrorName", "cuMemGetInfo",
]


def header_mapping() -> dict[str, str]:
    """`#define cuX cuX_vN` (also through __CUDA_API_PTDS/PTSZ, default-stream build)."""
    text = (B.find_cuda_include() / "cuda.h").read_text()
    mapping = {}
    for m in re.finditer(r"^\s*#define\s+(cu\w+)\s+(?:__CUDA_API_PT(?:DS|SZ)\((cu\w+)\)|(cu\w+))\s*$",
                         text, re.MULTILINE):
        mapping.setdefault(m.group(1), m.group(2) or m.group(3))
    return mapping


def test_exports_the_versioned_names_cuda_h_maps_to(libdir: Path) -> None:
    nm = subprocess.run(["nm", "-D", "--defined-only", str(libdir / "libcuda.so.1")],
                        capture_output=True, text=True, check=True).stdout
    exported = {ln.split()[-1] for ln in nm.splitlines() if ln.strip()}
    mapping = header_mapping()
    assert mapping["cuMemAlloc"] == "cuMemAlloc_v2" and mapping["cuCtxCreate"] == "cuCtxCreate_v4"
    want = {mapping.get(f, f) for f in IMPLEMENTED}
    assert want <= exported, sorted(want - exported)
    for f in ("cuMemAlloc_v2", "cuMemcpyHtoD_v2", "cuMemcpyDtoH_v2", "cuMemFree_v2",
              "cuDeviceTotalMem_v2", "cuCtxDestroy_v2", "cuDevicePrimaryCtxRelease_v2",
              "cuDevicePrimaryCtxReset_v2", "cuMemGetInfo_v2", "cuDeviceGetUuid_v2"):
        assert f in exported
    # the 32-bit v1 ABI names are not offered (a caller would get silently wrong sizes)
    assert not {"cuMemAlloc", "cuMemFree", "cuMemcpyHtoD", "cuDeviceTotalMem"} & exported
    # only cu* symbols leak out of the library
    assert all(s.startswith("cu") for s in exported)
