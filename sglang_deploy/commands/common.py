"""The one command-line convention of every ``sglang-deploy`` command, shared.

* ``INVENTORY`` is positional; ``--limit PATTERN`` follows pyinfra's rules (host name, group
  name, glob; ``controller.hosts.select``), a multi-node group's ``sglang_group`` name selects its
  nodes (plain pyinfra too: ``integration.hooks``), and one that matches nothing is an error (exit 2);
  ``--data K=V`` is checked like the inventory's data before any connection; ``--json``
  prints the result as JSON on stdout and nothing else goes there; ``-v`` / ``-vv`` pass
  pyinfra's verbosity through (and show tracebacks).
* The exit statuses (``EXIT_*``) are listed in each command's ``--help`` (``epilog``).
* ``host_error`` shows pyinfra's own error from a run's output, for display only where no
  host left an outcome record (pyinfra stopped before any host ran). Every command decides
  each host's outcome from the records (``integration/outcomes.py``), never from this text.
* ``table`` / ``print_table`` / ``console``: rich tables and text; plain ASCII, no colour and no
  padding to a console width when the output is not a terminal.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterable

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_ROLLBACK_FAILED = 3
EXIT_INTERRUPTED = 130

_BASE_CODES = (
    (EXIT_OK, "success"),
    (EXIT_FAILED, "a host or an operation failed (the host's own error is printed)"),
    (EXIT_USAGE, ("usage or input error: bad inventory, a --limit that matches no host, bad "
                  "--data or data, a missing file; nothing was touched")),
)


def epilog(*extra: tuple[int, str], failed: str | None = None) -> str:
    """The ``exit status:`` section of a command's --help."""
    codes = [(c, failed if c == EXIT_FAILED and failed else text) for c, text in _BASE_CODES]
    codes += list(extra) + [(EXIT_INTERRUPTED, "interrupted (Ctrl-C)")]
    return "exit status:\n" + "\n".join(f"  {c:<4}{text}" for c, text in codes)


def verbose_parent() -> argparse.ArgumentParser:
    """``-v`` on every command (and before it): pyinfra's -v/-vv, and tracebacks shown."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("-v", "--verbose", action="count", default=argparse.SUPPRESS,
                   help="more output: passed to pyinfra as -v/-vv; show tracebacks")
    return p


def add_command(sub, name: str, *, help: str, description: str | None = None,
                codes: Iterable[tuple[int, str]] = (), failed: str | None = None,
                ) -> argparse.ArgumentParser:
    """A subcommand with the shared options (-v) and its exit statuses in --help."""
    return sub.add_parser(name, help=help, description=description or help,
                          epilog=epilog(*codes, failed=failed), parents=[verbose_parent()],
                          formatter_class=argparse.RawDescriptionHelpFormatter)


def add_inventory(p: argparse.ArgumentParser) -> None:
    p.add_argument("inventory", metavar="INVENTORY",
                   help="pyinfra inventory file (e.g. inventory/prod.py)")


def add_limit(p: argparse.ArgumentParser) -> None:
    p.add_argument("--limit", action="append", default=[], metavar="PATTERN",
                   help="only these hosts: a host name, a group name or a glob (pyinfra's "
                        "--limit rules), or a multi-node group's name (sglang_group); "
                        "repeatable")


def add_data(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", "-e", action="append", default=[], metavar="KEY=VALUE",
                   help="override host data, as pyinfra --data (Ansible's -e: above "
                        "host_vars/); checked like the inventory's data before any "
                        "connection (repeatable)")


def add_json(p: argparse.ArgumentParser, what: str = "the result") -> None:
    p.add_argument("--json", action="store_true",
                   help=f"print {what} as JSON on stdout (progress goes to stderr)")


# ------------------------------------------------------------------ the failing host's error

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_TYPED_HEAD = re.compile(r": expected |^GPU pre-flight failed: ")


def _typed_block(lines: list[str], start: int, first: str, n: int) -> str:
    block = [first.split("sglang_deploy.core.errors.", 1)[-1].strip()]
    for more in lines[start + 1:]:
        if not more.startswith(" ") or more.lstrip().startswith("["):
            break
        block.append(more.rstrip())
    return "\n".join(block[:n])


def host_error(output: str, n: int = 12) -> str:
    """Pyinfra's own error in a run's OUTPUT, for display only where no host left an outcome
    record (pyinfra stopped before any host ran): the tool's typed error (expected / found /
    fix) as pyinfra printed it, else pyinfra's ``--> pyinfra error`` line, else the last lines.
    No decision is taken on it (``integration.outcomes`` records decide)."""
    lines = [_ANSI.sub("", ln) for ln in output.rstrip().splitlines()]
    for i in range(len(lines) - 1, -1, -1):
        line = lines[i]
        if line.lstrip().startswith("[") or not _TYPED_HEAD.search(line):
            continue
        if "sglang_deploy.core.errors." in line or line.startswith("--> pyinfra error") \
                or not line.startswith(" "):
            return _typed_block(lines, i, line.split("--> pyinfra error: ", 1)[-1], n)
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith("--> pyinfra error"):
            return "\n".join(lines[i:i + n])
    tail = [ln for ln in lines if ln.strip()][-n:]
    return "\n".join(tail) if tail else "pyinfra printed nothing"


# ------------------------------------------------------------------ tables

def _tty(out) -> bool:
    return hasattr(out, "isatty") and out.isatty()


def is_terminal(out=None) -> bool:
    """Whether OUT (stdout) is a terminal: styles and rich layouts there, plain text else."""
    return _tty(out or sys.stdout)


def table(columns: Iterable[str], title: str | None = None, out=None):
    """A rich Table; when OUT is not a terminal, plain ASCII text: no borders, columns
    aligned by spaces, the title on its own line at the left, each row on one line starting
    with its first cell."""
    from rich import box
    from rich.table import Table

    tty = _tty(out or sys.stdout)
    if tty:
        t = Table(title=title, box=box.SIMPLE_HEAD, collapse_padding=True)
    else:
        t = Table(title=title, box=None, pad_edge=False, show_edge=False, title_justify="left")
    for col in columns:
        # on a terminal a cell too long for its column wraps (folded inside a word), never
        # cut with an ellipsis
        t.add_column(col, no_wrap=not tty, overflow="fold")
    return t


def console(out=None):
    """A rich Console on OUT (stdout): styles and the terminal's width on a terminal;
    otherwise no colour and no fixed width (a long line stays one line)."""
    from rich.console import Console

    out = out or sys.stdout
    return Console(file=out, width=None if _tty(out) else 10_000, no_color=not _tty(out),
                   highlight=False, emoji=False)


def print_table(t, out=None) -> None:
    """Print T on OUT (stdout): styles and the terminal's width on a terminal; otherwise plain
    text, no colour, and lines as long as their content, not padded to the widest row or to a
    console width (a piped table keeps one row per line)."""
    import io

    out = out or sys.stdout
    if _tty(out):
        console(out).print(t)
        return
    buffer = io.StringIO()
    console(buffer).print(t)
    out.write("".join(line.rstrip() + "\n" for line in buffer.getvalue().splitlines()))
