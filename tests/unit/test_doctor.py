"""`sglang-deploy doctor`: --from folders built from real samples, the CLI, and live mode
against the testbed's nvidia-smi and libcuda stand-ins."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import pytest

from sglang_deploy.commands import cli, doctor
from sglang_deploy.core import nvsmi
from sglang_deploy.commands.doctor import Expectations

REPO = Path(__file__).resolve().parents[2]
CASES = REPO / "tests" / "fixtures" / "doctor"
NAME = "NVIDIA RTX PRO 6000 Blackwell Server Edition"
EXPECT = Expectations(count=8, model=NAME, min_driver="580.0", p2p_policy="require", min_gbps=20)


def checks_of(report: dict) -> dict[str, dict]:
    return {c["name"]: c for c in report["checks"]}


def from_case(case: str, **kw) -> dict:
    exp = Expectations(**{**EXPECT.__dict__, **kw})
    report = doctor.run_doctor(from_dir=CASES / case, expectations=exp)
    assert report["mode"] == "from"
    return report


def test_every_case_folder_is_documented():
    cases = [p for p in CASES.iterdir() if p.is_dir()]
    assert len(cases) >= 10
    for case in cases:
        assert (case / "README.md").is_file(), case


# ----------------------------------------------------------------------------- --from


def test_healthy_8x_passes():
    report = from_case("healthy-8x")
    assert report["status"] == "pass", [c for c in report["checks"] if c["status"] != "pass"]
    checks = checks_of(report)
    assert checks["gpu-count"]["message"].startswith("8 GPUs")
    assert checks["dev-cgroup"]["status"] == "pass"
    assert report["nccl_env"] == {}
    assert report["p2p_matrix"].splitlines()[0].split()[:2] == ["GPU0", "GPU1"]
    assert report["facts"]["driver_version"] == "580.95.05"
    assert report["facts"]["cuda_version"] == "13.0"
    assert len(report["facts"]["gpus"]) == 8


def test_query_only_counts_8_and_skips_the_rest():
    report = from_case("query-only-8x")
    checks = checks_of(report)
    assert checks["gpu-count"]["status"] == "pass"
    assert checks["gpu-model"]["status"] == "pass"
    for name in ("dev-nvidia-uvm", "cuda-init", "cuda-devices", "topology", "p2p-support",
                 "p2p-data"):
        assert checks[name]["status"] == "skipped", name
    assert report["status"] == "pass"


def test_lxc_driver_mismatch_real_sample():
    report = from_case("lxc-driver-mismatch")
    assert report["status"] == "fail"
    c = checks_of(report)["nvidia-smi"]
    assert c["status"] == "fail"
    assert c["details"]["kind"] == "driver-library-mismatch"
    assert "different version than the kernel module" in c["message"]
    assert "Driver/library version mismatch" in c["found"]
    assert "--no-kernel-module" in c["fix"] and "/proc/driver/nvidia/version" in c["fix"]


def test_lxc_no_driver_real_sample():
    report = from_case("lxc-no-driver")
    c = checks_of(report)["nvidia-smi"]
    assert c["details"]["kind"] == "no-driver" and c["found"].startswith("exit code 9")
    assert "lxc.mount.entry: /dev/nvidiactl dev/nvidiactl" in c["fix"]
    assert checks_of(report)["topology"]["status"] == "skipped"


def test_uvm_missing():
    report = from_case("uvm-missing")
    checks = checks_of(report)
    assert report["status"] == "fail"
    assert checks["gpu-count"]["status"] == "pass"  # nvidia-smi works without uvm
    assert checks["dev-nvidia-uvm"]["status"] == "fail"
    assert "nvidia-modprobe -u -c=0" in checks["dev-nvidia-uvm"]["fix"]
    init = checks["cuda-init"]
    assert init["status"] == "fail" and init["details"]["error"]["code"] == 999
    assert "/dev/nvidia-uvm is missing in the container" in init["message"]


def test_uvm_placeholder_file():
    checks = checks_of(from_case("uvm-placeholder"))
    assert "empty regular file" in checks["dev-nvidia-uvm"]["message"]
    assert "empty regular file" in checks["cuda-init"]["message"]


def test_gpu_missing_7x():
    checks = checks_of(from_case("gpu-missing-7x"))
    assert checks["gpu-count"]["status"] == "fail"
    assert checks["gpu-count"]["found"] == "7 GPUs (indices 0-6)"
    assert checks["dev-nvidia-gpus"]["details"]["missing"] == [7]
    assert checks["cuda-devices"]["status"] == "fail"
    assert checks["p2p-data"]["status"] == "pass"  # the 7 present GPUs copy fine


def test_cgroup_denied():
    checks = checks_of(from_case("cgroup-denied"))
    assert checks["nvidia-smi"]["details"]["kind"] == "nvml-unknown-error"
    c = checks["dev-cgroup"]
    assert c["status"] == "fail"
    assert "lxc.cgroup2.devices.allow: c 195:* rwm" in c["fix"]
    assert "lxc.cgroup2.devices.allow: c 508:* rwm" in c["fix"]
    assert checks["cuda-init"]["details"]["error"]["code"] == 100


def test_p2p_gns_real_samples_policy():
    report = from_case("p2p-gns-2x", count=2, model=None, min_driver=None)
    assert report["status"] == "fail"
    assert checks_of(report)["p2p-support"]["found"] == "GPU0->GPU1 (read GNS), GPU1->GPU0 (read GNS)"
    report = from_case("p2p-gns-2x", count=2, model=None, min_driver=None, p2p_policy="adapt")
    assert report["status"] == "warn"
    assert report["nccl_env"] == {"NCCL_P2P_DISABLE": "1"}


def test_p2p_cns_across_sockets():
    assert from_case("p2p-cns-8x")["status"] == "fail"
    report = from_case("p2p-cns-8x", p2p_policy="adapt")
    assert report["status"] == "warn" and report["nccl_env"] == {"NCCL_P2P_DISABLE": "1"}
    assert len(checks_of(report)["p2p-support"]["details"]["pairs"]) == 32


@pytest.mark.parametrize("policy", ["require", "adapt"])
def test_p2p_corrupt_fails_in_both_policies(policy):
    report = from_case("p2p-corrupt", p2p_policy=policy)
    c = checks_of(report)["p2p-data"]
    assert report["status"] == "fail" and c["status"] == "fail"
    assert c["details"]["corrupt"] == [[0, 5], [3, 4], [5, 0]]
    assert checks_of(report)["p2p-support"]["status"] == "pass"  # nvidia-smi said OK


def test_p2p_slow():
    c = checks_of(from_case("p2p-slow"))["p2p-bandwidth"]
    assert c["status"] == "fail" and c["details"]["slow"] == [[1, 2], [2, 1]]
    assert checks_of(from_case("p2p-slow", min_gbps=5))["p2p-bandwidth"]["status"] == "pass"


def test_missing_files_are_skipped(tmp_path):
    report = doctor.run_doctor(from_dir=tmp_path, expectations=EXPECT)
    assert {c["status"] for c in report["checks"]} == {"skipped"}
    assert report["status"] == "skipped"


def test_the_python_and_glibc_checks_come_first(tmp_path):
    """The deploy's first two pre-flight rows, from the folder's host-platform.json (the
    system python's `hoststate.py platform`), against the default lock's target."""
    for name in os.listdir(CASES / "healthy-8x"):
        (tmp_path / name).write_bytes((CASES / "healthy-8x" / name).read_bytes())
    (tmp_path / "host-platform.json").write_text('{"python": "3.12", "glibc": "2.31"}\n')
    report = doctor.run_doctor(from_dir=tmp_path, expectations=EXPECT)
    assert [c["name"] for c in report["checks"][:2]] == ["host-python", "host-glibc"]
    python, glibc = report["checks"][:2]
    assert python["status"] == "fail" and python["found"] == "Python 3.12"
    assert "sglang_system_python" in python["fix"]
    assert glibc["status"] == "fail" and glibc["found"] == "glibc 2.31"
    assert "glibc >= 2.34" in glibc["expected"]
    assert report["status"] == "fail"
    (tmp_path / "host-platform.json").write_text('{"python": "3.11", "glibc": "2.36"}\n')
    assert doctor.run_doctor(from_dir=tmp_path, expectations=EXPECT)["status"] == "pass"
    (tmp_path / "host-platform.json").write_text("sh: 1: /usr/bin/python3: not found\n")
    python = checks_of(doctor.run_doctor(from_dir=tmp_path, expectations=EXPECT))["host-python"]
    assert python["status"] == "fail" and "not found" in python["found"]
    # a folder collected before these checks existed: skipped, as any missing file
    checks = checks_of(from_case("healthy-8x"))
    assert checks["host-python"]["status"] == checks["host-glibc"]["status"] == "skipped"


def test_garbled_probe_output(tmp_path):
    (tmp_path / "cuda-probe.json").write_text("Traceback (most recent call last):\nSyntaxError\n")
    checks = checks_of(doctor.run_doctor(from_dir=tmp_path, expectations=EXPECT))
    assert checks["cuda-init"]["status"] == "fail"
    assert "SyntaxError" in checks["cuda-init"]["found"]


# ----------------------------------------------------------------------------- CLI


def test_cli_json_and_exit_codes(capsys):
    rc = cli.main(["doctor", "--from", str(CASES / "healthy-8x"), "--json", "--expected-count", "8",
                      "--expected-model", NAME, "--min-driver", "580.0", "--min-gbps", "20"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["status"] == "pass"
    assert {"name", "status", "message"} <= set(out["checks"][0])
    rc = cli.main(["doctor", "--from", str(CASES / "lxc-driver-mismatch"), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 1 and out["status"] == "fail"
    rc = cli.main(["doctor", "--from", str(CASES / "p2p-gns-2x"), "--json", "--p2p-policy", "adapt",
                      "--expected-count", "2"])
    assert rc == 0 and json.loads(capsys.readouterr().out)["nccl_env"] == {"NCCL_P2P_DISABLE": "1"}


def test_cli_table_output(capsys):
    rc = cli.main(["doctor", "--from", str(CASES / "uvm-missing"), "--expected-count", "8"])
    out = capsys.readouterr().out
    assert rc == 1
    assert "dev-nvidia-uvm" in out and "cuda-init" in out
    assert "lxc.mount.entry: /dev/nvidia-uvm dev/nvidia-uvm none bind,optional,create=file" in out
    assert "overall: fail" in out


def test_cli_errors(tmp_path, capsys):
    assert cli.main(["doctor", "--from", str(tmp_path / "nope")]) == 2
    assert "no such folder" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["doctor", "--from", str(tmp_path), "--collect", str(tmp_path)])


def test_add_parser_registers_doctor():
    parser = argparse.ArgumentParser(prog="sglang-deploy")
    sub = parser.add_subparsers(dest="command")
    doctor.add_parser(sub)
    args = parser.parse_args(["doctor", "--from", "x", "--p2p-policy", "adapt", "--min-gbps", "5"])
    assert args.command == "doctor" and args.from_dir == "x" and args.min_gbps == 5.0
    assert args.func is doctor.run


# ----------------------------------------------------------------------------- live mode


@pytest.fixture(scope="module")
def standins(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from testbed.gpu import build
    root = tmp_path_factory.mktemp("standins")
    try:
        build.build_libcuda(root / "lib")
    except (build.BuildError, FileNotFoundError, OSError) as exc:
        raise AssertionError(f"cannot build the libcuda stand-in: {exc}")
    bin_dir = root / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{build.NVIDIA_SMI}" "$@"\n')
    smi.chmod(0o755)
    return root


@pytest.fixture
def fake_host(standins: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from testbed.gpu.build import render_gpu_env

    dev = tmp_path / "dev"
    dev.mkdir()
    for name in [f"nvidia{i}" for i in range(8)] + ["nvidiactl", "nvidia-uvm"]:
        (dev / name).touch()
    env_file = tmp_path / "gpu.env"
    monkeypatch.setenv("PATH", f"{standins / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("LD_LIBRARY_PATH", str(standins / "lib"))
    monkeypatch.setenv("TESTBED_GPU_ENV", str(env_file))
    monkeypatch.setenv("TESTBED_DEV_ROOT", str(dev))

    def configure(**keys: str) -> None:
        env_file.write_text(render_gpu_env(**keys))

    configure()
    return configure


def test_live_collect_then_from_gives_the_same_answer(fake_host, tmp_path):
    out = tmp_path / "collected"
    probe = doctor.ProbeOptions(mib=1, p2p=True, timeout_s=120)
    report = doctor.run_doctor(collect_dir=out, expectations=EXPECT, probe=probe)
    assert report["mode"] == "live"
    for name in ("nvidia-smi.txt", "query-gpu.csv", "topo-m.txt", "topo-p2p-r.txt",
                 "topo-p2p-w.txt", "dev-nvidia.txt", "dev-open.txt", "cuda-probe.json",
                 "host-platform.json", "commands.txt"):
        assert (out / name).is_file(), name
    commands = (out / "commands.txt").read_text().splitlines()
    assert f"query-gpu.csv\t0\t{nvsmi.query_command()}" in commands
    assert not (out / "query-gpu.csv").read_text().startswith("#")  # raw output, no comment
    checks = checks_of(report)
    for name in ("nvidia-smi", "gpu-count", "gpu-model", "driver-version", "cuda-init",
                 "cuda-devices", "topology", "p2p-support", "p2p-data"):
        assert checks[name]["status"] == "pass", checks[name]
    # the device-node checks look at this machine's real /dev (the stand-in's $TESTBED_DEV_ROOT
    # is invisible to production code), so only their presence is asserted
    assert "dev-nvidia-uvm" in checks
    # this machine's /usr/bin/python3 answered (its version decides pass or fail)
    assert set(json.loads((out / "host-platform.json").read_text())) == {"python", "glibc"}
    assert checks["host-python"]["status"] != "skipped" != checks["host-glibc"]["status"]
    again = doctor.run_doctor(from_dir=out, expectations=EXPECT)
    assert [(c["name"], c["status"]) for c in again["checks"]] == [
        (c["name"], c["status"]) for c in report["checks"]]


def test_live_driver_mismatch(fake_host, tmp_path):
    fake_host(SCENARIO="driver-mismatch")
    report = doctor.run_doctor(collect_dir=tmp_path / "c", expectations=EXPECT,
                               probe=doctor.ProbeOptions(mib=1))
    checks = checks_of(report)
    assert checks["nvidia-smi"]["details"]["kind"] == "driver-library-mismatch"
    assert checks["cuda-init"]["details"]["error"]["code"] == 803
    assert report["status"] == "fail"


def test_live_p2p_corrupt_cli(fake_host, tmp_path, capsys):
    fake_host(SCENARIO="p2p-corrupt", GPU_COUNT="2")
    rc = cli.main(["doctor", "--json", "--collect", str(tmp_path / "c"), "--mib", "1",
                      "--p2p-policy", "adapt"])
    report = json.loads(capsys.readouterr().out)
    assert rc == 1
    assert checks_of(report)["p2p-data"]["details"]["corrupt"] == [[0, 1], [1, 0]]


# ------------------------------------------------------------- the deploy's expectations


def test_doctor_expects_what_the_deploy_expects_by_default(capsys):
    """No option: the data keys' defaults, so 7 GPUs of 8 fail as in a deploy."""
    assert cli.main(["doctor", "--from", str(CASES / "healthy-8x"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["expectations"] == {
        "count": 8, "model": NAME, "min_driver": "580.0", "p2p_policy": "require", "min_gbps": 10.0}
    assert cli.main(["doctor", "--from", str(CASES / "gpu-missing-7x"), "--json"]) == 1
    assert checks_of(json.loads(capsys.readouterr().out))["gpu-count"]["status"] == "fail"


def test_a_slow_pair_fails_at_the_deploys_default_minimum(tmp_path, capsys):
    folder = tmp_path / "slow"
    folder.mkdir()
    for f in (CASES / "healthy-8x").iterdir():
        (folder / f.name).write_bytes(f.read_bytes())
    probe = json.loads((folder / "cuda-probe.json").read_text().strip().splitlines()[-1])
    probe["p2p"][0]["gbps"] = 6.5
    (folder / "cuda-probe.json").write_text(json.dumps(probe) + "\n")
    assert cli.main(["doctor", "--from", str(folder), "--json"]) == 1
    bw = checks_of(json.loads(capsys.readouterr().out))["p2p-bandwidth"]
    assert bw["status"] == "fail" and "6.5" in json.dumps(bw)
    assert cli.main(["doctor", "--from", str(folder), "--json", "--min-gbps", "5"]) == 0


def test_the_model_name_is_matched_exactly(capsys):
    assert cli.main(["doctor", "--from", str(CASES / "healthy-8x"), "--json",
                        "--expected-model", "RTX PRO 6000"]) == 1
    assert checks_of(json.loads(capsys.readouterr().out))["gpu-model"]["status"] == "fail"
    assert cli.main(["doctor", "--from", str(CASES / "healthy-8x"), "--json", "--expected-model", ""]) == 0


def test_remote_mode_turns_options_into_data_and_reads_the_plan_records(tmp_path):
    from sglang_deploy.commands import doctor_remote

    given = {o: None for o in doctor.OPTION_KEYS}
    assert doctor.data_overrides({**given, "expected_count": 7, "expected_model": "X Y"},
                                 ["a=1"]) == ["gpu_expected_count=7", 'gpu_expected_model="X Y"', "a=1"]
    from sglang_deploy.core import journal, outcome

    ran = journal.Journal({
        "h1": {"preflight": {
            "host": "h1", "checks": [{"name": "gpu-count", "status": "pass", "message": "8 GPUs"},
                                     {"name": "p2p-bandwidth", "status": "fail", "message": "slow"}],
            "nccl_env": {}, "p2p_matrix": "m"}},
        "h2": {"outcome": outcome.record("h2", "unreachable", "connect", error=outcome.unreachable_error(
            "Could not connect (timed out)"))}})
    report = doctor_remote.host_report("h1", ran)
    assert report["status"] == "fail" and report["p2p_matrix"] == "m"
    missing = doctor_remote.host_report("h2", ran, fallback="pyinfra's words")
    assert missing["status"] == "fail" and missing["error"] == "Could not connect (timed out)"
    none = doctor_remote.host_report("h3", ran, "--> pyinfra error: x")
    assert none["error"].startswith("no outcome record") and none["error"].endswith("pyinfra error: x")


def test_limit_without_inventory_is_a_usage_error(capsys):
    assert cli.main(["doctor", "--limit", "h1"]) == 2
    assert "need an INVENTORY" in capsys.readouterr().err
