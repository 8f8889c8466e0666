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

Layers:
  * pure core: :func:`analyse` (-> :class:`PatchPlan`) and :func:`apply_text`;
  * file helpers: :func:`locate`, :func:`status`, :func:`apply` (atomic write keeping
    mode/owner, byte-compile, optional JSON state record);
  * CLI: :func:`add_parser` / :func:`run` for ``sglang-deploy patch ...``, and
    ``python patch.py status|apply PATH [--json] [--record FILE] [--python EXE]``.

This module is shipped to the hosts and run there with the release venv's python as a
standalone script, so it imports only the standard library at module level.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import hashlib
import json
import os
import re
import stat
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

try:  # inside the sglang_deploy package; standalone on a host it is not importable
    from sglang_deploy.core.errors import PatchError
except ImportError:  # pragma: no cover - exercised by the standalone-script test

    class PatchError(Exception):  # type: ignore[no-redef]
        """Standalone stand-in for ``sglang_deploy.core.errors.PatchError`` (same fields/text)."""

        title = "cannot patch SGLang"

        def __init__(self, what: str, found: str | None = None, fix: str | None = None, *,
                     details: dict | None = None) -> None:
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

        def to_dict(self) -> dict:
            return {"type": "PatchError", "what": self.what, "found": self.found,
                    "fix": self.fix, **({"details": self.details} if self.details else {})}


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
NOT_FOUND = "not-found"
WRITE_FAILED = "write-failed"
COMPILE_FAILED = "compile-failed"

_COMMENTED_RE = re.compile(r'^(?P<indent>[ \t]*)#[ \t]?"flashinfer_cutlass",[ \t]*$')
_TODO_RE = re.compile(r"^(?P<indent>[ \t]*)#[ \t]*TODO\b.*\bflashinfer_cutlass\b")
_LINE_RE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z")


def _error(code: str, *, what: str, found: str = "", fix: str = "") -> Exception:
    """A PatchError; ``what`` is what was expected (rendered "expected <what>"). The error
    code (no-autotune-list, unrecognised, ...) is ``err.code`` and ``err.details["code"]``."""
    err = PatchError(what=what, found=found or None, fix=fix or None, details={"code": code})
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


# --------------------------------------------------------------------------- pure core


@dataclass
class PatchPlan:
    """What :func:`analyse` found. ``state`` is ``needed``, ``already-applied`` or
    ``enabled-upstream``; for ``needed`` the change is ``old_line`` -> ``new_line`` at
    ``line`` (1-based) and ``new_source``/``diff`` hold the result."""

    state: str
    relpath: str
    function: str  # e.g. "ModelRunner._should_run_flashinfer_autotune"
    function_lines: tuple[int, int]
    list_lines: tuple[int, int]
    line: int  # the flashinfer_cutlass line (commented or not)
    old_line: str  # without line ending
    new_line: str  # without line ending (== old_line unless state == needed)
    new_source: str
    diff: str
    message: str
    marker: bool = False  # already-applied: our marker is on the line
    notes: list[str] = field(default_factory=list)


def _find_functions(tree: ast.Module) -> list[tuple[str, ast.AST, bool]]:
    """(qualname, node, is_method) for every definition of the autotune predicate."""
    found: list[tuple[str, ast.AST, bool]] = []
    defs = (ast.FunctionDef, ast.AsyncFunctionDef)
    for node in tree.body:
        if isinstance(node, defs) and node.name == FUNCTION_NAME:
            found.append((node.name, node, False))
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, defs) and item.name == METHOD_NAME:
                    found.append((f"{node.name}.{item.name}", item, True))
    return found


def _is_backend_list(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.List)
        and bool(node.elts)
        and all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts)
        and any(e.value.startswith("flashinfer_") for e in node.elts)  # type: ignore[attr-defined]
    )


