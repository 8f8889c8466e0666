"""The passthrough lines merged into a container's config file (pure, idempotent).

``merge`` takes the file's current text, the desired ``Directive`` values and the
``Record`` of what the tool wrote last time, and returns the new text, what changed, and
the record to keep. Its contract:

- Lines the tool did not write are kept byte for byte, in their places.
- The tool's own lines are the lines of its ``Record`` (the exact text it wrote; the
  shell keeps ``Record.to_json()`` on the LXC host, beside the config). A plain-LXC file
  also has them between two marker comments, so that they are known even without the
  record. A Proxmox file has no markers: its ``#`` lines are the container's description,
  which Proxmox rewrites at will.
- Its own lines are replaced when the desired ones differ (a new ``nvidia-uvm`` major
  after a driver or kernel update), where the first of them stood; new lines go at the end
  of the main section (Proxmox: before its ``[snapshot]`` / ``[pve:pending]`` sections,
  which are never touched).
- A second merge of its own output changes nothing (same bytes).
- A hand-written line identical to a desired one is adopted (the tool's from now on; its
  bytes stay). Other hand-written NVIDIA lines (a device rule for a major an NVIDIA driver
  holds, a bind mount or ``devN`` of a ``/dev/nvidia*`` node) conflict: ``LxcHostError``
  lists each with its line number and why, and nothing changes, unless ADOPT (the
  container's ``adopt_passthrough_lines`` data key) lets the tool replace them.
- A hand-written whole-major device rule (``c M:* rwm``) for a major no driver on the host
  registers conflicts too when the operator wrote NVIDIA lines by hand: NVIDIA recipes
  write such rules for ``nvidia-uvm`` and ``nvidia-caps``, so it is most likely another
  host's or an earlier driver's major (a forum post's). Any other rule for such a major
  is left alone and reported in ``warnings`` (a device whose driver is not loaded now).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sglang_deploy.core.errors import LxcHostError
from sglang_deploy.core.lxchost.desired import DEV, Directive, render
from sglang_deploy.core.lxchost.facts import DriverMajors

#: the marker lines around the tool's block in a plain-LXC config
BEGIN = "# BEGIN sglang-deploy GPU passthrough (written by sglang-deploy; edits here are replaced)"
END = "# END sglang-deploy GPU passthrough"
RECORD_VERSION = 1
_SECTION = re.compile(r"^\[[^\]]+\]\s*$")
_DEV_KEY = re.compile(r"^dev(\d+)$")
_RULE_KEYS = ("lxc.cgroup.devices.allow", "lxc.cgroup.devices.deny",
              "lxc.cgroup2.devices.allow", "lxc.cgroup2.devices.deny")


@dataclass(frozen=True)
class Record:
    """What the tool wrote into one container's config last time: the exact lines (no
    newline). The shell stores ``to_json()`` on the LXC host and hands it back."""

    lines: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"version": RECORD_VERSION, "lines": list(self.lines)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> Record:
        """The record from ``to_json()``'s value (None or {}: none yet). Raises
        ``LxcHostError`` on anything else."""
        if not data:
            return cls()
        lines = data.get("lines") if isinstance(data, Mapping) else None
        if data.get("version") != RECORD_VERSION or not isinstance(lines, list) \
                or not all(isinstance(x, str) for x in lines):
            raise LxcHostError(f"a passthrough record (version {RECORD_VERSION}, a list of "
                               "lines)", found=repr(data)[:200],
                               fix="delete the record file on the LXC host: the tool then "
                                   "adopts its lines that are still right")
        return cls(tuple(lines))


@dataclass(frozen=True)
class MergeResult:
    """The new file text; whether it differs; the tool's lines added and removed; the
    hand-written lines adopted or (with ADOPT) replaced; warnings; the record to keep."""

    text: str
    changed: bool
    added: tuple[str, ...]
    removed: tuple[str, ...]
    adopted: tuple[str, ...]
    record: Record
    warnings: tuple[str, ...] = field(default=())


@dataclass
class _Line:
    number: int
    raw: str  # with its line ending

    @property
    def text(self) -> str:
        return self.raw.rstrip("\r\n")


def _split(text: str, dialect: str) -> tuple[list[_Line], list[str]]:
    """The main section's lines and the rest (Proxmox: from the first [section] on)."""
    raws = text.splitlines(keepends=True)
    end = len(raws)
    if dialect == "proxmox":
        end = next((i for i, r in enumerate(raws) if _SECTION.match(r.strip())), len(raws))
    return [_Line(i + 1, r) for i, r in enumerate(raws[:end])], raws[end:]


