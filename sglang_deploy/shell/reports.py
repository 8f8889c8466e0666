"""The controller's report files of a deploy: each host's verification summary
(``core.report``) and its last data-verified P2P matrix. The folders are read at call time:
``SGLANG_DEPLOY_REPORTS`` (the rollout sets it per batch) or ``.sglang-deploy/reports``."""

from __future__ import annotations

import json
import os
from pathlib import Path

from sglang_deploy.core.report import format_summary

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
    folder = report_dir()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{summary['host']}.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")


def write_p2p(host: str, record: dict, folder: Path | None = None) -> Path:
    folder = folder or P2P_DIR
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{host}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    tmp.replace(path)
    return path
