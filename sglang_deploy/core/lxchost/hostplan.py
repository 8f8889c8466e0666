"""One LXC host's run of ``lxc_host.py``, planned (pure): the host's facts and each
container's state in, what to write and run out, every check made before anything changes.

``read_host`` types the host's facts (the driver's majors, nodes, module, cgroup layout,
the container managers, Proxmox's version) and the data (``lxc_containers``; raises
``DataError`` or ``LxcHostError``); ``plan_container`` plans one container from its state
(``lxchost/facts.LxcContainerState``'s dict). The shell fetches, calls these, and
applies the plans only once every container of the host is planned: bad data, a host
without the NVIDIA module, conflicting hand-written lines or a missing container without a
base image stop the run before anything is changed.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sglang_deploy.core.errors import DataError, LxcHostError
from sglang_deploy.core.lxchost import confmerge, containers, desired, facts, incus, pve, restart
from sglang_deploy.core.lxchost import userspace as userspace_mod
from sglang_deploy.core.lxchost.containers import ContainerSpec, CreatePlan

#: the default folder of the tool's Record files on the LXC host (data: lxc_record_dir)
RECORD_DIR = "/var/lib/sglang-deploy/lxc-host"


@dataclass(frozen=True)
class HostInfo:
    """The LXC host as planned from: its facts, the containers' specs (dialects resolved),
    where plain-LXC containers live, where records are kept, Proxmox's devN support."""

    facts: facts.HostFacts
    specs: tuple[ContainerSpec, ...]
    lxc_path: str = containers.LXC_PATH
    record_dir: str = RECORD_DIR
    dev_entries: bool = False


def _str_key(data: Mapping[str, Any], key: str, default: str) -> str:
    value = data.get(key)
    if value is None:
        return default
    if not isinstance(value, str) or not value.startswith("/") or value.rstrip("/") != value:
        raise DataError(key=key, what=f"`{key}`: an absolute path without a trailing /",
                        found=repr(value), fix=f"e.g. {key}: {default}")
    return value


def check_data(data: Mapping[str, Any]) -> tuple[tuple[ContainerSpec, ...], str, str]:
    """The LXC host's data checked: (the containers' specs, ``lxc_path``,
    ``lxc_record_dir``). Raises ``DataError`` naming the key."""
    specs = containers.parse_containers(data.get("lxc_containers"))
    if not specs:
        raise DataError(key="lxc_containers", what="at least one container in `lxc_containers`",
                        found="an empty list or none", fix="lxc_containers: [{name: gpu-node-1}]")
    return (specs, _str_key(data, "lxc_path", containers.LXC_PATH),
            _str_key(data, "lxc_record_dir", RECORD_DIR))


def read_host(data: Mapping[str, Any], raw: Mapping[str, str]) -> HostInfo:
    """DATA (the LXC host's data: ``lxc_containers``, ``lxc_path``, ``lxc_record_dir``) and
    RAW (``lxchost/facts.HOST_SECTIONS``' outputs by name) -> ``HostInfo``. Raises
    ``DataError`` on bad data and ``LxcHostError`` when the host cannot pass GPUs in (no
    NVIDIA module, nodes missing or stale: ``facts.check_host``) or lacks a container's
    manager."""
    specs, lxc_path, record_dir = check_data(data)
    host = facts.host_facts(raw.get("proc-devices", ""), raw.get("nodes", ""),
                            raw.get("version", ""), raw.get("cgroup", "").strip() or "cgroup2fs",
                            raw.get("gpus", ""))
    facts.check_host(host)
    managers = raw.get("managers", "")
    specs = tuple(containers.resolve_dialect(s, managers) for s in specs)
    dev_entries = False
    if any(s.dialect == "proxmox" for s in specs):
        dev_entries = pve.parse_pveversion(raw.get("pveversion", "")).dev_entries
    return HostInfo(host, specs, lxc_path, record_dir, dev_entries)


