"""The typed host state (``core.hoststate``): made from the JSON that ``remote/hoststate.py
state`` printed on a testbed host (tests/fixtures/hoststate/), the three meanings of
"running" told apart, the stages' typed operations record, and the host-state read kept for
the operations that compare with it (``facts.read_host_state``, ``operations.path_state``)."""

from __future__ import annotations

import json
from io import StringIO
from pathlib import Path

import pytest
import runobj
from pyinfra.context import ctx_host
from pyinfra.facts.files import Directory, File

from sglang_deploy.core import restart
from sglang_deploy.core.hoststate import HostState, PathState, ServiceState
from sglang_deploy.core.service import StageOps, Trigger
from sglang_deploy.hostops import facts, operations
from sglang_deploy.hostops.facts import HostSnapshot, PathStatus, SglangHostState, Snapshot

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hoststate"


def raw(name: str) -> dict:
    """The object a testbed host printed (``hoststate.py state``; how: the README there)."""
    return json.loads((FIXTURES / f"{name}.json").read_text())


def test_a_deployed_host_reads_as_typed_attributes():
    src = raw("deployed")
    hs = HostState.from_json(src)
    rid = src["current"]
    assert hs.service.serving and hs.service.unit_active and hs.service.started
    assert hs.service.invocation_id == src["service"]["InvocationID"]
    assert hs.service.unit_file_state == "enabled" and hs.service.enabled
    assert hs.releases.current == rid and hs.releases.complete(rid)
    assert hs.releases.get(rid).sglang_version == src["releases"][rid]["sglang_version"]
    assert hs.releases.known_good_release == rid
    assert hs.runs_verified and hs.verified_invocation == src["last_verified"]["invocation"]
    assert hs.platform.python == src["python"] and hs.platform.glibc == src["glibc"]
    assert "root" in hs.users and hs.uv_version == src["uv_version"]
    unit = hs.paths["/etc/systemd/system/sglang.service"]
    assert unit.kind == "file" and unit.mode == "644" and len(unit.sha256) == 64
    assert hs.paths["/opt/sglang/current"].links_to(f"/opt/sglang/releases/{rid}")
    assert hs.paths["/opt/sglang"].is_dir("root", "755")
    assert hs.raw == src  # the wire form stays at hand (the plan's status row)
    # every path reported reads back as it came
    assert {p: v.as_json() if v else None for p, v in hs.paths.items()} == src["paths"]


def test_a_bare_host_reads_as_nothing_installed_and_nothing_running():
    hs = HostState.from_json(raw("bare"))
    assert not (hs.service.serving or hs.service.unit_active or hs.service.up)
    assert hs.service.invocation_id is None and not hs.runs_verified
    assert dict(hs.releases.installed) == {} and hs.releases.current is None
    assert hs.releases.known_good is None and hs.releases.known_good_release is None
    assert hs.paths["/opt/sglang"] is None  # asked for, absent
    assert hs.secrets_sha256 is None and hs.last_verified is None


def test_missing_keys_read_as_absent():
    hs = HostState.from_json({})
    assert hs.service == ServiceState() and hs.releases.current is None
    assert dict(hs.paths) == {} and hs.users == frozenset() and hs.platform.python is None


@pytest.mark.parametrize("active, sub, serving, unit_active, up, started", [
    ("active", "running", True, True, True, True),
    ("active", "exited", False, True, True, True),       # up, but no process serves
    ("reloading", "reload", False, False, True, True),
    ("activating", "start", False, False, True, True),   # starting: a start changes nothing
    ("activating", "auto-restart", False, False, True, False),  # waiting after a crash
    ("deactivating", "stop-sigterm", False, False, False, False),
    ("inactive", "dead", False, False, False, False),
    ("failed", "failed", False, False, False, False),
    ("", "", False, False, False, False),                # no such unit
])
def test_the_three_meanings_of_running(active, sub, serving, unit_active, up, started):
    svc = ServiceState.from_json({"ActiveState": active, "SubState": sub})
    assert (svc.serving, svc.unit_active, svc.up, svc.started) == \
        (serving, unit_active, up, started)


def test_the_service_started_operation_and_the_probe_plan_agree_on_serving():
    svc = ServiceState.from_json({"ActiveState": "activating", "SubState": "auto-restart"})
    assert not svc.started and svc.state_text == "activating/auto-restart"
    assert ServiceState().state_text == "?/?"


class _Op:
    def __init__(self, will_change: bool):
        self.will_change = will_change


