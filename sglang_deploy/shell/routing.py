"""Which hosts of an inventory are routers and which are its workers (pyinfra inventory).

The group ``routers`` (``core.router.ROUTER_GROUP``) holds the hosts that run the router;
every other host serves. A serving host's data is read through ``core.router.routed_data``
when the inventory has a router, so its bind address and key follow from the inventory.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from sglang_deploy.core import data as datamod
from sglang_deploy.core import group
from sglang_deploy.core.router import ROUTER_GROUP, http_url, routed_data, worker_address


def is_router(host) -> bool:
    return ROUTER_GROUP in (host.groups or ())


def has_routers(inventory) -> bool:
    return bool(inventory.groups.get(ROUTER_GROUP))


def raw_data(host, inventory) -> dict:
    """HOST's merged data, with the worker defaults of a routed fleet applied and, for a node
    of a multi-node group (``sglang_group``), the group's flags (``--nnodes``,
    ``--node-rank``, ``--dist-init-addr``) and rank 0's address (``core.group``; a group that
    cannot work raises DataError here, before any connection)."""
    routed = has_routers(inventory) and not is_router(host)
    raw = routed_data(host.data.dict(), host.name, routed)
    g = host_group(host, inventory)
    if g is None:
        group.check_no_reserved(host.name, raw)
        return raw
    return {**raw, "sglang_flags": {**raw.get("sglang_flags", {}), **group.group_flags(g, host.name)},
            "sglang_dist_init_addr": g.addr}


def host_group(host, inventory) -> group.Group | None:
    """The multi-node group HOST is a node of (None: it serves alone, or routes)."""
    name = host.data.dict().get("sglang_group")
    if not name or is_router(host):
        return None
    routed = has_routers(inventory)
    members = [(h.name, routed_data(h.data.dict(), h.name, routed)) for h in inventory
               if not is_router(h) and h.data.dict().get("sglang_group") == name]
    return group.plan(members)[name]


def router_workers(fleet: Fleet) -> list[tuple[str, dict]]:
    """The hosts a router lists: every serving host but a group's nodes of rank >= 1 (only
    rank 0 of a group serves HTTP)."""
    return [(n, raw) for n, raw in fleet.workers
            if int((raw.get("sglang_flags") or {}).get("node-rank") or 0) == 0]


def groups(inventory) -> dict[str, group.Group]:
    """The multi-node groups of INVENTORY's serving hosts (``core.group.plan``)."""
    routed = has_routers(inventory)
    return group.plan([(h.name, routed_data(h.data.dict(), h.name, routed and not is_router(h)))
                       for h in inventory if not is_router(h)])


def worker_url(name: str, raw: dict) -> str:
    """The URL of serving host NAME (its data RAW), as the router reaches it."""
    port = raw.get("sglang_port", datamod.KEYS["sglang_port"].default)
    return http_url(worker_address(raw, name), port)


def settings(host, inventory) -> datamod.Settings:
    """HOST's data resolved now (``data.resolve``): the hooks' validation, the commands."""
    return resolve(raw_data(host, inventory))


def resolve(raw: dict) -> datamod.Settings:
    """RAW data resolved, its secrets read from this controller's environment."""
    return datamod.resolve(raw, os.environ)


#: the attribute of pyinfra's ``State`` (this project's own) holding this run's Settings
RESOLVED_ATTR = "sglang_deploy_settings"


def remember(state, resolved: dict[str, datamod.Settings]) -> None:
    """Keep RESOLVED (host name -> Settings, from the hooks' validation before any
    connection) on this pyinfra run's STATE, for the stages (``settings_of``)."""
    setattr(state, RESOLVED_ATTR, dict(resolved))


def settings_of(host, state) -> datamod.Settings:
    """HOST's Settings of this pyinfra run: resolved once, by the hooks' validation before any
    connection (``remember``); resolved here only where no validation ran (a deploy file
    outside config.py stops earlier, in ``hooks.require_checked``)."""
    resolved = getattr(state, RESOLVED_ATTR, None) or {}
    if host.name in resolved:
        return resolved[host.name]
    return settings(host, state.inventory)


@dataclass
class Fleet:
    """The controller's view of an inventory: (name, data) of workers and routers, in
    inventory order, data as the deploy uses it."""

    workers: list[tuple[str, dict]]
    routers: list[tuple[str, dict]]


def fleet(inventory: str, cwd: str | os.PathLike = ".", data: dict | None = None) -> Fleet:
    """Read INVENTORY the way pyinfra does (group data included), without connecting."""
    from sglang_deploy.shell.inventory import load

    return fleet_of(load(inventory, cwd, data))


def fleet_of(inv) -> Fleet:
    """The ``Fleet`` of an inventory already loaded (pyinfra ``Inventory``: INV)."""
    workers, routers = [], []
    for h in inv:
        (routers if is_router(h) else workers).append((h.name, raw_data(h, inv)))
    return Fleet(workers=workers, routers=routers)
