"""The run journal: everything one pyinfra run hands back to the command that started it, in
one file (its shape: ``core/journal.py``).

The command names the file in the run spec of its pyinfra subprocess (``core/runspec.py``:
``journal``; a run without it, by hand, writes ``.sglang-deploy/journal.json`` of its
folder, the last such run's) and reads it back with ``read`` once the run ended. In the pyinfra process the
hooks attach one ``Writer`` to the run's State when it starts (``attach``, through
``outcomes.attach``) and the outcome recorder releases it after the last host
(``release``); each writer of a part (``outcomes``: the outcome records, ``plan``: the plan
and pre-flight records, ``reports.emit``: the verification summaries,
``throughputhost.bench_host``: the bench entries) goes through ``current()``. Every write
replaces the whole file atomically (``atomicfile``): a reader sees the journal as it was
after one write or after the next one, never a part of one.
"""

from __future__ import annotations

import os
from pathlib import Path

from sglang_deploy.controller import atomicfile
from sglang_deploy.core import journal as shape
from sglang_deploy.core.runspec import RunSpec

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


#: the attribute of a pyinfra State that holds its run's ``Writer``
_ATTR = "sglang_deploy_journal"


def attach(state, path: str | os.PathLike) -> Writer:
    """Give STATE its run's journal at PATH (the hooks do, when the run starts)."""
    writer = Writer(path)
    setattr(state, _ATTR, writer)
    return writer


def release(state) -> None:
    """Drop STATE's journal (after the run's last host: what it wrote stays in the file)."""
    if hasattr(state, _ATTR):
        delattr(state, _ATTR)


def of(state) -> Writer | None:
    """STATE's journal, or None (no run with this project's hooks, or released)."""
    return getattr(state, _ATTR, None)


def current() -> Writer | None:
    """The journal of the pyinfra run in progress (pyinfra's context state), or None."""
    from pyinfra import state

    return of(state)


def record(host: str, part: str, value: dict) -> bool:
    """Put HOST's PART into the run's journal; False when no journal is attached."""
    writer = current()
    if writer is None:
        return False
    writer.put(host, part, value)
    return True
