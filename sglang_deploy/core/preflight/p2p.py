"""P2P (pure): the data-verified peer copies and the topology claims -> checks, the matrix
shown to the operator, and the verdict a passed full test leaves on the host."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

from sglang_deploy.core.hostrecords import P2PVerified
from sglang_deploy.core.preflight.checks import Check, _fail
from sglang_deploy.core.topo import TopoMatrix

if TYPE_CHECKING:
    from rich.text import Text

# ---------------------------------------------------------------------------------------
# P2P

P2P_FIX = (
    "Enable P2P on the host: IOMMU off or passthrough (`iommu=pt` / `amd_iommu=pt`), ACS "
    "disabled on the PCIe switches and root ports, BIOS 'Above 4G decoding' and 'Re-size BAR' "
    "on; GeForce cards report GNS and cannot be fixed. Or set the p2p policy to 'adapt' to run "
    "with NCCL_P2P_DISABLE=1 (all-reduce through host memory, slower)."
)


#: verdict of one GPU pair in the matrix (3 characters at most, so 8 GPUs fit 80 columns)
VERDICTS = {
    "ok": "bytes verified after the copy",
    "low": "verified, below the minimum bandwidth",
    "BAD": "data differs after the copy (corruption)",
    "ERR": "the copy failed",
    "hst": "no peer access: copied through host memory",
    "--": "not tested",
}


def p2p_cells(
    n: int,
    p2p_read: Mapping[tuple[int, int], str] | None = None,
    probe_p2p: Sequence[Mapping[str, Any]] | None = None,
    min_gbps: float | None = None,
) -> list[dict[str, Any]]:
    """One cell per ordered GPU pair, row-major (source row, destination column), diagonal
    included (verdict ``self``). ``verdict``: a key of :data:`VERDICTS`, or the
    ``nvidia-smi topo -p2p r`` code when that is all there is or when it contradicts a good
    copy (``CNS``, ``GNS``...). ``heat``: GB/s over the best measured pair (0..1)."""
    by_pair = {(int(e["src"]), int(e["dst"])): e for e in probe_p2p or []}
    measured = [float(e["gbps"]) for e in by_pair.values() if e.get("gbps") is not None]
    best = max(measured) if measured else None
    cells: list[dict[str, Any]] = []
    for i in range(n):
        for j in range(n):
            entry = by_pair.get((i, j))
            code = (p2p_read or {}).get((i, j))
            gbps = float(entry["gbps"]) if entry is not None and entry.get("gbps") is not None else None
            if i == j:
                verdict = "self"
            elif entry is None:
                verdict = code or "--"
            elif entry.get("verified") is False:
                verdict = "BAD"
            elif entry.get("error") and entry.get("verified") is not True:
                verdict = "ERR"
            elif entry.get("can_access") is False:
                verdict = "hst"
            elif code not in (None, "OK"):
                verdict = code
            elif gbps is not None and min_gbps is not None and gbps < min_gbps:
                verdict = "low"
            elif entry.get("verified") is True:
                verdict = "ok"
            else:
                verdict = "--"
            cells.append({"src": i, "dst": j, "verdict": verdict, "code": code,
                          "gbps": None if gbps is None else round(gbps, 2),
                          "heat": None if gbps is None or not best else round(gbps / best, 3),
                          "error": (entry or {}).get("error")})
    return cells


def _gbps_text(gbps: float | None, compact: bool) -> str:
    if gbps is None:
        return "-"
    return f"{gbps:.0f}" if compact or gbps >= 99.95 else f"{gbps:.1f}"


def cell_style(cell: Mapping[str, Any]) -> str:
    """rich style of a cell: green by bandwidth when good, yellow when slow or disputed,
    red when broken, magenta through host, dim when untested."""
    verdict, heat = cell["verdict"], cell.get("heat")
    if verdict == "self":
        return "dim"
    if verdict == "ok":
        if heat is None:
            return "black on green3"
        return ("black on green1" if heat >= 0.9 else "black on green3" if heat >= 0.75
                else "white on green4" if heat >= 0.5 else "white on dark_green")
    if verdict in ("BAD", "ERR"):
        return "bold white on red3"
    if verdict == "hst":
        return "black on magenta"
    if verdict in ("--", "OK"):
        return "dim"
    return "black on yellow3"


def matrix_lines(cells: Sequence[Mapping[str, Any]], n: int, min_gbps: float | None = None,
                 width: int = 80) -> list[list[tuple[str, str]]]:
    """The matrix as lines of (text, rich style) segments, at most WIDTH columns when it can:
    ``GB/s verdict`` per cell (9 columns each: 8 GPUs in 77), else a compact form (4 columns:
    whole GB/s when ok, the verdict otherwise)."""
    compact = 5 + 9 * n > width
    grid = {(c["src"], c["dst"]): c for c in cells}
    lines: list[list[tuple[str, str]]] = [
        [("     ", "")]
        + [((f" {j:>3}" if compact else f"{'GPU' + str(j):^9}"), "bold") for j in range(n)]]
    if not compact:  # "src\dst" takes 7 columns: the first header shifts left by 2
        lines[0][1] = (lines[0][1][0][2:], "bold")
    for i in range(n):
        row: list[tuple[str, str]] = [(f"GPU{i}".ljust(5), "bold")]
        for j in range(n):
            c = grid.get((i, j)) or {"verdict": "--", "gbps": None}
            if c["verdict"] == "self":
                text = "  X" if compact else "    X   "
            elif compact:
                text = f"{(_gbps_text(c['gbps'], True) if c['verdict'] == 'ok' else c['verdict'])[:3]:>3}"
            else:
                text = f"{_gbps_text(c['gbps'], False):>4} {c['verdict'][:3]:<3}"
            row += [(" ", ""), (text, cell_style(c))]
        lines.append(row)
    low = f"below {min_gbps:g} GB/s" if min_gbps is not None else "below the minimum"
    if compact:
        lines.append([("rows: source GPU, columns: destination; cell: GB/s if ok, else verdict",
                       "")])
    else:
        lines.append([("rows: source GPU, columns: destination; cell: GB/s of the verified "
                       "copy, verdict", "")])
    legend = [("ok", "verified"), ("low", low), ("BAD", "corrupted"), ("ERR", "copy failed"),
              ("hst", "via host memory (no peer access)"), ("--", "not tested"),
              ("CNS..", "nvidia-smi topo -p2p r code")]
    line: list[tuple[str, str]] = [("verdict:", "")]
    used = len("verdict:")
    for key, meaning in legend:
        piece = f" {key} {meaning},"
        if used + len(piece) > width:
            lines.append(line)
            line, used = [("        ", "")], 8
        sample = {"verdict": key if key != "CNS.." else "CNS", "heat": 1.0}
        line += [(" ", ""), (key, cell_style(sample)), (f" {meaning},", "")]
        used += len(piece)
    line[-1] = (line[-1][0].rstrip(","), "")
    lines.append(line)
    return lines


def plain_matrix(cells: Sequence[Mapping[str, Any]], n: int, min_gbps: float | None = None,
                 width: int = 80) -> str:
    """Plain-text matrix (see :func:`matrix_lines`), one row per source GPU."""
    return "\n".join("".join(t for t, _ in line).rstrip()
                     for line in matrix_lines(cells, n, min_gbps, width))


def rich_matrix(cells: Sequence[Mapping[str, Any]], n: int, min_gbps: float | None = None,
                width: int = 80) -> Text:
    """The same matrix as a rich ``Text`` with the heatmap colours."""
    from rich.text import Text

    text = Text()
    for k, line in enumerate(matrix_lines(cells, n, min_gbps, width)):
        if k:
            text.append("\n")
        for segment, style in line:
            text.append(segment, style=style or None)
    return text


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
    * ``p2p-matrix`` - informational, ``details["matrix"]`` holds :func:`plain_matrix`.

    The GPUs are those the inputs name (a missing GPU is the count checks' business);
    ``expected_count`` is recorded in the matrix check. One GPU has no pair to test: the
    three checks pass and say so.
    """
    if policy not in ("require", "adapt"):
        raise ValueError(f"p2p policy must be 'require' or 'adapt', not {policy!r}")
    env: dict[str, str] = {}
    probe_p2p = list(probe_p2p or [])
    gpu_ids = _gpu_ids(topo, p2p_read, p2p_write, probe_p2p)
    n = max(gpu_ids) + 1 if gpu_ids else 0  # GPU indices are 0..n-1
    checks = [_topology_check(topo)]
    if n == 1 or (n == 0 and expected_count == 1):
        checks += [Check(name, "pass", "one GPU: no pair to test", details={"gpus": 1})
                   for name in ("p2p-support", "p2p-data", "p2p-bandwidth")]
        return checks, env
    if n < 2:
        checks += [Check(name, "skipped", "no P2P information (topo -m/-p2p or CUDA probe)")
                   for name in ("p2p-support", "p2p-data", "p2p-bandwidth")]
        return checks, env
    pairs = [(i, j) for i in range(n) for j in range(n) if i != j]
    by_pair = {(int(e["src"]), int(e["dst"])): e for e in probe_p2p}
    checks += _support_checks(pairs, p2p_read, p2p_write, by_pair, policy, env)
    checks.append(_data_check(pairs, by_pair))
    checks.append(_bandwidth_check(by_pair, min_gbps))
    if probe_p2p or p2p_read is not None:
        cells = p2p_cells(n, p2p_read, probe_p2p, min_gbps)
        checks.append(Check("p2p-matrix", "pass", f"{n}x{n} pair matrix in details",
                            details={"matrix": plain_matrix(cells, n, min_gbps), "cells": cells,
                                     "min_gbps": min_gbps, "gpus": n,
                                     "expected_count": expected_count}))
    return checks, env


