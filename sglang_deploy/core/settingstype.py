"""What a type checker knows of ``data.Settings``, imported by core under ``TYPE_CHECKING``
only: at run time ``Settings`` is made by ``make_dataclass`` from ``data.KEYS``, which a
checker cannot read. The fields outside ``KEYS`` and the properties are typed here; a key's
field is ``Any`` (its type is the table's, checked by ``data.resolve`` at run time)."""

from __future__ import annotations

from typing import Any


class Settings:
    """Resolved data for one host (``data.Settings``, as a type checker sees it)."""

    secrets: dict[str, str]
    router_key: str | None
    #: properties at run time: ``sglang_served_model_name`` or ``sglang_model_path``; the
    #: secret ``SGLANG_API_KEY``
    served_model_name: str
    api_key: str | None

    def __init__(self, **values: Any) -> None: ...

    def __getattr__(self, name: str) -> Any: ...
