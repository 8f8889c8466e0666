"""Post-deploy verifier: blocks until the model really serves, or fails fast and says why.

The pure core is ``Verifier.observe(poll)``: it takes one poll of the host (systemd
properties, new journal lines, HTTP answers) and returns a ``Decision`` (wait / ready /
fail); ``check_serving`` judges one poll of a server that was not restarted, and
``poll_command`` is the host command of one poll. The loops that run that command on the
host and wait between polls (``wait_until_ready``, ``wait_serving``) are the thin shell, in
``stages/verifyloop.py``.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from typing import Any

from sglang_deploy.core.hoststate import ServiceState
from sglang_deploy.core.logs.parse import Event, StartupTracker

# tracker phase -> deadline key (data: verify_phase_timeouts)
PHASE_DEADLINE_KEY = {
    "starting": "starting", "loading": "loading", "loaded": "kv_cache", "kv_cache": "kv_cache",
    "autotune": "autotune", "autotuned": "capture", "capture": "capture", "captured": "http",
    "http": "warmup", "warmup": "warmup", "ready": "warmup",
}

CRASH_STATES = {"failed", "inactive", "deactivating"}


@dataclass
class Decision:
    kind: str  # wait | ready | fail
    message: str = ""
    details: dict[str, Any] = field(default_factory=dict)


@dataclass
class Verifier:
    """Pure readiness decision over a stream of polls."""

    sglang_version: str
    expect_autotune: bool
    cuda_graph: bool
    served_model_name: str
    overall_timeout_s: float
    phase_timeouts: dict[str, Any]
    require_generate: bool = True
    #: a group's node of rank >= 1: it never serves the API; it is up when its dummy health
    #: server answers /health 200, which SGLang starts only once its schedulers are ready
    worker: bool = False
    started_at: float | None = None
    invocation: str | None = None
    tracker: StartupTracker = None  # type: ignore[assignment]
    phase_since: float | None = None
    last_phase: str | None = None
    http_failures: int = 0

    def __post_init__(self) -> None:
        self.tracker = StartupTracker(self.sglang_version, expect_autotune=self.expect_autotune,
                                      cuda_graph=self.cuda_graph)

    def _fail(self, message: str, service: dict[str, Any], **details: Any) -> Decision:
        diag = self.tracker.diagnosis()
        details.update(
            phase=self.failure_phase(diag),
            exit=f"{service.get('ExecMainCode', '?')}/{service.get('ExecMainStatus', '?')}",
            state=f"{service.get('ActiveState')}/{service.get('SubState')}",
            log=self.tracker.relevant_lines(),
            hints=[diag["fix"]] if diag["fix"] else [],
            cause=diag["cause"],        # (None, as the fix and summary, unless it failed)
            summary=diag["summary"],
        )
        return Decision("fail", message, details)

    def failure_phase(self, diag: dict[str, Any] | None = None) -> str:
        """The phase a failure belongs to: what its lines say (``serving`` after the
        ready line), else the phase the startup reached."""
        diag = diag if diag is not None else self.tracker.diagnosis()
        if diag["failed"] and diag["phase"]:
            phase: str = diag["phase"]
            return phase
        return "serving" if self.tracker.ready_seen else self.tracker.phase

    def _crash_text(self) -> str:
        diag = self.tracker.diagnosis()
        return f": {diag['cause']}: {diag['summary']}" if diag["failed"] else ""

    def observe(self, poll: dict[str, Any]) -> Decision:
        now = poll["now"]
        service = poll.get("service", {})
        if self.started_at is None:
            self.started_at = now
        inv = service.get("InvocationID") or None
        self.invocation = self.invocation or inv

        events = [e for entry in poll.get("journal", [])
                  for e in self.tracker.feed(entry["msg"], entry["t"])]
        violation = next((e for e in events if e.kind == "violation"), None)
        if self.tracker.phase != self.last_phase:
            self.last_phase, self.phase_since = self.tracker.phase, now
        failed = self._crashed(service, inv, violation) or self._overdue(now, service)
        if failed is not None:
            return failed
        if self.worker:
            return self._worker_ready(poll, now)
        if not self.tracker.ready_seen:
            return Decision("wait", self.progress_text(now))
        return self._api_ready(poll, now, service)

    def _crashed(self, service: dict[str, Any], inv: str | None, violation: Event | None
                 ) -> Decision | None:
        """A failure the service or its lines show: startup out of order, a restart, an
        exit, a fatal line."""
        if violation is not None:
            return self._fail(f"startup out of order: {violation.message}", service)
        if inv and self.invocation and inv != self.invocation:
            return self._fail(
                f"the service restarted during startup (invocation {self.invocation[:8]} -> "
                f"{inv[:8]}): it crashed in phase `{self.failure_phase()}`{self._crash_text()}",
                service)
        active, sub = service.get("ActiveState"), service.get("SubState")
        if active in CRASH_STATES or sub == "auto-restart":
            return self._fail(
                f"the server exited in phase `{self.failure_phase()}` "
                f"(status {service.get('ExecMainCode')}/{service.get('ExecMainStatus')})"
                f"{self._crash_text()}", service)
        if self.tracker.fatal:
            # the process may still be dying: report now, the lines are conclusive
            return self._fail(f"fatal error in phase `{self.failure_phase()}`"
                              f"{self._crash_text()}", service)
        return None

    def _overdue(self, now: float, service: dict[str, Any]) -> Decision | None:
        """A phase's deadline or the overall one passed."""
        elapsed = self._since(now, self.started_at)
        key = PHASE_DEADLINE_KEY.get(self.tracker.phase, "warmup")
        limit = self.phase_timeouts.get(key)
        if limit is not None and self._since(now, self.phase_since) > limit:
            return self._fail(
                f"startup stalled in phase `{self.tracker.phase}`: no progress for "
                f"{self._since(now, self.phase_since):.0f}s "
                f"(limit {limit}s, verify_phase_timeouts.{key})",
                service, progress=self.progress_text(now))
        if elapsed > self.overall_timeout_s:
            return self._fail(
                f"not ready after {elapsed:.0f}s (verify_timeout_s {self.overall_timeout_s})",
                service, progress=self.progress_text(now))
        return None

    @staticmethod
    def _since(now: float, at: float | None) -> float:
        """Seconds from AT (``started_at``, ``phase_since``: set by the first poll) to NOW."""
        if at is None:
            raise RuntimeError("the verifier was asked for a time before its first poll")
        return now - at

    def _ready(self, message: str, now: float) -> Decision:
        return Decision("ready", message, {
            "phase_durations": self.tracker.phase_durations,
            "time_to_ready_s": round(self._since(now, self.started_at), 2),
            "invocation": self.invocation,
        })

    def _worker_ready(self, poll: dict[str, Any], now: float) -> Decision:
        """A group's node of rank >= 1 is up when its /health answers 200."""
        health = poll.get("health") or {}
        if health.get("status") != 200:
            return Decision("wait", self.progress_text(now))
        return self._ready(f"node up after {self._since(now, self.started_at):.1f}s: its "
                           "schedulers are ready (/health 200)", now)

    def _api_ready(self, poll: dict[str, Any], now: float, service: dict[str, Any]) -> Decision:
        """The log says ready: now the API must agree (health, models, a generation)."""
        health = poll.get("health") or {}
        if health.get("status") != 200:
            return Decision("wait", f"log says ready; {_health_text(health)}")
        models = poll.get("models") or {}
        if models.get("status") != 200:
            return self._http_failed(
                f"/v1/models answers {models.get('status')}: {models.get('body', '')[:200]}",
                service)
        ids = _model_ids(models)
        if self.served_model_name not in ids:
            return self._fail(f"/v1/models serves {ids}, not `{self.served_model_name}`", service)
        if self.require_generate:
            gen = poll.get("generate") or {}
            if gen.get("status") != 200:
                return self._http_failed(
                    f"a one-token generation failed: {gen.get('status') or gen.get('error')} "
                    f"{gen.get('body', '')[:200]}", service)
        return self._ready(f"ready after {self._since(now, self.started_at):.1f}s", now)

    def _http_failed(self, message: str, service: dict[str, Any]) -> Decision:
        """An API check failed after the ready line. The poll read the journal BEFORE
        asking the API: a crash the request caused is in the next poll's lines. Wait for
        that one poll, then fail (with the crash's cause if the lines name one)."""
        self.http_failures += 1
        if self.http_failures < 2:
            return Decision("wait", f"log says ready; {message} (checking the log once more)")
        return self._fail(message, service)

    def wants_http(self) -> bool:
        return self.worker or bool(self.tracker.ready_seen)

    def progress_text(self, now: float) -> str:
        prog = self.tracker.shard_progress
        shards = (f", shards {prog[0]}/{prog[1]} ({prog[2]}%)"
                  if prog and self.tracker.phase == "loading" else "")
        return f"phase {self.tracker.phase}{shards}, elapsed {now - (self.started_at or now):.0f}s"


