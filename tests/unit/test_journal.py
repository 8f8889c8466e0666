"""The run journal (core/journal.py, integration/journal.py): one file per pyinfra run, one writer
in the run object on the run's State, written atomically (controller/atomicfile.py), read by the commands
through one reader."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import runobj
from pyinfra.api.state import StateStage
from pyinfra.context import ctx_state

import sglang_deploy
from sglang_deploy.controller import atomicfile
from sglang_deploy.core import journal as shape
from sglang_deploy.core import outcome
from sglang_deploy.core.errors import DataError, UsageError
from sglang_deploy.core.runspec import RunSpec
from sglang_deploy.integration import integration, journal, outcomes

SUMMARY = {"host": "h1", "action": "restarted", "release": "r1", "time_to_ready_s": 41.5}


# ------------------------------------------------------------------ the atomic write

def test_a_write_replaces_the_file_whole_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "sub" / "f.json"
    atomicfile.write(path, "one\n")
    atomicfile.write(path, b"two\n")
    assert path.read_text() == "two\n"
    assert [p.name for p in path.parent.iterdir()] == ["f.json"]
    mask = os.umask(0)
    os.umask(mask)
    assert path.stat().st_mode & 0o777 == 0o644 & ~mask  # as a plain open() would make it


def test_a_crash_mid_write_leaves_the_old_file(tmp_path):
    path = tmp_path / "f.json"
    atomicfile.write(path, "old\n")
    with pytest.raises(RuntimeError), atomicfile.replacing(path) as fh:
        fh.write("half of the new")
        raise RuntimeError("killed here")
    assert path.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["f.json"]


def test_a_failed_rename_leaves_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "f.json"
    atomicfile.write(path, "old\n")

    def refuse(src, dst):
        raise OSError("no space left")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(OSError, match="no space"):
        atomicfile.write(path, "new\n")
    assert path.read_text() == "old\n" and [p.name for p in tmp_path.iterdir()] == ["f.json"]


def test_without_parents_a_missing_folder_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError), atomicfile.replacing(tmp_path / "no" / "f", "wb",
                                                                 parents=False) as fh:
        fh.write(b"x")
    assert not (tmp_path / "no").exists()


def test_the_package_writes_atomically_only_through_the_one_helper():
    """No hand-written temporary-and-rename on the controller (the host's stdlib-only scripts
    in remote/ cannot import it)."""
    package = Path(sglang_deploy.__file__).parent
    hand = re.compile(r"os\.replace\(|os\.rename\(|\.rename\(|\.replace\(tmp|mkstemp\(")
    found = [f"{p.relative_to(package)}:{n}" for p in sorted(package.rglob("*.py"))
             if p.parent.name != "remote" and p.name != "atomicfile.py"
             for n, line in enumerate(p.read_text().splitlines(), 1) if hand.search(line)]
    assert found == []


# ------------------------------------------------------------------ one writer, one reader

def test_the_writer_keeps_every_part_of_every_host_in_one_file(tmp_path):
    path = tmp_path / "journal.json"
    w = journal.Writer(path)
    w.put("h1", shape.OUTCOME, outcome.record("h1", outcome.RUNNING, "verify"))
    w.put("h1", shape.REPORT, SUMMARY)
    w.put("h2", shape.PLAN, {"host": "h2", "preflight": "pass", "changes": []})
    w.put("h1", shape.OUTCOME, outcome.record("h1", outcome.PASSED, "verify", action="restarted",
                                              summary=SUMMARY))
    w.put("h3", shape.BENCH, {"run_id": "r", "current": {"identity": "A"}})
    assert [p.name for p in tmp_path.iterdir()] == ["journal.json"]
    ran = journal.read(path)
    assert ran.outcome("h1").verified and ran.outcome("h1").action == "restarted"
    assert ran.report("h1") == SUMMARY and ran.plan("h1") is None
    assert ran.plan("h2")["changes"] == [] and ran.outcome("h2").kind == "missing"
    assert ran.bench("h3")["current"]["identity"] == "A" and ran.preflight("h3") is None
    assert {h: o.kind for h, o in ran.outcomes(["h1", "h2"]).items()} == {
        "h1": "passed", "h2": "missing"}
    with pytest.raises(ValueError, match="not a part"):
        w.put("h1", "notes", {})


def test_the_file_is_json_with_one_line_per_host(tmp_path):
    path = tmp_path / "journal.json"
    assert shape.parse(shape.text({})).hosts == {}
    w = journal.Writer(path)
    w.put('odd "name"', shape.PLAN, {"changes": ["a\nb"]})
    w.put("h1", shape.REPORT, SUMMARY)
    lines = path.read_text().splitlines()
    assert len(lines) == 4 and lines[1].startswith('  "h1": ')  # sorted by host
    assert json.loads(path.read_text())["hosts"]['odd "name"'] == {"plan": {"changes": ["a\nb"]}}


@pytest.mark.parametrize("text", [None, "", "{ half", "[]", '{"hosts": 3}'])
def test_no_journal_or_a_damaged_one_holds_no_host(tmp_path, text):
    path = tmp_path / "journal.json"
    if text is not None:
        path.write_text(text)
    ran = journal.read(path)
    assert ran.hosts == {} and ran.outcome("h1").kind == "missing"


def test_the_path_comes_from_the_run_spec_or_the_runs_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("SGLANG_DEPLOY_JOURNAL", str(tmp_path / "old-channel.json"))  # ignored
    assert journal.journal_path(RunSpec(), tmp_path) == \
        tmp_path / ".sglang-deploy" / "journal.json"
    assert journal.journal_path(RunSpec(journal=str(tmp_path / "mine.json")), tmp_path) == \
        tmp_path / "mine.json"


# ------------------------------------------------------------------ on the run's State

class Host:
    def __init__(self, name: str) -> None:
        self.name = name


def fake_state():
    return SimpleNamespace(failed_hosts=set(), current_stage=StateStage.Disconnect, ops={})


def test_each_run_has_its_own_journal_in_its_run_object(tmp_path):
    """Nothing module-level: two States, each with its run object and journal; what a run's
    code records goes to the journal of the State in pyinfra's context."""
    a, b = fake_state(), fake_state()
    runobj.start(a, RunSpec(journal=str(tmp_path / "a.json")), checked=False)
    runobj.start(b, RunSpec(journal=str(tmp_path / "b.json")), dry=True, checked=False)
    with ctx_state.use(a):
        assert journal.current() is integration.run_of(a).journal
        assert outcomes.recorder() is integration.run_of(a).recorder
        outcomes.failed("h1", DataError(key="k", what="a number", found="x", fix="y"), "data")
        journal.record("h1", shape.REPORT, SUMMARY)
    with ctx_state.use(b):
        outcomes.note_error("h1", {"type": "ConnectionLost", "message": "gone"})
    assert journal.read(tmp_path / "a.json").outcome("h1").error_type() == "DataError"
    assert journal.read(tmp_path / "a.json").report("h1") == SUMMARY
    assert not (tmp_path / "b.json").exists()


