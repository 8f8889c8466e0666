"""This project's own operations in pyinfra's fixture style: for each JSON case of
``tests/unit/operations/MODULE.OPERATION/`` (the operation's arguments and the facts it reads
in), the commands it yields, its noop text, the facts it read and the error it raises are
compared with the case's. ``UPDATE_OPERATION_CASES=1`` writes them from what the operation
does now (then review the diff); ``opcase.py`` is the runner."""

from __future__ import annotations

import json

import opcase
import pytest

CASES = opcase.case_files()


def _run(path, tmp_path, monkeypatch) -> dict:
    name = path.parent.name
    assert name in opcase.operations(), f"{name}: no @operation of that name in the package"
    return opcase.run_case(name, opcase.load(path), tmp_path, monkeypatch)


@pytest.mark.parametrize("path", CASES, ids=[f"{p.parent.name}/{p.stem}" for p in CASES])
def test_operation_case(path, tmp_path, monkeypatch):
    case = opcase.load(path)
    got = _run(path, tmp_path, monkeypatch)
    if opcase.updating():
        keep = {k: v for k, v in case.items() if k not in (
            "commands", "noop_description", "facts_read", "exception")}
        new = {**keep, **({"exception": {**got["exception"], "message": case.get(
            "exception", {}).get("message", got["exception"]["message"])}}
            if "exception" in got else {"commands": got["commands"]})}
        if got["noop_description"] is not None:
            new["noop_description"] = got["noop_description"]
        if got["facts"]:
            new["facts_read"] = got["facts"]
        path.write_text(opcase.dump(new))
        return
    want = opcase.expected_of(case)
    assert opcase.matches(got, want), (
        f"{path.parent.name}/{path.name}: the operation does other than the case says "
        f"({opcase.UPDATE_ENV}=1 rewrites it, if deliberate)\n"
        f"now:      {json.dumps(got, indent=1)}\nexpected: {json.dumps(want, indent=1)}")
    if not got.get("commands") and "exception" not in got:
        assert got["noop_description"], "an operation that yields nothing says why (host.noop)"


def test_every_operation_of_the_package_has_cases():
    """A new ``@operation`` comes with its cases (a folder of at least one)."""
    have = {p.parent.name for p in CASES}
    missing = sorted(set(opcase.operations()) - have)
    assert not missing, f"operations without cases under tests/unit/operations/: {missing}"
    assert have <= set(opcase.operations()), sorted(have - set(opcase.operations()))


def test_every_case_says_what_it_is_about():
    for path in CASES:
        case = opcase.load(path)
        assert case.get("description"), path
        assert "commands" in case or "exception" in case, path


def test_a_changed_command_fails_the_case(tmp_path, monkeypatch):
    """The comparison is real: a case whose command was changed fails."""
    path = next(p for p in CASES if p.parent.name == "operations.service_stopped")
    case = opcase.load(path)
    case["commands"] = ["systemctl stop another.service"]
    broken = tmp_path / "operations.service_stopped" / path.name
    broken.parent.mkdir()
    broken.write_text(opcase.dump(case))
    monkeypatch.delenv(opcase.UPDATE_ENV, raising=False)
    with pytest.raises(AssertionError, match="does other than the case says"):
        test_operation_case(broken, tmp_path, monkeypatch)


def test_a_fact_the_case_does_not_give_is_named(tmp_path, monkeypatch):
    got = opcase.run_case("operations.symlink", {"kwargs": {"path": "/l", "target": "/t"}},
                          tmp_path, monkeypatch)
    assert got["exception"]["name"] == "KeyError"
    assert "PathStatus(path=/l)" in got["exception"]["message"]
