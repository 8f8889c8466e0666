"""A multi-node group inside one pyinfra run: the group pre-flight, the restart as one and
the verification as one, with fail-fast (the shell around ``core.group``).

pyinfra prepares every host's operations first, then runs operation N on every host (in a
pool of ``config.PARALLEL`` greenlets: ``--parallel N`` runs them N at a time) and only then
N+1. So every node of a group adds the SAME operations, and no operation ever waits for another host's operation, which may not be
running (pool full): a wait is only ever on a host-side process that an EARLIER operation
started on every node (the barrier between operations guarantees they all started).

The group's decision (does it restart, and why) is made once per run while the nodes are
prepared, from every node's facts (``groupprep``, ``core.restart``), and kept on the group's
run (``GroupRun.decision``, a ``Once``: made by the first node prepared, never replaced):
every node adds the same operations, their conditions static (``Decided``). What the nodes
share during the run are execute-time results only, append-only (``core.group.Results``:
each node appends its own observation, nothing replaces another's), in one ``GroupRun`` per
group, in the run object's ``GroupRuns`` (``integration.ThisRun.groups``: made when the run
starts, released at its end). No verdict is kept: each node judges for itself, from the same
results, with the pure judges of ``core.group``:

- the group pre-flight, three operations: ``rendezvous_started`` starts the rendezvous tool
  in the background on every node (rank 0 listens, the others connect, each with its own
  deadline, its result in a file), ``rendezvous_collect`` waits for this node's result on
  its own host and appends it, ``rendezvous_judge`` judges every node's result with every
  node's card (``core.group.rendezvous_verdict``) and fails every node before any server of
  the group stops;
- the restart (``group_service``): every node's unit stopped, then every node's started;
- the verification, three operations: the workers (rank >= 1: their /health), then rank 0
  (it serves), each on its own host, its verification or its failure appended and a failed
  node's unit stopped but nothing raised (a node verified later sees the failure before its
  first poll and stops at once: fail-fast, ``Watch.abort``); then ``group_ready`` on every
  node (``core.group.verdict``): the group is ready when every node was verified (each
  keeps its record), else every node stops and fails, naming the node that failed and why.

A converged group adds none of these: nothing restarts. (``plan.changes`` knows the group's
operations by their condition, ``Decided``, and leaves them out of a node's own drift;
``group_fields`` records the node's reasons instead.)
"""

from __future__ import annotations

import json
import random
import secrets as secretsmod
from dataclasses import dataclass, field

from pyinfra import host, logger
from pyinfra.api import operation

from sglang_deploy.core import group as groupmod
from sglang_deploy.core import unitstart
from sglang_deploy.core.errors import GroupPreflightError, VerifyError
from sglang_deploy.hostops.operations import _sh
from sglang_deploy.integration.integration import run_of as run_object_of

#: where a node's rendezvous tool writes its result (one file per run and node)
RESULTS_DIR = "/run/sglang-deploy"
#: how long past the tool's own deadline its result may take to appear (seconds)
COLLECT_GRACE_S = 15.0


class Once:
    """A value made once, by the first caller's MAKE, and never replaced: a group's decision,
    made while the first of its nodes is prepared and given as is to every other node (a MAKE
    that raises makes nothing: the next caller's MAKE runs)."""

    def __init__(self) -> None:
        self._made = False
        self._value: object = None

    def get(self, make):
        if not self._made:
            self._value = make()
            self._made = True
        return self._value


@dataclass(frozen=True)
class GroupRun:
    """What a group's nodes share while one run executes (controller side): its ports and
    files, the decision made once while its nodes were prepared, and the nodes' results,
    append-only (``core.group.Results``: each node appends its own observation; every
    verdict is judged by each node from them, none kept)."""

    group: groupmod.Group
    probe: int                                   # the NCCL-range port of the rendezvous
    token: str = field(default_factory=lambda: secretsmod.token_hex(6))  # this run's files
    results: groupmod.Results = field(default_factory=groupmod.Results)
    #: the group's decision (``hostplan.Prepared``), made once while the first node is
    #: prepared (``groupprep.decide``), before anything executes
    decision: Once = field(default_factory=Once)

    def worker(self, node: str) -> bool:
        return self.group.rank_of(node) > 0

    def result_file(self, node: str) -> str:
        return f"{RESULTS_DIR}/rendezvous-{self.token}-{self.group.rank_of(node)}.json"


