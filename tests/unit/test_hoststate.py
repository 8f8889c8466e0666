"""remote/hoststate.py `state` run locally (it is a stdlib script fed to the host's python)."""

from __future__ import annotations

import json
import pwd
import subprocess
import sys
from pathlib import Path

TOOL = Path(__file__).resolve().parents[2] / "sglang_deploy" / "remote" / "hoststate.py"


def test_state_lists_the_users(tmp_path):
    out = subprocess.run([sys.executable, str(TOOL), "state", "--root", str(tmp_path),
                          "--service", "sglang-deploy-test-absent"],
                         capture_output=True, text=True, check=True).stdout
    state = json.loads(out)
    assert "root" in state["users"]
    assert state["users"] == sorted({p.pw_name for p in pwd.getpwall()})
    assert state["releases"] == {} and state["current"] is None
