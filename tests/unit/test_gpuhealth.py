"""GPU health (core.gpuhealth): parsing real and synthetic nvidia-smi, kernel-log and DCGM
outputs, the policy table and the gate a (re)start asks (tests/fixtures/gpuhealth/SOURCES.md)."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pytest

from sglang_deploy.core import data, gpuhealth
from sglang_deploy.core.errors import DataError, GpuHealthError
from sglang_deploy.core.hostrecords import GpuHealthRead

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "gpuhealth"
FIELDS = list(gpuhealth.HEALTH_FIELDS)


def fixture(name: str) -> str:
    return (FIX / name).read_text()


def project(capture: str, **changes: str) -> str:
    """The health query's answer (``csv,noheader,nounits``, HEALTH_FIELDS' order) of a real
    full ``--query-gpu`` capture (header + rows), with CHANGES to its values (a fault)."""
    lines = fixture(capture).splitlines()
    header = [re.sub(r"\s*\[[^\]]*\]$", "", c) for c in next(csv.reader([lines[0]], skipinitialspace=True))]
    out = []
    for line in lines[1:]:
        row = dict(zip(header, next(csv.reader([line], skipinitialspace=True))))
        row.update({k.replace("__", "."): v for k, v in changes.items()})
        # nounits: the unit after a number goes, as the deploy asks for it
        out.append(", ".join(re.sub(r"^(-?[\d.]+) (W|C|MiB|%)$", r"\1", row[f]) for f in FIELDS))
    return "\n".join(out) + "\n"


def raw(out: str, rc: int | None = 0, kernel: dict | None = None, dcgm: dict | None = None,
        dropped: tuple = (), xml: str | None = None, error: str | None = None) -> GpuHealthRead:
    """The typed read of the host's answers (``GpuHealthRead.from_json`` of the wire form)."""
    query = {"rc": rc, "out": out, "fields": [f for f in FIELDS if f not in dropped],
             "dropped": list(dropped)}
    if error:
        query["error"] = error
    return GpuHealthRead.from_json({
        "query": query, "xml": {"rc": 0, "out": xml} if xml is not None else None,
        "kernel": kernel if kernel is not None else {"rc": 0, "lines": []}, "dcgm": dcgm})


def kernel_lines(name: str) -> dict:
    """The kernel log as the host brings it back: only the lines of KERNEL_PATTERN."""
    pattern = re.compile(gpuhealth.KERNEL_PATTERN)
    return {"rc": 0, "lines": [x for x in fixture(name).splitlines() if pattern.search(x)]}


def codes(report: gpuhealth.Report) -> dict[str, str]:
    return {f.code: f.severity for f in report.findings}


H200 = "exporter_h200_590.48.01_query_gpu.csv"
H100 = "exporter_h100_590.48.01_query_gpu.csv"
GEFORCE = "exporter_rtx2080super_595.71.05_query_gpu.csv"


# ------------------------------------------------------------------------ real captures


@pytest.mark.parametrize("capture", [H200, H100, GEFORCE])
def test_real_captures_of_healthy_gpus_read_healthy(capture):
    report = gpuhealth.evaluate(raw(project(capture)), expected_count=1)
    assert report.verdict == "healthy" and report.findings == () and report.gpus == 1
    assert report.sources == ("nvidia-smi", "kernel-log")


def test_not_applicable_fields_of_a_gpu_without_ecc_are_not_errors():
    # the GeForce capture: ECC, retired pages and remapped rows all [N/A]
    text = project(GEFORCE)
    assert "[N/A]" in text
    assert gpuhealth.evaluate(raw(text), 1).verdict == "healthy"


def test_a_container_that_cannot_read_the_kernel_log_is_unknown_and_says_where_to_read_it():
    denied = {"rc": 1, "error": fixture("dmesg_not_permitted.txt"), "lines": []}
    report = gpuhealth.evaluate(raw(project(H200), kernel=denied), 1)
    assert report.verdict == "unknown" and "kernel-log" not in report.sources
    (f,) = report.findings
    assert f.code == "kernel-log-unreadable" and f.severity == "unknown"
    assert "the container cannot read the kernel log" in f.message
    assert "LXC host" in f.fix
    assert f.line().startswith("unknown: host: the container cannot read the kernel log")


# ------------------------------------------------------------------------ nvidia-smi faults


