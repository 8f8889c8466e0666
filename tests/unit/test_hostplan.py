"""One host's plan (``core.hostplan``): made once by ``hostplan.plan`` from the host's facts
and its Settings, frozen; a stage that learns something returns a new plan and leaves the
one it got as it was; a group's node gets the very plan its own pre-flight makes (one
function, no callback)."""

from __future__ import annotations

import dataclasses

import pytest
import stagecase

from sglang_deploy.core import data, hostplan, service
from sglang_deploy.core.service import Trigger
from sglang_deploy.hostops.facts import CudaProbe, HostSnapshot

LOCK = stagecase.REPO / "locks" / "testbed.txt"
RECORDED_OFF = {"/hoststate.json/out/p2p_verified/nccl_env": {"NCCL_P2P_DISABLE": "1"}}


def _release() -> hostplan.Release:
    text = LOCK.read_text()
    return (*service.release_of_lock(text, str(LOCK)), text)


def _settings(**keys):
    return data.resolve({**stagecase.base_data(), "ssh_hostname": "10.226.0.12", **keys},
                        environ={})


def _snapshot(label: str = "serving", set_: dict | None = None):
    raw = stagecase.resolve_raw({"$file": f"{label}/HostSnapshot.json", "set": set_ or {}})
    return HostSnapshot().process(stagecase.raw_lines("HostSnapshot", raw))


def _probe(label: str = "serving") -> dict:
    raw = stagecase.resolve_raw({"$file": f"{label}/CudaProbe.json"})
    return CudaProbe().process(stagecase.raw_lines("CudaProbe", raw))


def _plan(s=None, snap=None, **kwargs) -> hostplan.HostPlan:
    s, snap = s or _settings(), snap or _snapshot()
    return hostplan.plan(s, _release(), snap.state, snap.gpu, kwargs.pop("probe", None),
                         **kwargs)


# ------------------------------------------------------------------ made from the facts
def test_a_serving_verified_hosts_plan_keeps_the_recorded_verdict_and_reads_no_probe():
    s, snap = _settings(), _snapshot()
    assert hostplan.probe_kind(s, snap.state, read_only=False) == "none"
    hp = _plan(s, snap)
    assert hp.probe == "none" and hp.p2p_skipped and hp.p2p_record is None
    checks = {c.name: c for c in hp.checks}
    assert checks["cuda-init"].status == "pass" and "CUDA probe skipped" in \
        checks["cuda-init"].message
    assert [c.name for c in hp.checks][:2] == ["host-python", "host-glibc"]  # first, as ever
    assert hp.group is None and hp.group_env == {} and hp.patch_state == "unknown"
    assert hp.restart is None and hp.ops == service.StageOps()
    # what it renders: the unit of this release, its environment with the NCCL verdict
    assert f"releases/{hp.release_id}/venv/bin/python" in hp.unit_text()
    # a read-only run leaves the GPUs of a unit that is up alone, and says so
    ro = _plan(s, snap, read_only=True)
    assert "read-only command" in {c.name: c for c in ro.checks}["cuda-init"].message


def test_the_recorded_nccl_verdict_reaches_the_unit_and_the_verifier():
    hp = _plan(snap=_snapshot(set_=RECORDED_OFF))
    assert hp.nccl_env == {"NCCL_P2P_DISABLE": "1"}
    assert "NCCL_P2P_DISABLE=1" in hp.unit_text()
    assert hp.verify_params()["nccl_env"] == {"NCCL_P2P_DISABLE": "1"}


def test_a_host_with_free_gpus_reads_the_full_probe_and_keeps_its_record():
    s, snap = _settings(), _snapshot("bare")
    assert hostplan.probe_kind(s, snap.state, read_only=False) == "p2p"
    hp = _plan(s, snap, probe=_probe("bare"))
    assert hp.probe == "p2p" and not hp.p2p_skipped
    assert hp.p2p_record is not None and hp.p2p_record["verified"]
    # a probe that should have run and gave nothing fails the checks (never guessed)
    none = _plan(s, snap, probe=None)
    assert {c.name: c.status for c in none.checks}["cuda-probe"] == "fail"
    assert none.p2p_record is None


