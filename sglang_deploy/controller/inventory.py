"""An inventory read the way pyinfra reads it, before any connection: ``load`` (pyinfra's own
``make_inventory``: group data, ``--data`` overrides, groups; then the YAML data beside it,
``yamldata.apply``, as the hooks do in a pyinfra run), ``match`` (``--limit`` by pyinfra's
rules) and ``parse_data`` (``--data K=V`` as pyinfra's CLI parses it).

The bottom of the shell's inventory code: it imports nothing of the shell but ``yamldata``
(which imports only core) and ``inputerror``, so that the data checks (``hooks``,
``routing``), ``runner`` and ``hosts.select`` can all build on it.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Sequence
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

from sglang_deploy.core.errors import DataError, UsageError


def parse_data(items: Sequence[str]) -> dict[str, Any]:
    """``--data K=V`` items -> {K: value}, values parsed as pyinfra's CLI parses them
    (true/false, integers, JSON, else the string)."""
    from pyinfra_cli.util import parse_cli_arg

    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(what="--data KEY=VALUE", found=f"--data {item!r}",
                             fix=_data_fix(item))
        out[key.strip()] = parse_cli_arg(value)
    return out


def _data_fix(item: str) -> str:
    """The fix for a ``--data``/``-e`` ITEM that is not KEY=VALUE, Ansible's other forms named."""
    if item.startswith("@"):
        return ("Ansible's `-e @FILE` is not read (pyinfra's --data takes KEY=VALUE): put those "
                "values in host_vars/HOST.yml or group_vars/GROUP.yml beside the inventory "
                "(docs/data-keys.md, \"YAML data\"), or pass each as -e KEY=VALUE")
    if item.lstrip().startswith("{"):
        return ("pass each key on its own, its value may be JSON: -e 'sglang_flags={\"tp-size\": "
                "4}' -e sglang_port=30001 (a JSON object of several keys is not read)")
    return ("write it as KEY=VALUE, e.g. --data verify_timeout_s=1800 (keys: the data table in "
            "docs/data-keys.md)")


#: the first line of an Ansible INI inventory: a section header such as ``[gpu_servers]``
_INI_SECTION = re.compile(r"^\s*\[[^\]\s]+\]\s*(?:[#;].*)?$")


