"""The served model in the page cache (pure): how much of it is there, and whether to read it in
before a restart.

A restart of a large model is dominated by reading its shards (GLM-5-NVFP4: about 400 GB; cold
from NVMe at 2-3 GB/s that is minutes, from the page cache a fraction of that), and every rank
of a TP-8 server maps the same shard files. The host-state read reports, per shard, the bytes
in the page cache (``remote/hoststate.py``: mincore over a read-only mapping, nothing read) and
the host's MemAvailable and MemTotal. ``Residency.of`` makes one figure of them;
``warm_decision`` says whether a run reads the shards in while the old server still serves
(``remote/model_warm.py``), and why not.

The decision: warm only when a (re)start is coming, warming is on (``sglang_model_warm``), some
shard bytes are not in the page cache, and those bytes plus a margin (``sglang_model_warm_margin_pct`` of MemTotal)
fit in MemAvailable; otherwise nothing, or a skip that names the figures. A read-only run
(``status``, ``--dry``) decides the same: its plan names the operation, which only the run
executes (the dry run equals the run).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sglang_deploy.core.hostrecords import Memory, ModelState
from sglang_deploy.core.progress import size

WARM = "warm"  # read the missing bytes in
SKIP = "skip"  # would help, but does not fit (or cannot be told): said, with the figures
NONE = "none"  # nothing to do (off, no restart, already in memory, no shards)


@dataclass(frozen=True)
class Residency:
    """The model's shards in the page cache, and the host's memory (bytes)."""

    shard_bytes: int
    resident_bytes: int | None  # None: the host could not tell (for at least one shard)
    shards: int
    mem_available: int | None = None
    mem_total: int | None = None

    @classmethod
    def of(cls, model: ModelState | None, memory: Memory | None) -> Residency | None:
        """From the host-state read's ``model`` (``hoststate.model_state``) and ``memory``;
        None when the folder has no shard on the host."""
        shards = [s for s in (model.shards.values() if model is not None else ())
                  if s.exists and s.size is not None]
        if not shards:
            return None
        known = [s.resident for s in shards]
        resident = None if any(r is None for r in known) \
            else sum(r for r in known if r is not None)
        memory = memory or Memory()
        return cls(shard_bytes=sum(s.size or 0 for s in shards), resident_bytes=resident,
                   shards=len(shards), mem_available=memory.available, mem_total=memory.total)

    @property
    def missing_bytes(self) -> int | None:
        """Shard bytes not in the page cache (None: unknown)."""
        if self.resident_bytes is None:
            return None
        return max(self.shard_bytes - self.resident_bytes, 0)

    @property
    def percent(self) -> int | None:
        """Percent of the shard bytes in the page cache, rounded down (100 only when all)."""
        if self.resident_bytes is None:
            return None
        if not self.shard_bytes:
            return 100
        return min(100, self.resident_bytes * 100 // self.shard_bytes)

    def text(self) -> str:
        """``97% in memory (388.0 GB of 400.0 GB; MemAvailable 120.0 GB)``."""
        avail = f"; MemAvailable {size(self.mem_available)}" if self.mem_available is not None \
            else ""
        if self.percent is None:
            return f"in memory: unknown ({size(self.shard_bytes)} of shards{avail})"
        return (f"{self.percent}% in memory ({size(self.resident_bytes)} of "
                f"{size(self.shard_bytes)}{avail})")

    def as_json(self) -> dict[str, Any]:
        return {"shard_bytes": self.shard_bytes, "resident_bytes": self.resident_bytes,
                "percent": self.percent, "shards": self.shards,
                "mem_available": self.mem_available, "mem_total": self.mem_total}


def margin_bytes(margin_pct: float, mem_total: int | None) -> int:
    """The memory kept free besides the warmed bytes: MARGIN_PCT percent of MemTotal."""
    return int((mem_total or 0) * margin_pct / 100)


@dataclass(frozen=True)
class WarmDecision:
    action: str  # WARM, SKIP or NONE
    reason: str
    read_bytes: int = 0  # WARM: the bytes not in the page cache
    keep_available: int = 0  # WARM: stop reading if MemAvailable falls below this


def warm_decision(residency: Residency | None, *, enabled: bool, restart_coming: bool, margin_pct: float, pending: bool = False
                  ) -> WarmDecision:
    """Whether to read the model's shards into the page cache before the server (re)starts.

    PENDING: the shards are downloaded by this very run (a new revision), so the figures are
    not there yet: warm, and let the host's own measure decide once they are."""
    if not enabled:
        return WarmDecision(NONE, "off (sglang_model_warm: false)")
    if not restart_coming:
        return WarmDecision(NONE, "no (re)start coming")
    if pending:
        return WarmDecision(WARM, "the shards arrive in this run: measured on the host then")
    if residency is None or not residency.shard_bytes:
        return WarmDecision(NONE, "no shard on the host")
    missing = residency.missing_bytes
    if missing is None:
        return WarmDecision(SKIP, "the page cache's residency cannot be read on the host "
                                  "(mincore refused: not root nor the shards' owner)")
    if missing == 0:
        return WarmDecision(NONE, f"already {residency.text()}")
    if residency.mem_available is None or residency.mem_total is None:
        return WarmDecision(SKIP, f"MemAvailable/MemTotal not reported by the host; "
                                  f"{residency.text()}")
    margin = margin_bytes(margin_pct, residency.mem_total)
    need = missing + margin
    if need > residency.mem_available:
        return WarmDecision(SKIP, (
            f"does not fit: {size(missing)} to read + {size(margin)} margin "
            f"({margin_pct:g}% of MemTotal {size(residency.mem_total)}) = {size(need)} > "
            f"MemAvailable {size(residency.mem_available)}; the server will load it from disk "
            f"(lower sglang_model_warm_margin_pct or free memory)"))
    return WarmDecision(WARM, (
        f"{size(missing)} of {size(residency.shard_bytes)} not in memory; fits: "
        f"{size(need)} (with {size(margin)} margin) <= MemAvailable "
        f"{size(residency.mem_available)}"), read_bytes=missing, keep_available=margin)


def result_text(result: Mapping[str, Any]) -> str:
    """One line of ``model_warm.py warm``'s final object: what was read, how fast, and the
    residency after it."""
    read, seconds = result.get("read_bytes") or 0, result.get("seconds") or 0.0
    rate = f"{size(read / seconds)}/s" if seconds > 0 and read else "-"
    after = Residency(shard_bytes=int(result.get("shard_bytes") or 0),
                      resident_bytes=result.get("resident_after"), shards=0)
    stopped = f"; stopped early: {result['stopped']}" if result.get("stopped") else ""
    prio = result.get("io_priority") or "?"
    return (f"model warm: read {size(read)} in {seconds:.1f}s ({rate}, I/O priority {prio}); "
            f"now {after.percent if after.percent is not None else '?'}% in memory{stopped}")
