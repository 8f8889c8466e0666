"""The rollout's pure parts: the order, the batches, each host's result and the decisions
from the outcome records (``commands/rollout.py`` runs them)."""

from __future__ import annotations

from dataclasses import dataclass

from sglang_deploy.core import outcome as outcomemod
from sglang_deploy.core.outcome import HostOutcome


def plan_order(hosts: list[str], canary: str | None = None,
               limit: list[str] | None = None) -> list[str]:
    """Hosts in rollout order: the canary first, then the inventory order (limited: LIMIT
    is the hosts --limit selected)."""
    from sglang_deploy.core.errors import UsageError

    unknown = [h for h in ([canary] if canary else []) + list(limit or []) if h not in hosts]
    if unknown:
        raise UsageError(what="host names from the inventory",
                         found=f"not in the inventory: {', '.join(unknown)}",
                         fix=f"use one of: {', '.join(hosts)}")
    chosen = [h for h in hosts if not limit or h in limit]
    if canary and canary not in chosen:
        raise UsageError(what="the canary among the hosts rolled",
                         found=f"{canary} is excluded by --limit", fix="add it to --limit")
    return ([canary] if canary else []) + [h for h in chosen if h != canary]


def batches(order: list[str], size: int, canary: str | None = None,
            units: dict[str, list[str]] | None = None) -> list[list[str]]:
    """Batches of SIZE units; the canary's unit, if any, alone in the first batch. A unit is
    one host, or every node of a multi-node group (UNITS: host -> its group's nodes in rank
    order), which is drained, restarted, verified and rolled back as one."""
    from sglang_deploy.core.errors import UsageError

    if size < 1:
        raise UsageError(what="--batch of at least 1", found=str(size), fix="use --batch 1 or more")
    units = units or {}
    rest: list[list[str]] = []
    for h in order:
        unit = [n for n in units.get(h, [h]) if n in order]
        if unit not in rest:
            rest.append(unit)
    out: list[list[str]] = []
    if canary:
        out.append(rest.pop(0))
    for i in range(0, len(rest), size):
        out.append([h for unit in rest[i:i + size] for h in unit])
    return out


@dataclass
class HostResult:
    host: str
    status: str = "untouched"  # done | converged | failed | rolled-back | rollback-failed | untouched
    seconds: float | None = None
    restart_to_ready_s: float | None = None
    action: str | None = None
    message: str = ""
    rollback_seconds: float | None = None
    log: str | None = None
    router: str | None = None  # with a router: out (drained) | back (routed to again) | left out
    rollback: str | None = None  # the rollback's verified action: rolled-back | unchanged
    stage_seconds: float | None = None  # the staging run (all hosts at once), before any drain
    out_of_router_s: float | None = None  # from its drain's start to its put back
    drain_s: float | None = None  # its drain: from the DELETE to out of routing and idle
    #: the router's state of it when its drain ended: ``draining`` (the router still held it
    #: in its settle: the drain ended first) or ``removed``
    drain_router: str | None = None
    #: its put back: how long it waited for the router to forget its drain (None: no wait)
    readd_wait_s: float | None = None
    #: staged, with a router: the part of its deploy step run while it drained (the run's
    #: start, connections and host reads: ``stages/rollgate.py``)
    prepared_while_draining_s: float | None = None
    #: the deploy's restart decision on the host (its outcome record: ``restart`` true or
    #: false, ``why``, ``reasons``; ``core.restart``); None: the run did not reach it
    restart: dict | None = None


def outcome(results: list[HostResult]) -> tuple[bool, str]:
    """(all good?, one-line verdict) of a finished rollout."""
    bad = [r for r in results if r.status in ("failed", "rolled-back", "rollback-failed")]
    if any(r.status == "rollback-failed" for r in results):
        names = ", ".join(r.host for r in results if r.status == "rollback-failed")
        return False, f"ROLLBACK FAILED on {names}: the host may not be serving; act now"
    if bad:
        untouched = sum(r.status == "untouched" for r in results)
        return False, (f"rollout halted at {bad[0].host} ({bad[0].status}); "
                       f"{untouched} host(s) untouched")
    return True, f"rollout complete: {len(results)} host(s) verified"


def failure_text(o: HostOutcome) -> str:
    """What went wrong on a host, from its record: the typed error (expected / found / fix),
    the connection's error, or why the run left no result for it."""
    if o.kind == outcomemod.UNREACHABLE:
        return f"did not answer over SSH: {o.message}"
    return o.message


def answered(outcomes: dict[str, HostOutcome]) -> list[str]:
    """The hosts of the reachability check (``pyinfra exec -- true``) that did not pass it:
    not connected, a deploy lock held elsewhere, invalid data, or no record at all."""
    return [name for name, o in outcomes.items() if not o.passed]


def after_deploy(o: HostOutcome) -> tuple[str, str, float | None]:
    """(status, message, seconds from restart to ready) of a host after its batch's deploy:
    done / converged only when the verifier passed on it in this run."""
    if o.verified:
        s = o.summary or {}
        status = "converged" if o.action == "converged" else "done"
        return (status, f"{o.action}; sglang {s.get('sglang_version')} release {s.get('release')}",
                s.get("time_to_ready_s"))
    if o.passed:
        return "failed", "the deploy passed but the verifier did not run on this host", None
    return "failed", failure_text(o), None


def after_staging(o: HostOutcome) -> str | None:
    """None when the staging run passed on the host (everything installed and checked,
    nothing serving touched), else why it failed (its typed error)."""
    if o.passed:
        return None
    return "staging failed (nothing drained, still serving its release): " + failure_text(o)


def after_rollback(o: HostOutcome) -> tuple[str, str]:
    """(status, line added to the message) of a failed host after rollback.py: still on its
    known-good release (not restarted), rolled back, nothing to roll back to (no known-good
    configuration: ``service.NO_KNOWN_GOOD``), or ROLLBACK FAILED."""
    from sglang_deploy.core.service import NO_KNOWN_GOOD

    release = (o.summary or {}).get("release")
    if o.verified and o.action == "unchanged":
        # nothing had changed yet: it still serves, not restarted
        return "failed", (f"still on its known-good release {release} (checked serving; "
                          "nothing to restore, not restarted)")
    if o.verified:
        return "rolled-back", f"rolled back to release {release}, restarted and verified serving"
    if (o.kind == outcomemod.FAILED and o.error_type() == "RollbackError"
            and ((o.error or {}).get("details") or {}).get("reason") == NO_KNOWN_GOOD):
        return "failed", ("nothing to roll back to: no known-good configuration on the host "
                          "(no deploy was ever verified there)")
    return "rollback-failed", "ROLLBACK FAILED: " + failure_text(o)


def verified_after_rollback(r: HostResult) -> bool:
    """Serving a verified configuration after the rollback: put back into the router. A host
    that was never verified, or whose rollback failed, stays out."""
    return r.status in ("done", "converged", "rolled-back") or r.rollback == "unchanged"


def indent(text: str, prefix: str = "      ") -> str:
    return "\n".join(prefix + line for line in text.splitlines())


def batches_emptying_the_router(groups: list[list[str]], workers: set[str]) -> list[int]:
    """The (1-based) batches of GROUPS that hold every one of the router's WORKERS: while
    such a batch is out, the router has no worker to send a request to. None with fewer than
    two workers (one worker cannot be rolled without that)."""
    if len(workers) < 2:
        return []
    return [i for i, batch in enumerate(groups, 1) if workers <= set(batch)]
