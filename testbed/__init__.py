"""The testbed: real systemd containers standing in for 8-GPU hosts (see testbed/README.md)."""

import sys


class TestbedError(RuntimeError):
    """A testbed command failed; the message says why (the CLI prints it and exits 1)."""


def log(msg: str) -> None:
    print(f"[testbed] {msg}", file=sys.stderr, flush=True)
