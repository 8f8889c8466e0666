"""The restart decision (pure): from a host's typed facts and what this run wants of it, what
happens to its server and why.

One function, ``decide``, answers for a single host and for each node of a multi-node group
(``decide_group``: the group restarts when any node has a reason); the stages add their
operations from its ``Decision``, the operations' conditions name its reasons, and the
reasons are recorded (the outcome record, the host's ``last-verified.json``, which ``status``
and the reports read) and printed with ``-v`` before the restart. Nothing else computes them.

The reasons, in this order (``Reason.name``; the operation names and the records use them):

- ``unit``: the rendered unit differs from the host's (sha256); its text says which launch
  flags changed (the loaded unit's ``ExecStart``, when the host reported it) and the release;
- ``secrets``: the rendered secrets file differs from the host's (sha256; never its values);
- ``release``, ``patch``, ``model``: this run installs the release's venv, applies the
  autotune patch, downloads the model (``service.Trigger``; ``changing`` says when);
- ``not running``: the unit is not active (a single host's is started, a group's node
  starts with its group);
- ``running, never verified``: the unit runs an invocation no deploy verified and it does not
  serve (a single host; a group's node whatever it serves, when nothing else restarts it);
- ``peer changed``: a group's node restarted because another node has a reason
  (``GroupDecision.of``).

Besides the reasons, the decision says whether the unit starts (it is not active: a single
host's unit is started, not restarted) and whether P2P is retested first (``retest``: the
pre-flight skipped the peer copies because a server ran, and that server is replaced).
"""

from __future__ import annotations

import hashlib
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sglang_deploy.core.hoststate import HostState

#: the operations whose change restarts the server, besides the unit and the secrets
#: (``service.Trigger``'s values, in this order)
TRIGGERS = ("release", "patch", "model")
NOT_RUNNING = "not running"
UNVERIFIED = "running, never verified"
PEER = "peer changed"
#: the decision's action on a server it does not restart
NONE, VERIFY, RESTART = "none", "verify", "restart"


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def short(release: str | None) -> str:
    """A release id as the reasons print it: its first 4 characters and an ellipsis."""
    return f"{release[:4]}…" if release else "none"


@dataclass(frozen=True)
class Reason:
    """One reason to (re)start: its NAME (the list above) and what it says in a sentence."""

    name: str
    text: str

    def as_json(self) -> dict[str, str]:
        return {"name": self.name, "text": self.text}


@dataclass(frozen=True)
class Facts:
    """The values of a host's state the decision reads (``of``)."""

    unit_sha256: str | None = None        # the installed unit file's
    secrets_sha256: str | None = None     # the installed secrets file's
    active: bool = False                  # ActiveState=active
    up: bool = False                      # active, activating or reloading
    serving: bool = False                 # active/running
    started: bool = False                 # up, not waiting to restart after a crash
    unverified: bool = False              # it runs an invocation no deploy verified
    current: str | None = None            # the release ``current`` links to
    exec_start: str | None = None         # the loaded unit's ExecStart (``systemctl show``)
    stale_load: bool = False              # the unit file on disk is not the loaded one

    @classmethod
    def of(cls, hs: HostState, unit_file: str) -> Facts:
        """The facts of host state HS (UNIT_FILE: the unit's path in its ``paths``)."""
        svc = hs.service
        unit = hs.paths.get(unit_file)
        return cls(unit_sha256=unit.sha256 if unit is not None else None,
                   secrets_sha256=hs.secrets_sha256, active=svc.unit_active, up=svc.up,
                   serving=svc.serving, started=svc.started,
                   unverified=bool(svc.invocation_id) and not hs.runs_verified,
                   current=hs.releases.current, exec_start=svc.show.get("ExecStart") or None,
                   stale_load=svc.need_daemon_reload)


@dataclass(frozen=True)
class Wanted:
    """What this run gives the host: its unit and secrets texts, the release, the launch
    argv (for the flags' difference), the triggers that change (``changing``), and whether
    the pre-flight skipped the peer copies (a server ran)."""

    unit_text: str
    secrets_text: str
    release: str
    argv: tuple[str, ...] = ()
    changing: tuple[str, ...] = ()
    p2p_skipped: bool = False


