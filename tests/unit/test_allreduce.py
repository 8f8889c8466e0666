"""The NCCL all-reduce check: the remote script (its helpers, and its orchestration run
against a fake torch: tests/unit/faketorch), the pure core (argv, parsing, the verdict), the
data keys and the pyinfra shell (with a fake host). No GPU and no NCCL here: what the real
all-reduce measures is not tested (docs/design.md, "The NCCL all-reduce check")."""

from __future__ import annotations

import ast
import json
import os
import queue
import shlex
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import runobj

from sglang_deploy.core import allreduce, data, group, service
from sglang_deploy.core.errors import DataError, PreflightError
from sglang_deploy.remote import allreduce_check as script
from sglang_deploy.stages import allreduce as shell

SCRIPT = Path(script.__file__)
FAKE_TORCH = Path(__file__).resolve().parent / "faketorch"
MIN_DATA = {"sglang_model_path": "/srv/models/m"}


# ---------------------------------------------------------------------------------------
# the remote script: pure helpers


def test_global_ranks_put_node_rank_0_local_0_first_and_nodes_in_blocks():
    assert script.global_rank(0, 8, 0) == 0
    assert script.global_rank(1, 8, 0) == 8
    assert script.global_rank(2, 4, 3) == 11
    assert script.node_ranks(1, 4) == [4, 5, 6, 7]
    every = [r for node in range(3) for r in script.node_ranks(node, 4)]
    assert every == list(range(12))  # each global rank exactly once


@pytest.mark.parametrize(("nbytes", "seconds", "n", "algbw", "busbw"), [
    # nccl-tests (doc/PERFORMANCE.md): algbw = S / t; all-reduce busbw = algbw * 2(n-1)/n
    (1_000_000_000, 1.0, 2, 1.0, 1.0),
    (1_000_000_000, 0.5, 8, 2.0, 3.5),
    (256 * 2**20, 0.0125, 4, 21.474836, 32.212255),
    (1_000_000_000, 1.0, 1, 1.0, 0.0),  # one rank: nothing crosses a link
])
def test_bandwidth_is_nccl_tests_algbw_and_busbw(nbytes, seconds, n, algbw, busbw):
    got = script.bandwidth(nbytes, seconds, n)
    assert got == pytest.approx((algbw, busbw), rel=1e-6)


@pytest.mark.parametrize(("version", "text"), [((2, 27, 3), "2.27.3"), (2708, "2.7.8"),
                                               (21003, "2.10.3"), (None, None)])
def test_nccl_version_text(version, text):
    assert script._version_text(version) == text


def test_single_node_runs_on_loopback_and_a_group_needs_a_port():
    args = script.parse_args(["--gpus", "8", "--addr", "10.0.0.1"])
    assert (args.addr, args.port, args.nnodes, args.node_rank) == ("127.0.0.1", 0, 1, 0)
    args = script.parse_args(["--gpus", "8", "--addr", "10.0.0.1", "--port", "50001",
                              "--nnodes", "2", "--node-rank", "1"])
    assert (args.addr, args.port) == ("10.0.0.1", 50001)
    for bad in (["--gpus", "8", "--nnodes", "2", "--node-rank", "1"],  # no port
                ["--gpus", "8", "--nnodes", "2", "--port", "1", "--node-rank", "2"],
                ["--gpus", "0"], ["--gpus", "8", "--timeout", "0"]):
        with pytest.raises(SystemExit):
            script.parse_args(bad)


def test_script_imports_only_stdlib_at_module_level():
    """torch is imported by the functions that use it: the helpers load anywhere."""
    tree = ast.parse(SCRIPT.read_text())
    top = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            top |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            top.add((node.module or "").split(".")[0])
    assert top - {"__future__"} <= set(sys.stdlib_module_names), top
    inner = {a.name for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names}
    assert {"torch", "torch.distributed", "torch.multiprocessing"} <= inner


