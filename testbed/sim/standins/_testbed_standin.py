"""Import-only stand-ins for torch, triton and torchvision (testbed only; stdlib only).

`python -m sglang.bench_serving` of sglang 0.5.12.post1 is a pure HTTP client (aiohttp,
transformers tokenizers), but importing it runs `sglang/__init__.py`, whose
`sglang.srt.utils.common` imports torch, triton and torchvision at module level (and
`sglang.srt.disaggregation.utils` imports torch.distributed). Nothing of them is called on
the benchmark's code path. The real packages are the ~3.5 GB CUDA stack, which the testbed
hosts do not get (locks/testbed.txt installs sglang without its GPU dependencies), so the
testbed puts these stand-ins on the benchmark's PYTHONPATH (inventory/testbed.py,
`bench_env`). Every attribute is an inert placeholder; calling one that is not a decorator
returns another placeholder. `__version__` is "0.0.0+testbed.standin": below transformers'
minimum (2.4), so transformers treats torch as absent and stays on its tokenizer-only path.

Never used outside the testbed. The production release venv has the real torch.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types

VERSION = "0.0.0+testbed.standin"
ROOTS = ("torch", "triton", "torchvision")


class Placeholder:
    """Any attribute, call, subscript or base class: inert."""

    def __init__(self, name: str):
        self._name = name

    def __repr__(self):
        return f"<testbed stand-in {self._name}>"

    def __getattr__(self, key):
        if key.startswith("__") and key.endswith("__"):
            raise AttributeError(key)
        return Placeholder(f"{self._name}.{key}")

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]  # used as a decorator: leave the function as it is
        return Placeholder(f"{self._name}()")

    def __mro_entries__(self, bases):
        return (object,)

    def __getitem__(self, key):
        return self

    def __iter__(self):
        return iter(())

    def __bool__(self):
        return False

    def __or__(self, other):
        return self

    __ror__ = __or__


class StandinModule(types.ModuleType):
    def __getattr__(self, key):
        if key.startswith("__") and key.endswith("__"):
            raise AttributeError(key)
        return Placeholder(f"{self.__name__}.{key}")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Submodules of the stand-in packages (torch.distributed, torchvision.io, ...)."""

    def find_spec(self, name, path, target=None):
        if "." in name and name.split(".")[0] in ROOTS:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        mod = StandinModule(spec.name)
        mod.__path__ = []
        mod.__version__ = VERSION
        return mod

    def exec_module(self, module):
        pass


def install(module_globals: dict) -> None:
    """Turn the calling package into a stand-in (module __getattr__) and serve its submodules."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
    module_globals["__version__"] = VERSION
    name = module_globals["__name__"]
    module_globals["__getattr__"] = lambda key: StandinModule.__getattr__(sys.modules[name], key)