def analyse(source: str, relpath: str = "<source>", *, version: str | None = None) -> PatchPlan:
    """Locate the MoE autotune allow-list in SOURCE and say what the patch would do.

    Raises PatchError with ``code`` ``no-autotune-list`` (no list: SGLang <= 0.5.6.post2)
    or ``unrecognised`` (the function exists but its shape is not one we know)."""
    label = f"SGLang {version}" if version else "this SGLang"
    where = f"{relpath}" + (f" (SGLang {version})" if version else "")

    def unrecognised(found: str, lines: tuple[int, int] | None = None) -> Exception:
        at = f" (lines {lines[0]}-{lines[1]})" if lines else ""
        return _error(
            UNRECOGNISED,
            what=f"the FlashInfer autotune allow-list in {where} in a known shape (a list "
            'of flashinfer_* MoE backends with "flashinfer_cutlass" commented out under its '
            "TODO, or enabled); other shapes are refused, never guessed",
            found=found + at,
            fix=f"inspect {relpath}{at} by hand; {SUPPORTED}. Pin a known version, teach "
            "sglang_deploy/core/patch.py this layout, or turn the autotune patch off for this "
            "profile",
        )

    try:
        tree = ast.parse(source, filename=relpath)
    except SyntaxError as exc:
        raise _error(
            UNRECOGNISED,
            what=f"{where} to parse with Python {sys.version.split()[0]}",
            found=f"SyntaxError: {exc.msg} (line {exc.lineno})",
            fix="run the patch with the release venv's python (the standalone script: "
            "`python patch.py status SITE_PACKAGES`), which can parse its own sglang",
        ) from None

    funcs = _find_functions(tree)
    if not funcs:
        raise _error(
            NO_LIST,
            what=_NO_LIST_WHAT,
            found=f"{label}: neither {METHOD_NAME}() (a method) nor {FUNCTION_NAME}() (a "
            f"module function) is defined in {relpath}; SGLang <= 0.5.5.post3 has no "
            "FlashInfer autotune at all",
            fix=_NO_LIST_FIX,
        )
    if len(funcs) > 1:
        names = ", ".join(f"{q} (line {n.lineno})" for q, n, _ in funcs)  # type: ignore[attr-defined]
        raise unrecognised(f"the autotune predicate is defined {len(funcs)} times: {names}")

    qualname, func, _is_method = funcs[0]
    flines = (func.lineno, func.end_lineno or func.lineno)  # type: ignore[attr-defined]
    lines = _split_lines(source)
    body_text = "".join(lines[flines[0] - 1 : flines[1]])

    candidates = [n for n in ast.walk(func) if _is_backend_list(n)]
    if not candidates:
        if "enable_flashinfer_autotune" in body_text:
            raise _error(
                NO_LIST,
                what=_NO_LIST_WHAT,
                found=f"{label}: {qualname}() in {relpath} (lines {flines[0]}-{flines[1]}) "
                "uses the opt-in --enable-flashinfer-autotune scheme of 0.5.6.x and has no "
                "MoE backend list",
                fix=_NO_LIST_FIX,
            )
        raise unrecognised(f"{qualname}() has no list of flashinfer_* backends", flines)
    if len(candidates) > 1:
        raise unrecognised(
            f"{qualname}() has {len(candidates)} lists of flashinfer_* backends "
            f"(lines {', '.join(str(c.lineno) for c in candidates)}): which one is meant is "
            "ambiguous",
            flines,
        )
    lst = candidates[0]
    llines = (lst.lineno, lst.end_lineno or lst.lineno)  # type: ignore[attr-defined]
    elt_lines = sorted({e.lineno for e in lst.elts})  # type: ignore[attr-defined]
    enabled = [e for e in lst.elts if e.value == BACKEND]  # type: ignore[attr-defined]

    # The list's interior lines (between the brackets), as (lineno, text without eol).
    interior = [(n, _strip_eol(lines[n - 1])) for n in range(llines[0], llines[1] + 1)]
    commented = [(n, t) for n, t in interior if _COMMENTED_RE.match(t)]
    marked = [(n, t) for n, t in interior if MARKER in t]

    def plan(state: str, n: int, new_line: str, new_source: str, diff: str, message: str,
             marker: bool = False, notes: list[str] | None = None) -> PatchPlan:
        return PatchPlan(
            state=state, relpath=relpath, function=qualname, function_lines=flines,
            list_lines=llines, line=n, old_line=_strip_eol(lines[n - 1]), new_line=new_line,
            new_source=new_source, diff=diff, message=message, marker=marker,
            notes=notes or [],
        )

    if enabled:
        if len(enabled) > 1 or commented:
            raise unrecognised(
                f'"{BACKEND}" appears {len(enabled)} time(s) enabled and {len(commented)} '
                f"time(s) commented out in the list of {qualname}()",
                llines,
            )
        n = enabled[0].lineno
        text = _strip_eol(lines[n - 1])
        if len([e for e in lst.elts if e.lineno == n]) != 1:  # type: ignore[attr-defined]
            raise unrecognised(f'"{BACKEND}" shares line {n} with other list items', llines)
        if any(m != n for m, _ in marked):
            raise unrecognised(
                f"the marker {MARKER!r} is on line(s) "
                f"{', '.join(str(m) for m, _ in marked if m != n)}, not on the "
                f'"{BACKEND}" item (line {n})',
                llines,
            )
        if marked:
            return plan(ALREADY, n, text, source, "",
                        f'"{BACKEND}" enabled by sglang-deploy ({relpath}:{n})', marker=True)
        above = _strip_eol(lines[n - 2]) if n >= 2 else ""
        if _TODO_RE.match(above):
            note = "no sglang-deploy marker: it was uncommented by hand or another tool"
            return plan(ALREADY, n, text, source, "",
                        f'"{BACKEND}" enabled under the TODO ({relpath}:{n}; {note})',
                        notes=[note])
        return plan(UPSTREAM, n, text, source, "",
                    f'"{BACKEND}" is autotuned upstream ({qualname}, {relpath}:{n}): '
                    "nothing to patch")

    if marked:
        raise unrecognised(
            f"the marker {MARKER!r} is present (line {marked[0][0]}) but "
            f'"{BACKEND}" is not an item of the list',
            llines,
        )
    if not commented:
        raise unrecognised(
            f'"{BACKEND}" is neither an item of nor commented out in the list of {qualname}() '
            f"(lines {llines[0]}-{llines[1]})",
            flines,
        )
    if len(commented) > 1:
        raise unrecognised(
            f'"{BACKEND}" is commented out {len(commented)} times '
            f"(lines {', '.join(str(n) for n, _ in commented)})",
            llines,
        )
    n, text = commented[0]
    indent = _indent(text)
    item_indents = {_indent(_strip_eol(lines[m - 1])) for m in elt_lines}
    if (
        llines[0] in elt_lines
        or llines[1] in elt_lines
        or len(elt_lines) != len(lst.elts)
        or item_indents != {indent}
    ):
        raise unrecognised(
            f"the list items of {qualname}() are not one per line at the indentation of the "
            f"commented-out line {n} ({len(indent)} columns)",
            llines,
        )
    above = _strip_eol(lines[n - 2])
    m = _TODO_RE.match(above)
    if not m or m.group("indent") != indent:
        raise unrecognised(
            f'line {n - 1}, above the commented-out "{BACKEND}" (line {n}), is not the '
            f"flashinfer_cutlass TODO comment: {above.strip()!r}",
            llines,
        )
    new_line = f'{indent}"{BACKEND}",  {MARKER}'
    new_lines = list(lines)
    new_lines[n - 1] = new_line + _eol(lines[n - 1])
    new_source = "".join(new_lines)
    diff = _unified_diff(lines, new_lines, relpath)
    result = plan(NEEDED, n, new_line, new_source, diff,
                  f'"{BACKEND}" is commented out in {qualname}() ({relpath}:{n}): '
                  "the patch uncomments it")
    # Self-check: the result parses and reads back as our change, on the same line.
    try:
        again = analyse(new_source, relpath, version=version)
    except PatchError as exc:  # pragma: no cover - would be a bug in this module
        raise unrecognised(f"the patched text does not verify: {exc}", llines) from None
    if again.state != ALREADY or not again.marker or again.line != n:  # pragma: no cover
        raise unrecognised(f"the patched text reads back as {again.state!r}", llines)
    return result


