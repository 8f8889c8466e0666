"""The demo ends with what to do next: the status, the API on the host (over SSH: the server
listens on the host's 127.0.0.1), the teardown; each a command that works as printed from
the project folder, and the README says how its bare commands get on PATH."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

from sglang_deploy.commands import cli

ROOT = Path(__file__).resolve().parents[2]


def _next_steps(prefix: str) -> list[str]:
    out = subprocess.run(["bash", "scripts/demo.sh", "--next-steps"], cwd=ROOT, text=True,
                         capture_output=True, check=True, timeout=30,
                         env={"PATH": "/usr/bin:/bin", "TESTBED_PREFIX": prefix}).stdout
    return [line.strip() for line in out.splitlines() if line.startswith("  ")]


def test_the_demo_ends_with_status_the_api_and_the_teardown():
    status, api, down = _next_steps("hc")
    assert status == "status:    .venv/bin/sglang-deploy status inventory/testbed.py"
    assert api.startswith("the API:   .venv/bin/python -m testbed ssh hc1 curl -sS "
                          "http://127.0.0.1:30000/v1/models")
    assert down == "tear down: .venv/bin/python -m testbed down"


def test_each_next_step_is_a_command_of_this_project():
    status, api, down = (line.split(":", 1)[1].split("(")[0].strip() for line in _next_steps("tb"))
    argv = shlex.split(status)
    assert (ROOT / argv[0]).name == Path(sys.executable).parent.joinpath("sglang-deploy").name
    args = cli.build_parser().parse_args(argv[1:])
    assert args.command == "status" and args.inventory == "inventory/testbed.py"
    assert (ROOT / "inventory/testbed.py").is_file()
    assert shlex.split(api)[1:5] == ["-m", "testbed", "ssh", "tb1"]
    assert shlex.split(down)[1:] == ["-m", "testbed", "down"]


def test_the_readme_says_how_its_commands_get_on_path():
    readme = (ROOT / "README.md").read_text()
    assert "`source .venv/bin/activate` puts `sglang-deploy` and `pyinfra` on PATH" in readme
