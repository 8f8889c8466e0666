"""The fleet report (pure): what `sglang-deploy report` shows, from what the tool recorded.

Inputs are the records the tool already keeps on the controller: `status` rows, the per-host
verification summaries (``.sglang-deploy/reports/`` and each rollout's batch reports), the
last data-verified P2P matrix (``.sglang-deploy/p2p/``) and the benchmark records
(``.sglang-deploy/bench/<host>.jsonl``). :func:`build` turns them into ONE JSON document
(what ``--json`` prints); the HTML page is drawn from that document only, with the chart
geometry of :func:`timeline_bars` and :func:`bench_chart`.

A multi-node group (``core.group``) is shown as a unit: its nodes stand together in the
``hosts`` list, rank 0 first (the caller's order, ``core.groupstatus.ordered``), each host
names its ``group`` and ``node_rank``, and ``groups`` holds each group's state as `status`
judges it (``core.groupstatus``; ``unknown`` when status was not collected).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from sglang_deploy.core import groupstatus
from sglang_deploy.core.logs.markers import PHASES

if TYPE_CHECKING:  # for the annotations only
    from sglang_deploy.core.group import Group

REPORT_VERSION = 1
STATUS_FIELDS = ("reachable", "unit", "uptime_s", "release", "sglang_version", "patch_state",
                 "health", "models", "last_verified", "in_sync", "healthy", "changes", "problem",
                 "hardening", "gpu_health", "model_memory", "last_restart", "watchdog")


def _epoch(summary: Mapping[str, Any]) -> float:
    value = summary.get("verified_epoch_s")
    return float(value) if isinstance(value, (int, float)) else 0.0


def startup_of(summary: Mapping[str, Any]) -> dict[str, Any]:
    """A verification summary's startup as ordered phases with their start offsets."""
    durations = summary.get("phase_durations_s") or {}
    order = [p for p in PHASES if p in durations] + sorted(p for p in durations if p not in PHASES)
    phases, t = [], 0.0
    for name in order:
        seconds = float(durations[name])
        phases.append({"phase": name, "start_s": round(t, 3), "seconds": round(seconds, 3)})
        t += seconds
    return {"verified_at": summary.get("verified_at"), "action": summary.get("action"),
            "release": summary.get("release"), "time_to_ready_s": summary.get("time_to_ready_s"),
            "phases": phases}


def verifications(summaries: Iterable[Mapping[str, Any]]
                  ) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """(the latest verification, the latest one that started the server) of one host."""
    ordered = sorted(summaries, key=_epoch)
    if not ordered:
        return None, None
    last = ordered[-1]
    latest = {k: last.get(k) for k in ("action", "verified_at", "release", "sglang_version",
                                       "patch_state", "served_model_name", "time_to_ready_s")}
    started = [s for s in ordered if s.get("phase_durations_s")]
    return latest, (startup_of(started[-1]) if started else None)


