"""Parsers of nvidia-smi outputs, against the real samples in tests/fixtures/nvidia-smi/."""

from __future__ import annotations

from pathlib import Path

import pytest

from sglang_deploy.core import nvsmi
from sglang_deploy.core.nvsmi import SmiFailure

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "nvidia-smi"


def raw(prefix: str) -> str:
    """The raw output of a sample (also accepts the shared-collection form with a header)."""
    (path,) = FIX.glob(prefix + "*")
    text = path.read_text()
    lines = text.split("\n")
    if "# BEGIN" in lines:
        return "\n".join(lines[lines.index("# BEGIN") + 1: lines.index("# END")]) + "\n"
    return text


# ----------------------------------------------------------------------------- query csv


def test_query_command_is_the_deploy_contract():
    assert nvsmi.QUERY_FIELDS == ("index", "name", "uuid", "driver_version", "memory.total",
                                  "compute_cap", "pci.bus_id")
    assert nvsmi.query_command() == (
        "nvidia-smi --query-gpu=index,name,uuid,driver_version,memory.total,compute_cap,"
        "pci.bus_id --format=csv,noheader,nounits")


def test_query_csv_noheader_with_units_sample_08():
    fields = ["index", "name", "uuid", "driver_version", "memory.total", "mig.mode.current"]
    block = raw("08_").split("\n\n")[0]
    rows = nvsmi.parse_query_csv(block, fields)
    assert [r["index"] for r in rows] == ["4", "5"]
    assert rows[0]["name"] == "NVIDIA RTX PRO 6000 Blackwell Server Edition"
    assert rows[0]["uuid"] == "GPU-4c395b7a-a7e6-d90f-1ced-d96e8dd68288"
    assert rows[0]["driver_version"] == "610.43.02"
    assert rows[0]["memory.total"] == "97887"  # "97887 MiB" without the unit
    assert rows[1]["mig.mode.current"] == "Enabled"


def test_query_csv_header_and_units_sample_07():
    first, second = raw("07_").split("\n\n")
    fields = ["index", "name", "temperature.gpu", "power.draw", "power.limit",
              "ecc.errors.corrected.volatile.total", "ecc.errors.uncorrected.volatile.total"]
    rows = nvsmi.parse_query_csv(first, fields)
    assert len(rows) == 2
    assert rows[0]["power.draw"] == "30.39" and rows[1]["power.limit"] == "600.00"
    assert rows[1]["ecc.errors.uncorrected.volatile.total"] == "0"
    # fields=None: names come from the header (which renamed the throttle fields)
    rows = nvsmi.parse_query_csv(second, None)
    assert rows[0]["clocks_event_reasons.active"] == "0x0000000000000004"
    assert rows[1]["clocks_event_reasons.sw_power_cap"] == "Active"


def test_query_csv_na_and_whitespace():
    text = "0, NVIDIA X ,  [N/A] , 580.95.05, [Not Supported], 12.0, 00000000:01:00.0  \n\n"
    (row,) = nvsmi.parse_query_csv(text)
    assert row["name"] == "NVIDIA X"
    assert row["uuid"] is None and row["memory.total"] is None
    assert row["pci.bus_id"] == "00000000:01:00.0"


def test_query_csv_deploy_fixture_and_typed_view():
    rows = nvsmi.parse_query_csv(raw("synth_query_8x"))
    gpus = nvsmi.gpus_from_query(rows)
    assert [g.index for g in gpus] == list(range(8))
    assert {g.memory_mib for g in gpus} == {97887}
    assert {g.compute_cap for g in gpus} == {"12.0"}
    assert gpus[7].pci_bus_id == "00000000:E1:00.0"


@pytest.mark.parametrize("prefix", ["11_", "13_"])
def test_query_csv_rejects_error_text(prefix):
    with pytest.raises(nvsmi.ParseError):
        nvsmi.parse_query_csv(raw(prefix))


def test_driver_version_tuple():
    assert nvsmi.driver_version_tuple("580.95.05") == (580, 95, 5)
    assert nvsmi.driver_version_tuple("580.95.05") > nvsmi.driver_version_tuple("580.9")
    with pytest.raises(ValueError):
        nvsmi.driver_version_tuple("N/A")


# ----------------------------------------------------------------------------- topo -m


def test_topo_tabs_gpu_numa_id_sample_01():
    topo = nvsmi.parse_topo_matrix(raw("01_"))
    assert topo.gpus == ["GPU0", "GPU1"] and topo.nics == []
    assert topo.links == {(0, 0): "X", (0, 1): "PHB", (1, 0): "PHB", (1, 1): "X"}
    assert topo.cpu_affinity == {0: "0-63", 1: "0-63"}
    assert topo.numa_affinity == {0: "0", 1: "0"}
    assert topo.gpu_numa_id == {0: None, 1: None}  # N/A after the double tab


