#!/usr/bin/env python3
"""A short NCCL all-reduce over this host's GPUs (and, for a multi-node group, across its
nodes), timed: run on the host by the RELEASE venv's python (stdlib and torch only).

  allreduce_check.py --gpus 8 [--mib 256] [--iters 20] [--timeout 120]
  allreduce_check.py --addr RANK0_ADDR --port P --nnodes N --node-rank R --gpus 8 ...

One process per local GPU (``torch.multiprocessing``, spawn); local rank L of node R is global
rank ``R * gpus + L``, so node rank 0's local rank 0 is global rank 0, which hosts the
rendezvous store (``init_process_group("nccl", init_method="tcp://ADDR:PORT")``). With
``--nnodes 1`` the store is on 127.0.0.1 and ``--port 0`` picks a free port. Each rank sets
its device, joins the group, all-reduces (sum) a float32 tensor of ``--mib`` MiB filled with
ones once (warm-up: NCCL's communicator is set up here) and checks every element equals the
world size, then times ``--iters`` all-reduces (``torch.cuda.synchronize`` before the clock
stops). Bandwidth as nccl-tests defines it: algbw = bytes / seconds per all-reduce, busbw =
algbw * 2 (n - 1) / n (n ranks), in GB/s (1e9 bytes/s).

Everything has a deadline, ``--timeout`` seconds from the start: torch's rendezvous and NCCL
timeout get what is left of it, and the parent ends any rank still running at the deadline.
Prints ONE JSON line on stdout (NCCL_DEBUG lines of the ranks may come before it)::

  {"check": "allreduce", "ok": true, "world_size": 16, "nnodes": 2, "node_rank": 0,
   "gpus": 8, "ranks": [0, ..., 7], "mib": 256, "bytes": 268435456, "dtype": "float32",
   "iters": 20, "seconds": 0.0123, "algbw_gbps": 21.8, "busbw_gbps": 40.9,
   "nccl": "2.27.3", "torch": "2.9.1+cu130", "elapsed_s": 14.2, "timeout": false,
   "failures": [], ...}

and on failure ``"ok": false`` with the first failure's ``rank``, ``local_rank``, ``stage``
(import, devices, set_device, init_process_group, allocate, warm-up, verify, timed),
``error_type`` and ``error`` (the exception's message), every failure in ``failures``, and
``"timeout": true`` when ranks were still running at the deadline. Exit status 0 when it
passed, 1 otherwise. The deploy judges the line (``sglang_deploy.core.allreduce``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import queue as queue_mod
import socket
import sys
import time

CHECK = "allreduce"
#: stages of one rank, in order (the parent's own: "import", "devices")
STAGES = ("start", "set_device", "init_process_group", "allocate", "warm-up", "verify", "timed",
          "done")
#: seconds the ranks still running get after one rank of this node failed
FAIL_GRACE_S = 5.0
#: seconds a rank that exited is given for its result to arrive through the queue
EXIT_GRACE_S = 1.0
ELEMENT_BYTES = 4  # float32
MESSAGE_LIMIT = 2000


def global_rank(node_rank: int, gpus: int, local_rank: int) -> int:
    """The global rank of local rank LOCAL_RANK on node NODE_RANK (GPUS ranks per node)."""
    return node_rank * gpus + local_rank


def node_ranks(node_rank: int, gpus: int) -> list[int]:
    return [global_rank(node_rank, gpus, local) for local in range(gpus)]


def bandwidth(nbytes: int, seconds: float, world_size: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s of an all-reduce of NBYTES per rank taking SECONDS, as
    nccl-tests defines them: algbw = bytes / time; busbw = algbw * 2 (n - 1) / n."""
    algbw = nbytes / seconds / 1e9
    return algbw, algbw * 2 * (world_size - 1) / world_size