def ansible_ini(path: Path) -> bool:
    """PATH looks like an Ansible INI inventory: not Python, its first line that is not blank
    nor a comment a ``[group]`` section header."""
    if path.suffix == ".py":
        return False
    try:
        with path.open(encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.strip() and not line.lstrip().startswith(("#", ";")):
                    return bool(_INI_SECTION.match(line))
    except OSError:
        return False
    return False


def no_inventory_file(inventory: str, path: Path) -> UsageError:
    """INVENTORY (resolved: PATH) is not a file."""
    return UsageError(what="an inventory file (a pyinfra inventory such as inventory/prod.py)",
                      found=f"no file {inventory}" + (" (a folder)" if path.is_dir() else ""),
                      fix="pass the path of an existing inventory file")


def group_data_folders(inventory: str, cwd: str | os.PathLike = ".") -> list[Path]:
    """The group_data/ folders pyinfra's CLI reads for INVENTORY: the current folder's and the
    inventory file's folder's (``make_inventory_from_files``)."""
    here = Path(cwd).resolve()
    beside = Path(here, inventory).resolve().parent
    return [here / "group_data"] + ([beside / "group_data"] if beside != here else [])


def project_of(inventory: str, cwd: str | os.PathLike = ".") -> Path | None:
    """The nearest folder above INVENTORY that holds deploy.py and group_data/ (a project)."""
    for folder in Path(cwd, inventory).resolve().parents:
        if (folder / "deploy.py").is_file() and (folder / "group_data").is_dir():
            return folder
    return None


def no_group_data(inventory: str, cwd: str | os.PathLike, cause: DataError) -> UsageError:
    """CAUSE (a host's data) comes from running in a folder with no group_data/."""
    where = " nor ".join(str(f.parent) for f in group_data_folders(inventory, cwd))
    project = project_of(inventory, cwd)
    return UsageError(
        what="a group_data/ folder (the deploy profile, group_data/all.py) in the current "
             "folder or beside the inventory, where pyinfra reads it",
        found=f"no group_data/ in {where}, so the hosts' data is incomplete: {cause.what}",
        fix="run sglang-deploy from the project folder (the one with deploy.py and "
            "group_data/)" + (f": cd {project}" if project else ""))


def no_host(inventory: str) -> UsageError:
    return UsageError(what=f"hosts in {inventory}", found="the inventory has no host",
                      fix="add hosts to the inventory")


def load(inventory: str, cwd: str | os.PathLike = ".", data: dict | None = None):
    """pyinfra's Inventory of the file INVENTORY (relative to CWD), no connection."""
    from pyinfra.api import State
    from pyinfra.context import ctx_state
    from pyinfra_cli.inventory import make_inventory

    cwd = str(Path(cwd).resolve())
    path = Path(inventory) if os.path.isabs(inventory) else Path(cwd, inventory)
    if not path.is_file():
        raise no_inventory_file(inventory, path)
    if path.suffix in (".yml", ".yaml"):
        loader = path.with_suffix(".py")
        raise UsageError(
            what="a pyinfra inventory file: a YAML inventory is read through its Python loader "
                 "beside it (pyinfra loads only Python inventories)",
            found=f"the YAML file {inventory}" + (f" (its loader {loader.name} exists)"
                                                  if loader.is_file() else ""),
            fix=f"pass {loader.name} beside it" + ("" if loader.is_file() else
                f", made by copying inventory/yaml/prod.py to {loader}")
            + " (docs/data-keys.md, \"YAML data\")")
    if ansible_ini(path):
        yml = path.with_suffix(".yml")
        raise UsageError(
            what="a pyinfra inventory file, or a YAML inventory through its loader",
            found=f"an Ansible INI inventory ({inventory}), which is not read",
            fix=f"convert it once with ansible-core: `ansible-inventory -i {inventory} --list "
                f"--yaml --export > {yml}`, copy inventory/yaml/prod.py to "
                f"{yml.with_suffix('.py')} and pass that (docs/data-keys.md, \"YAML data\")")
    if cwd not in sys.path:
        sys.path.append(cwd)
    ctx_state.set(State())
    try:
        inv = make_inventory(str(path), cwd=cwd, override_data=data or {})
    except DataError:
        raise
    except Exception as exc:
        from sglang_deploy.integration.inputerror import InputError

        if isinstance(exc, InputError):  # a YAML inventory's loader (``yamldata.groups``)
            raise exc.error from None
        text = " ".join(str(exc).split()) or type(exc).__name__
        raise UsageError(what=f"an inventory that pyinfra can load ({inventory})",
                         found=f"{type(exc).__name__}: {text}",
                         fix="fix the inventory file (try `pyinfra INVENTORY debug-inventory`)"
                         ) from exc
    from sglang_deploy.controller import yamldata

    yamldata.apply(inv, path, cwd)
    return inv


def group_members(inv, name: str) -> list:
    """The nodes of the multi-node group NAME (their ``sglang_group``), inventory order."""
    return [h for h in inv if str(h.data.get("sglang_group") or "") == name]


def _pattern_hosts(inv, pattern: str) -> list:
    """pyinfra's --limit rule for one pattern (an inventory group, else a glob on host
    names), and a multi-node group's name (``sglang_group``) as its nodes."""
    from pyinfra.api.exceptions import NoGroupError

    try:
        found = list(inv.get_group(pattern))
    except NoGroupError:
        found = [h for h in inv if fnmatch(h.name, pattern)]
    return found or group_members(inv, pattern)


def match(inv, patterns: Sequence[str], option: str = "--limit") -> list:
    """The hosts of INV that PATTERNS select (pyinfra's ``--limit``, and a multi-node
    group's ``sglang_group`` name), in inventory order; a pattern that matches nothing is a
    UsageError naming the hosts and groups there are."""
    chosen: set = set()
    unmatched = []
    for pattern in patterns:
        found = _pattern_hosts(inv, pattern)
        if not found:
            unmatched.append(pattern)
        chosen.update(found)
    if unmatched:
        groups = sorted(g for g in inv.groups if g != "all")
        multi = sorted({str(h.data.get("sglang_group")) for h in inv
                        if h.data.get("sglang_group")})
        raise UsageError(
            what=f"{option} patterns that match hosts of the inventory (host names, group "
                 "names or globs such as 'gpu-*')",
            found=f"nothing matches {', '.join(repr(p) for p in unmatched)}",
            fix=f"use one of the hosts: {', '.join(h.name for h in inv) or '(none)'}"
                + (f"; or groups: {', '.join(groups)}" if groups else "")
                + (f"; or multi-node groups (sglang_group): {', '.join(multi)}" if multi else "")
                + ("; for every host (Ansible's `all`), leave out --limit"
                   if "all" in unmatched and option == "--limit" else ""))
    return [h for h in inv if h in chosen]


def with_group_limits(inv, initial_limit, limit: Sequence[str], exclude: Sequence[str]):
    """pyinfra's own ``--limit`` / ``--exclude`` selection INITIAL_LIMIT, with the nodes of
    each multi-node group that a LIMIT pattern names by its ``sglang_group`` (pyinfra knows
    only inventory groups: it matched none for it); EXCLUDE still applies."""
    extra = [h for p in limit for h in group_members(inv, p)]
    if not extra:
        return initial_limit
    excluded = {h for p in exclude for h in _pattern_hosts(inv, p)}
    chosen = set(initial_limit or ()) | set(extra)
    return [h for h in inv if h in chosen and h not in excluded]
