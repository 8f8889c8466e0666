"""The NCCL all-reduce check on a host, as one pyinfra operation (decisions in
``core.allreduce``, the run in ``remote/allreduce_check.py``)."""

from __future__ import annotations

from pyinfra import host, logger
from pyinfra.operations import python

from sglang_deploy.core import allreduce
from sglang_deploy.shell.operations import reported


def add_allreduce_check(ctx, *, group=None, when=None):
    """Add the all-reduce check of this host (``ctx``: ``stages.Context``, after the runtime
    stage: the release venv and the shipped tool exist when it runs). GROUP: the host's
    ``core.group.Group`` when it is a node of one; every node must add it at the same place
    (the same operation, which pyinfra runs on all of them at once: they all-reduce
    together, rank 0 hosting the rendezvous on the group's port + 1). WHEN: the operation's
    ``_if`` (a callable; for a group it must be true on every node or on none).

    The operation runs the script with the service's environment (``ctx.environment()``: the
    NCCL settings the server gets) and ``gpu_allreduce_env`` over it, judges its output and raises ``PreflightError`` (expected,
    found, fix) when it fails; a pass is logged with the measured bus bandwidth. Adds nothing
    and returns None when ``gpu_allreduce_check`` is off; else the operation's meta."""
    s = ctx.settings
    if not s.gpu_allreduce_check:
        return None
    spec = allreduce.spec_of(s, group=group, host=host.name)
    env = {**dict(ctx.environment()), **{k: str(v) for k, v in s.gpu_allreduce_env.items()}}
    python_path, tool = ctx.venv_python, ctx.layout.tool(allreduce.TOOL)
    command = allreduce.command(python_path, tool, spec, env)

    def check() -> None:
        _, output = host.run_shell_command(command, print_output=False,
                                           print_input=host.state.print_input)
        result = allreduce.parse_output(output.stdout, output.stderr)
        verdict = allreduce.judge(result, spec, s.gpu_allreduce_min_busbw_gbps, env=env,
                                  python=python_path, tool=tool)
        if verdict.failed:
            raise allreduce.error_for(host.name, verdict)
        logger.info(f"{host.print_prefix}{verdict.message}")

    extra = {} if when is None else {"_if": when}
    return python.call(name=allreduce.op_name(spec), function=reported(check), **extra)
