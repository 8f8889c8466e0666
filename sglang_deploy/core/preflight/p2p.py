"""P2P (pure): the data-verified peer copies and the topology claims -> checks, the matrix
shown to the operator, and the verdict a passed full test leaves on the host."""

from __future__ import annotations

import statistics
from typing import Any, Iterable, Literal, Mapping, Sequence

from sglang_deploy.core.nvsmi import (
    TopoMatrix,
)
from sglang_deploy.core.preflight.checks import Check, _fail

# ---------------------------------------------------------------------------------------
# P2P

P2P_FIX = (
    "Enable P2P on the host: IOMMU off or passthrough (`iommu=pt` / `amd_iommu=pt`), ACS "
    "disabled on the PCIe switches and root ports, BIOS 'Above 4G decoding' and 'Re-size BAR' "
    "on; GeForce cards report GNS and cannot be fixed. Or set the p2p policy to 'adapt' to run "
    "with NCCL_P2P_DISABLE=1 (all-reduce through host memory, slower)."
)


def render_p2p_matrix(
    n: int,
    p2p_read: Mapping[tuple[int, int], str] | None = None,
    probe_p2p: Sequence[Mapping[str, Any]] | None = None,
) -> str:
    """Text matrix, one cell per ordered pair: ``<topo code|peer|host> <ok|BAD|ERR|-> <GB/s|->``."""
    by_pair = {(int(e["src"]), int(e["dst"])): e for e in probe_p2p or []}
    cells: dict[tuple[int, int], str] = {}
    for i in range(n):
        for j in range(n):
            if i == j:
                cells[(i, j)] = "X"
                continue
            entry = by_pair.get((i, j))
            code = (p2p_read or {}).get((i, j))
            if code is None and entry is not None and entry.get("can_access") is not None:
                code = "peer" if entry.get("can_access") else "host"
            verified = "-"
            gbps = "-"
            if entry is not None:
                if entry.get("verified") is True:
                    verified = "ok"
                elif entry.get("verified") is False:
                    verified = "BAD"
                elif entry.get("error"):
                    verified = "ERR"
                if entry.get("gbps") is not None:
                    gbps = f"{float(entry['gbps']):.1f}"
            cells[(i, j)] = f"{code or '?'} {verified} {gbps}"
    width = max([len(c) for c in cells.values()] + [6]) + 2
    lines = ["src\\dst".ljust(8) + "".join(f"GPU{j}".ljust(width) for j in range(n))]
    for i in range(n):
        lines.append(f"GPU{i}".ljust(8) + "".join(cells[(i, j)].ljust(width) for j in range(n)))
    lines.append("cell: nvidia-smi topo -p2p r code (or peer/host from CUDA), data check "
                 "(ok/BAD/ERR), GB/s")
    return "\n".join(line.rstrip() for line in lines)


def _pairs_text(pairs: Iterable[tuple[int, int]], extra: Mapping[tuple[int, int], str] | None = None) -> str:
    out = []
    for i, j in sorted(pairs):
        tail = f" ({extra[(i, j)]})" if extra and (i, j) in extra else ""
        out.append(f"GPU{i}->GPU{j}{tail}")
    return ", ".join(out)