def _gpu_ids(topo: TopoMatrix | None, p2p_read: Mapping[tuple[int, int], str] | None,
             p2p_write: Mapping[tuple[int, int], str] | None,
             probe_p2p: Sequence[Mapping[str, Any]]) -> set[int]:
    """Every GPU index the inputs name."""
    gpu_ids: set[int] = set(topo.gpu_indices) if topo is not None else set()
    for matrix in (p2p_read, p2p_write):
        for i, j in (matrix or {}):
            gpu_ids.update((i, j))
    for e in probe_p2p:
        gpu_ids.update((int(e["src"]), int(e["dst"])))
    return gpu_ids


def _topology_check(topo: TopoMatrix | None) -> Check:
    if topo is None:
        return Check("topology", "skipped", "no `nvidia-smi topo -m` output")
    return Check("topology", "pass",
                 f"{topo.gpu_count} GPU{'s' * (topo.gpu_count != 1)}; links: "
                 + (", ".join(f"{k} x{v}" for k, v in topo.link_counts().items()) or "none"),
                 details={"links": topo.link_counts(), "nics": topo.nics})


def _support_checks(pairs: list[tuple[int, int]], p2p_read: Mapping[tuple[int, int], str] | None,
                    p2p_write: Mapping[tuple[int, int], str] | None,
                    by_pair: Mapping[tuple[int, int], Mapping[str, Any]], policy: str,
                    env: dict[str, str]) -> list[Check]:
    """``p2p-support`` (nvidia-smi's read/write matrices and CUDA's peer access) and, when
    they disagree, ``p2p-consistency``. Policy 'adapt' puts NCCL_P2P_DISABLE in ENV."""
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
    if by_pair:
        sources.append("CUDA")
        for pair, e in by_pair.items():
            if e.get("can_access") is False:
                unsupported.setdefault(pair, "CUDA: no peer access")
            elif e.get("error") and "cuCtxEnablePeerAccess" in str(e.get("error")):
                unsupported.setdefault(pair, "CUDA: enabling peer access failed")
    checks = [_support_check(pairs, unsupported, sources, policy, env)]
    smi_ok = {p for p in pairs if (p2p_read or {}).get(p) == "OK"} if p2p_read is not None else set()
    disagree = sorted(smi_ok & {p for p, e in by_pair.items() if e.get("can_access") is False})
    if disagree:
        checks.append(Check("p2p-consistency", "warn",
                            "nvidia-smi reports P2P OK but CUDA cannot access the peer on "
                            + _pairs_text(disagree),
                            found=_pairs_text(disagree)))
    return checks


