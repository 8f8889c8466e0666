"""Version-aware FlashInfer autotune patch for SGLang (``flashinfer_cutlass``).

SGLang 0.5.7 .. 0.5.12.post1 decide in ``ModelRunner._should_run_flashinfer_autotune``
(``sglang/srt/model_executor/model_runner.py``) which MoE runner backends get FlashInfer
autotune, from a list in which ``flashinfer_cutlass`` is commented out::

            if backend_str not in [
                "flashinfer_trtllm",
                # TODO: Enable for flashinfer_trtllm_routed once ... is fixed.
                # "flashinfer_trtllm_routed",
                "flashinfer_mxfp4",
                # TODO: flashinfer_cutlass will cause some flashinfer compilation errors. To be fixed.
                # "flashinfer_cutlass",
            ]:

The patch uncomments exactly that one line (indentation kept) and tags it with a marker
comment, so that a second run can tell our change (``already-applied``) from upstream's
(``enabled-upstream``, 0.5.13+; 0.5.14 in ``runner/base_runner.py``, 0.5.15+ in the module
function ``runner/flashinfer_autotune.py:should_run_flashinfer_autotune``)::

                # TODO: flashinfer_cutlass will cause some flashinfer compilation errors. To be fixed.
                "flashinfer_cutlass",  # sglang-deploy: autotune patch

Nothing is guessed: the function is located with ``ast`` and the list inside it by its
line range; any other shape is refused (``unrecognised``). Versions <= 0.5.6.post2 have
no MoE autotune allow-list (``no-autotune-list``).

This module is the pure part: :func:`analyse` (-> :class:`PatchPlan`, with the new source)
and :func:`status_from_record`, on text and dicts only (no file system). The host side
(locate the package in a venv, read its version, atomic write, byte-compile, the JSON state
record, the ``status|apply`` CLI) is ``sglang_deploy/remote/patch_tool.py``. Both files are
shipped to the host's tools folder, side by side, and run there with the release venv's
python (``python patch_tool.py status|apply PATH ...``), so this module imports only the
standard library at module level.
"""

from __future__ import annotations

import ast
import difflib
import re
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeGuard

if TYPE_CHECKING:
    from sglang_deploy.core.errors import PatchError
    from sglang_deploy.core.hostrecords import PatchRecord


class StandalonePatchError(Exception):
    """Standalone stand-in for ``sglang_deploy.core.errors.PatchError`` (same fields/text)."""

    title = "cannot patch SGLang"

    def __init__(self, what: str, found: str | None = None, fix: str | None = None, *,
                 details: dict[str, Any] | None = None) -> None:
        self.what, self.found, self.fix = what, found, fix
        self.details = dict(details or {})
        super().__init__(what)

    def __str__(self) -> str:
        out = [f"{self.title}: expected {self.what}"]
        if self.found:
            out.append("  found:    " + "\n            ".join(str(self.found).splitlines()))
        if self.fix:
            out.append("  fix:      " + "\n            ".join(str(self.fix).splitlines()))
        return "\n".join(out)

    def to_dict(self) -> dict[str, Any]:
        return {"type": "PatchError", "what": self.what, "found": self.found,
                "fix": self.fix, **({"details": self.details} if self.details else {})}


def error_type() -> type[PatchError | StandalonePatchError]:
    """The type of this module's errors: the package's typed ``PatchError`` (imported when
    first needed), or,
    standalone on a host where the package is not importable, ``StandalonePatchError``."""
    try:
        from sglang_deploy.core.errors import PatchError
    except ImportError:  # pragma: no cover - exercised by the standalone-script test
        return StandalonePatchError
    return PatchError


MARKER = "# sglang-deploy: autotune patch"
"""Comment put on the line we uncomment: makes ``already-applied`` unambiguous."""

METHOD_NAME = "_should_run_flashinfer_autotune"  # ModelRunner (<=0.5.13.post1), BaseRunner (0.5.14)
FUNCTION_NAME = "should_run_flashinfer_autotune"  # module function, 0.5.15+
BACKEND = "flashinfer_cutlass"