def free_port(addr: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((addr, 0))
        return sock.getsockname()[1]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--addr", default="127.0.0.1", help="global rank 0's address (IPv4)")
    ap.add_argument("--port", type=int, default=0,
                    help="global rank 0's rendezvous port (0 with --nnodes 1: a free port)")
    ap.add_argument("--nnodes", type=int, default=1)
    ap.add_argument("--node-rank", type=int, default=0)
    ap.add_argument("--gpus", type=int, required=True, help="GPUs (ranks) on this node")
    ap.add_argument("--mib", type=int, default=256, help="size of the all-reduced tensor, MiB")
    ap.add_argument("--iters", type=int, default=20, help="timed all-reduces")
    ap.add_argument("--timeout", type=float, default=120.0, help="deadline of everything, s")
    args = ap.parse_args(argv)
    problems = []
    if args.nnodes < 1:
        problems.append("--nnodes must be >= 1")
    if not 0 <= args.node_rank < max(args.nnodes, 1):
        problems.append("--node-rank must be in 0..nnodes-1")
    for name in ("gpus", "mib", "iters"):
        if getattr(args, name) < 1:
            problems.append(f"--{name} must be >= 1")
    if args.timeout <= 0:
        problems.append("--timeout must be > 0")
    if args.nnodes > 1 and args.port <= 0:
        problems.append("--port must be given for --nnodes > 1")
    if problems:
        ap.error("; ".join(problems))
    if args.nnodes == 1:
        args.addr = "127.0.0.1"
    return args


def _version_text(version) -> str | None:
    if version is None:
        return None
    if isinstance(version, (tuple, list)):
        return ".".join(str(v) for v in version)
    if isinstance(version, int):  # old torch: 2708 -> 2.7.8; 22703 -> 2.27.3
        major, rest = divmod(version, 10000 if version >= 10000 else 1000)
        minor, patch = divmod(rest, 100)
        return f"{major}.{minor}.{patch}"
    return str(version)


def _failure(rank, local_rank, stage: str, exc_type: str, message: str) -> dict:
    return {"rank": rank, "local_rank": local_rank, "stage": stage, "error_type": exc_type,
            "error": str(message)[:MESSAGE_LIMIT]}


def worker(local_rank: int, opts: dict, results) -> None:
    """One rank (a spawned process): report each stage, then the timing or the failure."""
    rank = global_rank(opts["node_rank"], opts["gpus"], local_rank)
    world = opts["nnodes"] * opts["gpus"]
    stage = "start"

    def enter(name: str) -> None:
        nonlocal stage
        stage = name
        results.put({"kind": "stage", "local_rank": local_rank, "stage": name})

    dist = None
    try:
        import torch
        import torch.distributed as dist

        enter("set_device")
        torch.cuda.set_device(local_rank)
        enter("init_process_group")
        left = max(1.0, opts["deadline"] - time.time() - 2.0)
        dist.init_process_group("nccl", init_method=f"tcp://{opts['addr']}:{opts['port']}",
                                rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=left))
        enter("allocate")
        numel = opts["mib"] * 1024 * 1024 // ELEMENT_BYTES
        tensor = torch.ones(numel, dtype=torch.float32, device=f"cuda:{local_rank}")
        enter("warm-up")
        dist.all_reduce(tensor)
        torch.cuda.synchronize()
        enter("verify")
        if not bool(tensor.eq(float(world)).all()):
            raise RuntimeError(f"data differs after the all-reduce: not every element of the "
                               f"sum over {world} ranks equals {world}")
        enter("timed")
        start = time.perf_counter()
        for _ in range(opts["iters"]):
            dist.all_reduce(tensor)
        torch.cuda.synchronize()
        seconds = (time.perf_counter() - start) / opts["iters"]
        enter("done")
        results.put({"kind": "result", "local_rank": local_rank, "rank": rank, "ok": True,
                     "seconds": seconds})
    except BaseException as exc:  # noqa: BLE001 - every failure is reported, with its rank
        results.put({"kind": "result", "ok": False,
                     **_failure(rank, local_rank, stage, type(exc).__name__, str(exc))})
    finally:
        if dist is not None:
            try:
                if dist.is_initialized():
                    dist.destroy_process_group()
            except BaseException:  # noqa: BLE001, S110 - the result is already reported
                pass


def _stop(procs) -> None:
    for proc in procs:
        if proc.is_alive():
            proc.terminate()
    end = time.monotonic() + 5
    for proc in procs:
        proc.join(max(0.1, end - time.monotonic()))
        if proc.is_alive():
            proc.kill()
            proc.join(1)


def collect(procs, results, gpus: int, deadline: float, clock=time.monotonic) -> dict:
    """Wait for the GPUS ranks' results until DEADLINE (CLOCK's time): {"results": {local:
    result}, "stages": {local: last stage}, "stuck": [local ranks without a result],
    "deadline_reached": bool}. A rank
    that exited without a result counts as failed; once one rank failed, the others get
    FAIL_GRACE_S (the all-reduce cannot complete without it)."""
    got: dict[int, dict] = {}
    stages: dict[int, str] = {}
    exited_at: dict[int, float] = {}
    give_up = deadline
    while len(got) < gpus and clock() < give_up:
        try:
            msg = results.get(timeout=max(0.01, min(0.2, give_up - clock())))
        except queue_mod.Empty:
            msg = None
        if msg is not None:
            local = msg["local_rank"]
            if msg["kind"] == "stage":
                stages[local] = msg["stage"]
            else:
                got[local] = msg
                if not msg["ok"]:
                    give_up = min(give_up, clock() + FAIL_GRACE_S)
            continue
        now = clock()
        for local, proc in enumerate(procs):
            if local in got or proc.exitcode is None:
                continue
            exited_at.setdefault(local, now)
            if now - exited_at[local] >= EXIT_GRACE_S:
                got[local] = {"kind": "result", "ok": False, **_failure(
                    None, local, stages.get(local, "start"), "ProcessExited",
                    f"the rank's process exited with status {proc.exitcode} without a result")}
                give_up = min(give_up, now + FAIL_GRACE_S)
    return {"results": got, "stages": stages,
            "stuck": [local for local in range(gpus) if local not in got],
            "deadline_reached": len(got) < gpus and clock() >= deadline}


