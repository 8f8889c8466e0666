"""The host side of the FlashInfer autotune patch (``flashinfer_cutlass``).

Finds SGLang in a venv, reads its version, writes the patched file atomically (mode and
owner kept), byte-compiles it and keeps a JSON state record. What to change is decided by
the pure ``sglang_deploy/core/patch.py`` (see its docstring).

The deploy ships both files to ``ROOT/tools`` side by side and runs ``<release venv>/bin/python
ROOT/tools/patch_tool.py status|apply PATH [--json] [--record FILE] [--python EXE]`` (exit
codes: :data:`EXIT_CODES`); on the controller the same CLI is ``sglang-deploy patch``.
Stdlib only: it imports ``patch`` from its own folder on a host, from the package otherwise.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import os
import re
import stat
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

if __package__:  # imported from the sglang_deploy package (the `patch` command, the tests)
    from sglang_deploy.core import patch
else:  # a script in ROOT/tools on a host, beside the shipped patch.py
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import patch  # type: ignore[no-redef]

# Error codes of the host side (PatchError.code), besides the analysis' own
NOT_FOUND = "not-found"
WRITE_FAILED = "write-failed"
COMPILE_FAILED = "compile-failed"


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
        raise patch.patch_error(
            NOT_FOUND,
            what=f"an SGLang installation at {p} (a site-packages, sglang package or venv "
            "directory, or the file itself)",
            found="not a file, nor a site-packages / sglang package / venv directory "
            "containing sglang/srt" if p.exists() else "the path does not exist",
            fix="pass the release venv's site-packages directory (e.g. "
            "/opt/sglang/venv/lib/python3.11/site-packages), its sglang package directory, "
            "or the file sglang/srt/model_executor/model_runner.py",
        )
    existing = [pkg / rel for rel in patch.KNOWN_LOCATIONS if (pkg / rel).is_file()]
    pattern = re.compile(rf"^\s*(?:async\s+)?def\s+_?{patch.FUNCTION_NAME}\s*\(", re.MULTILINE)
    for f in existing:
        if pattern.search(f.read_text(encoding="utf-8", errors="replace")):
            return f
    if existing:
        return existing[-1]
    raise patch.patch_error(
        NOT_FOUND,
        what=f"SGLang's model runner under {pkg}",
        found=f"none of {', '.join('sglang/' + r for r in patch.KNOWN_LOCATIONS)} exists",
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
        return self.state == patch.APPLIED

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
        raise patch.patch_error(
            patch.UNRECOGNISED,
            what=f"{file} to be UTF-8 text",
            found=str(exc),
            fix="reinstall sglang in that venv; the file is not the one from the wheel",
        ) from None
    root = _sglang_root(file)
    version = read_version(root) if root else None
    relpath = file.resolve().relative_to(root.parent).as_posix() if root else file.name
    return data, text, version, relpath


def _analyse_file(file: Path) -> tuple[bytes, str, str | None, patch.PatchPlan]:
    data, text, version, relpath = _read(file)
    bom = text.startswith("\ufeff")
    plan = patch.analyse(text[1:] if bom else text, relpath, version=version)
    if bom:
        plan.new_source = "\ufeff" + plan.new_source
    return data, text, version, plan


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
            raise patch.patch_error(
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
            raise patch.patch_error(
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
            if result.state == patch.ALREADY:
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
    if plan.state == patch.NEEDED:
        new = plan.new_source.encode("utf-8")
        real = file.resolve()
        try:
            _atomic_write(real, new, like=os.stat(real))
        except OSError as exc:
            raise patch.patch_error(
                WRITE_FAILED,
                what=f"{real} to be writable",
                found=f"{type(exc).__name__}: {exc}",
                fix="run the patch as the owner of the release venv (or root); the file is "
                "unchanged",
            ) from None
        pyc = byte_compile(real, python)
        state, after, diff = patch.APPLIED, _sha256(new), plan.diff
        message = (f'uncommented "{patch.BACKEND}" in {plan.function}() '
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
            raise patch.patch_error(
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
    kw = {"epilog": EXIT_CODES, "formatter_class": argparse.RawDescriptionHelpFormatter}
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
        description=patch.__doc__.split("\n\n")[0] if patch.__doc__ else None,
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
    except (patch.PatchError, OSError):
        return str(path), None
    root = _sglang_root(f)
    return str(f), (read_version(root) if root else None)


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
    except (patch.PatchError, OSError) as err:
        code = patch.error_code(err) if isinstance(err, patch.PatchError) else "error"
        file, version = _describe(args.path)
        message = str(err)
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
    """Standalone entry (on a host): ``python patch_tool.py status|apply PATH [--json]
    [--record FILE] [--python EXE]``."""
    parser = argparse.ArgumentParser(
        prog="patch_tool.py",
        description="FlashInfer autotune patch for SGLang (flashinfer_cutlass)",
    )
    sub = parser.add_subparsers(dest="patch_command", metavar="{status,apply}")
    sub.required = True
    _add_arguments(sub)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