# Where the function lives, newest layout first (relative to the ``sglang`` package dir).
KNOWN_LOCATIONS = (
    "srt/model_executor/runner/flashinfer_autotune.py",  # 0.5.15+
    "srt/model_executor/runner/base_runner.py",  # 0.5.14
    "srt/model_executor/model_runner.py",  # 0.5.6 .. 0.5.13.post1 (and the file of <= 0.5.5)
)

PATCH_RANGE = "0.5.7 .. 0.5.12.post1"
SUPPORTED = (
    f"the patch applies to SGLang {PATCH_RANGE}; 0.5.13 and later autotune "
    "flashinfer_cutlass upstream (nothing to patch); <= 0.5.6.post2 have no MoE allow-list"
)
_NO_LIST_WHAT = (
    "an SGLang with the FlashInfer autotune MoE allow-list: "
    f"{PATCH_RANGE} (patched) or >= 0.5.13 (flashinfer_cutlass enabled upstream)"
)
_NO_LIST_FIX = (
    f"pin sglang {PATCH_RANGE} (tested pin: 0.5.12.post1) or >= 0.5.13; on older versions "
    "FlashInfer cannot autotune flashinfer_cutlass: turn the autotune patch off for this "
    "profile"
)

# States
NEEDED = "needed"  # status only: the commented line is there, unpatched
APPLIED = "applied"  # apply only: we changed it now
ALREADY = "already-applied"
UPSTREAM = "enabled-upstream"
# Error codes (PatchError.code)
NO_LIST = "no-autotune-list"
UNRECOGNISED = "unrecognised"

_COMMENTED_RE = re.compile(r'^(?P<indent>[ \t]*)#[ \t]?"flashinfer_cutlass",[ \t]*$')
_TODO_RE = re.compile(r"^(?P<indent>[ \t]*)#[ \t]*TODO\b.*\bflashinfer_cutlass\b")
_LINE_RE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z")


def patch_error(code: str, *, what: str, found: str = "", fix: str = "") -> Exception:
    """A PatchError; ``what`` is what was expected (rendered "expected <what>"). The error
    code (no-autotune-list, unrecognised, ...) is ``err.code`` and ``err.details["code"]``."""
    err: Exception = error_type()(what=what, found=found or None, fix=fix or None,
                                  details={"code": code})
    err.code = code  # type: ignore[attr-defined]
    return err


def error_code(err: BaseException) -> str:
    return getattr(err, "code", None) or "error"


def _split_lines(text: str) -> list[str]:
    """Lines with their endings, split the way Python's tokenizer counts them
    (\\n, \\r\\n, \\r only; str.splitlines would also split on \\f, \\x1c, \\u2028 ...)."""
    return _LINE_RE.findall(text)


def _strip_eol(line: str) -> str:
    return line.rstrip("\r\n")


def _eol(line: str) -> str:
    return line[len(_strip_eol(line)):]


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip(" \t"))]


def _unified_diff(old: list[str], new: list[str], relpath: str) -> str:
    lines = difflib.unified_diff(
        [_strip_eol(x) for x in old],
        [_strip_eol(x) for x in new],
        fromfile=f"a/{relpath}",
        tofile=f"b/{relpath}",
        lineterm="",
    )
    out = "\n".join(lines)
    return out + "\n" if out else ""


@dataclass
class PatchPlan:
    """What :func:`analyse` found. ``state`` is ``needed``, ``already-applied`` or
    ``enabled-upstream``; for ``needed`` the change is ``old_line`` -> ``new_line`` at
    ``line`` (1-based) and ``new_source``/``diff`` hold the result."""

    state: str
    relpath: str
    function: str  # e.g. "ModelRunner._should_run_flashinfer_autotune"
    line: int  # the flashinfer_cutlass line (commented or not)
    old_line: str  # without line ending
    new_line: str  # without line ending (== old_line unless state == needed)
    new_source: str
    diff: str
    message: str
    marker: bool = False  # already-applied: our marker is on the line


