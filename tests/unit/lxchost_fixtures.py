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


def run_standin(argv, tmp_path, answers=None):
    """Run ARGV with the stand-in CLIs first on PATH; ANSWERS (relative path -> text) are
    written to the stand-ins' answer folder. Returns (completed process, calls logged)."""
    import json
    import os
    import subprocess

    folder = tmp_path / "answers"
    for rel, text in (answers or {}).items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text(text)
    log = tmp_path / "calls.jsonl"
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}",
           "LXCHOST_STANDIN_LOG": str(log), "LXCHOST_STANDIN_DIR": str(folder)}
    done = subprocess.run(list(argv), env=env, capture_output=True, text=True, timeout=30,
                          check=False)
    calls = [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []
    return done, calls