def _health_text(health: dict[str, Any]) -> str:
    """What /health said: its status, the error of a request that got no answer, or (the
    poll that first sees the ready line asks nothing yet) that it is asked next."""
    if not health:
        return "checking /health next"
    answer = health.get("status") or health.get("error") or "no answer"
    return f"/health answers {answer}"


def _model_ids(models: dict[str, Any]) -> list[Any]:
    """The model ids of a /v1/models answer (none when its body is no such list)."""
    try:
        return [m.get("id") for m in json.loads(models.get("body") or "{}").get("data", [])]
    except (ValueError, AttributeError):
        return []


def poll_command(tool: str, service: str, port: int, host_addr: str, cursor: str | None,
                 invocation: str | None, http: bool, generate: bool, secrets: str,
                 journal: bool = True) -> str:
    args = ["python3", tool, "poll", "--service", service, "--port", str(port), "--host", host_addr,
            "--secrets", secrets]
    if cursor:
        args += ["--cursor", cursor]
    if invocation:
        args += ["--invocation", invocation]
    if not journal:
        args.append("--no-journal")
    if http:
        args.append("--http")
        if generate:
            args.append("--generate")
    return shlex.join(args)


def check_serving(poll: dict[str, Any], served_model_name: str, require_generate: bool,
                  worker: bool = False) -> Decision:
    """Pure: does a server that was NOT restarted serve? One poll (with --http) decides:
    wait (not yet answering), ready, or fail (unit down, wrong model, generation refused).
    WORKER: a group's node of rank >= 1, up when its unit runs and /health answers 200."""
    service = poll.get("service", {})
    state = f"{service.get('ActiveState')}/{service.get('SubState')}"
    details = {"state": state, "invocation": service.get("InvocationID") or None,
               "exit": f"{service.get('ExecMainCode', '?')}/{service.get('ExecMainStatus', '?')}"}
    if not ServiceState.from_json(service).serving:
        return Decision("fail", f"the unit is {state}, not active/running", details)
    health = poll.get("health") or {}
    if health.get("status") != 200:
        return Decision("wait", _health_text(health), details)
    if worker:
        return Decision("ready", "node up (not restarted): /health 200",
                        {**details, "phase_durations": {}, "time_to_ready_s": None})
    models = poll.get("models") or {}
    ids = _model_ids(models)
    if models.get("status") != 200 or served_model_name not in ids:
        return Decision("fail", f"/v1/models answers {models.get('status')} serving {ids}, not "
                                f"`{served_model_name}`", details)
    if require_generate:
        gen = poll.get("generate") or {}
        if gen.get("status") != 200:
            return Decision("fail", f"a one-token generation failed: {gen.get('status') or gen.get('error')}",
                            details)
    return Decision("ready", "serving (not restarted)", {**details, "phase_durations": {},
                                                          "time_to_ready_s": None})