def _find_functions(tree: ast.Module) -> list[tuple[str, ast.AST]]:
    """(qualname, node) for every definition of the autotune predicate."""
    found: list[tuple[str, ast.AST]] = []
    defs = (ast.FunctionDef, ast.AsyncFunctionDef)
    for node in tree.body:
        if isinstance(node, defs) and node.name == FUNCTION_NAME:
            found.append((node.name, node))
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, defs) and item.name == METHOD_NAME:
                    found.append((f"{node.name}.{item.name}", item))
    return found


def _is_backend_list(node: ast.AST) -> TypeGuard[ast.List]:
    return (
        isinstance(node, ast.List)
        and bool(node.elts)
        and all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts)
        and any(e.value.startswith("flashinfer_") for e in node.elts)  # type: ignore[attr-defined]
    )


@dataclass
class _Reading:
    """One source under analysis: its text, lines and names, for the errors and the plan."""

    source: str
    relpath: str
    version: str | None
    qualname: str = ""

    def __post_init__(self) -> None:
        self.lines = _split_lines(self.source)
        self.label = f"SGLang {self.version}" if self.version else "this SGLang"
        self.where = f"{self.relpath}" + (f" (SGLang {self.version})" if self.version else "")

    def line(self, n: int) -> str:
        return _strip_eol(self.lines[n - 1])

    def unrecognised(self, found: str, lines: tuple[int, int] | None = None) -> Exception:
        at = f" (lines {lines[0]}-{lines[1]})" if lines else ""
        return patch_error(
            UNRECOGNISED,
            what=f"the FlashInfer autotune allow-list in {self.where} in a known shape (a list "
            'of flashinfer_* MoE backends with "flashinfer_cutlass" commented out under its '
            "TODO, or enabled); other shapes are refused, never guessed",
            found=found + at,
            fix=f"inspect {self.relpath}{at} by hand; {SUPPORTED}. Pin a known version, teach "
            "sglang_deploy/core/patch.py this layout, or turn the autotune patch off for this "
            "profile",
        )

    def plan(self, state: str, n: int, message: str, *, new_line: str | None = None,
             new_source: str | None = None, diff: str = "", marker: bool = False) -> PatchPlan:
        old_line = self.line(n)
        return PatchPlan(state=state, relpath=self.relpath, function=self.qualname, line=n,
                         old_line=old_line, new_line=new_line or old_line,
                         new_source=self.source if new_source is None else new_source,
                         diff=diff, message=message, marker=marker)


def _parse(r: _Reading) -> ast.Module:
    try:
        return ast.parse(r.source, filename=r.relpath)
    except SyntaxError as exc:
        raise patch_error(
            UNRECOGNISED,
            what=f"{r.where} to parse with Python {sys.version.split()[0]}",
            found=f"SyntaxError: {exc.msg} (line {exc.lineno})",
            fix="run the patch with the release venv's python (the standalone script: "
            "`python patch_tool.py status SITE_PACKAGES`), which can parse its own sglang",
        ) from None


def _predicate(r: _Reading, tree: ast.Module) -> ast.AST:
    """The one definition of the autotune predicate (its qualname into R)."""
    funcs = _find_functions(tree)
    if not funcs:
        raise patch_error(
            NO_LIST,
            what=_NO_LIST_WHAT,
            found=f"{r.label}: neither {METHOD_NAME}() (a method) nor {FUNCTION_NAME}() (a "
            f"module function) is defined in {r.relpath}; SGLang <= 0.5.5.post3 has no "
            "FlashInfer autotune at all",
            fix=_NO_LIST_FIX,
        )
    if len(funcs) > 1:
        names = ", ".join(f"{q} (line {n.lineno})" for q, n in funcs)  # type: ignore[attr-defined]
        raise r.unrecognised(f"the autotune predicate is defined {len(funcs)} times: {names}")
    r.qualname, func = funcs[0]
    return func