def changing(*, release_complete: bool, patch_enabled: bool, patch_state: str | None,
             model_download: bool, model_complete: bool) -> tuple[str, ...]:
    """Of ``TRIGGERS``, those this run changes on the host, as its release, patch and model
    operations decide (``releaseops``): a release venv not complete, a patch whose status is
    unknown (a new venv) or ``needed``, a model folder not complete."""
    out = []
    if not release_complete:
        out.append("release")
    if patch_enabled and patch_state in (None, "", "needed"):
        out.append("patch")
    if model_download and not model_complete:
        out.append("model")
    return tuple(out)


def _flags(words: Iterable[str]) -> dict[str, str]:
    """``--name value`` pairs of argv WORDS (a flag alone: "" as its value)."""
    out: dict[str, str] = {}
    words = list(words)
    for i, word in enumerate(words):
        if word.startswith("--"):
            values = []
            for nxt in words[i + 1:]:
                if nxt.startswith("--"):
                    break
                values.append(nxt)
            out[word[2:]] = " ".join(values)
    return out


def argv_flags(words: Iterable[str]) -> dict[str, str]:
    """``--name value`` pairs of a launch argv (a flag alone: "" as its value)."""
    return _flags(words)


def exec_argv(exec_start: str | None) -> list[str] | None:
    """The argv of ``systemctl show -p ExecStart``'s value (``{ path=... ; argv[]=WORDS ;
    ...}``), None when it has none."""
    if not exec_start or "argv[]=" not in exec_start:
        return None
    text = exec_start.split("argv[]=", 1)[1].split(" ; ", 1)[0]
    try:
        return shlex.split(text)
    except ValueError:
        return text.split()


def flag_changes(old: Sequence[str], new: Sequence[str], limit: int = 4) -> list[str]:
    """What differs between two launch argvs, flag by flag: ``tp-size 8 -> 4``, ``+name v``
    (added), ``-name`` (removed); at most LIMIT, then how many more."""
    a, b = _flags(old), _flags(new)
    out = []
    for name in sorted(set(a) | set(b)):
        if name not in a:
            out.append(f"+{name} {b[name]}".rstrip())
        elif name not in b:
            out.append(f"-{name}")
        elif a[name] != b[name]:
            out.append(f"{name} {a[name] or '(set)'} -> {b[name] or '(set)'}")
    if len(out) > limit:
        out = [*out[:limit], f"{len(out) - limit} more"]
    return out


def _unit_text(facts: Facts, wanted: Wanted, release_reason: bool) -> str:
    parts = []
    old = exec_argv(facts.exec_start)
    if old is not None and wanted.argv:
        changes = flag_changes(old, wanted.argv)
        if changes:
            parts.append("flags changed: " + ", ".join(changes))
    if not release_reason and facts.current and facts.current != wanted.release:
        parts.append(f"release {short(facts.current)} -> {short(wanted.release)}")
    return "; ".join(parts) or ("unit changed" if facts.unit_sha256 else "unit new")


def _trigger_text(name: str, facts: Facts, wanted: Wanted) -> str:
    if name == "release":
        return f"release {short(facts.current)} -> {short(wanted.release)}"
    if name == "patch":
        return "autotune patch applied"
    return "model downloaded"


@dataclass(frozen=True)
class Decision:
    """What happens to one host's server in this run, and why.

    ``reasons``: why it (re)starts (empty: nothing of its own); ``start``: a single host
    whose unit is not active (it is started, which a restart does not need); ``action``: of
    a server running an invocation no deploy verified, ``"verify"`` (it serves, nothing
    restarts it), ``"restart"`` (it does not serve) or ``"none"``; ``copies_skipped``: the
    pre-flight skipped the peer copies (a server ran on the GPUs)."""

    reasons: tuple[Reason, ...] = ()
    start: bool = False
    action: str = NONE
    copies_skipped: bool = False

    @property
    def names(self) -> list[str]:
        return [r.name for r in self.reasons]

    @property
    def triggers(self) -> list[str]:
        """The reasons whose operation restarts the server once it changes (the restart's
        condition, the operation's name): unit, secrets, release, patch, model."""
        return [n for n in self.names if n in ("unit", "secrets", *TRIGGERS)]

    @property
    def retest(self) -> bool:
        """A single host's P2P retest before its server is (re)started: the pre-flight
        skipped the copies and the server is replaced or started (a group's node:
        ``GroupDecision.retest``)."""
        return self.copies_skipped and (bool(self.reasons) or self.start)

    def why(self) -> str:
        """The reasons in one line: ``flags changed: tp-size 8 -> 4; release d5e0… -> 7a1c…``."""
        return "; ".join(r.text for r in self.reasons)

    def as_json(self) -> list[dict[str, str]]:
        return [r.as_json() for r in self.reasons]


