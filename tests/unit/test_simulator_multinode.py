"""The simulator's multi-node groups (testbed/sim/sim_multinode.py, sim_group.py) against the real
0.5.12.post1 wheel: rank numbering, the group token, the dummy health server's routes, and two
nodes on this machine's loopback doing the real TCP rendezvous.

Synchronisation is on output lines and process exits with deadlines, never on sleeps.
"""

from __future__ import annotations

import ast
import re
import socket
import time
from pathlib import Path

import pytest
from test_simulator import Run, free_port, model_dir, site, wheel  # noqa: F401 (fixtures)

from testbed.sim import sim_multinode as mn

TP_LINE = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d TP(\d+)\] ", re.MULTILINE)


# ----------------------------------------------------------------------------- pure parts
def _real_function(site_dir: Path, rel: str, name: str):
    """NAME of the wheel's REL, compiled alone (it needs nothing but typing)."""
    tree = ast.parse((site_dir / rel).read_text())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    ns: dict = {}
    exec("from typing import Tuple, List, Optional\n" + ast.unparse(fn), ns)  # noqa: S102
    return ns[name]


def test_rank_ranges_are_the_real_engines(site):  # noqa: F811
    real = _real_function(site, "sglang/srt/entrypoints/engine.py", "_calculate_rank_ranges")
    for nnodes, tp, pp in [(2, 16, 1), (4, 32, 1), (2, 8, 1), (3, 24, 1), (2, 16, 2)]:
        for node in range(nnodes):
            assert list(mn.rank_range(nnodes, tp, node, pp)) == list(real(nnodes, pp, tp, node)[1])
    assert list(mn.rank_range(2, 16, 1)) == list(range(8, 16))


def test_token_ignores_only_the_per_node_flags():
    base = ["--model-path", "/m", "--tp-size", "16", "--nnodes", "2", "--dist-init-addr", "10.0.0.1:50000"]
    t = mn.group_token("0.5.12.post1", base + ["--node-rank", "0", "--host", "10.0.0.1", "--port", "30000"])
    assert t == mn.group_token("0.5.12.post1", base + ["--node-rank=1", "--host", "10.0.0.2", "--port", "30001"])
    assert t != mn.group_token("0.5.12.post1", base + ["--node-rank", "1", "--mem-fraction-static", "0.8"])
    assert t != mn.group_token("0.5.13", base + ["--node-rank", "1"])


def test_rank0_checks_each_nodes_hello():
    tok = mn.group_token("v", ["--tp-size", "16"])
    assert mn.check_hello(mn.hello(1, tok).decode(), tok, 2) == (1, "")
    rank, why = mn.check_hello(mn.hello(1, "other").decode(), tok, 2)
    assert rank == 1 and "other flags or another sglang version" in why
    assert "outside 1..1" in mn.check_hello(mn.hello(2, tok).decode(), tok, 2)[1]
    assert mn.check_hello("GET / HTTP/1.1\r\n", tok, 2)[0] is None


def test_dist_init_addr_forms():
    assert mn.parse_dist_init_addr("10.1.2.3:5000") == ("10.1.2.3", 5000)
    assert mn.parse_dist_init_addr("[fd00::1]:5000") == ("fd00::1", 5000)
    assert mn.parse_dist_init_addr("node0", 50000) == ("node0", 50000)


def test_dummy_health_routes_are_the_real_ones(site):  # noqa: F811
    src = (site / "sglang/srt/utils/common.py").read_text()
    fn = next(n for n in ast.walk(ast.parse(src))
              if isinstance(n, ast.FunctionDef) and n.name == "launch_dummy_health_check_server")
    routes = {d.args[0].value for n in ast.walk(fn) if isinstance(n, ast.AsyncFunctionDef)
              for d in n.decorator_list if isinstance(d, ast.Call) and d.func.attr == "get"}
    assert routes == set(mn.DUMMY_PATHS)
    # a node >= 1 ends its startup with that server: the engine's branch for node_rank >= 1
    engine = (site / "sglang/srt/entrypoints/engine.py").read_text()
    assert "if server_args.node_rank >= 1:" in engine
    assert "launch_dummy_health_check_server(" in engine


