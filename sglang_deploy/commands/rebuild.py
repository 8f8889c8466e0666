"""`sglang-deploy rebuild INVENTORY HOST [--cache FILE]`: disaster recovery of one host.

A host that was lost and replaced by a blank container is brought back to the state the
deploy defines: the release from the committed lock (offline from `sglang_wheelhouse` when
the data names one), the same patch state, unit and flags, verified serving. With
``--cache`` the archive from ``sglang-deploy cache save`` seeds the empty cache folder first,
so the rebuilt host does not pay for autotune and JIT again. It is the plain deploy, limited
to HOST, with ``sglang_cache_seed`` set: nothing here differs from a first install. With a
``routers`` group, the host is put (back) into the router only once the deploy verified it,
and the router must then route a generation to it.
"""

from __future__ import annotations

import sys

from sglang_deploy.core.errors import SglangDeployError
from sglang_deploy.shell import routerctl, runner


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
    if result.ok:
        return put_back(args.inventory, args.host, args.data)
    return result.rc


def put_back(inventory: str, host: str, data: list[str]) -> int:
    """Only a verified host goes (back) into the router(s): add it and confirm the router
    routes a generation to it."""
    try:
        for r in routerctl.routers(inventory, data=data):
            if host in r.workers:
                r.put_back(host, say=lambda text: print(text, file=sys.stderr))
    except SglangDeployError as exc:
        print(exc.message, file=sys.stderr)
        return 1
    return 0
