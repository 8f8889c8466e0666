"""The NCCL all-reduce check (pure): the command a node runs, its output read, and the verdict.

``remote/allreduce_check.py`` runs on the host with the release venv's python: one process per
GPU, ``torch.distributed`` over NCCL, a verified warm-up all-reduce then timed ones of
``gpu_allreduce_mib`` MiB; it prints one JSON line. Here: ``spec_of`` (what a host runs, alone
or as a node of a group), ``command`` (the shell line, under a deadline), ``parse_output``
(the line found among NCCL's own output, or a failure saying why there is none) and ``judge``
(a :class:`~sglang_deploy.core.preflight.Check` with expected, found and the fix).

Bus bandwidth is nccl-tests' ``busbw``: algbw x 2 (n - 1) / n, comparable with
``all_reduce_perf``'s column and between world sizes. A group's nodes all-reduce together:
global rank 0 (node rank 0's first GPU) hosts torch's rendezvous store on
``sglang_dist_init_port`` + :data:`PORT_OFFSET` of the group's ``--dist-init-addr``.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sglang_deploy.core.errors import PreflightError
from sglang_deploy.core.preflight.checks import Check
from sglang_deploy.core.preflight.p2p import P2P_FIX

if TYPE_CHECKING:
    from sglang_deploy.core.group import Group
    from sglang_deploy.core.settingstype import Settings

#: the script shipped with the other tools (``service.TOOLS``)
TOOL = "allreduce_check.py"
#: the check's name in the pre-flight's list of checks
NAME = "nccl-allreduce"
#: the marker of the JSON line the script prints
MARK = "allreduce"
#: timed all-reduces after the warm-up (256 MiB x 20 at 20 GB/s bus bandwidth: under a second)
ITERS = 20
#: a group's rendezvous port: the group's dist-init port + this (free: the server is down)
PORT_OFFSET = 1
#: seconds past the script's own deadline before coreutils' ``timeout`` ends it, and after
#: that before it is killed
KILL_AFTER_S = (15, 10)
#: the line the command appends with the script's exit status
EXIT_PREFIX = "allreduce-exit="
#: exit statuses of coreutils' ``timeout`` when it ended the command
TIMEOUT_STATUSES = (124, 137)
#: the environment variables the manual command (in a fix) repeats
MANUAL_ENV_PREFIXES = ("NCCL_", "GLOO_", "TORCH_", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")

_STOPPED = ("Timeout", "Stopped")


@dataclass(frozen=True)
class Spec:
    """What one host runs: its GPUs, and its place in a group (``nnodes`` > 1)."""

    gpus: int
    mib: int
    timeout_s: float
    iters: int = ITERS
    nnodes: int = 1
    node_rank: int = 0
    addr: str = "127.0.0.1"
    port: int = 0  # 0: a free port on 127.0.0.1 (one host)
    group: str | None = None

    @property
    def world_size(self) -> int:
        return self.nnodes * self.gpus

    @property
    def ranks(self) -> list[int]:
        """The global ranks of this node: node rank x GPUs + local rank."""
        return [self.node_rank * self.gpus + local for local in range(self.gpus)]

    @property
    def bound_applies(self) -> bool:
        """One rank moves nothing over any link: its bus bandwidth is 0 by definition."""
        return self.world_size > 1


def spec_of(settings: Settings, group: Group | None = None, host: str = "") -> Spec:
    """The spec of HOST from its settings; GROUP (``core.group.Group``) when it is a node of a
    multi-node group: every node then runs the same world size, rank 0's address and port."""
    gpus, mib = int(settings.gpu_expected_count), int(settings.gpu_allreduce_mib)
    timeout_s = float(settings.gpu_allreduce_timeout_s)
    if group is None:
        return Spec(gpus=gpus, mib=mib, timeout_s=timeout_s)
    return Spec(gpus=gpus, mib=mib, timeout_s=timeout_s, nnodes=group.nnodes,
                node_rank=group.rank_of(host), addr=group.addr,
                port=group.port + PORT_OFFSET, group=group.name)


def argv(python: str, tool: str, spec: Spec) -> list[str]:
    """The script's argv (the release venv's PYTHON, the shipped TOOL)."""
    return [python, tool, "--addr", spec.addr, "--port", str(spec.port),
            "--nnodes", str(spec.nnodes), "--node-rank", str(spec.node_rank),
            "--gpus", str(spec.gpus), "--mib", str(spec.mib), "--iters", str(spec.iters),
            "--timeout", f"{spec.timeout_s:g}"]