def test_uncorrectable_ecc_since_the_driver_loaded_is_fatal_on_that_gpu():
    text = project(H200, ecc__errors__uncorrected__volatile__total="2", ecc__errors__uncorrected__aggregate__total="5")
    report = gpuhealth.evaluate(raw(text), 1)
    assert report.verdict == "fatal"
    (f,) = report.findings
    assert (f.code, f.gpu, f.bus_id) == ("ecc-uncorrected-volatile", 0, "00000000:83:00.0")
    assert "2 uncorrectable ECC error(s)" in f.message and "nvidia-smi -r -i 0" in f.fix


def test_uncorrectable_ecc_only_in_the_lifetime_count_is_a_warning():
    text = project(H100, ecc__errors__uncorrected__aggregate__total="3")
    report = gpuhealth.evaluate(raw(text), 1)
    assert report.verdict == "warning" and codes(report) == {"ecc-uncorrected-aggregate": "warning"}


def test_a_pending_remap_is_a_warning_until_the_reset_and_a_failed_one_fatal():
    pending = gpuhealth.evaluate(raw(project(H100, remapped_rows__pending="Yes")), 1)
    assert pending.verdict == "warning" and codes(pending) == {"remap-pending": "warning"}
    failed = gpuhealth.evaluate(raw(project(H100, remapped_rows__failure="Yes")), 1)
    assert failed.verdict == "fatal" and codes(failed) == {"remap-failure": "fatal"}
    retire = gpuhealth.evaluate(raw(project(H200, retired_pages__pending="Yes")), 1)
    assert codes(retire) == {"retired-pages-pending": "warning"}


@pytest.mark.parametrize("action, said", [("Reset", "a GPU reset"), ("Reboot", "a reboot"),
                                          ("Drain P2P", "draining P2P"),
                                          ("Drain and Reset", "draining P2P traffic and a GPU reset"),
                                          ("SomethingNew", "`SomethingNew`")])
def test_a_recovery_action_the_driver_asks_for_is_fatal(action, said):
    report = gpuhealth.evaluate(raw(project(H200, gpu_recovery_action=action)), 1)
    assert report.verdict == "fatal"
    (f,) = report.findings
    assert f.code == "recovery-action" and said in f.message and action in f.message


@pytest.mark.parametrize("cell", ["[Unknown Error]", "ERR!"])
def test_a_health_counter_that_cannot_be_read_is_unknown_never_healthy(cell):
    text = project(H200, ecc__errors__uncorrected__volatile__total=cell)
    report = gpuhealth.evaluate(raw(text), 1)
    assert report.verdict == "unknown" and codes(report) == {"field-unreadable": "unknown"}
    assert cell in report.findings[0].message


def test_an_err_reading_of_power_is_a_warning():
    report = gpuhealth.evaluate(raw(project(H200, power__draw="ERR!")), 1)
    assert report.verdict == "warning" and codes(report) == {"field-error": "warning"}


def test_a_cell_saying_the_gpu_is_lost_or_needs_a_reset_is_fatal():
    lost = gpuhealth.evaluate(raw(project(H200, temperature__gpu="[GPU is lost]")), 1)
    assert codes(lost) == {"gpu-lost": "fatal"}
    reset = gpuhealth.evaluate(raw(project(H200, power__draw="[GPU requires reset]")), 1)
    assert codes(reset) == {"recovery-action": "fatal"}


def test_a_lost_gpu_between_the_rows_is_fatal_and_named():
    # real: the handle error of GPU0 above GPU1's row (the row is of another query)
    report = gpuhealth.evaluate(raw(fixture("query_lost_gpu0_616.92.txt"), rc=15), 2)
    lost = [f for f in report.findings if f.code == "gpu-lost"]
    assert report.verdict == "fatal" and len(lost) == 1
    assert (lost[0].gpu, lost[0].bus_id) == (0, "0000:24:00.0")
    assert "GPU is lost.  Reboot the system to recover this GPU" in lost[0].message


@pytest.mark.parametrize("name, bus, said", [
    ("handle_unknown_error_nospace_525.txt", "0000:65:00.0", "Unknown Error"),
    ("handle_unknown_error_space.txt", "0000:0B:00.0", "Unknown Error"),
    ("handle_gpu_is_lost.txt", "0000:05:00.0", "GPU is lost"),
])
def test_every_real_form_of_the_handle_error_names_the_bus(name, bus, said):
    report = gpuhealth.evaluate(raw(fixture(name), rc=15), 1)
    (f,) = report.findings
    assert (f.code, f.severity, f.bus_id, f.gpu) == ("gpu-lost", "fatal", bus, None)
    assert said in f.message


