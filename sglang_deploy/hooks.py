"""Validate every host's data before pyinfra opens the first connection.

pyinfra's CLI loads ``config.py`` before it builds the inventory, and ``State.init`` runs
after that, so ``install`` wraps this state's ``init``: as soon as the inventory exists, the
data of EVERY host is checked and a ``DataError`` stops the run there, before
``connect_all`` starts any connection (the CLI prints it as a pyinfra error, no traceback).
When the state is already initialised (API use), a ``host_before_connect`` callback does the
same check and refuses every host's connection while the data is wrong.
"""

from __future__ import annotations

from pyinfra.api.state import BaseStateCallback

from sglang_deploy import data


def validate_inventory(inventory) -> None:
    """Resolve every host's data; raise the first ``DataError``, naming the host."""
    for each in inventory:
        try:
            data.resolve(each.data.dict())
        except data.DataError as exc:
            if not exc.what.startswith(f"[{each.name}] "):
                exc.what = f"[{each.name}] {exc.what}"
            raise


class ValidateBeforeConnect(BaseStateCallback):
    def __init__(self) -> None:
        self.checked = False
        self.error: data.DataError | None = None

    def host_before_connect(self, state, host):  # type: ignore[override]
        if not self.checked:
            self.checked = True
            try:
                validate_inventory(state.inventory)
            except data.DataError as exc:
                self.error = exc
        if self.error is not None:  # hosts connect in parallel: refuse each one
            raise self.error


def connection_lost(host) -> bool:
    """True when HOST's SSH connection is known to be closed (paramiko transport gone)."""
    client = getattr(host.connector, "client", None)
    if client is None or not hasattr(client, "get_transport"):
        return False
    transport = client.get_transport()
    return transport is None or not transport.is_active()


def lost_connection_message(host_name: str, address: str, operation: str) -> str:
    return (f"sglang-deploy: the SSH connection to {host_name} was lost during `{operation}`\n"
            f"  found:    the connection closed under the running command (sshd killed, network "
            f"down or host rebooted); nothing after it ran on {host_name}, and the service keeps "
            f"the release it had (a half-made release has no .complete marker and is never used)\n"
            f"  fix:      check that `ssh root@{address} true` works, then re-run the deploy: it "
            f"continues from where it stopped")


class ExplainLostConnection(BaseStateCallback):
    """When an operation fails because the SSH connection dropped, say so (pyinfra only says
    `Error: executed N commands` and `No hosts remaining!`)."""

    def operation_host_error(self, state, host, op_hash, retry_attempt=0, max_retries=0):  # type: ignore[override]
        if not connection_lost(host):
            return
        from pyinfra import logger

        names = sorted(state.get_op_meta(op_hash).names) or [op_hash]
        address = host.data.get("ssh_hostname") or host.name
        logger.error(host.print_prefix + lost_connection_message(host.name, address, names[0]))


def install(state) -> None:
    """Validate on ``state`` as soon as its inventory exists (before or after ``State.init``)."""
    handler = ValidateBeforeConnect()
    if hasattr(state, "callback_handlers"):
        state.add_callback_handler(handler)
        state.add_callback_handler(ExplainLostConnection())
        return
    original = state.init

    def init(*args, **kwargs):
        result = original(*args, **kwargs)
        state.add_callback_handler(handler)
        state.add_callback_handler(ExplainLostConnection())
        validate_inventory(state.inventory)
        handler.checked = True
        return result

    state.init = init
