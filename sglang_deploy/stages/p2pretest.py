"""The P2P retest before a server is replaced: the CUDA probe with the peer copies, an
operation in the real run and the dry run alike (``core.restart.Decision.retest``).

The pre-flight skips the copies while a server runs on the GPUs (``preflight.probe_plan``:
its GPU memory is the server's, and a read-only command never touches the GPUs of a unit that
is active or activating). A deploy that will replace that server proves P2P first, on GPUs no
server holds: a single host's unit is stopped just before (``Stop SERVICE for the P2P
retest``), after the new unit and secrets files are in place; a group's node retests once its
whole group has stopped. Being an operation, it never runs while pyinfra prepares, nor in a
read-only command (``status``, ``rollout --dry``, ``report``, ``deploy.py --dry``), whose plan
shows the same operations. A failed retest leaves the server stopped: a new one would not
serve on those GPUs either. A passed one whose verdict asks for another NCCL environment than
the last record did rewrites the unit before the start (one restart, with what was proven).
"""

from __future__ import annotations

import functools

from pyinfra import host, logger
from pyinfra.operations import python

from sglang_deploy.core import preflight
from sglang_deploy.core.errors import PreflightError
from sglang_deploy.core.hostplan import HostPlan
from sglang_deploy.hostops import operations as ops
from sglang_deploy.stages import p2pview
from sglang_deploy.stages.group import groupprep


class Retested:
    """The retest's verdict once its operation ran on the host (``add_retest``), as pyinfra's
    ``OperationMeta`` holds an operation's result once it ran: the host's plan with that
    verdict (``HostPlan.retested``: a new plan, the stages' own unchanged), kept once. Read
    by what runs after it (the verification's parameters: ``latest``)."""

    def __init__(self) -> None:
        self._plan: HostPlan | None = None

    def keep(self, retested: HostPlan) -> None:
        if self._plan is not None:
            raise RuntimeError("the P2P retest ran twice in one run (a bug of sglang-deploy)")
        self._plan = retested

    @property
    def plan(self) -> HostPlan | None:
        """The plan with the retest's verdict; None: the retest has not run (or failed)."""
        return self._plan


def latest(hp: HostPlan) -> HostPlan:
    """HP, or the plan with its retest's verdict once the retest ran (``Retested``)."""
    done = hp.ops.retest.plan if hp.ops.retest is not None else None
    return done if done is not None else hp


def add_retest(hp: HostPlan, **gate) -> Retested:
    """Add the retest of HP's host (its ``hostplan.HostPlan``); GATE: its ``_if`` (the server
    was stopped for it; a group's node: its group restarts). Returns where its verdict is
    kept once it ran."""
    name = (f"{preflight.RETEST_NOTE} of {hp.settings.sglang_service} (peer copies on every "
            "GPU pair)")
    result = Retested()
    python.call(name=name, function=ops.reported(functools.partial(retest, hp, result)),
                **gate)
    return result


def retest(hp: HostPlan, result: Retested) -> None:
    """On the host's turn: the probe with the peer copies, its matrix, the new verdict kept
    on the host (and in RESULT); raises when P2P fails. A verdict that asks for another NCCL
    environment than the unit was rendered with (HP's: from the last recorded test; e.g. P2P
    works again where the unit had NCCL_P2P_DISABLE=1, or an `adapt` host lost it) rewrites
    the unit with it and reloads systemd, so that the server starts once, with the verdict
    just proven."""
    s = hp.settings
    new = hp.retested(groupprep.probe(host, s, "p2p"))  # read afresh: the operations execute
    p2pview.show(list(new.checks), record=True, policy=s.gpu_p2p_policy)
    if new.p2p_record is not None:
        ops.write_json_record(hp.layout.p2p_record, dict(new.p2p_record))
    ops.preflight_gate(list(new.checks), title=f"P2P before restarting {s.sglang_service}",
                       before=f"before {s.sglang_service} starts again (retested with it "
                              "stopped; it stays stopped)")
    result.keep(new)
    if dict(new.nccl_env) != dict(hp.nccl_env):  # the hardware (or the policy) changed since
        unit = hp.layout.unit_file
        ops.write_text(unit, new.unit_text())  # rendered with the new verdict
        ok, out = host.run_shell_command("systemctl daemon-reload", print_output=False)
        if not ok:
            raise PreflightError(
                what=f"systemd to load {unit}, rendered again with the retest's verdict",
                found=(out.stderr or "no output")[-500:] + f"; {s.sglang_service} is stopped",
                fix="run `systemctl daemon-reload` on the host and read its error, then run "
                    "the deploy again")
        logger.warning(f"{host.print_prefix}P2P retest: the verdict changed since the last "
                       f"recorded test; {unit} rendered again with NCCL environment "
                       f"{_env(new.nccl_env)} (was {_env(hp.nccl_env)}) before "
                       f"{s.sglang_service} starts")


def _env(env) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(env.items())) or "(none)"
