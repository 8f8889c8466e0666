"""The first error of a failed start that nothing catalogued names (pure): the exception as
the log prints it, where it was raised and by which rank, so that explain-log and the
verifier name it instead of a generic cause (logcauses.diagnose)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["ExcLine", "first_error", "first_error_fix"]


@dataclass(frozen=True)
class ExcLine:
    """An exception line as the tracker saw it (``ValueError: ...``, also behind a rank's
    prefix), with where it was raised: the innermost frame printed above it and that
    frame's code line, when a traceback came with it."""

    line: str                   # redacted, as shown
    after_ready: bool
    text: str                   # without its prefixes
    where: str | None = None    # "sglang/srt/x.py:12, in func"
    code: str | None = None     # the frame's source line ("assert x == 1")
    rank: str | None = None     # the rank whose traceback it ends ("TP3"), when one is known


def first_error(exc_lines: list[ExcLine], named: Callable[[str], bool]) -> dict[str, Any] | None:
    """The first exception before ready that no signature names (NAMED says which are; a
    warning is no error, and the teardown's own `scheduler died` message is named), as the
    log prints it: ``type``, ``message``, ``where`` it was raised, its ``code`` line, the
    ``rank``, the ``line`` as shown and a ``summary`` of them. None when there is none."""
    for e in exc_lines:
        kind, _, message = e.text.partition(":")
        if e.after_ready or kind.endswith("Warning") or named(e.text):
            continue
        message = message.strip()
        where = e.where
        if e.code and (not message or kind == "AssertionError"):
            where = f"{where}: `{e.code[:160]}`" if where else f"`{e.code[:160]}`"
        summary = (message[:240] or "(no message)") + (f" (raised in {where})" if where else "") \
            + (f" on {e.rank}" if e.rank else "")
        return {"type": kind, "message": message, "where": e.where, "code": e.code,
                "rank": e.rank, "line": e.line, "summary": summary}
    return None


def first_error_fix(error: dict[str, Any], phase: str | None) -> str:
    """The fix of an error nothing catalogued names: read it, the usual suspects."""
    where = f" raised in {error['where']}" if error.get("where") else ""
    return (f"no catalogued cause matches it: the {error['type']}{where} is the first error "
            f"the server printed{f' (phase {phase})' if phase else ''}. Most often a launch "
            "flag, the model and the SGLang version do not go together: check the flags for "
            "this model and version, or roll back to the known-good configuration; report it "
            "with its traceback (the lines below)")
