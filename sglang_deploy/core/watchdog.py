"""The watchdog's judgement after ready (pure, stdlib only: shipped to the host as a tool
beside ``remote/watchdog.py``).

A server is judged by what it does, never by ``/health`` alone (vLLM#46811, SGLang#22779):

- ``probe``: a 1-token generation under a deadline, its outcome and time;
- ``busy`` / ``tokens``: requests running or waiting and the server's own
  ``sglang:generation_tokens_total`` counter (``/metrics``; SGLang increments it when a
  request FINISHES, in ``TokenizerMetricsCollector.observe_one_finished_request``), or,
  without metrics, the requests of ``/v1/loads``;
- ``journal_at``: when the unit last wrote to the journal.

The rule (``judge``), one observation per tick:

- a probe that fails ``probe_failures`` times in a row while the token counter did not move
  (or cannot be read) is a wedge;
- one failed probe is enough when the server has also been STALLED: requests waiting while
  the counter stayed flat for ``stall_s`` (without metrics: while the journal was silent for
  ``journal_silence_s``);
- any progress (the counter moved, a probe answered) clears the streak: a slow server that
  still finishes requests is never a wedge, however slow;
- a server that does not answer HTTP at all (connection refused, unit not active) is
  ``down``, not wedged: systemd's ``Restart=`` and the deploy own that case.

``decide`` turns a wedge into an action under the policy and the never-act conditions, and
``capped`` keeps restarts within ``max_restarts_per_hour``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the controller's only: this file is shipped alone to the host
    from sglang_deploy.core.hoststate import WatchdogRead

MODES = ("off", "report", "restart")
HOUR_S = 3600.0


@dataclass(frozen=True)
class Config:
    mode: str = "report"
    interval_s: float = 15.0
    probe_timeout_s: float = 30.0
    probe_failures: int = 3
    stall_s: float = 120.0
    journal_silence_s: float = 120.0
    max_restarts_per_hour: int = 2
    verify_timeout_s: float = 600.0

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Config:
        known = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        cfg = cls(**known)
        if cfg.mode not in MODES:
            raise ValueError(f"watchdog mode {cfg.mode!r}: expected one of {', '.join(MODES)}")
        return cfg


@dataclass(frozen=True)
class Observation:
    """One tick's look at the server (None: could not be read)."""

    at: float                        # wall clock, seconds
    http_up: bool                    # /health (or the port) answered at all
    probe_ok: bool | None = None     # the 1-token generation finished within its deadline
    probe_s: float | None = None
    probe_error: str = ""
    busy: int | None = None          # requests running + waiting
    tokens: float | None = None      # sglang:generation_tokens_total
    journal_at: float | None = None  # last journal entry of the unit
    invocation: str = ""             # the unit's InvocationID: a new one resets the judgement


@dataclass(frozen=True)
class State:
    invocation: str = ""
    tokens: float | None = None       # counter at the last observation
    progress_at: float | None = None  # last moment the server was seen to make progress (or idle)
    fail_streak: int = 0              # probes failed in a row with no progress in between
    first_fail_at: float | None = None
    last_error: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> State:
        d = d or {}
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})


@dataclass(frozen=True)
class Verdict:
    kind: str                       # "healthy" | "slow" | "suspect" | "wedged" | "down"
    evidence: tuple[str, ...] = field(default_factory=tuple)

    @property
    def wedged(self) -> bool:
        return self.kind == "wedged"


def _fmt(v: float) -> str:
    return f"{v:.0f}" if float(v).is_integer() else f"{v:.1f}"


