"""core/ type-checks clean under mypy in strict mode (issue 39, item 4).

mypy runs with the project's own configuration (pyproject.toml's [tool.mypy]: strict, the
files it checks, the python version), as the venv installs it (the dev group)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import sglang_deploy

REPO = Path(sglang_deploy.__file__).resolve().parent.parent


def _mypy() -> str:
    found = Path(sys.executable).parent / "mypy"
    if found.exists():
        return str(found)
    on_path = shutil.which("mypy")
    assert on_path, ("mypy is not installed in this venv (the dev group pins it): "
                     "run `bash scripts/setup.sh` (uv sync) and run the tests again")
    return on_path


def test_core_passes_mypy_strict(tmp_path):
    # a cache of its own: two runs at once (xdist, another worktree) never share one
    proc = subprocess.run([_mypy(), "--config-file", str(REPO / "pyproject.toml"),
                           "--cache-dir", str(tmp_path / "mypy-cache")],
                          capture_output=True, text=True, cwd=REPO, timeout=600, check=False)
    assert proc.returncode == 0, \
        f"mypy found errors in sglang_deploy/core:\n{proc.stdout}{proc.stderr}"
    assert "Success: no issues found" in proc.stdout, proc.stdout + proc.stderr


def test_the_config_checks_core_strictly():
    """The configuration the test runs is the one the issue asks for: strict, on core/."""
    import tomllib

    cfg = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["mypy"]
    assert cfg["strict"] is True
    assert "sglang_deploy/core" in cfg["files"]