class FakeQueue:
    """Messages handed out one per get; an empty queue advances the fake clock."""

    def __init__(self, clock, messages):
        self.clock, self.messages = clock, list(messages)

    def get(self, timeout):
        if self.messages:
            return self.messages.pop(0)
        self.clock.now += timeout
        raise queue.Empty


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def proc(exitcode=None):
    return SimpleNamespace(exitcode=exitcode)


def test_collect_gives_up_on_the_others_soon_after_one_rank_failed():
    clock = Clock()
    msgs = [{"kind": "stage", "local_rank": 0, "stage": "warm-up"},
            {"kind": "stage", "local_rank": 1, "stage": "warm-up"},
            {"kind": "result", "ok": False, **script._failure(1, 1, "warm-up", "X", "boom")}]
    got = script.collect([proc(), proc(1)], FakeQueue(clock, msgs), 2, deadline=100, clock=clock)
    assert got["stuck"] == [0] and got["stages"][0] == "warm-up"
    assert not got["deadline_reached"]
    assert clock.now < 100 and clock.now >= script.FAIL_GRACE_S


def test_collect_counts_a_rank_that_exited_without_a_result_as_failed():
    clock = Clock()
    msgs = [{"kind": "stage", "local_rank": 0, "stage": "init_process_group"},
            {"kind": "result", "ok": True, "local_rank": 1, "rank": 1, "seconds": 0.01}]
    got = script.collect([proc(-9), proc(0)], FakeQueue(clock, msgs), 2, deadline=100,
                         clock=clock)
    failed = got["results"][0]
    assert (failed["error_type"], failed["stage"]) == ("ProcessExited", "init_process_group")
    assert "-9" in failed["error"] and got["stuck"] == []


def test_collect_stops_at_the_deadline():
    clock = Clock()
    msgs = [{"kind": "stage", "local_rank": 0, "stage": "init_process_group"}]
    got = script.collect([proc(), proc()], FakeQueue(clock, msgs), 2, deadline=3, clock=clock)
    assert got["stuck"] == [0, 1] and got["deadline_reached"]
    assert 3 <= clock.now < 3.5


def args_of(*argv):
    return script.parse_args(["--gpus", "2", *argv])


def test_summarise_reports_the_slowest_rank_and_the_real_error_before_the_waits():
    ok = {0: {"ok": True, "rank": 0, "seconds": 0.01}, 1: {"ok": True, "rank": 1, "seconds": 0.02}}
    out = script.summarise(args_of("--mib", "256"), {"results": ok, "stages": {}, "stuck": [],
                                                     "deadline_reached": False}, {}, 1.0)
    assert out["ok"] and out["seconds"] == 0.02
    assert out["busbw_gbps"] == pytest.approx(2**28 / 0.02 / 1e9, rel=1e-3)  # n=2: busbw = algbw
    failed = {1: {"kind": "result", "ok": False, **script._failure(1, 1, "warm-up", "E", "x")}}
    out = script.summarise(args_of(), {"results": failed, "stages": {0: "warm-up"}, "stuck": [0],
                                       "deadline_reached": True}, {}, 9.0)
    assert not out["ok"] and out["timeout"]
    assert (out["rank"], out["error_type"]) == (1, "E")
    assert [f["error_type"] for f in out["failures"]] == ["E", "Timeout"]
    assert "kind" not in out["failures"][0]


# ---------------------------------------------------------------------------------------
# the remote script run for real, against the fake torch


def run_script(*argv, timeout=60, **env):
    full = {**os.environ, "PYTHONPATH": str(FAKE_TORCH), **env}
    proc = subprocess.run([sys.executable, str(SCRIPT), *argv], env=full, capture_output=True,
                          text=True, timeout=timeout, check=False)
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1, proc.stdout + proc.stderr  # ONE JSON line
    return proc.returncode, json.loads(lines[0])