def key_value(line: str, dialect: str) -> tuple[str, str] | None:
    """(key, value) of a config line, None for a comment or blank line. Plain LXC is
    ``key = value``; Proxmox is ``key: value``, its ``lxc.*`` keys also ``key = value``
    (as Proxmox itself reads them)."""
    s = line.strip()
    if not s or s.startswith("#"):
        return None
    if dialect == "lxc" or (s.startswith("lxc.") and re.match(r"^lxc\.[\w.\-]+\s*=", s)):
        key, sep, value = s.partition("=")
    else:
        key, sep, value = s.partition(":")
    return (key.strip(), value.strip()) if sep else None


def nvidia_conflict(key: str, value: str, majors: DriverMajors) -> str | None:
    """Why a hand-written line is an NVIDIA passthrough line the tool would write too
    (None: it is not)."""
    if key in _RULE_KEYS:
        m = re.match(r"^[cb]\s+(\d+):", value)
        if m and int(m.group(1)) in majors.nvidia:
            return f"a device rule for major {m.group(1)}, an NVIDIA driver's on this host"
    elif key == "lxc.mount.entry":
        fields = value.split()
        if fields and (fields[0].startswith("/dev/nvidia")
                       or (len(fields) > 1 and fields[1].lstrip("/").startswith("dev/nvidia"))):
            return "a bind mount of an NVIDIA device node"
    elif _DEV_KEY.match(key) and value.split(",")[0].startswith("/dev/nvidia"):
        return "a Proxmox device entry of an NVIDIA device node"
    return None


def _unregistered_rule(key: str, value: str, majors: DriverMajors) -> str | None:
    m = re.match(r"^[cb]\s+(\d+):", value) if key in _RULE_KEYS else None
    if m and majors.char_majors and int(m.group(1)) not in majors.char_majors:
        return f"major {m.group(1)}, which no driver on this host registers"
    return None


def _owned(main: list[_Line], record: Record, dialect: str) -> set[int]:
    """The numbers of the tool's lines: the record's, and (plain LXC) the marker lines and
    each END marker's block back to the BEGIN before it (a BEGIN without its END marks
    nothing but itself)."""
    ours = set(record.lines) | ({BEGIN, END} if dialect == "lxc" else set())
    owned = {line.number for line in main if line.text in ours}
    if dialect == "lxc":
        begin = None
        for line in main:
            if line.text == BEGIN:
                begin = line.number
            elif line.text == END and begin is not None:
                owned.update(range(begin, line.number + 1))
                begin = None
    return owned


def _assign(desired: Sequence[Directive], dialect: str, taken: set[int],
            reuse: Mapping[str, int]) -> list[str]:
    """Rendered desired lines; a Proxmox devN keeps the index it had (REUSE, by value) and
    otherwise takes the lowest index not TAKEN."""
    out, used = [], set(taken)
    for d in desired:
        index = None
        if d.key == DEV:
            index = reuse.get(d.value)
            if index is None or index in used:
                index = next(i for i in range(len(used) + len(desired) + 1) if i not in used)
            used.add(index)
        out.append(render(d, dialect, index))
    if dialect == "lxc" and out:
        out = [BEGIN, *out, END]
    return out


def _dev_index(text: str, dialect: str) -> tuple[int, str] | None:
    kv = key_value(text, dialect)
    m = _DEV_KEY.match(kv[0]) if kv else None
    return (int(m.group(1)), kv[1]) if m and kv else None


