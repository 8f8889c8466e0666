"""Every pyinfra internal the package touches, each with why and what it needs of pyinfra;
``test_integration.py`` pins them (each still exists with the shape listed, in the installed
pyinfra, and the package touches nothing of pyinfra that is neither public nor listed here:
``pyinfrascan.scan`` reads the package's source).

**Public** (``is_public``): what pyinfra's documentation gives deploy, operation and fact
authors (docs.pyinfra.com: "Using Operations", "Writing Facts & Operations", "Inventory &
Data", "Deploy Process", "Using the API", the operations and facts index) and what its
packages export: ``pyinfra``'s ``host``, ``state``, ``config``, ``inventory``, ``logger``;
the names ``pyinfra.api`` exports (``operation``, ``deploy``, ``FactBase``, the command
classes, ``State``, ``Inventory``, ``Config``, ``BaseStateCallback``); its exceptions; every
operation and fact; ``host.name``, ``.data``, ``.groups``, ``.get_fact``, ``.noop``,
``.run_shell_command`` and the output it returns; ``inventory.get_host``, ``.get_group``;
``state.inventory``, ``.config``, ``.add_callback_handler``; an operation's
``changed``/``did_change``; the config options. A name that starts with ``_`` is never public.

**Internal**: anything else, each one an ``Internal`` below. A new use fails the test until
it is listed here (or replaced by public API); a listed use the package no longer makes
fails it too (drop the entry).
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass

PUBLIC_MEMBERS = {
    "Host": {"name", "data", "groups", "get_fact", "noop", "run_shell_command"},
    "State": {"inventory", "config", "add_callback_handler"},
    "Inventory": {"get_host", "get_group"},
    "OperationMeta": {"changed", "did_change", "did_succeed", "did_error"},
    "CommandOutput": {"stdout", "stderr", "stdout_lines", "stderr_lines", "combined_lines"},
}
PUBLIC_TOP = {"host", "state", "config", "inventory", "logger"}


def _resolve(path: str):
    """The object a dotted pyinfra path names (attributes after the module), or None."""
    import importlib

    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for part in parts[i:]:
            obj = getattr(obj, part, None)
        return obj
    return None


def is_public(key: str) -> bool:
    """Whether the use KEY (``pyinfrascan``) is pyinfra's public API (the module docstring)."""
    if any(part.startswith("_") for part in re.split(r"[. ]", key)):
        return False
    if "." in key and key.split(".")[0] in PUBLIC_MEMBERS:
        cls, member = key.split(".", 1)
        return member in PUBLIC_MEMBERS[cls]
    if key.startswith("Config."):
        return key.split(".", 1)[1].isupper()  # a config option (config.py)
    if key == "pyinfra" or key.split(".")[:2] in (["pyinfra", t] for t in PUBLIC_TOP) \
            and (key.count(".") == 1 or key.startswith("pyinfra.logger.")):
        return True
    if re.fullmatch(r"pyinfra\.(operations|facts)\.\w+(\.\w+)?", key):
        return True
    if re.fullmatch(r"pyinfra\.api\.exceptions\.\w+", key):
        return True
    import types

    import pyinfra.api

    if not key.startswith("pyinfra.api."):
        return False
    name = key.rsplit(".", 1)[-1]
    exported = vars(pyinfra.api).get(name)  # what ``pyinfra.api`` exports, not a submodule
    if exported is None or isinstance(exported, types.ModuleType):
        return False
    return key.count(".") == 2 or _resolve(key) is exported


# ------------------------------------------------------------------ shape checks
def _signature_has(path: str, *params: str) -> Callable[[], None]:
    def check() -> None:
        obj = _resolve(path)
        assert callable(obj), f"{path} is gone"
        have = inspect.signature(obj).parameters
        assert all(p in have for p in params), f"{path}{inspect.signature(obj)} lacks {params}"
    check.__doc__ = f"{path}({', '.join(params)}, ...)"
    return check