def _support_check(pairs: list[tuple[int, int]], unsupported: Mapping[tuple[int, int], str],
                   sources: list[str], policy: str, env: dict[str, str]) -> Check:
    if not sources:
        return Check("p2p-support", "skipped", "no P2P information (topo -p2p or CUDA probe)")
    if not unsupported:
        return Check("p2p-support", "pass",
                     f"P2P reported on all {len(pairs)} pairs ({', '.join(sources)})")
    found = _pairs_text(unsupported, unsupported)
    if policy == "require":
        return _fail(
            "p2p-support", f"P2P unavailable on {len(unsupported)} of {len(pairs)} GPU pairs",
            expected="P2P between every GPU pair (policy 'require')", found=found, fix=P2P_FIX,
            pairs=[list(p) for p in sorted(unsupported)])
    env["NCCL_P2P_DISABLE"] = "1"
    return Check(
        "p2p-support", "warn",
        f"P2P unavailable on {len(unsupported)} of {len(pairs)} GPU pairs: running with "
        "NCCL_P2P_DISABLE=1 (policy 'adapt'; all-reduce goes through host memory)",
        expected="P2P between every GPU pair", found=found, fix=P2P_FIX,
        details={"pairs": [list(p) for p in sorted(unsupported)], "nccl_env": dict(env)})


