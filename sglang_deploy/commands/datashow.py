"""`sglang-deploy data INVENTORY HOST [KEY]`: a host's resolved data, and for each value the
file (and line) that set it: Ansible's `ansible-inventory --host` plus "who set this".

Both inventory forms (a Python inventory, a YAML one through its loader), group_vars/ and
host_vars/, pyinfra's group_data/ and `--data` (shown as `--data`). A mapping such as
`sglang_flags` is shown entry by entry, each with its own line. Values of keys that name a
secret (`*password*`, `*passphrase*`, `*_token`, `*_secret`) are never shown: `*_env` keys
hold the NAME of a controller environment variable, shown as it is. Then the data check of
a deploy runs (keys, types, flags against the locked SGLang): exit status 2 when it fails,
the data still shown. No connection.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

from sglang_deploy.commands import common

#: data keys whose values are never printed (pyinfra's ssh_password, ssh_key_password...)
SECRET_KEY = re.compile(r"password|passphrase|_token$|_secret$", re.IGNORECASE)
HIDDEN = "(secret: not shown)"


def add_parser(sub) -> None:
    p = common.add_command(
        sub, "data", help="a host's resolved data and the file (and line) that set each value",
        description=__doc__.split("\n\n")[0],
        failed="an unexpected error (no host is contacted; 2: the data fails the data check, shown first)")
    common.add_inventory(p)
    p.add_argument("host", metavar="HOST", help="the host's inventory name")
    p.add_argument("key", metavar="KEY", nargs="?",
                   help="only this key (or one entry of a mapping: sglang_flags.tp-size)")
    common.add_data(p)
    common.add_json(p, "the data and where each value was set")


def shown(key: str, value):
    return HIDDEN if SECRET_KEY.search(key) and value not in (None, "") else value


def rows(data: dict, sources: dict, only: str | None = None) -> list[tuple[str, object, str]]:
    """(key, value, where) of every value of DATA, a mapping's entries as ``key.entry``;
    ONLY: that key (or entry)."""
    from sglang_deploy.core.ansibledata import where

    out = []
    for key in sorted(data):
        if key.startswith("_"):
            continue
        value = data[key]
        entries = value.items() if isinstance(value, dict) and value else None
        if only and only != key and not (entries and only.startswith(f"{key}.")):
            continue
        if entries is None:
            out.append((key, shown(key, value), where(sources, key) or "pyinfra"))
            continue
        for sub, item in entries:
            name = f"{key}.{sub}"
            if only and only not in (key, name):
                continue
            out.append((name, shown(str(sub), shown(key, item)),
                        where(sources, key, str(sub)) or "pyinfra"))
    return out


def run(args) -> int:
    from sglang_deploy.controller import yamldata
    from sglang_deploy.controller.inventory import load, parse_data
    from sglang_deploy.core.errors import DataError, UsageError
    from sglang_deploy.integration import hooks

    cwd = os.getcwd()
    inv = load(args.inventory, cwd, parse_data(args.data))
    host = next((h for h in inv if h.name == args.host), None)
    if host is None:
        raise UsageError(what=f"a host of {args.inventory}", found=f"no host {args.host!r}",
                         fix=f"use one of: {', '.join(h.name for h in inv) or '(none)'}")
    data = host.data.dict()
    sources = yamldata.sources(inv, host, Path(cwd, args.inventory), cwd)
    table = rows(data, sources, args.key)
    if args.key and not table:
        raise UsageError(what=f"a key of {args.host}'s data", found=f"no {args.key!r}",
                         fix="`sglang-deploy data INVENTORY HOST` lists them; a key not set "
                             "takes its default (docs/data-keys.md)")
    try:
        hooks.validate_inventory(inv, cwd, lambda text: None)
        problem = None
    except DataError as exc:
        problem = exc
    if args.json:
        print(json.dumps({"host": host.name, "groups": list(host.groups),
                          "data": {k: {"value": v, "from": w} for k, v, w in table},
                          "check": "ok" if problem is None else problem.to_dict()},
                         indent=2, default=str))
    else:
        width = max((len(k) + len(json.dumps(v, default=str)) for k, v, _ in table), default=0)
        print(f"{host.name}  (groups: {', '.join(host.groups)})")
        for key, value, where in table:
            text = f"{key}: {json.dumps(value, default=str)}"
            print(f"  {text.ljust(width + 2)}  {where}")
        # the check is the deploy's, of every host: say so when another host fails it
        other = problem is not None and not str(problem).startswith(f"[{host.name}]")
        print("data check: ok" if problem is None else
              "data check failed (on another host of the inventory):" if other else
              "data check failed:")
        if problem is not None:
            print(str(problem), file=sys.stderr)
    return 0 if problem is None else 2
