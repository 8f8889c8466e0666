"""pyinfrafast gives pyinfra's own operation order, global argument types and global
arguments, on real stacks and a real inventory (their installation, and the pin they were
checked against: tests/unit/test_integration.py)."""

from __future__ import annotations

import sys
import textwrap
from types import SimpleNamespace

import pyinfra
import pytest
from pyinfra.api import util as pyinfra_util
from pyinfra.api.util import PYINFRA_INSTALL_DIR

from sglang_deploy.integration import pyinfrafast

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


# ------------------------------------------------------------------ pop_global_arguments
def _state():
    from pyinfra.api import Config, Inventory, State

    inventory = Inventory(
        (["h1", ("h2", {"_sudo": True, "_env": {"FROM": "host"}, "unrelated": 1})], {"_timeout": 30}),
        override_data={"_retries": 2},
        web=(["h1", "h2"], {"_sudo_user": "svc", "_env": {"FROM": "group"}}),
        db=(["h2"], {"_sudo_user": "db", "_shell_executable": "bash"}),
    )
    return State(inventory, Config(SUDO=False, PARALLEL=3)), inventory


CALLS = [
    {},
    {"name": "Folders", "_sudo": False},
    {"_env": {"A": "1"}, "_if": [lambda: True], "path": "/x", "_ignore_errors": True},
    {"_serial": True, "_run_once": True, "_chdir": "/tmp", "_su_user": "root"},
]


@pytest.mark.parametrize("call", range(len(CALLS)))
@pytest.mark.parametrize("host_name", ["h1", "h2"])
def test_pop_global_arguments_is_pyinfras(call, host_name):
    from pyinfra.api.arguments import pop_global_arguments as pyinfras

    state, inventory = _state()
    host = inventory.get_host(host_name)
    for deploy_data, deploy_kwargs in ((None, None), ({"_sudo_user": "deploy"}, {"_shell_executable": "zsh"})):
        host.current_deploy_data, host.current_deploy_kwargs = deploy_data, deploy_kwargs
        theirs_kwargs, ours_kwargs = dict(CALLS[call]), dict(CALLS[call])
        theirs = pyinfras(state, host, theirs_kwargs)
        ours = pyinfrafast.pop_global_arguments(state, host, ours_kwargs)
        assert ours == theirs
        assert ours_kwargs == theirs_kwargs  # the same keys popped, the rest left
    # the values come from the host's data and are copies, as host.data.<key> gives
    args, _ = pyinfrafast.pop_global_arguments(state, host, {})
    assert args["_env"] == {"FROM": "host" if host_name == "h2" else "group"}
    assert args["_retries"] == 2 and args["_timeout"] == 30
    args["_env"]["FROM"] = "changed"
    assert host.data._env["FROM"] != "changed"


def test_pop_global_arguments_rejects_a_bad_type_as_pyinfra_does():
    from pyinfra.api.arguments import pop_global_arguments as pyinfras
    from pyinfra.api.exceptions import ArgumentTypeError

    state, inventory = _state()
    host = inventory.get_host("h1")
    with pytest.raises(ArgumentTypeError) as theirs:
        pyinfras(state, host, {"_sudo": "yes"})
    with pytest.raises(ArgumentTypeError) as ours:
        pyinfrafast.pop_global_arguments(state, host, {"_sudo": "yes"})
    assert str(ours.value) == str(theirs.value) and "_sudo" in str(ours.value)


def test_pop_global_arguments_reads_a_changed_layer_on_the_next_call():
    state, inventory = _state()
    host = inventory.get_host("h1")
    assert pyinfrafast.pop_global_arguments(state, host, {})[0]["_sudo"] is False
    host.data._sudo = True  # pyinfra's override layer of this host
    assert pyinfrafast.pop_global_arguments(state, host, {})[0]["_sudo"] is True
