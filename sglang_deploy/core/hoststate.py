"""The host's state as the stages read it: typed, frozen, made once from the JSON object that
``remote/hoststate.py state`` prints (its wire format) by ``HostState.from_json`` (pure).

Three meanings of "running" are told apart by name (``ServiceState``):

- ``serving``: ``active/running``: the unit's process runs and systemd counts it up. What the
  pre-flight's probe plan and the rollback call a serving server (no HTTP check here: that is
  the verifier's ``ServingProbe``).
- ``unit_active``: ``ActiveState=active`` whatever the sub-state: the unit is up, so a change
  restarts it rather than starts it, and no server is starting on the GPUs.
- ``up``: ``active``, ``activating`` or ``reloading``: systemd has the unit up or bringing it
  up; ``started`` is ``up`` short of a unit merely waiting to be restarted after a crash
  (``activating/auto-restart``): a ``systemctl start`` would change nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from sglang_deploy.core import hostrecords as hr
from sglang_deploy.core.hostrecords import (
    GpuHealthRead,
    Hardening,
    KnownGood,
    LastVerified,
    Memory,
    ModelState,
    P2PVerified,
    PatchRecord,
)


def _text(value: object) -> str | None:
    """A ``systemctl show`` value: "" (not set) as None."""
    return str(value) if value not in (None, "") else None


@dataclass(frozen=True)
class ServiceState:
    """The unit's ``systemctl show`` properties (None: empty or not reported)."""

    active_state: str | None = None
    sub_state: str | None = None
    result: str | None = None
    invocation_id: str | None = None
    main_pid: str | None = None
    unit_file_state: str | None = None
    load_state: str | None = None
    active_enter_monotonic: str | None = None
    n_restarts: str | None = None
    #: every property as ``systemctl show`` gave it (the wire form)
    show: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_json(cls, show: Mapping[str, Any] | None) -> ServiceState:
        show = dict(show or {})
        return cls(active_state=_text(show.get("ActiveState")),
                   sub_state=_text(show.get("SubState")), result=_text(show.get("Result")),
                   invocation_id=_text(show.get("InvocationID")),
                   main_pid=_text(show.get("MainPID")),
                   unit_file_state=_text(show.get("UnitFileState")),
                   load_state=_text(show.get("LoadState")),
                   active_enter_monotonic=_text(show.get("ActiveEnterTimestampMonotonic")),
                   n_restarts=_text(show.get("NRestarts")), show=show)

    @property
    def need_daemon_reload(self) -> bool:
        """systemd's ``NeedDaemonReload=yes``: the unit file on disk is not the one it runs
        (a run wrote it and ended before its daemon-reload)."""
        return self.show.get("NeedDaemonReload") == "yes"

    @property
    def serving(self) -> bool:
        """``active/running``: the server's process runs (the probe plan's and rollback's
        "serving"; whether it answers HTTP is the verifier's question)."""
        return self.active_state == "active" and self.sub_state == "running"

    @property
    def unit_active(self) -> bool:
        """``ActiveState=active``: the unit is up (a change restarts it; nothing is starting)."""
        return self.active_state == "active"

    @property
    def up(self) -> bool:
        """Up or coming up: ``active``, ``activating`` or ``reloading``."""
        return self.active_state in ("active", "activating", "reloading")

    @property
    def started(self) -> bool:
        """``up``, short of waiting to be restarted after a crash (``auto-restart``): a start
        would change nothing."""
        return self.up and self.sub_state != "auto-restart"

    @property
    def enabled(self) -> bool:
        return self.unit_file_state == "enabled"

    @property
    def state_text(self) -> str:
        """``ActiveState/SubState`` as the reports print it (``?`` for an unknown part)."""
        return f"{self.active_state or '?'}/{self.sub_state or '?'}"


# ---------------------------------------------------------------------------------------
# sglang-watchdog (its unit, state.json and last events)


@dataclass(frozen=True)
class WatchdogEvent:
    action: str | None = None
    at: float | None = None  # epoch seconds
    at_iso: str | None = None
    verdict: str | None = None
    outcome: str | None = None
    reason: str | None = None
    #: the event as the watchdog wrote it (``status --json`` shows the last one so)
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_json(cls, raw: object) -> WatchdogEvent | None:
        rec = hr.obj(raw)
        if rec is None:
            return None
        return cls(action=hr.text(rec.get("action")), at=hr.number(rec.get("at")),
                   at_iso=hr.text(rec.get("at_iso")), verdict=hr.text(rec.get("verdict")),
                   outcome=hr.text(rec.get("outcome")), reason=hr.text(rec.get("reason")),
                   raw=hr.frozen(rec))


