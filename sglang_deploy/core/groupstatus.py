"""Multi-node groups in `status` and the report (pure): a group judged as one unit.

A group (``core.group.Group``) serves through its rank 0, which serves the full HTTP API;
every other node serves only SGLang's dummy health server on the same port (``/health``
answers 200 once its schedulers are ready, there is no ``/v1/models``). So a node of rank
>= 1 is judged by its unit (``active/running``) and ``/health`` 200 only, never by the model
list, and rank 0 by the host's own ``healthy`` (``/health`` 200 and its unit running).

A group is ``serving`` when rank 0 serves and every other node is alive, ``degraded`` when
rank 0 serves but a node is not alive, ``down`` otherwise; ``problem`` names the nodes and
what is wrong with each (None when serving). Status rows are the ``status`` command's
(``commands.status.rows_from_plans``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # for the annotations only
    from sglang_deploy.core.group import Group

SERVING, DEGRADED, DOWN = "serving", "degraded", "down"
STATES = (SERVING, DEGRADED, DOWN)


def group_of(groups: Mapping[str, Group], host: str) -> Group | None:
    """The group HOST is a node of (``core.group.group_of``, without importing it)."""
    return next((g for g in groups.values() if host in g.members()), None)


def node_fields(groups: Mapping[str, Group], host: str) -> dict[str, Any]:
    """``group`` (name or None) and ``node_rank`` (int or None) of HOST."""
    g = group_of(groups, host)
    return {"group": g.name if g else None, "node_rank": g.rank_of(host) if g else None}


def annotate(rows: Iterable[Mapping[str, Any]], groups: Mapping[str, Group]) -> list[dict[str, Any]]:
    """ROWS, each with its host's ``group`` and ``node_rank`` (new dicts)."""
    return [{**r, **node_fields(groups, r["host"])} for r in rows]


def widen(selected: Iterable[str], groups: Mapping[str, Group]) -> set[str]:
    """SELECTED plus every node of a group it names part of: a group is looked at whole."""
    chosen = set(selected)
    for g in groups.values():
        if chosen & set(g.members()):
            chosen |= set(g.members())
    return chosen


def ordered(names: Sequence[str], groups: Mapping[str, Group]) -> list[str]:
    """NAMES in their order, except that a group's nodes stand together, rank 0 first, where
    the first of them stood."""
    out: list[str] = []
    present = set(names)
    for name in names:
        if name in out:
            continue
        g = group_of(groups, name)
        out.extend([n for n in g.members() if n in present] if g else [name])
    return out


def node_alive(row: Mapping[str, Any] | None) -> bool:
    """A node of rank >= 1: reachable, its unit active/running and ``/health`` 200 (it serves
    no ``/v1/models``: the model list is not asked of it)."""
    return row is not None and bool(row) and row.get("reachable") is True \
        and row.get("preflight") != "fail" \
        and row.get("unit") == "active/running" and row.get("health") == 200


def rank0_serves(row: Mapping[str, Any] | None) -> bool:
    """Rank 0: the host's own ``healthy`` (what a single host is judged by)."""
    return row is not None and bool(row) and row.get("reachable") is True \
        and row.get("healthy") is True


def what_is_wrong(row: Mapping[str, Any] | None) -> str:
    """A few words on why a node is not alive (one line)."""
    if not row:
        return "not looked at"
    if row.get("reachable") is not True or row.get("preflight") == "fail":
        lines = [ln.strip() for ln in str(row.get("problem") or "").splitlines() if ln.strip()]
        return lines[0] if lines else ("unreachable" if row.get("reachable") is False else "no result")
    parts = []
    if row.get("unit") != "active/running":
        parts.append(f"unit {row.get('unit') or '?'}")
    if row.get("health") != 200:
        parts.append(f"/health {row.get('health') or 'no answer'}")
    return ", ".join(parts) or "not healthy"


def state_of(group: Group, rows_by_host: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """GROUP's entry: ``name``, ``nodes`` (rank order), ``dist_init_addr``, ``state`` and
    ``problem`` (None when serving)."""
    rank0 = rows_by_host.get(group.rank0)
    others = [f"{n.name} (rank {n.rank}): {what_is_wrong(rows_by_host.get(n.name))}"
              for n in group.nodes[1:] if not node_alive(rows_by_host.get(n.name))]
    if not rank0_serves(rank0):
        state = DOWN
        problem = "; ".join([f"{group.rank0} (rank 0) does not serve: {what_is_wrong(rank0)}",
                             *others])
    elif others:
        state, problem = DEGRADED, "; ".join(others)
    else:
        state, problem = SERVING, None
    return {"name": group.name, "nodes": group.members(), "dist_init_addr": group.dist_init_addr,
            "state": state, "problem": problem}


def states(rows: Iterable[Mapping[str, Any]], groups: Mapping[str, Group]) -> list[dict[str, Any]]:
    """One entry per group with a node among ROWS, in the groups' (inventory) order."""
    by_host = {r["host"]: r for r in rows}
    return [state_of(g, by_host) for g in groups.values() if set(g.members()) & set(by_host)]


def unknown(group: Group) -> dict[str, Any]:
    """GROUP's entry when nothing was looked at (the report without status)."""
    return {"name": group.name, "nodes": group.members(), "dist_init_addr": group.dist_init_addr,
            "state": "unknown", "problem": None}
