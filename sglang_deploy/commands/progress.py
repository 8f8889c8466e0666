"""One live line per host while a rollout runs: its state and the latest thing it said.

``HostProgress`` is fed state changes (``update(host_or_hosts, state)``) and, optionally, the
lines of the pyinfra runs (``feed(line)``: the start of the verify stage moves the hosts of
the run to ``verifying``, a rollback's to ``rolling back``, and each ``[host] ...`` line
becomes that host's detail: display only, no outcome depends on these lines; the rollout
decides from the outcome records, ``integration/outcomes.py``). On a terminal (stderr) it is a
rich ``Live`` table redrawn in place; otherwise each change is one plain ``HOST: state``
line on stderr, so stdout stays for the command's own report and ``--json``.

States: waiting, deploying, verifying, draining, done, converged, failed, rolling back,
rolled-back, rollback-failed, untouched (any other word is shown as it is).
"""

from __future__ import annotations

import atexit
import re
import sys
import time
from collections.abc import Iterable

STYLES = {"waiting": "dim", "untouched": "dim", "deploying": "cyan", "verifying": "blue",
          "draining": "magenta", "rolling back": "yellow", "done": "green", "converged": "green",
          "rolled-back": "yellow", "failed": "bold red", "rollback-failed": "bold white on red"}

_STAGES = (("--> Starting operation: Verify:", "verifying"),
           ("--> Starting operation: Rollback:", "rolling back"))
_HOST_LINE = re.compile(r"^\s*\[([^\]]+)\]\s+(.*\S)")
#: pyinfra's own per-host words that say nothing about where the host is
_QUIET = {"Success", "No changes", "Connected", "Skipped", "Disconnected"}


def line_event(line: str) -> tuple[str | None, str | None, str | None]:
    """(state for every host of the run, or None; host named by the line, its detail)."""
    for prefix, state in _STAGES:
        if line.startswith(prefix):
            return state, None, None
    m = _HOST_LINE.match(line)
    if m and m.group(2) not in _QUIET and not m.group(2).startswith("Ready: "):
        return None, m.group(1), m.group(2)
    return None, None, None


class HostProgress:
    def __init__(self, out=None, clock=time.monotonic) -> None:
        self.out = out or sys.stderr
        self.clock = clock
        self.hosts: list[str] = []
        self.state: dict[str, str] = {}
        self.since: dict[str, float] = {}
        self.detail: dict[str, str] = {}
        self.running: list[str] = []
        self._live = None

    # ------------------------------------------------------------------ feeding
    def start(self, hosts: Iterable[str]) -> None:
        self.hosts = list(hosts)
        for h in self.hosts:
            self.state[h], self.since[h] = "waiting", self.clock()
        from rich.console import Console

        if Console(file=self.out).is_terminal:
            from rich.live import Live

            self._live = Live(get_renderable=self.table, console=Console(file=self.out),
                              refresh_per_second=4, redirect_stdout=False, redirect_stderr=False)
            self._live.start()
            atexit.register(self.stop)
        else:
            for h in self.hosts:
                self._line(h)

    def update(self, hosts: str | Iterable[str], state: str) -> None:
        names = [hosts] if isinstance(hosts, str) else list(hosts)
        self.running = names if state in ("deploying", "rolling back") else self.running
        for h in names:
            if self.state.get(h) == state:
                continue
            self.state[h], self.since[h] = state, self.clock()
            self.detail.pop(h, None)
            if self._live is None:
                self._line(h)

    def feed(self, line: str) -> None:
        """A line of the current pyinfra run (``runner.run_pyinfra(on_line=...)``)."""
        state, host, detail = line_event(line)
        if state:
            self.update(self.running, state)
        elif host in self.state and detail:
            self.detail[host] = detail

    def stop(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None

    def print(self, text: str, file) -> None:
        """Print TEXT (the command's own output) above the live lines, or just print it."""
        if self._live is not None and getattr(file, "isatty", lambda: False)():
            self._live.console.print(text, markup=False, highlight=False, soft_wrap=True)
        else:
            print(text, file=file, flush=True)

    # ------------------------------------------------------------------ drawing
    def _line(self, host: str) -> None:
        print(f"{host}: {self.state[host]}", file=self.out, flush=True)

    def table(self):
        from rich.table import Table
        from rich.text import Text

        table = Table(box=None, show_header=False, pad_edge=False)
        table.add_column(no_wrap=True)
        table.add_column(no_wrap=True)
        table.add_column(justify="right", no_wrap=True)
        table.add_column(overflow="ellipsis", no_wrap=True)
        now = self.clock()
        for h in self.hosts:  # Text, not markup: printing above the table may turn markup off
            state = self.state[h]
            table.add_row(Text(h), Text(state, style=STYLES.get(state, "")),
                          Text(f"{now - self.since[h]:.0f}s"), Text(self.detail.get(h, "")))
        return table
