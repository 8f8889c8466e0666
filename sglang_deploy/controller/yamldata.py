"""Ansible-style YAML data beside a pyinfra inventory: the YAML inventory's loader (a two-line
Python inventory file, ``inventory/yaml/prod.py``, runs ``groups(__file__)``), and
``group_vars/`` / ``host_vars/`` beside the inventory, for both forms (``apply``). The rules
(precedence, ``ansible_*`` keys) are ``core/ansibledata.py``'s; files are read by
``core/yamlfile.py``'s loader (line numbers, no duplicate keys, no tags, no alias bombs).

The result of ``apply``: each host's pyinfra host data becomes its whole merged data (every
layer below ``--data``, in Ansible's order), with ``SOURCES_KEY`` (where each value was
set); pyinfra's ``--data`` stays above it. A Python inventory with no ``group_vars/`` nor
``host_vars/`` beside it is left as pyinfra made it.
"""

from __future__ import annotations

import os
from pathlib import Path

from sglang_deploy.core import ansibledata as ad
from sglang_deploy.core import yamlfile
from sglang_deploy.core.errors import DataError

#: host data key (pyinfra passes `_` keys through) holding where each value was set
SOURCES_KEY = "_sglang_sources"
#: host data key of the stand-in host of a YAML inventory its loader could not read: the
#: error, which ``apply`` raises
ERROR_KEY = "_sglang_yaml_error"
#: host data key of a YAML inventory's host: the YAML file it came from
YAML_KEY = "_sglang_yaml"
SUFFIXES = (".yml", ".yaml")


def _label(path: Path, cwd: str | os.PathLike | None = None) -> str:
    """PATH as the operator names it: relative to the current folder when under it."""
    path = Path(path).resolve()
    try:
        return str(path.relative_to(Path(cwd or os.getcwd()).resolve()))
    except ValueError:
        return str(path)


def read_yaml(path: Path, cwd: str | os.PathLike | None = None) -> tuple[object, dict, str]:
    """(value, lines, label) of the YAML file PATH; its size is checked before it is read."""
    label = _label(path, cwd)
    yamlfile.check_size(label, path.stat().st_size)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        err = DataError(what="a UTF-8 text file", found=f"not UTF-8 ({exc.reason})",
                        fix="save the file as UTF-8 text")
        err.where = label
        raise err from None
    value, lines = yamlfile.parse(text, label)
    return value, lines, label


def yaml_of(loader_file: str | os.PathLike) -> Path:
    """The YAML inventory a loader file (``prod.py``) reads: ``prod.yml`` (or ``.yaml``)."""
    base = Path(loader_file).resolve()
    for suffix in SUFFIXES:
        if base.with_suffix(suffix).is_file():
            return base.with_suffix(suffix)
    raise DataError(what=f"a YAML inventory beside {base.name} ({base.stem}.yml)",
                    found=f"no {base.with_suffix('.yml')}",
                    fix=f"write the inventory in {base.stem}.yml, or remove {base.name}")


def load_inventory(path: Path, cwd: str | os.PathLike | None = None) -> ad.Inventory:
    doc, lines, label = read_yaml(path, cwd)
    return ad.parse_inventory(doc, lines, label)


def groups(loader_file: str | os.PathLike) -> dict:
    """The pyinfra groups of the YAML inventory beside LOADER_FILE: ``all`` (each host with
    ``YAML_KEY``: the rest of its data is layered by ``apply``), and each group with the
    hosts of its child groups too (``--limit PARENT`` selects them, as in Ansible)."""
    try:
        path = yaml_of(loader_file)
        inv = load_inventory(path)
    except DataError as exc:
        # pyinfra would wrap it (an "unexpected" error, exit 1): carried to ``apply`` by a
        # stand-in host (named after the file), which raises it as the input error it is
        # (exit status 2) before any connection
        name = Path(loader_file).with_suffix(".yml").name
        return {"all": ([(name, {ERROR_KEY: exc})], {})}
    out: dict = {name: inv.members(name) for name in inv.groups if name != "all"}
    out["all"] = ([(h, {YAML_KEY: str(path)}) for h in inv.hosts], {})
    return out


def _vars_files(folder: Path, kind: str, name: str) -> list[Path]:
    """group_vars/NAME.yml (.yaml, or no suffix) and the YAML files of group_vars/NAME/ (in
    name order, as Ansible reads them)."""
    found = [p for p in (folder / kind / f"{name}{s}" for s in SUFFIXES) if p.is_file()]
    sub = folder / kind / name
    if sub.is_dir():
        found += sorted(p for p in sub.rglob("*") if p.is_file() and p.suffix in SUFFIXES)
    return found


