"""The JIT toolchain check on the host, as a pyinfra operation (decisions in ``core.jit``)."""

from __future__ import annotations

from pyinfra import host, logger
from pyinfra.api import FunctionCommand, operation

from sglang_deploy.core import jit
from sglang_deploy.hostops.operations import reported


def _check_on_host(command: str, caps: list[str], venv_bin: str) -> None:
    _, output = host.run_shell_command(command, print_output=False,
                                       print_input=host.state.print_input)
    result = jit.parse_output(output.stdout)
    problems = jit.diagnose(result, caps, venv_bin, error_text=output.stderr)
    if problems:
        raise jit.error_for(host.name, problems)
    logger.info(f"{host.print_prefix}{jit.summary(result)}")


@operation()
def jit_toolchain_check(python: str, tool: str, site: str, env: dict, caps: list[str],
                        venv_bin: str):
    """
    Check, before the service (re)starts, that the server's JIT will find its compilers:
    ``jit_check.py`` run by the release venv's python with the unit's environment, judged
    by ``jit.diagnose``; a failure stops the host with the fix, nothing started.

    + python: the release venv's python
    + tool: path of the shipped ``jit_check.py`` on the host
    + site: the release venv's site-packages (torch's CUDA version is read there)
    + env: the unit's environment (``service.service_environment``)
    + caps: the GPUs' compute capabilities from the pre-flight
    + venv_bin: the release venv's bin folder (named in the fix for ninja)

    **Example:**

    .. code:: python

        jit_toolchain_check(python=".../venv/bin/python", tool="/opt/sglang/tools/jit_check.py",
                            site=".../site-packages", env=dict(environment), caps=["12.0"],
                            venv_bin=".../venv/bin")
    """
    command = jit.check_command(python, tool, site, env)
    yield FunctionCommand(reported(_check_on_host), (command, caps, venv_bin), {})
