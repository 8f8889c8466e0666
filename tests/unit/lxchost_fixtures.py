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


def on_full_listing(name: str) -> str:
    """The NVIDIA lines of the /proc/devices excerpt NAME added to a real complete listing
    (proc-devices/no-nvidia-debian12.txt: this build machine's): the excerpt's host's other
    devices are unknown, and a test of rules for unregistered majors needs a whole listing."""
    base = fixture("proc-devices/no-nvidia-debian12.txt")
    head, block = base.split("\nBlock devices:", 1)
    return head.rstrip("\n") + "\n" + fixture(name) + "\nBlock devices:" + block