def _data_check(pairs: list[tuple[int, int]],
                by_pair: Mapping[tuple[int, int], Mapping[str, Any]]) -> Check:
    """``p2p-data``: corrupt, failed or untested pairs fail."""
    if not by_pair:
        return Check("p2p-data", "skipped", "CUDA probe did not run the P2P copy test")
    bad = sorted(p for p, e in by_pair.items() if e.get("verified") is False)
    errored = {p: str(e.get("error")) for p, e in by_pair.items()
               if e.get("verified") is None and e.get("error")}
    untested = sorted(p for p in pairs if p not in by_pair)
    if not (bad or errored or untested):
        return Check("p2p-data", "pass", f"data verified on all {len(by_pair)} pairs")
    parts = []
    if bad:
        parts.append("data differs after copy: " + _pairs_text(bad))
    if errored:
        parts.append("copy failed: " + _pairs_text(errored, errored))
    if untested:
        parts.append("not tested (probe stopped): " + _pairs_text(untested))
    return _fail(
        "p2p-data",
        f"GPU-to-GPU copies are broken on {len(bad) + len(errored) + len(untested)} pairs"
        + (" (silent corruption)" if bad else ""),
        expected="bytes copied GPU->GPU arrive unchanged on every pair",
        found="; ".join(parts),
        fix="Do not serve from this host: corrupt or failing peer copies break tensor "
        "parallelism whatever NCCL does. " + P2P_FIX.split(" Or set")[0]
        + " Check the host's dmesg for IOMMU/AER errors.",
        corrupt=[list(p) for p in bad], failed=[list(p) for p in errored],
        untested=[list(p) for p in untested])