def _classify(main: list[_Line], owned: set[int], dialect: str, majors: DriverMajors,
              desired: Sequence[Directive]
              ) -> tuple[list[_Line], list[tuple[_Line, str]], list[str]]:
    """The operator's lines: adopted (identical to a desired one; a devN by its value),
    conflicting (NVIDIA lines; and device rules for a major no driver registers when the
    operator wrote NVIDIA lines by hand: another host's or an earlier driver's NVIDIA
    majors), and warnings (such rules without hand-written NVIDIA lines)."""
    rendered = set(_assign([d for d in desired if d.key != DEV], dialect, set(), {}))
    dev_values = {d.value for d in desired if d.key == DEV}
    adopted: list[_Line] = []
    conflicts: list[tuple[_Line, str]] = []
    dead: list[tuple[_Line, str]] = []
    for line in main:
        kv = None if line.number in owned else key_value(line.text, dialect)
        if kv is None:
            continue
        why = nvidia_conflict(kv[0], kv[1], majors)
        same = kv[1] in dev_values if _DEV_KEY.match(kv[0]) else line.text in rendered
        if why and same:
            adopted.append(line)
        elif why:
            conflicts.append((line, why))
        elif note := _unregistered_rule(kv[0], kv[1], majors):
            dead.append((line, note))
    whole = [(line, n) for line, n in dead if ":*" in line.text]
    if (adopted or conflicts) and whole:
        conflicts += [(line, (f"a device rule for all of {note}, beside hand-written NVIDIA "
                              "lines: an NVIDIA major of another host or of an earlier driver"))
                      for line, note in whole]
        conflicts.sort(key=lambda c: c[0].number)
        dead = [x for x in dead if x not in whole]
    return adopted, conflicts, [f"line {line.number}: {line.text} ({note}; left as it is)"
                                for line, note in dead]


def _conflict_error(conflicts: list[tuple[_Line, str]], path: str) -> LxcHostError:
    listed = [f"line {line.number}: {line.text}  ({why}, not written by sglang-deploy)"
              for line, why in conflicts]
    return LxcHostError(
        "no hand-written NVIDIA passthrough lines beside the tool's in " + path,
        found="\n".join(listed),
        fix=f"delete these lines from {path} (the tool writes the right ones, with this "
            "host's majors), or set `adopt_passthrough_lines: true` for this container to let "
            "the tool replace them",
        details={"lines": [{"number": line.number, "text": line.text, "why": why}
                           for line, why in conflicts]})


def _desired_lines(main: list[_Line], owned: set[int], adopted: list[_Line], dialect: str,
                   desired: Sequence[Directive]) -> list[str]:
    """The rendered desired lines, a Proxmox devN keeping the index of the tool's or an
    adopted line of the same value, and never one of the operator's indices."""
    mine = owned | {a.number for a in adopted}
    reuse: dict[str, int] = {}
    taken: set[int] = set()
    for line in main:
        dev = _dev_index(line.text, dialect)
        if dev and line.number in mine:
            reuse.setdefault(dev[1], dev[0])
        elif dev:
            taken.add(dev[0])
    return _assign(desired, dialect, taken, reuse)


def merge(text: str, desired: Sequence[Directive], dialect: str, majors: DriverMajors,
          record: Record | None = None, *, adopt: bool = False,
          path: str = "the container's config") -> MergeResult:
    """DESIRED merged into TEXT, a plain-LXC (``lxc``) or Proxmox (``proxmox``) config, as
    this module's docstring says. MAJORS (``facts.DriverMajors``) tells NVIDIA device rules
    apart. Raises ``LxcHostError`` on conflicting hand-written lines (PATH names the file
    in its text)."""
    record = record or Record()
    main, rest = _split(text, dialect)
    owned = _owned(main, record, dialect)
    adopted, conflicts, warnings = _classify(main, owned, dialect, majors, desired)
    if conflicts and not adopt:
        raise _conflict_error(conflicts, path)
    lines = _desired_lines(main, owned, adopted, dialect, desired)
    replaced = [line for line, _ in conflicts]
    current = [line for line in main if line.number in owned] + adopted
    old = Counter(line.text for line in current + replaced)
    new = Counter(lines)
    added, removed = tuple((new - old).elements()), tuple((old - new).elements())
    if not replaced and Counter(line.text for line in current) == new:
        return MergeResult(text, False, (), (), tuple(a.text for a in adopted),
                           Record(tuple(lines)), tuple(warnings))
    drop = {line.number for line in current + replaced}
    kept = [line.raw for line in main if line.number not in drop]
    at = _insert_at(main, drop, kept)
    if at and not kept[at - 1].endswith("\n"):
        kept[at - 1] += "\n"
    body = kept[:at] + [line + "\n" for line in lines] + kept[at:]
    return MergeResult("".join(body + rest), True, added, removed,
                       tuple(a.text for a in adopted), Record(tuple(lines)), tuple(warnings))


def _insert_at(main: list[_Line], drop: set[int], kept: list[str]) -> int:
    """Where the new lines go in KEPT: where the first dropped line stood, else after the
    main section's last non-blank line."""
    if drop:
        first = min(drop)
        return sum(1 for line in main if line.number < first and line.number not in drop)
    at = len(kept)
    while at and not kept[at - 1].strip():
        at -= 1
    return at