def command(python: str, tool: str, spec: Spec, env: Mapping[str, str] | None = None) -> str:
    """The shell line a host runs: the script with ENV (the service's environment: its NCCL
    settings are what the server will use) under coreutils' ``timeout`` (the script has its
    own deadline; this ends it if it cannot keep it), then a line with its exit status."""
    term, kill = KILL_AFTER_S
    words = ["timeout", "-k", str(kill), f"{spec.timeout_s + term:g}"]
    if env:
        words += ["env", *(f"{k}={v}" for k, v in env.items())]
    words += argv(python, tool, spec)
    return f"{shlex.join(words)}; echo {EXIT_PREFIX}$?"


def manual_command(python: str, tool: str, spec: Spec, env: Mapping[str, str] | None = None) -> str:
    """The same run for an operator, with NCCL telling which transport it picks (the
    environment's NCCL, gloo, torch and CUDA device settings only: what changes the run)."""
    keep = {k: v for k, v in (env or {}).items() if k.startswith(MANUAL_ENV_PREFIXES)}
    debug = {**keep, "NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,P2P,NET"}
    return shlex.join(["env", *(f"{k}={v}" for k, v in debug.items()), *argv(python, tool, spec)])


def op_name(spec: Spec) -> str:
    """The operation's name: the same on every node of a group (one operation, run at once)."""
    if spec.nnodes > 1:
        return (f"All-reduce (NCCL) over {spec.world_size} GPUs of group {spec.group} "
                f"({spec.nnodes} nodes)")
    return f"All-reduce (NCCL) over {spec.gpus} GPUs"


# ---------------------------------------------------------------------------------------
# the output


def _tail(text: str, lines: int = 8) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def parse_output(stdout: str | None, stderr: str | None = "") -> dict[str, Any]:
    """The script's JSON object, found among whatever came before it (NCCL_DEBUG lines); with
    ``exit_status`` from the command's last line. Without one: a failed result saying why
    (``error_type`` ``Timeout`` when coreutils' timeout ended it, ``NoResult`` otherwise,
    ``tail`` the last lines of output)."""
    stdout, stderr = stdout or "", stderr or ""
    status = None
    found = None
    for line in reversed(stdout.splitlines()):
        line = line.strip()
        if status is None and line.startswith(EXIT_PREFIX):
            try:
                status = int(line[len(EXIT_PREFIX):])
            except ValueError:
                pass
            continue
        if found is None and line.startswith("{"):
            try:
                value = json.loads(line)
            except ValueError:
                continue
            if isinstance(value, dict) and value.get("check") == MARK:
                found = value
                break
    if found is not None:
        return {**found, "exit_status": status}
    text = "\n".join(t for t in (_tail(stderr), _tail(
        "\n".join(ln for ln in stdout.splitlines() if not ln.startswith(EXIT_PREFIX)))) if t)
    if status in TIMEOUT_STATUSES:
        return {"check": MARK, "ok": False, "timeout": True, "error_type": "Timeout",
                "stage": None, "rank": None, "exit_status": status,
                "error": "the check ran past its deadline and was ended (no result line)",
                "tail": text}
    why = ("no output at all" if not (stdout.strip() or stderr.strip())
           else f"exit status {status}, no result line" if status is not None
           else "no result line")
    if status == 127:
        why = "the command was not found (exit status 127)"
    return {"check": MARK, "ok": False, "timeout": False, "error_type": "NoResult",
            "stage": None, "rank": None, "exit_status": status, "error": why, "tail": text}


# ---------------------------------------------------------------------------------------
# the verdict

DEBUG_FIX = ("Run it by hand on the host{every} to see what NCCL does (NCCL_DEBUG=INFO names "
             "the transport of each peer: P2P/CUMEM or P2P/IPC is direct, SHM goes through "
             "host memory, NET/Socket or NET/IB crosses nodes):\n  {manual}")
