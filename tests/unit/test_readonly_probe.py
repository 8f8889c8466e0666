"""Read-only commands stay read-only: no CUDA probe and no peer copies on a host whose unit is
up, serving or coming up (``preflight.probe_plan`` with ``read_only``); the retest before a
restart is an operation (``core.restart.Decision.retest``), and the plan says so
(``preflight.RETEST_NOTE``)."""

from __future__ import annotations

import pytest
import runobj

from sglang_deploy.core import preflight, restart
from sglang_deploy.core.hostrecords import LastVerified, P2PVerified
from sglang_deploy.core.hoststate import ServiceState
from sglang_deploy.integration import plan

SERVING = ServiceState.from_json({"ActiveState": "active", "SubState": "running",
                                  "InvocationID": "abc123"})
STOPPED = ServiceState.from_json({"ActiveState": "inactive", "SubState": "dead"})
CRASH_LOOP = ServiceState.from_json({"ActiveState": "activating", "SubState": "auto-restart",
                                     "InvocationID": "abc124"})
STARTING = ServiceState.from_json({"ActiveState": "activating", "SubState": "start",
                                   "InvocationID": "abc125"})
RECORD = P2PVerified.from_json({"gpus": 8, "policy": "require", "nccl_env": {},
                                "verified": ["p2p-data", "p2p-bandwidth"]})


@pytest.mark.parametrize("last_verified, record, p2p_test, deploy", [
    ({"invocation": "abc123"}, RECORD, "auto", "none"),  # verified and recorded
    ({"invocation": "older"}, RECORD, "auto", "basic"),  # running, never verified
    (None, None, "auto", "p2p"),                         # no P2P test recorded yet
    ({"invocation": "abc123"}, RECORD, "always", "p2p"),  # asked to copy every time
])
def test_a_read_only_command_never_probes_a_serving_host(last_verified, record, p2p_test, deploy):
    last_verified = LastVerified.from_json(last_verified)
    assert preflight.probe_plan(SERVING, last_verified, record, p2p_test, read_only=True) == "none"
    # the same host, deployed for real: the deploy's own probe stays as it was
    assert preflight.probe_plan(SERVING, last_verified, record, p2p_test) == deploy


def test_a_read_only_command_still_probes_a_host_that_does_not_serve():
    # nothing holds the GPUs: the plan shows what the pre-flight really finds
    assert preflight.probe_plan(STOPPED, None, None, "auto", read_only=True) == "p2p"


@pytest.mark.parametrize("unit", [CRASH_LOOP, STARTING])
def test_a_read_only_command_never_probes_a_unit_coming_up(unit):
    """Activating (starting, or waiting to restart after a crash): a server takes or is about
    to take the GPUs; a read-only command leaves them alone, whatever is recorded."""
    for record in (RECORD, None):
        assert preflight.probe_plan(unit, None, record, "auto", read_only=True) == "none"
        assert preflight.probe_plan(unit, None, record, "always", read_only=True) == "none"
    # the run: the copies wait for the retest after the stop, whatever is recorded
    assert preflight.probe_plan(unit, None, RECORD, "auto") == "basic"
    assert preflight.probe_plan(unit, None, None, "auto") == "basic"


@pytest.mark.parametrize("skipped, reasons, start, want", [
    (True, ["unit"], False, True), (True, [], False, False), (False, ["release"], False, False),
    (True, [], True, True)])  # a unit coming up, started: stopped and retested first
def test_the_retest_before_a_server_is_replaced(skipped, reasons, start, want):
    decision = restart.Decision(reasons=tuple(restart.Reason(r, r) for r in reasons),
                                start=start, copies_skipped=skipped)
    assert decision.retest is want


def test_read_only_checks_say_the_probe_was_not_run_and_when_p2p_is_retested():
    checks = [preflight.Check("gpu-count", "pass", "8 GPUs"),
              *preflight.check_cuda_probe(None, 8),
              preflight.Check("p2p-data", "skipped", "no probe")]
    got = {c.name: c for c in preflight.use_verified_server(
        checks, "sglang", LastVerified(invocation="older"), None, read_only=True)}
    assert got["cuda-init"].status == "pass"
    assert "read-only" in got["cuda-init"].message
    assert preflight.RETEST_NOTE in got["cuda-init"].message
    assert got["p2p-data"].status == "pass" and preflight.RETEST_NOTE in got["p2p-data"].message
    # a recorded verdict keeps its own p2p checks (``use_p2p_record`` wrote them)
    kept = {c.name: c for c in preflight.use_verified_server(
        checks, "sglang", LastVerified(invocation="older"), RECORD, read_only=True)}
    assert kept["p2p-data"].message == "no probe"


def test_plan_read_only_in_a_plan_run_or_with_pyinfras_dry_flag(monkeypatch):
    """The run object (``integration.ThisRun``, attached when the run starts: while pyinfra
    loads deploy files there is no click context to ask) says whether the run only reads:
    its spec's plan mode, or ``--dry``. The old environment channel counts for nothing."""
    from pyinfra.api import State
    from pyinfra.context import ctx_state

    from sglang_deploy.core.runspec import PLAN, RunSpec

    monkeypatch.setenv("SGLANG_DEPLOY_PLAN", "1")
    for spec, dry, read_only in ((RunSpec(), False, False), (RunSpec(), True, True),
                                 (RunSpec(mode=PLAN), False, True)):
        state = State()
        with ctx_state.use(state):
            runobj.start(state, spec, dry=dry, checked=False)
            assert plan.read_only() is read_only
            assert plan.planning() is spec.planning
