"""The P2P matrix in the deploy's output, and the controller's record of the last full test.

On a terminal the matrix is a coloured heatmap (rich); otherwise (a log file, a rollout's
captured output) plain text of the same layout. pyinfra's log handler writes through click,
which drops colour codes when stderr is not a terminal, so the plain layout must carry the
verdicts by itself, and does.

A deploy that ran the data-verified peer copies also writes the matrix's cells to
``.sglang-deploy/p2p/<host>.json`` on the controller (``sglang-deploy report`` draws it).
"""

from __future__ import annotations

import datetime
import functools
import io
import os
import sys
import time

from pyinfra import host, logger

from sglang_deploy.controller import reports
from sglang_deploy.core import preflight


@functools.lru_cache(maxsize=1)
def colour_terminal() -> bool:
    """Whether pyinfra's output (stderr) is a terminal that takes colour (rich decides:
    NO_COLOR, TERM=dumb and FORCE_COLOR are honoured). Asked once per run, not per host;
    without a terminal and without FORCE_COLOR the answer is no without importing rich."""
    if not (sys.stderr.isatty() or os.environ.get("FORCE_COLOR")):
        return False
    from rich.console import Console

    console = Console(stderr=True)
    return console.is_terminal and console.color_system is not None


def ansi(renderable, width: int) -> str:
    """A rich RENDERABLE as text with colour codes, for a terminal WIDTH columns wide."""
    from rich.console import Console

    buffer = io.StringIO()
    Console(file=buffer, force_terminal=True, width=width, color_system="256").print(
        renderable, soft_wrap=True)
    return buffer.getvalue().rstrip("\n")


def matrix_text(details: dict, colour: bool) -> str:
    if not colour or not details.get("cells"):
        return details["matrix"]
    return ansi(preflight.rich_matrix(details["cells"], details["gpus"], details.get("min_gbps")),
                width=80)


def show(checks: list, record: bool, policy: str | None = None) -> None:
    """Log the matrix of CHECKS (if any) under this host; with RECORD (the peer copies ran),
    keep it on the controller for the report."""
    check = next((c for c in checks if c.name == "p2p-matrix"), None)
    if check is None:
        return
    logger.info(f"{host.print_prefix}P2P matrix:\n{matrix_text(check.details, colour_terminal())}")
    if record and check.details.get("cells"):
        reports.write_p2p(host.name, {
            "host": host.name,
            "measured_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "epoch_s": round(time.time(), 3),
            "gpus": check.details["gpus"], "min_gbps": check.details.get("min_gbps"),
            "policy": policy, "cells": check.details["cells"],
            "checks": [{"name": c.name, "status": c.status, "message": c.message}
                       for c in checks if c.name.startswith("p2p-") and c.name != "p2p-matrix"],
        })