NETWORK_FIX = (
    "The all-reduce crosses the network between the group's nodes. Check the link (`ethtool "
    "IFACE` speed, `iperf3` between the nodes), that NCCL uses the intended interface "
    "(NCCL_SOCKET_IFNAME: `sglang_nccl_socket_ifname`, now {ifname}), and for InfiniBand/RoCE "
    "that NCCL finds the HCAs (`ibv_devinfo` in the container, /dev/infiniband bind-mounted "
    "into it, NCCL_IB_HCA naming them, NCCL_IB_DISABLE not set): NCCL_DEBUG=INFO must show "
    "NET/IB, not NET/Socket, for RDMA.")
RENDEZVOUS_FIX = (
    "Every node must reach {addr}:{port} (TCP) of node rank 0 ({what}): open it in the "
    "firewalls between the nodes, and check that the check ran on every node of the group "
    "(a node that failed before it leaves the others waiting). NCCL's own bootstrap then "
    "uses ephemeral ports between all nodes.")
GPUS_BUSY_FIX = (
    "Run the check when nothing else uses the GPUs (`nvidia-smi` lists their processes; the "
    "server is stopped before it restarts), or lower `gpu_allreduce_mib`.")
VENV_FIX = ("torch must import in the release venv ({python}): reinstall the release "
            "(remove its folder under releases/ and deploy again), or set "
            "`gpu_allreduce_check: false`.")


def _fmt(value: Any, digits: int = 1) -> str:
    return "?" if value is None else f"{float(value):.{digits}f}"


def _where(spec: Spec) -> str:
    if spec.nnodes > 1:
        return (f"{spec.world_size} GPUs of group {spec.group} ({spec.nnodes} nodes x "
                f"{spec.gpus}; this node's ranks {spec.ranks[0]}-{spec.ranks[-1]})")
    return f"{spec.gpus} GPUs of this host"


def _versions(result: Mapping[str, Any]) -> str:
    parts = [f"NCCL {result['nccl']}" if result.get("nccl") else None,
             f"torch {result['torch']}" if result.get("torch") else None]
    return ", ".join(p for p in parts if p)


def _p2p_hints(env: Mapping[str, str]) -> str:
    if str(env.get("NCCL_P2P_DISABLE", "")) == "1":
        return ("NCCL_P2P_DISABLE=1 is set (`gpu_p2p_policy: adapt` after a failed P2P test): "
                "the all-reduce goes through host memory. Fix P2P on the host, or lower "
                "`gpu_allreduce_min_busbw_gbps` to what host memory gives. " + P2P_FIX)
    return P2P_FIX


def _link_fix(spec: Spec, env: Mapping[str, str]) -> str:
    if spec.nnodes > 1:
        return NETWORK_FIX.format(ifname=env.get("NCCL_SOCKET_IFNAME") or "not set")
    return _p2p_hints(env)


def _failure_fix(result: Mapping[str, Any], spec: Spec, env: Mapping[str, str],
                 python: str) -> str:
    """The fix for a failed run, by the stage it failed in and what it raised."""
    stage, kind = result.get("stage"), result.get("error_type") or ""
    text = str(result.get("error") or "").lower()
    if stage is None and kind == "Timeout":
        return ("The script did not keep its own deadline and was ended from outside: a process "
                "stuck in the GPU driver (`nvidia-smi` hangs too; `dmesg` shows Xid errors) or "
                "a stalled `import torch` (its output's tail is above).")
    if stage == "import" or kind in ("ImportError", "ModuleNotFoundError"):
        return VENV_FIX.format(python=python)
    if stage == "devices":
        return ("torch must see every GPU the pre-flight found: check CUDA_VISIBLE_DEVICES in "
                "`sglang_env` and the device nodes of the container (the pre-flight's GPU "
                "checks).")
    if "out of memory" in text or "busy or unavailable" in text:
        return GPUS_BUSY_FIX
    if stage == "init_process_group":
        if spec.nnodes > 1:
            return RENDEZVOUS_FIX.format(addr=spec.addr, port=spec.port,
                                         what="`sglang_dist_init_port` + "
                                              f"{PORT_OFFSET}, the rendezvous of the check")
        return ("torch's rendezvous on 127.0.0.1 did not complete: a rank that never got "
                "there (its own failure comes first, or it hung setting up its GPU: "
                "`nvidia-smi` on the host), or the port was taken meanwhile (run it again).")
    if stage == "verify":
        return ("Data corruption between GPUs: " + _p2p_hints(env)
                + " Confirm with NCCL_P2P_DISABLE=1 (`gpu_p2p_policy: adapt`).")
    if stage in ("warm-up", "timed", "allocate", "set_device") or kind in _STOPPED:
        if spec.nnodes > 1:
            return ("If another node of the group failed, its error comes first. Otherwise: "
                    + NETWORK_FIX.format(ifname=env.get("NCCL_SOCKET_IFNAME") or "not set"))
        if kind in _STOPPED:  # a hang in NCCL on one host: P2P over PCIe (IOMMU, ACS)
            return ("An all-reduce that hangs on one host is the classic P2P fault of PCIe "
                    "GPUs (IOMMU or ACS on the host). " + _p2p_hints(env))
        return _p2p_hints(env)
    return "Read the error above and the tail of the output."


