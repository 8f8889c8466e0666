"""Stage cases in pyinfra's fixture style: the real ``deploy.py`` (its stages) prepared
against a real pyinfra ``State`` + ``Inventory`` whose hosts never connect, every fact of
this project answered from RAW fact output (what the remote scripts print), and the
operations each host gets recorded: names, the commands they would run or their noop text,
and their ``_if`` conditions. The cases are ``tests/unit/stagecases/*.json``
(``tests/unit/stagecases/README.md`` says how to add one); ``test_stage_cases.py`` runs them.

As pyinfra's own operation tests (``tests/util.py``: ``FakeHost.get_fact``) do, facts are
answered by patching ``get_fact``; unlike them, the answer is the fact's own ``process()``
of the raw output, so a change to a fact's parsing (or to the typed host state built
there) is run by every case. Nothing here reads the stages' internals: data and facts in,
operations out (``start_run`` does what the hooks do when a run starts; ``PER_RUN`` names
the values that change from run to run).
"""

from __future__ import annotations

import ast
import copy
import functools
import json
import os
import re
from pathlib import Path
from typing import Any

import pyinfra.api.host as pyinfra_host
import runobj
from pyinfra.api import Config, Inventory, State
from pyinfra.api.command import (
    FileDownloadCommand,
    FileUploadCommand,
    FunctionCommand,
    StringCommand,
)
from pyinfra.context import ctx_host, ctx_state

REPO = Path(__file__).resolve().parents[2]
CASES = Path(__file__).resolve().parent / "stagecases"
#: raw fact outputs captured from testbed hosts, shared by the cases (``"$file"``)
RAW = REPO / "tests" / "fixtures" / "stagecases"
#: set to 1 to rewrite every case's ``expected`` from what the stages now add
UPDATE_ENV = "UPDATE_STAGE_CASES"
#: the controller's secrets that data keys name (``*_env``): a case gives its own (``env``),
#: never the shell's. The run's modes are no environment: the case's run spec (``case_spec``)
SECRET_ENV = ("SGLANG_API_KEY", "HF_TOKEN", "ROUTER_API_KEY", "TESTBED_ROUTER_KEY")


