"""A node of a multi-node group in the simulator: the rendezvous with its real lines, the
phase barrier after graph capture, the dummy health server of nodes R >= 1 and the group
scenarios (see sim_multinode.py for the protocol and where the real code says what it does).

Scenarios (SCENARIO= in the node's sim.env; they act on a node with --node-rank >= 1 only):
  node-capture-crash  the node's ranks crash in CUDA graph capture (`Capture cuda graph
                      failed: CUDA out of memory`, the SIGQUIT teardown); rank 0 finishes its
                      own capture and waits in the collective: no ready line, port closed,
                      until the NCCL watchdog's timeout (600 s, scaled) aborts it
  node-dies-serving   the node's ranks die NODE_DIES_AFTER (30 s, scaled) after rank 0's ready
                      line; rank 0's /health then fails after 20 s (scaled) with `Health check
                      failed` and 503, requests hang, and the watchdog (600 s, scaled) aborts it
Rank 0 unreachable is a network fault of the testbed (`python -m testbed block HOST PORT`):
the node's ranks log c10d's failed connects, retry until the distributed timeout (1800 s,
scaled) and end with torch's DistNetworkError and the SIGQUIT teardown.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from . import sim_multinode as mn
from .sim_log import M, _write, log

GROUP_SCENARIOS = ("node-capture-crash", "node-dies-serving")
NODE_DIES_AFTER_S = 30.0
SCHED = "sglang/srt/managers/scheduler.py"
MR = "sglang/srt/model_executor/model_runner.py"
_DIST = [(SCHED, "run_scheduler_process", "scheduler = Scheduler("),
         (SCHED, "__init__", "self.init_model_worker()"),
         (SCHED, "init_model_worker", "self.init_tp_model_worker()"),
         ("sglang/srt/managers/tp_worker.py", "_init_model_runner", "self._model_runner = ModelRunner("),
         (MR, "__init__", "self.initialize(pre_model_load_memory)"),
         (MR, "initialize", "min_per_gpu_memory = self.init_torch_distributed()"),
         (MR, "init_torch_distributed", "init_distributed_environment("),
         ("sglang/srt/distributed/parallel_state.py", "init_distributed_environment",
          "torch.distributed.init_process_group(")]


def local_ranks(sim) -> list[int]:
    if sim.nnodes <= 1:
        return list(range(sim.tp))
    return list(mn.rank_range(sim.nnodes, sim.tp, sim.node_rank, sim.pp))


def _torch_frames(sim, func: str) -> list[tuple[str, str, str]]:
    t = f"{sim.site}/torch/distributed"
    return [(f"{t}/c10d_logger.py", "wrapper", "func_return = func(*args, **kwargs)"),
            (f"{t}/distributed_c10d.py", "init_process_group",
             "store, rank, world_size = next(rendezvous_iterator)"),
            (f"{t}/rendezvous.py", "_tcp_rendezvous_handler",
             "store = _create_c10d_store("),
            (f"{t}/rendezvous.py", "_create_c10d_store", "return TCPStore(")] if func else []


def _glog(rank: int, level: str = "W", where: str = "socket.cpp:752") -> str:
    """torch's glog-style prefix of a rank process: `[rank8]:[W1204 06:01:02.123456789 socket.cpp:752] `."""
    now = time.time()
    return (f"[rank{rank}]:[{level}{time.strftime('%m%d %H:%M:%S')}.{int(now % 1 * 1e9):09d} "
            f"{where}] ")


class Group:
    """This node's side of a rendezvous that succeeded."""

    def __init__(self, sim, rank0: mn.Rank0 | None = None, node: mn.Node | None = None,
                 nccl_root=None):
        self.rank0, self.node, self.nccl_root = rank0, node, nccl_root

    def captured(self, sim) -> None:
        """After graph capture: node R reports it; rank 0 waits for every node (the capture's
        collectives): a node gone or never reporting leaves rank 0 in the collective until the
        NCCL watchdog's timeout."""
        if self.node:
            self.node.report("captured")
            return
        limit = mn.WATCHDOG_TIMEOUT_S * sim.cfg.time_scale
        lost = self.rank0.wait_phase("captured", time.monotonic() + limit)
        if lost is None:
            return
        if lost:  # the peer is gone; the collective waits out the watchdog
            sim.peer_lost, sim.peer_lost_at = time.monotonic(), time.time()
            time.sleep(max(0.0, sim.peer_lost + limit - time.monotonic()))
        watchdog_abort(sim, seq=412, op="ALLREDUCE")

    def ready(self, sim) -> None:
        """Rank 0 is ready: tell the nodes, then watch them (serving)."""
        for conn in list(self.rank0.peers.values()):
            try:
                conn.sendall(b"ready\n")
            except OSError:
                pass

        def watch():
            self.rank0.wait_lost()
            sim.peer_lost, sim.peer_lost_at = time.monotonic(), time.time()
            time.sleep(mn.WATCHDOG_TIMEOUT_S * sim.cfg.time_scale)
            watchdog_abort(sim, seq=9141, op="ALLREDUCE")
        threading.Thread(target=watch, daemon=True).start()


