"""Ansible-style data (pure): a YAML inventory in Ansible's format, ``group_vars/`` and
``host_vars/``, merged in Ansible's order of precedence, each value with the file and line
that set it.

``parse_inventory`` reads the YAML inventory's structure (``all: children: ... hosts: ...
vars: ...``); ``merge`` layers a host's data, lowest first, the way Ansible does (its
"variable precedence" list, the inventory's part of it)::

    1. group vars of the inventory file (or pyinfra's group data): all, then each group by
       depth (a parent before its children), ansible_group_priority, name
    2. group_vars/all, then group_vars/<group> in the same order
    3. host vars of the inventory file (or of a pyinfra inventory's host tuple)
    4. host_vars/<host>
    5. --data (pyinfra's override data; Ansible's -e), which stays pyinfra's top layer

A mapping set at a higher layer replaces a lower one whole (Ansible's default
``hash_behaviour = replace``; pyinfra does the same). ``ansible_*`` connection keys are
mapped to pyinfra's (``ANSIBLE_MAPPED``), a few are ignored (``ANSIBLE_IGNORED``), the ones
this tool cannot honour are refused (``ANSIBLE_REFUSED``); any other ``ansible_*`` key is an
unknown data key for the data check.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from sglang_deploy.core.errors import DataError

#: Ansible connection variables -> pyinfra's ssh connector data
ANSIBLE_MAPPED = {
    "ansible_host": "ssh_hostname", "ansible_ssh_host": "ssh_hostname",
    "ansible_user": "ssh_user", "ansible_ssh_user": "ssh_user",
    "ansible_port": "ssh_port", "ansible_ssh_port": "ssh_port",
    "ansible_ssh_private_key_file": "ssh_key", "ansible_private_key_file": "ssh_key",
}
#: read and dropped: what they tell Ansible has no meaning for this tool
ANSIBLE_IGNORED = {
    "ansible_python_interpreter": "the hosts' Python is `sglang_system_python`",
    "ansible_group_priority": "used only to order groups of the same depth, as Ansible does",
    "ansible_connection": "only `ssh` (or `smart`) is accepted: the tool connects over SSH",
}
#: refused, with the reason
ANSIBLE_REFUSED = {
    "ansible_password": "a secret in a data file: use an SSH key (`ansible_ssh_private_key_file`)",
    "ansible_ssh_pass": "a secret in a data file: use an SSH key (`ansible_ssh_private_key_file`)",
    "ansible_become_password": "a secret in a data file; the deploy connects as root",
    "ansible_become_pass": "a secret in a data file; the deploy connects as root",
    "ansible_become": "the deploy connects as root (`ansible_user: root`), no privilege escalation",
    "ansible_become_user": "the deploy connects as root (`ansible_user: root`)",
    "ansible_become_method": "the deploy connects as root (`ansible_user: root`)",
    "ansible_ssh_common_args": "SSH options are pyinfra's `ssh_*` data keys",
    "ansible_ssh_extra_args": "SSH options are pyinfra's `ssh_*` data keys",
}

GROUP_KEYS = ("hosts", "vars", "children")
#: a key path in a YAML file (``("vars", "sglang_flags", "tp-size")``) and the line of each
KeyPath = tuple[Any, ...]
Lines = dict[KeyPath, int]
#: the source of each merged value: ``key`` or ``key.sub`` -> (label, line)
Sources = dict[str, tuple[str, int | None]]
_NAME = re.compile(r"[A-Za-z0-9_.\-]+")


@dataclass
class Layer:
    """Values set by one file (or pyinfra layer), LABEL naming it (``inventory/group_vars/
    gpu.yml``) and LINES the line of each key path in it (empty: no lines known)."""

    label: str
    values: dict[str, Any]
    lines: Lines = field(default_factory=dict)


@dataclass
class Group:
    name: str
    vars: Layer | None = None
    children: list[str] = field(default_factory=list)
    hosts: list[str] = field(default_factory=list)
    parents: list[str] = field(default_factory=list)


@dataclass
class Inventory:
    """An Ansible YAML inventory: GROUPS by name (``all`` included), each host's own vars
    (HOST_VARS, one layer per place it is listed with vars), hosts in first-listed order."""

    file: str
    groups: dict[str, Group]
    hosts: list[str]
    host_vars: dict[str, list[Layer]]

    def groups_of(self, host: str) -> list[str]:
        """Every group HOST belongs to (directly or through a child group), ``all`` included,
        in Ansible's order: depth, ``ansible_group_priority``, name."""
        found = {"all"}
        todo = [g.name for g in self.groups.values() if host in g.hosts]
        while todo:
            name = todo.pop()
            if name not in found:
                found.add(name)
                todo.extend(self.groups[name].parents)
        return sorted(found, key=lambda n: (self.depth(n), self.priority(n), n))

    def depth(self, name: str, seen: tuple[str, ...] = ()) -> int:
        parents = [p for p in self.groups[name].parents if p not in seen]
        return 0 if not parents else 1 + max(self.depth(p, seen + (name,)) for p in parents)

    def priority(self, name: str) -> int:
        layer = self.groups[name].vars
        value = layer.values.get("ansible_group_priority", 1) if layer else 1
        return value if isinstance(value, int) else 1

    def members(self, name: str) -> list[str]:
        """Hosts of group NAME and of its child groups, in inventory order."""
        names, todo, seen = set(), [name], set()
        while todo:
            g = todo.pop()
            if g in seen:
                continue
            seen.add(g)
            names.update(self.groups[g].hosts)
            todo.extend(self.groups[g].children)
        return [h for h in self.hosts if h in names]