def test_fewer_gpus_than_the_data_expects_is_fatal():
    eight = "".join(f"{i}, 00000000:{0x10 + i:02X}:00.0, GPU-{i}, 0, 0, [N/A], No, No, None, 30, 40\n"
                    for i in range(7))
    report = gpuhealth.evaluate(raw(eight), expected_count=8)
    assert codes(report) == {"gpu-missing": "fatal"}
    assert "7 GPU(s) answered (0, 1, 2, 3, 4, 5, 6)" in report.findings[0].message
    assert gpuhealth.evaluate(raw(eight), expected_count=7).verdict == "healthy"


@pytest.mark.parametrize("out, rc, error", [
    ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. ", 9, None),
    ("Failed to initialize NVML: Unknown Error\n", 255, None),
    ("", None, "`nvidia-smi --query-gpu=...` did not finish within 20 s (killed)"),
])
def test_a_query_that_fails_is_unknown_never_healthy(out, rc, error):
    report = gpuhealth.evaluate(raw(out, rc=rc, error=error), 8)
    assert report.verdict == "unknown" and report.gpus is None
    (f,) = report.findings
    assert f.code == "query-failed" and f.severity == "unknown"
    assert (error or out.strip()[:30]) in f.message


def test_no_read_at_all_is_unknown():
    assert gpuhealth.evaluate(None, 8).verdict == "unknown"


def test_fields_an_older_driver_does_not_know_are_read_from_the_xml_report():
    dropped = ("retired_pages.pending", "remapped_rows.pending", "remapped_rows.failure",
               "gpu_recovery_action")
    fields = [f for f in FIELDS if f not in dropped]
    rows = [dict(zip(FIELDS, ["0", "00000000:01:00.0", "GPU-a", "0", "0", "", "", "", "", "30", "60"])),
            dict(zip(FIELDS, ["1", "00000000:25:00.0", "GPU-b", "0", "3", "", "", "", "", "31", "61"]))]
    text = "".join(", ".join(r[f] for f in fields) + "\n" for r in rows)
    report = gpuhealth.evaluate(raw(text, dropped=dropped,
                                    xml=fixture("synth_q_x_two_gpus_remap_pending.xml")), 2)
    assert {(f.code, f.gpu) for f in report.findings} == {("remap-pending", 1),
                                                          ("ecc-uncorrected-aggregate", 1)}
    assert "gpu_recovery_action" in report.notes[0] and "-q -x" in report.notes[0]


# ------------------------------------------------------------------------ kernel log


def _gpu_at(bus: str) -> str:
    return f"0, {bus}, GPU-a, 0, 0, [N/A], No, No, None, 30, 60\n"


def test_the_multiline_fallen_off_the_bus_without_an_xid_is_xid_79_fatal():
    report = gpuhealth.evaluate(raw(_gpu_at("00000000:B3:00.0"),
                                    kernel=kernel_lines("kernel_fallen_off_bus_570.txt")), 1)
    assert codes(report) == {"xid-79": "fatal"}
    f = report.findings[0]
    assert f.gpu == 0 and "fallen off the bus" in f.message and "1843.308145 s after boot" in f.message


def test_an_xid_of_a_gpu_this_host_does_not_use_is_left_out():
    report = gpuhealth.evaluate(raw(_gpu_at("00000000:01:00.0"),
                                    kernel=kernel_lines("kernel_xid79_short.txt")), 1)
    assert report.verdict == "healthy" and report.findings == ()


@pytest.mark.parametrize("name, bus, code, severity", [
    ("kernel_xid79_short.txt", "00000000:44:00.0", "xid-79", "fatal"),
    ("kernel_xid48_dbe.txt", "00000000:01:00.0", "xid-48", "fatal"),
    ("kernel_xid32_channel.txt", "00000000:01:00.0", "xid-32", "ignore"),
])
def test_xid_lines_are_judged_by_their_code(name, bus, code, severity):
    report = gpuhealth.evaluate(raw(_gpu_at(bus), kernel=kernel_lines(name)), 1)
    if severity == "ignore":  # an application's fault: the GPU is fine
        assert report.verdict == "healthy" and report.findings == ()
    else:
        assert codes(report) == {code: severity}
        assert len(report.findings) == 1  # a repeated line is one finding


def test_an_xid_this_tool_does_not_classify_is_a_warning():
    kernel = {"rc": 0, "lines": ["[  9.0] NVRM: Xid (PCI:0000:01:00): 999, pid=7, something new"]}
    report = gpuhealth.evaluate(raw(_gpu_at("00000000:01:00.0"), kernel=kernel), 1)
    assert codes(report) == {"xid-999": "warning"}


# ------------------------------------------------------------------------ DCGM


