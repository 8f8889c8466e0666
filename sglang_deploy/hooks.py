"""Validate every host's data before pyinfra opens the first connection.

pyinfra's CLI loads ``config.py`` before it builds the inventory, and ``State.init`` (which
creates the callback list) runs after that, so ``install`` wraps this state's ``init`` to
register the callback as soon as it exists. The first ``host_before_connect`` then checks
the data of EVERY host in the inventory: nothing is contacted if any host's data is wrong.
"""

from __future__ import annotations

from pyinfra.api.state import BaseStateCallback

from sglang_deploy import data


class ValidateBeforeConnect(BaseStateCallback):
    def __init__(self) -> None:
        self.checked = False

    def host_before_connect(self, state, host):  # type: ignore[override]
        if self.checked:
            return
        self.checked = True
        for each in state.inventory:
            try:
                data.resolve(each.data.dict())
            except data.DataError as exc:
                exc.what = f"[{each.name}] {exc.what}"
                raise


def install(state) -> None:
    """Register ValidateBeforeConnect on ``state`` (before or after ``State.init``)."""
    handler = ValidateBeforeConnect()
    if hasattr(state, "callback_handlers"):
        state.add_callback_handler(handler)
        return
    original = state.init

    def init(*args, **kwargs):
        result = original(*args, **kwargs)
        state.add_callback_handler(handler)
        return result

    state.init = init
