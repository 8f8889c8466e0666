"""Pre-flight decisions (pure): each failure kind gives its diagnosis, expected/found and fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from sglang_deploy.core import nvsmi, preflight
from sglang_deploy.core.hostrecords import LastVerified, ModelState, P2PVerified
from sglang_deploy.core.hoststate import ServiceState
from sglang_deploy.core.preflight import Check, Expectations

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "nvidia-smi"
NAME = "NVIDIA RTX PRO 6000 Blackwell Server Edition"


def raw(prefix: str) -> str:
    (path,) = FIX.glob(prefix + "*")
    lines = path.read_text().split("\n")
    if "# BEGIN" in lines:
        return "\n".join(lines[lines.index("# BEGIN") + 1: lines.index("# END")]) + "\n"
    return "\n".join(lines)


def by_name(checks: list[Check]) -> dict[str, Check]:
    return {c.name: c for c in checks}


def assert_actionable(check: Check) -> None:
    assert check.status == "fail"
    assert check.expected and check.found and check.fix, check


def rows(n: int = 8, skip=(), name: str = NAME, driver: str = "580.95.05"):
    return [r | {"name": name, "driver_version": driver}
            for r in nvsmi.parse_query_csv(raw("synth_query_8x"))[:n]
            if int(r["index"]) not in skip]


def pairs(n: int = 8, override=None):
    override = override or {}
    out = []
    for s in range(n):
        for d in range(n):
            if s != d:
                entry = {"src": s, "dst": d, "can_access": True, "verified": True, "gbps": 40.0,
                         "error": None}
                entry.update(override.get((s, d), {}))
                out.append(entry)
    return out


# ----------------------------------------------------------------------------- Check


def test_check_validates_status_and_serialises():
    with pytest.raises(ValueError):
        Check("x", "ok", "nope")  # type: ignore[arg-type]
    d = Check("x", "pass", "fine").to_dict()
    assert d == {"name": "x", "status": "pass", "message": "fine"}
    d = Check("y", "fail", "bad", fix="do", expected="e", found="f", details={"k": 1}).to_dict()
    assert d["fix"] == "do" and d["details"] == {"k": 1}


def test_summarise():
    ok = Check("a", "pass", "ok")
    warn = Check("b", "warn", "hm")
    bad = Check("c", "fail", "broken", fix="fix c", expected="E", found="F")
    assert preflight.summarise([ok, Check("s", "skipped", "-")]) == "pass"
    assert preflight.summarise([ok, warn]) == "warn"
    assert preflight.summarise([ok, warn, bad]) == "fail"
    assert preflight.summarise([Check("s", "skipped", "-")]) == "skipped"


# ----------------------------------------------------------------------------- nvidia-smi


def test_smi_healthy():
    checks = by_name(preflight.check_smi(rows(), 8, NAME, "580.0"))
    assert {c.status for c in checks.values()} == {"pass"}
    assert checks["gpu-count"].details["count"] == 8


def test_smi_missing_gpu_names_mount_entry():
    c = by_name(preflight.check_smi(rows(skip=(7,)), 8, NAME, "580.0"))["gpu-count"]
    assert_actionable(c)
    assert c.found == "7 GPUs (indices 0-6)"
    assert "lxc.mount.entry: /dev/nvidia7 dev/nvidia7 none bind,optional,create=file" in c.fix
    assert "lxc.cgroup2.devices.allow: c 195:* rwm" in c.fix


def test_a_profile_for_more_gpus_than_the_host_has_says_which_keys_fit_it():
    """4 GPUs where the seed's profile wants 8: the fix names the profile's keys, beside the
    LXC lines for GPUs that are there but not passed through."""
    c = by_name(preflight.check_smi(rows(n=4), 8, NAME, "580.0"))["gpu-count"]
    assert_actionable(c)
    assert "lxc.mount.entry: /dev/nvidia4 dev/nvidia4" in c.fix
    assert "`gpu_expected_count = 4`" in c.fix and "`tp-size` of at most 4" in c.fix
    assert "group_data/all.py" in c.fix


def test_smi_more_gpus_than_expected_warns():
    assert by_name(preflight.check_smi(rows(), 4))["gpu-count"].status == "warn"


def test_smi_model_mismatch_and_partial_names():
    ws = "NVIDIA RTX PRO 6000 Blackwell Workstation Edition"
    c = by_name(preflight.check_smi(rows(name=ws), 8, NAME))["gpu-model"]
    assert_actionable(c)
    assert "GPU0: " + ws in c.found
    assert "`gpu_expected_model`" in c.fix and "group_data/all.py" in c.fix
    # the exact name: a part of it is no match (the data key's meaning), white space aside
    assert by_name(preflight.check_smi(rows(name=ws), 8, "RTX PRO 6000 Blackwell"))["gpu-model"].status == "fail"
    assert by_name(preflight.check_smi(rows(name=ws), 8, ws.upper()))["gpu-model"].status == "fail"
    assert by_name(preflight.check_smi(rows(name=ws), 8, ws.replace(" ", "  ")))["gpu-model"].status == "pass"


def test_smi_driver_too_old():
    c = by_name(preflight.check_smi(rows(driver="570.172.08"), 8, None, "580.0"))["driver-version"]
    assert_actionable(c)
    assert "570.172.08" in c.found and ">= 580.0" in c.expected
    assert by_name(preflight.check_smi(rows(driver="580.95.05"), 8, None, "580.95.05"))["driver-version"].status == "pass"


@pytest.mark.parametrize(
    ("prefix", "code", "kind", "fix_piece"),
    [
        ("11_", None, "driver-library-mismatch", "--no-kernel-module"),
        ("13_", 9, "no-driver", "lxc.mount.entry: /dev/nvidiactl"),
    ],
)
def test_smi_failures_from_real_samples(prefix, code, kind, fix_piece):
    checks = by_name(preflight.check_smi(None, 8, NAME, "580.0", error_text=raw(prefix), exit_code=code))
    c = checks["nvidia-smi"]
    assert_actionable(c)
    assert c.details["kind"] == kind
    assert fix_piece in c.fix
    assert {checks[n].status for n in ("gpu-count", "gpu-model", "driver-version")} == {"skipped"}


def test_smi_mismatch_message_and_version_hint():
    c = preflight.check_smi(None, 8, error_text=raw("11_"), exit_code=None)[0]
    assert "different version than the kernel module" in c.message
    assert "/proc/driver/nvidia/version" in c.fix


@pytest.mark.parametrize(
    ("text", "code", "piece"),
    [
        ("Failed to initialize NVML: Unknown Error\n", 255, "lxc.cgroup2.devices.allow: c 195:* rwm"),
        ("No devices were found\n", 6, "lxc.mount.entry: /dev/nvidiaN"),
        ("sh: 1: nvidia-smi: not found\n", 127, "--no-kernel-module"),
        ("weird\n", 3, "Run `nvidia-smi`"),
    ],
)
def test_smi_other_failures(text, code, piece):
    c = preflight.check_smi(None, 8, error_text=text, exit_code=code)[0]
    assert_actionable(c)
    assert piece in c.fix
    assert f"exit code {code}" in c.found


# ----------------------------------------------------------------------------- device nodes


def test_nodes_healthy_from_listing():
    checks = by_name(preflight.check_device_nodes(raw("synth_dev_nvidia_8x"), 8, {}))
    assert [checks[n].status for n in ("dev-nvidia-gpus", "dev-nvidiactl", "dev-nvidia-uvm",
                                       "dev-nvidia-uvm-tools")] == ["pass"] * 4
    assert checks["dev-nvidia-uvm"].message == "/dev/nvidia-uvm 508:0"


def test_parse_dev_listing_handles_caps_dir():
    nodes = preflight.parse_dev_listing(raw("synth_dev_nvidia_8x"))
    assert nodes["/dev/nvidia3"].major == 195 and nodes["/dev/nvidia3"].minor == 3
    assert nodes["/dev/nvidiactl"].minor == 255
    assert nodes["/dev/nvidia-caps/nvidia-cap1"].major == 511
    assert preflight.uvm_major_of(nodes) == 508


def test_nodes_uvm_missing_gives_modprobe_and_mount_lines():
    listing = "".join(ln + "\n" for ln in raw("synth_dev_nvidia_8x").splitlines() if "uvm" not in ln)
    checks = by_name(preflight.check_device_nodes(listing, 8))
    c = checks["dev-nvidia-uvm"]
    assert_actionable(c)
    assert "nvidia-modprobe -u -c=0" in c.fix
    assert "lxc.mount.entry: /dev/nvidia-uvm dev/nvidia-uvm none bind,optional,create=file" in c.fix
    assert ("lxc.mount.entry: /dev/nvidia-uvm-tools dev/nvidia-uvm-tools none bind,optional,"
            "create=file") in c.fix
    assert "c <uvm-major>:* rwm" in c.fix and "/proc/devices" in c.fix
    assert checks["dev-nvidia-uvm-tools"].status == "warn"
    assert checks["dev-nvidia-gpus"].status == "pass"


def test_nodes_placeholder_file_from_skipped_optional_mount():
    listing = raw("synth_dev_nvidia_8x").replace(
        "crw-rw-rw- 1 root root 508,   0 Dec  2 13:10 /dev/nvidia-uvm\n",
        "-rw-r--r-- 1 root root        0 Dec  2 13:10 /dev/nvidia-uvm\n")
    c = by_name(preflight.check_device_nodes(listing, 8))["dev-nvidia-uvm"]
    assert_actionable(c)
    assert "empty regular file" in c.message and "optional" in c.message
    assert "c 508:* rwm" in c.fix  # the major is known from nvidia-uvm-tools


def test_nodes_missing_gpu_and_ctl():
    listing = "".join(f"crw-rw-rw- 1 root root 195, {i} Dec  2 13:10 /dev/nvidia{i}\n"
                      for i in range(6))
    checks = by_name(preflight.check_device_nodes(listing, 8))
    c = checks["dev-nvidia-gpus"]
    assert_actionable(c)
    assert c.details["missing"] == [6, 7]
    assert "lxc.mount.entry: /dev/nvidia7 dev/nvidia7" in c.fix
    assert checks["dev-nvidiactl"].status == "fail"
    assert "lxc.mount.entry: /dev/nvidiactl dev/nvidiactl" in checks["dev-nvidiactl"].fix


def test_nodes_nothing_at_all():
    text = "ls: cannot access '/dev/nvidia*': No such file or directory\n"
    checks = by_name(preflight.check_device_nodes(text, 8, {}))
    assert [checks[n].status for n in ("dev-nvidia-gpus", "dev-nvidiactl", "dev-nvidia-uvm")] == ["fail"] * 3
    assert checks["dev-cgroup"].status == "skipped"


def test_nodes_cgroup_denied_lists_allow_lines_for_real_majors():
    opened = preflight.parse_open_results(
        "/dev/nvidia0 ok\n/dev/nvidia-uvm EPERM Operation not permitted\n"
        "/dev/nvidia1 EPERM Operation not permitted\n/dev/nvidiactl ok\n")
    c = by_name(preflight.check_device_nodes(raw("synth_dev_nvidia_8x"), 8, opened))["dev-cgroup"]
    assert_actionable(c)
    # the same lines as the real Proxmox configs (samples 14/15)
    conf = raw("14_")
    assert "lxc.cgroup2.devices.allow: c 195:* rwm" in conf
    assert "lxc.cgroup2.devices.allow: c 195:* rwm" in c.fix
    assert "lxc.cgroup2.devices.allow: c 508:* rwm" in c.fix
    assert "c 195:0 rwm" in c.fix  # mentions the per-minor form of sample 15
    assert "lxc.cgroup2.devices.allow: c 195:0 rwm" in raw("15_")
    assert c.details["denied"] == ["/dev/nvidia-uvm", "/dev/nvidia1"]


def test_nodes_other_open_errors():
    opened = {"/dev/nvidia0": "EACCES Permission denied"}
    c = by_name(preflight.check_device_nodes(raw("synth_dev_nvidia_8x"), 8, opened))["dev-cgroup"]
    assert_actionable(c)
    assert "EACCES" in c.fix


def test_fix_lines_match_real_lxc_config_syntax():
    """Every lxc line a fix proposes has the exact shape of the real configs (sample 14)."""
    real = {ln.split(":", 1)[0] for ln in raw("14_").splitlines() if ln.startswith("lxc.")}
    texts = [preflight.uvm_fix(508), preflight.gpu_nodes_fix(["/dev/nvidia0"], include_ctl=True),
             preflight.cgroup_fix([195, 508])]
    proposed = [ln.strip() for t in texts for ln in t.splitlines() if ln.strip().startswith("lxc.")]
    assert proposed
    for line in proposed:
        key = line.split(":", 1)[0]
        assert key in real, line
        if key == "lxc.mount.entry":
            src, dst, *_ = line.split(": ", 1)[1].split()
            assert dst == src.removeprefix("/")
            assert line.endswith("none bind,optional,create=file")
    assert "lxc.mount.entry: /dev/nvidia-uvm dev/nvidia-uvm none bind,optional,create=file" in raw("14_")


# ----------------------------------------------------------------------------- CUDA probe


def probe_ok(n: int = 8, p2p=None):
    return {"ok": True, "library": "/usr/lib/x86_64-linux-gnu/libcuda.so.1", "error": None,
            "driver_version": 13000, "device_count": n,
            "devices": [{"index": i, "name": NAME, "cc": "12.0", "total_mem_mib": 97887}
                        for i in range(n)], "p2p": p2p or []}


def probe_err(call: str, code, name, message):
    return {"ok": False, "library": None, "error": {"call": call, "code": code, "name": name,
                                                    "message": message},
            "driver_version": None, "device_count": None, "devices": [], "p2p": []}


def test_probe_healthy():
    checks = by_name(preflight.check_cuda_probe(probe_ok(), 8))
    assert checks["cuda-init"].status == "pass" and "13.0" in checks["cuda-init"].message
    assert checks["cuda-devices"].status == "pass"


def test_probe_not_run_is_skipped():
    assert {c.status for c in preflight.check_cuda_probe(None, 8)} == {"skipped"}


def test_probe_fewer_devices():
    c = by_name(preflight.check_cuda_probe(probe_ok(7), 8))["cuda-devices"]
    assert_actionable(c)
    assert "/dev/nvidia7" in c.fix and "CUDA_VISIBLE_DEVICES" in c.fix


@pytest.mark.parametrize(
    ("error", "message_piece", "fix_piece"),
    [
        (("cuInit", 999, "CUDA_ERROR_UNKNOWN", "unknown error"), "/dev/nvidia-uvm",
         "nvidia-modprobe -u -c=0"),
        (("cuInit", 803, "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
          "system has unsupported display driver / cuda driver combination"),
         "not the version of the host's kernel module", "--no-kernel-module"),
        (("cuInit", 804, "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE", "forward compatibility"),
         "forward-compatibility", "LD_LIBRARY_PATH"),
        (("cuInit", 304, "CUDA_ERROR_OPERATING_SYSTEM", "OS call failed or operation not supported on this OS"),
         "operating-system call", "lxc.cgroup2.devices.allow: c 195:* rwm"),
        (("cuInit", 35, "CUDA_ERROR_INSUFFICIENT_DRIVER",
          "CUDA driver version is insufficient for CUDA runtime version"),
         "Insufficient driver", "/proc/driver/nvidia/version"),
        (("cuInit", 100, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"),
         "no usable GPU", "lxc.mount.entry: /dev/nvidiactl"),
        (("cuInit", 34, "CUDA_ERROR_STUB_LIBRARY", "CUDA driver is a stub library"),
         "stub", "stubs"),
        (("dlopen", None, None, "libcuda.so.1: cannot open shared object file: No such file or directory"),
         "no NVIDIA userspace driver", "--no-kernel-module"),
        (("cuInit", 1, "CUDA_ERROR_INVALID_VALUE", "invalid argument"), "cuInit failed with", "cuda_probe.py"),
    ],
)
def test_probe_diagnoses(error, message_piece, fix_piece):
    checks = by_name(preflight.check_cuda_probe(probe_err(*error), 8))
    c = checks["cuda-init"]
    assert_actionable(c)
    assert message_piece in c.message
    assert fix_piece in c.fix
    assert checks["cuda-devices"].status == "skipped"


def test_probe_999_uses_device_listing():
    listing = "".join(ln + "\n" for ln in raw("synth_dev_nvidia_8x").splitlines() if "uvm" not in ln)
    c = preflight.check_cuda_probe(probe_err("cuInit", 999, "CUDA_ERROR_UNKNOWN", "unknown error"), 8, listing)[0]
    assert "/dev/nvidia-uvm is missing in the container" in c.message
    c = preflight.check_cuda_probe(probe_err("cuInit", 999, "CUDA_ERROR_UNKNOWN", "unknown error"), 8,
                                   raw("synth_dev_nvidia_8x"))[0]
    assert "denied by the device cgroup" in c.message  # uvm present: the other causes
    assert "c 508:* rwm" in c.fix


def test_probe_timeout_in_p2p():
    probe = probe_ok(p2p=pairs()[:3])
    probe["ok"] = False
    probe["error"] = {"call": "cuMemcpyPeer", "code": None, "name": "TIMEOUT",
                      "message": "no answer after 600s while testing GPU0 -> GPU4"}
    checks = by_name(preflight.check_cuda_probe(probe, 8))
    assert checks["cuda-init"].status == "pass"
    assert_actionable(checks["cuda-probe"])
    assert "NCCL_P2P_DISABLE=1" in checks["cuda-probe"].fix


# ----------------------------------------------------------------------------- P2P


def topo8():
    return nvsmi.parse_topo_matrix(raw("synth_topo_m_8x"))


def test_p2p_all_good():
    ok = nvsmi.parse_p2p_matrix(raw("synth_topo_p2p_r_8x_OK"))
    checks, env = preflight.check_p2p(topo8(), ok, ok, pairs(), "require", 10)
    c = by_name(checks)
    assert env == {}
    assert [c[n].status for n in ("topology", "p2p-support", "p2p-data", "p2p-bandwidth")] == ["pass"] * 4
    assert "NODE x12" in c["topology"].message
    matrix = c["p2p-matrix"].details["matrix"]
    assert matrix.splitlines()[1].split()[:4] == ["GPU0", "X", "40.0", "ok"]
    assert max(len(line) for line in matrix.splitlines()) <= 80


def test_p2p_gns_real_sample_require_fails_adapt_warns():
    topo = nvsmi.parse_topo_matrix(raw("01_"))
    read = nvsmi.parse_p2p_matrix(raw("02_"))
    checks, env = preflight.check_p2p(topo, read, None, None, "require", None)
    c = by_name(checks)["p2p-support"]
    assert_actionable(c)
    assert env == {}
    assert "GPU0->GPU1 (read GNS)" in c.found
    assert "adapt" in c.fix
    checks, env = preflight.check_p2p(topo, read, None, None, "adapt", None)
    c = by_name(checks)["p2p-support"]
    assert c.status == "warn" and "NCCL_P2P_DISABLE=1" in c.message
    assert env == {"NCCL_P2P_DISABLE": "1"}
    assert by_name(checks)["p2p-data"].status == "skipped"


def test_p2p_cuda_says_no_peer_access():
    no = {(s, d): {"can_access": False} for s in range(8) for d in range(8) if (s < 4) != (d < 4)}
    ok = nvsmi.parse_p2p_matrix(raw("synth_topo_p2p_r_8x_OK"))
    checks, env = preflight.check_p2p(topo8(), ok, ok, pairs(override=no), "adapt", 10)
    c = by_name(checks)
    assert c["p2p-support"].status == "warn" and env == {"NCCL_P2P_DISABLE": "1"}
    assert c["p2p-support"].details["pairs"][0] == [0, 4]
    # nvidia-smi said OK where CUDA says no: reported
    assert c["p2p-consistency"].status == "warn"
    assert c["p2p-data"].status == "pass"
    assert "host" in c["p2p-matrix"].details["matrix"] or "OK" in c["p2p-matrix"].details["matrix"]


def test_p2p_enable_peer_access_error_counts_as_unsupported():
    err = {(0, 1): {"error": "cuCtxEnablePeerAccess: CUDA_ERROR_PEER_ACCESS_UNSUPPORTED (217)"}}
    checks, _ = preflight.check_p2p(None, None, None, pairs(2, err), "require", None)
    c = by_name(checks)
    assert c["p2p-support"].status == "fail"
    assert "enabling peer access failed" in c["p2p-support"].found
    assert c["p2p-data"].status == "pass"  # the copy itself verified
    assert c["topology"].status == "skipped"


@pytest.mark.parametrize("policy", ["require", "adapt"])
def test_p2p_corruption_always_fails(policy):
    bad = {(0, 5): {"verified": False}, (3, 4): {"verified": False}}
    ok = nvsmi.parse_p2p_matrix(raw("synth_topo_p2p_r_8x_OK"))
    checks, env = preflight.check_p2p(topo8(), ok, ok, pairs(override=bad), policy, 10)
    c = by_name(checks)["p2p-data"]
    assert_actionable(c)
    assert "silent corruption" in c.message
    assert "GPU0->GPU5" in c.found and "GPU3->GPU4" in c.found
    assert c.details["corrupt"] == [[0, 5], [3, 4]]
    assert "BAD" in by_name(checks)["p2p-matrix"].details["matrix"]


def test_p2p_copy_errors_and_untested_pairs_fail():
    p = pairs(3, {(0, 1): {"verified": None, "gbps": None,
                          "error": "cuMemcpyPeer: CUDA_ERROR_ILLEGAL_ADDRESS (700)"}})
    p = [e for e in p if (e["src"], e["dst"]) != (2, 1)]
    c = by_name(preflight.check_p2p(None, None, None, p, "adapt", None)[0])["p2p-data"]
    assert_actionable(c)
    assert "copy failed: GPU0->GPU1 (cuMemcpyPeer" in c.found
    assert "not tested (probe stopped): GPU2->GPU1" in c.found


def test_p2p_slow_pairs_named():
    slow = {(1, 2): {"gbps": 6.6}, (2, 1): {"gbps": 6.34, "can_access": False}}
    checks, _ = preflight.check_p2p(topo8(), None, None, pairs(override=slow), "adapt", 20)
    c = by_name(checks)["p2p-bandwidth"]
    assert_actionable(c)
    assert c.found == "GPU1->GPU2 (6.6 GB/s), GPU2->GPU1 (6.3 GB/s, via host)"
    assert c.details["min"] == 6.34
    # no minimum: informational pass
    c = by_name(preflight.check_p2p(topo8(), None, None, pairs(override=slow), "adapt", None)[0])["p2p-bandwidth"]
    assert c.status == "pass" and "min 6.3" in c.message


def test_p2p_single_gpu_has_no_pair_to_test_and_nothing_skips():
    topo = nvsmi.parse_topo_matrix(raw("37_"))
    checks, env = preflight.check_p2p(topo, None, None, None, "require", 10)
    for name in ("p2p-support", "p2p-data", "p2p-bandwidth"):
        assert by_name(checks)[name].status == "pass", name
        assert by_name(checks)[name].message == "one GPU: no pair to test"
    assert env == {}
    checks, env = preflight.check_p2p(None, None, None, None, "require", 10, expected_count=1)
    assert by_name(checks)["p2p-data"].message == "one GPU: no pair to test"
    checks, env = preflight.check_p2p(None, None, None, None, "require", 10, expected_count=8)
    assert {c.status for c in checks} == {"skipped"}
    assert by_name(checks)["p2p-data"].message == "no P2P information (topo -m/-p2p or CUDA probe)"


def test_p2p_policy_is_validated():
    with pytest.raises(ValueError):
        preflight.check_p2p(None, None, None, None, "maybe", None)  # type: ignore[arg-type]


def render_p2p_matrix(n, p2p_read, probe_p2p, min_gbps=None):
    cells = preflight.p2p_cells(n, p2p_read, probe_p2p, min_gbps)
    return preflight.plain_matrix(cells, n, min_gbps)


def test_render_matrix_cells():
    text = render_p2p_matrix(
        2, {(0, 1): "GNS", (1, 0): "GNS"},
        [{"src": 0, "dst": 1, "can_access": False, "verified": True, "gbps": 12.345, "error": None},
         {"src": 1, "dst": 0, "can_access": False, "verified": None, "gbps": None, "error": "x"}])
    lines = text.splitlines()
    assert lines[0].split() == ["GPU0", "GPU1"]
    assert lines[1].split() == ["GPU0", "X", "12.3", "hst"]
    assert lines[2].split() == ["GPU1", "-", "ERR", "X"]
    assert render_p2p_matrix(2, None, [{"src": 0, "dst": 1, "can_access": True,
                                        "verified": False, "gbps": 1, "error": None}]
                             ).splitlines()[1].split()[2:] == ["1.0", "BAD"]


def _entry(src, dst, **kw):
    return {"src": src, "dst": dst, "can_access": True, "verified": True, "gbps": 40.0,
            "error": None, **kw}


@pytest.mark.parametrize("entry,code,verdict", [
    (_entry(0, 1), None, "ok"),
    (_entry(0, 1), "OK", "ok"),
    (_entry(0, 1, gbps=6.5), None, "low"),
    (_entry(0, 1, verified=False), None, "BAD"),
    (_entry(0, 1, verified=False, can_access=False), None, "BAD"),
    (_entry(0, 1, verified=None, gbps=None, error="cuMemcpyPeer"), None, "ERR"),
    (_entry(0, 1, can_access=False), None, "hst"),
    (_entry(0, 1, can_access=False, gbps=3.0), None, "hst"),
    (_entry(0, 1), "CNS", "CNS"),  # nvidia-smi disputes a good copy: shown
    (None, "OK", "OK"),  # the claim only, no copy
    (None, None, "--"),
])
def test_p2p_cell_verdicts(entry, code, verdict):
    cells = preflight.p2p_cells(2, {(0, 1): code} if code else None, [entry] if entry else [], 10)
    assert (cells[1]["src"], cells[1]["dst"], cells[1]["verdict"]) == (0, 1, verdict)
    assert cells[0]["verdict"] == cells[3]["verdict"] == "self" and cells[2]["verdict"] == "--"


def test_p2p_cells_heat_and_figures():
    probe = [_entry(0, 1, gbps=50.0), _entry(1, 0, gbps=25.0)]
    cells = preflight.p2p_cells(2, None, probe, 10)
    assert [(c["gbps"], c["heat"]) for c in cells] == [(None, None), (50.0, 1.0), (25.0, 0.5),
                                                       (None, None)]


@pytest.mark.parametrize("n,cell_text", [(8, "45.0 ok"), (16, "45")])
def test_p2p_matrix_fits_80_columns(n, cell_text):
    probe = [_entry(i, j, gbps=45.0) for i in range(n) for j in range(n) if i != j]
    text = render_p2p_matrix(n, None, probe, 10)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert len(lines) == n + 1 + 4  # header, rows, legend
    assert lines[n].startswith(f"GPU{n - 1}") and cell_text in lines[n]


def test_rich_matrix_colours_by_verdict():
    from rich.console import Console

    probe = [_entry(0, 1, verified=False), _entry(1, 0)]
    cells = preflight.p2p_cells(2, None, probe, 10)
    text = preflight.rich_matrix(cells, 2, 10)
    assert [line.rstrip() for line in text.plain.splitlines()] == \
        render_p2p_matrix(2, None, probe, 10).splitlines()
    styles = {text.plain[s.start:s.end]: str(s.style) for s in text.spans}
    assert "red" in styles["40.0 BAD"] and "green" in styles["40.0 ok "]
    out = Console(force_terminal=True, color_system="256", width=80, record=True)
    out.print(text)
    assert "\x1b[" in out.export_text(styles=True)


# ----------------------------------------------------------------------------- evaluate


def snapshot(**override):
    snap = {
        "query-gpu.csv": {"out": raw("synth_query_8x"), "rc": 0},
        "topo-m.txt": {"out": raw("synth_topo_m_8x"), "rc": 0},
        "topo-p2p-r.txt": {"out": raw("synth_topo_p2p_r_8x_OK"), "rc": 0},
        "topo-p2p-w.txt": {"out": raw("synth_topo_p2p_r_8x_OK"), "rc": 0},
        "dev-nvidia.txt": {"out": raw("synth_dev_nvidia_8x"), "rc": 0},
    }
    snap.update(override)
    return {k: v for k, v in snap.items() if v is not None}


EXPECT = Expectations(count=8, model=NAME, min_driver="580.0", p2p_policy="require", min_gbps=10)


def test_evaluate_healthy():
    facts: dict = {}
    checks, env, matrix = preflight.evaluate(snapshot(), probe_ok(p2p=pairs()), EXPECT, facts)
    assert preflight.summarise(checks) == "pass", [c for c in checks if c.status != "pass"]
    assert env == {} and matrix and matrix.count("\n") == 12  # header, 8 rows, 4 legend lines
    assert len(facts["gpus"]) == 8 and facts["topology"]["links"] == {"NODE": 12, "SYS": 16}
    assert facts["cuda_probe"]["device_count"] == 8
    assert by_name(checks)["dev-cgroup"].status == "skipped"  # no open test in the snapshot


def test_evaluate_driver_mismatch_everywhere():
    text = "Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 580.95\n"
    bad = {"out": text, "rc": 18}
    snap = snapshot(**{"query-gpu.csv": bad, "topo-m.txt": bad, "topo-p2p-r.txt": bad,
                       "topo-p2p-w.txt": bad})
    probe = probe_err("cuInit", 803, "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH", "x")
    checks, env, matrix = preflight.evaluate(snap, probe, EXPECT)
    c = by_name(checks)
    assert c["nvidia-smi"].details["kind"] == "driver-library-mismatch"
    assert c["cuda-init"].status == "fail" and "803" in c["cuda-init"].message
    assert c["topology"].status == "skipped" and c["topo-p2p-r"].status == "skipped"
    assert matrix is None and env == {}


def test_evaluate_plain_text_snapshot_and_missing_parts():
    checks, _, _ = preflight.evaluate({"query-gpu.csv": raw("synth_query_8x")}, None, EXPECT)
    c = by_name(checks)
    assert c["gpu-count"].status == "pass"
    assert c["dev-nvidia-uvm"].status == "skipped" and c["cuda-init"].status == "skipped"
    assert preflight.summarise(checks) == "pass"


def test_evaluate_adapt_returns_nccl_env():
    cns = {"out": raw("synth_topo_p2p_r_8x_CNS"), "rc": 0}
    exp = Expectations(count=8, p2p_policy="adapt")
    checks, env, _ = preflight.evaluate(snapshot(**{"topo-p2p-r.txt": cns, "topo-p2p-w.txt": cns}),
                                        probe_ok(p2p=pairs()), exp)
    assert env == {"NCCL_P2P_DISABLE": "1"}
    assert preflight.summarise(checks) == "warn"


def test_evaluate_table_fallback_when_no_query():
    snap = {"nvidia-smi.txt": {"out": raw("synth_nvidia_smi_table_8x"), "rc": 0}}
    checks = by_name(preflight.evaluate(snap, None, EXPECT)[0])
    assert checks["gpu-count"].status == "pass"
    assert checks["gpu-model"].status == "skipped"  # names are cut to "..." in the table
    assert checks["driver-version"].status == "pass"


# ----------------------------------------------------------------------------- model


def test_check_model():
    path = "/srv/models/glm"
    good = {"path": path, "exists": True, "config": True, "index": True,
            "shards": {"a.safetensors": {"exists": True, "size": 2**30, "expected_size": 2**30}}}
    assert preflight.check_model(ModelState.from_json(good), path)[0].status == "pass"
    absent = ModelState.from_json({"path": path, "exists": False})
    missing = preflight.check_model(absent, path)[0]
    assert_actionable(missing)
    assert preflight.check_model(absent, path, download=True)[0].status == "warn"
    assert preflight.check_model(None, path)[0].found == "absent"  # no read at all
    broken = dict(good, shards={"a.safetensors": {"exists": True, "size": 10, "expected_size": 2**30},
                                "b.safetensors": {"exists": False}})
    c = preflight.check_model(ModelState.from_json(broken), path)[0]
    assert_actionable(c)
    assert "1 shards missing (b.safetensors)" in c.found and "1 shards truncated" in c.found


# --------------------------------------------------------------------- open test (dev-open.txt)
ALL_NODES = [f"/dev/nvidia{i}" for i in range(8)] + [
    "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]


def open_text(status: dict[str, str], default: str = "ENXIO No such device or address") -> str:
    return "".join(f"{p} {status.get(p, default)}\n" for p in ALL_NODES)


def test_open_enxio_means_the_cgroup_permits_it():
    """Nodes without a driver instance answer ENXIO: the cgroup let the open through."""
    opened = preflight.parse_open_results(open_text({}))
    c = by_name(preflight.check_device_nodes(raw("synth_dev_nvidia_8x"), 8, opened))["dev-cgroup"]
    assert c.status == "pass" and "permits all 11 nodes" in c.message
    assert len(c.details["no_device"]) == 11
    ok = preflight.check_open_results({p: None for p in ALL_NODES})
    assert ok.status == "pass" and "open read-write" in ok.message


def test_open_eperm_everywhere_is_the_cgroup_with_both_real_majors():
    opened = preflight.parse_open_results(open_text({}, "EPERM Operation not permitted"))
    checks = by_name(preflight.check_device_nodes(raw("synth_dev_nvidia_8x"), 8, opened))
    c = checks["dev-cgroup"]
    assert_actionable(c)
    assert "device cgroup denies" in c.message and "EPERM" in c.message
    assert "lxc.cgroup2.devices.allow: c 195:* rwm" in c.fix
    assert "lxc.cgroup2.devices.allow: c 508:* rwm" in c.fix  # the uvm major of the listing
    assert "<uvm-major>" not in c.fix
    assert checks["dev-nvidia-gpus"].status == "pass"  # the nodes are there: only denied


def test_open_eperm_on_ctl_only_still_names_the_uvm_major():
    c = preflight.check_open_results(
        {"/dev/nvidiactl": "EPERM Operation not permitted", "/dev/nvidia0": None},
        preflight.parse_dev_listing(raw("synth_dev_nvidia_8x")))
    assert c.status == "fail" and c.details["denied"] == ["/dev/nvidiactl"]
    assert "c 195:* rwm" in c.fix and "c 508:* rwm" in c.fix


def test_open_enoent_and_eacces_and_others():
    gone = preflight.check_open_results({"/dev/nvidia3": "ENOENT No such file or directory"})
    assert_actionable(gone)
    assert "lxc.mount.entry: /dev/nvidia3 dev/nvidia3" in gone.fix
    acc = preflight.check_open_results({"/dev/nvidia0": "EACCES Permission denied"})
    assert_actionable(acc)
    assert "crw-rw-rw-" in acc.fix and "lxc.cgroup2.devices.allow: c 195:* rwm" in acc.fix
    # a per-minor LXC config that allows what CUDA needs but not uvm-tools / extra GPUs: warn
    optional = preflight.check_open_results(
        {"/dev/nvidia0": None, "/dev/nvidiactl": None, "/dev/nvidia-uvm": None,
         "/dev/nvidia-uvm-tools": "EPERM Operation not permitted",
         "/dev/nvidia5": "EPERM Operation not permitted"}, expected_count=4)
    assert optional.status == "warn" and "c 195:* rwm" in optional.fix
    assert preflight.check_open_results(
        {"/dev/nvidia3": "EPERM Operation not permitted"}, expected_count=4).status == "fail"
    busy = preflight.check_open_results({"/dev/nvidia0": "EBUSY Device or resource busy"})
    assert busy.status == "warn"
    assert [preflight.classify_open(e) for e in (None, "EPERM x", "1", "EACCES x", "ENOENT x",
                                                 "ENXIO x", "ENODEV x", "EIO x")] == [
        "ok", "denied", "denied", "access", "missing", "no-device", "no-device", "other"]


def test_evaluate_with_the_open_test_of_a_denied_container():
    snap = snapshot(**{"dev-open.txt": {"out": open_text({}, "EPERM Operation not permitted"),
                                        "rc": 0}})
    checks, _, _ = preflight.evaluate(snap, probe_ok(p2p=pairs()), EXPECT)
    assert by_name(checks)["dev-cgroup"].status == "fail"
    # what the real tools say then: NVML 'Unknown Error', cuInit 999 -> blamed on the cgroup
    nvml = {"out": "Failed to initialize NVML: Unknown Error\n", "rc": 255}
    snap = snapshot(**{"dev-open.txt": snap["dev-open.txt"], "query-gpu.csv": nvml,
                       "topo-m.txt": nvml, "topo-p2p-r.txt": nvml, "topo-p2p-w.txt": nvml})
    checks = by_name(preflight.evaluate(
        snap, probe_err("cuInit", 999, "CUDA_ERROR_UNKNOWN", "unknown error"), EXPECT)[0])
    for name in ("nvidia-smi", "cuda-init", "dev-cgroup"):
        assert checks[name].status == "fail"
        assert "device cgroup denies" in checks[name].message
        assert "lxc.cgroup2.devices.allow: c 508:* rwm" in checks[name].fix
    healthy = snapshot(**{"dev-open.txt": {"out": open_text({}), "rc": 0}})
    checks, _, _ = preflight.evaluate(healthy, probe_ok(p2p=pairs()), EXPECT)
    assert preflight.summarise(checks) == "pass"


def test_the_open_script_reports_the_errno_of_a_real_node(tmp_path):
    """A real character node 195:0 without the NVIDIA driver loaded: ENXIO (cgroup permits)."""
    import os

    from sglang_deploy.remote.hoststate import open_test

    node = tmp_path / "nvidia0"
    os.mknod(node, 0o666 | 0o020000, os.makedev(195, 0))
    text = open_test([str(node), "/dev/null", str(tmp_path / "absent"), str(tmp_path)])
    assert text == f"{node} ENXIO No such device or address\n/dev/null ok\n"
    assert preflight.classify_open(preflight.parse_open_results(text)[str(node)]) == "no-device"


# --- P2P verdict reused while the service serves -------------------------------------------

def test_p2p_record_only_from_a_passed_full_test():
    from sglang_deploy.core.preflight import Check, p2p_record

    passed = [Check("p2p-data", "pass", ""), Check("p2p-bandwidth", "pass", ""),
              Check("p2p-matrix", "pass", "", details={"gpus": 8})]
    assert p2p_record(passed, {"NCCL_P2P_DISABLE": "1"}, "adapt") == {
        "gpus": 8, "policy": "adapt", "nccl_env": {"NCCL_P2P_DISABLE": "1"},
        "verified": ["p2p-data", "p2p-bandwidth"]}
    assert p2p_record(passed[:1] + [Check("p2p-bandwidth", "skipped", "")], {}, "require") is None
    assert p2p_record([Check("p2p-data", "fail", ""), passed[1]], {}, "require") is None


def test_one_gpu_leaves_a_record_of_one_gpu():
    from sglang_deploy.core.preflight import p2p_record

    topo = nvsmi.parse_topo_matrix(raw("37_"))
    checks, env = preflight.check_p2p(topo, None, None, None, "require", 10)
    assert p2p_record(checks, env, "require") == {
        "gpus": 1, "policy": "require", "nccl_env": {}, "verified": ["p2p-data", "p2p-bandwidth"]}


def test_use_p2p_record_keeps_the_recorded_nccl_env_and_replaces_copy_checks():
    from sglang_deploy.core.preflight import Check, use_p2p_record

    checks = [Check("driver", "pass", ""), Check("p2p-data", "skipped", "no copies"),
              Check("p2p-bandwidth", "skipped", "no copies")]
    record = P2PVerified.from_json({"gpus": 8, "policy": "adapt",
                                    "nccl_env": {"NCCL_P2P_DISABLE": "1"}})
    out, env = use_p2p_record(checks, {}, record, "sglang")
    assert [c.name for c in out] == ["driver", "p2p-data"]
    assert out[-1].status == "pass" and "skipped while sglang serves" in out[-1].message
    assert env == {"NCCL_P2P_DISABLE": "1"}


def test_a_p2p_off_verdict_of_another_policy_does_not_stand():
    """An `adapt` record that turned P2P off does not stand under `require`: the unit is
    planned without its env (a restart, with the P2P retest first), and the check says so."""
    from sglang_deploy.core.preflight import Check, use_p2p_record

    checks = [Check("p2p-data", "skipped", "no copies"), Check("p2p-bandwidth", "skipped", "")]
    off = P2PVerified.from_json({"gpus": 8, "policy": "adapt",
                                 "nccl_env": {"NCCL_P2P_DISABLE": "1"}})
    out, env = use_p2p_record(checks, {}, off, "sglang", "require")
    assert env == {} and out[-1].name == "p2p-data" and out[-1].status == "warn"
    assert "passed only with NCCL_P2P_DISABLE=1 (policy adapt)" in out[-1].message
    assert "retested" in out[-1].message and "gpu_p2p_policy: adapt" in out[-1].fix
    # the same policy, or a verdict with P2P on under another policy, stands as before
    assert use_p2p_record(checks, {}, off, "sglang", "adapt")[1] == {"NCCL_P2P_DISABLE": "1"}
    on = P2PVerified.from_json({"gpus": 8, "policy": "adapt", "nccl_env": {}})
    kept, env = use_p2p_record(checks, {}, on, "sglang", "require")
    assert env == {} and kept[-1].status == "pass"


def test_host_snapshot_fact_runs_every_part_and_keeps_each_output(tmp_path):
    """The pre-flight's one round trip (host state with the open test, nvidia-smi, device
    nodes), run for real with sh here: every section is there, in order, even the parts that
    are multi-line (a here-document, a quoted script) or fail (no nvidia-smi here)."""
    import subprocess

    from sglang_deploy.hostops.facts import GPU_SECTIONS, HostSnapshot

    cmd = HostSnapshot().command(root=str(tmp_path), service="sglang-test-absent",
                                 python="python3", paths=(str(tmp_path),))
    out = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, timeout=120).stdout
    markers = [line for line in out.splitlines() if line.startswith("@@sglang-deploy:")
               and not line.startswith("@@sglang-deploy:rc=")]
    assert markers == [f"@@sglang-deploy:{n}" for n in ("hoststate.json", *GPU_SECTIONS)]
    snap = HostSnapshot().process(out.splitlines())
    assert snap.state.paths[str(tmp_path)].kind == "dir"
    assert dict(snap.state.releases.installed) == {}
    assert "dev_open" not in snap.state.raw  # moved to its section
    assert "cuda_probe" not in cmd  # the probe is its own round trip (preflight.probe_plan)
    assert snap.output.startswith("{")
    assert set(snap.gpu) == {*GPU_SECTIONS, "dev-open.txt"}
    # the open test ran in the host-state process: one line per /dev/nvidia* node this machine
    # has (none on a plain machine; the LXC testbed's stand-in nodes while it is up)
    opened = snap.gpu["dev-open.txt"]
    assert opened["rc"] == 0
    import glob
    assert sorted(line.split()[0] for line in opened["out"].splitlines()) == sorted(
        p for p in glob.glob("/dev/nvidia*") if not Path(p).is_dir())
    assert (snap.gpu["dev-nvidia.txt"]["rc"] == 0) == bool(glob.glob("/dev/nvidia*"))  # `ls -l`


def test_host_snapshot_without_its_python_keeps_the_other_sections_and_says_why(tmp_path):
    import subprocess

    from sglang_deploy.hostops.facts import GPU_SECTIONS, HostSnapshot

    cmd = HostSnapshot().command(root=str(tmp_path), service="sglang-test-absent",
                                 python=str(tmp_path / "no-python3"))
    out = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, timeout=120).stdout
    snap = HostSnapshot().process(out.splitlines())
    assert snap.state is None and "no-python3" in snap.output
    assert set(snap.gpu) == set(GPU_SECTIONS)


def test_sections_keep_output_without_a_final_newline_apart_from_the_marker():
    import subprocess

    from sglang_deploy.hostops.facts import _parse_sections, _sections_command

    cmd = _sections_command({"a": "printf 'no newline'", "b": "cat <<'EOF'\none\ntwo\nEOF",
                             "c": "exit 3", "d": "printf 'x\\n\\n'; echo err >&2; false",
                             "e": "echo '@@sglang-deploy:rc=9 is text here'"})
    out = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, timeout=30).stdout
    assert _parse_sections(out.splitlines()) == {
        "a": {"out": "no newline\n", "rc": 0}, "b": {"out": "one\ntwo\n", "rc": 0},
        "c": {"out": "", "rc": 3}, "d": {"out": "x\n\nerr\n", "rc": 1},
        "e": {"out": "@@sglang-deploy:rc=9 is text here\n", "rc": 0}}


# ------------------------------------------------------------------ which CUDA probe runs
SERVING = {"ActiveState": "active", "SubState": "running", "InvocationID": "abc123"}
RECORD = {"gpus": 8, "policy": "require", "nccl_env": {}, "verified": ["p2p-data", "p2p-bandwidth"]}


@pytest.mark.parametrize("service, last_verified, record, p2p_test, want", [
    # serving the invocation a deploy verified, P2P verdict on record: no probe at all
    (SERVING, {"invocation": "abc123"}, RECORD, "auto", "none"),
    # serving, never verified by a deploy (started at boot, a half-done deploy): init + devices
    (SERVING, {"invocation": "older"}, RECORD, "auto", "basic"),
    (SERVING, None, RECORD, "auto", "basic"),
    ({**SERVING, "InvocationID": ""}, {"invocation": ""}, RECORD, "auto", "basic"),
    # a unit waiting to restart after a crash: a server comes back on the GPUs; the copies
    # wait for the retest once it is stopped (``restart.Decision.retest``)
    ({**SERVING, "SubState": "auto-restart", "ActiveState": "activating"}, {"invocation": "abc123"},
     RECORD, "auto", "basic"),
    # no P2P verdict yet, not up, or asked to copy every time: the full test
    (SERVING, {"invocation": "abc123"}, None, "auto", "p2p"),
    ({"ActiveState": "inactive", "SubState": "dead"}, None, None, "auto", "p2p"),
    (SERVING, {"invocation": "abc123"}, RECORD, "always", "p2p"),
])
def test_probe_plan(service, last_verified, record, p2p_test, want):
    assert preflight.probe_plan(ServiceState.from_json(service),
                                LastVerified.from_json(last_verified),
                                P2PVerified.from_json(record), p2p_test) == want


def test_a_verified_server_stands_for_the_probe_checks():
    checks = [preflight.Check("gpu-count", "pass", "8 GPUs"),
              *preflight.check_cuda_probe(None, 8)]  # what evaluate gives without a probe
    assert {c.name: c.status for c in checks}["cuda-init"] == "skipped"
    verified = LastVerified.from_json({"invocation": "abc123def4567890",
                                       "verified_at": "2026-12-03T04:01:58+00:00"})
    got = preflight.use_verified_server(checks, "sglang", verified)
    by_name = {c.name: c for c in got}
    assert set(by_name) == {"gpu-count", "cuda-init"}
    assert by_name["cuda-init"].status == "pass"
    msg = by_name["cuda-init"].message
    assert "abc123def456" in msg and "2026-12-03T04:01:58" in msg and "before any restart" in msg


def test_an_empty_gpu_list_fails_the_count_and_skips_the_driver():
    """nvidia-smi answered with no row (exit 0): no crash, the count check says why."""
    for min_driver in (None, "580.0"):
        checks = by_name(preflight.check_smi([], None, None, min_driver))
        assert checks["gpu-count"].status == "fail" and checks["gpu-count"].fix
        assert checks["driver-version"].status == "skipped"