def _vars_layers(folder: Path, kind: str, name: str, cwd) -> list[ad.Layer]:
    layers = []
    for path in _vars_files(folder, kind, name):
        value, lines, label = read_yaml(path, cwd)
        if value is None:
            continue
        if not isinstance(value, dict):
            err = DataError(what=f"{kind}/{name}: a mapping of data keys",
                            found=f"a {type(value).__name__}", fix="write `key: value` lines")
            err.where = label
            raise err
        layers.append(ad.Layer(label, value, lines))
    return layers


def check_vars_names(folder: Path, groups_: set[str], hosts: set[str], cwd=None) -> None:
    """Every file or folder of group_vars/ and host_vars/ names a group or host of the
    inventory (a misspelt one would be silently ignored)."""
    for kind, known, what in (("group_vars", groups_, "group"), ("host_vars", hosts, "host")):
        top = folder / kind
        if not top.is_dir():
            continue
        for entry in sorted(top.iterdir()):
            if entry.name.startswith("."):
                continue
            name = entry.name if entry.is_dir() else entry.name.removesuffix(
                entry.suffix if entry.suffix in SUFFIXES else "")
            if entry.is_file() and entry.suffix not in SUFFIXES:
                continue  # not a data file (README, .json is not read)
            if name not in known:
                err = DataError(what=f"{kind}/ files named after a {what} of the inventory",
                                found=f"`{name}`: no such {what} (there are: "
                                      f"{', '.join(sorted(known)) or 'none'})",
                                fix=f"rename or remove {_label(entry, cwd)}")
                err.where = _label(entry, cwd)
                raise err


def host_layers(inventory, host, inventory_file: str | os.PathLike,
                cwd: str | os.PathLike | None = None, always: bool = False,
                parsed: dict | None = None) -> list[ad.Layer] | None:
    """HOST's data layers (lowest first, ``--data`` excluded) of a pyinfra INVENTORY made from
    INVENTORY_FILE: None where there is nothing but pyinfra's own data (a Python inventory
    with no group_vars/ nor host_vars/ beside it), unless ALWAYS. PARSED: the YAML
    inventories already read (path -> Inventory), one read per run."""
    own = dict(inventory.get_host_data(host.name))
    yaml_path = own.pop(YAML_KEY, None)
    own.pop(SOURCES_KEY, None)
    folder = Path(yaml_path).parent if yaml_path else Path(inventory_file).resolve().parent
    if not (yaml_path or always
            or any((folder / k).is_dir() for k in ("group_vars", "host_vars"))):
        return None
    pyinfra_groups = [g for g in host.groups if g != "all"]
    layers = [ad.Layer("pyinfra group data all (group_data/all.py)", dict(inventory.get_data()))]
    layers += [ad.Layer(f"pyinfra group data {g} (group_data/{g}.py or the inventory)",
                        dict(inventory.get_group_data(g))) for g in pyinfra_groups]
    if yaml_path:
        parsed = {} if parsed is None else parsed
        if yaml_path not in parsed:
            parsed[yaml_path] = load_inventory(Path(yaml_path), cwd)
        inv = parsed[yaml_path]
        order = inv.groups_of(host.name)
        layers += [inv.groups[g].vars for g in order if inv.groups[g].vars]
        check_vars_names(folder, set(inv.groups), set(inv.hosts), cwd)
    else:
        order = ["all", *sorted(pyinfra_groups)]
        check_vars_names(folder, set(inventory.groups) | {"all"}, {h.name for h in inventory},
                         cwd)
    for g in order:
        layers += _vars_layers(folder, "group_vars", g, cwd)
    # the inventory file's host vars: the YAML host's, or a Python inventory's host tuple
    if yaml_path:
        layers += inv.host_vars.get(host.name, [])
    else:
        layers.append(ad.Layer(_label(Path(inventory_file).resolve(), cwd), own))
    layers += _vars_layers(folder, "host_vars", host.name, cwd)
    return [ad.translate(layer) for layer in layers if layer.values]


