"""pyinfrafast.operation_order gives pyinfra's own operation order, on real stacks."""

from __future__ import annotations

import sys
import textwrap
from importlib.metadata import version
from types import SimpleNamespace

import pyinfra
import pytest
from pyinfra.api import util as pyinfra_util
from pyinfra.api.util import PYINFRA_INSTALL_DIR

from sglang_deploy import pyinfrafast

# A deploy file (exec'd like pyinfra runs one) calling helpers of a library module, in a
# loop and through a function compiled as if it were pyinfra's own (a frame pyinfra skips).
DEPLOY = """
import lib
for i in range(2):
    lib.stage(probe)
lib.via_pyinfra(lambda: lib.stage(probe))
probe()
"""

LIB = """
def stage(probe):
    helper(probe)

def helper(probe):
    probe()
"""

PYINFRA_FRAME = "def via_pyinfra(fn):\n    return fn()\n"


@pytest.fixture
def cli(monkeypatch):
    monkeypatch.setattr(pyinfra, "is_cli", True)


def _compare_on(deploy_filename: str | None, run_as: str, tmp_path, file_number: int = 3):
    """Run DEPLOY (compiled as RUN_AS) with a probe that computes both orders on the same
    line, from the same stack; return the pairs."""
    state = SimpleNamespace(current_deploy_filename=deploy_filename,
                            current_op_file_number=file_number)
    pairs = []

    def probe():
        pairs.append((pyinfra_util.get_operation_order_from_stack(state), pyinfrafast.operation_order(state, sys._getframe(0))))  # both calls on one line: the same f_lineno

    lib = type(sys)("lib")
    lib_file = str(tmp_path / "lib.py")
    exec(compile(textwrap.dedent(LIB), lib_file, "exec"), lib.__dict__)
    exec(compile(PYINFRA_FRAME, f"{PYINFRA_INSTALL_DIR}/api/fake_frame.py", "exec"), lib.__dict__)
    sys.modules["lib"] = lib
    try:
        exec(compile(textwrap.dedent(DEPLOY), run_as, "exec"), {"probe": probe})
    finally:
        del sys.modules["lib"]
    return pairs


def test_same_order_as_pyinfra_below_the_deploy_file(tmp_path, cli):
    deploy = str(tmp_path / "deploy.py")
    pairs = _compare_on(deploy, deploy, tmp_path)
    assert len(pairs) == 4
    for slow, fast in pairs:
        assert fast == slow
    # what the numbers are: the file number, then deploy line, lib lines, the probe's line
    assert pairs[0][1][:4] == [3, 4, 3, 6]
    # the pyinfra-file frame is left out, its caller and callee are not
    assert len(pairs[2][1]) == len(pairs[0][1]) + 1


def test_same_order_when_no_frame_is_the_deploy_file(tmp_path, cli):
    pairs = _compare_on(str(tmp_path / "elsewhere.py"), str(tmp_path / "deploy.py"), tmp_path)
    for slow, fast in pairs:
        assert fast == slow


def test_same_order_without_a_deploy_file_and_outside_cli_mode(tmp_path, monkeypatch):
    monkeypatch.setattr(pyinfra, "is_cli", False)
    pairs = _compare_on(None, str(tmp_path / "deploy.py"), tmp_path)
    for slow, fast in pairs:
        assert fast == slow


def test_global_arguments_are_pyinfras_and_a_new_list_each_time():
    from typing import get_type_hints

    from pyinfra.api.arguments import AllArguments

    expected = list(get_type_hints(AllArguments).items())  # pyinfra's all_global_arguments()
    first = pyinfrafast.global_arguments()
    assert first == expected and len(first) > 30
    assert ("_sudo", bool) in first
    first.clear()  # a caller's change does not reach the next caller
    assert pyinfrafast.global_arguments() == expected


def test_install_replaces_pyinfras_functions_for_the_pinned_version_only(monkeypatch):
    places = [(sys.modules[m], n) for m, n, _ in pyinfrafast._REPLACED]
    for module, name in places:  # stand-ins for pyinfra's own (restored after the test)
        monkeypatch.setattr(module, name, lambda *a: None)
    originals = [getattr(module, name) for module, name in places]
    # the pin this module was checked against is the one installed (a new pyinfra: recheck)
    assert version("pyinfra") == pyinfrafast.PYINFRA_VERSION
    monkeypatch.setattr(pyinfrafast, "PYINFRA_VERSION", "0.0")
    assert pyinfrafast.install() is False
    assert [getattr(module, name) for module, name in places] == originals
    monkeypatch.setattr(pyinfrafast, "PYINFRA_VERSION", version("pyinfra"))
    assert pyinfrafast.install() is True
    assert [getattr(module, name) for module, name in places] == [
        f for _, _, f in pyinfrafast._REPLACED]
    assert pyinfrafast.install() is True  # twice: still in place
