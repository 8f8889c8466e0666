"""A multi-node group inside one pyinfra run: the group pre-flight, the restart as one and
the verification as one, with fail-fast (the shell around ``core.group``).

pyinfra prepares each host's operations on its own, then runs operation N on every host in
parallel with a barrier before N+1. So every node of a group adds the same operations at the
same lines (they run together), and what the group decides is kept here, on the controller,
in one ``GroupRun`` per group and run:

- while preparing, each node registers what would (re)start it (a new release, new flags,
  a stopped unit...), its card (release, flags hash, driver) and whether it runs;
- ``restarting()``: the group restarts as one when any node wants it; read by the gated
  operations when they run, once every node is prepared (``Gate``);
- the group pre-flight (``preflight``): a real TCP rendezvous between the nodes (rank 0
  listens on its dist-init port and a port of NCCL's ephemeral range, the others connect),
  judged with the cards by ``core.group.judge_rendezvous``; any problem fails every node
  before any server of the group stops;
- the restart (``restart``): every node's unit stopped, then every node's started;
- the verification (``Watch``): rank 0 as a single server, then ready only when every other
  node is up (its dummy health server answers, which SGLang starts once its schedulers are
  ready); a node that fails stops itself and, through ``abort``, every other node, each
  saying which node failed and why, long before NCCL's or torch's distributed timeouts.

A converged group registers no reason: every gated operation is skipped, nothing restarts.
(``--dry`` shows the gated operations as conditional on a group's nodes: whether they run
depends on the other nodes; ``plan.changes`` leaves them out of the drift, and
``group_fields`` records the group's reasons instead.)
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass, field

from pyinfra import host, logger
from pyinfra.api import operation

from sglang_deploy.core import group as groupmod
from sglang_deploy.core.errors import GroupPreflightError, VerifyError
from sglang_deploy.shell.operations import _sh

#: state id and group name -> the group's run
_RUNS: dict[tuple[int, str], GroupRun] = {}


@dataclass
class GroupRun:
    """What one run knows of a group (controller side, shared by its nodes' operations)."""

    group: groupmod.Group
    probe: int                                   # the NCCL-range port of the rendezvous
    wants: dict[str, list[str]] = field(default_factory=dict)   # node -> its own reasons
    running: dict[str, bool] = field(default_factory=dict)      # node -> unit up or starting
    cards: dict[str, dict] = field(default_factory=dict)
    results: dict[str, dict | None] = field(default_factory=dict)  # rendezvous outputs
    problems: list[groupmod.Problem] | None = None               # judged once, when all in
    up: set[str] = field(default_factory=set)                    # nodes seen up in verify
    failed: tuple[str, str] | None = None                        # (node, why), the first
    ready: bool = False

    def register(self, node: str, wants: list[str], running: bool, card: dict) -> None:
        self.wants[node], self.running[node], self.cards[node] = list(wants), running, card

    def restarting(self) -> bool:
        """Does the group restart in this run (any node wants it)? Complete once every node
        is prepared: read it from operations only (``Gate``)."""
        return any(self.wants.values())

    def reasons(self) -> list[str]:
        return [f"{n}: {', '.join(w)}" for n, w in self.wants.items() if w]

    def go(self) -> bool:
        """The group restarts, and its pre-flight passed on every node."""
        return self.restarting() and self.problems == []

    def worker(self, node: str) -> bool:
        return self.group.rank_of(node) > 0


def run_of(state, group: groupmod.Group) -> GroupRun:
    """The run of GROUP in this pyinfra STATE (made when the first node asks)."""
    key = (id(state), group.name)
    if key not in _RUNS:
        _RUNS[key] = GroupRun(group, groupmod.probe_port(group, random.SystemRandom().randrange(1 << 30)))
    return _RUNS[key]


class Gate:
    """An ``_if`` of a group's operation: ``"restart"`` (the group restarts), ``"go"`` (it
    restarts and its pre-flight passed), ``"idle"`` (it does not restart). ``plan.changes``
    knows gates by this type: they are the group's decision, not this host's drift."""

    group_gate = True

    def __init__(self, run: GroupRun, when: str):
        self.run, self.when = run, when

    def __call__(self) -> bool:
        return {"restart": self.run.restarting, "go": self.run.go,
                "idle": lambda: not self.run.restarting()}[self.when]()


def group_fields(run: GroupRun, node: str) -> dict:
    """A node's group fields for the plan record (``status``): its group, rank, the group's
    nodes, and what would (re)start the group from this node (``group_wants``; the group's
    drift is every node's)."""
    return {"group": run.group.name, "node_rank": run.group.rank_of(node),
            "group_nodes": run.group.members(), "group_wants": list(run.wants.get(node, []))}


# ------------------------------------------------------------------ the group pre-flight
def _parse(stdout: str) -> dict | None:
    for line in reversed(stdout.strip().splitlines()):
        try:
            out = json.loads(line)
        except ValueError:
            continue
        if isinstance(out, dict):
            return out
    return None


def _wait_for(done, timeout_s: float, sleep=None) -> None:
    """Wait (cooperatively) until DONE() or TIMEOUT_S: the other nodes' greenlets fill the run."""
    import gevent

    sleep = sleep or gevent.sleep
    deadline = time.monotonic() + timeout_s
    while not done() and time.monotonic() < deadline:
        sleep(0.1)


def rendezvous(run: GroupRun, tool: str, python: str) -> None:
    """This node's part of the group pre-flight (run on every node at once): the rendezvous
    tool, then the verdict on every node's result; raises ``PreflightError`` naming each
    node pair that failed and the fix."""
    g, node = run.group, host.name
    argv = groupmod.rendezvous_argv(g, node, tool, run.cards[node], run.probe, python=python)
    _, output = host.run_shell_command(_sh(*argv), print_output=False)
    run.results[node] = _parse(output.stdout) if output is not None else None
    if run.results[node] is None:
        logger.warning(f"{host.print_prefix}rendezvous gave no result: "
                       f"{(output.stderr if output is not None else '')[-300:]}")
    _wait_for(lambda: len(run.results) == g.nnodes, groupmod.RENDEZVOUS_TIMEOUT_S + 15)
    if run.problems is None:
        run.problems = groupmod.judge_rendezvous(g, run.results, run.cards,
                                                 rank0_running=run.running.get(g.rank0, False))
    if run.problems:
        fixes = list(dict.fromkeys(p.fix for p in run.problems))
        raise GroupPreflightError(
            what=f"the pre-flight of group {g.name} ({', '.join(g.members())}) passes before "
                 "any of its servers stops: every node reaches rank 0 "
                 f"{g.addr} on {g.port} (dist-init) and {run.probe} (NCCL's range), same "
                 "release, flags and driver, clocks within "
                 f"{groupmod.CLOCK_SKEW_MAX_S:g}s",
            found="\n".join(p.text() for p in run.problems),
            fix="\n".join(fixes) + "\nnothing of the group was stopped; re-run the deploy")
    logger.info(f"{host.print_prefix}group {g.name}: rendezvous passed "
                f"({g.nnodes} nodes, ports {g.port} and {run.probe})")


@operation()
def group_service(service: str, action: str):
    """
    ``systemctl ACTION`` of a group's node, run on every node of the group at once (gate it
    with ``_if=Gate(run, "go")``): the group stops as one, then starts as one.

    + service: unit name without ``.service``
    + action: ``stop`` or ``start``

    **Example:**

    .. code:: python

        group_service(name="Stop the group's node", service="sglang", action="stop",
                      _if=Gate(run, "go"))
    """
    yield _sh("systemctl", action, f"{service}.service")


# ------------------------------------------------------------------ verified as one
class Watch:
    """A node's view of its group while it is verified (``verifyloop.wait_until_ready``)."""

    def __init__(self, run: GroupRun, node: str):
        self.run, self.node = run, node

    def abort(self) -> VerifyError | None:
        """Another node failed: the error this node stops with."""
        failed = self.run.failed
        if failed is None or failed[0] == self.node:
            return None
        g = self.run.group
        return VerifyError(
            what=f"every node of group {g.name} starts ({', '.join(g.members())})",
            found=f"node {failed[0]} failed: {failed[1]}; {self.node} was stopped with the "
                  "group, not left waiting for the distributed timeout",
            fix=f"read {failed[0]}'s error (above, or `sglang-deploy logs INVENTORY {failed[0]}`"
                " and `sglang-deploy explain-log`); fix it and re-run the deploy: the group "
                "starts again as one")

    def hold(self, decision) -> str | None:
        """None when this node's ready decision stands: a worker once rank 0 serves, rank 0
        once every other node is up; else what it waits on."""
        run, g = self.run, self.run.group
        if run.worker(self.node):
            run.up.add(self.node)
            return None if run.ready else f"up; waiting for rank 0 ({g.rank0}) to serve"
        missing = [n for n in g.members()[1:] if n not in run.up]
        if missing:
            return f"rank 0 serves; waiting for node(s) {', '.join(missing)} to be up"
        run.ready = True
        return None


def verify_node(run: GroupRun, service: str, verify):
    """Run VERIFY (this node's verification, given a ``Watch``); on any failure, record it
    for the group (the first one is the cause) and stop this node's unit, so that no node of
    a failed group is left waiting."""
    node = host.name
    try:
        return verify(Watch(run, node))
    except VerifyError as exc:
        if run.failed is None:
            run.failed = (node, (exc.found or exc.what).splitlines()[0])
        host.run_shell_command(_sh("systemctl", "stop", f"{service}.service"), print_output=False)
        if run.failed[0] == node:
            others = [n for n in run.group.members() if n != node]
            exc.fix = (exc.fix or "") + (f"\n{node} was stopped, and with it the group's other "
                                         f"node(s) {', '.join(others)}")
        raise