def test_topo_mp_spaces_sample_06():
    topo = nvsmi.parse_topo_matrix(raw("06_"))
    assert topo.links[(0, 1)] == "PIX"
    assert topo.cpu_affinity[1] == "0-47"
    assert topo.gpu_numa_id == {0: None, 1: None}  # the last column is read


def test_topo_without_gpu_numa_id_sample_10():
    topo = nvsmi.parse_topo_matrix(raw("10_"))
    assert topo.links[(1, 0)] == "PHB"
    assert topo.numa_affinity == {0: "0", 1: "0"}
    assert topo.gpu_numa_id == {}


def test_topo_doc_examples_sample_28():
    blocks = [b for b in raw("28_").split("$ nvidia-smi topo -m\n") if b.strip()]
    assert len(blocks) == 3
    four, dual, switch = (nvsmi.parse_topo_matrix(b) for b in blocks)
    assert four.gpu_count == 4 and four.link_counts() == {"NODE": 6}
    assert dual.gpu_count == 8 and dual.link_counts() == {"PHB": 12, "SYS": 16}
    assert dual.links[(3, 4)] == "SYS" and dual.links[(4, 7)] == "PHB"
    assert switch.link_counts() == {"PHB": 16, "PIX": 12}
    assert four.cpu_affinity == {0: None, 1: None, 2: None, 3: None}
    # parse_topo_matrix reads the first matrix of a text
    assert nvsmi.parse_topo_matrix(raw("28_")).gpu_count == 4


def test_topo_nvlink_and_nics_sample_35():
    topo = nvsmi.parse_topo_matrix(raw("35_"))
    assert topo.gpus == ["GPU0", "GPU1"]
    assert topo.nics == [f"NIC{i}" for i in range(10)]
    assert topo.links[(0, 1)] == "NV12"
    assert topo.nic_links[("GPU0", "NIC0")] == "PXB"
    assert topo.nic_links[("NIC2", "NIC3")] == "PXB"
    assert topo.nic_links[("NIC3", "GPU0")] == "SYS"  # truncated row kept as far as it goes
    assert topo.cpu_affinity[0] == "48-63,176-191" and topo.numa_affinity[1] == "3"


def test_topo_nic_legend_and_preamble_sample_37():
    topo = nvsmi.parse_topo_matrix(raw("37_"))
    assert topo.gpus == ["GPU0"] and topo.nics == ["NIC0"]
    assert topo.cpu_affinity == {0: "0-251"}
    assert topo.nic_links[("NIC0", "GPU0")] == "PHB"


def test_topo_8x_synth():
    topo = nvsmi.parse_topo_matrix(raw("synth_topo_m_8x"))
    assert topo.gpu_count == 8
    assert topo.link_counts() == {"NODE": 12, "SYS": 16}
    assert topo.numa_affinity[7] == "1" and topo.cpu_affinity[0] == "0-31,64-95"


def test_topo_old_soc_code_is_sys():
    text = "\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tSOC\t0-7\nGPU1\tSOC\t X \t0-7\n"
    assert nvsmi.parse_topo_matrix(text).links[(0, 1)] == "SYS"


@pytest.mark.parametrize("prefix", ["11_", "13_", "02_"])
def test_topo_rejects_other_text(prefix):
    with pytest.raises(nvsmi.ParseError):
        nvsmi.parse_topo_matrix(raw(prefix))


def test_topo_incomplete_gpu_row():
    with pytest.raises(nvsmi.ParseError):
        nvsmi.parse_topo_matrix("\tGPU0\tGPU1\nGPU0\t X \tPHB\nGPU1\tPHB\n")


# ----------------------------------------------------------------------------- topo -p2p


def test_p2p_gns_sample_02():
    assert nvsmi.parse_p2p_matrix(raw("02_")) == {(0, 1): "GNS", (1, 0): "GNS"}


def test_p2p_8x_synth():
    ok = nvsmi.parse_p2p_matrix(raw("synth_topo_p2p_r_8x_OK"))
    assert len(ok) == 56 and set(ok.values()) == {"OK"}
    cns = nvsmi.parse_p2p_matrix(raw("synth_topo_p2p_r_8x_CNS"))
    assert cns[(0, 3)] == "OK" and cns[(0, 4)] == "CNS" and cns[(7, 0)] == "CNS"