def bench_history(entries: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The host's benchmark records (``current`` of each local entry), oldest first, one per
    run, each with its configuration's number (1 = the first configuration seen)."""
    seen, records = set(), []
    for entry in entries:
        rec = entry.get("current") if isinstance(entry, Mapping) else None
        if not isinstance(rec, Mapping) or not isinstance(rec.get("output_tok_s"), Mapping):
            continue
        key = (rec.get("identity"), rec.get("time"))
        if key in seen:
            continue
        seen.add(key)
        records.append(rec)
    records.sort(key=lambda r: r.get("time") or 0)
    configs: dict[str, int] = {}
    out = []
    for rec in records:
        number = configs.setdefault(str(rec.get("identity")), len(configs) + 1)
        out.append({"time": rec.get("time"), "time_iso": rec.get("time_iso"),
                    "identity": rec.get("identity"), "config": number,
                    "release": rec.get("release"), "unit_sha256": rec.get("unit_sha256"),
                    "output_tok_s": {str(k): float(v) for k, v in
                                     sorted(rec["output_tok_s"].items(), key=lambda kv: int(kv[0]))}})
    return out


def host_entry(name: str, row: Mapping[str, Any] | None, p2p: Mapping[str, Any] | None,
               summaries: Sequence[Mapping[str, Any]], bench: Sequence[Mapping[str, Any]],
               groups: Mapping[str, Group] | None = None) -> dict[str, Any]:
    latest, startup = verifications(summaries)
    status = {k: (row or {}).get(k) for k in STATUS_FIELDS}
    status["state"] = ("unknown" if row is None else "unreachable" if row.get("reachable") is not True
                       else "healthy" if row.get("healthy") and row.get("in_sync")
                       else "drifted" if row.get("healthy") else "unhealthy")
    return {
        "host": name,
        **groupstatus.node_fields(groups or {}, name),
        "status": status,
        "p2p": None if not p2p else {k: p2p.get(k) for k in ("measured_at", "gpus", "min_gbps",
                                                            "policy", "cells", "checks")},
        "verification": latest,
        "startup": startup,
        "bench": bench_history(bench),
    }


def build(inventory: str, hosts: Sequence[str], rows: Sequence[Mapping[str, Any]] | None,
          summaries: Mapping[str, Sequence[Mapping[str, Any]]],
          p2p: Mapping[str, Mapping[str, Any]], bench: Mapping[str, Sequence[Mapping[str, Any]]],
          generated_at: str, groups: Mapping[str, Group] | None = None) -> dict[str, Any]:
    """The report document. ROWS: `status` rows (None: status not collected); GROUPS: the
    inventory's multi-node groups (``core.group.plan``), HOSTS already in the order to show."""
    by_host = {r["host"]: r for r in rows or []}
    groups = groups or {}
    entries = [host_entry(h, by_host.get(h) if rows is not None else None, p2p.get(h),
                          summaries.get(h) or [], bench.get(h) or [], groups) for h in hosts]
    states = [e["status"]["state"] for e in entries]
    shown = [g for g in groups.values() if set(g.members()) & set(hosts)]
    if rows is not None:
        group_states = groupstatus.states([by_host[h] for h in hosts if h in by_host],
                                          {g.name: g for g in shown})
    else:
        group_states = [groupstatus.unknown(g) for g in shown]
    return {"version": REPORT_VERSION, "inventory": inventory, "generated_at": generated_at,
            "status_collected": rows is not None,
            "summary": {"hosts": len(entries), **{s: states.count(s) for s in
                                                  ("healthy", "drifted", "unhealthy", "unreachable",
                                                   "unknown")}},
            "hosts": entries, "groups": group_states}


# ------------------------------------------------------------------------- chart geometry

_VERDICT_COLOURS = {"self": "#f4f4f4", "BAD": "#d9534f", "ERR": "#d9534f", "hst": "#c77dd1",
                    "--": "#e6e6e6", "OK": "#e6e6e6", None: "#e6e6e6"}


def heat_colour(cell: Mapping[str, Any]) -> str:
    """CSS colour of a heatmap cell: greens by bandwidth when verified, as on the terminal."""
    verdict = cell.get("verdict")
    if verdict == "ok":
        heat = cell.get("heat")
        heat = 1.0 if heat is None else heat
        return f"hsl(125, 55%, {round(82 - 40 * float(heat))}%)"
    return _VERDICT_COLOURS.get(verdict, "#f0c419")


PHASE_COLOURS = {"starting": "#9aa5b1", "loading": "#4e79a7", "loaded": "#76b7b2",
                 "kv_cache": "#59a14f", "autotune": "#f28e2b", "autotuned": "#edc948",
                 "capture": "#b07aa1", "captured": "#ff9da7", "http": "#9c755f",
                 "warmup": "#e15759", "ready": "#bab0ac"}


def timeline_bars(startup: Mapping[str, Any] | None, width: float = 640.0) -> list[dict[str, Any]]:
    """One bar per phase on a WIDTH-pixel axis (zero-length phases get a hairline)."""
    phases = (startup or {}).get("phases") or []
    total = sum(p["seconds"] for p in phases) or 1.0
    scale = width / total
    return [{**p, "x": round(p["start_s"] * scale, 2), "w": round(max(p["seconds"] * scale, 1.0), 2),
             "colour": PHASE_COLOURS.get(p["phase"], "#999")} for p in phases]


LEVEL_COLOURS = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1")


def _nice_max(value: float) -> float:
    if value <= 0:
        return 1.0
    step = 10 ** (len(str(int(value))) - 1)
    return float(-(-value // step) * step)


def bench_chart(history: Sequence[Mapping[str, Any]], width: float = 640.0,
                height: float = 200.0) -> dict[str, Any]:
    """Grouped bars: one group per run (oldest left), one bar per concurrency level."""
    levels = sorted({int(k) for run in history for k in run["output_tok_s"]})
    top = _nice_max(max((v for run in history for v in run["output_tok_s"].values()), default=0))
    group_w = width / max(len(history), 1)
    bar_w = group_w * 0.8 / max(len(levels), 1)
    bars, groups = [], []
    for g, run in enumerate(history):
        x0 = g * group_w + group_w * 0.1
        groups.append({"x": round(g * group_w + group_w / 2, 2), "config": run["config"],
                       "time_iso": run.get("time_iso") or "", "identity": run["identity"],
                       "boundary": g > 0 and history[g - 1]["config"] != run["config"],
                       "left": round(g * group_w, 2)})
        for k, level in enumerate(levels):
            value = run["output_tok_s"].get(str(level))
            if value is None:
                continue
            h = height * value / top
            bars.append({"x": round(x0 + k * bar_w, 2), "y": round(height - h, 2),
                         "w": round(bar_w * 0.92, 2), "h": round(h, 2), "value": value,
                         "concurrency": level, "identity": run["identity"], "run": g,
                         "colour": LEVEL_COLOURS[k % len(LEVEL_COLOURS)]})
    ticks = [{"y": round(height - height * f, 2), "value": round(top * f)} for f in (0, 0.25, 0.5, 0.75, 1)]
    return {"bars": bars, "groups": groups, "ticks": ticks, "top": top,
            "levels": [{"concurrency": lv, "colour": LEVEL_COLOURS[k % len(LEVEL_COLOURS)]}
                       for k, lv in enumerate(levels)]}
