"""Unit tests of the GPU stand-ins (testbed/gpu): nvidia-smi script and libcuda.so.1.

No containers.  The nvidia-smi outputs are compared with REAL samples copied into
tests/fixtures/nvidia-smi/; the libcuda stand-in is built against the real cuda.h and
driven by a small C client (tests/fixtures/c/probe.c) linked with -lcuda.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_deploy.remote import cuda_probe
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


def real_gpu(name: str) -> list[str]:
    """Lines of a file of the H200 capture (tests/fixtures/real-gpu/h200-1gpu-driver580/)."""
    return (FIX / "real-gpu" / "h200-1gpu-driver580" / name).read_text().split("\n")


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
    # header: starts with a tab, between ESC[4m and ESC[0m as driver 580 prints it (the H200)
    h200 = real_gpu("topo-m.txt")[0]
    assert h200 == "\t\x1b[4mGPU0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m"
    assert out[0] == "\t\x1b[4m" + "".join(f"GPU{i}\t" for i in range(8)) + \
        "CPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m"
    # same trailing columns as the real ones
    assert real[0].split("\t")[-3:] == ["CPU Affinity", "NUMA Affinity", "GPU NUMA ID"]
    assert out[0].removesuffix("\x1b[0m").split("\t")[-3:] == real[0].split("\t")[-3:]
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
        # real: ' \tGPU0\tGPU1\t' / ' GPU0\tX\tGNS\t'; driver 580 underlines the header
        assert real[0] == " \tGPU0\tGPU1\t" and real[1].startswith(" GPU0\tX\t")
        assert real_gpu("topo-p2p-r.txt")[:2] == [" \t\x1b[4mGPU0\t\x1b[0m", " GPU0\tX\t"]
        assert out[0] == " \t\x1b[4m" + "".join(f"GPU{i}\t" for i in range(8)) + "\x1b[0m"
        for i in range(8):
            cells = out[1 + i].split("\t")
            assert cells[0] == f" GPU{i}" and cells[-1] == "" and len(cells) == 10
            assert cells[1 + i] == "X"
            assert all(c == "OK" for j, c in enumerate(cells[1:9]) if j != i)
        assert out[9] == ""
        assert legend(out) == legend(real)
    r = host.smi("topo", "-p2p", "n")
    assert "OK" not in r.stdout.split("Legend")[0]


@pytest.mark.parametrize("count", [8, 1])
def test_the_deploys_readers_read_the_standins_escaped_headers(host: Host, count: int) -> None:
    from sglang_deploy.core import nvsmi

    host.write(GPU_COUNT=str(count))
    topo_out = host.smi("topo", "-m").stdout
    p2p_out = host.smi("topo", "-p2p", "r").stdout
    assert topo_out.count("\x1b[4m") == p2p_out.count("\x1b[4m") == 1
    topo = nvsmi.parse_topo_matrix(topo_out)
    assert topo.gpus == [f"GPU{i}" for i in range(count)] and topo.nics == []
    assert topo.gpu_numa_id == {i: None for i in range(count)}
    p2p = nvsmi.parse_p2p_matrix(p2p_out)
    assert p2p == {(i, j): "OK" for i in range(count) for j in range(count) if i != j}


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


HEALTH_QUERY = (("--query-gpu=index,pci.bus_id,uuid,ecc.errors.uncorrected.volatile.total,"
                "ecc.errors.uncorrected.aggregate.total,retired_pages.pending,"
                "remapped_rows.pending,remapped_rows.failure,gpu_recovery_action,temperature.gpu,"
                "power.draw"), "--format=csv,noheader,nounits")


def _health(host: Host, scenario: str, expected: int = 8):
    from sglang_deploy.core import gpuhealth
    from sglang_deploy.core.hostrecords import GpuHealthRead

    host.write(SCENARIO=scenario)
    r = host.smi(*HEALTH_QUERY)
    raw = {"query": {"rc": r.returncode, "out": r.stdout, "fields": HEALTH_QUERY[0][12:].split(","),
                     "dropped": []}, "kernel": {"rc": 0, "lines": []}}
    return r, gpuhealth.evaluate(GpuHealthRead.from_json(raw), expected)


def test_healthy_answers_the_health_fields_as_the_real_h100_capture(host: Host) -> None:
    r, report = _health(host, "healthy")
    assert r.returncode == 0 and report.verdict == "healthy" and report.gpus == 8
    # the values of the real 590 H100 capture (tests/fixtures/gpuhealth/)
    assert r.stdout.splitlines()[0].split(", ")[3:9] == ["0", "0", "[N/A]", "No", "No", "None"]


@pytest.mark.parametrize("scenario, verdict, code", [
    ("ecc-uncorrectable", "fatal", "ecc-uncorrected-volatile"),
    ("remap-pending", "warning", "remap-pending"),
    ("smi-err", "warning", "field-error"),
])
def test_health_fault_profiles_hit_gpu_1(host: Host, scenario: str, verdict: str, code: str) -> None:
    r, report = _health(host, scenario)
    assert r.returncode == 0 and report.verdict == verdict
    assert {f.gpu for f in report.findings} == {1} and code in {f.code for f in report.findings}


def test_smi_err_reads_err_in_the_table_and_unknown_error_in_the_csv(host: Host) -> None:
    r, report = _health(host, "smi-err")
    assert "[Unknown Error]" in r.stdout.splitlines()[1]
    assert {f.code: f.severity for f in report.findings} == {"field-unreadable": "unknown",
                                                             "field-error": "warning"}
    table = host.smi().stdout.splitlines()
    assert table[12].startswith("|   1  NVIDIA") and table[12].rstrip().endswith("ERR! |")
    assert table[13].startswith("| N/A") and "ERR! /  600W" in table[13]
    assert "ERR!" not in "".join(table[8:12])  # GPU 0


def test_ecc_uncorrectable_shows_in_the_tables_ecc_column(host: Host) -> None:
    host.write(SCENARIO="ecc-uncorrectable")
    table = host.smi().stdout.splitlines()
    assert table[12].startswith("|   1  NVIDIA") and table[12].rstrip().endswith(" 2 |")
    assert table[8].startswith("|   0  NVIDIA") and table[8].rstrip().endswith(" 0 |")


def test_gpu_lost_prints_the_handle_error_as_real_nvidia_smi(host: Host) -> None:
    real = (REPO / "tests" / "fixtures" / "gpuhealth" / "query_lost_gpu0_616.92.txt").read_text().splitlines()[0]
    r, report = _health(host, "gpu-lost")
    assert r.returncode == 15 and len(r.stdout.splitlines()) == 8
    line = r.stdout.splitlines()[-1]
    assert line == ("Unable to determine the device handle for GPU7: 0000:E1:00.0: GPU is lost.  "
                    "Reboot the system to recover this GPU")
    assert line.split(": ", 2)[2] == real.split(": ", 2)[2]
    assert report.verdict == "fatal" and [(f.code, f.gpu) for f in report.findings] == [("gpu-lost", 7)]
    table = host.smi()
    assert table.returncode == 15 and table.stdout == line + "\n"
    # the deploy's own query fails too (the pre-flight names it: nvsmi.classify_smi_error)
    from sglang_deploy.core import nvsmi

    q = host.smi("--query-gpu=index,name", "--format=csv,noheader,nounits")
    assert nvsmi.classify_smi_error(q.stdout, q.returncode) is nvsmi.SmiFailure.GPU_LOST


def test_health_query_error_fails_only_the_health_query(host: Host) -> None:
    r, report = _health(host, "health-query-error")
    assert r.returncode == 255 and report.verdict == "unknown"
    assert [f.code for f in report.findings] == ["query-failed"]
    assert host.smi("--query-gpu=index,name", "--format=csv,noheader").returncode == 0


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
    assert host.smi("topo", "-p2p", "w").stdout.startswith(" \t\x1b[4mGPU0\t")


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


def test_the_fleets_launcher_answers_as_the_script(host: Host, tmp_path: Path) -> None:
    """/usr/bin/nvidia-smi in a testbed host is fleet.SMI_LAUNCHER importing nvidia_smi.py
    (paths moved into a temp dir here): same answers as the script itself (the table's first
    line is the time), exit codes included."""
    from testbed import fleet

    lib = tmp_path / "lib"
    lib.mkdir()
    shutil.copy(SMI, lib / "nvidia_smi.py")
    text = fleet.SMI_LAUNCHER.replace("/usr/lib/testbed-gpu", str(lib))
    text = text.replace("#!/usr/bin/python3 -I\n", f"#!{sys.executable} -I\n", 1)
    assert text.startswith(f"#!{sys.executable} -I\n") and f'"{lib}"' in text
    launcher = tmp_path / "nvidia-smi"
    launcher.write_text(text)
    launcher.chmod(0o755)
    for args in (["-L"], ["--version"], ["-i", "0", "--query-gpu=index,uuid", "--format=csv"],
                 ["--query-gpu=index,xyz", "--format=csv"], ["topo", "-m"], ["-i", "3"], []):
        r = subprocess.run([str(launcher), *args], env=host.env(), capture_output=True, text=True,
                           timeout=30, check=False)
        want = host.smi(*args)
        assert r.returncode == want.returncode, args
        if args in ([], ["-i", "3"]):
            assert r.stdout.split("\n")[1:] == want.stdout.split("\n")[1:]
            assert "NVIDIA-SMI" in r.stdout
        else:
            assert r.stdout == want.stdout, args


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
    """A change to an input (the source, cuda.h) or to the command compiles again; nothing
    changed, nothing compiled."""
    src, header = tmp_path / "a.c", tmp_path / "cuda.h"
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


def test_render_gpu_env(tmp_path: Path) -> None:
    env = B.render_gpu_env(SCENARIO="p2p-slow", GPU_COUNT=4)
    assert "SCENARIO=p2p-slow\n" in env and "GPU_COUNT=4\n" in env and "P2P_GBPS=40\n" in env
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
    assert p["dev1.bus"] == "37"
    assert p["bad_device_rc"] == "101"
    assert (p["can_access_0_1"], p["can_access_0_0"]) == ("1", "0")
    assert p["alloc_without_ctx_rc"] == "201"
    assert p["htod_bad_ptr_rc"] == "1" and p["peer_wrong_ctx_rc"] == "1"
    assert p["enable_peer"] == "0 CUDA_SUCCESS no error"
    assert p["enable_peer_again"].startswith("704 CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED")
    assert p["peer_ok"] == "1"
    assert p["double_free_rc"] == "1" and p["released_sync_rc"] == "201" and p["done"] == "1"
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
    assert p["dev3.bus"] == "129"  # ordinal 3 is /dev/nvidia4 (bus 0x81)


def test_probe_p2p_unsupported(libdir: Path, host: Host) -> None:
    host.write(SCENARIO="p2p-unsupported")
    p = probe(libdir, host)
    assert p["can_access_0_1"] == "0"
    assert p["enable_peer"] == ("217 CUDA_ERROR_PEER_ACCESS_UNSUPPORTED peer access is not "
                                "supported between these two devices")
    assert p["peer_ok"] == "1"  # cuMemcpyPeer still works (staged), as on real hardware


def test_probe_p2p_corrupt(libdir: Path, host: Host) -> None:
    host.write(SCENARIO="p2p-corrupt")
    p = probe(libdir, host)
    assert p["can_access_0_1"] == "1" and p["enable_peer"].startswith("0 ")
    assert p["peer_ok"] == "0" and p["done"] == "1"


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
    "cuDeviceGetAttribute", "cuDeviceTotalMem", "cuDeviceCanAccessPeer",
    "cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRelease", "cuCtxSetCurrent",
    "cuCtxSynchronize", "cuCtxEnablePeerAccess", "cuMemAlloc", "cuMemFree", "cuMemcpyHtoD",
    "cuMemcpyDtoH", "cuMemcpyPeer", "cuGetErrorString", "cuGetErrorName",
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
    # every name sglang_deploy/remote/cuda_probe.py looks up
    assert set(cuda_probe.SIGNATURES) <= exported
    # the 32-bit v1 ABI names are not offered (a caller would get silently wrong sizes)
    assert not {"cuMemAlloc", "cuMemFree", "cuMemcpyHtoD", "cuDeviceTotalMem"} & exported
    # only cu* symbols leak out of the library
    assert all(s.startswith("cu") for s in exported)