@dataclass(frozen=True)
class WatchdogObservation:
    """``state.json``: the watchdog's last verdict and when (epoch seconds)."""

    verdict: str | None = None
    at: float | None = None

    @classmethod
    def from_json(cls, raw: object) -> WatchdogObservation:
        rec = hr.obj(raw) or {}
        return cls(verdict=hr.text(rec.get("verdict")), at=hr.number(rec.get("at")))


@dataclass(frozen=True)
class WatchdogRead:
    service: ServiceState = field(default_factory=ServiceState)
    state: WatchdogObservation = field(default_factory=WatchdogObservation)
    events: tuple[WatchdogEvent, ...] = ()  # oldest first
    now: float | None = None  # the host's clock when read

    @classmethod
    def from_json(cls, raw: object) -> WatchdogRead | None:
        rec = hr.record(raw)
        if rec is None:
            return None
        events = rec.get("events")
        found = [WatchdogEvent.from_json(e) for e in events] if isinstance(events, list) else []
        return cls(service=ServiceState.from_json(hr.obj(rec.get("service"))),
                   state=WatchdogObservation.from_json(rec.get("state")),
                   events=tuple(e for e in found if e is not None), now=hr.number(rec.get("now")))


@dataclass(frozen=True)
class PathState:
    """One managed path as the host-state read found it (``hoststate.path_state``)."""

    kind: str  # "file", "dir", "link" or "other"
    user: str | None = None
    group: str | None = None
    mode: str | None = None  # octal digits, "644"
    sha256: str | None = None  # files
    target: str | None = None  # links

    @classmethod
    def from_json(cls, raw: Mapping[str, Any] | None) -> PathState | None:
        if not raw:
            return None
        return cls(kind=str(raw.get("kind")), user=raw.get("user"), group=raw.get("group"),
                   mode=raw.get("mode"), sha256=raw.get("sha256"), target=raw.get("target"))

    def as_json(self) -> dict[str, Any]:
        """The wire form (``kind``, ``user``, ``group``, ``mode`` and ``sha256`` or ``target``)."""
        out = {"kind": self.kind, "user": self.user, "group": self.group, "mode": self.mode}
        if self.kind == "file":
            out["sha256"] = self.sha256
        elif self.kind == "link":
            out["target"] = self.target
        return out

    def is_dir(self, owner: str, mode: str) -> bool:
        """A folder owned by OWNER (user and group) with MODE (octal digits)."""
        return (self.kind, self.user, self.group, self.mode) == ("dir", owner, owner, mode)

    def is_file(self, sha256: str, mode: str) -> bool:
        """A regular file with these bytes (SHA256) and MODE (octal digits)."""
        return (self.kind, self.mode, self.sha256) == ("file", mode, sha256)

    def links_to(self, target: str) -> bool:
        return self.kind == "link" and self.target == target


@dataclass(frozen=True)
class Release:
    """One folder under ``ROOT/releases`` (``release.json``, its patch record and digests)."""

    id: str
    complete: bool = False
    sglang_version: str | None = None
    installed_at: str | None = None
    patch: PatchRecord | None = None  # autotune-patch.json
    patch_file_sha256: str | None = None
    server_args_sha256: str | None = None
    #: the release's record as the host reported it (release.json and the fields above)
    meta: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_json(cls, rid: str, raw: Mapping[str, Any] | None) -> Release:
        raw = dict(raw or {})
        return cls(id=rid, complete=bool(raw.get("complete")),
                   sglang_version=raw.get("sglang_version"), installed_at=raw.get("installed_at"),
                   patch=PatchRecord.from_json(raw.get("patch")), patch_file_sha256=raw.get("patch_file_sha256"),
                   server_args_sha256=raw.get("server_args_sha256"), meta=raw)


