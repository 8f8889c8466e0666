"""The host's records, typed (``core.hostrecords``, ``core.hoststate``): each ``from_json``
reads the wire form a real host printed (tests/fixtures/hoststate/, a model folder read by
``remote/hoststate.py``, a real nvidia-smi capture, the watchdog's own event) into attributes;
an absent, empty or odd record reads as no record, and an odd value inside one as unknown,
never as a good answer."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from sglang_deploy.core import gpuhealth, hardening, preflight, residency, service
from sglang_deploy.core import watchdog as wd
from sglang_deploy.core.errors import RollbackError
from sglang_deploy.core.hostrecords import (
    Answer,
    Fetched,
    GpuHealthRead,
    Hardening,
    KernelLog,
    KnownGood,
    LastRestart,
    LastVerified,
    Memory,
    ModelState,
    P2PVerified,
    PatchRecord,
    QueryAnswer,
    Shard,
)
from sglang_deploy.core.hoststate import HostState, ServiceState, WatchdogRead
from sglang_deploy.integration import plan
from testbed.sim.model import make_model_dir

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
REMOTE = Path(__file__).resolve().parents[2] / "sglang_deploy" / "remote"


def deployed() -> dict:
    """What `hoststate.py state` printed on a deployed testbed host."""
    return json.loads((FIXTURES / "hoststate" / "deployed.json").read_text())


#: what no record, or a record that is not one, reads as: every record the same way
NOT_RECORDS = [None, {}, [], "x", 3]

RECORDS = [LastVerified, LastRestart, P2PVerified, Hardening, ModelState, Memory, GpuHealthRead,
           WatchdogRead, PatchRecord, KnownGood]


@pytest.mark.parametrize("cls", RECORDS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("raw", NOT_RECORDS, ids=repr)
def test_an_absent_empty_or_odd_record_is_no_record(cls, raw):
    assert cls.from_json(raw) is None


def test_a_bare_host_has_none_of_the_records():
    hs = HostState.from_json(json.loads((FIXTURES / "hoststate" / "bare.json").read_text()))
    assert (hs.last_verified, hs.p2p_verified, hs.hardening, hs.model, hs.memory, hs.gpu_health,
            hs.watchdog, hs.releases.known_good) == (None,) * 8
    assert hs.previous_restart is None and hs.verified_invocation is None


# ------------------------------------------------------------------ last-verified.json

def test_last_verified_of_a_deployed_host():
    src = deployed()
    hs = HostState.from_json(src)
    assert hs.last_verified == LastVerified(invocation=src["last_verified"]["invocation"],
                                            verified_at="2026-12-04T22:57:07+00:00")
    assert hs.runs_verified  # its unit runs the very invocation the record names


def test_the_last_restart_keeps_its_entry_as_recorded():
    entry = {"at": "2026-12-05T18:20:00+00:00", "action": "restarted", "why": "flags changed",
             "reasons": [{"name": "unit", "text": "flags changed: tp-size 8 -> 4"}],
             "a-later-field": 1}
    hs = HostState.from_json({"last_verified": {"invocation": "abc", "last_restart": entry}})
    got = hs.last_verified.last_restart
    assert (got.at, got.action, got.why) == (entry["at"], "restarted", "flags changed")
    assert list(got.reasons) == entry["reasons"]
    assert dict(hs.previous_restart) == entry  # a run that restarts nothing keeps it whole
    odd = LastRestart.from_json({"at": 5, "why": None, "reasons": "unit"})
    assert (odd.at, odd.why, odd.reasons) == (None, "", ())


def test_an_odd_invocation_matches_no_running_unit():
    """An invocation that is not a string (a hand-edited file) is unknown: the probe still
    runs (``basic``), the serving unit is not taken as verified."""
    src = deployed()
    src["last_verified"]["invocation"] = 12
    hs = HostState.from_json(src)
    assert hs.last_verified.invocation is None and not hs.runs_verified
    assert preflight.probe_plan(hs.service, hs.last_verified, hs.p2p_verified, "auto") == "basic"


# ------------------------------------------------------------------ p2p-verified.json

def test_p2p_verified_of_a_deployed_host():
    hs = HostState.from_json(deployed())
    assert hs.p2p_verified == P2PVerified(gpus=8, policy="require", nccl_env={},
                                          verified=("p2p-data", "p2p-bandwidth"))


def test_what_the_deploy_writes_reads_back():
    checks = [preflight.Check("p2p-data", "pass", "", details={"gpus": 4}),
              preflight.Check("p2p-bandwidth", "pass", "")]
    written = preflight.p2p_record(checks, {"NCCL_P2P_DISABLE": "1"}, "adapt")
    got = P2PVerified.from_json(json.loads(json.dumps(written)))
    assert (got.gpus, got.policy, dict(got.nccl_env)) == (4, "adapt", {"NCCL_P2P_DISABLE": "1"})


def test_odd_p2p_values_read_as_unknown():
    got = P2PVerified.from_json({"gpus": "8", "policy": 1, "nccl_env": ["x"], "verified": "all"})
    assert got == P2PVerified()  # still a record: a verdict was kept, its figures unknown


# ------------------------------------------------------------------ hardening.json

def test_hardening_of_a_deployed_host():
    src = deployed()
    got = HostState.from_json(src).hardening
    assert got.checked_at == src["hardening"]["checked_at"]
    by_name = {p.name: p for p in got.properties}
    assert [p["name"] for p in src["hardening"]["properties"]] == list(by_name)
    assert by_name["NoNewPrivileges"].in_force is True
    assert by_name["DevicePolicy"].in_force is False and "23198" in by_name["DevicePolicy"].why


def test_an_in_force_that_is_not_a_boolean_cannot_be_told_never_in_force():
    rec = Hardening.from_json({"properties": [
        {"name": "NoNewPrivileges", "in_force": "yes"}, {"name": "SystemCallFilter"},
        {"in_force": True}, "odd"]})
    assert [(p.name, p.in_force) for p in rec.properties] == [
        ("NoNewPrivileges", None), ("SystemCallFilter", None)]
    assert hardening.summary(rec)["unknown"] == ["NoNewPrivileges", "SystemCallFilter"]
    assert hardening.summary(rec)["in_force"] == []


# ------------------------------------------------------------------ the model and the memory

def test_a_model_folder_as_the_host_state_read_reports_it(tmp_path):
    folder = make_model_dir(tmp_path / "GLM", n_shards=2, shard_bytes=4096)
    sys.path.insert(0, str(REMOTE))
    try:
        import hoststate as remote
    finally:
        sys.path.remove(str(REMOTE))
    raw = remote.model_state(str(folder))
    got = ModelState.from_json(raw)
    assert got.path == str(folder) and got.exists and got.config and got.index
    assert set(got.shards) == set(raw["shards"]) and got.revisions == {}
    shard = next(iter(got.shards.values()))
    assert shard.exists and shard.size == shard.expected_size and shard.error is None
    assert preflight.check_model(got, str(folder))[0].status == "pass"
    assert got.fetched is None  # copied by hand: no record of a download


def test_the_model_read_of_a_stage_fixture_and_its_memory():
    snap = json.loads((FIXTURES / "stagecases" / "unverified" / "HostSnapshot.json").read_text())
    hs = HostState.from_json(snap["hoststate.json"]["out"])
    assert hs.memory == Memory(available=21474836480, total=25276194816)
    res = residency.Residency.of(hs.model, hs.memory)
    assert res.shards == len(hs.model.shards) == 5 and res.percent == 0


def test_odd_shard_values_read_as_unknown_never_complete():
    got = ModelState.from_json({
        "path": "/m", "exists": True, "config": True, "fetched": {"repo": 1, "revision": "v1"},
        "shards": {"a": {"exists": "yes", "size": 10}, "b": {"exists": True, "size": "10",
                                                              "resident": 2.5},
                   "c": None},
        "revisions": {"m@v2": {"path": "/m@v2", "exists": False}, "m@v3": {}}})
    assert got.shards["a"] == Shard(exists=False, size=10)  # "yes" is not a yes
    assert got.shards["b"] == Shard(exists=True)  # a size that is not a number: unknown
    assert got.shards["c"] == Shard()
    assert got.fetched == Fetched(revision="v1") and list(got.revisions) == ["m@v2"]
    assert preflight.check_model(got, "/m")[0].status == "fail"
    assert residency.Residency.of(got, Memory.from_json({"available": "lots"})) is None
    assert Memory.from_json({"available": True, "total": 2.0}) == Memory(total=2)


# ------------------------------------------------------------------ the GPU health read

def _capture_read(**kernel) -> dict:
    """A health read whose query is a real H100 capture (projected as the test of
    ``core.gpuhealth`` does), and whose kernel log is KERNEL."""
    from test_gpuhealth import H100, project

    return {"query": {"rc": 0, "out": project(H100), "fields": list(gpuhealth.HEALTH_FIELDS),
                      "dropped": []},
            "xml": None, "kernel": kernel or {"rc": 0, "lines": [], "scanned": 1200},
            "dcgm": None}


def test_a_real_capture_reads_as_typed_answers_and_judges_healthy():
    raw = _capture_read()
    got = GpuHealthRead.from_json(raw)
    assert got.query.rc == 0 and got.query.out == raw["query"]["out"]
    assert got.query.fields == gpuhealth.HEALTH_FIELDS and got.query.dropped == ()
    assert got.kernel == KernelLog(rc=0) and got.xml is None and got.dcgm is None
    assert gpuhealth.evaluate(got, 1).verdict == "healthy"


@pytest.mark.parametrize("query", [
    {"rc": "0", "out": "ignored"},        # an exit status that is not a number
    {"rc": None, "out": "", "error": "`nvidia-smi` did not finish within 20 s (killed)"},
    {"out": "0, 00000000:01:00.0"},        # no exit status at all
    "not an answer",
])
def test_an_odd_or_missing_answer_is_unknown_never_healthy(query):
    raw = {**_capture_read(), "query": query}
    got = GpuHealthRead.from_json(raw)
    assert got.query is None or got.query.rc is None
    assert gpuhealth.evaluate(got, 1).verdict == "unknown"


def test_an_odd_kernel_log_or_dcgm_answer_is_unreadable_not_clean():
    got = GpuHealthRead.from_json({**_capture_read(), "kernel": {"rc": "0", "lines": "Xid"},
                                   "dcgm": {"rc": 0, "out": 5}})
    assert got.kernel == KernelLog() and got.dcgm == Answer(rc=0, out="")
    codes = {f.code for f in gpuhealth.evaluate(got, 1).findings}
    assert {"kernel-log-unreadable", "dcgm-unreadable"} <= codes
    assert QueryAnswer.from_json({"fields": ["index", 3], "dropped": None}).fields == ("index",)


# ------------------------------------------------------------------ the watchdog

def _event(**kw) -> dict:
    """An event as remote/watchdog.py appends it to events.jsonl."""
    return {"at": 1000.5, "at_iso": "2026-12-05T10:00:00Z", "host": "h1", "verdict": "wedged",
            "evidence": ["1-token generation failed 3 time(s) in a row"], "action": "restart",
            "reason": "watchdog=restart", "invocation": "a1", "outcome": "restarted and verified",
            "steps": [], "took_s": 12.0, "new_invocation": "b2", **kw}


def test_the_watchdog_read_as_the_host_state_read_brings_it():
    raw = {"service": {"LoadState": "loaded", "ActiveState": "active", "SubState": "running"},
           "events": [_event(), "torn line", _event(action="report", outcome="reported")],
           "now": 1100, "state": {"verdict": "healthy", "at": 1090, "judge": {}}}
    got = WatchdogRead.from_json(raw)
    assert got.service.serving and got.now == 1100
    assert (got.state.verdict, got.state.at) == ("healthy", 1090)
    assert [e.action for e in got.events] == ["restart", "report"]  # not an object: left out
    assert dict(got.events[0].raw) == _event()  # shown as the watchdog wrote it
    doc = wd.status_doc(got)
    assert doc["restarts_last_hour"] == 1 and doc["last_event"] == raw["events"][2]
    assert doc["observed_at"] == 1090 and isinstance(doc["observed_at"], int)  # as it came


def test_an_odd_watchdog_state_is_no_observation():
    got = WatchdogRead.from_json({"service": "?", "events": {"a": 1},
                                  "state": {"verdict": 3, "at": "soon"}})
    assert got.service == ServiceState() and got.events == ()
    assert (got.state.verdict, got.state.at) == (None, None)
    assert wd.status_doc(got) is None  # no unit installed, no event


# ------------------------------------------------------------------ patch record, known good

def test_the_patch_record_and_the_known_good_copy_of_a_deployed_host():
    src = deployed()
    hs = HostState.from_json(src)
    rid = src["current"]
    rec = src["releases"][rid]["patch"]
    assert hs.releases.get(rid).patch == PatchRecord(
        state="applied", file=rec["file"], version="0.5.12.post1",
        sha256_after=rec["sha256_after"])
    kg = hs.releases.known_good
    assert dict(kg.record) == src["known_good"]["record"] and kg.release == rid
    assert (kg.unit_sha256, kg.secrets_sha256) == (src["known_good"]["unit_sha256"],
                                                   src["known_good"]["secrets_sha256"])
    assert service.rollback_plan("hs1", hs, "/opt/sglang").params == src["known_good"]["record"]


def test_a_known_good_copy_without_a_record_or_a_release_is_nothing_to_roll_back_to():
    src = deployed()
    assert KnownGood.from_json({**src["known_good"], "record": None}) is None
    src["known_good"]["record"].pop("release")
    hs = HostState.from_json(src)
    assert hs.releases.known_good_release is None
    with pytest.raises(RollbackError) as err:
        service.rollback_plan("hs1", hs, "/opt/sglang")
    assert "names no release" in err.value.found


def test_an_odd_patch_state_is_not_applied():
    rec = PatchRecord.from_json({"state": ["applied"], "file": "/x", "sha256_after": "ab"})
    assert rec.state is None
    from sglang_deploy.core import patch

    assert patch.status_from_record(rec, "ab") is None  # ask the host


# ------------------------------------------------------------------ status from the typed state

def test_status_fields_read_the_typed_state():
    src = deployed()
    hs = HostState.from_json(src)
    got = plan.status_fields(hs, None, "r2")
    assert got["unit"] == "active/running" and got["release"] == src["current"]
    assert got["patch_state"] == "applied" and got["last_verified"] == "2026-12-04T22:57:07+00:00"
    assert got["hardening"]["not_in_force"][0]["name"] == "DevicePolicy"
    # the uptime: from the unit's ActiveEnterTimestampMonotonic and the host's clock
    entered = int(src["service"]["ActiveEnterTimestampMonotonic"])
    assert got["uptime_s"] == round(src["monotonic_now"] - entered / 1e6)
    # a poll's unit wins over the read's
    polled = plan.status_fields(hs, {"service": {"ActiveState": "failed",
                                                 "SubState": "failed"}}, "r2")
    assert polled["unit"] == "failed/failed" and polled["uptime_s"] is None
