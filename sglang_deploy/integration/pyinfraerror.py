"""Where this tool's errors cross into pyinfra.

``core.errors`` are plain exceptions (core imports no pyinfra). pyinfra's CLI reports a
``PyinfraError`` raised out of a deploy file, the state's set-up or a connection as
``--> pyinfra error in FILE line N: MESSAGE`` (no traceback, exit status 1) and anything else
as an unexpected internal error with its traceback. So each place where an error of ours
leaves our code for pyinfra's (``outcomes.stage`` around every stage, the hooks around the
state's set-up, the deploy lock taken on connecting, ``hooks.require_checked``) raises it as a
``ToolError``: a ``PyinfraError`` with the same text and the original's traceback (pyinfra
names the line that raised it), the original kept as ``error`` and as the cause.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from pyinfra.api.exceptions import PyinfraError

from sglang_deploy.core.errors import SglangDeployError


class ToolError(PyinfraError):
    """ERROR (a ``core.errors`` one) as pyinfra reports it: ``message`` is its full text."""

    def __init__(self, error: SglangDeployError) -> None:
        self.error = error
        super().__init__(error.message)

    @property
    def message(self) -> str:
        return self.error.message

    def __str__(self) -> str:
        return str(self.error)


def for_pyinfra(error: SglangDeployError) -> ToolError:
    """ERROR as pyinfra's own kind, raised from where ERROR was (its traceback)."""
    return ToolError(error).with_traceback(error.__traceback__)


@contextlib.contextmanager
def translated() -> Iterator[None]:
    """Run the block; an error of ours leaving it leaves as a ``ToolError``."""
    try:
        yield
    except SglangDeployError as exc:
        raise for_pyinfra(exc) from exc