def test_p2p_all_codes_and_missing():
    text = " \tGPU0\tGPU1\tGPU2\t\n GPU0\tX\tDR\tU\t\n GPU1\tTNS\tX\tNS\t\n GPU2\tCNS\tOK\tX\t\n"
    m = nvsmi.parse_p2p_matrix(text)
    assert m == {(0, 1): "DR", (0, 2): "U", (1, 0): "TNS", (1, 2): "NS", (2, 0): "CNS", (2, 1): "OK"}
    assert set(m.values()) - {"OK"} <= set(nvsmi.P2P_CODES)
    with pytest.raises(nvsmi.ParseError):
        nvsmi.parse_p2p_matrix(raw("11_"))


# ----------------------------------------------------------------------------- table


def test_table_550_sample_38():
    t = nvsmi.parse_smi_table(raw("38_"))
    assert (t.driver_version, t.cuda_version) == ("550.127.05", "12.4")
    assert len(t.gpus) == 8
    assert t.gpus[0].name == "NVIDIA RTX 6000 Ada Gene..." and t.gpus[0].name_truncated
    assert [g.index for g in t.gpus] == list(range(8))
    assert {g.memory_total_mib for g in t.gpus} == {49140}


def test_table_565_and_q_header_sample_39():
    t = nvsmi.parse_smi_table(raw("39_"))
    assert t.driver_version == "565.57.01" and t.cuda_version == "12.7"
    assert [g.name for g in t.gpus] == ["NVIDIA H100 80GB HBM3"] * 2
    assert not t.gpus[0].name_truncated and t.gpus[1].memory_total_mib == 81559


def test_table_580_header_sample_40():
    t = nvsmi.parse_smi_table(raw("40_"))
    assert (t.driver_version, t.cuda_version) == ("580.119.02", "13.0")
    assert t.gpus == []


def test_table_580_8x_synth():
    t = nvsmi.parse_smi_table(raw("synth_nvidia_smi_table_8x"))
    assert t.driver_version == "580.95.05" and len(t.gpus) == 8
    assert {g.memory_total_mib for g in t.gpus} == {97887}


def test_table_of_error_text_is_empty():
    t = nvsmi.parse_smi_table(raw("11_"))
    assert t.driver_version is None and t.gpus == []


# ----------------------------------------------------------------------------- failures


@pytest.mark.parametrize(
    ("prefix", "code", "kind"),
    [
        ("11_", None, SmiFailure.DRIVER_LIBRARY_MISMATCH),
        ("11_", 18, SmiFailure.DRIVER_LIBRARY_MISMATCH),
        ("13_", 9, SmiFailure.NO_DRIVER),
        ("13_", None, SmiFailure.NO_DRIVER),
        ("19_", None, SmiFailure.NVML_UNKNOWN),
    ],
)
def test_classify_real_samples(prefix, code, kind):
    assert nvsmi.classify_smi_error(raw(prefix), code) is kind


@pytest.mark.parametrize(
    ("text", "code", "kind"),
    [
        ("Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 580.95\n",
         18, SmiFailure.DRIVER_LIBRARY_MISMATCH),
        ("Failed to initialize NVML: Unknown Error\n", 255, SmiFailure.NVML_UNKNOWN),
        ("No devices were found\n", 6, SmiFailure.NO_DEVICES),
        ("bash: nvidia-smi: command not found\n", 127, SmiFailure.NOT_FOUND),
        ("", 127, SmiFailure.NOT_FOUND),
        ("NVIDIA-SMI couldn't find libnvidia-ml.so library in your system.\n", 12,
         SmiFailure.NVML_LIBRARY_MISSING),
        ("Unable to determine the device handle for GPU0000:01:00.0: GPU is lost.\n", 15,
         SmiFailure.GPU_LOST),
        ("something else\n", 3, SmiFailure.UNKNOWN),
    ],
)
def test_classify_messages(text, code, kind):
    assert nvsmi.classify_smi_error(text, code) is kind


def test_classify_success_is_none():
    assert nvsmi.classify_smi_error(raw("synth_query_8x"), 0) is None
    assert nvsmi.classify_smi_error(raw("38_"), None) is None


@pytest.mark.parametrize("text, kind", [
    ("FAILED TO INITIALIZE NVML: DRIVER/LIBRARY VERSION MISMATCH", SmiFailure.DRIVER_LIBRARY_MISMATCH),
    ("nvidia-smi has failed because it Couldn't Communicate With The NVIDIA Driver", SmiFailure.NO_DRIVER),
    ("exec: nvidia-smi: executable file not found in $PATH", SmiFailure.NOT_FOUND),
    ("GPU has Fallen Off The Bus", SmiFailure.GPU_LOST),
])
def test_classify_ignores_case(text, kind):
    assert nvsmi.classify_smi_error(text, None) is kind
    assert nvsmi.classify_smi_error(text.swapcase(), None) is kind