def judge(state: State, obs: Observation, cfg: Config) -> tuple[State, Verdict]:
    """The next state and the verdict on one observation (see the module doc)."""
    if obs.invocation and obs.invocation != state.invocation:
        state = State(invocation=obs.invocation, progress_at=obs.at)
    if not obs.http_up:
        return replace(state, fail_streak=0, first_fail_at=None, tokens=obs.tokens), Verdict(
            "down", ((f"the server does not answer HTTP ({obs.probe_error or 'no answer'}): "
                      "not a wedge, systemd's Restart= and the deploy own a server that is down"),))
    moved = (obs.tokens is not None and state.tokens is not None and obs.tokens > state.tokens)
    idle = obs.busy == 0
    progress_at = state.progress_at if state.progress_at is not None else obs.at
    if moved or idle or obs.probe_ok:
        progress_at = obs.at
    new = replace(state, tokens=obs.tokens if obs.tokens is not None else state.tokens,
                  progress_at=progress_at)
    if obs.probe_ok or moved:
        new = replace(new, fail_streak=0, first_fail_at=None, last_error="")
        # failed, but requests still finish: slow, not wedged (moved: the tokens were read)
        if obs.probe_ok is False and obs.tokens is not None:
            return new, Verdict("slow", ((
                f"1-token generation failed ({obs.probe_error}) but "
                f"generation_tokens_total rose to {_fmt(obs.tokens)}: progressing"),))
        return new, Verdict("healthy")
    if obs.probe_ok is None:
        return new, Verdict("healthy" if state.fail_streak == 0 else "suspect")
    # the probe failed and nothing moved
    streak = state.fail_streak + 1
    first = state.first_fail_at if state.first_fail_at is not None else obs.at
    new = replace(new, fail_streak=streak, first_fail_at=first, last_error=obs.probe_error)
    evidence = [(f"1-token generation failed {streak} time(s) in a row since "
                 f"{_fmt(obs.at - first)}s ago (last: {obs.probe_error})")]
    stalled = False
    if obs.busy:
        flat_for = obs.at - progress_at
        if obs.tokens is not None and flat_for >= cfg.stall_s:
            stalled = True
            evidence.append(f"{obs.busy} request(s) waiting while generation_tokens_total stayed "
                            f"at {_fmt(obs.tokens)} for {_fmt(flat_for)}s (stall_s={_fmt(cfg.stall_s)})")
        if obs.journal_at is not None:
            silent = obs.at - obs.journal_at
            if silent >= cfg.journal_silence_s:
                evidence.append(f"journal silent for {_fmt(silent)}s while {obs.busy} request(s) wait")
                stalled = stalled or obs.tokens is None
    elif obs.tokens is not None:
        evidence.append(f"generation_tokens_total flat at {_fmt(obs.tokens)}")
    if streak >= cfg.probe_failures or stalled:
        return new, Verdict("wedged", tuple(evidence))
    return new, Verdict("suspect", tuple(evidence))


# ------------------------------------------------------------------ acting


@dataclass(frozen=True)
class Context:
    """What the host says about acting now."""

    lock_busy: bool = False          # the deploy lock is held (a deploy, rollout or rebuild)
    lock_owner: str = ""
    verified: bool = True            # the running invocation is the one a deploy verified
    group_nodes: int = 1             # nnodes of the server's group (1: a single host)
    gpu_fatal: str = ""              # a GPU health finding judged fatal (empty: none)
    restarts: tuple[float, ...] = () # wall-clock moments of this host's earlier restarts


@dataclass(frozen=True)
class Action:
    kind: str    # "none" | "report" | "restart"
    reason: str


def capped(restarts: tuple[float, ...], now: float, per_hour: int) -> bool:
    """Has this host already had PER_HOUR restarts in the last hour?"""
    return sum(1 for t in restarts if now - t < HOUR_S) >= per_hour


def decide(verdict: Verdict, cfg: Config, ctx: Context, now: float) -> Action:
    """What to do about VERDICT: nothing unless wedged; then report only, or restart when the
    policy says so and none of the never-act conditions holds (each named in the reason)."""
    if not verdict.wedged or cfg.mode == "off":
        return Action("none", verdict.kind)
    if cfg.mode == "report":
        return Action("report", "watchdog=report: reported only")
    if ctx.group_nodes > 1:  # first: whatever else holds, the watchdog never restarts a group
        return Action("report", f"rank 0 of a {ctx.group_nodes}-node group: a group restarts as "
                                "one, from the controller (`pyinfra ... deploy.py` or "
                                "`sglang-deploy rollout`)")
    if ctx.lock_busy:
        return Action("report", f"the deploy lock is held ({ctx.lock_owner or 'a deploy'}): "
                                "a deploy, rollout or rebuild owns the host")
    if not ctx.verified:
        return Action("report", "the running server was never verified by a deploy")
    if ctx.gpu_fatal:
        return Action("report", f"a GPU is judged fatal ({ctx.gpu_fatal}): a restart would land "
                                "on it")
    if capped(ctx.restarts, now, cfg.max_restarts_per_hour):
        return Action("report", f"restart cap reached: {cfg.max_restarts_per_hour} restart(s) in "
                                "the last hour (watchdog_max_restarts_per_hour)")
    return Action("restart", "wedged: take out of the router, restart, verify, put back")


# ------------------------------------------------------------------ metrics text

_SAMPLE = re.compile(r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{[^}]*\})?\s+(?P<value>\S+)")


def parse_metrics(text: str) -> dict[str, float]:
    """Sum of each series over its labels (Prometheus text format; comments skipped)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        try:
            value = float(m["value"])
        except ValueError:
            continue
        out[m["name"]] = out.get(m["name"], 0.0) + value
    return out


def from_metrics(series: dict[str, float]) -> tuple[int | None, float | None]:
    """(busy, generated tokens) from SGLang's metrics (names as in the 0.5.12.post1 wheel)."""
    tokens = series.get("sglang:generation_tokens_total")
    running = series.get("sglang:num_running_reqs")
    queued = series.get("sglang:num_queue_reqs")
    busy = None if running is None and queued is None else int((running or 0) + (queued or 0))
    return busy, tokens