@dataclass(frozen=True)
class ContainerPlan:
    """What ``lxc_host.py`` does to one container. ``create`` (a missing container's
    commands), ``config_path`` / ``new_config`` (the config file's new text; None: unchanged),
    ``record_path`` / ``new_record`` (the Record JSON to keep; None: unchanged),
    ``incus_argv`` (LXD/Incus), ``changes`` (one line each, for the operator), ``restart``
    (``restart.RestartDecision``), ``userspace`` (the driver libraries' finding; None when
    not read: a stopped container, or LXD/Incus's injected user space), ``warnings``,
    and for a Proxmox container created by this run (``new_config`` is None then: the file
    is pct's, its lines not the tool's to write) ``pct_set`` (Proxmox 8.1 and newer: the
    argv ``pct set CTID --devN VALUE ...``) or ``append_lines`` (before 8.1: the ``lxc.*``
    lines appended to the file ``pct create`` wrote).

    In the order the shell applies it: ``create.argv`` (create it, never started), the
    passthrough (the config file; ``pct_set`` or ``append_lines``), the record,
    ``incus_argv`` (LXD/Incus: the gpu device and ``nvidia.runtime``, also for a container
    created by ``init``), then ``restart`` (a created container: start it);
    ``record_done`` (the record once a drained restart is done: ``new_record`` keeps the
    restart pending until then, so that a run stopped before it restarts it next time)."""

    spec: ContainerSpec
    restart: restart.RestartDecision
    config_path: str | None = None
    new_config: str | None = None
    record_path: str | None = None
    new_record: str | None = None
    incus_argv: tuple[tuple[str, ...], ...] = ()
    create: CreatePlan | None = None
    changes: tuple[str, ...] = ()
    userspace: userspace_mod.UserspaceFinding | None = None
    warnings: tuple[str, ...] = field(default=())
    pct_set: tuple[str, ...] = ()
    append_lines: tuple[str, ...] = ()
    record_done: str | None = None

    @property
    def changed(self) -> bool:
        return bool(self.create or self.new_config is not None or self.incus_argv
                    or self.pct_set or self.append_lines)


def config_path(spec: ContainerSpec, lxc_path: str) -> str | None:
    """The config file of SPEC's container (None for LXD/Incus)."""
    if spec.dialect == "lxc":
        return f"{lxc_path}/{spec.name}/config"
    if spec.dialect == "proxmox":
        return f"/etc/pve/lxc/{spec.ctid}.conf"
    return None


def record_path(spec: ContainerSpec, record_dir: str) -> str:
    """Where the Record of SPEC's passthrough lines is kept (Proxmox: by CTID)."""
    return f"{record_dir}/{spec.ctid if spec.dialect == 'proxmox' else spec.name}.json"


#: the record's key (beside the Record's own) saying that the running container has not been
#: restarted since its passthrough changed: the next run reports it again, or restarts it.
#: Its value is the container's init PID then (plain LXC; else true): another PID now means
#: the operator restarted it meanwhile.
PENDING = "restart_pending"


def _record_text(record: confmerge.Record, pending: str | bool = False) -> str:
    data = record.to_json()
    if pending:
        data[PENDING] = pending
    return json.dumps(data, indent=1) + "\n"


def _record(text: str | None, path: str) -> tuple[confmerge.Record, str | bool]:
    """The Record in TEXT and its pending restart (False: none)."""
    if not text:
        return confmerge.Record(), False
    try:
        data = json.loads(text)
        return confmerge.Record.from_json(data), data.get(PENDING) or False
    except (ValueError, AttributeError):
        raise LxcHostError("a passthrough record (JSON) in " + path, found=text.strip()[:200],
                           fix=f"delete {path}: the tool then adopts its lines that are still "
                               "right") from None


def _missing(spec: ContainerSpec, info: HostInfo) -> CreatePlan:
    if spec.base_image is None:
        where = (f"in {info.lxc_path}" if spec.dialect == "lxc"
                 else f"({spec.dialect}" + (f", CTID {spec.ctid})" if spec.ctid else ")"))
        raise LxcHostError(
            f"the container {spec.name} {where} on the LXC host", found="no such container",
            fix=f"fix the name in lxc_containers, create the container, or give it a "
                f"`base_image` (lxc_containers: {spec.name}) to have lxc_host.py create it")
    return containers.create_plan(spec, lxc_path=info.lxc_path)


@dataclass(frozen=True)
class _FilePart:
    """The config-file dialects' share of a plan (see ``ContainerPlan``)."""

    merged: confmerge.MergeResult
    new_config: str | None
    pct_set: tuple[str, ...]
    append: tuple[str, ...]
    changes: tuple[str, ...]


def _pve_created(spec: ContainerSpec, lines: Sequence[str], dev_entries: bool
                 ) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """A new Proxmox container's passthrough after ``pct create`` (which writes the config
    itself: none of its lines is replaced): (the ``pct set CTID --devN VALUE ...`` argv,
    the lines to append). ``devN`` entries go through ``pct set`` (its own file write,
    under its lock); ``lxc.*`` lines are appended to the file pct wrote (``pct set`` takes
    no ``lxc.*`` key). Either way the file then holds LINES verbatim, the record's lines."""
    if not dev_entries:
        return (), tuple(lines)
    options = [x for kv in (confmerge.key_value(line, "proxmox") for line in lines) if kv
               for x in (f"--{kv[0]}", kv[1])]
    return ("pct", "set", str(spec.ctid), *options), ()


def append_command(path: str, lines: Sequence[str]) -> str:
    """The shell command that appends LINES (one a line) to the file PATH."""
    return "printf '%s\\n' " + " ".join(shlex.quote(x) for x in lines) + " >> " \
        + shlex.quote(path)


