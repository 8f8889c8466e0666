"""`sglang-deploy logs INVENTORY HOST [--follow] [-n LINES] [--explain [--json]]`: the
service's journal.

One SSH session to HOST (``controller.hostshell``: the deploy's own SSH settings from the
inventory, plus ~/.ssh/config and the agent), running ``journalctl -u UNIT``. With
``--follow`` the journal streams until Ctrl-C, across restarts of the service. With
``--explain`` the journal since the service's last start is analysed as `explain-log` does
(``core.logs.explain``: phases, outcome, the cause and its fix), and a restart the watchdog
made around that run is named (``watchdog_restart``: its events file, read in the same
SSH command). Read-only.
"""

from __future__ import annotations

import argparse
import json
import sys

from sglang_deploy.commands import common
from sglang_deploy.commands import explain as explain_log


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
    p = common.add_command(
        sub, "logs", help="the service's journal on one host (--follow to stream, --explain "
                          "to analyse the last start)",
        description=__doc__.split("\n\n")[0],
        failed="journalctl failed on the host; with --explain: " + explain_log.FAILED,
        codes=((explain_log.EXIT_INCOMPLETE, "with --explain: " + explain_log.INCOMPLETE),))
    common.add_inventory(p)
    p.add_argument("host", metavar="HOST")
    p.add_argument("--follow", "-f", action="store_true",
                   help="keep streaming new lines (across restarts) until Ctrl-C")
    p.add_argument("--lines", "-n", type=line_count, default=100,
                   help="how many of the last lines to show first (default 100)")
    p.add_argument("--explain", action="store_true",
                   help="analyse the journal since the last start (as explain-log does)")
    common.add_json(p, "the --explain analysis")


def run(args) -> int:
    from sglang_deploy.controller import hostshell
    from sglang_deploy.core.sshtarget import journal_command

    if args.explain:
        from datetime import datetime

        from sglang_deploy.core.logs.explain import explain, render_text

        if args.follow:
            raise hostshell.HostShellError(what="--explain or --follow", found="both",
                                           fix="analyse the last start (--explain) or stream "
                                               "the journal (--follow), one at a time")
        from sglang_deploy.core import watchdog as wj

        last = hostshell.last_start(args.inventory, args.host)
        journal = last.journal
        result = explain(journal.splitlines(), year=datetime.now().year)
        if result.get("worker"):  # a group's node of rank >= 1: named with its group
            _, data = hostshell.target(args.inventory, args.host)
            result = explain(journal.splitlines(), year=datetime.now().year,
                             group=hostshell.setting(data, "sglang_group"))
        # the watchdog's restart around this run (its events file, read in the same round trip)
        result["watchdog_restart"] = wj.restart_of(list(last.watchdog_events), last.invocation)
        if args.json:
            print(json.dumps(result, indent=2, ensure_ascii=False))
        else:
            text = render_text(result)
            line = wj.restart_line(result["watchdog_restart"])
            sys.stdout.write(text + (f"watchdog:    {line}\n" if line else ""))
        return explain_log.EXIT[result["outcome"]]
    target, data = hostshell.target(args.inventory, args.host)
    unit = f"{hostshell.setting(data, 'sglang_service')}.service"
    with hostshell.connect(target) as cxn:
        status, _ = hostshell.stream(cxn, journal_command(unit, args.lines, args.follow),
                                     sys.stdout.buffer, sys.stderr.buffer)
    return status