def test_a_node_of_a_group_runs_its_global_ranks_against_rank_0s_store(tmp_path):
    rc, out = run_script("--gpus", "4", "--nnodes", "2", "--node-rank", "1", "--addr",
                         "10.0.0.1", "--port", "50001", "--mib", "1", "--timeout", "30",
                         FAKE_TORCH_LOG=str(tmp_path))
    assert rc == 0 and out["ok"] and out["check"] == "allreduce"
    assert (out["world_size"], out["ranks"], out["nccl"]) == (8, [4, 5, 6, 7], "2.27.3")
    assert out["busbw_gbps"] == pytest.approx(out["algbw_gbps"] * 2 * 7 / 8, rel=1e-3)
    inits = sorted((json.loads(p.read_text()) for p in tmp_path.glob("rank*.json")),
                   key=lambda i: i["rank"])
    assert [(i["rank"], i["local_rank"]) for i in inits] == [(4, 0), (5, 1), (6, 2), (7, 3)]
    assert {(i["backend"], i["init_method"], i["world_size"]) for i in inits} == {
        ("nccl", "tcp://10.0.0.1:50001", 8)}
    assert all(0 < i["timeout_s"] <= 30 for i in inits)  # init gets what is left of the deadline


def test_one_host_picks_a_free_loopback_port():
    rc, out = run_script("--gpus", "2", "--mib", "1")
    assert rc == 0 and out["addr"] == "127.0.0.1" and out["port"] > 0 and out["ranks"] == [0, 1]


def test_a_rank_that_raises_is_reported_with_its_rank_stage_and_exception():
    rc, out = run_script("--gpus", "4", "--mib", "1",
                         FAKE_TORCH_FAIL="2:warm-up:DistBackendError:NCCL error: unhandled system error")
    assert rc == 1 and not out["ok"] and not out["timeout"]
    assert (out["rank"], out["stage"], out["error_type"]) == (2, "warm-up", "DistBackendError")
    assert out["error"] == "NCCL error: unhandled system error"


def test_a_wrong_sum_fails_the_verify_stage():
    rc, out = run_script("--gpus", "2", "--mib", "1", FAKE_TORCH_CORRUPT="1")
    assert rc == 1 and (out["rank"], out["stage"]) == (1, "verify")
    assert "data differs" in out["error"]


def test_too_few_gpus_fails_before_spawning():
    rc, out = run_script("--gpus", "8", FAKE_TORCH_DEVICES="4")
    assert rc == 1 and (out["stage"], out["error_type"]) == ("devices", "DeviceCount")
    assert out["rank"] is None and "4" in out["error"]


def test_a_hanging_rank_is_ended_at_the_deadline_naming_its_stage():
    rc, out = run_script("--gpus", "2", "--mib", "1", "--timeout", "2",
                         FAKE_TORCH_HANG="1:init_process_group")
    assert rc == 1 and out["timeout"]
    assert (out["rank"], out["stage"], out["error_type"]) == (1, "init_process_group", "Timeout")
    assert out["elapsed_s"] < 10