def _bandwidth_check(by_pair: Mapping[tuple[int, int], Mapping[str, Any]],
                     min_gbps: float | None) -> Check:
    """``p2p-bandwidth``: the measured pairs against MIN_GBPS."""
    measured = {p: float(e["gbps"]) for p, e in by_pair.items() if e.get("gbps") is not None}
    if not measured:
        return Check("p2p-bandwidth", "skipped", "no bandwidth measured")
    values = sorted(measured.values())
    stats = {"min": values[0], "median": statistics.median(values), "max": values[-1]}
    slow = {p: v for p, v in measured.items() if min_gbps is not None and v < min_gbps}
    if not slow:
        return Check("p2p-bandwidth", "pass",
                     f"min {stats['min']:.1f}, median {stats['median']:.1f}, max "
                     f"{stats['max']:.1f} GB/s"
                     + (f" (>= {min_gbps:g})" if min_gbps is not None else ""), details=stats)
    paths = {p: f"{v:.1f} GB/s" + ("" if by_pair[p].get("can_access") else ", via host")
             for p, v in slow.items()}
    return _fail(
        "p2p-bandwidth", f"{len(slow)} pairs below {min_gbps:g} GB/s",
        expected=f">= {min_gbps:g} GB/s on every pair", found=_pairs_text(slow, paths),
        fix="Check the PCIe links on the host (`nvidia-smi -q | grep -A3 'Link Width'`, "
        "`lspci -vv` LnkSta: degraded width/speed), that P2P is really used (a 'CAN access "
        "peer' GPU pair can still copy slowly when IOMMU/ACS force traffic through the root "
        "complex), or lower the minimum if the hardware cannot do better.",
        slow=[list(p) for p in sorted(slow)], **stats)


P2P_RECORD_CHECKS = ("p2p-data", "p2p-bandwidth")


def p2p_record(checks: Iterable[Check], env: Mapping[str, str], policy: str
               ) -> dict[str, Any] | None:
    """What a passed, full P2P test leaves on the host for later runs (no figures that vary
    between runs, so the file only changes when the verdict does). None unless it passed."""
    by_name = {c.name: c for c in checks}
    if any(by_name.get(n) is None or by_name[n].status != "pass" for n in P2P_RECORD_CHECKS):
        return None
    matrix = by_name.get("p2p-matrix")
    gpus = (matrix or by_name["p2p-data"]).details.get("gpus")  # one GPU: no matrix
    return {"gpus": gpus, "policy": policy,
            "nccl_env": dict(sorted(env.items())), "verified": list(P2P_RECORD_CHECKS)}


def use_p2p_record(checks: list[Check], env: dict[str, str], record: P2PVerified,
                   service: str, policy: str | None = None) -> tuple[list[Check], dict[str, str]]:
    """Checks and NCCL env when the peer copies were skipped because SERVICE is serving:
    the last full test's verdict (RECORD) stands for the copy and bandwidth checks. Under
    another POLICY than the record's, a verdict that turned P2P off (``adapt``: its NCCL env)
    does not stand: the unit is planned without that env, and the check warns that P2P is
    proven by the retest before the restart this brings."""
    kept = [c for c in checks if c.name not in P2P_RECORD_CHECKS]
    recorded_env = dict(record.nccl_env)
    was = record.policy
    if policy is not None and was != policy and recorded_env:
        found = " ".join(f"{k}={v}" for k, v in sorted(recorded_env.items()))
        kept.append(Check("p2p-data", "warn",
                          f"the last full P2P test on this host passed only with {found} "
                          f"(policy {was}); with policy {policy} the unit is planned without "
                          f"it, and P2P is retested, with {service} stopped, before it restarts",
                          fix="nothing to do: the deploy retests P2P before the restart (it "
                              f"fails there, leaving {service} stopped, if P2P still does not "
                              f"work); set gpu_p2p_policy: {was} to keep serving without P2P"))
        return kept, dict(env)
    kept.append(Check("p2p-data", "pass",
                      f"peer copies skipped while {service} serves on these GPUs; the last full "
                      f"test on this host passed ({record.gpus} GPUs, policy "
                      f"{was}); set gpu_p2p_test: always to copy anyway"))
    return kept, {**recorded_env, **env}
