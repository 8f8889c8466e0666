"""The operations fetch what they compare themselves (``facts.service_state``,
``host_state``, ``patch_status``, ``path_state``), as pyinfra's ``systemd.service`` reads
``SystemdStatus``: through the run's store of reads, so that a no-op run stays one round trip
per host, prepare and execute together; what no read of the run reported is one read of the
operation's own fact (``ServiceStatus``, ``SglangHostState``, ``PatchStatus``, ``PathStatus``),
which reports what the host-state read would."""

from __future__ import annotations

import hashlib
import os
import subprocess

import pytest
import runobj
import stagecase

from sglang_deploy.core.hoststate import HostState, PathState, ServiceState
from sglang_deploy.hostops import facts
from sglang_deploy.hostops.facts import PathStatus, ServiceStatus, SglangHostState
from sglang_deploy.remote import hoststate as remote


# ------------------------------------------------------------------ a no-op run's round trips
def _no_op(path) -> bool:
    """A stage case where no host gets a command and none stops: a second run."""
    expected = stagecase.load(path).get("expected") or {}
    return bool(expected) and all(
        "error" not in got and not any(op.get("commands") for op in got["operations"])
        for got in expected.values())


NO_OP = [p for p in stagecase.case_files() if _no_op(p)]


class EveryRead(stagecase.Recorder):
    """The stage cases' recorder, counting every fact read each time it is made (pyinfra 3.10
    caches no fact: each ``get_fact`` is a round trip), the execute phase's too: the harness
    runs every operation's generator again to list its commands, as pyinfra's execute does."""

    def __init__(self, given: dict) -> None:
        super().__init__(given)
        self.calls: dict[str, list[str]] = {}

    def get_fact(self, state, host, cls, args=None, kwargs=None, **rest):
        self.calls.setdefault(host.name, []).append(stagecase.fact_call(cls, dict(kwargs or {})))
        return super().get_fact(state, host, cls, args, kwargs, **rest)


def test_there_are_no_op_cases_to_count():
    assert {"converged", "gpu_fatal_converged"} <= {p.stem for p in NO_OP}


def _every_read(path, tmp_path, monkeypatch) -> dict[str, list[str]]:
    """Each host's fact reads, each time made, when stage case PATH is prepared and listed."""
    recorders: list[EveryRead] = []

    def recorder(given: dict) -> EveryRead:
        recorders.append(EveryRead(given))
        return recorders[-1]

    monkeypatch.setattr(stagecase, "Recorder", recorder)
    got = stagecase.run_case(stagecase.load(path), tmp_path, monkeypatch)
    assert got and all(host in recorders[0].calls for host in got)
    return recorders[0].calls


@pytest.mark.parametrize("path", NO_OP, ids=[p.stem for p in NO_OP])
def test_a_no_op_run_is_one_round_trip_per_host_prepare_and_execute(path, tmp_path, monkeypatch):
    """Every operation of a converged host compares with the run's one host-state read (the
    unit's state, the releases, the patch record, the model folder, every managed path): one
    fact per host in all, though each operation fetches what it compares and runs twice."""
    for host, calls in _every_read(path, tmp_path, monkeypatch).items():
        assert len(calls) == 1, (host, calls)
        assert calls[0].startswith(("HostSnapshot(", "SglangHostState(")), calls


CASES = stagecase.case_files()


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_no_fact_of_the_project_is_read_twice_in_a_run(path, tmp_path, monkeypatch):
    """Whatever a run changes, each of this project's facts is one round trip per host and
    arguments: an operation that fetches one a stage or another operation read, or fetches it
    again when it executes, finds the run's read (pyinfra's own operations, such as
    ``files.directory``, read theirs again when they execute: pyinfra 3.10 keeps no fact)."""
    for host, calls in _every_read(path, tmp_path, monkeypatch).items():
        ours = [c for c in calls if "." not in c.split("(", 1)[0]]
        assert len(ours) == len(set(ours)), (host, ours)


# ------------------------------------------------------------------ the operations' own facts
def _local(command: str) -> list[str]:
    out = subprocess.run(["bash", "-c", command], check=True, capture_output=True, text=True)
    return out.stdout.splitlines()


def test_pathstatus_reports_a_path_as_the_host_state_read_does(tmp_path):
    """PathStatus (one shell command) and ``hoststate.py``'s ``paths`` agree on each kind."""
    (tmp_path / "f").write_text("some bytes\n")
    os.chmod(tmp_path / "f", 0o640)
    (tmp_path / "d").mkdir()
    os.chmod(tmp_path / "d", 0o2750)
    (tmp_path / "l").symlink_to(tmp_path / "d")
    (tmp_path / "broken").symlink_to(tmp_path / "nowhere")
    os.mkfifo(tmp_path / "p")
    for name in ("f", "d", "l", "broken", "p", "absent"):
        path = str(tmp_path / name)
        found = PathStatus().process(_local(PathStatus().command(path=path)))
        assert found == PathState.from_json(remote.path_state(path)), name
    assert PathStatus().process(_local(PathStatus().command(path=str(tmp_path / "f")))).sha256 \
        == hashlib.sha256(b"some bytes\n").hexdigest()
    assert PathStatus().process(_local(PathStatus().command(path=str(tmp_path / "absent")))) \
        is None