def test_the_ops_record_keys_its_triggers_by_the_restart_reasons_names():
    ops = StageOps(triggers={Trigger.RELEASE: _Op(True)})
    facts = restart.Facts(unit_sha256=restart.sha256_text("u"),
                          secrets_sha256=restart.sha256_text("s"), active=True)
    reasons = restart.decide(facts, restart.Wanted("u", "s", "rel", changing=("release",))
                             ).triggers
    assert reasons == ["release"] and type(reasons[0]) is str
    # the stages find a reason's operation by the reason's name
    triggers = {"unit": _Op(False), **ops.triggers}
    assert triggers["release"] is ops.triggers[Trigger.RELEASE]
    assert [t.value for t in Trigger] == list(restart.TRIGGERS) == ["release", "patch", "model"]
    with pytest.raises(AttributeError):
        Trigger.RELAESE  # noqa: B018  (a misspelt trigger fails, it is not a new key)


class FakeHost:
    """A pyinfra host's surface the operations use: facts answered from FACTS (counted),
    noops recorded."""

    def __init__(self, state, answers: dict):
        self.state, self.answers, self.asked, self.noops = state, answers, [], []
        self.name = "h1"

    def get_fact(self, fact, **kwargs):
        self.asked.append((fact.__name__, kwargs.get("path")))
        answer = self.answers[fact]
        return answer(**kwargs) if callable(answer) else answer

    def noop(self, text: str) -> None:
        self.noops.append(text)

    def get_temp_filename(self, dest: str) -> str:
        return "/tmp/x"


def _snapshot_host(answers: dict | None = None):
    hs = HostState.from_json(raw("deployed"))
    return FakeHost(runobj.bare_state(), {HostSnapshot: Snapshot(state=hs, gpu={}, output=""),
                               SglangHostState: hs, **(answers or {})}), hs


def test_the_host_state_is_read_once_per_run_and_kept_for_the_operations():
    fake, hs = _snapshot_host()
    kwargs = {"root": "/opt/sglang", "service": "sglang", "secrets": "/etc/sglang/secrets.env"}
    first = facts.read_host_state(fake, HostSnapshot, **kwargs)
    assert facts.read_host_state(fake, HostSnapshot, **kwargs) is first
    assert len(fake.asked) == 1  # one round trip
    # what the operations compare, answered by that read: no round trip more
    assert facts.path_state(fake, "/opt/sglang") == hs.paths["/opt/sglang"]
    assert facts.secrets_sha256(fake, "/etc/sglang/secrets.env") == hs.secrets_sha256
    assert facts.service_state(fake, "sglang") == hs.service
    assert facts.host_state(fake, "/opt/sglang") is hs
    assert len(fake.asked) == 1
    fake.state = runobj.bare_state()  # a new pyinfra run: nothing kept from the last one
    fake.answers[PathStatus] = None
    assert facts.path_state(fake, "/opt/sglang") is None  # its own read now
    assert fake.asked[-1] == ("PathStatus", "/opt/sglang")
    facts.read_host_state(fake, HostSnapshot, **kwargs)
    assert len(fake.asked) == 3


def _run(op, **kwargs) -> list:
    return list(op._inner(**kwargs))


def test_a_file_the_read_reported_as_up_to_date_costs_no_round_trip():
    fake, hs = _snapshot_host()
    facts.read_host_state(fake, SglangHostState, root="/opt/sglang")
    fake.asked.clear()
    unit = hs.paths["/etc/systemd/system/sglang.service"]
    with ctx_host.use(fake):
        assert operations.path_state("/etc/systemd/system/sglang.service") == unit
        assert _run(operations.directories, dirs=[("/opt/sglang", "root", "755")]) == []
        assert _run(operations.symlink, path="/opt/sglang/current",
                    target=hs.paths["/opt/sglang/current"].target) == []
    assert fake.asked == [] and len(fake.noops) == 2


def _path_answer(**found):
    """``PathStatus`` answered from FOUND (path -> PathState; absent otherwise)."""
    return lambda path: found.get(path)


def test_a_path_the_read_left_out_is_its_own_read_not_uploaded_blindly():
    body = "exact bytes\n"
    import hashlib

    digest = hashlib.sha256(body.encode()).hexdigest()
    fake, _ = _snapshot_host({PathStatus: _path_answer(**{"/opt/sglang/extra.json": PathState(
        kind="file", user="root", group="root", mode="644", sha256=digest)}),
        Directory: None})  # read by pyinfra's files.directory, which makes a folder
    facts.read_host_state(fake, SglangHostState, root="/opt/sglang")
    fake.asked.clear()
    with ctx_host.use(fake):
        assert _run(operations.file_content, src=StringIO(body), dest="/opt/sglang/extra.json",
                    mode="644") == []
        assert fake.noops == ["/opt/sglang/extra.json is up to date"]
        # one read for the path (its kind, mode and sha256 together)...
        assert fake.asked == [("PathStatus", "/opt/sglang/extra.json")]
        # ...kept for the run: other bytes compared with the same read, and uploaded
        assert _run(operations.file_content, src=StringIO("new\n"), dest="/opt/sglang/extra.json",
                    mode="644")
        assert fake.asked == [("PathStatus", "/opt/sglang/extra.json")]
        # a folder the read did not list and its own read finds absent: made
        assert _run(operations.directories, dirs=[("/opt/sglang/new", "root", "755")])
        assert fake.asked[1] == ("PathStatus", "/opt/sglang/new")


