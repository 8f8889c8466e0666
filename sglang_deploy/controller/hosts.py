"""The hosts a command acts on, read and checked before any connection.

``select`` loads INVENTORY with pyinfra's own inventory code (``pyinfra_cli``'s
``make_inventory``: group data, ``--data`` overrides, groups), applies ``--limit`` by
pyinfra's rules (a group name gives its hosts, anything else is a glob on host names:
``Inventory.get_group`` then ``fnmatch``, as ``pyinfra --limit`` does), and checks every
host's data as the deploy will (``hooks.validate_inventory``: keys, types, secrets, the lock,
the launch flags against the locked sglang). Anything wrong is a ``UsageError`` or
``DataError`` (exit status 2) that names what exists, before any host is contacted.

Reading the inventory (``load``, ``match``, ``parse_data``) lives in ``controller.inventory``,
below the data checks, so that the arrows go one way: ``hosts -> hooks -> ... -> inventory``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

# load, match, parse_data: the inventory's own module; kept here for the commands that select
from sglang_deploy.controller.inventory import (
    group_data_folders,
    load,
    match,
    no_group_data,
    no_host,
    parse_data,
)
from sglang_deploy.core.errors import DataError

__all__ = ["Selection", "load", "match", "parse_data", "select"]


@dataclass
class Selection:
    hosts: list[str]                      # the hosts acted on, in inventory order
    all_hosts: list[str]
    #: the inventory as loaded (pyinfra ``Inventory``, the --data overrides in), and each
    #: host's Settings as checked: what a command passes on instead of loading it again
    inventory: object = field(default=None, repr=False, compare=False)
    settings: dict = field(default_factory=dict, repr=False, compare=False)


def _warn(text: str) -> None:
    print(f"sglang-deploy: warning: {text}", file=sys.stderr, flush=True)


def select(inventory: str, limit: Sequence[str] | None = (), data: Sequence[str] | None = (),
           cwd: str | os.PathLike = ".", option: str = "--limit") -> Selection:
    """Load INVENTORY with the --data overrides, apply --limit, check every host's data."""
    from sglang_deploy.integration import hooks  # pyinfra's state callbacks: loaded when used

    inv = load(inventory, cwd, parse_data(list(data or ())))
    hosts = match(inv, list(limit), option) if limit else list(inv)
    if not hosts:
        raise no_host(inventory)
    try:
        resolved = hooks.validate_inventory(inv, str(Path(cwd).resolve()), _warn)
    except DataError as exc:
        if not any(f.is_dir() for f in group_data_folders(inventory, cwd)):
            raise no_group_data(inventory, cwd, exc) from exc
        raise
    return Selection(hosts=[h.name for h in hosts], all_hosts=[h.name for h in inv],
                     inventory=inv, settings=resolved)