def test_servicestatus_parses_systemctl_show():
    show = ["ActiveState=activating", "SubState=auto-restart", "UnitFileState=enabled",
            "NeedDaemonReload=yes", "ExecStart={ path=/x ; argv[]=/x --a=b }"]
    svc = ServiceStatus().process(show)
    assert (svc.active_state, svc.sub_state, svc.enabled) == ("activating", "auto-restart", True)
    assert not svc.started and svc.need_daemon_reload
    assert svc.show["ExecStart"] == "{ path=/x ; argv[]=/x --a=b }"
    assert ServiceStatus().default() == ServiceState()  # no output: systemd knows no such unit
    assert "-p " + ",".join(remote.SHOW_PROPS) in ServiceStatus().command(service="sglang")


# ------------------------------------------------------------------ which read answers what
class FakeHost:
    """A Host as the run's store of reads sees it: its run, and facts answered (counted)."""

    def __init__(self, answers: dict) -> None:
        self.state, self.answers, self.asked = runobj.bare_state(), answers, []
        self.name = "h1"

    def get_fact(self, fact, **kwargs):
        self.asked.append(fact.__name__)
        answer = self.answers[fact]
        return answer(**kwargs) if callable(answer) else answer


SHOW = {"ActiveState": "active", "SubState": "running", "UnitFileState": "enabled"}


def _state(**raw) -> HostState:
    return HostState.from_json({"service": SHOW, **raw})


def test_a_units_state_comes_from_the_read_made_for_it_else_its_own_read():
    fake = FakeHost({SglangHostState: _state(watchdog={"service": {"ActiveState": "inactive"}}),
                     ServiceStatus: ServiceState(active_state="failed")})
    facts.read_host_state(fake, SglangHostState, root="/opt/sglang", service="sglang",
                          watchdog="/var/lib/sglang-watchdog")
    assert facts.service_state(fake, "sglang").serving
    assert facts.service_state(fake, "sglang-watchdog").active_state == "inactive"
    assert fake.asked == ["SglangHostState"]
    # a unit no read was made for (the router's on a server): read once, kept for the run
    assert facts.service_state(fake, "smg").active_state == "failed"
    assert facts.service_state(fake, "smg").active_state == "failed"
    assert fake.asked == ["SglangHostState", "ServiceStatus"]


def test_a_model_folder_is_answered_by_the_read_of_it_or_of_the_folder_it_is_a_revision_of():
    model = {"path": "/m/GLM", "exists": True, "revisions": {
        "GLM@v2": {"path": "/m/GLM@v2", "exists": True}}}
    fake = FakeHost({SglangHostState: lambda **kw: _state(model={"path": kw.get("model")})})
    fake.answers[SglangHostState] = _state(model=model)
    facts.read_host_state(fake, SglangHostState, root="/opt/sglang", model="/m/GLM")
    for path in ("/m/GLM", "/m/GLM@v2", "/m/GLM@v3"):  # v3: listed as absent by that read
        hs = facts.host_state(fake, "/opt/sglang", model=path)
        assert facts.model_state(hs, path).path == path
    assert facts.model_state(facts.host_state(fake, "/opt/sglang", model="/m/GLM@v3"),
                             "/m/GLM@v3").exists is False
    assert fake.asked == ["SglangHostState"]
    # another folder (not a sibling revision) or another root: a read of its own
    fake.answers[SglangHostState] = lambda **kw: _state(model={"path": kw.get("model")})
    facts.host_state(fake, "/opt/sglang", model="/m/GLM-other")
    facts.host_state(fake, "/opt/smg", python="/usr/bin/python3")
    assert fake.asked == ["SglangHostState"] * 3


def test_the_patch_status_is_the_release_record_else_one_read_else_none_for_a_new_venv():
    sha = "ab" * 32
    record = {"state": "applied", "file": "/x.py", "sha256_after": sha, "version": "0.5.12"}
    fake = FakeHost({SglangHostState: _state(releases={
        "old": {"complete": True, "patch": record, "patch_file_sha256": sha},
        "edited": {"complete": True, "patch": record, "patch_file_sha256": "cd" * 32},
        "half": {"complete": False}}), facts.PatchStatus: {"state": "needed"}})
    facts.read_host_state(fake, SglangHostState, root="/opt/sglang")
    args = ("/py", "/site", "/tool")
    assert facts.patch_status(fake, "/opt/sglang", "old", *args)["state"] == "already-applied"
    assert facts.patch_status(fake, "/opt/sglang", "half", *args) is None
    assert facts.patch_status(fake, "/opt/sglang", "new", *args) is None
    assert fake.asked == ["SglangHostState"]
    # the file is no longer the bytes the record describes: the venv's python reads it
    assert facts.patch_status(fake, "/opt/sglang", "edited", *args) == {"state": "needed"}
    assert facts.patch_status(fake, "/opt/sglang", "edited", *args) == {"state": "needed"}
    assert fake.asked == ["SglangHostState", "PatchStatus"]


def test_an_operations_own_read_of_a_root_needs_no_unit(tmp_path):
    """``releases_pruned``'s and ``model_download``'s own read (``SglangHostState`` of a root,
    no unit named) runs ``hoststate.py state`` without ``--service``: the releases and the
    model folder reported, no unit read."""
    rel = tmp_path / "releases" / "r1"
    rel.mkdir(parents=True)
    (rel / ".complete").touch()
    (rel / "release.json").write_text('{"installed_at": "2026-01-01T00:00:00+00:00"}\n')
    command = SglangHostState().command(root=str(tmp_path), python="python3",
                                        model=str(tmp_path / "model"))
    assert "--service" not in command.splitlines()[0]  # the script follows, on stdin
    hs = SglangHostState().process(_local(command))
    assert hs.releases.complete("r1") and hs.releases.metas()["r1"]["installed_at"]
    assert hs.service == ServiceState() and hs.unit_sha256 is None
    assert hs.model.path == str(tmp_path / "model") and hs.model.exists is False