def _file_part(spec: ContainerSpec, info: HostInfo, state: Mapping[str, Any],
               create: CreatePlan | None, record: confmerge.Record) -> _FilePart:
    """Plain LXC or Proxmox: the passthrough merged into the config (a created plain-LXC
    container's whole file; a created Proxmox container's lines after pct's own)."""
    want = desired.desired_directives(spec.dialect, info.facts, spec.gpus,  # type: ignore[arg-type]  # resolved by read_host
                                      dev_entries_ok=info.dev_entries)
    text = state.get("config") or ""
    if create:
        text = "\n".join(create.config_lines) + "\n" if spec.dialect == "lxc" else ""
    merged = confmerge.merge(text, want, spec.dialect, info.facts.majors, record,  # type: ignore[arg-type]  # resolved by read_host
                             adopt=spec.adopt_passthrough_lines,
                             path=config_path(spec, info.lxc_path) or spec.name)
    changes = [f"create {spec.name} from {spec.base_image}"] if create else []
    new_config: str | None = None
    pct_set: tuple[str, ...] = ()
    append: tuple[str, ...] = ()
    if merged.changed or create:
        changes += [f"add: {x}" for x in merged.added] + [f"remove: {x}" for x in merged.removed]
        if create and spec.dialect == "proxmox":
            pct_set, append = _pve_created(spec, merged.record.lines, info.dev_entries)
        else:
            new_config = merged.text
    return _FilePart(merged, new_config, pct_set, append, tuple(changes))


def plan_container(spec: ContainerSpec, info: HostInfo, state: Mapping[str, Any], *,
                   behind_router: bool = False) -> ContainerPlan:
    """The plan for SPEC's container from STATE (``exists``, ``config``, ``record``,
    ``running``, ``init`` (its init PID, plain LXC), ``serving``, ``libraries``,
    ``os_release``); BEHIND_ROUTER: a router fronts the server it holds (``spec.serves``).
    A missing container is created (from its base image), its GPUs passed in, then
    started. A restart reported as needed by an earlier run and not done since (the same
    init PID) counts as a change until it is done. Raises ``LxcHostError`` on a
    missing container without a base image, hand-written NVIDIA lines that conflict (and
    ``adopt_passthrough_lines`` false), or a record it cannot read."""
    rpath = record_path(spec, info.record_dir)
    running, serving = bool(state.get("running")), bool(state.get("serving"))
    create = None if state.get("exists") else _missing(spec, info)
    new_record = None
    incus_argv: tuple[tuple[str, ...], ...]
    record, pending = (confmerge.Record(), False) if create else _record(state.get("record"), rpath)
    if spec.dialect in desired.FILE_DIALECTS:
        part = _file_part(spec, info, state, create, record)
        merged, new_config, pct_set, append = part.merged, part.new_config, part.pct_set, part.append
        changes, warnings, incus_argv = part.changes, part.merged.warnings, ()
    else:
        plan = incus.plan("" if create else state.get("config") or "", spec.dialect, spec.name,  # type: ignore[arg-type]  # resolved by read_host
                          info.facts, spec.gpus, adopt=spec.adopt_passthrough_lines)
        merged, new_config, pct_set, append, warnings = None, None, (), (), ()
        incus_argv = plan.argv
        changes = (f"create {spec.name} from {spec.base_image}",) * bool(create) + plan.changes
    finding = None
    if running and info.facts.module and spec.dialect in desired.FILE_DIALECTS \
            and state.get("libraries") is not None:
        finding = userspace_mod.check(state.get("libraries") or "", state.get("os_release") or "",
                                      info.facts.module)
    # a change not yet in force (a restart reported, not done) counts until the container
    # restarts; a stopped container takes its config at its next start
    init = state.get("init") or True
    pending = bool(pending and running and (pending is True or pending == init))
    changed = bool(create or new_config is not None or incus_argv or pending)
    decision = restart.decide(spec.dialect, spec.name, changed=changed, running=running,  # type: ignore[arg-type]  # resolved by read_host
                              serving=serving, policy=spec.restart, ctid=spec.ctid,
                              behind_router=behind_router, serves=spec.serves is not None,
                              lxc_path=info.lxc_path)
    record_done = None
    if merged is not None:
        keep = _record_text(merged.record,
                            init if decision.action in (restart.NEEDED, restart.DRAIN) else False)
        if create or keep != (state.get("record") or ""):
            new_record = keep
        if decision.action == restart.DRAIN:
            record_done = _record_text(merged.record)
    return ContainerPlan(spec, decision, config_path(spec, info.lxc_path), new_config, rpath,
                         new_record, incus_argv, create, tuple(changes), finding,
                         tuple(warnings), pct_set, append, record_done)
