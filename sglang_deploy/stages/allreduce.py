"""The NCCL all-reduce check on a host, as pyinfra operations (decisions in
``core.allreduce``, the run in ``remote/allreduce_check.py``).

A single host runs it in one operation. A multi-node group's nodes all-reduce together, yet
no operation may wait for another host's (``groupops``: the pool may hold one host at a
time), so a group's check is two operations, like its rendezvous: the tool started in the
background on every node (each with its own deadline, its output written whole to a file),
then each node's own output waited for on its own host and judged there (a node whose peer
failed fails too: the collective names it).
"""

from __future__ import annotations

import functools

from pyinfra import host, logger, state
from pyinfra.operations import python

from sglang_deploy.core import allreduce
from sglang_deploy.hostops.operations import reported
from sglang_deploy.stages.group import groupops

#: how long past the tool's deadline (and coreutils' kill) its output may take to appear (s)
COLLECT_GRACE_S = 15.0


def _judge(spec, env: dict, python_path: str, tool: str, min_busbw, stdout: str,
           stderr: str) -> None:
    result = allreduce.parse_output(stdout, stderr)
    verdict = allreduce.judge(result, spec, min_busbw, env=env, python=python_path, tool=tool)
    if verdict.failed:
        raise allreduce.error_for(host.name, verdict)
    logger.info(f"{host.print_prefix}{verdict.message}")


def started_command(command: str, out: str) -> str:
    """COMMAND started in the background (its own session), its output written whole to OUT
    (by a rename, once it ended) and its errors to OUT.err."""
    import shlex

    inner = f"{{ {command}; }} > {out}.part 2> {out}.err; mv -f {out}.part {out}"
    return (f"mkdir -p {groupops.RESULTS_DIR} && rm -f {out} {out}.part {out}.err && "
            f"{{ setsid sh -c {shlex.quote(inner)} </dev/null >/dev/null 2>&1 & }}")


def add_allreduce_check(hp, *, group=None, when=None):
    """Add the all-reduce check of this host (``hp``: its ``hostplan.HostPlan``, after the runtime
    stage: the release venv and the shipped tool exist when it runs). GROUP: the host's
    ``core.group.Group`` when it is a node of one; every node must add it at the same place
    (two operations: the tool started on every node, then each node's result collected on
    its own host; they all-reduce together, rank 0 hosting the rendezvous on the group's
    port + 1). WHEN: the operations' ``_if`` (for a group: its decision, the same on every
    node).

    The operation runs the script with the service's environment (``hp.environment()``: the
    NCCL settings the server gets) and ``gpu_allreduce_env`` over it, judges its output and raises ``PreflightError`` (expected,
    found, fix) when it fails; a pass is logged with the measured bus bandwidth. Adds nothing
    and returns None when ``gpu_allreduce_check`` is off; else the (last) operation's meta."""
    s = hp.settings
    if not s.gpu_allreduce_check:
        return None
    spec = allreduce.spec_of(s, group=group, host=host.name)
    env = {**dict(hp.environment()), **{k: str(v) for k, v in s.gpu_allreduce_env.items()}}
    python_path, tool = hp.venv_python, hp.layout.tool(allreduce.TOOL)
    command = allreduce.command(python_path, tool, spec, env)

    judge = functools.partial(_judge, spec, env, python_path, tool,
                              s.gpu_allreduce_min_busbw_gbps)
    extra = {} if when is None else {"_if": when}
    if group is None:
        def check() -> None:
            _, output = host.run_shell_command(command, print_output=False,
                                               print_input=host.state.print_input)
            judge(output.stdout, output.stderr)

        return python.call(name=allreduce.op_name(spec), function=reported(check), **extra)
    out = (f"{groupops.RESULTS_DIR}/allreduce-{groupops.run_of(state, group).token}-"
           f"{group.rank_of(host.name)}.out")
    wait_s = spec.timeout_s + sum(allreduce.KILL_AFTER_S) + COLLECT_GRACE_S

    def start() -> None:
        host.run_shell_command(started_command(command, out), print_output=False)

    def collect() -> None:
        _, output = host.run_shell_command(groupops.collect_command(out, wait_s),
                                           print_output=False)
        judge(output.stdout if output is not None else "",
              output.stderr if output is not None else "")

    python.call(name=f"{allreduce.op_name(spec)}: started on every node",
                function=reported(start), **extra)
    return python.call(name=f"{allreduce.op_name(spec)}: each node's result",
                       function=reported(collect), **extra)