def apply_text(source: str, relpath: str = "<source>", *,
               version: str | None = None) -> tuple[str, str]:
    """Return (new_source, state): state ``applied`` (changed now), ``already-applied`` or
    ``enabled-upstream`` (source returned unchanged). Raises PatchError like analyse."""
    p = analyse(source, relpath, version=version)
    if p.state == NEEDED:
        return p.new_source, APPLIED
    return source, p.state


# --------------------------------------------------------------------------- files


def _site_packages_of_prefix(path: Path) -> list[Path]:
    """site-packages dirs of a venv / prefix (lib/python3.*/site-packages)."""
    return sorted(path.glob("lib/python3*/site-packages")) + sorted(
        path.glob("lib64/python3*/site-packages")
    )


def _package_dir(path: Path) -> Path | None:
    """The ``sglang`` package dir for a site-packages dir, a package dir or a venv prefix."""
    if path.name == "sglang" and (path / "srt").is_dir():
        return path
    if (path / "sglang" / "srt").is_dir():
        return path / "sglang"
    for sp in _site_packages_of_prefix(path):
        if (sp / "sglang" / "srt").is_dir():
            return sp / "sglang"
    return None


def locate(path: str | os.PathLike) -> Path:
    """The file that holds the autotune predicate.

    PATH may be a site-packages dir, an ``sglang`` package dir, a venv prefix or the file
    itself. The known locations are tried newest first; the first that defines the
    predicate wins. If none does, ``srt/model_executor/model_runner.py`` is returned (so
    that analysis reports ``no-autotune-list``). Raises PatchError(code=``not-found``)."""
    p = Path(path)
    if p.is_file():
        return p
    pkg = _package_dir(p) if p.is_dir() else None
    if pkg is None:
        raise _error(
            NOT_FOUND,
            what=f"an SGLang installation at {p} (a site-packages, sglang package or venv "
            "directory, or the file itself)",
            found="not a file, nor a site-packages / sglang package / venv directory "
            "containing sglang/srt" if p.exists() else "the path does not exist",
            fix="pass the release venv's site-packages directory (e.g. "
            "/opt/sglang/venv/lib/python3.11/site-packages), its sglang package directory, "
            "or the file sglang/srt/model_executor/model_runner.py",
        )
    existing = [pkg / rel for rel in KNOWN_LOCATIONS if (pkg / rel).is_file()]
    pattern = re.compile(rf"^\s*(?:async\s+)?def\s+_?{FUNCTION_NAME}\s*\(", re.MULTILINE)
    for f in existing:
        if pattern.search(f.read_text(encoding="utf-8", errors="replace")):
            return f
    if existing:
        return existing[-1]
    raise _error(
        NOT_FOUND,
        what=f"SGLang's model runner under {pkg}",
        found=f"none of {', '.join('sglang/' + r for r in KNOWN_LOCATIONS)} exists",
        fix="check that sglang is fully installed in that venv (uv pip install from the lock)",
    )