def _base(args: argparse.Namespace, versions: dict, elapsed: float) -> dict:
    return {"check": CHECK, "ok": False, "host": socket.gethostname(),
            "world_size": args.nnodes * args.gpus, "nnodes": args.nnodes,
            "node_rank": args.node_rank, "gpus": args.gpus,
            "ranks": node_ranks(args.node_rank, args.gpus), "addr": args.addr, "port": args.port,
            "mib": args.mib, "bytes": args.mib * 1024 * 1024, "dtype": "float32",
            "iters": args.iters, "timeout_s": args.timeout, **versions,
            "elapsed_s": round(elapsed, 3), "timeout": False, "failures": []}


def _with_failures(out: dict, failures: list[dict]) -> dict:
    first = failures[0]
    out.update(failures=failures, rank=first["rank"], local_rank=first["local_rank"],
               stage=first["stage"], error_type=first["error_type"], error=first["error"])
    return out


def summarise(args: argparse.Namespace, collected: dict, versions: dict, elapsed: float) -> dict:
    """The one JSON object of this node, from the collected ranks (``collect``)."""
    out = _base(args, versions, elapsed)
    results, stages = collected["results"], collected["stages"]
    failures = [{k: v for k, v in r.items() if k not in ("kind", "ok")}
                for _, r in sorted(results.items()) if not r["ok"]]
    for local in collected["stuck"]:
        stage = stages.get(local, "start")
        if collected["deadline_reached"]:
            kind, why = "Timeout", f"still in stage {stage} at the deadline ({args.timeout:g} s)"
        else:
            kind, why = "Stopped", (f"still in stage {stage} {FAIL_GRACE_S:g} s after another "
                                    "rank of this node failed: stopped")
        failures.append(_failure(global_rank(args.node_rank, args.gpus, local), local, stage,
                                 kind, why))
    out["timeout"] = bool(collected["stuck"]) and collected["deadline_reached"]
    if failures:
        # the real errors first, then the ranks they left waiting
        failures.sort(key=lambda f: (f["error_type"] in ("Timeout", "Stopped"),
                                     f["local_rank"]))
        return _with_failures(out, failures)
    world = out["world_size"]
    seconds = max(r["seconds"] for r in results.values())  # the slowest rank of this node
    algbw, busbw = bandwidth(out["bytes"], seconds, world)
    out.update(ok=True, seconds=round(seconds, 6), algbw_gbps=round(algbw, 3),
               busbw_gbps=round(busbw, 3),
               per_rank_seconds={str(r["rank"]): round(r["seconds"], 6)
                                 for _, r in sorted(results.items())})
    return out


def _early_failure(args, stage: str, exc_type: str, message: str, versions: dict,
                   elapsed: float) -> dict:
    """Nothing was spawned: the parent's own failure (torch does not import, too few GPUs)."""
    return _with_failures(_base(args, versions, elapsed),
                          [_failure(None, None, stage, exc_type, message)])


def run(args: argparse.Namespace) -> dict:
    started = time.monotonic()
    deadline = started + args.timeout
    versions: dict = {"torch": None, "nccl": None}
    try:
        import torch
        import torch.multiprocessing as mp

        versions["torch"] = str(torch.__version__)
        versions["nccl"] = _version_text(torch.cuda.nccl.version())
    except BaseException as exc:  # noqa: BLE001
        return _early_failure(args, "import", type(exc).__name__, str(exc), versions,
                              time.monotonic() - started)
    try:
        visible = torch.cuda.device_count()
    except BaseException as exc:  # noqa: BLE001
        return _early_failure(args, "devices", type(exc).__name__, str(exc), versions,
                              time.monotonic() - started)
    if visible < args.gpus:
        return _early_failure(args, "devices", "DeviceCount",
                              f"torch sees {visible} CUDA devices, the check needs {args.gpus}",
                              versions, time.monotonic() - started)
    if args.port == 0:
        args.port = free_port(args.addr)
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    opts = {"addr": args.addr, "port": args.port, "nnodes": args.nnodes,
            "node_rank": args.node_rank, "gpus": args.gpus, "mib": args.mib,
            "iters": args.iters, "deadline": time.time() + args.timeout}
    procs = [ctx.Process(target=worker, args=(local, opts, results), daemon=True)
             for local in range(args.gpus)]
    try:
        for proc in procs:
            proc.start()
        collected = collect(procs, results, args.gpus, deadline)
    finally:
        _stop(procs)
    return summarise(args, collected, versions, time.monotonic() - started)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = run(args)
    sys.stdout.flush()
    print(json.dumps(result, sort_keys=True), flush=True)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