def _has(cls_path: str, *names: str, instance: bool = False) -> Callable[[], None]:
    """CLS_PATH (a class) has NAMES: as class attributes, or set by its constructor."""
    def check() -> None:
        cls = _resolve(cls_path)
        assert cls is not None, f"{cls_path} is gone"
        obj = _instance(cls) if instance else cls
        fields = {n for k in getattr(cls, "__mro__", ()) for n in getattr(k, "__annotations__", {})}
        missing = [n for n in names if not hasattr(obj, n) and n not in fields]
        assert not missing, f"{cls_path} has no {missing}"
    check.__doc__ = f"{cls_path}: {', '.join(names)}"
    return check


def _instance(cls):
    """One real instance of pyinfra's State, Host or SSHConnector, never connected."""
    from pyinfra.api import Config, Inventory, State

    inventory = Inventory((["h1"], {}))
    state = State(inventory, Config())
    host = inventory.get_host("h1")
    return {"State": state, "Host": host, "SSHConnector": host.connector,
            "Inventory": inventory}[cls.__name__]


def _all(*checks: Callable[[], None]) -> Callable[[], None]:
    def check() -> None:
        for each in checks:
            each()
    check.__doc__ = "; ".join(c.__doc__ or "" for c in checks)
    return check


@dataclass(frozen=True)
class Internal:
    """USES (``pyinfrascan`` keys) of pyinfra's internals, used for REASON; SHAPE asserts
    that the installed pyinfra still has them as used; WITHOUT: how to stop using them."""

    what: str
    uses: tuple[str, ...]
    reason: str
    shape: Callable[[], None]
    without: str