def _backend_list(r: _Reading, func: ast.AST, flines: tuple[int, int]) -> ast.List:
    """The one list of flashinfer_* backends inside FUNC (lines FLINES)."""
    candidates = [n for n in ast.walk(func) if _is_backend_list(n)]
    if not candidates:
        if "enable_flashinfer_autotune" in "".join(r.lines[flines[0] - 1 : flines[1]]):
            raise patch_error(
                NO_LIST,
                what=_NO_LIST_WHAT,
                found=f"{r.label}: {r.qualname}() in {r.relpath} (lines {flines[0]}-{flines[1]}) "
                "uses the opt-in --enable-flashinfer-autotune scheme of 0.5.6.x and has no "
                "MoE backend list",
                fix=_NO_LIST_FIX,
            )
        raise r.unrecognised(f"{r.qualname}() has no list of flashinfer_* backends", flines)
    if len(candidates) > 1:
        raise r.unrecognised(
            f"{r.qualname}() has {len(candidates)} lists of flashinfer_* backends "
            f"(lines {', '.join(str(c.lineno) for c in candidates)}): which one is meant is "
            "ambiguous",
            flines,
        )
    return candidates[0]


def _plan_enabled(r: _Reading, lst: ast.List, enabled: list[ast.expr],
                  commented: list[tuple[int, str]], marked: list[tuple[int, str]],
                  llines: tuple[int, int]) -> PatchPlan:
    """The backend is an item of the list: ours (the marker), by hand, or upstream's."""
    if len(enabled) > 1 or commented:
        raise r.unrecognised(
            f'"{BACKEND}" appears {len(enabled)} time(s) enabled and {len(commented)} '
            f"time(s) commented out in the list of {r.qualname}()",
            llines,
        )
    n = enabled[0].lineno
    if len([e for e in lst.elts if e.lineno == n]) != 1:
        raise r.unrecognised(f'"{BACKEND}" shares line {n} with other list items', llines)
    if any(m != n for m, _ in marked):
        raise r.unrecognised(
            f"the marker {MARKER!r} is on line(s) "
            f"{', '.join(str(m) for m, _ in marked if m != n)}, not on the "
            f'"{BACKEND}" item (line {n})',
            llines,
        )
    if marked:
        return r.plan(ALREADY, n, f'"{BACKEND}" enabled by sglang-deploy ({r.relpath}:{n})',
                      marker=True)
    above = r.line(n - 1) if n >= 2 else ""
    if _TODO_RE.match(above):
        return r.plan(ALREADY, n, f'"{BACKEND}" enabled under the TODO ({r.relpath}:{n}; no '
                      "sglang-deploy marker: it was uncommented by hand or another tool)")
    return r.plan(UPSTREAM, n, f'"{BACKEND}" is autotuned upstream ({r.qualname}, '
                  f"{r.relpath}:{n}): nothing to patch")


def _commented_line(r: _Reading, lst: ast.List, commented: list[tuple[int, str]],
                    marked: list[tuple[int, str]],
                    llines: tuple[int, int], flines: tuple[int, int]) -> tuple[int, str]:
    """The one commented-out backend line (number, indentation), in a list of one item per
    line at its indentation, under the TODO comment."""
    if marked:
        raise r.unrecognised(
            f"the marker {MARKER!r} is present (line {marked[0][0]}) but "
            f'"{BACKEND}" is not an item of the list',
            llines,
        )
    if not commented:
        raise r.unrecognised(
            f'"{BACKEND}" is neither an item of nor commented out in the list of {r.qualname}() '
            f"(lines {llines[0]}-{llines[1]})",
            flines,
        )
    if len(commented) > 1:
        raise r.unrecognised(
            f'"{BACKEND}" is commented out {len(commented)} times '
            f"(lines {', '.join(str(n) for n, _ in commented)})",
            llines,
        )
    n, text = commented[0]
    indent = _indent(text)
    elt_lines = sorted({e.lineno for e in lst.elts})
    item_indents = {_indent(r.line(m)) for m in elt_lines}
    if (llines[0] in elt_lines or llines[1] in elt_lines or len(elt_lines) != len(lst.elts)
            or item_indents != {indent}):
        raise r.unrecognised(
            f"the list items of {r.qualname}() are not one per line at the indentation of the "
            f"commented-out line {n} ({len(indent)} columns)",
            llines,
        )
    above = r.line(n - 1)
    m = _TODO_RE.match(above)
    if not m or m.group("indent") != indent:
        raise r.unrecognised(
            f'line {n - 1}, above the commented-out "{BACKEND}" (line {n}), is not the '
            f"flashinfer_cutlass TODO comment: {above.strip()!r}",
            llines,
        )
    return n, indent