def test_dcgm_failure_and_warning_name_their_gpu_and_words():
    dcgm = {"rc": 0, "out": fixture("synth_dcgmi_health_failure.txt")}
    report = gpuhealth.evaluate(raw(project(H200), dcgm=dcgm), 1)
    assert "dcgm" in report.sources and report.verdict == "fatal"
    found = {(f.code, f.gpu): f.message for f in report.findings}
    assert set(found) == {("dcgm-warning", 0), ("dcgm-failure", 1)}
    assert "Volatile double-bit ECC error(s) detected on GPU 1: 2 errors" in found[("dcgm-failure", 1)]


def test_dcgm_healthy_adds_nothing_and_without_watches_is_unknown():
    healthy = {"rc": 0, "out": fixture("synth_dcgmi_health_healthy.txt")}
    report = gpuhealth.evaluate(raw(project(H200), dcgm=healthy), 1)
    assert report.verdict == "healthy" and "dcgm" in report.sources
    off = {"rc": 255, "out": fixture("dcgmi_watches_not_enabled.txt")}
    report = gpuhealth.evaluate(raw(project(H200), dcgm=off), 1)
    assert codes(report) == {"dcgm-unreadable": "unknown"}
    assert "Health watches not enabled" in report.findings[0].message


# ------------------------------------------------------------------------ policy and gate


def test_the_hosts_policy_overrides_the_default_severity():
    kernel = kernel_lines("kernel_xid48_dbe.txt")
    text = _gpu_at("00000000:01:00.0")
    assert gpuhealth.evaluate(raw(text, kernel=kernel), 1).verdict == "fatal"
    assert gpuhealth.evaluate(raw(text, kernel=kernel), 1, {"xid-48": "warning"}).verdict == "warning"
    assert gpuhealth.evaluate(raw(text, kernel=kernel), 1, {"xid-48": "ignore"}).findings == ()


def test_the_policy_key_is_checked_before_any_connection():
    assert gpuhealth.policy_problem({"xid-48": "warning", "query-failed": "fatal"}) is None
    with pytest.raises(DataError, match="gpu_health_policy"):
        data.resolve({"sglang_model_path": "/m", "gpu_health_policy": {"xid-48": "meh"}}, {})
    with pytest.raises(DataError, match="found:    'ecc'"):
        data.resolve({"sglang_model_path": "/m", "gpu_health_policy": {"ecc": "fatal"}}, {})


def test_the_gate_refuses_a_fatal_gpu_with_the_finding_and_the_fix():
    text = project(H200, ecc__errors__uncorrected__volatile__total="2")
    report = gpuhealth.evaluate(raw(text), 1)
    with pytest.raises(GpuHealthError) as err:
        gpuhealth.gate(report, "gpu-host-1", "restart sglang (unit changed)")
    e = err.value
    assert "gpu-host-1's GPUs healthy before it can restart sglang (unit changed)" in e.what
    assert "nothing was stopped" in e.what
    assert "GPU 0: 2 uncorrectable ECC error(s)" in e.found and "nvidia-smi -r -i 0" in e.fix
    assert "ecc-uncorrected-volatile: warning" in e.fix
    assert e.details["findings"][0]["code"] == "ecc-uncorrected-volatile"


@pytest.mark.parametrize("report", [
    gpuhealth.evaluate(None, 8),  # unknown
    gpuhealth.Report(verdict="warning", findings=(gpuhealth.Finding(
        code="remap-pending", message="m", fix="f", source="nvidia-smi", severity="warning"),)),
    gpuhealth.Report(verdict="healthy"),
])
def test_the_gate_lets_warnings_and_unknowns_pass(report):
    gpuhealth.gate(report, "h", "start sglang")


def test_a_policy_can_make_an_unread_health_fail_closed():
    report = gpuhealth.evaluate(raw("", rc=9), 8, {"query-failed": "fatal"})
    with pytest.raises(GpuHealthError, match="query-failed"):
        gpuhealth.gate(report, "h", "start sglang")


def test_the_status_cell_and_lines():
    report = gpuhealth.evaluate(raw(project(H100, remapped_rows__pending="Yes")), 1)
    doc = report.to_dict()
    assert gpuhealth.summary_of(doc) == "warning: GPU 0 remap-pending"
    assert gpuhealth.summary_of(None) == "-"
    assert gpuhealth.lines("h1", doc) == [
        ("h1: warning: GPU 0: a row remapping is pending (applied at the next GPU reset) (fix: "
        "at the next maintenance window, stop the server and reset the GPU on the LXC host "
        "(`nvidia-smi -r -i 0`); serving goes on meanwhile)")]