def _err(file: str, lines: Lines, path: KeyPath, what: str, found: str, fix: str) -> DataError:
    err = DataError(what=what, found=found, fix=fix)
    line = lines.get(path)
    err.where = f"{file}:{line}" if line else file
    return err


def _sub_lines(lines: Lines, prefix: KeyPath) -> Lines:
    n = len(prefix)
    return {p[n:]: v for p, v in lines.items() if p[:n] == prefix and len(p) > n}


def parse_inventory(doc: Any, lines: Lines, file: str) -> Inventory:
    """An Ansible YAML inventory (DOC, as ``yamlfile.parse`` gave it, from FILE)."""
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise _err(file, lines, (), "an Ansible YAML inventory: a mapping of groups "
                   "(`all: {children: ..., hosts: ..., vars: ...}`)",
                   f"a {type(doc).__name__}", "start the file with `all:`")
    inv = Inventory(file, {"all": Group("all")}, [], {})
    for name, body in doc.items():
        _group(inv, lines, name, body, (name,), None if name == "all" else "all")
    for name, g in inv.groups.items():
        if name != "all" and not g.parents:
            g.parents.append("all")
    _no_cycle(inv, file, lines)
    ungrouped = [h for h in inv.hosts
                 if not any(h in g.hosts for n, g in inv.groups.items() if n != "all")]
    if ungrouped:
        inv.groups["ungrouped"] = Group("ungrouped", hosts=ungrouped, parents=["all"])
    return inv


def _group(inv: Inventory, lines: Lines, name: Any, body: Any, path: KeyPath,
           parent: str | None) -> None:
    """Group NAME of INV (its BODY at PATH), a child of PARENT: its vars, hosts, children."""
    file = inv.file
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise _err(file, lines, path, "a group name of letters, digits, `_`, `-`, `.`",
                   repr(name), "rename the group")
    g = inv.groups.setdefault(name, Group(name))
    if parent and parent not in g.parents and name != "all":
        g.parents.append(parent)
        if name not in inv.groups[parent].children:
            inv.groups[parent].children.append(name)
    if body is None:
        return
    if not isinstance(body, dict):
        raise _err(file, lines, path, f"group `{name}`: a mapping of {', '.join(GROUP_KEYS)}",
                   f"a {type(body).__name__}", "write `hosts:`, `vars:` or `children:` under it")
    for key in body:
        if key not in GROUP_KEYS:
            raise _err(file, lines, path + (key,),
                       f"group `{name}`: only {', '.join(GROUP_KEYS)}", f"`{key}`",
                       f"move `{key}` under `vars:` (a variable) or `children:` (a group)")
    vars_ = body.get("vars")
    if vars_ is not None:
        if not isinstance(vars_, dict):
            raise _err(file, lines, path + ("vars",), f"group `{name}`: vars as a mapping",
                       f"a {type(vars_).__name__}", "write `key: value` lines under `vars:`")
        if g.vars is not None:  # the same group's vars in two places: the later ones win
            g.vars.values.update(vars_)
            g.vars.lines.update(_sub_lines(lines, path + ("vars",)))
        else:
            g.vars = Layer(file, dict(vars_), _sub_lines(lines, path + ("vars",)))
    _hosts(inv, g, lines, body.get("hosts") or {}, path + ("hosts",))
    children = body.get("children") or {}
    if not isinstance(children, dict):
        raise _err(file, lines, path + ("children",), f"group `{name}`: children as a "
                   "mapping of groups", f"a {type(children).__name__}",
                   "write each child group as `name:` under `children:`")
    for child, cbody in children.items():
        if child == "all":
            raise _err(file, lines, path + ("children", child), "`all` only at the top",
                       "`all` as a child group", "rename the child group")
        _group(inv, lines, child, cbody, path + ("children", child), name)


