"""remote/launch.py: the API key moves from the environment into the server's own argv, as one
word, so that a key starting with "-" (a token_urlsafe key often does) is not taken for a flag."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

LAUNCH = Path(__file__).resolve().parents[2] / "sglang_deploy" / "remote" / "launch.py"

SERVER = """
import argparse, json, os, sys
p = argparse.ArgumentParser()
p.add_argument("--api-key")
p.add_argument("--port", type=int)
a = p.parse_args()
print(json.dumps({"key": a.api_key, "env": "SGLANG_API_KEY" in os.environ, "port": a.port}))
"""


@pytest.mark.parametrize("key", ["s3cret", "-OOk3y-with-dashes", "--looks-like-a-flag"])
def test_the_key_reaches_the_servers_parser_and_leaves_the_environment(tmp_path, key):
    server = tmp_path / "server.py"
    server.write_text(SERVER)
    r = subprocess.run([sys.executable, str(LAUNCH), str(server), "--port", "30000"],
                       env={**os.environ, "SGLANG_API_KEY": key}, capture_output=True, text=True,
                       timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.replace("<redacted>", key))
    assert out == {"key": key, "env": False, "port": 30000}
    assert key not in r.stdout  # the launcher redacts the key in the server's own output