def own_reasons(facts: Facts, wanted: Wanted) -> tuple[Reason, ...]:
    """The reasons of the host's own changes: unit, secrets, then the triggers."""
    reasons = []
    if sha256_text(wanted.unit_text) != facts.unit_sha256:
        reasons.append(Reason("unit", _unit_text(facts, wanted, "release" in wanted.changing)))
    elif facts.stale_load and facts.active:  # written by a run that ended before its reload
        reasons.append(Reason("unit", _unit_text(facts, wanted, "release" in wanted.changing)
                              .replace("unit changed", "the unit file written")
                              + " (not loaded by systemd yet: daemon-reload pending)"))
    if sha256_text(wanted.secrets_text) != facts.secrets_sha256:
        reasons.append(Reason("secrets", "secrets changed" if facts.secrets_sha256
                              else "secrets new"))
    reasons += [Reason(t, _trigger_text(t, facts, wanted)) for t in TRIGGERS
                if t in wanted.changing]
    return tuple(reasons)


def decide(facts: Facts, wanted: Wanted, *, serves: bool | None = None,
           group: bool = False) -> Decision:
    """The decision for one host (GROUP: a node of a multi-node group, which starts with its
    group, never alone). SERVES: whether its running server answers (the verifier's poll),
    asked only when ``needs_poll`` says so; None: not asked."""
    own = own_reasons(facts, wanted)
    reasons = list(own)
    action = NONE
    if not facts.active:
        reasons.append(Reason(NOT_RUNNING, "not running"))
    if group:
        if facts.active and facts.unverified and not own:
            reasons.append(Reason(UNVERIFIED, "running, never verified"))
    elif needs_poll(facts):
        if serves is False:
            action = RESTART
            if not reasons:
                reasons.append(Reason(UNVERIFIED, "running, never verified, not serving"))
        elif not own:
            action = VERIFY
    if facts.stale_load and facts.active and not group:
        action = RESTART  # no operation of this run changes the unit: the restart is due as is
    return Decision(reasons=tuple(reasons), start=not facts.active and not group,
                    action=action, copies_skipped=wanted.p2p_skipped)


def needs_poll(facts: Facts, group: bool = False) -> bool:
    """Whether the decision asks if the running server serves (``decide``'s SERVES): a single
    host's unit, started (a start would change nothing), running an invocation no deploy
    verified."""
    return not group and facts.started and facts.unverified


@dataclass(frozen=True)
class GroupDecision:
    """One decision for a group per run: every node's (rank order); the group restarts when
    any node has a reason, and a node with none restarts because a peer changed."""

    nodes: tuple[str, ...]
    decisions: Mapping[str, Decision]
    running: Mapping[str, bool]

    @property
    def restart(self) -> bool:
        return any(self.decisions[n].reasons for n in self.nodes)

    @property
    def reasons(self) -> Mapping[str, tuple[str, ...]]:
        return {n: tuple(self.decisions[n].names) for n in self.nodes}

    def own(self, node: str) -> tuple[str, ...]:
        """NODE's own reasons' names."""
        return tuple(self.decisions[node].names)

    def retest(self, node: str) -> bool:
        """NODE's P2P retest, once its group has stopped: its pre-flight skipped the peer
        copies (a server ran) and the group restarts."""
        return self.restart and self.decisions[node].copies_skipped

    def of(self, node: str) -> tuple[Reason, ...]:
        """Why NODE restarts: its own reasons, else (the group restarts) ``peer changed``
        naming the nodes that have one."""
        own = self.decisions[node].reasons
        if own or not self.restart:
            return own
        peers = [n for n in self.nodes if self.decisions[n].reasons]
        return (Reason(PEER, "peer changed: " + ", ".join(
            f"{n} ({self.decisions[n].why()})" for n in peers)),)

    def texts(self) -> list[str]:
        """``node: reason, reason`` of each node that has one."""
        return [f"{n}: {', '.join(self.decisions[n].names)}" for n in self.nodes
                if self.decisions[n].reasons]

    def why(self) -> str:
        """Every node's reasons in one line (``node: text; text``), rank order."""
        return "; ".join(f"{n}: {self.decisions[n].why()}" for n in self.nodes
                         if self.decisions[n].reasons)