def check_p2p(
    topo: TopoMatrix | None,
    p2p_read: Mapping[tuple[int, int], str] | None,
    p2p_write: Mapping[tuple[int, int], str] | None,
    probe_p2p: Sequence[Mapping[str, Any]] | None,
    policy: Literal["require", "adapt"] = "require",
    min_gbps: float | None = None,
    expected_count: int | None = None,
) -> tuple[list[Check], dict[str, str]]:
    """Decide P2P from every source available; returns (checks, NCCL environment).

    * ``p2p-data`` - any pair whose copied bytes differ fails, whatever the policy; a pair
      whose copy errored fails too (nvidia-smi's "OK" and CUDA's "can access peer" prove
      nothing: real hosts hang or corrupt behind them).
    * ``p2p-support`` - pairs where nvidia-smi (read/write) says anything but OK, or CUDA
      cannot access/enable the peer: ``require`` fails; ``adapt`` warns and returns
      ``{"NCCL_P2P_DISABLE": "1"}``.
    * ``p2p-bandwidth`` - measured pairs below ``min_gbps`` fail, named.
    * ``p2p-matrix`` - informational, ``details["matrix"]`` holds :func:`render_p2p_matrix`.

    The GPUs are those the inputs name (a missing GPU is the count checks' business);
    ``expected_count`` is accepted for symmetry and recorded in the matrix check.
    """
    if policy not in ("require", "adapt"):
        raise ValueError(f"p2p policy must be 'require' or 'adapt', not {policy!r}")
    checks: list[Check] = []
    env: dict[str, str] = {}
    probe_p2p = list(probe_p2p or [])
    gpu_ids: set[int] = set()
    if topo is not None:
        gpu_ids.update(topo.gpu_indices)
    for matrix in (p2p_read, p2p_write):
        for i, j in (matrix or {}):
            gpu_ids.update((i, j))
    for e in probe_p2p:
        gpu_ids.update((int(e["src"]), int(e["dst"])))
    n = max([len(gpu_ids), max(gpu_ids) + 1 if gpu_ids else 0])
    if topo is not None:
        checks.append(Check("topology", "pass",
                            f"{topo.gpu_count} GPUs; links: "
                            + (", ".join(f"{k} x{v}" for k, v in topo.link_counts().items()) or "none"),
                            details={"links": topo.link_counts(), "nics": topo.nics}))
    else:
        checks.append(Check("topology", "skipped", "no `nvidia-smi topo -m` output"))

    if n < 2:
        reason = "fewer than two GPUs" if gpu_ids else "no P2P information (topo -m/-p2p or CUDA probe)"
        for name in ("p2p-support", "p2p-data", "p2p-bandwidth"):
            checks.append(Check(name, "skipped", reason))
        return checks, env
    pairs = [(i, j) for i in range(n) for j in range(n) if i != j]

    # --- support
    unsupported: dict[tuple[int, int], str] = {}
    sources = []
    for label, matrix in (("read", p2p_read), ("write", p2p_write)):
        if matrix is None:
            continue
        sources.append(f"topo -p2p {label[0]}")
        for pair in pairs:
            code = matrix.get(pair)
            if code != "OK":
                unsupported.setdefault(pair, f"{label} {code or 'missing'}")
    by_pair = {(int(e["src"]), int(e["dst"])): e for e in probe_p2p}
    if probe_p2p:
        sources.append("CUDA")
        for pair, e in by_pair.items():
            if e.get("can_access") is False:
                unsupported.setdefault(pair, "CUDA: no peer access")
            elif e.get("error") and "cuCtxEnablePeerAccess" in str(e.get("error")):
                unsupported.setdefault(pair, "CUDA: enabling peer access failed")
    smi_ok = {p for p in pairs if (p2p_read or {}).get(p) == "OK"} if p2p_read is not None else set()
    cuda_no = {p for p, e in by_pair.items() if e.get("can_access") is False}
    disagree = sorted(smi_ok & cuda_no)
    if not sources:
        checks.append(Check("p2p-support", "skipped", "no P2P information (topo -p2p or CUDA probe)"))
    elif unsupported:
        found = _pairs_text(unsupported, unsupported)
        if policy == "require":
            checks.append(_fail(
                "p2p-support", f"P2P unavailable on {len(unsupported)} of {len(pairs)} GPU pairs",
                expected="P2P between every GPU pair (policy 'require')", found=found, fix=P2P_FIX,
                pairs=[list(p) for p in sorted(unsupported)]))
        else:
            env["NCCL_P2P_DISABLE"] = "1"
            checks.append(Check(
                "p2p-support", "warn",
                f"P2P unavailable on {len(unsupported)} of {len(pairs)} GPU pairs: running with "
                "NCCL_P2P_DISABLE=1 (policy 'adapt'; all-reduce goes through host memory)",
                expected="P2P between every GPU pair", found=found, fix=P2P_FIX,
                details={"pairs": [list(p) for p in sorted(unsupported)], "nccl_env": dict(env)}))
    else:
        checks.append(Check("p2p-support", "pass",
                            f"P2P reported on all {len(pairs)} pairs ({', '.join(sources)})"))
    if disagree:
        checks.append(Check("p2p-consistency", "warn",
                            "nvidia-smi reports P2P OK but CUDA cannot access the peer on "
                            + _pairs_text(disagree),
                            found=_pairs_text(disagree)))

    # --- data
    if not probe_p2p:
        checks.append(Check("p2p-data", "skipped", "CUDA probe did not run the P2P copy test"))
    else:
        bad = sorted(p for p, e in by_pair.items() if e.get("verified") is False)
        errored = {p: str(e.get("error")) for p, e in by_pair.items()
                   if e.get("verified") is None and e.get("error")}
        untested = sorted(p for p in pairs if p not in by_pair)
        if bad or errored or untested:
            parts = []
            if bad:
                parts.append("data differs after copy: " + _pairs_text(bad))
            if errored:
                parts.append("copy failed: " + _pairs_text(errored, errored))
            if untested:
                parts.append("not tested (probe stopped): " + _pairs_text(untested))
            checks.append(_fail(
                "p2p-data",
                f"GPU-to-GPU copies are broken on {len(bad) + len(errored) + len(untested)} pairs"
                + (" (silent corruption)" if bad else ""),
                expected="bytes copied GPU->GPU arrive unchanged on every pair",
                found="; ".join(parts),
                fix="Do not serve from this host: corrupt or failing peer copies break tensor "
                "parallelism whatever NCCL does. " + P2P_FIX.split(" Or set")[0]
                + " Check the host's dmesg for IOMMU/AER errors.",
                corrupt=[list(p) for p in bad], failed=[list(p) for p in errored],
                untested=[list(p) for p in untested]))
        else:
            checks.append(Check("p2p-data", "pass", f"data verified on all {len(by_pair)} pairs"))

    # --- bandwidth
    measured = {p: float(e["gbps"]) for p, e in by_pair.items() if e.get("gbps") is not None}
    if not measured:
        checks.append(Check("p2p-bandwidth", "skipped", "no bandwidth measured"))
    else:
        values = sorted(measured.values())
        stats = {"min": values[0], "median": statistics.median(values), "max": values[-1]}
        stat_text = f"min {stats['min']:.1f}, median {stats['median']:.1f}, max {stats['max']:.1f} GB/s"
        slow = {p: v for p, v in measured.items() if min_gbps is not None and v < min_gbps}
        if slow:
            paths = {p: f"{v:.1f} GB/s" + ("" if by_pair[p].get("can_access") else ", via host")
                     for p, v in slow.items()}
            checks.append(_fail(
                "p2p-bandwidth", f"{len(slow)} pairs below {min_gbps:g} GB/s",
                expected=f">= {min_gbps:g} GB/s on every pair", found=_pairs_text(slow, paths),
                fix="Check the PCIe links on the host (`nvidia-smi -q | grep -A3 'Link Width'`, "
                "`lspci -vv` LnkSta: degraded width/speed), that P2P is really used (a 'CAN access "
                "peer' GPU pair can still copy slowly when IOMMU/ACS force traffic through the root "
                "complex), or lower the minimum if the hardware cannot do better.",
                slow=[list(p) for p in sorted(slow)], **stats))
        else:
            checks.append(Check("p2p-bandwidth", "pass", stat_text + (
                f" (>= {min_gbps:g})" if min_gbps is not None else ""), details=stats))

    if probe_p2p or p2p_read is not None:
        checks.append(Check("p2p-matrix", "pass", f"{n}x{n} pair matrix in details",
                            details={"matrix": render_p2p_matrix(n, p2p_read, probe_p2p),
                                     "gpus": n, "expected_count": expected_count}))
    return checks, env




