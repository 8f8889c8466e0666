"""The stages of deploy.py in pyinfra's fixture style: for each case of
``tests/unit/stagecases/*.json`` (data and raw host facts in), the facts read and the
operations each host gets (names, commands or noop text, ``_if`` conditions) are compared
with the case's ``expected``, and the case's ``checks`` (what the case is about) are asserted
on them. ``UPDATE_STAGE_CASES=1`` rewrites ``expected`` from what the stages add now (then
review the diff); ``stagecase.py`` is the harness, ``stagecases/README.md`` says how to add a
case."""

from __future__ import annotations

import difflib
import json
import re

import pytest
import stagecase

from sglang_deploy.core import unitstart

CASES = stagecase.case_files()


def _ops(got: dict, host: str) -> list[dict]:
    return [op for op in got[host]["operations"] if "name" in op]


def _changing(got: dict, host: str) -> list[str]:
    return [op["name"] for op in _ops(got, host) if op.get("commands")]


def _service_command(command: str) -> str:
    """COMMAND, or `systemctl VERB UNIT` when it is ``unitstart.start_command(VERB, UNIT)``."""
    m = re.search(r"if systemctl (start|restart) (\S+); then", command)
    if m and command == unitstart.start_command(m.group(1), m.group(2)):
        return f"systemctl {m.group(1)} {m.group(2)}"
    return command


def _check(rule: str, want, got: dict, host: str) -> None:
    """One of a case's ``checks`` on HOST: the behaviour the case is about, asserted whatever
    ``expected`` says (a regeneration cannot make it pass)."""
    names = [op["name"] for op in _ops(got, host)]
    commands = [c for op in _ops(got, host) for c in op.get("commands", [])]
    if rule == "changes":  # exactly these operations (name patterns) yield commands
        changing = _changing(got, host)
        assert len(changing) == len(want) and all(
            re.fullmatch(p, n) for p, n in zip(want, changing)), (want, changing)
    elif rule == "changes_include":
        for pattern in want:
            assert any(re.fullmatch(pattern, n) for n in _changing(got, host)), (pattern, names)
    elif rule == "changes_exclude":
        for pattern in want:
            assert not any(re.fullmatch(pattern, n) for n in _changing(got, host)), pattern
    elif rule == "no_operation":
        for pattern in want:
            assert not any(re.fullmatch(pattern, n) for n in names), (pattern, names)
    elif rule == "operation":
        for pattern in want:
            assert any(re.fullmatch(pattern, n) for n in names), (pattern, names)
    elif rule == "order":  # operations (one per pattern, the first it names) in this order
        where = [next((i for i, n in enumerate(names) if re.fullmatch(p, n)), None) for p in want]
        assert None not in where and where == sorted(where), (want, names)
    elif rule == "systemctl":  # the service commands, in order (start, restart)
        service = [c for c in map(_service_command, commands)
                   if re.match(r"systemctl (start|restart|stop) ", c)]
        assert service == want, service
    elif rule == "conditions":  # the ``_if`` of the operations named (patterns)
        for pattern, condition in want.items():
            found = [op.get("if") for op in _ops(got, host) if re.fullmatch(pattern, op["name"])]
            assert found and all(c == condition for c in found), (pattern, found)
    elif rule == "facts_not_read":
        for fact in want:
            assert not any(f.startswith(f"{fact}(") for f in got[host]["facts"]), got[host]["facts"]
    elif rule == "facts_read":
        for fact in want:
            assert any(f.startswith(fact) for f in got[host]["facts"]), got[host]["facts"]
    elif rule == "error":
        assert re.search(want, got[host].get("error") or ""), got[host].get("error")
    else:
        raise AssertionError(f"unknown check {rule!r}")


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_stage_case(path, tmp_path, monkeypatch):
    case = stagecase.load(path)
    got = stagecase.run_case(case, tmp_path, monkeypatch)
    # no secret of the case in any fact, operation name or command
    text = json.dumps(got)
    for name, value in (case.get("env") or {}).items():
        assert value not in text, f"the secret {name} is in what the stages recorded"
    for host, checks in (case.get("checks") or {}).items():
        if "error" not in checks:
            assert "error" not in got[host], got[host]["error"]
        for rule, want in checks.items():
            _check(rule, want, got, host)
    if stagecase.updating():
        path.write_text(stagecase.dump({**case, "expected": got}))
        return
    assert "expected" in case, f"{path.name} has no expected operations: run with " \
                               f"{stagecase.UPDATE_ENV}=1 and review them"
    if got != case["expected"]:
        diff = difflib.unified_diff(stagecase.dump(case["expected"]).splitlines(),
                                    stagecase.dump(got).splitlines(), "expected", "now",
                                    lineterm="", n=4)
        pytest.fail(f"{path.name}: the stages add other operations than expected "
                    f"({stagecase.UPDATE_ENV}=1 rewrites them, if deliberate):\n"
                    + "\n".join(diff), pytrace=False)


def test_every_case_says_what_it_is_about():
    for path in CASES:
        case = stagecase.load(path)
        assert case.get("description") and case.get("checks"), path.name
        assert set(case["checks"]) <= set(case["hosts"]), path.name


def test_a_difference_is_shown_and_fails(tmp_path, monkeypatch):
    """The comparison is real: a case whose expected operations lost one fails, naming it."""
    path = next(p for p in CASES if p.stem == "converged")
    case = stagecase.load(path)
    case["expected"]["fx2"]["operations"].pop(1)
    broken = tmp_path / "cases" / path.name
    broken.parent.mkdir()
    broken.write_text(stagecase.dump(case))
    monkeypatch.delenv(stagecase.UPDATE_ENV, raising=False)
    with pytest.raises(pytest.fail.Exception, match=r"(?s)\+.*Folders"):
        test_stage_case(broken, tmp_path, monkeypatch)


def test_a_fact_the_case_does_not_give_stops_the_host_naming_it(tmp_path, monkeypatch):
    case = stagecase.load(stagecase.CASES / "first_deploy.json")
    del case["hosts"]["fx1"]["facts"]["CudaProbe"]
    got = stagecase.run_case(case, tmp_path, monkeypatch)
    assert re.search(r"the stages read CudaProbe\(mib=8, p2p=True, .*\), which the case does "
                     r"not give", got["fx1"]["error"]), got["fx1"]["error"]
    assert got["fx1"]["operations"] == []  # the pre-flight reads it before any operation


REAL = [p for p in CASES if not stagecase.load(p).get("dry")]


@pytest.mark.parametrize("path", REAL, ids=[p.stem for p in REAL])
def test_the_dry_run_plans_the_real_runs_operations(path, tmp_path, monkeypatch):
    """The dry run equals the run: each case run for real and as ``deploy.py --dry`` gives
    every host the same operations (names, commands, conditions, noops, in order) and the
    same failure; only the facts read differ (a read-only run touches no GPU of a unit that
    is up: ``crash_loop_dry``, ``serving_drift_dry``)."""
    case = stagecase.load(path)
    (tmp_path / "real").mkdir()
    (tmp_path / "dry").mkdir()
    real = stagecase.run_case(case, tmp_path / "real", monkeypatch)
    dry = stagecase.run_case({**case, "dry": True}, tmp_path / "dry", monkeypatch)
    assert set(real) == set(dry)
    for host in real:
        assert dry[host]["operations"] == real[host]["operations"], host
        assert ("error" in dry[host]) == ("error" in real[host]), host
