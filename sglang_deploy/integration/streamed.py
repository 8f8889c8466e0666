"""Run a long command on the host and show its progress lines live in pyinfra's output.

pyinfra prints a command's output only at the end (or every line raw with ``-v``). Here the
command runs over the deploy's own SSH connection (pyinfra's ``make_unix_command_for_host``
and ``read_output_buffers``, so timeouts and the prefix behave as in pyinfra) and every
``@@progress`` line (core/progress.py) is turned into one log line under the host as it
arrives: plain text, with a bar when pyinfra's output is a terminal. The other lines are
kept and, when the command fails, printed the way pyinfra prints a failed command's output.
"""

from __future__ import annotations

from collections.abc import Callable

import click
from pyinfra import host, logger
from pyinfra.api.command import StringCommand
from pyinfra.api.exceptions import NestedOperationError
from pyinfra.api.util import print_host_combined_output
from pyinfra.connectors.util import CommandOutput, make_unix_command_for_host, read_output_buffers

from sglang_deploy.core import progress
from sglang_deploy.stages.p2pview import ansi, colour_terminal


def _tapped(lines, on_line: Callable[[str], None]):
    """LINES, calling ON_LINE first with each. It runs in pyinfra's reader greenlet, where the
    ``host`` context is not set: ON_LINE must take what it needs beforehand."""
    for line in lines:
        text = line.decode() if isinstance(line, bytes) else line
        on_line(text.rstrip("\n"))
        yield line


def run_streamed(command: str, on_line: Callable[[str], None],
                 timeout: float | None = None) -> tuple[bool, CommandOutput]:
    """Run COMMAND (shell text) on the current host, ON_LINE called with each stdout line as
    it arrives; the command line is shown as pyinfra shows its own (``-vv``). Connectors
    without an SSH client (local, tests) deliver the lines at the end."""
    client = getattr(host.connector, "client", None)
    print_input = host.state.print_input
    if client is None or not hasattr(client, "exec_command"):
        ok, output = host.run_shell_command(StringCommand(command), print_output=False,
                                            print_input=print_input)
        for line in output.stdout_lines:
            on_line(line)
        return ok, output
    unix = make_unix_command_for_host(host.state, host, StringCommand(command))
    if print_input:
        click.echo(f"{host.print_prefix}>>> {unix}", err=True)
    stdin, stdout, stderr = client.exec_command(unix.get_raw_value())
    stdin.close()
    output = read_output_buffers(_tapped(stdout, on_line), stderr, timeout=timeout,
                                 print_output=False, print_prefix=host.print_prefix)
    return stdout.channel.recv_exit_status() == 0, output


def bar_text(sample: dict, text: str) -> str:
    """TEXT after a rich progress bar (ANSI), for a terminal."""
    from rich.progress_bar import ProgressBar

    done = progress.fraction(sample)
    if done is None:
        return text
    return f"{ansi(ProgressBar(total=1000, completed=int(done * 1000), width=20), width=24)} {text}"


def run_logged(command: str, timeout: float | None = None) -> tuple[bool, CommandOutput]:
    """Run COMMAND, logging each progress sample under the host as it arrives."""
    colour = colour_terminal()
    prefix = host.print_prefix  # on_line runs outside the host's context (see _tapped)
    last: list[dict] = []

    def on_line(line: str) -> None:
        sample = progress.parse(line)
        if sample is None:
            return
        text = progress.describe(sample, last[-1] if last else None)
        last[:] = [sample]
        logger.info(f"{prefix}{bar_text(sample, text) if colour else text}")

    return run_streamed(command, on_line, timeout=timeout)


def run_with_progress(command: str, what: str, timeout: float | None = None) -> CommandOutput:
    """:func:`run_logged`, failing the operation (after printing the command's own output,
    as pyinfra does for a failed command) when COMMAND fails."""
    ok, output = run_logged(command, timeout=timeout)
    if not ok:
        kept = CommandOutput([line for line in output.combined_lines
                              if progress.parse(line.line) is None])
        print_host_combined_output(host, kept)
        raise NestedOperationError(f"{what} failed")
    return output
