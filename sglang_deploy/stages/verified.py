"""A server verified and its verification kept (the stages' last step): ``verified_summary``
follows a (re)started server from its log until it is ready, or checks a running one by its
API; ``record_verified`` keeps the summary and the known-good copy a rollback restores."""

from __future__ import annotations

import datetime
import json
import shlex

from pyinfra import host, logger

from sglang_deploy.controller import reports
from sglang_deploy.core import data as datamod
from sglang_deploy.core import report, service
from sglang_deploy.core.service import Layout
from sglang_deploy.core.verify import Verifier
from sglang_deploy.integration import outcomes
from sglang_deploy.stages.group import groupops
from sglang_deploy.stages.verifyloop import wait_serving, wait_until_ready


def record_verified(s: datamod.Settings, params: dict, summary: dict) -> None:
    """Keep what was just verified on the host: the summary, and the known-good copy of the
    unit and secrets that a rollback restores (root only)."""
    lay = Layout.of(s)
    # Not promoted (a gate must pass first): kept as a candidate the rollout promotes.
    kg = lay.known_good(promote=s.verify_promote_known_good)
    summary["verified_at"] = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    if summary.get("last_restart") and not summary["last_restart"].get("at"):
        summary["last_restart"] = {**summary["last_restart"], "at": summary["verified_at"]}
    record = json.dumps({**params, "verified_at": summary["verified_at"]}, sort_keys=True)
    q = shlex.quote
    host.run_shell_command(
        f"set -e; install -d -m 700 {q(kg)}; install -m 644 {q(lay.unit_file)} {q(kg + '/unit.tmp')}; "
        f"if test -f {q(lay.secrets_file)}; then install -m 600 {q(lay.secrets_file)} {q(kg + '/secrets.tmp')}; "
        f"mv -f {q(kg + '/secrets.tmp')} {q(kg + '/secrets.env')}; else rm -f {q(kg + '/secrets.env')}; fi; "
        f"mv -f {q(kg + '/unit.tmp')} {q(kg + '/unit.service')}; "
        f"printf '%s\\n' {q(record)} > {q(kg + '/record.tmp')}; mv -f {q(kg + '/record.tmp')} {q(kg + '/record.json')}; "
        f"printf '%s\\n' {q(json.dumps(summary, sort_keys=True))} > {q(lay.last_verified)}",
        print_output=False)
    reports.emit(summary)
    outcomes.verified(summary)  # the host's outcome record: its action and this summary


def verify_and_record(s: datamod.Settings, params: dict, action: str,
                      watch: groupops.Watch | None = None, last_restart: dict | None = None
                      ) -> None:
    """Verify, then keep the result (``verified_summary``, ``record_verified``)."""
    record_verified(s, params, verified_summary(s, params, action, watch, last_restart))


def verified_summary(s: datamod.Settings, params: dict, action: str,
                     watch: groupops.Watch | None = None, last_restart: dict | None = None
                     ) -> dict:
    """Verify: a started server from its log until it is ready, a running one
    (``converged``, ``unchanged``) by its API (raises VerifyError); returns the host's
    summary. WATCH: this host is a node of a group being verified as one (a node of rank
    >= 1 is up when its /health answers; a peer's failure stops it at once). LAST_RESTART:
    the host's last restart and why (``core.restart.last_restart``), kept in the summary
    (``last-verified.json``: ``status`` shows it; the outcome record and the reports)."""
    worker = watch is not None and watch.run.worker(watch.node)
    probe = {"tool": f"{Layout.of(s).tools}/hoststate.py", "service": s.sglang_service,
             "port": s.sglang_port, "host_addr": service.probe_address(s.sglang_host),
             "secrets": service.SECRETS_FILE, "poll_s": s.verify_poll_s}
    if action in ("converged", "unchanged"):
        result = wait_serving(host, served_model_name=params["served_model_name"],
                              require_generate=s.verify_generate, worker=worker,
                              timeout_s=s.verify_phase_timeouts["http"], **probe)
    else:
        verifier = Verifier(
            sglang_version=params["sglang_version"], expect_autotune=params["expect_autotune"],
            cuda_graph=params["cuda_graph"], served_model_name=params["served_model_name"],
            overall_timeout_s=s.verify_timeout_s, phase_timeouts=s.verify_phase_timeouts,
            require_generate=s.verify_generate, worker=worker)
        result = wait_until_ready(host, verifier, **probe, watch=watch,
                                  log=lambda msg: logger.info(f"{host.print_prefix}verify: {msg}"))
    summary = report.host_summary(host.name, params, result)
    summary["action"] = action
    if last_restart:
        summary["last_restart"] = dict(last_restart)
    if watch is not None:
        summary["group"] = watch.run.group.name
        summary["node_rank"] = watch.run.group.rank_of(watch.node)
    return summary