@dataclass(frozen=True)
class Releases:
    """The installed releases, the ``current`` link's and the known-good configuration's."""

    installed: Mapping[str, Release] = field(default_factory=dict)
    current: str | None = None
    known_good: KnownGood | None = None  # record (verify params), unit/secrets sha256

    def get(self, release_id: str) -> Release | None:
        return self.installed.get(release_id)

    def complete(self, release_id: str) -> bool:
        return bool((self.installed.get(release_id) or Release(release_id)).complete)

    @property
    def known_good_release(self) -> str | None:
        return self.known_good.release if self.known_good is not None else None

    def metas(self) -> dict[str, Mapping[str, Any]]:
        """Release id -> its record as reported (what pruning reads: ``installed_at``)."""
        return {rid: rel.meta for rid, rel in self.installed.items()}


@dataclass(frozen=True)
class Platform:
    """What decides whether the lock's wheels install: the system python's X.Y and glibc's."""

    python: str | None = None
    glibc: str | None = None


@dataclass(frozen=True)
class HostState:
    """Everything one host-state read reported (``remote/hoststate.py state``)."""

    service: ServiceState
    releases: Releases
    paths: Mapping[str, PathState | None]
    platform: Platform
    users: frozenset[str] = frozenset()
    uv_version: str | None = None
    secrets_sha256: str | None = None
    unit_sha256: str | None = None
    last_verified: LastVerified | None = None
    p2p_verified: P2PVerified | None = None
    hardening: Hardening | None = None
    model: ModelState | None = None  # the model folder (``hoststate.model_state``)
    #: with the model: MemAvailable and MemTotal in bytes
    memory: Memory | None = None
    cache_files: int | None = None
    route_dev: str | None = None  # a group's node: the interface toward its rank 0
    monotonic_now: float | None = None
    #: the GPU health read's raw answers (``core.gpuhealth.evaluate`` judges them); None: not
    #: asked for (``--gpu-health``) or not brought back
    gpu_health: GpuHealthRead | None = None
    #: sglang-watchdog's unit (``systemctl show``), ``state`` and last ``events``; None: not
    #: asked for (``--watchdog``)
    watchdog: WatchdogRead | None = None
    #: the object as printed (the wire form, for what stores it as it is: the plan's record)
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> HostState:
        """The typed state of one ``hoststate.py state`` object (a missing key reads as
        absent, as the stages always read them)."""
        raw = dict(raw)
        rels = raw.get("releases") or {}
        return cls(
            service=ServiceState.from_json(raw.get("service")),
            releases=Releases(
                installed=MappingProxyType({rid: Release.from_json(rid, meta)
                                            for rid, meta in rels.items()}),
                current=raw.get("current"), known_good=KnownGood.from_json(raw.get("known_good"))),
            paths=MappingProxyType({p: PathState.from_json(v)
                                    for p, v in (raw.get("paths") or {}).items()}),
            platform=Platform(python=raw.get("python"), glibc=raw.get("glibc")),
            users=frozenset(raw.get("users") or ()), uv_version=raw.get("uv_version"),
            secrets_sha256=raw.get("secrets_sha256"), unit_sha256=raw.get("unit_sha256"),
            last_verified=LastVerified.from_json(raw.get("last_verified")),
            p2p_verified=P2PVerified.from_json(raw.get("p2p_verified")),
            hardening=Hardening.from_json(raw.get("hardening")),
            model=ModelState.from_json(raw.get("model")), memory=Memory.from_json(raw.get("memory")),
            cache_files=raw.get("cache_files"),
            route_dev=raw.get("route_dev"), monotonic_now=raw.get("monotonic_now"),
            gpu_health=GpuHealthRead.from_json(raw.get("gpu_health")),
            watchdog=WatchdogRead.from_json(raw.get("watchdog")),
            raw=raw)

    @property
    def verified_invocation(self) -> str | None:
        """The ``InvocationID`` the last deploy verified (``last-verified.json``)."""
        return self.last_verified.invocation if self.last_verified is not None else None

    @property
    def previous_restart(self) -> Mapping[str, Any] | None:
        """The last restart ``last-verified.json`` keeps, as recorded (a run that restarts
        nothing keeps it so: ``core.restart.last_restart``)."""
        lv = self.last_verified
        return lv.last_restart.raw if lv is not None and lv.last_restart is not None else None

    @property
    def runs_verified(self) -> bool:
        """The unit runs the very invocation a deploy verified."""
        return bool(self.service.invocation_id) and \
            self.service.invocation_id == self.verified_invocation
