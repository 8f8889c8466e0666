"""The few lines of a server log that show an operator what happened (pure): the excerpt
that the verifier, ``explain-log`` and ``logs --explain`` print under a verdict."""

from __future__ import annotations

import re

from sglang_deploy.core.logs.prefix import strip_prefix

__all__ = ["relevant"]


def relevant(blocks: list[list[str]], flagged: list[str], recent: list[str],
             limit: int) -> list[str]:
    """The first traceback of BLOCKS (where a crash starts; other ranks usually repeat it),
    a different last one if any, then the FLAGGED lines (fatal and notable, deduplicated
    across ranks), bounded to LIMIT lines. Without any of those: the RECENT lines."""
    out: list[str] = []
    if blocks:
        out += blocks[0]
        if blocks[-1][-1] != blocks[0][-1]:    # (a tracker's blocks are never empty)
            out += ["..."] + blocks[-1]
    firsts: dict[str, str] = {}
    for line in flagged:
        firsts.setdefault(_dedup_key(line), line)
    in_tb = {_dedup_key(x) for x in out}
    extras = [line for key, line in firsts.items() if key not in in_tb]
    if not out and not extras:
        return recent[-min(limit, 30):]
    if len(out) + len(extras) > limit:
        keep_tb = max(limit - len(extras), limit // 2)
        if len(out) > keep_tb:
            head = max(keep_tb // 4, 1)
            tail = keep_tb - head - 1
            out = out[:head] + [f"... ({len(out) - head - tail} lines omitted)"] + \
                (out[-tail:] if tail > 0 else [])
        extras = extras[: max(limit - len(out), 0)]
    return out + extras


def _dedup_key(line: str) -> str:
    key = strip_prefix(line)[2]
    return re.sub(r"\bRank \d+\b", "Rank N", key)[:200]