# ----------------------------------------------------------------------------- two nodes
GROUP = ["--tp-size", "16", "--nnodes", "2", "--host", "127.0.0.1"]


@pytest.fixture
def nodes():
    started = []
    yield started
    for r in started:
        r.stop()


def node(nodes, tmp_path, site, model_dir, rank, dport, scenario="healthy", extra=(),  # noqa: F811
         time_scale="0.002"):
    d = tmp_path / f"node{rank}-{len(nodes)}"
    d.mkdir()
    r = Run(d, site, model_dir, "--node-rank", str(rank), *extra, scenario=scenario,
            time_scale=time_scale, flags=GROUP + ["--dist-init-addr", f"127.0.0.1:{dport}"])
    nodes.append(r)
    return r


def ranks(text: str) -> set[int]:
    return {int(x) for x in TP_LINE.findall(text)}


def test_two_nodes_rendezvous_rank0_serves_node1_answers_health(nodes, tmp_path, site, model_dir):  # noqa: F811
    dport = free_port()
    n1 = node(nodes, tmp_path, site, model_dir, 1, dport)   # the worker first: it waits for rank 0
    n0 = node(nodes, tmp_path, site, model_dir, 0, dport)
    n0.wait_for("The server is fired up and ready to roll!", timeout=60)
    assert n0.http("/health")[0] == 200
    n1.wait_for(f"Dummy health check server started in background thread at 127.0.0.1:{n1.port}")
    for path in mn.DUMMY_PATHS:
        assert n1.http(path) == (200, b"")
    assert n1.http("/generate")[0] == 404
    assert n1.http("/v1/models")[0] == 404
    assert ranks(n0.text) == set(range(8)) and ranks(n1.text) == set(range(8, 16))
    assert "Loading safetensors checkpoint shards" in n0.text
    for only_rank0 in ("Loading safetensors", "Capture cuda graph bs", "max_total_num_tokens=",
                       "Uvicorn running", "fired up"):
        assert only_rank0 not in n1.text, only_rank0
    assert n1.text.count("Capture cuda graph end.") == 8


def test_node_without_rank0_logs_c10d_and_dies_at_the_distributed_timeout(nodes, tmp_path, site,  # noqa: F811
                                                                          model_dir):  # noqa: F811
    dport = free_port()   # nobody listens
    n1 = node(nodes, tmp_path, site, model_dir, 1, dport)
    assert n1.exit_code(timeout=60) == -9
    assert f"[c10d] The client socket has failed to connect to [127.0.0.1]:{dport} " \
           "(errno: 111 - Connection refused)." in n1.text
    assert "[rank8]:[W" in n1.text and "[rank15]:[W" in n1.text
    assert ("torch.distributed.DistNetworkError: The client socket has timed out after 1800000ms "
            f"while trying to connect to (127.0.0.1, {dport}).") in n1.text
    assert "Received sigquit from a child process" in n1.text
    assert not n1.port_open() and "Load weight begin" not in n1.text


def test_rank0_refuses_a_node_with_other_flags_and_waits(nodes, tmp_path, site, model_dir):  # noqa: F811
    dport = free_port()
    n0 = node(nodes, tmp_path, site, model_dir, 0, dport, time_scale="0.05")
    n0.wait_for(" TP7] Init torch distributed begin.")
    n1 = node(nodes, tmp_path, site, model_dir, 1, dport, extra=("--mem-fraction-static", "0.7"))
    assert n1.exit_code(timeout=60) == -9
    assert "torch.distributed.DistStoreError: rank 0 at 127.0.0.1" in n1.text
    n0.wait_for("Refused a node of the group: 127.0.0.1:")
    assert "other flags or another sglang version" in n0.text
    assert n0.p.poll() is None and "Load weight begin" not in n0.text