def rendezvous(sim) -> Group:
    """The rendezvous to --dist-init-addr (default port 50000 is not sglang's: it has none;
    the flag requires HOST:PORT). Crashes like the real node on failure."""
    host, port = mn.parse_dist_init_addr(getattr(sim.args, "dist_init_addr", None) or "", 50000)
    token = mn.group_token(sim.version, sim.argv)
    limit = mn.DIST_TIMEOUT_S * sim.cfg.time_scale
    deadline = time.monotonic() + limit
    if sim.node_rank == 0:
        try:  # torch's TCPStore server listens on every address of the node
            rank0 = mn.Rank0("0.0.0.0", port, sim.nnodes, token,
                             lambda why: log(f"Refused a node of the group: {why}"))
        except OSError as e:
            for r in sim.local[:1]:
                _write(sys.stderr, _glog(r, "W", "socket.cpp:464") + f"[c10d] The server socket has "
                       f"failed to bind to 0.0.0.0:{port} (errno: {e.errno} - {e.strerror}).\n")
            sim.crash(_DIST + _torch_frames(sim, "store"),
                      [(f"torch.distributed.DistNetworkError: The server socket has failed to listen "
                        f"on any local network address. port: {port}, useIpv6: false, code: "
                        f"-{e.errno}, name: EADDRINUSE, message: address already in use")])
        if not rank0.wait_all(deadline):
            with rank0.cond:
                joined = len(sim.local) * (1 + len(rank0.peers))
            sim.crash(_DIST + _torch_frames(sim, "store"),
                      [mn.C10D_SERVER_TIMEOUT.format(s=int(mn.DIST_TIMEOUT_S), joined=joined,
                                                     world=sim.tp * sim.pp)])
        root = mn.nccl_root()  # NCCL's bootstrap root: its port goes to every node
        for conn in list(rank0.peers.values()):
            conn.sendall(f"nccl {root.getsockname()[1]}\n".encode())
        return Group(sim, rank0=rank0, nccl_root=root)

    last_logged = [None]

    def refused(e: OSError):
        now = time.monotonic()
        every = max(mn.CONNECT_LOG_EVERY_S * sim.cfg.time_scale, 5 * mn.CONNECT_RETRY_S)
        if last_logged[0] is not None and now - last_logged[0] < every:
            return
        last_logged[0] = now
        reason = e.strerror or str(e) or "timed out"
        for r in sim.local:
            _write(sys.stderr, _glog(r) + mn.C10D_CONNECT_FAILED.format(
                host=host, port=port, errno=e.errno or 110, reason=reason) + "\n")

    node, why = mn.connect(host, port, sim.node_rank, token, deadline, refused)
    if node is None and why == "timeout":
        sim.crash(_DIST + _torch_frames(sim, "store"),
                  [mn.C10D_CLIENT_TIMEOUT.format(ms=int(mn.DIST_TIMEOUT_S * 1000), host=host,
                                                 port=port)])
    if node is None:
        sim.crash(_DIST + _torch_frames(sim, "store"),
                  [f"torch.distributed.DistStoreError: rank 0 at {host}:{port} {why}"])
    nccl_bootstrap(sim, node, host, deadline)
    return Group(sim, node=node)


def nccl_bootstrap(sim, node: mn.Node, host: str, deadline: float) -> None:
    """Node R: rank 0 sends its NCCL root's port once every node joined; connect to it as
    NCCL's bootstrap does. Unreachable: NCCL's lines on each rank, the DistBackendError."""
    try:
        node.sock.settimeout(max(deadline - time.monotonic(), 0.01))
        line = mn._readline(node.sock)
        node.sock.settimeout(None)
    except OSError:
        line = ""
    if not line.startswith("nccl "):
        sim.crash(_DIST + _torch_frames(sim, "store"), ["torch.distributed.DistStoreError: Socket Timeout"])
    port = int(line.split()[1])
    scale = min(1.0, sim.cfg.time_scale * 20)   # the real 100 ms steps at TIME_SCALE 0.05
    err = mn.nccl_connect(host, port, step_s=0.1 * scale, attempt_s=max(0.2, 20 * sim.cfg.time_scale))
    if err is None:
        return
    errno, reason = mn.errno_reason(err)
    name, pid = os.uname().nodename, os.getpid() + 1
    for i, r in enumerate(sim.local):
        head = f"{name}:{pid + i}:{pid + i} [{i}] "
        _write(sys.stdout, "\n" + head + mn.NCCL_WARN_CONNECT.format(
            addr=host, port=port, errno=errno, reason=reason) + "\n"
            + "".join(head + x + "\n" for x in mn.NCCL_INFO_TRACE))
    sim.crash(_DIST[:6] + [(MR, "init_torch_distributed", "initialize_model_parallel(")],
              [mn.NCCL_ERROR.format(addr=host, port=port, errno=errno, reason=reason)])