class GroupRuns:
    """Every group's run in one pyinfra run: a part of the run object
    (``integration.ThisRun.groups``), a group's made when a node first asks (``of``)."""

    def __init__(self) -> None:
        self.runs: dict[str, GroupRun] = {}

    def of(self, group: groupmod.Group) -> GroupRun:
        if group.name not in self.runs:
            seed = random.SystemRandom().randrange(1 << 30)
            self.runs[group.name] = GroupRun(group, groupmod.probe_port(group, seed))
        return self.runs[group.name]


def run_of(state, group: groupmod.Group) -> GroupRun:
    """The run of GROUP in this pyinfra STATE's run (its run object's ``groups``; none
    attached raises ``UsageError``)."""
    return run_object_of(state).groups.of(group)


class Decided:
    """The static condition of a group's operation: the group's decision, made while the
    nodes were prepared (the same on every node), and this node's part in it (RUN: false
    for the operation of the other ranks). ``plan.changes`` knows it by ``group_gate``: the
    group's decision, not this host's drift."""

    group_gate = True

    def __init__(self, run: bool = True):
        self.run = bool(run)

    def __call__(self) -> bool:
        return self.run

    def __repr__(self) -> str:
        return f"Decided({self.run})"


def group_fields(group: groupmod.Group, node: str, reasons) -> dict:
    """A node's group fields for the plan record (``status``): its group, rank, the group's
    nodes, and what would (re)start the group from this node (``group_wants``: REASONS; the
    group's drift is every node's)."""
    return {"group": group.name, "node_rank": group.rank_of(node),
            "group_nodes": group.members(), "group_wants": list(reasons)}


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


@operation()
def rendezvous_started(argv: list[str], out: str):
    """
    Start this node's rendezvous tool in the background on its host (every node of the group
    in the same operation: the next one collects the results); its result goes to OUT.

    + argv: the tool's command line (``core.group.rendezvous_argv``), its own deadline in it
    + out: the result file (written whole, by a rename), OUT.err its error output
    """
    yield (f"mkdir -p {RESULTS_DIR} && rm -f {out} {out}.err && "
           f"{{ setsid {_sh(*argv, '--out', out)} </dev/null >/dev/null 2>{out}.err & }}")


def collect_command(out: str, timeout_s: float) -> str:
    """Wait on the host (at most TIMEOUT_S) for the result file OUT, print it (its errors to
    stderr) and remove both."""
    return (f"end=$(( $(date +%s) + {int(timeout_s)} )); "
            f"while ! test -s {out} && [ \"$(date +%s)\" -lt \"$end\" ]; do sleep 0.2; done; "
            f"cat {out} 2>/dev/null; cat {out}.err >&2 2>/dev/null; rm -f {out} {out}.err; true")


def rendezvous_collect(run: GroupRun) -> None:
    """This node's rendezvous result, waited for on its own host (the tool was started on
    every node by the operation before), appended to the group's results (None: it gave
    none)."""
    node = host.name
    timeout = groupmod.RENDEZVOUS_TIMEOUT_S + COLLECT_GRACE_S
    _, output = host.run_shell_command(collect_command(run.result_file(node), timeout),
                                       print_output=False)
    result = _parse(output.stdout) if output is not None else None
    run.results.append(node, groupmod.RENDEZVOUS, result)
    if result is None:
        logger.warning(f"{host.print_prefix}rendezvous gave no result: "
                       f"{(output.stderr if output is not None else '')[-300:]}")


