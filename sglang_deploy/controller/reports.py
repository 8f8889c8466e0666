"""The controller's report files of a deploy: each host's verification summary
(``core.report``) and its last data-verified P2P matrix, the history `sglang-deploy report`
draws. The folders are read at call time: ``SGLANG_DEPLOY_REPORTS`` (the rollout sets it per
batch) or ``.sglang-deploy/reports``. ``emit`` also puts the summary in the run journal
(``integration/journal.py``: the host's ``report``), for the command that started the run.
Every file is written atomically (``atomicfile``)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from sglang_deploy.controller import atomicfile
from sglang_deploy.core import journal as shape
from sglang_deploy.core.report import format_summary
from sglang_deploy.integration import journal

#: the environment variable naming the folder of the per-host summaries
REPORTS_ENV = "SGLANG_DEPLOY_REPORTS"
DEFAULT_REPORT_DIR = Path(".sglang-deploy/reports")
#: the last data-verified P2P matrix of each host (``sglang-deploy report`` draws it)
P2P_DIR = Path(".sglang-deploy/p2p")


def report_dir() -> Path:
    """The folder of the per-host summaries, as the environment names it now."""
    return Path(os.environ.get(REPORTS_ENV, str(DEFAULT_REPORT_DIR)))


def emit(summary: dict) -> None:
    from pyinfra import logger

    logger.info(format_summary(summary))
    atomicfile.write(report_dir() / f"{summary['host']}.json",
                     json.dumps(summary, indent=2, sort_keys=True) + "\n")
    journal.record(summary["host"], shape.REPORT, summary)


def write_p2p(host: str, record: dict, folder: Path | None = None) -> Path:
    return atomicfile.write((folder or P2P_DIR) / f"{host}.json",
                            json.dumps(record, indent=2, sort_keys=True) + "\n")