INTERNALS = (
    Internal(
        "the speed-ups (integration/pyinfrafast.py, placed by integration.SPEEDUPS)",
        ("pyinfra.api.util.get_operation_order_from_stack",
         "pyinfra.api.arguments.all_global_arguments", "pyinfra.api.arguments.pop_global_arguments",
         "pyinfra.api.operation._wrap_operation", "pyinfra.api.operation.solve_operation_consistency",
         "pyinfra.api.deploy._wrap_deploy", "pyinfra.api.facts", "pyinfra.api.facts._handle_fact_kwargs",
         "pyinfra.api.arguments", "pyinfra.api.arguments.AllArguments",
         "pyinfra.api.arguments.ArgumentTypeError", "pyinfra.api.arguments.all_argument_meta",
         "pyinfra.api.arguments.ctx_config", "pyinfra.api.arguments.ctx_config.get",
         "pyinfra.api.arguments.ctx_config.isset", "pyinfra.api.arguments.raise_if_bad_type",
         "pyinfra.api.util.PYINFRA_INSTALL_DIR", "pyinfra.is_cli",
         "State.current_deploy_filename", "State.current_op_file_number",
         "Host.current_deploy_kwargs"),
        "three of pyinfra's per-operation functions replaced by ones that return the same and "
        "halve the controller's CPU on a no-op deploy (docs/performance.md); their sources and "
        "callers are pinned by hash (test_each_replaced_function_and_its_callers_are_the_source_"
        "checked), the replacements read what pyinfra's read",
        _all(_signature_has("pyinfra.api.util.get_operation_order_from_stack", "state"),
             _signature_has("pyinfra.api.arguments.pop_global_arguments", "state", "host", "kwargs"),
             _signature_has("pyinfra.api.arguments.raise_if_bad_type", "value", "type_",
                            "exception", "message_prefix"),
             _has("pyinfra.api.arguments.ctx_config", "get", "isset"),
             _has("pyinfra.api.arguments", "AllArguments", "ArgumentTypeError",
                  "all_argument_meta", "all_global_arguments"),
             _has("pyinfra.api.util", "PYINFRA_INSTALL_DIR"), _has("pyinfra", "is_cli"),
             _has("pyinfra.api.state.State", "current_deploy_filename",
                  "current_op_file_number", instance=True),
             _has("pyinfra.api.host.Host", "current_deploy_kwargs", instance=True)),
        "delete install_speedups() from PyinfraIntegration.install, and pyinfrafast.py"),
    Internal(
        "a command's output line by line (integration/streamed.py)",
        ("pyinfra.connectors.util.make_unix_command_for_host",
         "pyinfra.connectors.util.read_output_buffers", "pyinfra.connectors.util.CommandOutput",
         "pyinfra.api.util.print_host_combined_output"),
        "pyinfra's run_shell_command gives a command's output at its end only; a long install or "
        "download shows its progress lines as they come by running the command as pyinfra does "
        "(its command line, sudo/env prefix and timeout) on the host's SSH client and reading "
        "the output with pyinfra's own reader",
        _all(_signature_has("pyinfra.connectors.util.make_unix_command_for_host", "state", "host",
                            "command"),
             _signature_has("pyinfra.connectors.util.read_output_buffers", "stdout_buffer",
                            "stderr_buffer", "timeout", "print_output", "print_prefix"),
             _signature_has("pyinfra.api.util.print_host_combined_output", "host", "output"),
             _has("pyinfra.connectors.util.CommandOutput", "stdout_lines", "combined_lines")),
        "run_logged falls back to host.run_shell_command (progress shown at the end): drop "
        "the SSH branch of run_streamed"),
    Internal(
        "the SSH client of a host's connection",
        ("Host.connector", "SSHConnector.client"),
        "the deploy lock's channel held for the whole connection, TCP_NODELAY on its socket, "
        "a lost connection told apart from a failed command (integration/hooks.py), and "
        "streamed.py's command; a connector without a client (@local) is skipped",
        _all(_has("pyinfra.api.host.Host", "connector", instance=True),
             _has("pyinfra.connectors.ssh.SSHConnector", "client", instance=True),
             _has("pyinfra.connectors.sshuserclient.SSHClient", "exec_command", "get_transport")),
        "drop the deploy lock, NoDelay and the lost-connection message"),
    Internal(
        "Host.print_prefix",
        ("Host.print_prefix",),
        "our log lines start with the host's `[name] ` as pyinfra's own lines do",
        _has("pyinfra.api.host.Host", "print_prefix", instance=True),
        "write f'[{host.name}] ' instead"),
    Internal(
        "Host.get_temp_filename",
        ("Host.get_temp_filename",),
        "a file is uploaded to pyinfra's temporary name for it, then moved into place, as "
        "files.put does (operations.file_content)",
        _signature_has("pyinfra.api.host.Host.get_temp_filename", "hash_key"),
        "name the temporary file ourselves (DEST.tmp)"),
    Internal(
        "pyinfra's -v and -vv settings",
        ("Host.state", "State.print_input", "State.print_noop_info"),
        "a command run on the host's turn is shown with -vv as pyinfra shows its own "
        "(print_input), a restart's reasons with -v (print_noop_info); a host's reads are "
        "kept in the run object of the Host's State (facts.read_host_state)",
        _has("pyinfra.api.state.State", "print_input", "print_noop_info", instance=True),
        "print unconditionally, or not at all"),
    Internal(
        "the run's operation tables",
        ("State.ops", "State.op_meta", "State.get_op_meta", "State.get_op_data_for_host",
         "StateOperationHostData.operation_meta", "StateOperationMeta.global_arguments",
         "Host.op_hash_order", "OperationMeta.is_complete", "State.failed_hosts"),
        "the outcome record names the operation that failed, its stage and whether it changed "
        "anything (integration/outcomes.py); a plan lists the operations that would change "
        "(integration/plan.py); a lost connection names the operation it cut (integration/hooks.py)",
        _all(_has("pyinfra.api.state.State", "ops", "op_meta", "failed_hosts", instance=True),
             _signature_has("pyinfra.api.state.State.get_op_meta", "op_hash"),
             _signature_has("pyinfra.api.state.State.get_op_data_for_host", "host", "op_hash"),
             _has("pyinfra.api.state.StateOperationMeta", "names", "global_arguments"),
             _has("pyinfra.api.state.StateOperationHostData", "operation_meta",
                  "global_arguments", "command_generator"),
             _has("pyinfra.api.host.Host", "op_hash_order", instance=True),
             _has("pyinfra.api.operation.OperationMeta", "is_complete")),
        "record outcomes from the callback handlers' arguments only (no operation names)"),
    Internal(
        "OperationMeta.will_change",
        ("OperationMeta.will_change",),
        "whether an operation will change something, known while the deploy is prepared "
        "(did_change, the documented one, is known only when it ran): a daemon-reload or a "
        "restart is added only when something before it may change",
        _has("pyinfra.api.operation.OperationMeta", "will_change"),
        "add those operations always, gated by _if=...did_change"),
    Internal(
        "the run's stage",
        ("State.current_stage", "pyinfra.api.state.StateStage",
         *(f"pyinfra.api.state.StateStage.{s}"
           for s in ("Setup", "Connect", "Prepare", "Execute", "Disconnect"))),
        "an outcome record says in which phase a host failed (connect, prepare, execute); a "
        "group's node reads its peers' facts only while the run prepares (stages/group/groupprep.py)",
        _all(_has("pyinfra.api.state.State", "current_stage", instance=True),
             _has("pyinfra.api.state.StateStage", "Setup", "Connect", "Prepare", "Execute",
                  "Disconnect")),
        "record the phase from the callbacks (host_connect, operation_start)"),
    Internal(
        "State.init wrapped (integration/integration.py)",
        ("State.init",),
        "pyinfra has no hook between building the inventory and connecting: every host's data "
        "is checked there, before any connection",
        _signature_has("pyinfra.api.state.State.init", "inventory", "config", "initial_limit"),
        "check the data on the first operation, after connecting"),
    Internal(
        "State.cwd",
        ("State.cwd",),
        "the folder of the run (pyinfra's --chdir): the lock files, the controller's caches "
        "and the run journal are found there",
        _has("pyinfra.api.state.State", "cwd", instance=True),
        "use os.getcwd() (wrong under --chdir)"),
    Internal(
        "State.is_host_in_limit",
        ("State.is_host_in_limit",),
        "a group's node reads the facts of its peers in the run's --limit only",
        _signature_has("pyinfra.api.state.State.is_host_in_limit", "host"),
        "read every peer's facts"),
    Internal(
        "nested operations (files.directory._inner, files.link._inner)",
        ("pyinfra.operations.files.directory._inner", "pyinfra.operations.files.link._inner"),
        "our operations hand a folder or a link that differs to pyinfra's own operation, whose "
        "commands they yield; pyinfra refuses an operation called in an operation and names "
        "`_inner` as the way (its docs' `yield from files.file(...)` raises)",
        _all(_signature_has("pyinfra.operations.files.directory._inner", "path", "user",
                            "group", "mode"),
             _signature_has("pyinfra.operations.files.link._inner", "path", "target")),
        "yield the mkdir/chown/chmod and ln commands ourselves"),
    Internal(
        "the inventory's data layers (controller/yamldata.py)",
        ("Inventory.get_data", "Inventory.get_group_data", "Inventory.get_host_data",
         "Inventory.get_override_data", "Inventory.host_data", "Inventory.groups"),
        "YAML data (group_vars/, host_vars/) is layered between pyinfra's own group data and "
        "its --data overrides, with one precedence, and each value's file and line kept; the "
        "run spec's `--data _sglang_deploy_run=PATH` is taken out of the live override data "
        "(integration/integration.py, read_spec), so that it is no host's data",
        _all(_has("pyinfra.api.inventory.Inventory", "get_data", "get_group_data",
                  "get_host_data", "get_override_data", "host_data", "groups", instance=True),
             _signature_has("pyinfra.api.inventory.Inventory.get_host_data", "hostname"),
             _signature_has("pyinfra.api.inventory.Inventory.get_group_data", "group"),
             lambda: _override_data_is_live()),
        "Python data files only (no YAML inventory); the run spec named by an argument of "
        "pyinfra's own, if it ever has one for a deploy's own input"),
    Internal(
        "an inventory read as pyinfra's CLI reads it, outside a run",
        ("pyinfra_cli.inventory.make_inventory", "pyinfra_cli.util.parse_cli_arg",
         "pyinfra_cli.exceptions.CliError", "pyinfra.context.ctx_state",
         "pyinfra.context.ctx_state.set"),
        "`sglang-deploy` commands (status, data, doctor, rollout...) select hosts and resolve "
        "their data exactly as `pyinfra INVENTORY` does (group_data/, --data K=V); an input "
        "error ends a run as one (a CliError: exit status 2, no traceback)",
        _all(_signature_has("pyinfra_cli.inventory.make_inventory", "inventory", "cwd",
                            "override_data"),
             _signature_has("pyinfra_cli.util.parse_cli_arg", "arg"),
             _has("pyinfra.context.ctx_state", "set", "use"),
             _has("pyinfra_cli.exceptions", "CliError")),
        "load inventories with our own loader"),
    Internal(
        "the run's pyinfra context kept while another inventory loads inside the run",
        ("pyinfra.context.ctx_config", "pyinfra.context.ctx_host",
         "pyinfra.context.ctx_inventory"),
        "lxc_host.py reads the serving fleet's inventory (`serves.inventory`: its routers) "
        "while its own run prepares; loading it sets pyinfra's context (State, inventory, "
        "host, config), which lxchost/serving.py puts back afterwards",
        _all(*(_has(f"pyinfra.context.{c}", "get", "set")
               for c in ("ctx_config", "ctx_host", "ctx_inventory", "ctx_state"))),
        "read the serving fleet in a subprocess (`sglang-deploy` prints its routers as JSON)"),
    Internal(
        "our own attributes on pyinfra's State",
        tuple(f"own attribute {name}" for name in (
            "_sglang_deploy_integration", "_sglang_deploy_run")),
        "the run object (integration.ThisRun: the run's spec, journal, outcome recorder, "
        "Fleet, groups and reads) lives as long as its run, on its State, attached once and "
        "released at the end; the integration marks a State it is installed on; pyinfra has "
        "no place for a deploy's own per-run data",
        lambda: _own_attributes_fit(),
        "keep the run object in a context variable set by the wrapped State.init"),
    Internal(
        "pyinfra's log lines the log filters rewrite (integration/integration.py)",
        (),
        "a typed error raised in a python.call is logged by pyinfra as a traceback and "
        "`Unexpected error in Python callback: `; a --limit of a group's name as `No host "
        "matches found for --limit pattern`",
        lambda: _texts_present(),
        "drop install_log_filters (the lines come back)"),
)