P2P_RECORD_CHECKS = ("p2p-data", "p2p-bandwidth")


def p2p_record(checks: Iterable[Check], env: Mapping[str, str], policy: str) -> dict | None:
    """What a passed, full P2P test leaves on the host for later runs (no figures that vary
    between runs, so the file only changes when the verdict does). None unless it passed."""
    by_name = {c.name: c for c in checks}
    if any(by_name.get(n) is None or by_name[n].status != "pass" for n in P2P_RECORD_CHECKS):
        return None
    matrix = by_name.get("p2p-matrix")
    return {"gpus": (matrix.details.get("gpus") if matrix else None), "policy": policy,
            "nccl_env": dict(sorted(env.items())), "verified": list(P2P_RECORD_CHECKS)}



def use_p2p_record(checks: list[Check], env: dict[str, str], record: Mapping[str, Any],
                   service: str) -> tuple[list[Check], dict[str, str]]:
    """Checks and NCCL env when the peer copies were skipped because SERVICE is serving:
    the last full test's verdict (RECORD) stands for the copy and bandwidth checks."""
    kept = [c for c in checks if c.name not in P2P_RECORD_CHECKS]
    kept.append(Check("p2p-data", "pass",
                      f"peer copies skipped while {service} serves on these GPUs; the last full "
                      f"test on this host passed ({record.get('gpus')} GPUs, policy "
                      f"{record.get('policy')}); set gpu_p2p_test: always to copy anyway"))
    return kept, {**dict(record.get("nccl_env") or {}), **env}


