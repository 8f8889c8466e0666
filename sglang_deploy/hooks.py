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


def install(state) -> None:
    """Validate on ``state`` as soon as its inventory exists (before or after ``State.init``)."""
    handler = ValidateBeforeConnect()
    if hasattr(state, "callback_handlers"):
        state.add_callback_handler(handler)
        return
    original = state.init

    def init(*args, **kwargs):
        result = original(*args, **kwargs)
        state.add_callback_handler(handler)
        validate_inventory(state.inventory)
        handler.checked = True
        return result

    state.init = init
