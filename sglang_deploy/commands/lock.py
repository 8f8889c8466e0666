"""`sglang-deploy lock`: regenerate a release lock (with hashes) for the HOSTS' platform.

The input `locks/NAME.in` lists the top-level pins; a line `# lock-options: ...` in it adds
uv options (e.g. `--no-deps` for the testbed, which installs sglang without its GPU stack).
The output `locks/NAME.txt` is what `uv pip sync --require-hashes` installs on the host.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from sglang_deploy.commands import common

DEFAULT_PLATFORM = "x86_64-manylinux_2_36"  # Debian 12 (glibc 2.36) on x86_64
DEFAULT_PYTHON = "3.11"  # Debian 12's python3


def compile_command(src: Path, out: Path, platform: str, python: str) -> list[str]:
    """``uv pip compile`` of SRC, with the options of its ``# lock-options:`` lines."""
    options = [o for line in src.read_text().splitlines() if line.startswith("# lock-options:")
               for o in shlex.split(line.split(":", 1)[1])]
    return [shutil.which("uv") or "uv", "pip", "compile", str(src), "--generate-hashes",
            "--quiet", "--python-platform", platform, "--python-version", python,
            "--custom-compile-command", f"sglang-deploy lock {src}", *options, "-o", str(out)]


def add_parser(sub) -> None:
    p = common.add_command(sub, "lock",
                           help="regenerate a release lock file (hashes) for the hosts' platform",
                           failed="uv pip compile failed (its error is printed)")
    p.add_argument("input", type=Path, metavar="INPUT", help="locks/NAME.in")
    p.add_argument("--platform", default=DEFAULT_PLATFORM)
    p.add_argument("--python-version", default=DEFAULT_PYTHON)
    p.add_argument("--output", type=Path, help="default: NAME.txt beside the input")


def run(args) -> int:
    from sglang_deploy.core.errors import UsageError

    if not args.input.is_file():
        raise UsageError(what="INPUT: the top-level pins of a release (locks/NAME.in)",
                         found=f"no file {args.input}",
                         fix="pass an existing .in file (see locks/*.in)")
    out = args.output or args.input.with_suffix(".txt")
    cmd = compile_command(args.input, out, args.platform, args.python_version)
    proc = subprocess.run(cmd, stdout=sys.stderr, check=False)
    if proc.returncode != 0:
        print(f"sglang-deploy lock: uv pip compile failed (exit status {proc.returncode}; "
              "its error is above)", file=sys.stderr)
        return common.EXIT_FAILED
    print(f"wrote {out}")
    return common.EXIT_OK