def _sglang_root(file: Path) -> Path | None:
    for parent in file.resolve().parents:
        if parent.name == "sglang" and (
            (parent / "version.py").is_file() or (parent / "__init__.py").is_file()
        ):
            return parent
    return None


def _literal_version(path: Path) -> str | None:
    """``__version__ = "x"`` (also ``__version__ = version = "x"``) at module top level."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return None
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "__version__" for t in node.targets)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            return node.value.value
    return None


def read_version(pkg: Path) -> str | None:
    """SGLang's version from the package dir: version.py (<= 0.5.6 holds the literal),
    _version.py (0.5.7+: version.py imports it, generated by setuptools-scm), then the
    dist-info METADATA next to the package."""
    for name in ("version.py", "_version.py"):
        v = _literal_version(pkg / name)
        if v:
            return v
    for meta in sorted(pkg.parent.glob("sglang-*.dist-info/METADATA")):
        try:
            for line in meta.read_text(encoding="utf-8").splitlines():
                if line.startswith("Version:"):
                    return line.split(":", 1)[1].strip()
                if not line.strip():
                    break
        except OSError:
            continue
    return None


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass
class PatchResult:
    state: str  # needed | applied | already-applied | enabled-upstream
    file: str
    version: str | None
    sha256: str  # of the file now
    diff: str  # the change made (apply) or to be made (status: needed); "" otherwise
    message: str
    sha256_before: str | None = None
    line: int | None = None
    function: str | None = None
    pyc: str | None = None  # apply/applied: the byte-compiled file
    record: str | None = None  # apply: where the state record was written

    @property
    def changed(self) -> bool:
        return self.state == APPLIED

    def to_dict(self) -> dict:
        d = asdict(self)
        d["changed"] = self.changed
        return d

    def to_json(self, **kw) -> str:
        return json.dumps(self.to_dict(), **kw)


def _read(file: Path) -> tuple[bytes, str, str | None, str]:
    """(raw bytes, text, version, relpath) for a located file."""
    data = file.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _error(
            UNRECOGNISED,
            what=f"{file} to be UTF-8 text",
            found=str(exc),
            fix="reinstall sglang in that venv; the file is not the one from the wheel",
        ) from None
    root = _sglang_root(file)
    version = read_version(root) if root else None
    relpath = file.resolve().relative_to(root.parent).as_posix() if root else file.name
    return data, text, version, relpath


def _analyse_file(file: Path) -> tuple[bytes, str, str | None, PatchPlan]:
    data, text, version, relpath = _read(file)
    bom = text.startswith("\ufeff")
    plan = analyse(text[1:] if bom else text, relpath, version=version)
    if bom:
        plan.new_source = "\ufeff" + plan.new_source
    return data, text, version, plan


def status_from_record(record: dict | None, file_sha256: str | None) -> dict | None:
    """What ``status --json`` would say, decided from a release's state record (see
    :func:`write_record`) when the patched file is still byte-for-byte the file the record
    describes (FILE_SHA256, its sha256 on the host now): ``already-applied`` after
    ``applied``/``already-applied``, ``enabled-upstream`` after ``enabled-upstream``. None
    when the record is absent, unknown or does not match: then ``status`` must read the file."""
    if not isinstance(record, dict) or not file_sha256 or record.get("sha256_after") != file_sha256:
        return None
    state = {APPLIED: ALREADY, ALREADY: ALREADY, UPSTREAM: UPSTREAM}.get(record.get("state"))
    if state is None or not record.get("file"):
        return None
    return {"state": state, "file": record["file"], "version": record.get("version"),
            "sha256": file_sha256, "from_record": True}


def status(path: str | os.PathLike) -> PatchResult:
    """Read-only: ``needed``, ``already-applied`` or ``enabled-upstream`` (raises
    PatchError for ``not-found``, ``no-autotune-list``, ``unrecognised``)."""
    file = locate(path)
    data, _text, version, plan = _analyse_file(file)
    return PatchResult(
        state=plan.state, file=str(file), version=version, sha256=_sha256(data),
        sha256_before=_sha256(data), diff=plan.diff, message=plan.message, line=plan.line,
        function=plan.function,
    )


def _atomic_write(file: Path, data: bytes, like: os.stat_result | None = None) -> None:
    """Write DATA to FILE via a temp file + rename in the same dir, keeping the mode and
    owner of LIKE (the file's stat before)."""
    fd, tmp = tempfile.mkstemp(dir=str(file.parent), prefix=f".{file.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        if like is not None:
            os.chmod(tmp, stat.S_IMODE(like.st_mode))
            st = os.stat(tmp)
            if (st.st_uid, st.st_gid) != (like.st_uid, like.st_gid):
                os.chown(tmp, like.st_uid, like.st_gid)
        os.replace(tmp, file)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    try:
        dfd = os.open(str(file.parent), os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:  # pragma: no cover - some filesystems refuse fsync on dirs
        pass


_COMPILE_SNIPPET = "import py_compile, sys; print(py_compile.compile(sys.argv[1], doraise=True))"


def byte_compile(file: Path, python: str | None = None) -> str:
    """Byte-compile FILE into its __pycache__ (what ``python -m py_compile FILE`` does),
    with PYTHON's interpreter tag when given (the target venv's interpreter), else
    in-process. The .pyc gets the source's owner. Returns the .pyc path."""
    if python:
        try:
            proc = subprocess.run(
                [python, "-c", _COMPILE_SNIPPET, str(file)],
                capture_output=True, text=True, check=False,
            )
        except OSError as exc:
            proc = subprocess.CompletedProcess([python], 127, "", f"{type(exc).__name__}: {exc}")
        if proc.returncode != 0:
            raise _error(
                COMPILE_FAILED,
                what=f"{file} to byte-compile with {python}",
                found=(proc.stderr or proc.stdout).strip()[-2000:],
                fix="the source was written and re-parsed fine; check that PYTHON is the "
                "release venv's interpreter and that its __pycache__ is writable, then rerun",
            )
        pyc = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    else:
        import py_compile

        try:
            pyc = py_compile.compile(str(file), doraise=True)
        except (py_compile.PyCompileError, OSError) as exc:
            raise _error(
                COMPILE_FAILED,
                what=f"{file} to byte-compile",
                found=str(exc),
                fix="check that its __pycache__ is writable, then rerun",
            ) from None
    if pyc:
        src = os.stat(file)
        for p in (Path(pyc).parent, Path(pyc)):
            try:
                st = os.stat(p)
                if (st.st_uid, st.st_gid) != (src.st_uid, src.st_gid):
                    os.chown(p, src.st_uid, src.st_gid)
            except OSError:
                pass
    return pyc


def write_record(record_path: str | os.PathLike, result: PatchResult) -> None:
    """The small JSON state record: patch, tool, version, file, state, sha256_before,
    sha256_after, line. Rewritten only when its content changes, and left as it is on an
    ``already-applied`` run whose file still matches it (so it keeps describing the
    change: state ``applied`` with the unpatched file's sha256_before)."""
    rec = {
        "patch": "flashinfer-cutlass-autotune",
        "tool": "sglang-deploy",
        "version": result.version,
        "file": result.file,
        "state": result.state,
        "sha256_before": result.sha256_before,
        "sha256_after": result.sha256,
        "line": result.line,
    }
    data = (json.dumps(rec, indent=2, sort_keys=True) + "\n").encode()
    path = Path(record_path)
    try:
        if path.is_file():
            old = path.read_bytes()
            if old == data:
                return
            if result.state == ALREADY:
                prev = json.loads(old)
                if (prev.get("file"), prev.get("sha256_after")) == (result.file, result.sha256):
                    return
    except (OSError, ValueError, AttributeError):
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    _atomic_write(path, data)


def apply(path: str | os.PathLike, *, python: str | None = None,
          record_path: str | os.PathLike | None = None) -> PatchResult:
    """Apply the patch: ``applied``, or the no-op states ``already-applied`` /
    ``enabled-upstream`` (file untouched). Writes atomically (mode and owner kept),
    byte-compiles (see :func:`byte_compile`), writes the state record if RECORD_PATH."""
    file = locate(path)
    data, _text, version, plan = _analyse_file(file)
    before = _sha256(data)
    pyc = None
    if plan.state == NEEDED:
        new = plan.new_source.encode("utf-8")
        real = file.resolve()
        try:
            _atomic_write(real, new, like=os.stat(real))
        except OSError as exc:
            raise _error(
                WRITE_FAILED,
                what=f"{real} to be writable",
                found=f"{type(exc).__name__}: {exc}",
                fix="run the patch as the owner of the release venv (or root); the file is "
                "unchanged",
            ) from None
        pyc = byte_compile(real, python)
        state, after, diff = APPLIED, _sha256(new), plan.diff
        message = (f'uncommented "{BACKEND}" in {plan.function}() '
                   f"({plan.relpath}:{plan.line})")
    else:
        state, after, diff, message = plan.state, before, "", plan.message
    result = PatchResult(
        state=state, file=str(file), version=version, sha256=after, sha256_before=before,
        diff=diff, message=message, line=plan.line, function=plan.function, pyc=pyc,
    )
    if record_path:
        try:
            write_record(record_path, result)
        except OSError as exc:
            raise _error(
                WRITE_FAILED,
                what=f"the state record {record_path} to be writable",
                found=f"{type(exc).__name__}: {exc} (the patch itself is {state})",
                fix="make the record's directory writable or pass another --record",
            ) from None
        result.record = str(record_path)
    return result


# --------------------------------------------------------------------------- CLI


#: the exit statuses of `patch status|apply` (in their --help)
EXIT_CODES = """exit status:
  0   a state: needed, applied, already-applied, enabled-upstream (printed)
  1   an error state: no-autotune-list, unrecognised, write-failed, or a PATH without sglang
      (the error is printed with the fix; with --json also as one JSON object)
  2   usage error"""


def _add_arguments(sub) -> None:
    kw = dict(epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    s = sub.add_parser("status", help="show whether the autotune patch is needed (read-only)",
                       **kw)
    s.add_argument("path", metavar="PATH",
                   help="site-packages dir, sglang package dir, venv prefix or the file")
    s.add_argument("--json", action="store_true", help="print one JSON object")
    a = sub.add_parser("apply", help="apply the autotune patch (idempotent)", **kw)
    a.add_argument("path", metavar="PATH",
                   help="site-packages dir, sglang package dir, venv prefix or the file")
    a.add_argument("--json", action="store_true", help="print one JSON object")
    a.add_argument("--record", metavar="FILE", help="write a JSON state record to FILE")
    a.add_argument("--python", metavar="EXE",
                   help="byte-compile with this interpreter (the release venv's python); "
                   "default: the running one")


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register ``patch status PATH [--json]`` and ``patch apply PATH [--json]
    [--record FILE] [--python EXE]`` on an argparse subparsers object; the parser's
    default ``func`` is :func:`run`."""
    p = subparsers.add_parser(
        "patch",
        help="the FlashInfer autotune patch (flashinfer_cutlass, SGLang 0.5.7..0.5.12.post1)",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="patch_command", metavar="{status,apply}")
    sub.required = True
    _add_arguments(sub)
    p.set_defaults(func=run)
    return p


def _describe(path: str) -> tuple[str, str | None]:
    """(file, version) for an error report, as far as they can be told."""
    try:
        f = locate(path)
    except (PatchError, OSError):
        return str(path), None
    root = _sglang_root(f)
    return str(f), (read_version(root) if root else None)


def _format_error(err: BaseException) -> str:
    return str(err)


def run(args: argparse.Namespace) -> int:
    """Run ``patch status|apply``: 0 on a state, 1 on an error (actionable message on
    stderr; with --json also one JSON object on stdout with ``state``=error code and
    ``error``)."""
    command = getattr(args, "patch_command", None)
    as_json = bool(getattr(args, "json", False))
    try:
        if command == "status":
            result = status(args.path)
        elif command == "apply":
            result = apply(args.path, python=getattr(args, "python", None),
                           record_path=getattr(args, "record", None))
        else:
            print("usage: patch {status,apply} PATH [--json] [--record FILE]", file=sys.stderr)
            return 2
    except (PatchError, OSError) as err:
        code = error_code(err) if isinstance(err, PatchError) else "error"
        file, version = _describe(args.path)
        message = _format_error(err)
        print(f"sglang-deploy patch {command}: {code}: {message}", file=sys.stderr)
        if as_json:
            print(json.dumps({
                "state": code, "file": file, "version": version, "error": message,
                "what": getattr(err, "what", None), "found": getattr(err, "found", None),
                "fix": getattr(err, "fix", None), "changed": False,
            }))
        return 1
    if as_json:
        print(result.to_json())
    else:
        ver = result.version or "unknown version"
        print(f"{result.state}: {result.message}\n  file: {result.file} (sglang {ver})")
        if result.diff:
            print(result.diff, end="")
        if result.record:
            print(f"  record: {result.record}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Standalone entry (on a host): ``python patch.py status|apply PATH [--json]
    [--record FILE] [--python EXE]``."""
    parser = argparse.ArgumentParser(
        prog="patch.py", description="FlashInfer autotune patch for SGLang (flashinfer_cutlass)"
    )
    sub = parser.add_subparsers(dest="patch_command", metavar="{status,apply}")
    sub.required = True
    _add_arguments(sub)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