def test_the_secrets_are_compared_with_the_read_of_that_file_else_its_own_read():
    body = "SGLANG_API_KEY=x\n"
    import hashlib

    fake, hs = _snapshot_host({PathStatus: _path_answer(**{"/etc/router/secrets.env": PathState(
        kind="file", user="root", group="root", mode="600",
        sha256=hashlib.sha256(body.encode()).hexdigest())})})
    facts.read_host_state(fake, SglangHostState, root="/opt/sglang",
                          secrets="/etc/sglang/secrets.env")
    fake.asked.clear()
    with ctx_host.use(fake):
        # the read's digest is another file's: uploaded, no round trip spent on comparing
        assert hs.secrets_sha256 != hashlib.sha256(body.encode()).hexdigest()
        assert _run(operations.secret_file, path="/etc/sglang/secrets.env", content=body)
        assert fake.asked == []
        # a secrets file the read did not cover: its own PathStatus, equal: nothing to do
        assert _run(operations.secret_file, path="/etc/router/secrets.env", content=body) == []
        assert fake.asked == [("PathStatus", "/etc/router/secrets.env")]


def test_path_state_wire_form_round_trips():
    for wire in ({"kind": "dir", "user": "root", "group": "root", "mode": "755"},
                 {"kind": "file", "user": "root", "group": "root", "mode": "600", "sha256": "ab"},
                 {"kind": "link", "user": "root", "group": "root", "mode": "777", "target": "/x"}):
        assert PathState.from_json(wire).as_json() == wire
    assert PathState.from_json(None) is None


def test_the_release_operations_compare_with_the_read_of_their_root_else_their_own_fact():
    from sglang_deploy.hostops import releaseops
    from sglang_deploy.hostops.facts import FileCount, UvVersion

    src = raw("deployed")
    fake, hs = _snapshot_host({UvVersion: "0.0.1", File: None, FileCount: 3})
    facts.read_host_state(fake, SglangHostState, root="/opt/sglang", cache="/var/cache/sglang")
    fake.asked.clear()
    with ctx_host.use(fake):
        assert _run(releaseops.tool_venv, root="/opt/sglang", python="/usr/bin/python3",
                    uv_version=src["uv_version"]) == []
        assert _run(releaseops.release_venv, root="/opt/sglang", release_id=src["current"],
                    python="/usr/bin/python3", lock_path="/x.lock") == []
        assert _run(releaseops.cache_seeded, seed="s.tar.gz", cache_dir="/var/cache/sglang",
                    user="sglang") == []
        assert fake.asked == []  # all three answered by the read
        # another root (a router's): each asks its own fact, and acts on what it says
        assert _run(releaseops.tool_venv, root="/opt/smg", python="/usr/bin/python3",
                    uv_version=src["uv_version"])
        assert _run(releaseops.cache_seeded, seed="s.tar.gz", cache_dir="/var/cache/other",
                    user="sglang") == []  # FileCount: 3 files there, not seeded
    assert fake.asked == [("UvVersion", None), ("FileCount", "/var/cache/other")]
    assert fake.noops[-1] == "/var/cache/other already holds 3 files: not seeded"
    assert hs.cache_files == src["cache_files"]


@pytest.mark.parametrize("fact, output, want", [
    ("UvVersion", ["uv 0.9.5"], "0.9.5"), ("UvVersion", [], None),
    ("FileCount", ["12"], 12), ("FileCount", [""], 0),
])
def test_the_fallback_facts_parse_their_output(fact, output, want):
    assert getattr(facts, fact)().process(output) == want


def test_the_snapshot_fact_types_a_real_snapshot_once():
    """The pre-flight's one round trip as a testbed host answered it (snapshot-hs3.txt):
    the host-state part typed, the GPU sections kept, the open test moved to its section."""
    lines = (FIXTURES / "snapshot-hs3.txt").read_text().splitlines()
    snap = HostSnapshot().process(lines)
    assert isinstance(snap.state, HostState) and snap.state.service.serving
    assert set(snap.gpu) == {"query-gpu.csv", "topo-m.txt", "topo-p2p-r.txt", "topo-p2p-w.txt",
                             "dev-nvidia.txt", "dev-open.txt"}
    assert all(section["rc"] == 0 for section in snap.gpu.values())
    # (the testbed's nodes: no driver instance answers the open, ENXIO)
    assert "dev_open" not in snap.state.raw
    assert "/dev/nvidia0 ENXIO" in snap.gpu["dev-open.txt"]["out"]
    assert snap.output.strip().splitlines()[-1].startswith("{")
    assert snap.state.paths["/opt/sglang/current"].kind == "link"
