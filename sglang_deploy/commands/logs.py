"""`sglang-deploy logs HOST [-i INVENTORY] [--follow] [-n LINES]`: the service's journal.

One SSH session to HOST (``shell.hostshell``: the deploy's own SSH settings from the
inventory, plus ~/.ssh/config and the agent), running ``journalctl -u UNIT``. With
``--follow`` the journal streams until Ctrl-C, across restarts of the service. Read-only.
"""

from __future__ import annotations

import argparse
import sys

from sglang_deploy.core.errors import SglangDeployError
from sglang_deploy.core.sshtarget import journal_command

DEFAULT_INVENTORY = "inventory/prod.py"


def line_count(text: str) -> int:
    """argparse type of -n/--lines: a whole number, 0 or more."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number of lines, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected 0 or more lines, got {value}")
    return value


def add_parser(sub) -> None:
    p = sub.add_parser("logs", help="the service's journal on one host (--follow to stream)")
    p.add_argument("host")
    p.add_argument("--inventory", "-i", default=DEFAULT_INVENTORY)
    p.add_argument("--follow", "-f", action="store_true",
                   help="keep streaming new lines (across restarts) until Ctrl-C")
    p.add_argument("--lines", "-n", type=line_count, default=100,
                   help="how many of the last lines to show first (default 100)")


def run(args) -> int:
    from sglang_deploy.shell import hostshell

    try:
        target, data = hostshell.target(args.inventory, args.host)
        unit = f"{hostshell.setting(data, 'sglang_service')}.service"
        with hostshell.connect(target) as cxn:
            status, _ = hostshell.stream(cxn, journal_command(unit, args.lines, args.follow),
                                         sys.stdout.buffer, sys.stderr.buffer)
    except SglangDeployError as exc:
        print(exc.message, file=sys.stderr)
        return 2
    return status
