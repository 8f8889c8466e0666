"""`sglang-deploy wheelhouse LOCK DIR`: fill a local wheelhouse with every wheel of a lock.

For air-gapped sites, or an index that no longer serves an old version: hosts whose data
sets ``sglang_wheelhouse`` install the release venv (``uv pip sync --offline --no-index
--find-links``) and uv itself from that folder, without reaching any index.

pip's own ``pip download --require-hashes`` does the work (``controller.wheelhouse.fill``, through
``controller.pipdownload``): for each
pin of the lock the one wheel that fits the HOSTS (CPython version and glibc platform,
default Debian 12 x86_64) and whose sha256 is one of the lock's hashes, so the host's
``--require-hashes`` install accepts it; then uv's own wheel (for the tool venv), checked
against the index's sha256. Index credentials (pip.conf, netrc, keyring), retries and
progress are pip's.
"""

from __future__ import annotations

import sys
from pathlib import Path

from sglang_deploy.commands import common
from sglang_deploy.controller.pipdownload import DEFAULT_ARCH, DEFAULT_GLIBC, DEFAULT_PYTHON

DEFAULT_INDEX = "https://pypi.org/simple"


def add_parser(sub) -> None:
    p = common.add_command(sub, "wheelhouse",
                           help="fill a local wheelhouse with every wheel of a lock (offline installs)",
                           failed="a wheel could not be downloaded (pip's error is printed)")
    p.add_argument("lock", type=Path, metavar="LOCK", help="locks/NAME.txt")
    p.add_argument("dest", type=Path, metavar="DIR", help="wheelhouse folder to fill")
    p.add_argument("--index-url", default=None,
                   help=f"package index (pip's --index-url; default: pip's own, {DEFAULT_INDEX})")
    p.add_argument("--python-version", default=DEFAULT_PYTHON, help="the hosts' CPython (X.Y)")
    p.add_argument("--glibc", default="%d.%d" % DEFAULT_GLIBC, help="the hosts' glibc (X.Y)")
    p.add_argument("--arch", default=DEFAULT_ARCH)
    p.add_argument("--uv-version", default="0.13.9", help="uv wheel for the tool venv ('' = none)")


def run(args) -> int:
    from sglang_deploy.core.errors import UsageError

    try:
        glibc = tuple(int(x) for x in args.glibc.split("."))
        if len(glibc) != 2:
            raise ValueError
    except ValueError:
        raise UsageError(what="--glibc X.Y", found=repr(args.glibc), fix="e.g. --glibc 2.36") from None
    from sglang_deploy.controller.wheelhouse import fill

    result = fill(args.lock, args.dest, index=args.index_url, python=args.python_version,
                  glibc=glibc, arch=args.arch, uv_version=args.uv_version or None,
                  log=lambda m: print(m, file=sys.stderr))
    have = sum(1 for _ in args.dest.glob("*.whl"))
    print(f"{args.dest}: {len(result['fetched'])} fetched, {have} wheels for "
          f"{result['pins']} pins")
    return common.EXIT_OK
