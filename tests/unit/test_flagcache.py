"""The controller's cache of parsed server_args.py files (sglang_deploy.controller.flagcache)."""

from __future__ import annotations

import hashlib
import json

import pytest

from sglang_deploy.controller import flagcache
from sglang_deploy.core import flags as F

SOURCE = '''
import argparse
class ServerArgs:
    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser):
        parser.add_argument("--model-path", "--model", type=str, help="weights")
        parser.add_argument("--tp-size", "--tensor-parallel-size", type=int, default=1)
        parser.add_argument("--moe-runner-backend", type=str, choices=["auto", "flashinfer_cutlass"])
        parser.add_argument("--disable-cuda-graph", action="store_true")
'''


@pytest.fixture(autouse=True)
def fresh_memory(monkeypatch):
    monkeypatch.setattr(flagcache, "_MEMORY", {})


def test_spec_survives_json_exactly():
    spec = F.parse_server_args(SOURCE, version="t")
    back = F.FlagSpec.from_json(json.loads(json.dumps(spec.to_json())))
    assert back == spec and back.version == "t"
    assert back["--tensor-parallel-size"] is back["--tp-size"]  # aliases share one declaration
    assert back["--moe-runner-backend"].choices == ("auto", "flashinfer_cutlass")
    assert back != F.parse_server_args(SOURCE.replace("store_true", "store_false"), version="t")


def test_the_real_pinned_spec_survives_json():
    from tests.unit.test_flags import PINNED, spec

    real = spec(PINNED)
    assert F.FlagSpec.from_json(json.loads(json.dumps(real.to_json()))) == real


def test_a_hit_needs_no_parse_and_a_miss_parses_once(tmp_path, monkeypatch):
    sha = hashlib.sha256(SOURCE.encode()).hexdigest()
    assert flagcache.load(tmp_path, sha) is None
    first = flagcache.spec_for(tmp_path, SOURCE)
    assert flagcache.entry_path(tmp_path, sha).is_file()

    monkeypatch.setattr(flagcache, "_MEMORY", {})  # a new controller process
    monkeypatch.setattr(F, "parse_server_args", lambda *a, **k: pytest.fail("parsed again"))
    assert flagcache.load(tmp_path, sha) == first
    assert flagcache.spec_for(tmp_path, SOURCE) == first


@pytest.mark.parametrize("damage", ["not json", json.dumps({"sha256": "x", "parser": "y", "spec": {}}),
                                    json.dumps({"sha256": None})])
def test_a_damaged_or_foreign_entry_is_a_miss(tmp_path, damage):
    sha = hashlib.sha256(SOURCE.encode()).hexdigest()
    path = flagcache.entry_path(tmp_path, sha)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(damage)
    assert flagcache.load(tmp_path, sha) is None
    assert flagcache.spec_for(tmp_path, SOURCE) == F.parse_server_args(SOURCE)
    assert flagcache.load(tmp_path, sha) is not None  # rewritten


def test_the_key_names_the_parser(tmp_path, monkeypatch):
    sha = hashlib.sha256(SOURCE.encode()).hexdigest()
    flagcache.spec_for(tmp_path, SOURCE)
    monkeypatch.setattr(flagcache, "_MEMORY", {})
    monkeypatch.setattr(flagcache, "PARSER_ID", "another-parser")
    assert flagcache.load(tmp_path, sha) is None
