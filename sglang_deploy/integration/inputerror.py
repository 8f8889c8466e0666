"""An input error (bad data, a command line pyinfra cannot act on) ending a plain pyinfra run
as one: its own text (``[host] invalid data: KEY: expected ...``, found, fix), no source
path, and exit status 2, as every ``sglang-deploy`` command ends on one.

pyinfra's CLI shows any other error it wraps as ``--> pyinfra error in FILE line N: ...``
and exits 1, the status of a failed host. A ``CliError`` is the one kind of error it lets
through unwrapped (click then prints it with ``show`` and exits with its ``exit_code``).
"""

from __future__ import annotations

import click
from pyinfra_cli.exceptions import CliError

from sglang_deploy.core.errors import SglangDeployError

#: the exit status of an input error (``commands.common.EXIT_USAGE``)
EXIT_INPUT = 2


class InputError(CliError):
    """A typed input error (``exit_status`` 2) as pyinfra's CLI ends a run with it."""

    exit_code = EXIT_INPUT

    def __init__(self, error: SglangDeployError):
        super().__init__(str(error))
        self.error = error

    def show(self, file=None) -> None:
        click.echo(str(self.error), err=True)


def is_input_error(exc: BaseException) -> bool:
    return isinstance(exc, SglangDeployError) and exc.exit_status == EXIT_INPUT