def rendezvous_judge(run: GroupRun, cards: dict, rank0_running: bool) -> None:
    """This node's verdict on every node's result (all collected by the operation before: the
    barrier) with every node's CARDS (made while preparing, the same on every node), judged
    by each node from the same results (``core.group.rendezvous_verdict``): the same on
    every node; raises ``GroupPreflightError`` naming each node pair that failed and the
    fix."""
    g = run.group
    problems = groupmod.rendezvous_verdict(g, run.results.log(), cards,
                                           rank0_running=rank0_running)
    if problems:
        fixes = list(dict.fromkeys(p.fix for p in problems))
        raise GroupPreflightError(
            what=f"the pre-flight of group {g.name} ({', '.join(g.members())}) passes before "
                 "any of its servers stops: every node reaches rank 0 "
                 f"{g.addr} on {g.port} (dist-init) and {run.probe} (NCCL's range), same "
                 "release, flags and driver, clocks within "
                 f"{groupmod.CLOCK_SKEW_MAX_S:g}s",
            found="\n".join(p.text() for p in problems),
            fix="\n".join(fixes) + "\nnothing of the group was stopped; re-run the deploy")
    logger.info(f"{host.print_prefix}group {g.name}: rendezvous passed "
                f"({g.nnodes} nodes, ports {g.port} and {run.probe})")


@operation()
def group_service(service: str, action: str):
    """
    ``systemctl ACTION`` of a group's node, run on every node of the group in one operation
    (when the group restarts): the group stops as one, then starts as one.

    + service: unit name without ``.service``
    + action: ``stop`` or ``start``

    **Example:**

    .. code:: python

        group_service(name="Stop the group's node", service="sglang", action="stop",
                      _if=Decided())
    """
    if action == "start":  # a unit that hit its start limit (a node restarted alone) starts
        yield _sh("systemctl", "reset-failed", f"{service}.service") + " || true"
        yield unitstart.start_command("start", f"{service}.service")
        return
    yield _sh("systemctl", action, f"{service}.service")


# ------------------------------------------------------------------ verified as one
class Watch:
    """A node's view of its group while it is verified (``verifyloop.wait_until_ready``)."""

    def __init__(self, run: GroupRun, node: str):
        self.run, self.node = run, node

    def abort(self) -> VerifyError | None:
        """Another node failed (``core.group.peer_failed``): the error this node stops with."""
        return groupmod.peer_failed(self.run.group, self.run.results.log(), self.node)


def _stop(service: str) -> None:
    host.run_shell_command(_sh("systemctl", "stop", f"{service}.service"), print_output=False)


def verify_node(run: GroupRun, service: str, verify) -> None:
    """Run VERIFY (this node's verification, given a ``Watch``; it returns the node's
    summary): this node's observation appended to the group's results, verified or failed
    (the first failure is the group's cause). A failed node's unit is stopped and nothing
    raised: every node's verdict is given by ``group_ready``, which runs on every node."""
    node = host.name
    try:
        summary = verify(Watch(run, node))
    except VerifyError as exc:
        run.results.append(node, groupmod.FAILED, exc)
        _stop(service)
        failed = groupmod.first_failure(run.results.log())
        logger.warning(f"{host.print_prefix}node {node} of group {run.group.name} failed: "
                       f"{failed[1] if failed and failed[0] == node else 'stopped with it'}")
        return
    run.results.append(node, groupmod.VERIFIED, summary)


def group_ready(run: GroupRun, service: str, record) -> None:
    """The group's verdict on this node, after every node's verification, judged by this
    node from every node's results (``core.group.verdict``): ready when every node was
    verified (RECORD keeps a copy of this node's summary), else this node's unit stopped and
    its error raised (its own, or the node that failed)."""
    judged = groupmod.verdict(run.group, run.results.log(), host.name)
    if judged.ready:
        record(dict(judged.summary or {}))
        return
    _stop(service)
    raise judged.error