def test_a_new_model_revision_is_planned_in_its_own_folder():
    s = _settings(sglang_model_download=True, sglang_model_repo="org/m",
                  sglang_model_revision="v2")
    serving_v1 = _snapshot(set_={"/hoststate.json/out/model/fetched": {"repo": "org/m",
                                                                        "revision": "v1"}})
    hp = _plan(s, serving_v1)
    assert _plan(s).settings is s  # the folder holds no record: it is the revision's
    assert hp.settings.sglang_model_path == f"{s.sglang_model_path}@v2"
    assert hp.settings.served_model_name == s.served_model_name
    assert hp.hoststate.model is not None and \
        hp.hoststate.model.path == hp.settings.sglang_model_path
    assert f"{s.sglang_model_path}@v2" in hp.unit_text()


# ------------------------------------------------------------------ frozen
def test_the_plan_is_frozen_and_so_are_the_operations_it_hands_on():
    hp = _plan()
    for field, value in (("nccl_env", {}), ("restart", None), ("patch_state", "applied"),
                         ("verify_running", True)):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(hp, field, value)
    with pytest.raises(dataclasses.FrozenInstanceError):
        hp.ops.started = object()


def test_what_a_stage_learns_is_a_new_plan():
    hp = _plan()
    patched = hp.with_patch({"state": "already-applied", "file": "x.py"})
    assert patched is not hp and patched.patch_state == "already-applied"
    assert hp.patch_state == "unknown" and hp.patch_status is None
    # the unit says "applied" either way: it does not change between runs
    assert hp.with_patch(None).unit_text() == patched.unit_text()
    assert hp.with_patch({"state": "needed"}).patch_state == "applied"
    off = _plan(_settings(sglang_autotune_patch=False)).with_patch(None)
    assert off.patch_state == "disabled" and "patch" not in off.changing()


def test_a_retest_gives_a_new_plan_with_its_verdict_the_stages_one_unchanged():
    hp = _plan(snap=_snapshot(set_=RECORDED_OFF)).with_patch(None)
    new = hp.retested(_probe())
    assert new is not hp and new.probe == "p2p" and not new.p2p_skipped
    assert new.nccl_env == {} and new.p2p_record is not None   # P2P works again
    assert hp.nccl_env == {"NCCL_P2P_DISABLE": "1"} and hp.p2p_record is None
    assert "NCCL_P2P_DISABLE" not in new.unit_text() and "NCCL_P2P_DISABLE" in hp.unit_text()
    assert new.verify_params()["nccl_env"] == {}


def test_the_restart_decisions_inputs_come_from_the_plan():
    hp = _plan().with_patch({"state": "already-applied"})
    wanted = hp.wanted()
    assert wanted.unit_text == hp.unit_text() and wanted.release == hp.release_id
    assert wanted.p2p_skipped and wanted.changing == hp.changing()
    assert hp.restart_facts().active  # it serves


# ------------------------------------------------------------------ through deploy.py
def _traced(monkeypatch, case_name: str) -> tuple[dict, list]:
    """CASE_NAME's stages run through deploy.py (the stage-case harness), each stage's
    (host, stage, plan given, plan returned) recorded."""
    from pyinfra import host

    from sglang_deploy.stages import stages

    seen: list = []
    for name in ("preflight_stage", "runtime_stage", "service_stage"):
        real = getattr(stages, name)

        def traced(*args, _real=real, _name=name):
            given = args[0] if args else None
            made = _real(*args)
            seen.append((host.name, _name, given, made))
            return made

        monkeypatch.setattr(stages, name, traced)
    return stagecase.load(stagecase.CASES / f"{case_name}.json"), seen


