"""The records a host keeps and the host-state read brings back, typed (pure): each a frozen
dataclass made once by its ``from_json`` from the wire form that ``remote/hoststate.py
state`` prints (``HostState.from_json`` calls them), so that the stages, ``status`` and the
reports read attributes, not string keys.

A record that is absent, not a JSON object, or an empty one reads as None (no record: what
every reader took ``{}`` for). A value of the wrong type inside one reads as unknown (None,
or "cannot tell"), never as a good answer: a ``rc`` that is not a number is a command that
gave no answer, an ``in_force`` that is not a boolean is a property nobody could tell.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any


def obj(value: object) -> Mapping[str, Any] | None:
    """VALUE when it is a JSON object, else None."""
    return value if isinstance(value, Mapping) else None


def record(value: object) -> dict[str, Any] | None:
    """A host record as a plain dict of its own: None when absent, not an object, or empty."""
    return dict(value) if isinstance(value, Mapping) and value else None


def text(value: object) -> str | None:
    """A string value; anything else (absent, a number, "") reads as None."""
    return value if isinstance(value, str) and value else None


def integer(value: object) -> int | None:
    """An integer value (a float that is one, too); a bool or anything else reads as None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    return int(value) if isinstance(value, float) and value.is_integer() else None


def number(value: object) -> float | None:
    """A JSON number, as it came (an int stays one: it is shown as it was); a bool or anything
    else reads as None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value


def strings(value: object) -> tuple[str, ...]:
    """A list of strings (anything else in it left out); not a list: empty."""
    return tuple(v for v in value if isinstance(v, str)) if isinstance(value, list | tuple) \
        else ()


def frozen(value: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(value))


# ---------------------------------------------------------------------------------------
# last-verified.json (the verifier's summary) and its last restart


@dataclass(frozen=True)
class LastRestart:
    """The last (re)start and why (``core.restart.last_restart``, kept by the verifier)."""

    at: str | None = None
    action: str | None = None
    why: str = ""
    #: each reason as recorded (``core.restart``'s ``as_json``), handed on as it is
    reasons: tuple[Any, ...] = ()
    #: the entry as recorded (kept as it is by a run that restarts nothing)
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_json(cls, raw: object) -> LastRestart | None:
        rec = record(raw)
        if rec is None:
            return None
        reasons = rec.get("reasons")
        return cls(at=text(rec.get("at")), action=text(rec.get("action")),
                   why=text(rec.get("why")) or "",
                   reasons=tuple(reasons) if isinstance(reasons, list) else (),
                   raw=frozen(rec))


@dataclass(frozen=True)
class LastVerified:
    """``last-verified.json``: what the last deploy verified (``report.host_summary``)."""

    invocation: str | None = None  # the unit's InvocationID it verified
    verified_at: str | None = None
    last_restart: LastRestart | None = None

    @classmethod
    def from_json(cls, raw: object) -> LastVerified | None:
        rec = record(raw)
        if rec is None:
            return None
        return cls(invocation=text(rec.get("invocation")),
                   verified_at=text(rec.get("verified_at")),
                   last_restart=LastRestart.from_json(rec.get("last_restart")))


# ---------------------------------------------------------------------------------------
# p2p-verified.json (``preflight.p2p_record``)


@dataclass(frozen=True)
class P2PVerified:
    """The verdict of the last passed, full P2P test on the host."""

    gpus: int | None = None
    policy: str | None = None
    nccl_env: Mapping[str, str] = field(default_factory=dict)
    verified: tuple[str, ...] = ()  # the checks it stands for

    @classmethod
    def from_json(cls, raw: object) -> P2PVerified | None:
        rec = record(raw)
        if rec is None:
            return None
        env = obj(rec.get("nccl_env")) or {}
        return cls(gpus=integer(rec.get("gpus")), policy=text(rec.get("policy")),
                   nccl_env=MappingProxyType({str(k): str(v) for k, v in env.items()}),
                   verified=strings(rec.get("verified")))


# ---------------------------------------------------------------------------------------
# hardening.json (what the release smoke saw of the unit's sandbox, ``core.hardening``)


@dataclass(frozen=True)
class HardeningProperty:
    name: str
    in_force: bool | None = None  # None: cannot tell
    found: str | None = None
    why: str | None = None
    fix: str | None = None

    @classmethod
    def from_json(cls, raw: object) -> HardeningProperty | None:
        rec = obj(raw)
        if rec is None or text(rec.get("name")) is None:
            return None
        in_force = rec.get("in_force")
        return cls(name=str(rec["name"]), in_force=in_force if isinstance(in_force, bool) else None,
                   found=text(rec.get("found")), why=text(rec.get("why")), fix=text(rec.get("fix")))


@dataclass(frozen=True)
class Hardening:
    checked_at: str | None = None
    release: str | None = None
    properties: tuple[HardeningProperty, ...] = ()

    @classmethod
    def from_json(cls, raw: object) -> Hardening | None:
        rec = record(raw)
        if rec is None:
            return None
        props = rec.get("properties")
        found = [HardeningProperty.from_json(p) for p in props] if isinstance(props, list) else []
        return cls(checked_at=text(rec.get("checked_at")), release=text(rec.get("release")),
                   properties=tuple(p for p in found if p is not None))


# ---------------------------------------------------------------------------------------
# the model folder (``hoststate.model_state``) and the host's memory


@dataclass(frozen=True)
class Shard:
    exists: bool = False
    size: int | None = None
    expected_size: int | None = None  # from its header (None: not read)
    resident: int | None = None  # its bytes in the page cache (None: cannot be told)
    error: str | None = None  # an unreadable header

    @classmethod
    def from_json(cls, raw: object) -> Shard:
        rec = obj(raw) or {}
        error = rec.get("error")
        return cls(exists=rec.get("exists") is True, size=integer(rec.get("size")),
                   expected_size=integer(rec.get("expected_size")),
                   resident=integer(rec.get("resident")),
                   error=None if error in (None, "") else str(error))


@dataclass(frozen=True)
class Fetched:
    """``.sglang-deploy-fetched.json``: which repo and revision model_fetch.py put there."""

    repo: str | None = None
    revision: str | None = None

    @classmethod
    def from_json(cls, raw: object) -> Fetched | None:
        rec = obj(raw)
        return None if rec is None else cls(repo=text(rec.get("repo")),
                                             revision=text(rec.get("revision")))


@dataclass(frozen=True)
class ModelState:
    """One model folder as the host-state read (or model_fetch.py) found it."""

    path: str | None = None
    exists: bool = False
    config: bool = False  # config.json parses
    index: bool = False  # model.safetensors.index.json parses
    total_size: int | None = None
    shards: Mapping[str, Shard] = field(default_factory=dict)
    fetched: Fetched | None = None
    #: the sibling ``PATH@REV`` folders, by folder name (only the configured folder's read)
    revisions: Mapping[str, ModelState] = field(default_factory=dict)

    @classmethod
    def from_json(cls, raw: object) -> ModelState | None:
        rec = record(raw)
        if rec is None:
            return None
        shards = obj(rec.get("shards")) or {}
        revisions = obj(rec.get("revisions")) or {}
        return cls(path=text(rec.get("path")), exists=rec.get("exists") is True,
                   config=rec.get("config") is True, index=rec.get("index") is True,
                   total_size=integer(rec.get("total_size")),
                   shards=MappingProxyType({str(n): Shard.from_json(s) for n, s in shards.items()}),
                   fetched=Fetched.from_json(rec.get("fetched")),
                   revisions=MappingProxyType({
                       str(n): m for n, v in revisions.items()
                       if (m := ModelState.from_json(v)) is not None}))

    @classmethod
    def absent(cls, path: str) -> ModelState:
        return cls(path=path, exists=False)


@dataclass(frozen=True)
class Memory:
    """/proc/meminfo's MemAvailable and MemTotal, in bytes (None: not told)."""

    available: int | None = None
    total: int | None = None

    @classmethod
    def from_json(cls, raw: object) -> Memory | None:
        rec = record(raw)
        return None if rec is None else cls(available=integer(rec.get("available")),
                                            total=integer(rec.get("total")))


