"""`python -m testbed up --group N`: the group recorded in state.json and the data
inventory/testbed.py gives its hosts (pure: no containers)."""

from __future__ import annotations

import ast
import json
import runpy
from pathlib import Path

import pytest

from sglang_deploy.core import data
from testbed import fleet

ROOT = Path(__file__).resolve().parents[2]


def _seed_flags() -> dict:
    tree = ast.parse((ROOT / "group_data" / "all.py").read_text())
    node = next(n for n in tree.body if isinstance(n, ast.Assign)
                and getattr(n.targets[0], "id", None) == "sglang_flags")
    return ast.literal_eval(node.value)


def test_group_record_is_the_first_hosts():
    assert fleet.group_record("tb", 3, 2) == {"name": "tbg1", "hosts": ["tb1", "tb2"]}
    for bad in (1, 4):
        with pytest.raises(fleet.TestbedError, match="a group has 2 to --hosts"):
            fleet.group_record("tb", 3, bad)


def _inventory(tmp_path, monkeypatch, groups):
    monkeypatch.setenv("TESTBED_DIR", str(tmp_path))
    state = fleet.new_state("zz")
    state["hosts"] = [fleet.host_record(state, i) for i in (1, 2, 3)]
    state["groups"] = groups
    (tmp_path / "state.json").write_text(json.dumps(state))
    return dict(runpy.run_path(str(ROOT / "inventory" / "testbed.py"))["testbed"])


def test_inventory_gives_the_group_its_key_and_tp16(tmp_path, monkeypatch):
    hosts = _inventory(tmp_path, monkeypatch, [fleet.group_record("zz", 3, 2)])
    seed = _seed_flags()
    for name in ("zz1", "zz2"):
        d = hosts[name]
        assert d["sglang_group"] == "zzg1"
        assert d["sglang_flags"] == {**seed, "tp-size": 16}
        # the deploy side's data check takes it (its defaults: rank, dist-init addr and port)
        assert data.unknown_keys(d) == []
        data.resolve(d, environ={})
    assert "sglang_group" not in hosts["zz3"] and "sglang_flags" not in hosts["zz3"]


def test_inventory_without_group_is_unchanged(tmp_path, monkeypatch):
    hosts = _inventory(tmp_path, monkeypatch, [])
    assert all("sglang_group" not in d for d in hosts.values())
