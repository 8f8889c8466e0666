"""Pure helpers of sglang_deploy.stages (the pyinfra stages themselves run in tests/integration)."""

from __future__ import annotations

import inspect
import sys
from types import SimpleNamespace

from sglang_deploy import stages


def test_the_deploy_file_gets_a_module_so_pyinfra_stack_lookups_are_dictionary_hits(
        tmp_path, monkeypatch):
    """pyinfra inspects the call stack on every operation; a frame of the exec'd deploy file
    made inspect.getmodule scan sys.modules each time. Once named, the frame has a module."""
    deploy_file = tmp_path / "deploy.py"
    deploy_file.write_text("import sys\nframe = sys._getframe()\n")
    scope: dict = {}
    exec(compile(deploy_file.read_text(), str(deploy_file), "exec"), scope)
    frame = scope["frame"]
    assert inspect.getmodule(frame) is None  # the scan of sys.modules finds nothing

    monkeypatch.setattr(stages, "state", SimpleNamespace(current_deploy_filename=str(deploy_file)))
    before = set(sys.modules)
    stages.name_deploy_file_as_module()
    stages.name_deploy_file_as_module()  # once per file, however many hosts call it
    added = set(sys.modules) - before
    try:
        assert len(added) == 1
        module = inspect.getmodule(frame)
        assert module is sys.modules[added.pop()]
        assert module.__file__ == str(deploy_file)
    finally:
        for name in set(sys.modules) - before:
            del sys.modules[name]


def test_no_deploy_file_no_module(monkeypatch):
    monkeypatch.setattr(stages, "state", SimpleNamespace(current_deploy_filename=None))
    before = set(sys.modules)
    stages.name_deploy_file_as_module()
    assert set(sys.modules) == before