# ---------------------------------------------------------------------------------------
# the GPU health read's raw answers (``hoststate.gpu_health``; ``core.gpuhealth`` judges)


@dataclass(frozen=True)
class Answer:
    """One command's answer (``run_merged``): its exit status, None when it did not start
    or did not end (``error`` says why), and its output."""

    rc: int | None = None
    out: str = ""
    error: str | None = None

    @classmethod
    def from_json(cls, raw: object) -> Answer | None:
        rec = obj(raw)
        return None if rec is None else cls(**_answer(rec))


def _answer(rec: Mapping[str, Any]) -> dict[str, Any]:
    error, out = rec.get("error"), rec.get("out")
    return {"rc": integer(rec.get("rc")), "out": out if isinstance(out, str) else "",
            "error": None if error in (None, "") else str(error)}


@dataclass(frozen=True)
class QueryAnswer(Answer):
    """``nvidia-smi --query-gpu``: the fields asked and those this driver did not know."""

    fields: tuple[str, ...] = ()
    dropped: tuple[str, ...] = ()

    @classmethod
    def from_json(cls, raw: object) -> QueryAnswer | None:
        rec = obj(raw)
        return None if rec is None else cls(**_answer(rec), fields=strings(rec.get("fields")),
                                            dropped=strings(rec.get("dropped")))


