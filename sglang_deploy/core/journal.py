"""The run journal's shape (pure): one JSON document per pyinfra run, what the command that
started the run reads back of each host.

Written by ``integration/journal.py`` (the run's one writer, atomically), read by the commands
through ``integration.journal.read``. A journal::

    {"schema": 1,
     "hosts": {"gpu-1": {"outcome": the outcome record (``core/outcome.py``),
                         "plan": the plan record (``integration/plan.py``: drift and state),
                         "preflight": every pre-flight check (``integration/plan.py``),
                         "report": the verification summary (``core/report.py``),
                         "bench": the benchmark entry (``stages/throughputhost.py``)}}}

Each part of a host's entry is there only when the run wrote it (a plan only in a plan run,
a bench entry only in a bench run). A missing or unreadable journal reads as one that holds
no host: every host's outcome is then ``missing``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from sglang_deploy.core import outcome
from sglang_deploy.core.outcome import HostOutcome

SCHEMA = 1
#: the parts of a host's entry
OUTCOME, PLAN, PREFLIGHT, REPORT, BENCH = "outcome", "plan", "preflight", "report", "bench"
PARTS = (OUTCOME, PLAN, PREFLIGHT, REPORT, BENCH)


def put(entry: dict[str, Any], part: str, value: dict[str, Any]) -> dict[str, Any]:
    """A host's ENTRY with its PART set to VALUE (ENTRY is changed in place and returned)."""
    if part not in PARTS:
        raise ValueError(f"not a part of a host's journal entry: {part!r} (one of {PARTS})")
    entry[part] = value
    return entry


def entry_text(entry: dict[str, Any]) -> str:
    """One host's entry as the journal's text holds it (one line)."""
    return json.dumps(entry, sort_keys=True, default=str)


def text(entries: dict[str, str]) -> str:
    """The journal's text (what the file holds) from each host's ``entry_text``, one line per
    host: a record rewrites one host's line, not the whole document (the writer keeps the
    other lines as they were)."""
    lines = ",\n".join(f"  {json.dumps(host)}: {line}" for host, line in sorted(entries.items()))
    return f'{{"schema": {SCHEMA}, "hosts": {{\n{lines}\n}}}}\n'


@dataclass(frozen=True)
class Journal:
    """A run's journal as the commands read it."""

    hosts: dict[str, dict[str, Any]] = field(default_factory=dict)

    def part(self, host: str, part: str) -> dict[str, Any] | None:
        return (self.hosts.get(host) or {}).get(part)

    def outcome(self, host: str) -> HostOutcome:
        """HOST's outcome decided from its record (``outcome.decide``: none, ``missing``)."""
        return outcome.decide(host, self.part(host, OUTCOME))

    def outcomes(self, hosts: list[str]) -> dict[str, HostOutcome]:
        return {name: self.outcome(name) for name in hosts}

    def plan(self, host: str) -> dict[str, Any] | None:
        return self.part(host, PLAN)

    def preflight(self, host: str) -> dict[str, Any] | None:
        return self.part(host, PREFLIGHT)

    def report(self, host: str) -> dict[str, Any] | None:
        return self.part(host, REPORT)

    def bench(self, host: str) -> dict[str, Any] | None:
        return self.part(host, BENCH)


def parse(text: str | None) -> Journal:
    """The journal of TEXT (None, or text that is not a journal: one that holds no host)."""
    try:
        doc = json.loads(text) if text else None
    except ValueError:
        doc = None
    hosts = doc.get("hosts") if isinstance(doc, dict) else None
    if not isinstance(hosts, dict):
        return Journal()
    return Journal({str(k): v for k, v in hosts.items() if isinstance(v, dict)})