# ------------------------------------------------------------------ inputs: data and facts
def _literals(path: Path) -> dict:
    """The top-level literal assignments of a pyinfra data file (read, not imported)."""
    out = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 \
                and isinstance(node.targets[0], ast.Name):
            try:
                out[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                continue
    return out


@functools.cache
def base_data() -> dict:
    """group_data/all.py and the testbed inventory's ``TESTBED_DATA`` (the raw facts were
    captured on testbed hosts deployed with that data)."""
    group_all = {k: v for k, v in _literals(REPO / "group_data" / "all.py").items()
                 if not k.startswith("_")}
    data = {**group_all, **_literals(REPO / "inventory" / "testbed.py")["TESTBED_DATA"]}
    # the captures predate metrics on by default: their units have no --enable-metrics
    data["sglang_flags"] = {**data.get("sglang_flags", {}), "enable-metrics": False}
    return data


def host_data(case: dict, name: str) -> dict:
    """NAME's data: ``base_data``, its address, then the case's own keys for it."""
    spec = case["hosts"][name]
    data = {**copy.deepcopy(base_data()), "ssh_hostname": spec.get("address", "10.226.0.11")}
    return {**data, **copy.deepcopy(spec.get("data") or {})}


def _pointer_set(doc: Any, pointer: str, value: Any) -> None:
    """Set the RFC 6901 JSON POINTER of DOC to VALUE (missing objects on the way made)."""
    parts = [p.replace("~1", "/").replace("~0", "~") for p in pointer.lstrip("/").split("/")]
    for part in parts[:-1]:
        doc = doc[int(part)] if isinstance(doc, list) else doc.setdefault(part, {})
    doc[int(parts[-1]) if isinstance(doc, list) else parts[-1]] = value


def _current_tools(doc: Any) -> Any:
    """DOC as the host would report it with the tools of this tree: each installed tool's
    sha256 is the one of the file the deploy ships (``stages.runtime_stage``), so that a
    change to a host-side script does not turn every captured host into one that needs new
    tools (a case about outdated tools sets the sha256 it wants with ``set``)."""
    import hashlib

    from sglang_deploy.core import patch as patchmod
    from sglang_deploy.core import service
    from sglang_deploy.hostops.facts import REMOTE

    state = doc.get("hoststate.json", {}).get("out") if "hoststate.json" in doc else doc
    paths = state.get("paths") if isinstance(state, dict) else None
    # a tool added to the tree since the capture: reported as the others were (installed,
    # or absent on a blank host)
    tools = [(p, e) for p, e in (paths or {}).items() if p.endswith(".py") and "/tools/" in p]
    if tools:
        path, entry = tools[0]
        for name in service.TOOLS:
            paths.setdefault(f"{path.rsplit('/', 1)[0]}/{name}",
                             dict(entry) if isinstance(entry, dict) else entry)
        # the watchdog's files (``core.watchdogunit``), captured before it existed: absent
        from sglang_deploy.core import watchdogunit

        for managed in watchdogunit.managed_paths(path.rsplit("/", 2)[0]):
            paths.setdefault(managed, None)
    for name in service.TOOLS if isinstance(paths, dict) else ():
        src = Path(patchmod.__file__) if name == "patch.py" else REMOTE / name
        for path, entry in paths.items():
            if path.endswith(f"/tools/{name}") and isinstance(entry, dict) and "sha256" in entry:
                entry["sha256"] = hashlib.sha256(src.read_bytes()).hexdigest()
    return doc


def resolve_raw(value: Any) -> Any:
    """A fact's raw output as a case gives it: inline, or ``{"$file": NAME}`` (a file of
    ``tests/fixtures/stagecases``) with ``"set"``: JSON pointer -> value changed in it."""
    if isinstance(value, dict) and "$file" in value:
        doc = _current_tools(json.loads((RAW / value["$file"]).read_text()))
        for pointer, new in (value.get("set") or {}).items():
            _pointer_set(doc, pointer, new)
        return doc
    return copy.deepcopy(value)


def _one_line(value: Any) -> list[str]:
    return value.splitlines() if isinstance(value, str) else [json.dumps(value, sort_keys=True)]


def raw_lines(fact: str, raw: Any) -> list[str]:
    """The stdout lines the fact's command prints: ``HostSnapshot``'s sections (each
    ``{"out", "rc"}``, a JSON ``out`` printed on one line) between their markers, as
    ``facts._sections_command`` prints them; any other fact's JSON on one line (or text)."""
    if fact != "HostSnapshot":
        return _one_line(raw)
    from sglang_deploy.hostops.facts import MARK

    lines: list[str] = []
    for name, section in raw.items():
        lines += [f"{MARK}{name}", *_one_line(section["out"]), "", f"{MARK}rc={section['rc']}"]
    return lines


# ------------------------------------------------------------------ the controller's caches
@functools.cache
def _flag_spec(version: str):
    from sglang_deploy.core.flags import spec as flagmod
    from testbed.wheels import fetch_sglang

    return flagmod.spec_from_wheel(fetch_sglang(version), version)


def seed_flag_cache(cwd: Path, snapshot: dict) -> None:
    """The controller's cache of parsed ``server_args.py`` (``flagcache``) holds every
    release the host reports (the steady state of a controller that deployed it before):
    parsed from the real sglang wheel of that release's version."""
    from sglang_deploy.controller import flagcache

    state = (snapshot.get("hoststate.json") or {}).get("out") or {}
    for rel in (state.get("releases") or {}).values():
        sha, version = rel.get("server_args_sha256"), rel.get("sglang_version")
        if sha and version:
            flagcache.store(cwd / ".sglang-deploy" / "cache" / "flagspec", sha, _flag_spec(version))


# ------------------------------------------------------------------ recording
def _short(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return f"<{len(value)} items>"
    return str(value)


def fact_key(cls) -> str:
    """A fact's name in a case: this project's by class (``HostSnapshot``), pyinfra's as
    its own tests name them (``server.Users``)."""
    if cls.__module__.startswith("pyinfra."):
        return f"{cls.__module__.rsplit('.', 1)[-1]}.{cls.__name__}"
    return cls.__name__


def fact_call(cls, kwargs: dict) -> str:
    return f"{fact_key(cls)}({', '.join(f'{k}={_short(v)}' for k, v in sorted(kwargs.items()))})"


def _function_name(function) -> str:
    while hasattr(function, "__wrapped__"):
        function = function.__wrapped__
    while isinstance(function, functools.partial):
        function = function.func
    return getattr(function, "__qualname__", repr(function))


#: what differs from run to run by design, not by case: a time stamp the controller writes
#: (a release's ``installed_at``), a group run's id and the free port its rendezvous takes
PER_RUN = ((re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?([+-]\d\d:\d\d|Z)?"), "<now>"),
           (re.compile(r"rendezvous-[0-9a-f]{12}-"), "rendezvous-<run>-"),
           (re.compile(r"(rendezvous\.py .* --port )\d+"), r"\1<free port>"))


def _per_run(text: str) -> str:
    for pattern, replacement in PER_RUN:
        text = pattern.sub(replacement, text)
    return text


def describe_command(command) -> str:
    """A command as the host would get it; a multi-line one (a script in a here-document)
    by its first line and its length, an upload by its destination only (its content may be
    a secret)."""
    if isinstance(command, FileUploadCommand):
        return f"upload -> {command.dest}"
    if isinstance(command, FileDownloadCommand):
        return f"download {command.src}"
    if isinstance(command, FunctionCommand):
        return f"python: {_function_name(command.function)}"
    text = command.get_masked_value() if isinstance(command, StringCommand) else str(command)
    lines = _per_run(text).splitlines() or [""]
    return lines[0] if len(lines) == 1 else f"{lines[0]} … ({len(lines)} lines)"


class Recorder:
    """What the stages asked of each host: the facts read, the noop texts (by operation, or
    outside any), in order."""

    def __init__(self, facts: dict[str, dict]) -> None:
        self.facts = facts
        self.read: dict[str, list[str]] = {}
        self.noops: dict[str, dict[str, str]] = {}
        self.loose: dict[str, list[tuple[int, str]]] = {}
        self.listing = False  # True while the harness lists commands: not the stages' reads

    def get_fact(self, state, host, cls, args=None, kwargs=None, **_):
        kwargs = dict(kwargs or {})
        call = fact_call(cls, kwargs)
        if not self.listing and call not in self.read.setdefault(host.name, []):
            self.read[host.name].append(call)
        given = self.facts.get(host.name) or {}
        key = fact_key(cls)
        if key in given:
            lines = raw_lines(key, given[key])
            return cls().process(lines) if lines else cls().default()
        if cls.__module__.startswith("pyinfra."):
            return cls().default()  # a pyinfra fact not given: as on a host without it
        raise KeyError(f"{host.name}: the stages read {call}, which the case does not give "
                       f"(add its raw output under hosts.{host.name}.facts.{key})")

    def noop(self, host, text: str) -> None:
        if host.current_op_hash is not None:
            self.noops.setdefault(host.name, {}).setdefault(host.current_op_hash, text)
        else:
            self.loose.setdefault(host.name, []).append((len(host.op_hash_order), text))


# ------------------------------------------------------------------ conditions
def _host_metas(state) -> list:
    return [data.operation_meta for ops in state.ops.values() for data in ops.values()]


def _evaluate(condition, metas: list, changed) -> Any:
    """CONDITION's value had only the operation meta CHANGED (None: none) changed something
    when the deploy executed; every other operation ran and changed nothing."""
    for meta in metas:
        meta._success, meta._commands = True, (["changed"] if meta is changed else [])
    try:
        return bool(condition())
    except Exception as exc:  # noqa: BLE001 - a condition that cannot be judged says so
        return f"{type(exc).__name__}: {exc}"
    finally:
        for meta in metas:
            meta._success, meta._commands = None, None


def describe_condition(condition, state, earlier: list[tuple[str, Any]]) -> Any:
    """An ``_if`` by what it does: a group's operation by the group's decision, made while
    the nodes were prepared (``groupops.Decided``: static, its value ``now``); any other by
    the earlier operations of its host (EARLIER: name, meta of each that would change) whose
    change alone makes it true, or ``always`` / ``never``."""
    if getattr(condition, "group_gate", False):
        return {"group_gate": "decided", "now": bool(condition())}
    metas = _host_metas(state)
    base = _evaluate(condition, metas, None)
    fired = {name: _evaluate(condition, metas, meta) for name, meta in earlier}
    if all(v == base for v in fired.values()):
        return {True: "always", False: "never"}.get(base, base)
    if base is False:
        return {"when_any_changes": [n for n, v in fired.items() if v is True]}
    return {"without_changes": base, "by_change": fired}


# ------------------------------------------------------------------ running a case
def _name_of(state, op_hash: str, data) -> str:
    """This host's name of the operation (pyinfra shares names between hosts by hash)."""
    names = sorted(state.get_op_meta(op_hash).names)
    given = data.global_arguments.get("name")
    if given:
        mine = [n for n in names if n == given or n.endswith(f" | {given}")]
        names = mine or names
    return names[0] if names else op_hash


def host_operations(state, host, rec: Recorder) -> list[dict]:
    """HOST's operations in order, each: stage, name, and either its commands or its noop
    text; ``if`` where it has a condition; a noop outside any operation as its own entry."""
    out: list[dict] = []
    earlier: list[tuple[str, Any]] = []
    loose = list(rec.loose.get(host.name, []))
    for index, op_hash in enumerate(host.op_hash_order):
        while loose and loose[0][0] <= index:
            out.append({"noop": loose.pop(0)[1]})
        data = state.ops.get(host, {}).get(op_hash)
        if data is None:  # named, then not added (``_run_once`` on another host)
            continue
        full = _name_of(state, op_hash, data)
        stage, _, name = full.rpartition(" | ")
        entry: dict[str, Any] = {"stage": stage, "name": name}
        rec.listing = True
        try:
            with ctx_state.use(state), ctx_host.use(host):
                commands = [describe_command(c) for c in data.command_generator()]
        finally:
            rec.listing = False
        if commands:
            entry["commands"] = commands
        elif op_hash in rec.noops.get(host.name, {}):
            entry["noop"] = rec.noops[host.name][op_hash]
        else:
            entry["commands"] = []
        conditions = data.global_arguments.get("_if") or []
        conditions = conditions if isinstance(conditions, list) else [conditions]
        if conditions:
            with ctx_state.use(state), ctx_host.use(host):
                described = [describe_condition(c, state, earlier) for c in conditions]
            entry["if"] = described[0] if len(described) == 1 else described
        if data.operation_meta.will_change:
            earlier.append((name, data.operation_meta))
        out.append(entry)
    out += [{"noop": text} for _, text in loose]
    return out


def _error(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines() or [""]
    return f"{type(exc).__name__}: " + " / ".join(line.strip() for line in lines[:6])


def start_run(state, inventory, dry: bool, spec=None) -> None:
    """What the hooks do to a run's STATE when it starts (``hooks.install``'s ``init``), but
    connecting and the controller's own checks of the data (lock files on disk, the locked
    sglang's flags): the run object (``hooks.new_run``: SPEC, the run's spec, and DRY; its
    journal in the case's folder, ``state.cwd``), each host's Settings resolved once (its
    Fleet, as the check gives it), and every host connected as pyinfra leaves it (a group's
    node reads its peers' facts). The one place to follow when the hooks change."""
    from sglang_deploy.controller import routing

    fleet = routing.fleet_of(inventory)  # the run's one Fleet (``hooks.check_run``)
    for h in inventory:
        fleet.settings(h.name)
    runobj.start(state, spec, dry=dry, fleet=fleet, cwd=state.cwd)
    for h in inventory:  # as pyinfra's connect_all leaves them (their facts: answered here)
        h.connected = True


def _environment(case: dict, monkeypatch) -> None:
    """The controller's environment of CASE: its own secrets, none of the shell's."""
    for name in SECRET_ENV:
        monkeypatch.delenv(name, raising=False)
    for name, value in (case.get("env") or {}).items():
        monkeypatch.setenv(name, value)


def case_spec(case: dict, cwd: Path):
    """CASE's run spec (``core/runspec.py``): a deploy, the rollout's staging run
    (``stage_only``) or a rolling run at its gate (``roll_gate``: the gate file made in CWD)."""
    from sglang_deploy.core import runspec

    if case.get("stage_only"):  # the rollout's staging run (``stages/staging.py``)
        return runspec.RunSpec(mode=runspec.STAGE)
    if case.get("roll_gate") is not None:  # a staged rollout's rolling run at its gate
        gate = cwd / "batch.gate"
        gate.write_text(case["roll_gate"] + "\n")
        return runspec.RunSpec(gate=runspec.Gate(path=str(gate)))
    return runspec.RunSpec()


def run_case(case: dict, cwd: Path, monkeypatch) -> dict:
    """Prepare CASE's hosts with the real deploy.py (or its ``deploy_file``) in CWD (a scratch folder: the
    controller's caches go there); returns, per host, the facts read and the operations."""
    from sglang_deploy.controller import flagcache

    _environment(case, monkeypatch)
    monkeypatch.setattr(flagcache, "_MEMORY", {}, raising=False)  # only this case's cache
    (cwd / "locks").symlink_to(REPO / "locks")
    for name, spec in (case.get("lock_files") or {}).items():  # a case's own lock files
        path = cwd / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(spec["first_line"] + "\n" + (REPO / spec["from"]).read_text())
    facts = {name: {fact: resolve_raw(raw) for fact, raw in (spec.get("facts") or {}).items()}
             for name, spec in case["hosts"].items()}
    for snapshot in (f.get("HostSnapshot") for f in facts.values()):
        if snapshot:
            seed_flag_cache(cwd, snapshot)
    rec = Recorder(facts)
    monkeypatch.setattr(pyinfra_host, "get_fact", rec.get_fact)
    monkeypatch.setattr(pyinfra_host.Host, "noop", lambda self, text: rec.noop(self, text))

    def never(self, *args, **kwargs):
        raise AssertionError(f"the stage cases never connect ({self.name})")

    monkeypatch.setattr(pyinfra_host.Host, "connect", never)
    groups = {name: (list(members), {}) for name, members in
              (case.get("groups") or {}).items()}  # inventory groups (``routers``)
    inventory = Inventory(([(n, host_data(case, n)) for n in case["hosts"]], {}), **groups)
    state = State(inventory, Config())
    state.cwd = str(cwd)
    start_run(state, inventory, bool(case.get("dry")), case_spec(case, cwd))
    deploy_file = REPO / case.get("deploy_file", "deploy.py")
    code = compile(deploy_file.read_text(), str(deploy_file), "exec")
    errors = {}
    for host in inventory:  # pyinfra loads the deploy file once per host, in one State
        with ctx_state.use(state), ctx_host.use(host):
            try:
                exec(code, {"__file__": str(deploy_file), "__name__": "deploy"})
            except Exception as exc:  # noqa: BLE001 - a stage that stops the host is an outcome
                errors[host.name] = _error(exc)
    out = {}
    for host in inventory:
        out[host.name] = {"facts": rec.read.get(host.name, []),
                          "operations": host_operations(state, host, rec)}
        if host.name in errors:
            out[host.name]["error"] = errors[host.name]
    return out


# ------------------------------------------------------------------ cases on disk
def case_files() -> list[Path]:
    return sorted(CASES.glob("*.json"))


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def dump(case: dict) -> str:
    return json.dumps(case, indent=2, ensure_ascii=False) + "\n"


def updating() -> bool:
    return os.environ.get(UPDATE_ENV) == "1"
