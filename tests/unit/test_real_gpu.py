"""The bytes real drivers print, read by every nvidia-smi reader: the H200 capture
(tests/fixtures/real-gpu/h200-1gpu-driver580/, driver 580.159.04, a `doctor --collect`
folder kept byte for byte) and variants of it and of the other real samples (escape
sequences, CRLF, trailing blanks, a GPU NUMA ID column or none)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sglang_deploy.commands import cli, doctor
from sglang_deploy.commands.doctor import Expectations
from sglang_deploy.core import nvsmi
from sglang_deploy.core.topo import plain_text

FIX = Path(__file__).resolve().parent.parent / "fixtures"
H200 = FIX / "real-gpu" / "h200-1gpu-driver580"


def real(name: str) -> str:
    return (H200 / name).read_text()


def sample(prefix: str) -> str:
    (path,) = (FIX / "nvidia-smi").glob(prefix + "*")
    return path.read_text()


def crlf(text: str, ending: str = "\r\n") -> str:
    return text.replace("\n", ending)


def underline_header(text: str, style: str = "\x1b[4m", reset: str = "\x1b[0m") -> str:
    """TEXT with its matrix header row (the first line naming GPU0) between escapes, as
    driver 580 prints it: after the leading blanks, before the end of the line."""
    lines = text.split("\n")
    at = next(n for n, ln in enumerate(lines) if "GPU0" in ln)
    head = lines[at]
    lead = len(head) - len(head.lstrip())
    lines[at] = head[:lead] + style + head[lead:] + reset
    return "\n".join(lines)


def test_the_capture_really_holds_the_escapes():
    assert real("topo-m.txt").startswith("\t\x1b[4mGPU0\tCPU Affinity\tNUMA Affinity\t"
                                         "GPU NUMA ID\x1b[0m\n")
    assert real("topo-p2p-r.txt").startswith(" \t\x1b[4mGPU0\t\x1b[0m\n GPU0\tX\t\n")


def test_plain_text_removes_every_escape_sequence_and_keeps_the_cells():
    assert plain_text("\t\x1b[4mGPU0\tCPU Affinity\x1b[0m\n") == "\tGPU0\tCPU Affinity\n"
    assert plain_text("\x1b[1;4;32mGPU0\x1b[m \x1b[K\x1b[2J|") == "GPU0 |"  # SGR, erase
    assert plain_text("\x1b]0;nvidia-smi\x07GPU0\x1b]8;;x\x1b\\ok") == "GPU0ok"  # OSC
    assert plain_text("\x1b(BGPU0\x1b=\x9b0m") == "GPU0"  # charset, keypad, 8-bit CSI
    assert plain_text("\ufeffa\r\nb\rc\x00\x07\x08\n") == "a\nb\nc\n"
    assert plain_text("a\r\r\nb\r\n") == "a\nb\n"  # CRLF through a terminal twice
    assert plain_text("GPU0\t X \t0-15\t0\t\tN/A   \n") == "GPU0\t X \t0-15\t0\t\tN/A   \n"


def test_topo_m_of_the_h200():
    for text in (real("topo-m.txt"), crlf(real("topo-m.txt")), crlf(real("topo-m.txt"), "\r\r\n")):
        topo = nvsmi.parse_topo_matrix(text)
        assert topo.gpus == ["GPU0"] and topo.nics == []
        assert topo.links == {(0, 0): "X"}
        assert topo.cpu_affinity == {0: "0-15"} and topo.numa_affinity == {0: "0"}
        assert topo.gpu_numa_id == {0: None}


def test_topo_m_without_the_gpu_numa_id_column():
    text = real("topo-m.txt").replace("\tGPU NUMA ID", "").replace("\t\tN/A", "")
    assert "GPU NUMA ID" not in text
    topo = nvsmi.parse_topo_matrix(text)
    assert topo.cpu_affinity == {0: "0-15"} and topo.numa_affinity == {0: "0"}
    assert topo.gpu_numa_id == {}


@pytest.mark.parametrize("prefix", ["01_", "06_", "10_", "28_", "35_", "37_", "synth_topo_m_8x"])
@pytest.mark.parametrize("variant", ["underline", "bold-crlf", "trailing-blanks"])
def test_every_real_topo_m_reads_the_same_with_real_bytes(prefix, variant):
    text = sample(prefix)
    if "# BEGIN" in text:
        text = text.split("# BEGIN\n", 1)[1].split("# END", 1)[0]
    want = nvsmi.parse_topo_matrix(text)
    if variant == "underline":
        changed = underline_header(text)
    elif variant == "bold-crlf":
        changed = crlf(underline_header(text, "\x1b[1;4m", "\x1b[m\x1b[K"))
    else:
        changed = "\n".join(ln + "  \t" if ln.strip() else ln for ln in text.split("\n"))
    assert changed != text
    got = nvsmi.parse_topo_matrix(changed)
    assert got == want


def test_topo_p2p_of_the_h200_has_no_pair():
    for name in ("topo-p2p-r.txt", "topo-p2p-w.txt"):
        assert nvsmi.parse_p2p_matrix(real(name)) == {}
        assert nvsmi.parse_p2p_matrix(crlf(real(name))) == {}


@pytest.mark.parametrize("prefix", ["02_", "synth_topo_p2p_r_8x_CNS", "synth_topo_p2p_r_8x_OK"])
def test_every_real_topo_p2p_reads_the_same_underlined(prefix):
    text = sample(prefix)
    if "# BEGIN" in text:
        text = text.split("# BEGIN\n", 1)[1].split("# END", 1)[0]
    want = nvsmi.parse_p2p_matrix(text)
    assert want  # a real matrix, with pairs
    assert nvsmi.parse_p2p_matrix(underline_header(text)) == want
    assert nvsmi.parse_p2p_matrix(crlf(underline_header(text))) == want


def test_query_csv_and_table_of_the_h200():
    for text in (real("query-gpu.csv"), crlf(real("query-gpu.csv")),
                 "\x1b[0m" + real("query-gpu.csv").rstrip("\n") + "   \n"):
        (gpu,) = nvsmi.gpus_from_query(nvsmi.parse_query_csv(text))
        assert (gpu.index, gpu.name, gpu.memory_mib, gpu.compute_cap, gpu.driver_version) == \
            (0, "NVIDIA H200", 143771, "9.0", "580.159.04")
        assert gpu.uuid == "GPU-45d612f2-f419-ed1d-e6e0-1a290b853e64"
    bold = re.sub(r"(NVIDIA H200)", "\x1b[1m\\1\x1b[0m", real("nvidia-smi.txt"))
    for text in (real("nvidia-smi.txt"), crlf(real("nvidia-smi.txt")), bold):
        table = nvsmi.parse_smi_table(text)
        assert (table.driver_version, table.cuda_version) == ("580.159.04", "13.0")
        assert [(g.index, g.name, g.memory_total_mib) for g in table.gpus] == \
            [(0, "NVIDIA H200", 143771)]


def test_failures_are_classified_through_escapes_and_crlf():
    text = "\x1b[31mFailed to initialize NVML: Driver/library version mismatch\x1b[0m\r\n"
    assert nvsmi.classify_smi_error(text, 18) is nvsmi.SmiFailure.DRIVER_LIBRARY_MISMATCH


def checks_of(report: dict) -> dict[str, dict]:
    return {c["name"]: c for c in report["checks"]}


def test_doctor_from_the_h200_folder():
    """The issue's acceptance: the topology is read, the GPU checks pass, one GPU has no pair
    to test, and only host-python fails (Ubuntu 24.04: python 3.12), its fix a lock for
    3.12 and the data key pointing at it."""
    report = doctor.run_doctor(from_dir=H200, expectations=Expectations(
        count=1, model="NVIDIA H200"))
    checks = checks_of(report)
    assert report["status"] == "fail"
    assert [n for n, c in checks.items() if c["status"] != "pass"] == ["host-python"]
    assert checks["topology"]["message"] == "1 GPU; links: none"
    assert report["facts"]["topology"]["gpus"] == ["GPU0"]
    for name in ("p2p-support", "p2p-data", "p2p-bandwidth"):
        assert checks[name]["message"] == "one GPU: no pair to test"
    for name in ("nvidia-smi", "gpu-count", "gpu-model", "driver-version", "dev-nvidia-gpus",
                 "dev-nvidiactl", "dev-nvidia-uvm", "dev-cgroup", "cuda-init", "cuda-devices",
                 "host-glibc"):
        assert checks[name]["status"] == "pass", name
    fix = checks["host-python"]["fix"]
    assert "`sglang-deploy lock --python-version 3.12 locks/NAME.in" in fix
    assert "the data key `sglang_lock`" in fix
    assert checks["host-python"]["found"] == "Python 3.12"


def test_doctor_cli_from_the_h200_folder_prints_no_escape(capsys):
    rc = cli.main(["doctor", "--from", str(H200), "--expected-count", "1",
                   "--expected-model", "NVIDIA H200"])
    out = capsys.readouterr().out
    assert rc != 0 and "\x1b" not in out
    assert re.search(r"^pass +topology +1 GPU; links: none", out, re.MULTILINE)
    assert re.search(r"^fail +host-python", out, re.MULTILINE)
    assert "--python-version 3.12" in out