def test_without_a_run_object_nothing_is_recorded_and_the_lookup_raises_with_the_fix():
    """No run in pyinfra's context (a deploy file run without config.py): every writer of the
    journal raises the run object's ``UsageError``, none writes anywhere by default."""
    with ctx_state.use(fake_state()):
        for write in (journal.current, outcomes.recorder,
                      lambda: journal.record("h1", shape.REPORT, SUMMARY),
                      lambda: outcomes.failed("h1", RuntimeError("x"), "verify"),
                      lambda: outcomes.note_error("h1", RuntimeError("x")),
                      lambda: outcomes.decided("h1", {"why": "x"}, True),
                      lambda: outcomes.verified(SUMMARY)):
            with pytest.raises(UsageError) as exc:
                write()
            assert "no run object" in exc.value.found and "config.py" in exc.value.fix


def test_the_journal_is_released_after_the_last_host_and_the_last_record_still_kept(tmp_path):
    """The journal is a part of the run object: attached when the run starts, released with
    it when the last connected host disconnects (``integration.ReleaseRun``, a handler
    before the recorder), whose final record the recorder still writes."""
    from sglang_deploy.integration.integration import ReleaseRun

    state = fake_state()
    run = runobj.start(state, RunSpec(journal=str(tmp_path / "j.json")), checked=False)
    rec = run.recorder
    release = ReleaseRun()
    h1, h2 = Host("h1"), Host("h2")
    for handler in (release, rec):  # pyinfra calls the handlers in the order they were added
        handler.host_connect(state, h1)
        handler.host_connect(state, h2)
    for handler in (release, rec):
        handler.host_disconnect(state, h1)
    assert integration.run_of(state).journal is rec.journal  # h2 is still connected
    for handler in (release, rec):
        handler.host_disconnect(state, h2)
    with ctx_state.use(state), pytest.raises(UsageError):  # released: nothing more recorded
        outcomes.failed("h1", RuntimeError("late"), "verify")
    ran = journal.read(tmp_path / "j.json")
    assert ran.outcome("h1").kind == ran.outcome("h2").kind == "passed"
    assert ran.outcome("h2").action == "unchanged"