def test_node_capture_crash_leaves_rank0_waiting_until_the_watchdog(nodes, tmp_path, site, model_dir):  # noqa: F811
    dport = free_port()
    n0 = node(nodes, tmp_path, site, model_dir, 0, dport)
    n1 = node(nodes, tmp_path, site, model_dir, 1, dport, scenario="node-capture-crash")
    assert n1.exit_code(timeout=60) == -9
    assert " TP8] Scheduler hit an exception" in n1.text and "Capture cuda graph failed: CUDA out of memory" in n1.text
    assert n0.exit_code(timeout=60) == -9
    assert "Watchdog caught collective operation timeout" in n0.text
    assert "fired up" not in n0.text and "Uvicorn running" not in n0.text


def test_node_dies_serving_makes_rank0_unhealthy_then_aborts(nodes, tmp_path, site, model_dir):  # noqa: F811
    dport = free_port()
    n0 = node(nodes, tmp_path, site, model_dir, 0, dport, time_scale="0.02")
    n1 = node(nodes, tmp_path, site, model_dir, 1, dport, scenario="node-dies-serving", time_scale="0.02")
    n0.wait_for("The server is fired up and ready to roll!", timeout=60)
    assert n1.exit_code(timeout=60) == -9
    assert "torch.AcceleratorError: CUDA error" in n1.text
    deadline = time.monotonic() + 30   # rank 0 sees the loss when the node's socket closes
    while n0.http("/health", timeout=30)[0] != 503:
        assert time.monotonic() < deadline, n0.text[-2000:]
    n0.wait_for("Health check failed. Server couldn't get a response from detokenizer")
    assert n0.exit_code(timeout=60) == -9
    assert "Watchdog caught collective operation timeout" in n0.text


def test_node_connects_over_a_real_socket():
    """A rendezvous by hand: the server accepts the right hello, refuses another token."""
    tok = "t" * 16
    port = free_port()
    refused = []
    r0 = mn.Rank0("127.0.0.1", port, 3, tok, refused.append)
    node1, why = mn.connect("127.0.0.1", port, 1, tok, deadline=time.monotonic() + 60, on_refused=lambda e: None)
    assert node1 is not None and why == ""
    bad, why = mn.connect("127.0.0.1", port, 2, "x" * 16, deadline=time.monotonic() + 60, on_refused=lambda e: None)
    assert bad is None and why.startswith("refused: node rank 2 was launched with other flags")
    assert refused and not r0.wait_all(deadline=0)   # 1 of 2 nodes joined
    node1.sock.close()
    assert r0.wait_lost() == [1]
    with socket.create_connection(("127.0.0.1", port)) as s:  # still listening
        s.sendall(b"junk\n")


def test_nccl_bootstrap_connect_and_its_error_lines():
    """NCCL's bootstrap connect: the root accepts; a closed port fails after NCCL's retries with
    the errno in NCCL's and torch's wording."""
    root = mn.nccl_root()
    assert mn.nccl_connect("127.0.0.1", root.getsockname()[1], step_s=0.0, attempt_s=5) is None
    closed = free_port()
    err = mn.nccl_connect("127.0.0.1", closed, step_s=0.0, attempt_s=5)
    assert isinstance(err, ConnectionRefusedError)
    errno, reason = mn.errno_reason(err)
    assert (errno, reason) == (111, "Connection refused")
    assert mn.errno_reason(TimeoutError("timed out")) == (110, "Connection timed out")
    warn = mn.NCCL_WARN_CONNECT.format(addr="10.0.0.1", port=closed, errno=errno, reason=reason)
    assert re.fullmatch(r"misc/socket\.cc:\d+ NCCL WARN socketPollConnect: Connect to 10\.0\.0\.1<\d+> "
                        r"returned 111\(Connection refused\) errno 115\(Operation now in progress\)", warn)
    assert "Last error:\nsocketPollConnect: Connect to 10.0.0.1<" in mn.NCCL_ERROR.format(
        addr="10.0.0.1", port=closed, errno=errno, reason=reason)
