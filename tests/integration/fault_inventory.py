"""The testbed inventory with per-host data for the fault suite (tests only).

`FAULT_HOST_DATA` (JSON: {host: {key: value}}) is merged into those hosts' data, so that one
run can deploy new data to one host while another host of the same run keeps its own (and
must stay untouched). Everything else is inventory/testbed.py as is.
"""

import json
import os
import runpy
from pathlib import Path

_base = runpy.run_path(str(Path(__file__).resolve().parents[2] / "inventory" / "testbed.py"))
_over = json.loads(os.environ.get("FAULT_HOST_DATA") or "{}")

testbed = [(name, {**data, **_over.get(name, {})}) for name, data in _base["testbed"]]
if "routers" in _base:  # a testbed with the router (`up --router`): the same routed fleet
    routers = _base["routers"]
