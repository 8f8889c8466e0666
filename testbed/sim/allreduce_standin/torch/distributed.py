"""torch.distributed of the testbed's all-reduce stand-in: a real TCP sum between the ranks.

``init_process_group(init_method="tcp://ADDR:PORT")``: global rank 0 listens on PORT (every
address, as torch's store does), every other rank connects to ADDR:PORT, retrying until the
deadline (``timeout``), as torch's store client does; a rank that cannot reach rank 0 raises
after the deadline with torch's wording. ``all_reduce``: each rank sends its value to rank
0, which sums and sends the sum back.
"""

import socket
import time

_G: dict = {}


def _deadline(timeout) -> float:
    return time.monotonic() + (timeout.total_seconds() if timeout is not None else 1800.0)


def init_process_group(backend, init_method=None, rank=None, world_size=None, timeout=None):
    addr, port = init_method[len("tcp://"):].rsplit(":", 1)
    port, deadline = int(port), _deadline(timeout)
    _G.update(rank=rank, world=world_size)
    if rank == 0:
        srv = socket.create_server(("", port))
        peers = []
        while len(peers) < world_size - 1:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(f"Timed out after {timeout} waiting for {world_size - 1 - len(peers)} "
                                   f"of {world_size - 1} ranks to connect to port {port}")
            srv.settimeout(left)
            try:
                conn, _ = srv.accept()
            except socket.timeout:
                continue
            peers.append(conn.makefile("rwb"))
        _G.update(srv=srv, peers=peers)
        return
    last = None
    while time.monotonic() < deadline:
        try:
            conn = socket.create_connection((addr, port), timeout=5.0)
            conn.settimeout(max(1.0, deadline - time.monotonic()))
            _G["conn"] = conn.makefile("rwb")
            return
        except OSError as exc:
            last = exc
            time.sleep(0.2)
    raise RuntimeError(f"The client socket has timed out after {timeout} while trying to connect "
                       f"to ({addr}, {port}): {last}")


def is_initialized() -> bool:
    return "rank" in _G


def all_reduce(tensor) -> None:
    if _G["rank"] == 0:
        total = tensor.value
        for f in _G["peers"]:
            total += float(f.readline())
        for f in _G["peers"]:
            f.write(f"{total!r}\n".encode())
            f.flush()
        tensor.value = total
        return
    f = _G["conn"]
    f.write(f"{tensor.value!r}\n".encode())
    f.flush()
    line = f.readline()
    if not line:
        raise RuntimeError("rank 0 closed the connection during all_reduce")
    tensor.value = float(line)


def destroy_process_group() -> None:
    for f in _G.get("peers", []) + ([_G["conn"]] if "conn" in _G else []):
        f.close()
    if "srv" in _G:
        _G["srv"].close()
    _G.clear()
