"""The verifier's loops on a host (the I/O around ``core.verify``): poll the host through
pyinfra's connection, hand each poll to the pure judge, wait, and raise ``VerifyError`` with
the phase reached, the exit status and the relevant log lines.

``wait_until_ready`` follows a (re)started server until ``Verifier`` decides;
``wait_serving`` checks a running server (``check_serving``) until it serves or a deadline.
"""

from __future__ import annotations

import json
import time

from sglang_deploy.core.errors import VerifyError
from sglang_deploy.core.verify import Decision, Verifier, check_serving, poll_command


def wait_until_ready(host, verifier: Verifier, *, tool: str, service: str, port: int,
                     host_addr: str, secrets: str, poll_s: float, log=None,
                     clock=time.time, sleep=None, watch=None) -> Decision:
    """Poll the host until the verifier decides; raise VerifyError on failure.

    WATCH (a node of a multi-node group, ``stages.group.groupops.Watch``): before each poll
    ``watch.abort()`` gives the error to raise when another node failed; the node's own
    ready decision stands (its group is judged as one afterwards, ``groupops.group_ready``)."""
    import gevent

    sleep = sleep or gevent.sleep
    cursor, last_shown, last_text = None, 0.0, ""
    while True:
        stop = watch.abort() if watch is not None else None
        if stop is not None:
            raise stop
        asked_http = verifier.wants_http()
        cmd = poll_command(tool, service, port, host_addr, cursor, verifier.invocation,
                           asked_http, verifier.require_generate, secrets)
        ok, output = host.run_shell_command(cmd, print_output=False)
        if not ok:
            raise VerifyError(what="the verifier's poll of the host answers",
                              found=f"poll failed: {output.stderr[-500:]}",
                              fix="check the SSH connection and that python3 exists on the host")
        poll = json.loads(output.stdout.strip().splitlines()[-1])
        cursor = poll.get("cursor") or cursor
        decision = verifier.observe(poll)
        if decision.kind == "ready":
            return decision
        if decision.kind == "fail":
            d = decision.details
            lines = "\n".join(f"    {line}" for line in d.get("log", [])[-40:])
            raise VerifyError(
                what="the server reaches `The server is fired up and ready to roll!` and serves",
                found=(f"{decision.message}; phase reached: {d.get('phase')}; unit "
                       f"{d.get('state')}; exit {d.get('exit')}"
                       + (f"; {d['progress']}" if d.get("progress") else "")
                       + (f"\n  relevant log lines:\n{lines}" if lines else "")),
                fix="".join(f"{h}\n" for h in d.get("hints", []))
                    + f"read `journalctl -u {service} -b` on the host; fix the cause above and re-run "
                    "the deploy (it converges from where it stopped)",
            )
        now = clock()
        if log and (decision.message != last_text and now - last_shown >= 2.0 or now - last_shown >= 10):
            log(decision.message)
            last_shown, last_text = now, decision.message
        if verifier.wants_http() and not asked_http:
            continue  # the log just said ready: ask the API at once, not one poll interval later
        sleep(poll_s)


def wait_serving(host, *, tool: str, service: str, port: int, host_addr: str, secrets: str,
                 served_model_name: str, require_generate: bool, timeout_s: float,
                 poll_s: float, clock=time.monotonic, sleep=None, worker: bool = False
                 ) -> Decision:
    """Poll a running server until it serves, or raise VerifyError at the deadline (WORKER:
    a group's node of rank >= 1, up with its unit running and /health 200)."""
    import gevent

    sleep = sleep or gevent.sleep
    deadline = clock() + timeout_s
    while True:
        generate = require_generate and not worker
        cmd = poll_command(tool, service, port, host_addr, None, None, True, generate,
                           secrets, journal=False)
        ok, output = host.run_shell_command(cmd, print_output=False)
        decision = (check_serving(json.loads(output.stdout.strip().splitlines()[-1]),
                                  served_model_name, generate, worker=worker)
                    if ok else Decision("wait", f"poll failed: {output.stderr[-300:]}"))
        if decision.kind == "ready":
            return decision
        if decision.kind == "fail" or clock() > deadline:
            raise VerifyError(
                what=f"the running {service} server (not restarted) answers /health, /v1/models "
                     "and a generation",
                found=decision.message + (f" (after {timeout_s:g}s)" if decision.kind == "wait" else ""),
                fix=f"read `journalctl -u {service} -b` on the host; re-run the deploy, or roll "
                    "back with `pyinfra INVENTORY rollback.py --limit HOST`")
        sleep(poll_s)