def analyse(source: str, relpath: str = "<source>", *, version: str | None = None) -> PatchPlan:
    """Locate the MoE autotune allow-list in SOURCE and say what the patch would do.

    Raises PatchError with ``code`` ``no-autotune-list`` (no list: SGLang <= 0.5.6.post2)
    or ``unrecognised`` (the function exists but its shape is not one we know)."""
    r = _Reading(source, relpath, version)
    func = _predicate(r, _parse(r))
    flines = (func.lineno, func.end_lineno or func.lineno)  # type: ignore[attr-defined]
    lst = _backend_list(r, func, flines)
    llines = (lst.lineno, lst.end_lineno or lst.lineno)
    enabled = [e for e in lst.elts if e.value == BACKEND]  # type: ignore[attr-defined]
    # The list's interior lines (between the brackets), as (lineno, text without eol).
    interior = [(n, r.line(n)) for n in range(llines[0], llines[1] + 1)]
    commented = [(n, t) for n, t in interior if _COMMENTED_RE.match(t)]
    marked = [(n, t) for n, t in interior if MARKER in t]
    if enabled:
        return _plan_enabled(r, lst, enabled, commented, marked, llines)
    n, indent = _commented_line(r, lst, commented, marked, llines, flines)
    new_line = f'{indent}"{BACKEND}",  {MARKER}'
    new_lines = list(r.lines)
    new_lines[n - 1] = new_line + _eol(r.lines[n - 1])
    new_source = "".join(new_lines)
    result = r.plan(NEEDED, n, f'"{BACKEND}" is commented out in {r.qualname}() ({relpath}:{n}): '
                    "the patch uncomments it", new_line=new_line, new_source=new_source,
                    diff=_unified_diff(r.lines, new_lines, relpath))
    # Self-check: the result parses and reads back as our change, on the same line.
    try:
        again = analyse(new_source, relpath, version=version)
    except error_type() as exc:  # pragma: no cover - would be a bug in this module
        raise r.unrecognised(f"the patched text does not verify: {exc}", llines) from None
    if again.state != ALREADY or not again.marker or again.line != n:  # pragma: no cover
        raise r.unrecognised(f"the patched text reads back as {again.state!r}", llines)
    return result


def status_from_record(record: PatchRecord | None, file_sha256: str | None
                       ) -> dict[str, Any] | None:
    """What ``status --json`` would say, decided from a release's state record (see
    ``patch_tool.write_record``) when the patched file is still byte-for-byte the file the
    record describes (FILE_SHA256, its sha256 on the host now): ``already-applied`` after
    ``applied``/``already-applied``, ``enabled-upstream`` after ``enabled-upstream``. None
    when the record is absent, unknown or does not match: then ``status`` must read the file."""
    if record is None or not file_sha256 or record.sha256_after != file_sha256:
        return None
    state = {APPLIED: ALREADY, ALREADY: ALREADY, UPSTREAM: UPSTREAM}.get(str(record.state))
    if state is None or not record.file:
        return None
    return {"state": state, "file": record.file, "version": record.version,
            "sha256": file_sha256, "from_record": True}