def from_loads(doc: object) -> int | None:
    """Requests running + waiting from ``/v1/loads`` (None when it cannot say)."""
    if not isinstance(doc, dict):
        return None
    agg = doc.get("aggregate") or {}
    if "total_running_reqs" in agg or "total_waiting_reqs" in agg:
        return int(agg.get("total_running_reqs") or 0) + int(agg.get("total_waiting_reqs") or 0)
    loads = doc.get("loads")
    if isinstance(loads, list):
        return sum(int(x.get("num_running_reqs", 0)) + int(x.get("num_waiting_reqs", 0)) for x in loads)
    return None


# ------------------------------------------------------------------ records


def in_flight_text(event: Mapping[str, Any]) -> str:
    """What a restart ended, as its event counts it (empty when not read): the requests on the
    wedged server when it was taken out. The router retries those that had sent nothing
    (whole requests; OpenAI streams before their first token); a stream that had begun is
    cut and lost, and is among them."""
    n = (event.get("in_flight") or {}).get("server")
    if event.get("action") != "restart" or not isinstance(n, int):
        return ""
    return (f"; {n} request(s) in flight on it when taken out (the router retries those not "
            "yet begun; a stream already begun is lost)")


def summary_line(host: str, events: list[dict[str, Any]], now: float) -> str | None:
    """One line for `status` under the table: the host's last watchdog event and its restarts
    in the last hour (None when it has none)."""
    if not events:
        return None
    last = events[-1]
    restarts = sum(1 for e in events if e.get("action") == "restart" and now - float(e.get("at", 0)) < HOUR_S)
    ev = "; ".join(last.get("evidence") or [])
    return (f"watchdog {host}: {last.get('verdict')} -> {last.get('action')} "
            f"({last.get('outcome') or last.get('reason', '')}) at {last.get('at_iso', '?')}"
            f"{in_flight_text(last)}; "
            f"{restarts} restart(s) in the last hour" + (f"; evidence: {ev}" if ev else ""))


def status_doc(read: WatchdogRead | None) -> dict[str, Any] | None:
    """The watchdog of one host as ``status`` shows it, from the host-state read's
    ``watchdog`` (its unit, ``state.json``, last events, the host's clock): None when none
    is installed and it never recorded an event. ``text``: the line under the table."""
    if read is None:
        return None
    svc, st, events = read.service, read.state, read.events
    if svc.load_state in (None, "not-found") and not events:
        return None
    now = float(read.now or st.at or 0)
    unit = svc.state_text
    restarts = sum(1 for e in events if e.action == "restart"
                   and now - float(e.at or 0) < HOUR_S)
    text = f"{unit}, " + (f"{st.verdict} {_fmt(max(0.0, now - float(st.at)))}s ago"
                          if st.verdict and st.at else "no observation yet")
    last = events[-1] if events else None
    if last is not None:
        text += (f"; last event {last.at_iso or '?'}: {last.verdict} -> "
                 f"{last.action} ({last.outcome or last.reason or ''})"
                 f"{in_flight_text(last.raw)}")
    text += f"; {restarts} restart(s) in the last hour"
    return {"unit": unit, "verdict": st.verdict, "observed_at": st.at,
            "last_event": dict(last.raw) if last is not None else None,
            "restarts_last_hour": restarts, "text": text}


def restart_of(events: list[dict[str, Any]], invocation: str) -> dict[str, Any] | None:
    """The watchdog's restart that concerns the server's run INVOCATION (its last start), from
    the host's events (oldest first): the restart that STARTED it (the event's
    ``new_invocation``), else the one that ENDED it (the wedged run was this one, and no new
    run followed). None: the watchdog did not restart around this run."""
    if not invocation:
        return None
    for e in reversed(events):
        if not isinstance(e, dict) or e.get("action") != "restart":
            continue
        if e.get("new_invocation") == invocation:
            relation = "started"
        elif e.get("invocation") == invocation:
            relation = "ended"
        else:
            continue
        return {"relation": relation, "at": e.get("at_iso"), "verdict": e.get("verdict"),
                "evidence": list(e.get("evidence") or []), "outcome": e.get("outcome"),
                "wedged_invocation": e.get("invocation"), "new_invocation": e.get("new_invocation")}
    return None


def restart_line(restart: dict[str, Any] | None) -> str | None:
    """``restart_of``'s finding for a person (``logs --explain``), or None."""
    if not restart:
        return None
    what = ("this run was started by the watchdog's restart" if restart["relation"] == "started"
            else "the watchdog restarted this run")
    ev = "; ".join(restart.get("evidence") or [])
    return (f"{what} at {restart.get('at') or '?'} ({restart.get('verdict')}"
            + (f": {ev}" if ev else "") + f"); outcome: {restart.get('outcome') or '?'}")