def test_without_torch_the_script_still_prints_its_line(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}  # no torch anywhere
    proc = subprocess.run([sys.executable, str(SCRIPT), "--gpus", "2"], env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert proc.returncode == 1 and out["stage"] == "import"
    assert out["error_type"] == "ModuleNotFoundError"


# ---------------------------------------------------------------------------------------
# core: the spec, the command, the output


def settings(**raw):
    return data.resolve({**MIN_DATA, **raw}, environ={})


GROUP = group.Group("g", (group.Node("a", 0), group.Node("b", 1)), "10.0.0.1", 50000)


def test_spec_of_one_host_and_of_a_groups_node():
    s = settings(gpu_expected_count=4, gpu_allreduce_mib=64, gpu_allreduce_timeout_s=30)
    one = allreduce.spec_of(s)
    assert (one.nnodes, one.world_size, one.ranks, one.port, one.mib) == (1, 4, [0, 1, 2, 3], 0, 64)
    node = allreduce.spec_of(s, group=GROUP, host="b")
    assert (node.nnodes, node.node_rank, node.world_size, node.ranks) == (2, 1, 8, [4, 5, 6, 7])
    assert (node.addr, node.port) == ("10.0.0.1", 50001)  # the dist-init port + 1


def test_argv_and_command():
    spec = allreduce.Spec(gpus=8, mib=256, timeout_s=120, nnodes=2, node_rank=1,
                          addr="10.0.0.1", port=50001, group="g")
    argv = allreduce.argv("/v/bin/python", "/opt/sglang/tools/allreduce_check.py", spec)
    assert argv == ["/v/bin/python", "/opt/sglang/tools/allreduce_check.py", "--addr", "10.0.0.1",
                    "--port", "50001", "--nnodes", "2", "--node-rank", "1", "--gpus", "8",
                    "--mib", "256", "--iters", str(allreduce.ITERS), "--timeout", "120"]
    # the script's own parser takes it
    parsed = script.parse_args(argv[2:])
    assert (parsed.nnodes, parsed.node_rank, parsed.port, parsed.gpus) == (2, 1, 50001, 8)
    cmd = allreduce.command("/v/bin/python", "/t/allreduce_check.py", spec,
                            {"NCCL_SOCKET_IFNAME": "eth1", "PATH": "/a b"})
    line, _, tail = cmd.partition("; ")
    words = shlex.split(line)
    assert words[:4] == ["timeout", "-k", "10", "135"]  # past the script's own deadline
    assert words[4:7] == ["env", "NCCL_SOCKET_IFNAME=eth1", "PATH=/a b"]
    assert words[7:9] == ["/v/bin/python", "/t/allreduce_check.py"]
    assert tail == f"echo {allreduce.EXIT_PREFIX}$?"


def test_op_name_is_the_same_on_every_node_of_a_group():
    s = settings(gpu_expected_count=8)
    names = {allreduce.op_name(allreduce.spec_of(s, group=GROUP, host=h)) for h in ("a", "b")}
    assert names == {"All-reduce (NCCL) over 16 GPUs of group g (2 nodes)"}
    assert allreduce.op_name(allreduce.spec_of(s)) == "All-reduce (NCCL) over 8 GPUs"


GOOD = {"check": "allreduce", "ok": True, "world_size": 8, "ranks": list(range(8)), "mib": 256,
        "seconds": 0.0125, "algbw_gbps": 21.47, "busbw_gbps": 37.58, "nccl": "2.27.3",
        "torch": "2.9.1"}


def test_parse_finds_the_line_after_nccls_noise():
    noise = "\n".join(["host:1:1 [0] NCCL INFO Bootstrap: Using eth0:10.0.0.1<0>",
                       '{"not": "ours"}', "{broken json", json.dumps(GOOD), "allreduce-exit=0"])
    out = allreduce.parse_output(noise, "some warning")
    assert out["ok"] and out["busbw_gbps"] == 37.58 and out["exit_status"] == 0


def test_parse_without_a_line():
    out = allreduce.parse_output("", "")
    assert (out["ok"], out["error_type"], out["error"]) == (False, "NoResult", "no output at all")
    out = allreduce.parse_output("allreduce-exit=1", "Traceback ...\nSyntaxError: bad")
    assert out["error_type"] == "NoResult" and out["exit_status"] == 1
    assert "SyntaxError: bad" in out["tail"]
    out = allreduce.parse_output("NCCL INFO x\nallreduce-exit=124", "")
    assert out["timeout"] and out["error_type"] == "Timeout" and "NCCL INFO x" in out["tail"]
    out = allreduce.parse_output("allreduce-exit=127", "env: '/v/bin/python': No such file")
    assert "not found" in out["error"]


def test_parse_keeps_the_scripts_own_failure():
    failed = {"check": "allreduce", "ok": False, "rank": 3, "stage": "warm-up",
              "error_type": "DistBackendError", "error": "NCCL error", "timeout": False}
    out = allreduce.parse_output(json.dumps(failed) + "\nallreduce-exit=1")
    assert (out["rank"], out["stage"], out["exit_status"]) == (3, "warm-up", 1)


# ---------------------------------------------------------------------------------------
# core: the verdict

ONE = allreduce.Spec(gpus=8, mib=256, timeout_s=120)
NODE = allreduce.Spec(gpus=8, mib=256, timeout_s=120, nnodes=2, node_rank=1, addr="10.0.0.1",
                      port=50001, group="g")


def test_pass_with_and_without_a_bound():
    check = allreduce.judge(GOOD, ONE, 30)
    assert check.status == "pass" and "37.6 GB/s" in check.message and "bound 30.0" in check.message
    check = allreduce.judge(GOOD, ONE, None)
    assert check.status == "pass" and "no bound set" in check.message
    assert check.details["busbw_gbps"] == 37.58


def test_one_gpu_has_no_bus_bandwidth_to_judge():
    one = allreduce.Spec(gpus=1, mib=256, timeout_s=120)
    check = allreduce.judge({**GOOD, "world_size": 1, "busbw_gbps": 0.0}, one, 30)
    assert check.status == "pass" and "one GPU" in check.message


def test_below_the_bound_on_one_host_points_at_p2p():
    check = allreduce.judge(GOOD, ONE, 40, python="/v/bin/python",
                            tool="/opt/sglang/tools/allreduce_check.py",
                            env={"PATH": "/usr/bin", "NCCL_P2P_LEVEL": "SYS"})
    assert check.failed and check.expected.startswith("bus bandwidth >= 40.0 GB/s")
    assert check.found == "37.6 GB/s"
    assert "iommu=pt" in check.fix and "ACS" in check.fix and "NCCL_DEBUG=INFO" in check.fix
    assert "NCCL_P2P_LEVEL=SYS" in check.fix and "PATH=" not in check.fix  # the manual run
    assert "/opt/sglang/tools/allreduce_check.py" in check.fix


def test_below_the_bound_with_p2p_disabled_says_so():
    check = allreduce.judge(GOOD, ONE, 40, env={"NCCL_P2P_DISABLE": "1"})
    assert check.failed and "NCCL_P2P_DISABLE=1 is set" in check.fix


def test_below_the_bound_in_a_group_points_at_the_network():
    check = allreduce.judge({**GOOD, "world_size": 16}, NODE, 40,
                            env={"NCCL_SOCKET_IFNAME": "ens5"})
    assert check.failed and "NCCL_SOCKET_IFNAME" in check.fix and "now ens5" in check.fix
    assert "NCCL_IB_HCA" in check.fix and "every node of the group" in check.fix
    assert "iommu" not in check.fix


FAILED = {"check": "allreduce", "ok": False, "timeout": False}


@pytest.mark.parametrize(("spec", "result", "words"), [
    (ONE, {"stage": "import", "error_type": "ModuleNotFoundError", "error": "No module named 'torch'"},
     "reinstall the release"),
    (ONE, {"stage": "devices", "error_type": "DeviceCount", "error": "torch sees 4"},
     "CUDA_VISIBLE_DEVICES"),
    (ONE, {"rank": 0, "stage": "allocate", "error_type": "OutOfMemoryError",
           "error": "CUDA out of memory. Tried to allocate 256 MiB"}, "nothing else uses the GPUs"),
    (NODE, {"rank": 8, "stage": "init_process_group", "error_type": "DistNetworkError",
            "error": "Connection refused"}, "10.0.0.1:50001"),
    (ONE, {"rank": 1, "stage": "verify", "error_type": "RuntimeError",
           "error": "data differs after the all-reduce"}, "iommu=pt"),
    (ONE, {"rank": 3, "stage": "warm-up", "error_type": "Timeout", "timeout": True,
           "error": "still in stage warm-up at the deadline"}, "classic P2P fault"),
    (NODE, {"rank": 9, "stage": "warm-up", "error_type": "Timeout", "timeout": True,
            "error": "still in stage warm-up at the deadline"}, "another node of the group"),
    (ONE, {"error_type": "Timeout", "timeout": True, "error": "ran past its deadline",
           "tail": "last words"}, "Xid"),
])
def test_failures_name_the_rank_stage_and_a_fix(spec, result, words):
    check = allreduce.judge({**FAILED, **result}, spec, 30)
    assert check.failed and words in check.fix
    assert "NCCL_DEBUG=INFO" in check.fix  # the manual run, every time
    assert result["error"] in check.message and result["error"] in check.found
    if result.get("rank") is not None:
        assert f"rank {result['rank']}" in check.message
    if result.get("tail"):
        assert result["tail"] in check.found


def test_a_failed_check_becomes_a_preflight_error_with_its_fix():
    check = allreduce.judge({**FAILED, "rank": 1, "stage": "verify", "error_type": "RuntimeError",
                             "error": "data differs"}, ONE, None)
    err = allreduce.error_for("gpu-1", check)
    assert isinstance(err, PreflightError) and err.checks == [check]
    assert "gpu-1" in str(err) and "data differs" in str(err) and "iommu=pt" in str(err)


# ---------------------------------------------------------------------------------------
# data keys and shipping


def test_data_keys_defaults_and_checks():
    s = settings()
    assert (s.gpu_allreduce_check, s.gpu_allreduce_min_busbw_gbps, s.gpu_allreduce_mib,
            s.gpu_allreduce_timeout_s) == (False, None, 256, 120)
    s = settings(gpu_allreduce_check=True, gpu_allreduce_min_busbw_gbps=30)
    assert s.gpu_allreduce_min_busbw_gbps == 30
    for key, bad in (("gpu_allreduce_check", "yes"), ("gpu_allreduce_min_busbw_gbps", -1),
                     ("gpu_allreduce_min_busbw_gbps", True), ("gpu_allreduce_mib", 0),
                     ("gpu_allreduce_timeout_s", 1)):
        with pytest.raises(DataError) as err:
            settings(**{key: bad})
        assert err.value.key == key
    assert all(k.startswith("gpu_") for k in data.KEYS if "allreduce" in k)


def test_a_groups_nodes_must_agree_on_the_check():
    base = {**MIN_DATA, "sglang_group": "g", "gpu_expected_count": 8,
            "sglang_flags": {"tp-size": 16}, "ssh_hostname": "10.0.0.1"}
    with pytest.raises(DataError) as err:
        group.plan([("a", base), ("b", {**base, "gpu_allreduce_check": True})])
    assert err.value.key == "gpu_allreduce_check"
    with pytest.raises(DataError) as err:
        group.plan([("a", base), ("b", {**base, "gpu_allreduce_mib": 64})])
    assert err.value.key == "gpu_allreduce_mib"


def test_the_script_is_shipped_with_the_tools():
    assert allreduce.TOOL in service.TOOLS
    assert (SCRIPT.parent / allreduce.TOOL).is_file()


# ---------------------------------------------------------------------------------------
# the shell: one operation, its callback judged


class FakeHost:
    name = "b"
    print_prefix = "[b] "
    state = SimpleNamespace(print_input=False)

    def __init__(self, stdout, stderr=""):
        self.output = SimpleNamespace(stdout=stdout, stderr=stderr)
        self.commands = []

    def run_shell_command(self, command, **kwargs):
        self.commands.append(command)
        return True, self.output


@pytest.fixture
def added(monkeypatch):
    calls = []
    monkeypatch.setattr(shell, "python", SimpleNamespace(
        call=lambda **kw: calls.append(kw) or "meta"))
    monkeypatch.setattr(shell, "reported", lambda fn: fn)

    def add(stdout, *, check=True, min_busbw=None, group_=None, when=None):
        fake = FakeHost(stdout)
        monkeypatch.setattr(shell, "host", fake)
        s = settings(gpu_allreduce_check=check, gpu_allreduce_min_busbw_gbps=min_busbw)
        ctx = SimpleNamespace(settings=s, venv_python="/opt/sglang/releases/r1/venv/bin/python",
                              layout=service.Layout.of(s),
                              environment=lambda: [("NCCL_SOCKET_IFNAME", "ens5")])
        meta = shell.add_allreduce_check(ctx, group=group_, when=when)
        return meta, calls, fake

    return add


def test_the_shell_adds_nothing_when_the_check_is_off(added):
    meta, calls, _ = added("", check=False)
    assert meta is None and calls == []


def test_a_groups_node_starts_the_tool_in_one_operation_and_collects_its_result_in_the_next(
        added, monkeypatch, tmp_path):
    """No operation waits for another host's (any pool size): the tool is started in the
    background on every node, then each node waits for its own output on its own host."""
    import subprocess

    monkeypatch.setattr(shell, "state", runobj.bare_state())  # the run object: its groups
    when = lambda: True
    meta, calls, fake = added(json.dumps({**GOOD, "world_size": 16}) + "\nallreduce-exit=0",
                              group_=GROUP, when=when)
    assert meta == "meta" and len(calls) == 2
    assert calls[0]["name"] == ("All-reduce (NCCL) over 16 GPUs of group g (2 nodes): "
                                "started on every node")
    assert calls[1]["name"] == "All-reduce (NCCL) over 16 GPUs of group g (2 nodes): each node's result"
    assert calls[0]["_if"] is when and calls[1]["_if"] is when
    calls[0]["function"]()  # on the host's turn: started in the background, returns at once
    calls[1]["function"]()  # the next operation: its own result judged (passes)
    start, collect = fake.commands
    assert "setsid" in start and start.rstrip().endswith("& }")
    out = collect.split("test -s ")[1].split(" ")[0]
    assert out in start and out.startswith("/run/sglang-deploy/allreduce-")
    # the started command writes the output whole (by a rename) once the tool ended
    script = shell.started_command("echo hi; echo allreduce-exit=0", str(tmp_path / "o"))
    script = script.replace(shell.groupops.RESULTS_DIR, str(tmp_path))
    subprocess.run(["sh", "-c", script], check=True, timeout=30)
    got = subprocess.run(["sh", "-c", shell.groupops.collect_command(str(tmp_path / "o"), 20)],
                         capture_output=True, text=True, timeout=60)
    assert got.stdout.split() == ["hi", "allreduce-exit=0"]
    cmd = start.split("sh -c ")[1]
    words = shlex.split(shlex.split(cmd)[0].partition("; ")[0].lstrip("{ "))
    assert "NCCL_SOCKET_IFNAME=ens5" in words
    i = words.index("/opt/sglang/releases/r1/venv/bin/python")
    assert words[i + 1] == "/opt/sglang/tools/allreduce_check.py"
    assert words[words.index("--node-rank") + 1] == "1"
    assert words[words.index("--port") + 1] == "50001"


def test_the_shell_raises_the_preflight_error_when_it_fails(added):
    _, calls, _ = added(json.dumps(GOOD) + "\nallreduce-exit=0", min_busbw=40)
    assert "_if" not in calls[0]
    with pytest.raises(PreflightError) as err:
        calls[0]["function"]()
    assert err.value.checks[0].name == allreduce.NAME and "37.6 GB/s" in str(err.value)
    _, calls, _ = added("allreduce-exit=124")
    with pytest.raises(PreflightError, match="ran past its deadline"):
        calls[0]["function"]()