# ------------------------------------------------------------------------ the host's read


TOOL = Path(__file__).resolve().parents[2] / "sglang_deploy" / "remote" / "hoststate.py"


def _fake_tools(bin_dir: Path, xml: str) -> None:
    """An nvidia-smi of a driver that does not know ``gpu_recovery_action`` (its real refusal,
    exit 2), answering the rest for one GPU with a pending remap; a dmesg refused as in an
    unprivileged container; no dcgmi."""
    bin_dir.mkdir()
    (bin_dir / "q.xml").write_text(xml)
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f"""#!/bin/sh
case "$*" in
  *gpu_recovery_action*) printf 'Field "gpu_recovery_action" is not a valid field to query.\\n\\n'; exit 2;;
  "-q -x") cat {bin_dir}/q.xml; exit 0;;
  *--query-gpu=*) echo "0, 00000000:25:00.0, GPU-b, 0, 0, No, Yes, No, 31, 61"; exit 0;;
esac
exit 3
""")
    dmesg = bin_dir / "dmesg"
    dmesg.write_text("#!/bin/sh\necho 'dmesg: read kernel buffer failed: Operation not permitted' >&2\n"
                     "exit 1\n")
    for tool in (smi, dmesg):
        tool.chmod(0o755)


def test_the_state_read_brings_the_health_back_and_drops_what_the_driver_does_not_know(tmp_path):
    import json
    import subprocess
    import sys

    from sglang_deploy.hostops.facts import SglangHostState

    _fake_tools(tmp_path / "bin", fixture("synth_q_x_two_gpus_remap_pending.xml"))
    argv = SglangHostState.args(root=str(tmp_path), service="sglang-deploy-test-absent",
                                gpu_health=True)
    out = subprocess.run([sys.executable, str(TOOL), *argv], capture_output=True, text=True,
                         check=True, stdin=subprocess.DEVNULL,
                         env={"PATH": str(tmp_path / "bin")}).stdout
    health = json.loads(out)["gpu_health"]
    assert health["query"]["dropped"] == ["gpu_recovery_action"]
    assert "gpu_recovery_action" not in health["query"]["fields"] and health["query"]["rc"] == 0
    assert health["xml"]["rc"] == 0 and health["dcgm"] is None
    assert health["kernel"]["rc"] == 1 and "Operation not permitted" in health["kernel"]["error"]
    report = gpuhealth.evaluate(GpuHealthRead.from_json(health), 1)
    assert codes(report) == {"remap-pending": "warning", "kernel-log-unreadable": "unknown"}
    assert report.verdict == "warning"


def test_the_state_read_without_the_option_asks_no_gpu(tmp_path):
    import json
    import subprocess
    import sys

    _fake_tools(tmp_path / "bin", "")
    (tmp_path / "bin" / "nvidia-smi").write_text("#!/bin/sh\ntouch " + str(tmp_path / "asked") + "\n")
    out = subprocess.run([sys.executable, str(TOOL), "state", "--root", str(tmp_path),
                          "--service", "x"], capture_output=True, text=True, check=True,
                         stdin=subprocess.DEVNULL, env={"PATH": str(tmp_path / "bin")}).stdout
    assert "gpu_health" not in json.loads(out) and not (tmp_path / "asked").exists()


# ------------------------------------------------------------------------ status


def test_status_lists_the_findings_under_the_table_and_a_fatal_gpu_fails_it(capsys):
    from sglang_deploy.commands import status

    report = gpuhealth.evaluate(raw(project(H100, remapped_rows__failure="Yes")), 1).to_dict()
    rows = [{"host": "h1", "in_sync": True, "healthy": True, "gpu_health": report},
            {"host": "h2", "in_sync": True, "healthy": True, "gpu_health": None}]
    status.render_gpu_health(rows)
    out = capsys.readouterr().out.splitlines()
    assert out == [("gpu: h1: fatal: GPU 0: a row remapping failed: the GPU's memory has no spare "
                   "rows left where it needed one (fix: replace the GPU (NVIDIA's RMA policy for "
                   "row-remapping failure))")]
    assert status.ok(rows, [], None) is False
    rows[0]["gpu_health"] = gpuhealth.evaluate(raw(project(H100)), 1).to_dict()
    assert status.ok(rows, [], None) is True
    assert status.gpu_cell(rows[0]) == "healthy" and status.gpu_cell(rows[1]) == "-"
    assert status.gpu_cell({"gpu_health": report}, short=True) == "FATAL"
