"""pyinfra's operation order, read from the frames instead of from ``inspect.stack()``.

In CLI mode pyinfra orders the operations of a run by the line numbers of the call stack
below the deploy file (``pyinfra.api.util.get_operation_order_from_stack``). It gets them
with ``inspect.stack()`` and then ``getframeinfo`` twice per frame: every frame's source file
is looked up, ``stat``-ed and read through ``linecache``, on every operation call. That is
about 1.2 ms of controller CPU per operation and host (13 operations per host and run), a
tenth of a 8-host no-op deploy's controller time. The same numbers are the frames' own
``f_code.co_filename`` and ``f_lineno``.

``install()`` puts ``operation_order`` in the place of pyinfra's function for the pyinfra
version this project pins and tests (``PYINFRA_VERSION``); any other version keeps its own
(``tests/unit/test_oporder.py`` compares both on real stacks and fails when the pin moves).
"""

from __future__ import annotations

import sys

PYINFRA_VERSION = "3.10.0"


def operation_order(state, frame) -> list[int]:
    """What ``get_operation_order_from_stack(state)`` returns, for the stack from FRAME out:
    pyinfra's current file number (CLI mode), then the line of every frame from the outermost
    frame of the deploy file inwards, frames of pyinfra's own files left out."""
    import pyinfra
    from pyinfra.api.util import PYINFRA_INSTALL_DIR

    frames = []
    while frame is not None:
        frames.append(frame)
        frame = frame.f_back
    frames.reverse()  # outermost first, as pyinfra reverses inspect.stack()

    start = 0
    deploy_file = state.current_deploy_filename
    if deploy_file:
        # no frame of the deploy file: pyinfra's loop ends on its own frame, which it skips
        start = len(frames)
        for i, f in enumerate(frames):
            if f.f_code.co_filename == deploy_file:
                start = i
                break
    lines = [state.current_op_file_number] if pyinfra.is_cli else []
    lines += [f.f_lineno for f in frames[start:]
              if not f.f_code.co_filename.startswith(PYINFRA_INSTALL_DIR)]
    return lines


def _from_caller(state) -> list[int]:
    return operation_order(state, sys._getframe(1))


def install() -> bool:
    """Use ``operation_order`` for pyinfra's operation order (pinned pyinfra only). True when
    it is in place."""
    import pyinfra.api.operation  # noqa: F401  (the module, not the decorator of that name)

    module = sys.modules["pyinfra.api.operation"]
    if getattr(module, "get_operation_order_from_stack", None) is _from_caller:
        return True
    try:
        from importlib.metadata import version

        installed = version("pyinfra")
    except Exception:  # noqa: BLE001  (no metadata: leave pyinfra as it is)
        return False
    if installed != PYINFRA_VERSION or not hasattr(module, "get_operation_order_from_stack"):
        return False
    module.get_operation_order_from_stack = _from_caller
    return True
