"""The LXC host fixtures (tests/fixtures/lxchost): the verbatim text between a fixture's
`# BEGIN` and `# END` lines (its header says where it comes from)."""

from __future__ import annotations

from pathlib import Path

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "lxchost"
BIN = FIXTURES / "bin"


def fixture(name: str) -> str:
    text = (FIXTURES / name).read_text()
    head, sep, rest = text.partition("# BEGIN\n")
    assert sep and "# source:" in head, f"{name}: no source header or no # BEGIN"
    body, end, _ = rest.rpartition("# END")
    assert end, f"{name}: no # END"
    return body


def grep_excerpt(name: str) -> str:
    """A fixture that is a grep of /proc/devices, with the header the grep dropped."""
    return "Character devices:\n" + fixture(name)