@dataclass(frozen=True)
class KernelLog:
    """``dmesg``: its NVIDIA lines (when it could be read) or its error."""

    rc: int | None = None
    error: str | None = None
    lines: tuple[str, ...] = ()

    @classmethod
    def from_json(cls, raw: object) -> KernelLog | None:
        rec = obj(raw)
        if rec is None:
            return None
        lines = rec.get("lines")
        error = rec.get("error")
        return cls(rc=integer(rec.get("rc")), error=None if error in (None, "") else str(error),
                   lines=tuple(str(x) for x in lines) if isinstance(lines, list) else ())


@dataclass(frozen=True)
class GpuHealthRead:
    query: QueryAnswer | None = None
    xml: Answer | None = None  # ``nvidia-smi -q -x``, asked when a field was dropped
    kernel: KernelLog | None = None
    dcgm: Answer | None = None  # ``dcgmi health -c`` where DCGM is installed

    @classmethod
    def from_json(cls, raw: object) -> GpuHealthRead | None:
        rec = record(raw)
        if rec is None:
            return None
        return cls(query=QueryAnswer.from_json(rec.get("query")),
                   xml=Answer.from_json(rec.get("xml")),
                   kernel=KernelLog.from_json(rec.get("kernel")),
                   dcgm=Answer.from_json(rec.get("dcgm")))


# ---------------------------------------------------------------------------------------
# a release's autotune-patch.json and the known-good configuration


@dataclass(frozen=True)
class PatchRecord:
    """``autotune-patch.json`` (``patch_tool.write_record``)."""

    state: str | None = None
    file: str | None = None
    version: str | None = None
    sha256_after: str | None = None

    @classmethod
    def from_json(cls, raw: object) -> PatchRecord | None:
        rec = record(raw)
        if rec is None:
            return None
        return cls(state=text(rec.get("state")), file=text(rec.get("file")),
                   version=text(rec.get("version")), sha256_after=text(rec.get("sha256_after")))


@dataclass(frozen=True)
class KnownGood:
    """ROOT/known-good/: the last verified configuration a rollback restores."""

    #: record.json: the verify parameters (handed on as they are: the rollback's)
    record: Mapping[str, Any]
    unit_sha256: str | None = None
    secrets_sha256: str | None = None

    @property
    def release(self) -> str | None:
        return text(self.record.get("release"))

    @classmethod
    def from_json(cls, raw: object) -> KnownGood | None:
        rec = record(raw)
        params = obj(rec.get("record")) if rec is not None else None
        if rec is None or params is None:
            return None
        return cls(record=frozen(params), unit_sha256=text(rec.get("unit_sha256")),
                   secrets_sha256=text(rec.get("secrets_sha256")))
