"""Multi-node groups in the simulator: `--nnodes N --node-rank R --dist-init-addr HOST:PORT`.

What is real here: a TCP rendezvous across the testbed network. Rank 0 listens on the
dist-init address (as torch's TCPStore server does on the rank-0 node), the other nodes
connect to it, retrying on refusal until the distributed timeout as torch's TCPStore client
does, and send a token: the hash of the sglang version and the launch flags without
`--node-rank` (every node of a group runs the same command). Rank 0 refuses a node whose
token differs. Rank 0 waits for all N-1 nodes before loading; every node keeps its
connection, so each side sees the other's process end (EOF) and the node phases are
synchronised on it (after graph capture rank 0 waits for every node, as the real collective
capture does). There is no NCCL: the data plane between the nodes is not simulated.

Where the real code says what differs on a node with --node-rank >= 1 (sglang 0.5.12.post1):
  rank ranges                   srt/entrypoints/engine.py _calculate_rank_ranges
  node >= 1: no tokenizer,      srt/entrypoints/engine.py Engine._launch_subprocesses
    no HTTP API, dummy health   (`if server_args.node_rank >= 1:` -> wait_for_ready,
    server, then waits for its   launch_dummy_health_check_server(host, port, enable_metrics),
    schedulers forever           wait_for_completion)
  dummy health server           srt/utils/common.py launch_dummy_health_check_server:
                                GET /ping, /health, /health_generate -> 200 (empty body),
                                on --host/--port; uvicorn with log_level="warning" (no access
                                log, no startup lines); logs `Dummy health check server started
                                in background thread at HOST:PORT`
  lines of global TP rank 0     tqdm of the shards (weight_utils: torch rank 0), `Capture cuda
  only (node 0)                 graph bs` (log_info_on_rank0), the capture bar and
                                `max_total_num_tokens=` (tp_rank == 0)
  "fired up and ready to roll"  http_server.py _execute_server_warmup: node 0 only
  dist timeout                  ServerArgs.dist_timeout None -> torch's default; sglang#7478
                                shows `timed out after 1800000ms` on a blocked rendezvous
"""

from __future__ import annotations

import hashlib
import socket
import threading
import time

MAGIC = "SGLSIM-RDZV/1"
#: torch.distributed's default timeout as seen in real multi-node logs (sglang#7478), seconds
DIST_TIMEOUT_S = 1800.0
#: the NCCL watchdog's collective timeout (Timeout(ms)=600000 in real watchdog lines), seconds
WATCHDOG_TIMEOUT_S = 600.0
#: torch's TCPStore client retries a refused connection about once a second
CONNECT_RETRY_S = 1.0
#: c10d logs a failed connect attempt; the simulator repeats it at most this often (real seconds)
CONNECT_LOG_EVERY_S = 60.0

# torch's own messages (c10d, outside the sglang wheel)
C10D_CONNECT_FAILED = ("[c10d] The client socket has failed to connect to [{host}]:{port} "
                       "(errno: {errno} - {reason}).")
C10D_CLIENT_TIMEOUT = ("torch.distributed.DistNetworkError: The client socket has timed out after "
                       "{ms}ms while trying to connect to ({host}, {port}).")
C10D_SERVER_TIMEOUT = ("torch.distributed.DistStoreError: Timed out after {s} seconds waiting for "
                       "clients. {joined}/{world} clients joined.")
DUMMY_HEALTH = "Dummy health check server started in background thread at {host}:{port}"
DUMMY_HEALTH_SRC = "sglang/srt/utils/common.py"
DUMMY_PATHS = ("/ping", "/health", "/health_generate")


