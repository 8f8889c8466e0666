"""`sglang-deploy metrics-targets INVENTORY [--out FILE]`: what Prometheus scrapes.

Writes Prometheus file_sd JSON (``core.metricstargets``) for the servers, the router and the
watchdog of INVENTORY, each target labelled component, host, group, release and model (a
server the router lists also with worker, its URL there). Point a scrape job's
``file_sd_configs`` at FILE (sglang_deploy/monitoring/prometheus.example.yml); Prometheus
reads it again whenever it changes, so rerun this after a deploy or rollout (a new release).
http_sd serves the very same document: any static web server in front of FILE is an http_sd
endpoint; this command writes a file so that the controller needs no service of its own.

The release label is read on the hosts: one SSH command per host (``readlink`` of the
``current`` link), all hosts in parallel, nothing changed. A host that cannot be read keeps
its targets with ``release="unknown"`` and the exit status is 1. Targets bound to loopback
(the default: the API's own bind, and the router's metrics) cannot be scraped from another
machine and are left out, each named with its fix on stderr (``--include-loopback``: for a
Prometheus on that host).
"""

from __future__ import annotations

import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from sglang_deploy.commands import common

#: SSH reads at once (each is one short command)
PARALLEL = 16
#: deadline of one host's read, seconds (the connection's own timeout comes first)
READ_TIMEOUT_S = 30


def add_parser(sub) -> None:
    p = common.add_command(
        sub, "metrics-targets",
        help="write Prometheus file_sd JSON for the servers, the router and the watchdog",
        description=__doc__.split("\n\n", 1)[1],
        failed="a host's release could not be read (its targets say release=\"unknown\"; "
               "the file is written)")
    common.add_inventory(p)
    common.add_limit(p)
    common.add_data(p)
    p.add_argument("--out", metavar="FILE", default=None,
                   help="write the JSON to FILE, whole or not at all (default: stdout)")
    p.add_argument("--include-loopback", action="store_true",
                   help="list loopback-bound targets as 127.0.0.1:PORT, for a Prometheus "
                        "running on that host (default: leave them out)")


def _read_release(name: str, data: dict, root: str, cwd: str) -> tuple[str | None, str | None]:
    """(release id or None, error text or None) of one host: one SSH command."""
    from sglang_deploy.controller import hostshell
    from sglang_deploy.core import metricstargets as mt
    from sglang_deploy.core.errors import SglangDeployError
    from sglang_deploy.core.sshtarget import target_from_data

    try:
        with hostshell.connect(target_from_data(name, data, cwd)) as cxn:
            status, out, err = hostshell.run(cxn, mt.release_command(root),
                                             timeout=READ_TIMEOUT_S)
    except (SglangDeployError, OSError, EOFError) as exc:
        return None, str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if status != 0:
        return None, f"`readlink` exit status {status}: {err.strip()[-200:]}"
    return mt.release_of(out) or "none", None


def hosts_of(sel, cwd: str = ".", read=_read_release) -> tuple[list, dict[str, str]]:
    """The ``core.metricstargets.Host`` of every selected host, their releases read in
    parallel by READ (name, data, root, cwd); and the read errors by host."""
    from sglang_deploy.controller import routing
    from sglang_deploy.core import metricstargets as mt
    from sglang_deploy.core import service
    from sglang_deploy.core import watchdogunit as wu

    fleet = routing.fleet_of(sel.inventory, sel.settings)
    listed = {n for n, _ in routing.router_workers(fleet)} if fleet.routed else set()
    names = list(sel.hosts)
    raws = {n: fleet.raw(n) for n in names}
    roots = {n: fleet.settings(n).router_root if routing.is_router(fleet.host(n))
             else fleet.settings(n).sglang_root for n in names}
    with ThreadPoolExecutor(max_workers=max(1, min(PARALLEL, len(names)))) as pool:
        reads = dict(zip(names, pool.map(lambda n: read(n, raws[n], roots[n], cwd), names)))
    out = []
    for n in names:
        s, raw = fleet.settings(n), raws[n]
        ssh_address = str(raw.get("ssh_hostname") or n)
        if routing.is_router(fleet.host(n)):
            out.append(mt.Host(name=n, router=True, bind=s.router_prometheus_host,
                               port=s.router_prometheus_port, ssh_address=ssh_address,
                               release=reads[n][0]))
            continue
        g = fleet.group_of(n)
        out.append(mt.Host(
            name=n, router=False, bind=s.sglang_host, port=s.sglang_port,
            ssh_address=ssh_address, release=reads[n][0], model=s.served_model_name,
            group=s.sglang_group, node_rank=g.rank_of(n) if g else None,
            worker_url=routing.worker_url(n, raw) if n in listed else None,
            metrics_on=service.metrics_on(s),
            # where the deploy installs a watchdog (core.watchdogunit.placement): not with
            # `watchdog: off`, on a group's rank 0 only
            watchdog_port=s.watchdog_metrics_port if wu.placement(
                s.watchdog, g.name if g else None, g.nnodes if g else 1,
                g.rank_of(n) if g else None).install else None))
    return out, {n: err for n, (_, err) in reads.items() if err}


def run(args) -> int:
    from sglang_deploy.controller import atomicfile
    from sglang_deploy.controller import hosts as hostsmod
    from sglang_deploy.core import metricstargets as mt

    sel = hostsmod.select(args.inventory, args.limit, args.data)
    hosts, errors = hosts_of(sel)
    groups, left = mt.target_groups(hosts, include_loopback=args.include_loopback)
    text = json.dumps(groups, indent=2, sort_keys=True) + "\n"
    if args.out:
        atomicfile.write(Path(args.out), text)
    else:
        sys.stdout.write(text)
    for lo in left:
        print(f"metrics-targets: {lo.host} ({lo.component}) left out: {lo.why}; {lo.fix}",
              file=sys.stderr)
    for name, err in errors.items():
        print(f"metrics-targets: {name}: release not read ({err}); its targets say "
              f"release=\"unknown\"", file=sys.stderr)
    where = f" to {args.out}" if args.out else ""
    print(f"metrics-targets: {len(groups)} targets of {len(hosts)} hosts written{where}"
          + (f", {len(left)} left out" if left else ""), file=sys.stderr)
    return common.EXIT_FAILED if errors else common.EXIT_OK
