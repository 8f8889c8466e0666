"""The run journal: everything one pyinfra run hands back to the command that started it, in
one file (its shape: ``core/journal.py``).

The command names the file in the run spec of its pyinfra subprocess (``core/runspec.py``:
``journal``; a run without it, by hand, writes ``.sglang-deploy/journal.json`` of its
folder, the last such run's) and reads it back with ``read`` once the run ended. In the
pyinfra process the journal's one ``Writer`` is a part of the run object
(``integration.ThisRun.journal``: made when the run starts, ``hooks.begin``, and released
with the run object after its last host); each writer of a part (``outcomes``: the outcome
records, ``plan``: the plan and pre-flight records, ``reports.emit``: the verification
summaries, ``throughputhost.bench_host``: the bench entries) goes through ``current()``,
which raises outside a run of this project. Every write replaces the whole file atomically
(``atomicfile``): a reader sees the journal as it was after one write or after the next one,
never a part of one.
"""

from __future__ import annotations

import os
from pathlib import Path

from sglang_deploy.controller import atomicfile
from sglang_deploy.core import journal as shape
from sglang_deploy.core.runspec import RunSpec
from sglang_deploy.integration.integration import this_run

DEFAULT_PATH = Path(".sglang-deploy/journal.json")


def journal_path(spec: RunSpec, cwd: str | os.PathLike | None = None) -> Path:
    """The file this run's journal goes to (SPEC's ``journal``, or the default under CWD)."""
    return Path(spec.journal) if spec.journal else Path(cwd or ".") / DEFAULT_PATH


def read(path: str | os.PathLike) -> shape.Journal:
    """The journal of a run, as its command reads it (no file, or a damaged one: a journal
    that holds no host)."""
    try:
        text = Path(path).read_text()
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        text = None
    return shape.parse(text)


class Writer:
    """The one writer of a run's journal: each ``put`` rewrites the file atomically."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self.entries: dict[str, dict] = {}  # host -> its entry
        self.lines: dict[str, str] = {}  # host -> its entry's text (``shape.entry_text``)

    def put(self, host: str, part: str, value: dict) -> None:
        entry = shape.put(self.entries.setdefault(host, {}), part, value)
        self.lines[host] = shape.entry_text(entry)
        atomicfile.write(self.path, shape.text(self.lines))


def current() -> Writer:
    """The journal of the pyinfra run in progress (its run object's: ``integration.this_run``;
    none attached raises ``UsageError``)."""
    return this_run().journal


def record(host: str, part: str, value: dict) -> None:
    """Put HOST's PART into the journal of the run in progress (``current``)."""
    current().put(host, part, value)
