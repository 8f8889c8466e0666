"""`sglang-deploy rebuild INVENTORY HOST [--cache FILE]`: disaster recovery of one host.

A host that was lost and replaced by a blank container is brought back to the state the
deploy defines: the release from the committed lock (offline from `sglang_wheelhouse` when
the data names one), the same patch state, unit and flags, verified serving. With
``--cache`` the archive from ``sglang-deploy cache save`` seeds the empty cache folder first,
so the rebuilt host does not pay for autotune and JIT again. It is the plain deploy, limited
to HOST, with ``sglang_cache_seed`` set: nothing here differs from a first install.
"""

from __future__ import annotations

import sys

from sglang_deploy.shell import runner


def add_parser(sub) -> None:
    p = sub.add_parser("rebuild", help="bring a blank replacement host back to the deployed state")
    p.add_argument("inventory")
    p.add_argument("host")
    p.add_argument("--cache", help="cache archive from `sglang-deploy cache save` to seed it with")
    p.add_argument("--data", action="append", default=[], metavar="KEY=VALUE")


def run(args) -> int:
    data = list(args.data) + ([f"sglang_cache_seed={args.cache}"] if args.cache else [])
    result = runner.run_pyinfra(args.inventory, "deploy.py", limit=[args.host], data=data,
                                on_line=print)
    verdict = "rebuilt and verified" if result.ok else "rebuild FAILED (see above)"
    print(f"{args.host}: {verdict} in {result.seconds:.1f}s", file=sys.stderr)
    return result.rc
