"""The controller's report files of a deploy: each host's verification summary
(``core.report``) and its last data-verified P2P matrix, the history `sglang-deploy report`
draws. The folder is the run spec's ``reports`` (``core/runspec.py``: the rollout sets it per
batch) or ``.sglang-deploy/reports``. ``emit`` also puts the summary in the run journal
(``integration/journal.py``: the host's ``report``), for the command that started the run.
Every file is written atomically (``atomicfile``)."""

from __future__ import annotations

import json
from pathlib import Path

from sglang_deploy.controller import atomicfile
from sglang_deploy.core import journal as shape
from sglang_deploy.core.report import format_summary
from sglang_deploy.core.runspec import RunSpec
from sglang_deploy.integration import journal

DEFAULT_REPORT_DIR = Path(".sglang-deploy/reports")
#: the last data-verified P2P matrix of each host (``sglang-deploy report`` draws it)
P2P_DIR = Path(".sglang-deploy/p2p")


def report_dir(spec: RunSpec) -> Path:
    """The folder of the per-host summaries of a run of SPEC."""
    return Path(spec.reports) if spec.reports else DEFAULT_REPORT_DIR


def emit(summary: dict) -> None:
    from pyinfra import logger

    from sglang_deploy.integration.integration import this_run

    logger.info(format_summary(summary))
    atomicfile.write(report_dir(this_run().spec) / f"{summary['host']}.json",
                     json.dumps(summary, indent=2, sort_keys=True) + "\n")
    journal.record(summary["host"], shape.REPORT, summary)


def write_p2p(host: str, record: dict, folder: Path | None = None) -> Path:
    return atomicfile.write((folder or P2P_DIR) / f"{host}.json",
                            json.dumps(record, indent=2, sort_keys=True) + "\n")