def rank_range(nnodes: int, tp_size: int, node_rank: int, pp_size: int = 1) -> range:
    """The TP ranks of NODE_RANK (engine.py _calculate_rank_ranges)."""
    nnodes_per_pp_rank = max(nnodes // pp_size, 1)
    per_node = tp_size // nnodes_per_pp_rank
    first = per_node * (node_rank % nnodes_per_pp_rank)
    return range(first, first + per_node)


def parse_dist_init_addr(value: str, default_port: int = 50000) -> tuple[str, int]:
    """HOST:PORT ("[v6]:PORT" too; no port: DEFAULT_PORT)."""
    value = (value or "").strip()
    if value.startswith("["):
        host, _, rest = value[1:].partition("]")
        port = rest.lstrip(":")
        return host, int(port) if port else default_port
    host, sep, port = value.rpartition(":")
    if not sep:
        return value, default_port
    return host, int(port)


#: per-node flags left out of the token: the rank, and where this node's own HTTP server binds
PER_NODE_FLAGS = ("--node-rank", "--host", "--port")


def group_token(version: str, argv: list[str]) -> str:
    """What every node of a group must share: the sglang version and the launch flags except
    PER_NODE_FLAGS (and their values)."""
    kept, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a in PER_NODE_FLAGS:
            skip = True
            continue
        if a.split("=", 1)[0] in PER_NODE_FLAGS:
            continue
        kept.append(a)
    return hashlib.sha256("\0".join([version, *kept]).encode()).hexdigest()[:16]


def hello(node_rank: int, token: str) -> bytes:
    return f"{MAGIC} {node_rank} {token}\n".encode()


def check_hello(line: str, token: str, nnodes: int) -> tuple[int | None, str]:
    """Rank 0's check of a node's first line: (node rank, "") or (rank or None, why refused)."""
    parts = line.strip().split()
    if len(parts) != 3 or parts[0] != MAGIC or not parts[1].isdigit():
        return None, f"not a node of this group: {line.strip()[:60]!r}"
    rank = int(parts[1])
    if not 1 <= rank < nnodes:
        return rank, f"node rank {rank} is outside 1..{nnodes - 1} (--nnodes {nnodes})"
    if parts[2] != token:
        return rank, (f"node rank {rank} was launched with other flags or another sglang version "
                      f"(token {parts[2]}, rank 0 has {token})")
    return rank, ""


def _readline(sock: socket.socket) -> str:
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = sock.recv(1)
        if not chunk:
            break
        buf += chunk
    return buf.decode(errors="replace")


class Rank0:
    """The rendezvous server of node 0."""

    def __init__(self, host: str, port: int, nnodes: int, token: str, log_refusal):
        self.nnodes, self.token, self.log_refusal = nnodes, token, log_refusal
        self.peers: dict[int, socket.socket] = {}
        self.lost: list[int] = []
        self.phases: dict[int, set] = {}
        self.cond = threading.Condition()
        self.srv = socket.create_server((host, port), reuse_port=False)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            conn, addr = self.srv.accept()
            threading.Thread(target=self._greet, args=(conn, addr), daemon=True).start()

    def _greet(self, conn: socket.socket, addr):
        try:
            rank, why = check_hello(_readline(conn), self.token, self.nnodes)
        except OSError:
            conn.close()
            return
        with self.cond:
            if not why and rank in self.peers:
                why = f"node rank {rank} joined twice"
        if why:
            self.log_refusal(f"{addr[0]}:{addr[1]}: {why}")
            try:
                conn.sendall(f"REFUSED {why}\n".encode())
            except OSError:
                pass
            conn.close()
            return
        conn.sendall(b"OK\n")
        with self.cond:
            self.peers[rank] = conn
            self.cond.notify_all()
        self._watch(rank, conn)

    def _watch(self, rank: int, conn: socket.socket):
        """Reads the node's phase lines until its process ends (EOF)."""
        while True:
            try:
                line = _readline(conn)
            except OSError:
                line = ""
            with self.cond:
                if not line:
                    self.lost.append(rank)
                    self.cond.notify_all()
                    return
                self.phases.setdefault(rank, set()).add(line.strip())
                self.cond.notify_all()

    def wait_all(self, deadline: float) -> bool:
        """Every node joined before DEADLINE (monotonic)."""
        with self.cond:
            while len(self.peers) < self.nnodes - 1:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.cond.wait(left)
            return True

    def wait_phase(self, phase: str, deadline: float) -> list[int] | None:
        """Every node reported PHASE: None; a node ended first: the ranks lost (waits until
        DEADLINE only while none is lost)."""
        with self.cond:
            while True:
                if self.lost:
                    return list(self.lost)
                if all(phase in self.phases.get(r, ()) for r in self.peers):
                    return None
                left = deadline - time.monotonic()
                if left <= 0:
                    return []
                self.cond.wait(left)

    def wait_lost(self) -> list[int]:
        """Blocks until a node's process ends; its rank(s)."""
        with self.cond:
            while not self.lost:
                self.cond.wait()
            return list(self.lost)


class Node:
    """A node R >= 1: its connection to rank 0."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.gone = threading.Event()

    def report(self, phase: str) -> None:
        try:
            self.sock.sendall(f"{phase}\n".encode())
        except OSError:
            self.gone.set()

    def watch(self) -> None:
        def run():
            try:
                while self.sock.recv(64):
                    pass
            except OSError:
                pass
            self.gone.set()
        threading.Thread(target=run, daemon=True).start()


def connect(host: str, port: int, node_rank: int, token: str, deadline: float, on_refused):
    """Connect to rank 0 until DEADLINE (monotonic), calling ON_REFUSED(OSError) for each failed
    attempt. Returns (Node, "") or (None, "timeout") or (None, "refused: why")."""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return None, "timeout"
        try:
            s = socket.create_connection((host, port), timeout=min(left, 30.0))
        except OSError as e:
            on_refused(e)
            time.sleep(min(CONNECT_RETRY_S, max(deadline - time.monotonic(), 0)))
            continue
        try:
            s.settimeout(max(deadline - time.monotonic(), 0.01))
            s.sendall(hello(node_rank, token))
            answer = _readline(s)
        except OSError as e:
            s.close()
            on_refused(e)
            time.sleep(CONNECT_RETRY_S)
            continue
        if answer.startswith("OK"):
            s.settimeout(None)
            return Node(s), ""
        s.close()
        return None, "refused: " + (answer.partition(" ")[2].strip() or "connection closed")


# --------------------------------------------------------------------------- NCCL bootstrap
# After the store rendezvous, NCCL's bootstrap: rank 0's root listens on an ephemeral port
# (the kernel's ip_local_port_range: a firewall between the nodes must let it through), the
# other ranks connect to it. NCCL retries a refused or timed-out connect 34 times, 100 ms x
# attempt apart, then fails the communicator init (messages of NCCL's misc/socket.cc and
# bootstrap.cc, wording as in real logs, e.g. sglang#3820).
NCCL_RETRIES = 34
NCCL_WARN_CONNECT = ("misc/socket.cc:533 NCCL WARN socketPollConnect: Connect to {addr}<{port}> "
                     "returned {errno}({reason}) errno 115(Operation now in progress)")
NCCL_INFO_TRACE = ("NCCL INFO misc/socket.cc:570 -> 2", "NCCL INFO misc/socket.cc:621 -> 2",
                   "NCCL INFO bootstrap.cc:285 -> 2", "NCCL INFO init.cc:1534 -> 2",
                   "NCCL INFO init.cc:1799 -> 2")
NCCL_ERROR = ("torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/"
              "c10d/ProcessGroupNCCL.cpp:3353, unhandled system error (run with NCCL_DEBUG=INFO "
              "for details), NCCL version 2.27.5\nncclSystemError: System call (e.g. socket, "
              "malloc) or external library call failed or device error. \nLast error:\n"
              "socketPollConnect: Connect to {addr}<{port}> returned {errno}({reason}) errno "
              "115(Operation now in progress)")


def nccl_root() -> socket.socket:
    """Rank 0's NCCL bootstrap root: every address, an ephemeral port; accepts and holds."""
    srv = socket.create_server(("0.0.0.0", 0))
    held = []

    def accept():
        while True:
            conn, _ = srv.accept()
            held.append(conn)
    threading.Thread(target=accept, daemon=True).start()
    return srv


def nccl_connect(host: str, port: int, step_s: float, attempt_s: float):
    """NCCL's bootstrap connect: None when it connected, else the last OSError after
    NCCL_RETRIES attempts STEP_S x attempt apart (each attempt at most ATTEMPT_S)."""
    last = None
    for i in range(1, NCCL_RETRIES + 1):
        try:
            socket.create_connection((host, port), timeout=attempt_s).close()
            return None
        except OSError as e:
            last = e
            time.sleep(step_s * i)
    return last


def errno_reason(e: OSError) -> tuple[int, str]:
    if isinstance(e, TimeoutError) or e.errno is None:
        return 110, "Connection timed out"
    return e.errno, e.strerror or str(e)
