"""A multi-node group's decision (pure): does the group restart in this run, and why.

Made while the operations are prepared, by EVERY node of the group from every node's facts
(``shell.groupprep``), so that every node computes the same answer whatever order the nodes
are prepared in, and adds the same operations with static conditions. Nothing here reads
another node's operations or any state shared during the run.

A node's restart reasons are a pure function of a few values of its own host state and of
what this run renders for it (``NodeState``, ``Wanted``): the same reasons a single server's
restart follows (``service.restart_reasons``), plus ``not running`` and ``running, never
verified`` (a group's node starts with its group, never alone).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sglang_deploy.core.service import RESTART_TRIGGERS


@dataclass(frozen=True)
class NodeState:
    """The values of a node's host state its restart depends on."""

    active: bool                     # the unit's ActiveState is "active"
    running: bool                    # active, activating or reloading
    unverified: bool                 # it runs an invocation no deploy verified
    unit_sha256: str | None          # the installed unit file's
    secrets_sha256: str | None       # the installed secrets file's
    changing: tuple[str, ...] = ()   # of RESTART_TRIGGERS, those this run changes on it


@dataclass(frozen=True)
class Wanted:
    """What this run renders for a node (sha256 of its unit and secrets texts)."""

    unit_sha256: str
    secrets_sha256: str


def node_reasons(state: NodeState, wanted: Wanted) -> tuple[str, ...]:
    """Why this run (re)starts the node, in a fixed order; empty: nothing of its own."""
    reasons = []
    if wanted.unit_sha256 != state.unit_sha256:
        reasons.append("unit")
    if wanted.secrets_sha256 != state.secrets_sha256:
        reasons.append("secrets")
    reasons += [k for k in RESTART_TRIGGERS if k in state.changing]
    if not state.active:
        reasons.append("not running")
    elif not reasons and state.unverified:
        reasons.append("running, never verified")
    return tuple(reasons)


@dataclass(frozen=True)
class Decision:
    """The group's decision for this run: every node's reasons (rank order) and whether the
    group restarts (any node has one)."""

    nodes: tuple[str, ...]
    reasons: Mapping[str, tuple[str, ...]]
    running: Mapping[str, bool]

    @property
    def restart(self) -> bool:
        return any(self.reasons[n] for n in self.nodes)

    def of(self, node: str) -> tuple[str, ...]:
        return self.reasons[node]

    def texts(self) -> list[str]:
        """``node: reason, reason`` of each node that has one."""
        return [f"{n}: {', '.join(self.reasons[n])}" for n in self.nodes if self.reasons[n]]


def decide(nodes: Sequence[str], states: Mapping[str, NodeState],
           wanted: Mapping[str, Wanted]) -> Decision:
    """The decision of a group of NODES (rank order) from each node's STATES and WANTED."""
    return Decision(nodes=tuple(nodes),
                    reasons={n: node_reasons(states[n], wanted[n]) for n in nodes},
                    running={n: states[n].running for n in nodes})


def rollback_decision(nodes: Sequence[str], restarts: Mapping[str, bool],
                      running: Mapping[str, bool]) -> Decision:
    """A rollback's decision: a node that restores something or does not serve restarts the
    group (``service.rollback_plan``'s ``restart`` of each node: RESTARTS)."""
    return Decision(nodes=tuple(nodes),
                    reasons={n: ("known-good restored",) if restarts[n] else () for n in nodes},
                    running=dict(running))