def test_each_stage_returns_a_new_plan_and_leaves_the_one_it_got(tmp_path, monkeypatch):
    case, seen = _traced(monkeypatch, "new_release")
    got = stagecase.run_case(case, tmp_path, monkeypatch)
    assert all("error" not in h for h in got.values()), got
    stages_of = {stage: (given, made) for _, stage, given, made in seen}
    _, first = stages_of["preflight_stage"]
    given, made = stages_of["runtime_stage"]
    assert given is first and made is not given
    assert dict(given.ops.triggers) == {} and given.patch_state == "unknown"
    assert Trigger.RELEASE in made.ops.triggers and made.patch_state != "unknown"
    given, made = stages_of["service_stage"]
    assert given is stages_of["runtime_stage"][1] and made is not given
    assert given.restart is None and given.ops.started is None
    assert made.restart is not None and made.restart.reasons and made.ops.started is not None
    assert made.ops.triggers == given.ops.triggers  # handed on as they were


def test_a_group_nodes_plan_is_the_one_its_own_preflight_makes(tmp_path, monkeypatch):
    """The group's decision reads every node's plan (``groupprep.node_view``): the unit and
    the reasons it decides on are those of the plan the node's own stages make."""
    from sglang_deploy.stages.group import groupprep

    case, seen = _traced(monkeypatch, "group_restarted_by_peer")
    views = {}
    real_view = groupprep.node_view

    def node_view(h, *args):
        views[h.name] = real_view(h, *args)
        return views[h.name]

    monkeypatch.setattr(groupprep, "node_view", node_view)
    got = stagecase.run_case(case, tmp_path, monkeypatch)
    assert all("error" not in h for h in got.values()), got
    own = {name: made for name, stage, _, made in seen if stage == "runtime_stage"}
    assert set(own) == set(views) == {"fx1", "fx2"}
    for name, mine in own.items():
        viewed = views[name]
        assert mine is not viewed and mine.group is not None
        assert mine.unit_text() == viewed.unit_text()
        assert mine.wanted() == viewed.wanted()
        assert (mine.nccl_env, mine.group_env, mine.patch_state) == \
            (viewed.nccl_env, viewed.group_env, viewed.patch_state)


# ------------------------------------------------------------------ the retest, executed
class _Host:
    """The host the retest runs on: its shell commands and its written files recorded."""

    name, print_prefix = "fx2", "[fx2] "

    def __init__(self) -> None:
        self.commands: list[str] = []

    def run_shell_command(self, command, **_):
        self.commands.append(command)
        return True, None


def test_the_retest_rewrites_the_unit_with_its_verdict_and_the_verifier_follows(monkeypatch):
    """Executed once the server stopped (``p2pretest.retest``): the verdict it proves (P2P
    works again) renders the unit again and is what the verification records; the plan the
    stages made is left as it was."""
    from pyinfra.context import ctx_host

    from sglang_deploy.hostops import operations as ops
    from sglang_deploy.stages import p2pretest, p2pview
    from sglang_deploy.stages.group import groupprep

    hp = _plan(snap=_snapshot(set_=RECORDED_OFF)).with_patch(None)
    box = p2pretest.Retested()
    staged = dataclasses.replace(hp, ops=dataclasses.replace(hp.ops, retest=box))
    assert p2pretest.latest(staged) is staged   # before it ran
    written: dict[str, object] = {}
    monkeypatch.setattr(groupprep, "probe", lambda h, s, kind: _probe() if kind == "p2p" else None)
    monkeypatch.setattr(p2pview, "show", lambda *a, **k: None)
    monkeypatch.setattr(ops, "write_json_record", lambda path, doc: written.update({path: doc}))
    monkeypatch.setattr(ops, "write_text", lambda path, text: written.update({path: text}))
    fake = _Host()
    with ctx_host.use(fake):
        p2pretest.retest(staged, box)
    assert written[hp.layout.p2p_record]["nccl_env"] == {}
    assert "NCCL_P2P_DISABLE" not in written[hp.layout.unit_file]
    assert fake.commands == ["systemctl daemon-reload"]
    assert p2pretest.latest(staged).verify_params()["nccl_env"] == {}
    assert staged.nccl_env == {"NCCL_P2P_DISABLE": "1"}   # the stages' plan unchanged
    with pytest.raises(RuntimeError, match="twice"):
        box.keep(staged)
