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
from sglang_deploy.hostops import operations as ops
from sglang_deploy.stages import p2pview
from sglang_deploy.stages.group import groupprep


def run_probe(ctx, kind: str) -> tuple[list, str | None]:
    """The CUDA probe of KIND on CTX's host (``stages.Context``; ``preflight.probe_plan``:
    "p2p", "basic" or "none": no probe), then the GPUs judged: (checks, P2P matrix text), the
    NCCL environment and a passed full test's record kept in CTX. A probe that should have run and gave no
    result fails the checks: the deploy never installs on a host whose CUDA was not proven."""
    s = ctx.settings
    probe = None
    if kind != "none":
        probe = groupprep.probe(host, s, kind)  # read once per run (a group's peers too)
    checks, ctx.nccl_env, matrix = preflight.evaluate(ctx.gpu_snapshot, probe, ctx.expect)
    if kind != "none" and probe is None:
        checks.append(preflight.Check(
            name="cuda-probe", status="fail", message="the CUDA probe gave no result",
            fix=f"run `{s.sglang_system_python} cuda_probe.py --p2p` on the host (or "
                "`sglang-deploy doctor` there) and read its error"))
    if kind == "p2p":
        ctx.p2p_record = preflight.p2p_record(checks, ctx.nccl_env, s.gpu_p2p_policy)
    return checks, matrix


def add_retest(ctx, **gate) -> None:
    """Add the retest of CTX's host (``stages.Context``); GATE: its ``_if`` (the server was
    stopped for it; a group's node: its group restarts)."""
    name = (f"{preflight.RETEST_NOTE} of {ctx.settings.sglang_service} (peer copies on every "
            "GPU pair)")
    python.call(name=name, function=ops.reported(functools.partial(
        retest, ctx, dict(ctx.nccl_env))), **gate)


def retest(ctx, rendered_env: dict) -> None:
    """On the host's turn: the probe with the peer copies, its matrix, the new verdict kept
    on the host; raises when P2P fails. A verdict that asks for another NCCL environment than
    the unit was rendered with (RENDERED_ENV: from the last recorded test; e.g. P2P works again
    where the unit had NCCL_P2P_DISABLE=1, or an `adapt` host lost it) rewrites the unit with
    it and reloads systemd, so that the server starts once, with the verdict just proven."""
    s = ctx.settings
    checks, _ = run_probe(ctx, "p2p")
    p2pview.show(checks, record=True, policy=s.gpu_p2p_policy)
    if ctx.p2p_record is not None:
        ops.write_json_record(ctx.layout.p2p_record, ctx.p2p_record)
    ops.preflight_gate(checks, title=f"P2P before restarting {s.sglang_service}",
                       before=f"before {s.sglang_service} starts again (retested with it "
                              "stopped; it stays stopped)")
    ctx.p2p_skipped = False
    if dict(ctx.nccl_env) != rendered_env:  # the hardware (or the policy) changed since
        unit = ctx.layout.unit_file
        ops.write_text(unit, ctx.unit_text())  # rendered with the new verdict: ctx.nccl_env
        ok, out = host.run_shell_command("systemctl daemon-reload", print_output=False)
        if not ok:
            raise PreflightError(
                what=f"systemd to load {unit}, rendered again with the retest's verdict",
                found=(out.stderr or "no output")[-500:] + f"; {s.sglang_service} is stopped",
                fix="run `systemctl daemon-reload` on the host and read its error, then run "
                    "the deploy again")
        logger.warning(f"{host.print_prefix}P2P retest: the verdict changed since the last "
                       f"recorded test; {unit} rendered again with NCCL environment "
                       f"{_env(ctx.nccl_env)} (was {_env(rendered_env)}) before "
                       f"{s.sglang_service} starts")


def _env(env: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(env.items())) or "(none)"