def apply(inventory, inventory_file: str | os.PathLike,
          cwd: str | os.PathLike | None = None) -> None:
    """Layer every host's data of INVENTORY (pyinfra's, made from INVENTORY_FILE) with the
    YAML data (``host_layers``), in place: each host's pyinfra host data becomes the merge,
    with ``SOURCES_KEY``. Raises ``DataError`` (``where`` = FILE:LINE) for a bad file."""
    for host in inventory:
        failed = inventory.get_host_data(host.name).get(ERROR_KEY)
        if isinstance(failed, DataError):
            raise failed
    override, parsed = inventory.get_override_data(), {}
    for host in inventory:
        if SOURCES_KEY in inventory.get_host_data(host.name):
            continue  # done (apply runs once per inventory, whichever path comes first)
        layers = host_layers(inventory, host, inventory_file, cwd, parsed=parsed)
        if layers is None:
            if not host.data.get(CONFIG_KEY):
                continue
            layers = host_layers(inventory, host, inventory_file, cwd, always=True)
        data, sources = ad.merge(layers or [])
        config = override.get(CONFIG_KEY, data.get(CONFIG_KEY))
        if config:
            with_config(data, sources, str(config), cwd)
        data[SOURCES_KEY] = sources
        inventory.host_data[host.name] = data


#: the data key naming an SGLang YAML config file (``--config``), read on the controller
CONFIG_KEY = "sglang_config_file"


def config_flags(path: Path, cwd=None) -> tuple[dict, dict, str]:
    """The launch flags of the SGLang YAML config file PATH (its keys as sglang's
    ``--config`` reads them: ``tp-size`` or ``tp_size``, no leading dashes): (flags by their
    dashed name, the line of each, the file's label)."""
    if not path.is_file():
        err = DataError(key=CONFIG_KEY, what="`sglang_config_file` names a file on the "
                        "controller (relative to the deploy folder)",
                        found=f"no file {_label(path, cwd)}",
                        fix="fix the path, or remove `sglang_config_file`")
        raise err
    value, lines, label = read_yaml(path, cwd)
    if value is None:
        return {}, {}, label
    if not isinstance(value, dict) or "config" in value:
        err = DataError(key=CONFIG_KEY, what="an SGLang config file: a mapping of launch "
                        "flags (`tp-size: 8`), no nested `config`",
                        found=f"a {type(value).__name__}" if not isinstance(value, dict)
                        else "`config` (a config file naming another)",
                        fix="write one `flag: value` line per flag")
        err.where = label
        raise err
    flags, flag_lines = {}, {}
    for key, item in value.items():
        name = str(key).strip().removeprefix("--").replace("_", "-")
        if name in flags:
            err = DataError(key=CONFIG_KEY, what="each flag once in the config file",
                            found=f"`{key}` and another spelling of `{name}`",
                            fix="keep one of them")
            err.where = f"{label}:{lines.get((key,))}"
            raise err
        flags[name] = item
        flag_lines[name] = lines.get((key,))
    return flags, flag_lines, label


def with_config(data: dict, sources: dict, config: str, cwd=None) -> None:
    """DATA's ``sglang_flags`` with the flags of the SGLang config file CONFIG under them: a
    flag that ``sglang_flags`` sets too keeps ``sglang_flags``' value (as sglang's own
    command line wins over its ``--config`` file); SOURCES name the file's line of each."""
    path = Path(config) if os.path.isabs(config) else Path(cwd or os.getcwd(), config)
    flags, lines, label = config_flags(path, cwd)
    own = data.get("sglang_flags") or {}
    if not isinstance(own, dict):
        return  # the data check says what sglang_flags must be
    normalised = {str(k).strip().removeprefix("--").replace("_", "-") for k in own}
    added = {k: v for k, v in flags.items() if k not in normalised}
    data["sglang_flags"] = {**added, **own}
    for name in added:
        sources[f"sglang_flags.{name}"] = (label, lines[name])
    if "sglang_flags" not in sources:
        sources["sglang_flags"] = (label, None)


def sources_of(host_data: dict) -> dict:
    return dict(host_data.get(SOURCES_KEY) or {})


def sources(inventory, host, inventory_file: str | os.PathLike,
            cwd: str | os.PathLike | None = None) -> dict:
    """Where each of HOST's values was set (``ad.merge``'s sources), ``--data`` included."""
    found = sources_of(inventory.get_host_data(host.name))
    if not found:  # a Python inventory as pyinfra made it: its layers, told apart here
        found = ad.merge(host_layers(inventory, host, inventory_file, cwd, always=True) or [])[1]
    for key, value in inventory.get_override_data().items():
        for old in [s for s in found if s == key or s.startswith(f"{key}.")]:
            del found[old]
        found[key] = ("--data", None)
        if isinstance(value, dict):
            found.update({f"{key}.{sub}": ("--data", None) for sub in value})
    return found