def decide_group(nodes: Sequence[str], facts: Mapping[str, Facts],
                 wanted: Mapping[str, Wanted]) -> GroupDecision:
    """The decision of a group of NODES (rank order) from each node's FACTS and WANTED."""
    return GroupDecision(nodes=tuple(nodes),
                         decisions={n: decide(facts[n], wanted[n], group=True) for n in nodes},
                         running={n: facts[n].up for n in nodes})


KNOWN_GOOD = "known-good restored"


def rollback_reason(release: str, restore: Sequence[str]) -> Reason:
    """Why a rollback restarts a server: the known-good RELEASE, and what it RESTORES
    (``service.rollback_plan``; nothing: the server did not serve)."""
    what = ", ".join(restore) if restore else "nothing restored: the server did not serve"
    return Reason(KNOWN_GOOD, f"rollback to the known-good release {short(release)} ({what})")


def rollback_group(nodes: Sequence[str], restarts: Mapping[str, bool],
                   running: Mapping[str, bool]) -> GroupDecision:
    """A rollback's decision: a node that restores something or does not serve restarts the
    group (``service.rollback_plan``'s ``restart`` of each node: RESTARTS)."""
    reason = Reason(KNOWN_GOOD, "known-good configuration restored")
    return GroupDecision(nodes=tuple(nodes),
                         decisions={n: Decision(reasons=(reason,) if restarts[n] else ())
                                    for n in nodes},
                         running=dict(running))


def record(decision: Decision | GroupDecision, node: str | None = None) -> dict[str, Any]:
    """The reasons as the records keep them: ``{"why": one line, "reasons": [...]}``."""
    if isinstance(decision, GroupDecision):
        reasons = decision.of(node) if node else ()
        return {"why": "; ".join(r.text for r in reasons),
                "reasons": [r.as_json() for r in reasons]}
    return {"why": decision.why(), "reasons": decision.as_json()}


#: a verification's actions that follow a (re)start of the server
RESTART_ACTIONS = ("started", "restarted", "rolled-back")


def last_restart(action: str | None, decided: Mapping[str, Any] | None,
                 previous: Mapping[str, Any] | None
                 ) -> dict[str, Any] | None:
    """The ``last_restart`` a verification keeps in the host's ``last-verified.json`` (which
    ``status`` and the reports show): after a (re)start (ACTION in ``RESTART_ACTIONS``) this
    run's decision (DECIDED: ``record``'s ``why`` and ``reasons``), its time added when it is
    recorded (``at``); else the PREVIOUS one, kept (a converged host was not restarted)."""
    if action in RESTART_ACTIONS:
        return {"action": action, "why": (decided or {}).get("why") or "",
                "reasons": list((decided or {}).get("reasons") or [])}
    return dict(previous) if previous else None


def last_restart_text(entry: Mapping[str, Any] | None) -> str | None:
    """``2026-12-05 18:20 UTC restarted: flags changed: tp-size 8 -> 4; release d5e0… ->
    7a1c…``, or None when no restart was recorded."""
    if not entry:
        return None
    at = str(entry.get("at") or "?")
    if len(at) >= 16 and at[10] == "T":
        at = f"{at[:10]} {at[11:16]} UTC"
    why = entry.get("why") or "no reason recorded"
    return f"{at} {entry.get('action') or 'restarted'}: {why}"