def _hosts(inv: Inventory, g: Group, lines: Lines, hosts: Any, path: KeyPath) -> None:
    """The ``hosts:`` of group G (at PATH): each host in G, its vars a layer of its own."""
    file = inv.file
    if not isinstance(hosts, dict):
        raise _err(file, lines, path, f"group `{g.name}`: hosts as a mapping "
                   "(`name:` or `name: {vars}`)", f"a {type(hosts).__name__}",
                   "write each host as `name:` on its own line under `hosts:`")
    for host, hvars in hosts.items():
        hpath = path + (host,)
        if not isinstance(host, str) or not re.fullmatch(r"[A-Za-z0-9_.\-:]+", host):
            raise _err(file, lines, hpath, "a host name (Ansible's ranges such as "
                       "`node[01:08]` are not read)", repr(host), "list each host by its name")
        if hvars is not None and not isinstance(hvars, dict):
            raise _err(file, lines, hpath, f"host `{host}`: vars as a mapping",
                       f"a {type(hvars).__name__}", "write `key: value` lines under it")
        if host not in inv.hosts:
            inv.hosts.append(host)
        if host not in g.hosts:
            g.hosts.append(host)
        if hvars:
            inv.host_vars.setdefault(host, []).append(
                Layer(file, dict(hvars), _sub_lines(lines, hpath)))


def _no_cycle(inv: Inventory, file: str, lines: Lines) -> None:
    def visit(name: str, stack: tuple[str, ...]) -> None:
        if name in stack:
            raise _err(file, lines, (), "groups that do not contain themselves",
                       f"a loop of child groups: {' -> '.join(stack + (name,))}",
                       "remove one `children:` entry of the loop")
        for child in inv.groups[name].children:
            visit(child, stack + (name,))

    visit("all", ())


def translate(layer: Layer) -> Layer:
    """LAYER's values with ``ansible_*`` connection keys mapped to pyinfra's (their lines
    kept), the ignored ones dropped; a refused one (or a mapped key set twice, as
    ``ansible_host`` and ``ssh_hostname``) is a ``DataError`` at its line."""
    values: dict[str, Any] = {}
    lines = {p: v for p, v in layer.lines.items() if p[0] not in ANSIBLE_MAPPED}
    for key, value in layer.values.items():
        if key in ANSIBLE_REFUSED:
            raise _err(layer.label, layer.lines, (key,), "no `" + key + "`",
                       f"`{key}`: {ANSIBLE_REFUSED[key]}", f"remove `{key}`")
        if key == "ansible_connection" and value not in ("ssh", "smart"):
            raise _err(layer.label, layer.lines, (key,), "`ansible_connection: ssh`",
                       f"`ansible_connection: {value}`",
                       "remove it: the deploy connects to every host over SSH")
        if key in ANSIBLE_IGNORED:
            continue
        name = ANSIBLE_MAPPED.get(key, key)
        if name in values:
            raise _err(layer.label, layer.lines, (key,), f"`{name}` set once in one place",
                       f"`{key}` and another key that sets `{name}`", "keep one of them")
        values[name] = value
        if name != key:
            lines.update({(name,) + p[1:]: v for p, v in layer.lines.items() if p[0] == key})
    return Layer(layer.label, values, lines)


def merge(layers: list[Layer]) -> tuple[dict[str, Any], Sources]:
    """LAYERS (lowest first) -> (the data, the source of each value: ``key`` and, for a
    mapping, ``key.sub`` -> (label, line)). A higher layer's value replaces a lower one
    whole, a mapping included."""
    data: dict[str, Any] = {}
    sources: Sources = {}
    for layer in layers:
        for key, value in layer.values.items():
            data[key] = value
            for old in [s for s in sources if s == key or s.startswith(f"{key}.")]:
                del sources[old]
            sources[key] = (layer.label, layer.lines.get((key,)))
            if isinstance(value, dict):
                for sub in value:
                    sources[f"{key}.{sub}"] = (layer.label, layer.lines.get((key, sub)))
    return data, sources


def where(sources: Sources, key: str | None, sub: str | None = None) -> str | None:
    """``FILE:LINE`` (or ``FILE``) that set KEY (its entry SUB when given and known)."""
    if not key:
        return None
    found = sources.get(f"{key}.{sub}") if sub is not None else None
    found = found or sources.get(key)
    if not found:
        return None
    label, line = found
    return f"{label}:{line}" if line else label
