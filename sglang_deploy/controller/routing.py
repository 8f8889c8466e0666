"""Which hosts of an inventory are routers and which are its workers (pyinfra inventory).

The group ``routers`` (``core.router.ROUTER_GROUP``) holds the hosts that run the router;
every other host serves. A serving host's data is read through ``core.router.routed_data``
when the inventory has a router, so its bind address and key follow from the inventory.
"""

from __future__ import annotations

import os

from sglang_deploy.core import data as datamod
from sglang_deploy.core import group
from sglang_deploy.core.router import ROUTER_GROUP, http_url, routed_data, worker_address


def is_router(host) -> bool:
    return ROUTER_GROUP in (host.groups or ())


def has_routers(inventory) -> bool:
    return bool(inventory.groups.get(ROUTER_GROUP))


class Fleet:
    """The controller's view of an inventory, built once per pyinfra run by the data check
    (``hooks.check_run``: the run object's ``fleet``, ``integration.ThisRun``, released with
    it at the run's end) and read by the stages, the router's stage and ``routerctl``: each
    host's data as the deploy uses it (``raw``), its Settings (resolved at most once per
    host: ``settings``) and the multi-node groups (planned once each: ``group``,
    ``groups``). Commands outside pyinfra build the same from an inventory file
    (``fleet``) or one already loaded (``fleet_of``). Everything is read lazily, so that a
    bad host's data raises when that host is read (``hooks.validate_inventory`` names it)."""

    def __init__(self, inventory, resolved: dict[str, datamod.Settings] | None = None):
        self.inventory = inventory
        self._raw: dict[str, dict] = {}
        self._settings: dict[str, datamod.Settings] = dict(resolved or {})
        self._group: dict[str, group.Group] = {}
        self._groups: dict[str, group.Group] | None = None
        self._hosts: dict | None = None

    def host(self, name: str):
        if self._hosts is None:  # any iterable of hosts (pyinfra's Inventory is one)
            self._hosts = {h.name: h for h in self.inventory}
        return self._hosts[name]

    @property
    def routed(self) -> bool:
        return has_routers(self.inventory)

    def raw(self, name: str) -> dict:
        """Host NAME's merged data, with the worker defaults of a routed fleet applied and,
        for a node of a multi-node group (``sglang_group``), the group's flags
        (``--nnodes``, ``--node-rank``, ``--dist-init-addr``) and rank 0's address
        (``core.group``; a group that cannot work raises DataError here, before any
        connection)."""
        if name not in self._raw:
            h = self.host(name)
            raw = routed_data(h.data.dict(), name, self.routed and not is_router(h))
            g = self.group_of(name)
            if g is None:
                group.check_no_reserved(name, raw)
            else:
                raw = {**raw, "sglang_flags": {**raw.get("sglang_flags", {}),
                                               **group.group_flags(g, name)},
                       "sglang_dist_init_addr": g.addr}
            self._raw[name] = raw
        return self._raw[name]

    def settings(self, name: str) -> datamod.Settings:
        """Host NAME's Settings (``data.resolve``, its secrets from this controller's
        environment), resolved once."""
        if name not in self._settings:
            self._settings[name] = resolve(self.raw(name))
        return self._settings[name]

    def group(self, name: str) -> group.Group:
        """Multi-node group NAME, planned once (``core.group.plan`` of its nodes)."""
        if name not in self._group:
            members = [(h.name, routed_data(h.data.dict(), h.name, self.routed)) for h in
                       self.inventory if not is_router(h)
                       and h.data.dict().get("sglang_group") == name]
            self._group[name] = group.plan(members)[name]
        return self._group[name]

    def group_of(self, name: str) -> group.Group | None:
        """The multi-node group host NAME is a node of (None: it serves alone, or routes)."""
        h = self.host(name)
        gname = h.data.dict().get("sglang_group")
        return None if not gname or is_router(h) else self.group(gname)

    @property
    def groups(self) -> dict[str, group.Group]:
        """Every multi-node group of the serving hosts (``core.group.plan``), planned once."""
        if self._groups is None:
            self._groups = group.plan(
                [(h.name, routed_data(h.data.dict(), h.name, self.routed))
                 for h in self.inventory if not is_router(h)])
        return self._groups

    @property
    def workers(self) -> list[tuple[str, dict]]:
        """(name, data) of the serving hosts, inventory order."""
        return [(h.name, self.raw(h.name)) for h in self.inventory if not is_router(h)]

    @property
    def routers(self) -> list[tuple[str, dict]]:
        """(name, data) of the routers, inventory order."""
        return [(h.name, self.raw(h.name)) for h in self.inventory if is_router(h)]


def router_workers(fleet: Fleet) -> list[tuple[str, dict]]:
    """The hosts a router lists: every serving host but a group's nodes of rank >= 1 (only
    rank 0 of a group serves HTTP)."""
    return [(n, raw) for n, raw in fleet.workers
            if int((raw.get("sglang_flags") or {}).get("node-rank") or 0) == 0]


def not_worker_why(raw: dict) -> str:
    """Why a serving host (its data RAW) that ``router_workers`` leaves out is no worker."""
    rank = int((raw.get("sglang_flags") or {}).get("node-rank") or 0)
    return (f"node {rank} of group {raw.get('sglang_group')}, not a router worker (only rank 0 "
            "serves HTTP)")


def groups(inventory) -> dict[str, group.Group]:
    """The multi-node groups of INVENTORY's serving hosts (``Fleet.groups``)."""
    return Fleet(inventory).groups


def worker_url(name: str, raw: dict) -> str:
    """The URL of serving host NAME (its data RAW), as the router reaches it."""
    port = raw.get("sglang_port", datamod.KEYS["sglang_port"].default)
    return http_url(worker_address(raw, name), port)


def settings(host, inventory) -> datamod.Settings:
    """HOST's data resolved now (``data.resolve``), outside a run (in a run: its run
    object's ``fleet``)."""
    return Fleet(inventory).settings(host.name)


def resolve(raw: dict) -> datamod.Settings:
    """RAW data resolved, its secrets read from this controller's environment."""
    return datamod.resolve(raw, os.environ)


def fleet(inventory: str, cwd: str | os.PathLike = ".", data: dict | None = None) -> Fleet:
    """Read INVENTORY the way pyinfra does (group data included), without connecting."""
    from sglang_deploy.controller.inventory import load

    return fleet_of(load(inventory, cwd, data))


def fleet_of(inv, resolved: dict[str, datamod.Settings] | None = None) -> Fleet:
    """The ``Fleet`` of an inventory already loaded (pyinfra ``Inventory``: INV); RESOLVED:
    Settings already resolved (host name -> Settings)."""
    return Fleet(inv, resolved)
