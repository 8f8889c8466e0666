"""`sglang-deploy rebuild INVENTORY HOST [--cache FILE]`: disaster recovery of one host.

A host that was lost and replaced by a blank container is brought back to the state the
deploy defines: the release from the committed lock (offline from `sglang_wheelhouse` when
the data names one), the same patch state, unit and flags, verified serving. With
``--cache`` the archive from ``sglang-deploy cache save`` seeds the empty cache folder first,
so the rebuilt host does not pay for autotune and JIT again. It is the plain deploy, limited
to HOST, with ``sglang_cache_seed`` set: nothing here differs from a first install. With a
``routers`` group, the host is put (back) into the router only once the deploy verified it,
and the router must then route a generation to it.

A node of a multi-node group is rebuilt with its group: the deploy runs on every node of the
group (the others converge: nothing to install), and the group pre-flight, restart and
verification run as one, since the rebuilt node cannot join a group that is already up.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from sglang_deploy.commands import common
from sglang_deploy.core.runspec import RunSpec


def add_parser(sub) -> None:
    p = common.add_command(sub, "rebuild",
                           help="bring a blank replacement host back to the deployed state",
                           failed="the deploy or its verification failed on the host")
    common.add_inventory(p)
    p.add_argument("host", metavar="HOST",
                   help="the host to rebuild (a host name, or a group / glob, as --limit)")
    p.add_argument("--cache", help="cache archive from `sglang-deploy cache save` to seed it with")
    common.add_data(p)
    common.add_json(p)


def with_groups(hosts: list[str], nodes: dict[str, list[str]]) -> list[str]:
    """HOSTS, each with every node of its multi-node group (NODES: host -> its group's nodes
    in rank order), in order, each once."""
    return list(dict.fromkeys(n for h in hosts for n in nodes.get(h, [h])))


def run(args) -> int:
    from sglang_deploy.controller import hosts, routing
    from sglang_deploy.core import group
    from sglang_deploy.core.errors import UsageError

    if args.cache and not Path(args.cache).is_file():
        raise UsageError(what="--cache FILE: an archive from `sglang-deploy cache save`",
                         found=f"no file {args.cache}", fix="pass the path of that archive")
    data = list(args.data) + ([f"sglang_cache_seed={args.cache}"] if args.cache else [])
    chosen = hosts.select(args.inventory, [args.host], data, option="HOST")
    # a group's node comes back with its whole group (its nodes start as one)
    limit = with_groups(chosen.hosts, group.units(routing.groups(chosen.inventory)))
    show = (lambda line: print(line, file=sys.stderr)) if args.json else print
    result, rows = deploy_verified(args.inventory, limit, data, on_line=show)
    if args.json:
        print(json.dumps({"ok": result.ok, "seconds": round(result.seconds, 2), "hosts": rows},
                         indent=2))
    for row in rows:
        verdict = "rebuilt and verified" if row["ok"] else "rebuild FAILED:\n" + row["error"]
        print(f"{row['host']}: {verdict} ({result.seconds:.1f}s)", file=sys.stderr)
    if not result.ok or not all(row["ok"] for row in rows):
        return common.EXIT_FAILED
    for name in limit:  # a group: its rank 0 (the router's worker; put_back skips the others)
        put_back(args.inventory, name, args.data)
    return common.EXIT_OK


def deploy_verified(inventory: str, limit: list[str], data: list[str], on_line=None,
                    cwd: str = ".") -> tuple:
    """The fleet's own deploy of LIMIT (``pyinfra -y INVENTORY deploy.py --limit HOST...``,
    which waits until each server serves): (the run, one row per host: ``host``, ``ok``,
    ``error``), each host's verdict from its own outcome record, never from the printed
    text. Also what ``lxc_host.py`` runs to verify a server after its container's restart."""
    from sglang_deploy.controller import runner
    from sglang_deploy.integration import journal

    with tempfile.TemporaryDirectory(prefix="rebuild-") as tmp:
        records = Path(tmp) / "journal.json"
        result = runner.run_pyinfra(inventory, "deploy.py", limit=limit, data=data,
                                    on_line=on_line, spec=RunSpec(journal=str(records)),
                                    cwd=cwd)
        got = journal.read(records).outcomes(limit)  # each host's own record, never the text
    # no record at all (pyinfra stopped before the host): pyinfra's own error, as printed
    rows = [{"host": name, "ok": got[name].passed,
             "error": None if got[name].passed else got[name].message
             or f"{got[name].kind}: {common.host_error(result.output)}"}
            for name in limit]
    return result, rows


def put_back(inventory: str, host: str, data: list[str]) -> None:
    """Only a verified host goes (back) into the router(s): add it and confirm the router
    routes a generation to it (a typed error otherwise)."""
    from sglang_deploy.controller import routerctl

    for r in routerctl.routers(inventory, data=data):
        if host in r.workers:
            r.put_back(host, say=lambda text: print(text, file=sys.stderr))
