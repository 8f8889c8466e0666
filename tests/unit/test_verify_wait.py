"""verifyloop.wait_until_ready (the shell around Verifier) over a fake host: no real waits."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from sglang_deploy.core.verify import Verifier
from sglang_deploy.stages.verifyloop import wait_until_ready

LOGS = Path(__file__).resolve().parent.parent / "fixtures" / "logs"


class FakeHost:
    """Answers each poll command with the next canned poll; records the commands."""

    def __init__(self, polls):
        self.polls, self.commands = list(polls), []

    def run_shell_command(self, cmd, print_output=False):
        self.commands.append(cmd)
        return True, SimpleNamespace(stdout=json.dumps(self.polls.pop(0)) + "\n", stderr="")


def journal(name):
    rows = [json.loads(x) for x in (LOGS / name).read_text().splitlines() if x.strip()]
    return [{"t": r["ts"], "msg": r["line"]} for r in rows]


def ready_host_and_verifier():
    """A host whose first poll reads a healthy 0.5.12.post1 journal to the ready line and
    whose second answers /health, /v1/models and a generation; a Verifier for it."""
    service = {"ActiveState": "active", "SubState": "running", "InvocationID": "inv1"}
    models = {"status": 200, "body": json.dumps({"data": [{"id": "glm-5"}]})}
    host = FakeHost([
        {"now": 100.0, "service": service, "journal": journal("healthy-0.5.12.post1.jsonl")},
        {"now": 100.1, "service": service, "journal": [], "health": {"status": 200},
         "models": models, "generate": {"status": 200, "body": "{}"}},
    ])
    verifier = Verifier(sglang_version="0.5.12.post1", expect_autotune=True, cuda_graph=False,
                        served_model_name="glm-5", overall_timeout_s=60, phase_timeouts={})
    return host, verifier


def test_api_is_asked_at_once_when_the_log_says_ready():
    host, verifier = ready_host_and_verifier()
    sleeps = []
    decision = wait_until_ready(host, verifier, tool="/t/hoststate.py", service="sglang", port=30000,
                                host_addr="127.0.0.1", secrets="/etc/sglang/secrets.env", poll_s=0.5,
                                clock=lambda: 0.0, sleep=sleeps.append)
    assert decision.kind == "ready"
    assert "--http" not in host.commands[0] and "--http" in host.commands[1]
    assert sleeps == []  # the HTTP poll followed the ready line without a poll interval


def test_a_crash_on_the_verifiers_generation_is_reported_in_phase_serving_with_its_cause():
    """The poll reads the journal before asking the API: a generation that brings the server
    down fails first, and the crash's lines come in the next poll (composed lines)."""
    service = {"ActiveState": "active", "SubState": "running", "InvocationID": "inv1"}
    models = {"status": 200, "body": json.dumps({"data": [{"id": "glm-5"}]})}
    v = Verifier(sglang_version="0.5.12.post1", expect_autotune=True, cuda_graph=False,
                 served_model_name="glm-5", overall_timeout_s=60, phase_timeouts={})
    d = v.observe({"now": 100.0, "service": service,
                   "journal": journal("healthy-0.5.12.post1.jsonl")})
    assert d.kind == "wait" and v.wants_http()
    d = v.observe({"now": 100.1, "service": service, "journal": [], "health": {"status": 200},
                   "models": models, "generate": {"status": None, "error": "RemoteDisconnected"}})
    assert d.kind == "wait"
    crash = ["[2026-03-01 12:01:00 TP0] Scheduler hit an exception: Traceback (most recent call last):",
             '  File "/x/sglang/srt/managers/scheduler.py", line 1594, in event_loop_overlap',
             "    batch_result = self.run_batch(batch)",
             "IndexError: index 4096 is out of bounds for dimension 0 with size 4096",
             "[2026-03-01 12:01:00] Received sigquit from a child process. It usually means the child failed."]
    d = v.observe({"now": 100.6, "service": {**service, "ActiveState": "failed", "SubState": "failed"},
                   "journal": [{"t": 100.5, "msg": x} for x in crash]})
    assert d.kind == "fail"
    assert d.details["phase"] == "serving" and d.details["cause"] == "scheduler-exception"
    assert "phase `serving`" in d.message and "IndexError" in d.message
    assert d.details["hints"] and "scheduler" in d.details["hints"][0]


def test_an_api_failure_without_a_crash_still_fails_on_the_next_poll():
    service = {"ActiveState": "active", "SubState": "running", "InvocationID": "inv1"}
    v = Verifier(sglang_version="0.5.12.post1", expect_autotune=True, cuda_graph=False,
                 served_model_name="glm-5", overall_timeout_s=60, phase_timeouts={})
    v.observe({"now": 100.0, "service": service, "journal": journal("healthy-0.5.12.post1.jsonl")})
    wrong = {"status": 503, "body": "Service Unavailable"}
    poll = {"now": 100.1, "service": service, "journal": [], "health": {"status": 200},
            "models": wrong}
    assert v.observe(poll).kind == "wait"
    d = v.observe({**poll, "now": 100.6})
    assert d.kind == "fail" and "/v1/models answers 503" in d.message
    assert d.details["phase"] == "serving" and d.details["cause"] is None


def test_the_poll_that_first_sees_the_ready_line_says_health_is_asked_next_not_none():
    host, verifier = ready_host_and_verifier()
    shown, ticks = [], iter(range(5, 1000, 5))
    decision = wait_until_ready(host, verifier, tool="/t/hoststate.py", service="sglang", port=30000,
                                host_addr="127.0.0.1", secrets="/etc/sglang/secrets.env", poll_s=0.5,
                                clock=lambda: float(next(ticks)), sleep=lambda s: None,
                                log=shown.append)
    assert decision.kind == "ready"
    assert "log says ready; checking /health next" in shown
    assert not any("None" in line for line in shown)