def _override_data_is_live() -> None:
    """A key taken out of ``get_override_data()`` is gone from every host's data."""
    from pyinfra.api import Inventory

    inventory = Inventory((["h1"], {}), override_data={"_k": "v"})
    host = inventory.get_host("h1")
    assert host.data.get("_k") == "v"
    inventory.get_override_data().pop("_k")
    assert host.data.get("_k") is None, "the override data is no longer read live"


def _own_attributes_fit() -> None:
    """State and Host take attributes of ours, and pyinfra defines none of those names."""
    from pyinfra.api.host import Host
    from pyinfra.api.state import State

    names = [u.split(" ", 2)[2] for e in INTERNALS for u in e.uses if u.startswith("own ")]
    for cls in (State, Host):
        obj = _instance(cls)
        assert hasattr(obj, "__dict__"), f"{cls.__name__} no longer takes attributes"
        clash = [n for n in names if hasattr(obj, n)]
        assert not clash, f"pyinfra's {cls.__name__} now defines {clash}"


def _texts_present() -> None:
    from pathlib import Path

    import pyinfra

    site = Path(pyinfra.__file__).parent
    assert "Unexpected error in Python callback: " in (site / "api/operations.py").read_text()
    assert "No host matches found for {option_name} pattern" in (
        site.parent / "pyinfra_cli" / "cli.py").read_text()


def listed() -> dict[str, Internal]:
    """Each listed use -> its entry."""
    return {use: entry for entry in INTERNALS for use in entry.uses}
