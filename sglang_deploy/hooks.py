"""pyinfra callback: validate every host's data before the first connection is opened."""

from __future__ import annotations

from pyinfra.api.state import BaseStateCallback

from sglang_deploy import data


class ValidateBeforeConnect(BaseStateCallback):
    """On the first ``host_before_connect``, check the data of every host in the inventory.

    Raising here aborts the run before any SSH connection exists; the error names the host
    and the key."""

    checked = False

    @staticmethod
    def host_before_connect(state, host):
        if ValidateBeforeConnect.checked:
            return
        ValidateBeforeConnect.checked = True
        for each in state.inventory:
            try:
                data.resolve(each.data.dict())
            except data.DataError as exc:
                exc.host = each.name
                raise
