"""`sglang-deploy lock`: make a release lock (with hashes) for the HOSTS' platform, and prove it.

    sglang-deploy lock locks/NAME.in            # resolve -> locks/NAME.txt, then --check it
    sglang-deploy lock --check locks/NAME.txt   # install it in a scratch venv + release smoke

The input `locks/NAME.in` lists the top-level pins. Its directives (comment lines, so plain
uv reads the file too; ``core.lockfile.LockInput``): `# lock-options: ...` adds uv options
(`--no-deps` for the testbed); `# constraint: SPEC` bounds a package that something requires
(uv's `--constraint`: it never adds a package, unlike a requirement, and never replaces a
dependency's own bound, unlike an override), the reason in the comment above it;
`# versions-from: OTHER.txt` gives every package that OTHER lock also holds OTHER's version.
`-c FILE` adds a constraints file. The lock's header records the target and every bound.
The existing output is uv's preference: a re-lock moves only what the new bounds move.

`--check` (also run after `lock` where this machine matches the lock's platform) installs the
lock with uv into a scratch venv cached by the lock's hash, then runs the release smoke
(`import sglang`, sglang's own `prepare_server_args` on the inventory's launch flags, the
server's entry modules) and `uv pip check`: see controller/releasecheck.py.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from sglang_deploy.commands import common

DEFAULT_PLATFORM = "x86_64-manylinux_2_36"  # Debian 12 (glibc 2.36) on x86_64
DEFAULT_PYTHON = "3.11"  # Debian 12's python3
#: the --python-platform values of uv that name a Linux host image: ARCH-manylinux_2_GLIBC
#: (docs/releases.md, "A lock for another host image")
PLATFORM_HELP = ("the hosts' platform, as uv's --python-platform: ARCH-manylinux_2_NN with "
                 "the hosts' glibc 2.NN (x86_64 or aarch64; uv knows 2_17 to 2_40), e.g. "
                 "x86_64-manylinux_2_36 for Debian 12, x86_64-manylinux_2_39 for Ubuntu 24.04 "
                 "(default: %(default)s)")


def compile_command(src: Path, out: Path, platform: str, python: str,
                    constraint_files: list[str] = ()) -> list[str]:
    """``uv pip compile`` of SRC, with the options of its ``# lock-options:`` lines and
    CONSTRAINT_FILES (``--constraint``)."""
    from sglang_deploy.core import lockfile

    directives = lockfile.parse_input(src.read_text())
    cons = [a for f in constraint_files for a in ("--constraint", str(f))]
    # the command the lock's header names makes this very lock again (target and output)
    again = f"sglang-deploy lock {src}"
    if (platform, python) != (DEFAULT_PLATFORM, DEFAULT_PYTHON):
        again += f" --platform {platform} --python-version {python}"
    if out != src.with_suffix(".txt"):
        again += f" --output {out}"
    return [shutil.which("uv") or "uv", "pip", "compile", str(src), "--generate-hashes",
            "--quiet", "--python-platform", platform, "--python-version", python,
            "--custom-compile-command", again, *directives.options,
            *cons, "-o", str(out)]


def add_parser(sub) -> None:
    p = common.add_command(
        sub, "lock",
        help="make a release lock file (hashes) for the hosts' platform, or --check one",
        failed="uv pip compile failed, or the lock's check failed (its error is printed)")
    p.add_argument("input", type=Path, metavar="INPUT",
                   help="locks/NAME.in (with --check: the lock, locks/NAME.txt)")
    p.add_argument("--platform", default=DEFAULT_PLATFORM, help=PLATFORM_HELP)
    p.add_argument("--python-version", default=DEFAULT_PYTHON, metavar="X.Y",
                   help="the hosts' python3 (3.11 on Debian 12, 3.12 on Ubuntu 24.04; "
                        "default: %(default)s)")
    p.add_argument("--output", type=Path,
                   help="the lock to write (default: NAME.txt beside the input); never the "
                        "input itself")
    p.add_argument("-c", "--constraint", action="append", default=[], metavar="FILE",
                   help="a constraints file for the resolution (repeatable; recorded in the "
                        "lock's header; default: none)")
    p.add_argument("--check", action="store_true",
                   help="install INPUT (a lock: locks/NAME.txt) in a cached scratch venv and "
                        "run the release smoke and `uv pip check` there (default: off)")
    p.add_argument("--no-check", action="store_true",
                   help="after making the lock, do not check it (default: check it where "
                        "this machine matches the lock's platform)")
    p.add_argument("--inventory", metavar="INVENTORY",
                   help="whose launch flags the smoke parses (default: group_data/ alone)")
    p.add_argument("--python", metavar="PATH",
                   help="the interpreter of the scratch venv (default: /usr/bin/pythonX.Y of "
                        "the lock's version, else pythonX.Y on PATH)")
    p.add_argument("--json", action="store_true",
                   help="with --check: the result as JSON on stdout (default: off)")


def _missing(path: Path, what: str):
    from sglang_deploy.core.errors import UsageError

    return UsageError(what=what, found=f"no file {path}",
                      fix="pass an existing file (see locks/)")


def _is_lock(text: str) -> bool:
    return "--hash=sha256:" in text


def check_platform(platform: str) -> None:
    """A --platform of a Linux host image (``ARCH-manylinux_2_NN``, uv's values), else a
    usage error naming the values accepted (before uv runs)."""
    import re

    from sglang_deploy.core.errors import UsageError

    m = re.fullmatch(r"(x86_64|aarch64)-manylinux_2_(\d+)", platform)
    if m is None or not 17 <= int(m.group(2)) <= 40:
        raise UsageError(what="--platform ARCH-manylinux_2_NN: ARCH x86_64 or aarch64, NN the "
                              "hosts' glibc minor version from 17 to 40",
                         found=f"--platform {platform}",
                         fix="e.g. x86_64-manylinux_2_36 (Debian 12) or x86_64-manylinux_2_39 "
                             "(Ubuntu 24.04); docs/releases.md, \"A lock for another host "
                             "image\"")


def refuse_wrong_input(args) -> None:
    """A lock given to make a lock (it would be resolved as requirements and overwritten,
    its header's bounds lost), an output that is the input, or an input to --check that is
    no lock: usage errors (exit 2) that name the command meant."""
    from sglang_deploy.core.errors import UsageError

    src: Path = args.input
    is_lock = _is_lock(src.read_text())
    source, lock = src.with_suffix(".in"), src.with_suffix(".txt")
    if args.check:
        if not is_lock:
            raise UsageError(what="a lock (with hashes) after --check",
                             found=f"{src} has no hashes: a lock's input",
                             fix=f"--check takes the lock file: {lock} (make it first with "
                                 f"`sglang-deploy lock {src}`)")
        return
    if is_lock:
        raise UsageError(what=f"a lock's input ({source}) to make a lock from",
                         found=f"{src} is a lock (it has hashes); re-locking it would "
                               "overwrite it and drop its header's bounds",
                         fix=f"re-lock from its input: sglang-deploy lock {source}; check this "
                             f"lock: sglang-deploy lock --check {src}")
    out = args.output or lock
    if out.resolve() == src.resolve():
        raise UsageError(what="an output other than the input",
                         found=f"the lock would overwrite its input {src}",
                         fix=f"name the input {source} (the lock is written beside it as "
                             f"{lock}) or pass another --output")


def make_lock(args) -> tuple[int, Path]:
    from sglang_deploy.core import lockfile

    src: Path = args.input
    out = args.output or src.with_suffix(".txt")
    directives = lockfile.parse_input(src.read_text())
    files = [str(f) for f in args.constraint]
    for f in args.constraint:
        if not Path(f).is_file():
            raise _missing(Path(f), "a constraints file (-c FILE)")
    # uv names these files in its `# via -c FILE` notes: a fixed relative path keeps the
    # lock deterministic (the folder is the tool's own, git-ignored)
    work = Path(".sglang-deploy", "lock", src.stem)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    extra = []
    if directives.constraints:
        extra.append(work / "constraints.txt")
        extra[-1].write_text("".join(f"{c}\n" for c in directives.constraints))
    for other in directives.versions_from:
        path = src.parent / other
        if not path.is_file():
            raise _missing(path, f"the lock named by `# versions-from:` in {src}")
        extra.append(work / f"versions-of-{Path(other).stem}.txt")
        extra[-1].write_text(lockfile.pins_as_constraints(path.read_text(), str(path)))
    cmd = compile_command(src, out, args.platform, args.python_version,
                          files + [str(e) for e in extra])
    proc = subprocess.run(cmd, stdout=sys.stderr, check=False)
    if proc.returncode != 0:
        print(f"sglang-deploy lock: uv pip compile failed (exit status {proc.returncode}; "
              "its error is above)", file=sys.stderr)
        return common.EXIT_FAILED, out
    header = lockfile.header_lines(
        args.platform, args.python_version, constraints=directives.constraints,
        constraint_files=files,
        versions_from=[str(src.parent / o) for o in directives.versions_from],
        options=directives.options)
    out.write_text(lockfile.with_header(out.read_text(), header))
    print(f"wrote {out}" + (f" (bounded by: {'; '.join(h.split(': ', 1)[1] for h in header[1:])})"
                            if len(header) > 1 else ""), file=sys.stderr)
    return common.EXIT_OK, out


def run(args) -> int:
    from sglang_deploy.controller import releasecheck
    from sglang_deploy.core import lockfile

    if not args.input.is_file():
        raise _missing(args.input, "INPUT: locks/NAME.in (or, with --check, locks/NAME.txt)")
    refuse_wrong_input(args)
    if args.check:
        return releasecheck.main(args.input, inventory=args.inventory, python=args.python,
                                 as_json=args.json)
    check_platform(args.platform)
    rc, out = make_lock(args)
    if rc != common.EXIT_OK or args.no_check:
        return rc
    reason = releasecheck.platform_mismatch(lockfile.parse_header(out.read_text()))
    if reason:
        print(f"sglang-deploy lock: not checked here ({reason}); run `sglang-deploy lock "
              f"--check {out}` on a machine of the hosts' platform", file=sys.stderr)
        return rc
    return releasecheck.main(out, inventory=args.inventory, python=args.python,
                             as_json=args.json)
