"""Benchmark inventory: the testbed inventory plus BENCH_EXTRA_DATA (a JSON object, env).

The benchmarks use it to make a change that needs a restart (e.g. a new `sglang_env` value)
without editing any file; with BENCH_EXTRA_DATA unset or `{}` it equals inventory/testbed.py.
"""

import json
import os
import runpy
from pathlib import Path

_here = Path(globals().get("__file__") or "bench/inventory.py").resolve().parent
_extra = json.loads(os.environ.get("BENCH_EXTRA_DATA") or "{}")
testbed = [(name, {**data, **_extra})
           for name, data in runpy.run_path(str(_here.parent / "inventory" / "testbed.py"))["testbed"]]
