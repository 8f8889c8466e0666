"""Three of pyinfra's per-operation costs, made cheap without changing what they return.

pyinfra does this work on every operation call (13 operations per host and no-op run):

- **Operation order.** In CLI mode pyinfra orders the operations of a run by the line numbers
  of the call stack below the deploy file (``pyinfra.api.util.get_operation_order_from_stack``).
  It gets them with ``inspect.stack()`` and then ``getframeinfo`` twice per frame: every
  frame's source file is looked up, ``stat``-ed and read through ``linecache``.
  ``operation_order`` reads the same numbers from the frames' own ``f_code.co_filename``
  and ``f_lineno``.
- **Global argument types.** ``pyinfra.api.arguments.all_global_arguments()`` evaluates
  ``typing.get_type_hints`` over the 35 global arguments (``_sudo``, ``_env``...) every time
  an operation or a fact pops its global arguments. The answer depends on pyinfra's classes
  only: ``global_arguments`` computes it once.
- **Global arguments from the host's data.** ``pop_global_arguments`` (every operation, fact
  and ``@deploy`` call) looks each of the 35 global arguments up in ``host.data``, and each
  lookup walks the data layers (override, host, groups, inventory, deploy data), calling the
  getter of every layer again (the group layer merges the groups' dicts each time) and
  raising a ``KeyError`` per layer that lacks the key. ``pop_global_arguments`` here reads
  the layers once per call and looks the keys up in them, in the same order.

``integration.install_speedups`` (called by ``hooks.install``, so by ``config.py`` before any
operation is added) puts them in place for the pyinfra version this project pins and tests
(``integration.PYINFRA_VERSION``, ``integration.SPEEDUPS``); any other version keeps its own
functions and is warned about. ``tests/unit/test_pyinfrafast.py`` compares each with pyinfra's,
``tests/unit/test_integration.py`` fails when the pin or pyinfra's source moves.
"""

from __future__ import annotations

import functools
import sys


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


def from_caller(state) -> list[int]:
    """``get_operation_order_from_stack(state)``, for the stack of its caller."""
    return operation_order(state, sys._getframe(1))


@functools.cache
def _global_argument_table() -> tuple[tuple[str, type], ...]:
    """A cache: pyinfra's global arguments and their types depend on its classes only."""
    from typing import get_type_hints

    from pyinfra.api.arguments import AllArguments

    return tuple(get_type_hints(AllArguments).items())


def global_arguments() -> list[tuple[str, type]]:
    """``all_global_arguments()``: every global argument and its type, computed once (a new
    list per call, as pyinfra's callers get)."""
    return list(_global_argument_table())


def pop_global_arguments(state, host, kwargs: dict):
    """``pyinfra.api.arguments.pop_global_arguments(state, host, kwargs)`` (3.10.0): the
    global arguments of one call, in pyinfra's order of preference (the call's own KWARGS,
    popped; the current ``@deploy``'s kwargs; the host's data; the config), each checked
    against its type when it differs from its default. The host's data layers are read once
    per call instead of once per argument: the same values, as long as every layer is a dict
    (as pyinfra's own are)."""
    from copy import copy

    from pyinfra.api import arguments as pa

    config = state.config
    if pa.ctx_config.isset():
        config = pa.ctx_config.get()
    meta_kwargs = host.current_deploy_kwargs or {}
    # HostData.__getattr__'s layers, in its order (each getter called once, not per key)
    datas = [data() if callable(data) else data for data in host.data.datas]
    arguments: dict = {}
    found_keys: list[str] = []
    for key, type_ in global_arguments():
        meta = pa.all_argument_meta[key]
        default = meta.default(config)
        for data in datas:
            if key in data:
                default = copy(data[key])  # a copy, as host.data.<key> returns
                break
        if key in kwargs:
            found_keys.append(key)
            value = kwargs.pop(key)
        else:
            value = meta_kwargs.get(key, default)
        if meta.handler:
            value = meta.handler(config, value)
        if value != default:
            pa.raise_if_bad_type(value, type_, pa.ArgumentTypeError, f"Invalid argument `{key}`:")
        arguments[key] = value
    return arguments, found_keys