def judge(result: Mapping[str, Any], spec: Spec, min_busbw_gbps: float | None = None, *,
          env: Mapping[str, str] | None = None, python: str = "python",
          tool: str = TOOL) -> Check:
    """The verdict of one node's result: pass, or fail with expected, found and the fix.
    MIN_BUSBW_GBPS null: only that the all-reduce completes with the right sum."""
    env = env or {}
    where = _where(spec)
    every = " (on every node of the group at once)" if spec.nnodes > 1 else ""
    debug = DEBUG_FIX.format(every=every, manual=manual_command(python, tool, spec, env))
    if not result.get("ok"):
        rank = result.get("rank")
        who = f"rank {rank}" if rank is not None else "this node"
        stage = result.get("stage")
        what = f"{result.get('error_type') or 'failure'}: {result.get('error') or ''}".strip()
        message = (f"the NCCL all-reduce over {where} failed: {who}"
                   + (f" in {stage}" if stage else "") + f": {what}")
        found = what + (f"\n{result['tail']}" if result.get("tail") else "")
        return Check(NAME, "fail", message, expected=f"an all-reduce over {where} that "
                     f"completes within {spec.timeout_s:g} s with the right sum",
                     found=found, fix=_failure_fix(result, spec, env, python) + "\n" + debug,
                     details={"result": dict(result)})
    busbw, algbw, seconds = result.get("busbw_gbps"), result.get("algbw_gbps"), result.get("seconds")
    measured = (f"bus bandwidth {_fmt(busbw)} GB/s (algbw {_fmt(algbw)} GB/s, "
                f"{result.get('mib', spec.mib)} MiB in {_fmt((seconds or 0) * 1000, 2)} ms"
                + (f"; {_versions(result)}" if _versions(result) else "") + ")")
    details = {"result": dict(result), "busbw_gbps": busbw, "min_busbw_gbps": min_busbw_gbps}
    if not spec.bound_applies:
        return Check(NAME, "pass", f"all-reduce over {where} completed (one GPU: nothing "
                     "crosses a link, no bandwidth bound applies)", details=details)
    if min_busbw_gbps is not None and (busbw is None or float(busbw) < float(min_busbw_gbps)):
        return Check(NAME, "fail",
                     f"all-reduce over {where}: {measured}, below the bound "
                     f"{_fmt(min_busbw_gbps)} GB/s",
                     expected=f"bus bandwidth >= {_fmt(min_busbw_gbps)} GB/s "
                              "(`gpu_allreduce_min_busbw_gbps`)",
                     found=f"{_fmt(busbw)} GB/s",
                     fix=_link_fix(spec, env) + "\n" + debug
                     + "\nOr lower `gpu_allreduce_min_busbw_gbps` to what this hardware gives "
                       "with the service's NCCL settings (compare nccl-tests' all_reduce_perf "
                       "busbw; NCCL's defaults can give far less than a tuned setup: 8x RTX PRO "
                       "6000 on PCIe Gen5 about 22 GB/s against 37-42 GB/s tuned).",
                     details=details)
    bound = (f"bound {_fmt(min_busbw_gbps)} GB/s" if min_busbw_gbps is not None
             else "no bound set (`gpu_allreduce_min_busbw_gbps`)")
    return Check(NAME, "pass", f"all-reduce over {where}: {measured}; {bound}",
                 details=details)


def error_for(host: str, check: Check) -> PreflightError:
    """The typed error that stops HOST when the check failed."""
    return PreflightError(what=f"the NCCL all-reduce check passes on {host} before the server "
                               f"(re)starts: {check.expected}",
                          found=check.message, fix=check.fix, checks=[check])