def node_capture_crash(sim) -> None:
    """Node R's ranks run out of memory in CUDA graph capture (the capture-oom lines on this
    node's ranks), then the SIGQUIT teardown."""
    from .sim_faults import capture_oom
    capture_oom(sim)


def watchdog_abort(sim, seq: int, op: str) -> None:
    """torch's NCCL watchdog aborts the collective on this node's first rank, then the teardown."""
    bad = sim.local[0]
    stamp = time.strftime("%m%d %H:%M:%S") + f".{int(time.time() % 1 * 1e9):09d}"
    work = (f"WorkNCCL(SeqNum={seq}, OpType={op}, NumelIn=7168, NumelOut=7168, "
            "Timeout(ms)=600000) ran for 600017 milliseconds before timing out.")
    rank = f"[rank{bad}]:"
    _write(sys.stderr,
           f"{rank}[E{stamp} ProcessGroupNCCL.cpp:632] [Rank {bad}] Watchdog caught collective "
           f"operation timeout: {work}\n"
           f"{rank}[E{stamp} ProcessGroupNCCL.cpp:2271] [PG ID 2 PG GUID 3 Rank {bad}]  failure "
           f"detected by watchdog at work sequence id: {seq} PG status: last enqueued work: {seq}, "
           f"last completed work: {seq - 1}\n"
           "terminate called after throwing an instance of 'c10::DistBackendError'\n"
           f"  what():  [PG ID 2 PG GUID 3 Rank {bad}] Process group watchdog thread terminated "
           f"with exception: [Rank {bad}] Watchdog caught collective operation timeout: {work}\n")
    log(M("sigquit"))
    sim.die("watchdog")


class _DummyHealth(BaseHTTPRequestHandler):
    """launch_dummy_health_check_server's FastAPI app: GET /ping, /health, /health_generate
    answer 200 with an empty body; anything else FastAPI's 404. uvicorn runs it with
    log_level="warning": no access log."""
    protocol_version = "HTTP/1.1"
    server_version = "uvicorn"
    sys_version = ""

    def log_message(self, fmt, *args):
        pass

    def _answer(self):
        path = self.path.split("?", 1)[0]
        if self.command == "GET" and path in mn.DUMMY_PATHS:
            status, body = 200, b""
        elif path in mn.DUMMY_PATHS:
            status, body = 405, b'{"detail":"Method Not Allowed"}'
        else:
            status, body = 404, b'{"detail":"Not Found"}'
        self.send_response(status)
        if body:
            self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_DELETE = _answer


def serve_dummy_health(sim) -> None:
    """Node R >= 1 at the end of its startup (engine.py _launch_subprocesses): the dummy health
    server on --host/--port, its log line, then it waits on its schedulers; the node dies when
    rank 0 does (the watchdog), or by the node-dies-serving scenario."""
    ThreadingHTTPServer.daemon_threads = True
    try:
        httpd = ThreadingHTTPServer((sim.host, sim.port), _DummyHealth)
    except OSError as e:
        log(f"Dummy health check server failed to start: [Errno {e.errno}] error while attempting "
            f"to bind on address ('{sim.host}', {sim.port}): {(e.strerror or '').lower()}")
        while True:
            time.sleep(3600)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    log(M("dummy_health", addr=f"{sim.host}:{sim.port}"))
    node = sim.group.node
    rank0_ready = threading.Event()

    def read_rank0():
        try:
            while True:
                line = mn._readline(node.sock)
                if not line:
                    break
                if line.strip() == "ready":
                    rank0_ready.set()
        except OSError:
            pass
        node.gone.set()
    threading.Thread(target=read_rank0, daemon=True).start()
    if sim.cfg.scenario == "node-dies-serving":
        rank0_ready.wait()
        time.sleep(NODE_DIES_AFTER_S * sim.cfg.time_scale)
        sim.crash([(SCHED, "run_scheduler_process", "scheduler.run_event_loop()"),
                   (SCHED, "run_event_loop", "dispatch_event_loop(self)"),
                   (SCHED, "dispatch_event_loop", "scheduler.event_loop_overlap()"),
                   (SCHED, "event_loop_overlap", "batch_result = self.run_batch(batch)")],
                  ["torch.AcceleratorError: CUDA error: unspecified launch failure"])
    node.gone.wait()  # rank 0 is gone: the collectives of this node wait out the watchdog
    time.sleep(mn.WATCHDOG_TIMEOUT_S * sim.cfg.time_scale)
    watchdog_abort(sim, seq=9141, op="ALLREDUCE")
    os.kill(os.getpid(), signal.SIGKILL)
