"""The data ``lxc_host.py`` takes per container, validated (pure), and the command that
creates a missing container.

The data is a list of mappings (``parse_containers``); each item's keys:

==========================  =========================================================
``name``                    the container's name (a host name: letters, digits, ``-``,
                            starting with a letter, at most 63); on Proxmox its hostname
``dialect``                 ``lxc`` (plain LXC), ``proxmox``, ``incus`` or ``lxd``; left
                            out: what the host has (``resolve_dialect``)
``ctid``                    Proxmox only, required there: the container's ID (100 and up)
``gpus``                    ``all`` (default) or the GPU numbers N of /dev/nvidiaN
``restart``                 ``when-idle`` (default), ``now`` or ``never``: ``restart.decide``
``base_image``              to create the container when it is missing: plain LXC a rootfs
                            folder or tarball (absolute path on the LXC host); Proxmox a
                            template volume ``STORAGE:vztmpl/FILE.tar.zst``; LXD/Incus an
                            image alias (``images:debian/12``). Left out: a missing container
                            is an error
``unprivileged``            true (default) or false
``adopt_passthrough_lines`` false (default); true lets the tool replace hand-written NVIDIA
                            passthrough lines (``confmerge``) or gpu devices (``incus``)
``config``                  what a container created from ``base_image`` gets besides its
                            rootfs, name and privilege. Plain LXC: config lines (``lxc.KEY =
                            VALUE``): its network (``lxc.net.0.*``), AppArmor profile,
                            ``lxc.init.cmd``. Proxmox: ``pct create`` options written as its
                            config's lines (``KEY: VALUE`` -> ``--KEY VALUE``): ``net0: name=
                            eth0,bridge=vmbr0,ip=dhcp``, ``rootfs: local-lvm:64``, ``memory``,
                            ``cores``; ``features`` replaces the default ``nesting=1``.
                            LXD/Incus: none (the default profile gives network and disk)
==========================  =========================================================
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from sglang_deploy.core.errors import DataError, LxcHostError

DIALECTS = ("lxc", "proxmox", "incus", "lxd")
RESTART_POLICIES = ("when-idle", "now", "never")
KEYS = ("name", "dialect", "ctid", "gpus", "restart", "base_image", "unprivileged",
        "adopt_passthrough_lines", "config")
#: the command whose output ``resolve_dialect`` reads: the container managers on the host
DETECT_COMMAND = "for c in pct incus lxd lxc-start; do command -v $c >/dev/null && echo $c; done; true"
#: the manager's command per dialect, in the order a dialect is chosen when data names none
#: (a Proxmox host has lxc-start too; LXD's snap has lxd)
DETECT = (("proxmox", "pct"), ("incus", "incus"), ("lxd", "lxd"), ("lxc", "lxc-start"))
LXC_PATH = "/var/lib/lxc"
_NAME = re.compile(r"^[A-Za-z](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?$")
_TARBALL = re.compile(r"\.(tar|tar\.gz|tgz|tar\.xz|txz|tar\.zst|tar\.bz2)$")
_TEMPLATE = re.compile(r"^[A-Za-z][\w.-]*:vztmpl/[^/\s]+\.tar\.(gz|xz|zst)$")
_ALIAS = re.compile(r"^(?:[a-z0-9][\w.-]*:)?[\w][\w./-]*$")


@dataclass(frozen=True)
class BaseImage:
    """What a missing container is created from: ``kind`` is ``folder`` or ``tarball``
    (plain LXC), ``template`` (Proxmox), ``alias`` (LXD/Incus)."""

    kind: str
    ref: str


@dataclass(frozen=True)
class ContainerSpec:
    """One container's validated data (see the module's table); ``gpus`` None is all."""

    name: str
    dialect: str | None = None
    ctid: int | None = None
    gpus: tuple[int, ...] | None = None
    restart: str = "when-idle"
    base_image: str | None = None
    unprivileged: bool = True
    adopt_passthrough_lines: bool = False
    config: tuple[str, ...] = ()

    @property
    def image(self) -> BaseImage | None:
        """The base image typed for the dialect (None when there is none or the dialect is
        not known yet)."""
        if self.base_image is None or self.dialect is None:
            return None
        return base_image(self.dialect, self.base_image, "base_image")


def _bad(key: str, what: str, found: Any, fix: str) -> DataError:
    return DataError(key=key, what=what, found=repr(found), fix=fix)


def base_image(dialect: str, value: Any, key: str) -> BaseImage:
    """VALUE as DIALECT's kind of base image; raises ``DataError`` naming KEY when it is of
    another kind."""
    if not isinstance(value, str) or not value.strip():
        raise _bad(key, "a base image name or path", value, "set it to a string or leave it out")
    if dialect == "lxc":
        if not value.startswith("/"):
            raise _bad(key, "an absolute path on the LXC host to a rootfs folder or tarball "
                       "(plain LXC)", value, "e.g. /srv/images/debian12-rootfs.tar.xz")
        return BaseImage("tarball" if _TARBALL.search(value) else "folder", value.rstrip("/"))
    if dialect == "proxmox":
        if not _TEMPLATE.match(value):
            raise _bad(key, "a Proxmox container template volume STORAGE:vztmpl/FILE.tar.zst",
                       value, "`pveam list local` lists them, e.g. "
                              "local:vztmpl/debian-12-standard_12.7-1_amd64.tar.zst")
        return BaseImage("template", value)
    if value.startswith("/") or _TARBALL.search(value) or not _ALIAS.match(value):
        raise _bad(key, f"an image alias for {dialect} (e.g. images:debian/12)", value,
                   f"`{'incus' if dialect == 'incus' else 'lxc'} image list` shows the local "
                   "aliases; a remote one is REMOTE:ALIAS")
    return BaseImage("alias", value)


def _gpus(value: Any, key: str) -> tuple[int, ...] | None:
    if value is None or value == "all":
        return None
    if not isinstance(value, list) or not value or any(
            isinstance(n, bool) or not isinstance(n, int) or n < 0 for n in value) \
            or len(set(value)) != len(value):
        raise _bad(key, "`all` or a list of distinct GPU numbers (the N of /dev/nvidiaN)",
                   value, "e.g. gpus: [0, 1, 2, 3], or leave it out for all")
    return tuple(value)


def _bool(value: Any, key: str, default: bool) -> bool:
    if value is None:
        return default
    if not isinstance(value, bool):
        raise _bad(key, "true or false", value, f"set it to true or false (default {default})")
    return value


def _ctid(value: Any, dialect: str | None, key: str) -> int | None:
    if value is None:
        if dialect == "proxmox":
            raise _bad(key, "the container's ID (ctid) for a Proxmox container", value,
                       "add ctid: the number `pct list` shows (100 and up)")
        return None
    if dialect not in (None, "proxmox"):
        raise _bad(key, f"no ctid for a {dialect} container (ctid is Proxmox's)", value,
                   "remove ctid, or set dialect: proxmox")
    if isinstance(value, bool) or not isinstance(value, int) or not 100 <= value <= 999999999:
        raise _bad(key, "a Proxmox container ID from 100 to 999999999", value,
                   "use the number `pct list` shows")
    return value


#: a plain-LXC config line, and a Proxmox one as ``pct create`` takes it (``KEY: VALUE``)
_LXC_LINE = re.compile(r"^lxc\.[\w.\-]+\s*=")
_PVE_LINE = re.compile(r"^([a-z][a-z0-9\-]*):\s*(\S.*?)\s*$")
#: Proxmox keys `config` may not set: the tool's own (from other data keys, or the GPU
#: passthrough it writes after the create), and a secret (argv is readable by every user)
_PVE_REFUSED = {"hostname": "the container's `name` is its hostname",
                "unprivileged": "the `unprivileged` data key sets it",
                "password": "a secret on a command line; use `ssh-public-keys: FILE` instead",
                "start": "lxc_host.py starts the container once its GPUs are passed in"}


def _pve_option(line: str) -> str | None:
    """Why a Proxmox `config` line cannot be a ``pct create`` option (None: it can)."""
    m = _PVE_LINE.match(line)
    if not m:
        return "not `KEY: VALUE`"
    if m.group(1) in _PVE_REFUSED:
        return _PVE_REFUSED[m.group(1)]
    if re.fullmatch(r"dev\d+", m.group(1)):
        return "the GPU passthrough is the tool's (written after the create)"
    return None


def _config(value: Any, dialect: str | None, key: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if dialect not in (None, "lxc", "proxmox"):
        raise _bad(key, f"no config lines for a {dialect} container (plain LXC's and "
                   "Proxmox's)", value,
                   "remove config; the default profile gives its network and disk")
    lines = value if isinstance(value, list) and all(
        isinstance(x, str) and "\n" not in x for x in value) else None
    if lines is None or (dialect == "lxc" and not all(_LXC_LINE.match(x) for x in lines)) \
            or (dialect is None and not all(_LXC_LINE.match(x) or _PVE_LINE.match(x)
                                            for x in lines)):
        raise _bad(key, "a list of config lines: plain LXC `lxc.KEY = VALUE`, Proxmox "
                   "`KEY: VALUE`", value,
                   "e.g. config: ['lxc.net.0.type = veth', 'lxc.net.0.link = br0'] (plain "
                   "LXC), ['net0: name=eth0,bridge=vmbr0,ip=dhcp'] (Proxmox)")
    bad = [(x, why) for x in lines if (why := _pve_option(x))] if dialect == "proxmox" else []
    if bad:  # the line's key only: its value may be a secret (password)
        line, why = bad[0]
        raise _bad(key, "Proxmox `pct create` options as config lines `KEY: VALUE`",
                   line.split(":", 1)[0] + ": ..." if ":" in line else line,
                   f"{why}; e.g. config: ['net0: name=eth0,bridge=vmbr0,ip=dhcp', "
                   "'rootfs: local-lvm:64']")
    return tuple(lines)


def _name(value: Any, key: str) -> str:
    if not isinstance(value, str) or not _NAME.match(value):
        raise _bad(key, "a container name: letters, digits and `-`, starting with a letter, "
                   "at most 63", value, "e.g. gpu-node-1")
    return value


def parse_container(raw: Any, where: str = "lxc_containers[0]") -> ContainerSpec:
    """One raw mapping -> ``ContainerSpec``; raises ``DataError`` naming WHERE.KEY on an
    unknown key or a bad value."""
    if not isinstance(raw, Mapping):
        raise _bad(where, "a mapping of container keys", raw, "e.g. {name: gpu-node-1}")
    unknown = sorted(set(raw) - set(KEYS))
    if unknown:
        raise _bad(f"{where}.{unknown[0]}", "only the keys " + ", ".join(KEYS), unknown,
                   "remove or rename it")
    dialect = raw.get("dialect")
    if dialect is not None and dialect not in DIALECTS:
        raise _bad(f"{where}.dialect", "one of " + ", ".join(DIALECTS), dialect,
                   "or leave it out to use what the host has")
    restart = raw.get("restart", "when-idle")
    if restart not in RESTART_POLICIES:
        raise _bad(f"{where}.restart", "one of " + ", ".join(RESTART_POLICIES), restart,
                   "when-idle restarts only a container that serves nothing")
    image = raw.get("base_image")
    if image is not None and dialect is not None:
        base_image(dialect, image, f"{where}.base_image")
    return ContainerSpec(
        name=_name(raw.get("name"), f"{where}.name"), dialect=dialect,
        ctid=_ctid(raw.get("ctid"), dialect, f"{where}.ctid"),
        gpus=_gpus(raw.get("gpus"), f"{where}.gpus"), restart=restart, base_image=image,
        unprivileged=_bool(raw.get("unprivileged"), f"{where}.unprivileged", True),
        adopt_passthrough_lines=_bool(raw.get("adopt_passthrough_lines"),
                                      f"{where}.adopt_passthrough_lines", False),
        config=_config(raw.get("config"), dialect, f"{where}.config"))


def parse_containers(raw: Any, key: str = "lxc_containers") -> tuple[ContainerSpec, ...]:
    """The data's list of containers -> their specs, in order; raises ``DataError`` naming
    ``KEY[i].FIELD`` on bad input, or KEY on a name or ctid given twice."""
    if not isinstance(raw, Sequence) or isinstance(raw, str):
        raise _bad(key, "a list of containers", raw, f"{key}: [{{name: gpu-node-1}}]")
    specs = tuple(parse_container(item, f"{key}[{i}]") for i, item in enumerate(raw))
    for attr in ("name", "ctid"):
        seen = [getattr(s, attr) for s in specs if getattr(s, attr) is not None]
        twice = sorted({v for v in seen if seen.count(v) > 1})
        if twice:
            raise _bad(key, f"each container's {attr} once", twice, f"give each its own {attr}")
    return specs


def resolve_dialect(spec: ContainerSpec, available: Collection[str] | str) -> ContainerSpec:
    """SPEC with its dialect set: the data's, or the first of ``DETECT`` whose command the
    host has (AVAILABLE: the command names, or ``DETECT_COMMAND``'s output). Raises
    ``LxcHostError`` when the host lacks the dialect's command, and ``DataError`` when the
    now known dialect does not fit the spec (ctid, base image)."""
    have = set(available.split()) if isinstance(available, str) else set(available)
    command = dict(DETECT)
    dialect = spec.dialect or next((d for d, c in DETECT if c in have), None)
    if dialect is None or command[dialect] not in have:
        raise LxcHostError(
            f"a container manager for {spec.name} on the LXC host"
            + (f" ({spec.dialect}: `{command[spec.dialect]}`)" if spec.dialect else ""),
            found="commands found: " + (", ".join(sorted(have)) or "none of pct, incus, lxd, "
                                                                      "lxc-start"),
            fix="install LXC, Incus or LXD on the LXC host, or set the container's `dialect` "
                "to the one it has")
    resolved = replace(spec, dialect=dialect)
    _ctid(spec.ctid, dialect, f"{spec.name}.ctid")
    if spec.base_image is not None:
        base_image(dialect, spec.base_image, f"{spec.name}.base_image")
    _config(list(spec.config) or None, dialect, f"{spec.name}.config")
    return resolved


@dataclass(frozen=True)
class CreatePlan:
    """How to create a missing container: the argv to run in order, then (plain LXC only)
    the lines to append to ``/var/lib/lxc/NAME/config`` before its first start."""

    argv: tuple[tuple[str, ...], ...]
    config_lines: tuple[str, ...] = ()


def _lxc_plan(spec: ContainerSpec, image: BaseImage, lxc_path: str) -> CreatePlan:
    rootfs = f"{lxc_path}/{spec.name}/rootfs"
    fill = ("cp", "-a", "--", f"{image.ref}/.", rootfs + "/") if image.kind == "folder" \
        else ("tar", "--numeric-owner", "-xpf", image.ref, "-C", rootfs)
    lines = [f"lxc.rootfs.path = dir:{rootfs}", f"lxc.uts.name = {spec.name}",
             "lxc.include = /usr/share/lxc/config/common.conf"]
    if spec.unprivileged:
        lines += ["lxc.include = /usr/share/lxc/config/userns.conf",
                  "lxc.idmap = u 0 100000 65536", "lxc.idmap = g 0 100000 65536",
                  "lxc.rootfs.options = idmap=container"]
    lines += spec.config
    where = () if lxc_path == LXC_PATH else ("-P", lxc_path)
    return CreatePlan((("lxc-create", *where, "-n", spec.name, "-t", "none"),
                       ("mkdir", "-p", rootfs), fill), tuple(lines))


def create_plan(spec: ContainerSpec, *, lxc_path: str = LXC_PATH) -> CreatePlan:
    """The commands that create SPEC's container from its base image (its dialect must be
    resolved). Plain LXC: ``lxc-create -t none`` (only the host's default config), the
    rootfs copied (folder) or unpacked (tarball), then the config lines (rootfs, name, the
    common config; unprivileged: LXC's userns config, the 100000:65536 id map, which
    needs ``root:100000:65536`` in /etc/subuid and /etc/subgid, and an idmapped rootfs).
    Proxmox: ``pct create CTID TEMPLATE --hostname NAME --unprivileged 1|0 --features
    nesting=1`` (nesting: systemd's service sandboxing needs it) and the `config` options.
    LXD/Incus: ``init ALIAS NAME`` (privileged: ``-c security.privileged=true``). None of
    them starts the container: its GPUs are passed in first. Raises ``DataError`` when SPEC
    has no base image."""
    image = spec.image
    if image is None:
        raise DataError(key=f"{spec.name}.base_image",
                        what=f"a base image to create the missing container {spec.name}",
                        found="none (or its dialect is not resolved)",
                        fix="create the container by hand, or give it a base_image")
    if spec.dialect == "lxc":
        return _lxc_plan(spec, image, lxc_path)
    if spec.dialect == "proxmox":
        return CreatePlan((_pct_create(spec, image),))
    client = "incus" if spec.dialect == "incus" else "lxc"
    extra = () if spec.unprivileged else ("-c", "security.privileged=true")
    return CreatePlan(((client, "init", image.ref, spec.name, *extra),))


def _pct_create(spec: ContainerSpec, image: BaseImage) -> tuple[str, ...]:
    """``pct create`` (which does not start it: no ``--start``) with SPEC's `config`
    lines as options, in order; ``--features nesting=1`` unless they set ``features``."""
    options = [_PVE_LINE.match(x).groups() for x in spec.config]  # type: ignore[union-attr]
    features = () if any(k == "features" for k, _ in options) else ("--features", "nesting=1")
    return ("pct", "create", str(spec.ctid), image.ref, "--hostname", spec.name,
            "--unprivileged", "1" if spec.unprivileged else "0", *features,
            *(x for k, v in options for x in (f"--{k}", v)))
