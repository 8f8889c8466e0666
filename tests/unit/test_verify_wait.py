"""verify.wait_until_ready (the shell around Verifier) over a fake host: no real waits."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from sglang_deploy.core.verify import Verifier, wait_until_ready

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


def test_api_is_asked_at_once_when_the_log_says_ready():
    service = {"ActiveState": "active", "SubState": "running", "InvocationID": "inv1"}
    models = {"status": 200, "body": json.dumps({"data": [{"id": "glm-5"}]})}
    host = FakeHost([
        {"now": 100.0, "service": service, "journal": journal("healthy-0.5.12.post1.jsonl")},
        {"now": 100.1, "service": service, "journal": [], "health": {"status": 200},
         "models": models, "generate": {"status": 200, "body": "{}"}},
    ])
    verifier = Verifier(sglang_version="0.5.12.post1", expect_autotune=True, cuda_graph=False,
                        served_model_name="glm-5", overall_timeout_s=60, phase_timeouts={})
    sleeps = []
    decision = wait_until_ready(host, verifier, tool="/t/hoststate.py", service="sglang", port=30000,
                                host_addr="127.0.0.1", secrets="/etc/sglang/secrets.env", poll_s=0.5,
                                clock=lambda: 0.0, sleep=sleeps.append)
    assert decision.kind == "ready"
    assert "--http" not in host.commands[0] and "--http" in host.commands[1]
    assert sleeps == []  # the HTTP poll followed the ready line without a poll interval
