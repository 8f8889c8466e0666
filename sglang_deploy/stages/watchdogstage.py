"""The watchdog installed by the deploy's last stage (``stages.verify_stage``), after the
server is verified: its two tools, its configuration, the router key when it acts through a
router, and its hardened unit (``core.watchdogunit``), enabled and started; restarted when
one of them changes; everything removed with ``watchdog: off``. Compared with the run's
host-state read: a converged host gets no change and no round trip."""

from __future__ import annotations

import shlex
from io import StringIO
from pathlib import Path

from pyinfra import host, state
from pyinfra.api import operation

from sglang_deploy.core import router as routermod
from sglang_deploy.core import watchdogunit as wu
from sglang_deploy.hostops import operations as ops
from sglang_deploy.integration.integration import run_of

PACKAGE = Path(__file__).resolve().parent.parent


def router_for(name: str, s) -> wu.Router | None:
    """The router in front of host NAME, as the watchdog on NAME reaches it (None: no router,
    or only one bound to loopback on another host)."""
    if s.watchdog != "restart":
        return None
    from sglang_deploy.controller import routerctl

    for r in routerctl.routers_of(run_of(state).fleet):
        address = r.url.split("//", 1)[1].rsplit(":", 1)[0].strip("[]")
        if name in r.workers and (not routermod.is_loopback(address) or r.host == name):
            return wu.Router(url=r.url, worker_url=r.workers[name], key=r.key)
    return None


def install(hp) -> None:
    """The watchdog of this host (HP: its ``hostplan.HostPlan``) as its data says
    (``watchdog``): on a single host, and on a multi-node group's rank 0, where it judges the
    group's server and only reports (a group restarts as one); none on a group's node of
    rank >= 1 (``core.watchdogunit.placement``)."""
    s, g = hp.settings, hp.group
    where = wu.placement(s.watchdog, g.name if g else None, g.nnodes if g else 1,
                         g.rank_of(host.name) if g else None)
    if not where.install:
        removed(name=f"Watchdog removed ({where.why})", root=s.sglang_root)
        return
    router = router_for(host.name, s) if where.group_nodes <= 1 else None
    key = wu.router_key(s, router)
    tools = ops.files_content(
        name=f"Watchdog tools ({', '.join(n for n, _ in wu.TOOLS)})", mode="755",
        sources=[(str(PACKAGE / src), dest) for (_, src), dest in
                 zip(wu.TOOLS, wu.tool_paths(s.sglang_root), strict=True)])
    conf = ops.file_content(name=f"Watchdog config {wu.CONFIG_FILE}", mode="644",
                            src=StringIO(wu.config_text(wu.config(
                                s, host.name, where.group_nodes, router, where.group))),
                            dest=wu.CONFIG_FILE)
    changing = [tools, conf]
    # read at each scrape and tick, not at start: a change needs no restart
    ops.file_content(name=f"GPU health as judged {wu.GPU_HEALTH_FILE}", mode="644",
                     src=StringIO(wu.gpu_health_text(hp.gpu_report)), dest=wu.GPU_HEALTH_FILE)
    if key:
        changing.append(ops.secret_file(name=f"Router key {wu.ROUTER_KEY_FILE} (0600, root)",
                                        path=wu.ROUTER_KEY_FILE, content=key + "\n"))
    elif ops.path_state(wu.ROUTER_KEY_FILE) is not None:
        changing.append(removed_files(name=f"No router key {wu.ROUTER_KEY_FILE}",
                                      paths=[wu.ROUTER_KEY_FILE]))
    unit = ops.file_content(name=f"Unit {wu.UNIT_FILE}", mode="644", dest=wu.UNIT_FILE,
                            src=StringIO(wu.render_unit(s, with_router_key=bool(key))))
    changing.append(unit)
    started = ops.enabled_and_started(wu.SERVICE, unit)
    if not started.will_change and any(op.will_change for op in changing):
        ops.service_restarted(name=f"Restart {wu.SERVICE} (its files changed)", service=wu.SERVICE,
                              _if=lambda: any(op.did_change() for op in changing))


@operation()
def removed_files(paths: list):
    """
    Files removed (the caller found them present).

    + paths: the files
    """
    yield "rm -f " + " ".join(shlex.quote(p) for p in paths)


@operation()
def removed(root: str):
    """
    The watchdog gone: its unit stopped and disabled, its unit file, configuration, router
    key and tools removed (its events and state are kept in ``/var/lib/sglang-watchdog``).

    + root: ``sglang_root`` (its tools)
    """
    present = [p for p in wu.managed_paths(root) if ops.path_state(p) is not None]
    if not present:
        host.noop("no watchdog installed")
        return
    yield f"systemctl disable --now {wu.SERVICE}.service || true"
    yield "rm -f " + " ".join(shlex.quote(p) for p in present)
    yield "systemctl daemon-reload"
