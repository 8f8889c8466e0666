"""The stages of deploy.py and rollback.py, as pyinfra deploys: pre-flight, runtime, service,
verify, rollback.

Glue only: each stage reads the host's state (facts), asks the pure modules
(``core.hostplan``, ``core.preflight``, ``core.service``, ...) what to do, and adds operations.
The pre-flight returns the host's plan (``hostplan.HostPlan``: made once from its facts and
Settings, frozen); each later stage takes the plan and returns the next one, with what it
learned (the patch status, the restart decision, the operations a later stage reads), which
deploy.py hands on. Nothing here knows whether a host is simulated.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from io import StringIO
from pathlib import Path

from pyinfra import host, logger, state
from pyinfra.api import deploy
from pyinfra.operations import python, server

from sglang_deploy.controller import flagcache, lockfiles
from sglang_deploy.core import hostplan, modelfetch, restart, service
from sglang_deploy.core import patch as patchmod
from sglang_deploy.core import progress as progressmod
from sglang_deploy.core.errors import DataError, RuntimeSetupError
from sglang_deploy.core.hostplan import HostPlan
from sglang_deploy.core.service import Layout, Trigger
from sglang_deploy.core.unit import render_secrets_env
from sglang_deploy.hostops import operations as ops
from sglang_deploy.hostops import releaseops
from sglang_deploy.hostops.facts import REMOTE, patch_status, serving_poll
from sglang_deploy.integration import outcomes, plan
from sglang_deploy.integration.integration import run_of, this_run
from sglang_deploy.stages import (
    allreduce,
    autotunecarry,
    gpugate,
    p2pretest,
    p2pview,
    rollgate,
    staging,
    warm,
    watchdogstage,
)
from sglang_deploy.stages import restarts as restarts_mod
from sglang_deploy.stages.group import groupops, groupprep, groupstage
from sglang_deploy.stages.verified import verify_and_record


def lock_info(lock_file: str, key: str = "sglang_lock", parse=service.release_of_lock,
              fix: str = "run `sglang-deploy lock locks/NAME.in` or fix `sglang_lock`"
              ) -> tuple[str, str, str]:
    """(release id, version, lock text) of a lock file on the controller, PARSE giving the
    first two (it raises for a bad lock; every host of a fleet names the same lock, parsed
    once: ``lockfile.Lock``). KEY and FIX: the data key, for the error."""
    path = Path(state.cwd or ".") / lock_file
    if not path.is_file():
        raise DataError(key=key, what=f"the lock file named by `{key}` exists",
                        found=f"no file {path}", fix=fix)
    text = lockfiles.read(path).text  # parsed once per text (``lockfile.Lock``)
    return (*parse(text, str(path)), text)


def put_p2p_record(hp: HostPlan) -> None:
    """Keep a passed full P2P test's verdict on the host (a file op: unchanged = no change)."""
    if hp.p2p_record is not None:
        ops.file_content(name="Record of the passed P2P test", mode="644",
                         src=StringIO(json.dumps(hp.p2p_record, sort_keys=True) + "\n"),
                         dest=hp.layout.p2p_record)


@outcomes.stage("preflight")
@deploy("Pre-flight: GPUs, CUDA, P2P and model")
def preflight_stage() -> HostPlan:
    """The pre-flight of this host; returns its plan (``hostplan.plan``, from the facts read
    here and its Settings), which deploy.py hands to the next stages."""
    settings = run_of(state).fleet.settings(host.name)
    release = lock_info(settings.sglang_lock)
    # one round trip: host state and GPU snapshot, run at once (read once per run: a group's
    # peers read it while they are prepared, ``groupprep``)
    snap = groupprep.snapshot(host, settings, release[0])
    hs = snap.state
    if hs is None:
        raise RuntimeSetupError(
            what=f"the host-state read ({settings.sglang_system_python} hoststate.py) to print JSON",
            found="\n".join((snap.output or "").strip().splitlines()[-5:])
            or "no output at all",
            fix=f"check that `{settings.sglang_system_python}` "
            "(sglang_system_python) runs on the host: it is the Python 3 the deploy uses there")
    # Peer copies need GPU memory the running server holds; while it serves, the verdict of
    # the last full test on this host stands, and while it serves a verified invocation, so
    # does that server for the probe itself (``preflight.probe_plan``).
    kind = hostplan.probe_kind(settings, hs, read_only=plan.read_only())
    probe = groupprep.probe(host, settings, kind) if kind != "none" else None
    group = run_of(state).fleet.group_of(host.name) if settings.sglang_group \
        else None
    hp = hostplan.plan(settings, release, hs, snap.gpu, probe, group=group,
                       read_only=plan.read_only())
    checks = list(hp.checks)
    p2pview.show(checks, record=kind == "p2p", policy=settings.gpu_p2p_policy)
    plan.preflight(host.name, checks, hp.nccl_env, hp.matrix, gpu_health=hp.gpu_report)
    ops.preflight_gate(checks, title="pre-flight (GPU, CUDA, P2P, model)")
    return hp


@outcomes.stage("runtime")
@deploy("Runtime: user, folders, uv, release venv, autotune patch")
def runtime_stage(hp: HostPlan) -> HostPlan:
    """The runtime of this host; returns its plan with the patch status and the operations
    whose change restarts the server (``StageOps.triggers``)."""
    s, hs, lay = hp.settings, hp.hoststate, hp.layout
    if s.sglang_user not in hs.users:
        server.user(name=f"Service user {s.sglang_user}", user=s.sglang_user, system=True,
                    home=s.sglang_home, shell="/usr/sbin/nologin", create_home=False)
    else:
        host.noop(f"user {s.sglang_user} exists")
    ops.directories(name="Folders (root, releases, tools, cache, home, secrets, uv cache)",
                    dirs=lay.folders())
    if s.sglang_cache_seed:
        releaseops.cache_seeded(name=f"Caches from {s.sglang_cache_seed}", seed=s.sglang_cache_seed,
                         cache_dir=s.sglang_cache_dir, user=s.sglang_user)
    ops.files_content(name=f"Tools ({', '.join(service.TOOLS)})", mode="755",
                      sources=[(str(Path(patchmod.__file__) if t == "patch.py" else REMOTE / t),
                                lay.tool(t)) for t in service.TOOLS])
    releaseops.tool_venv(name=f"uv {s.sglang_uv_version} in the tool venv", root=s.sglang_root,
                  python=s.sglang_system_python, uv_version=s.sglang_uv_version,
                  wheelhouse=s.sglang_wheelhouse, index_url=s.sglang_index_url)

    put_p2p_record(hp)
    lock_path = lay.release_lock(hp.release_id)
    ops.file_content(
        name=f"Lock of release {hp.release_id}", src=StringIO(hp.lock_text), dest=lock_path,
        mode="644")
    triggers = {Trigger.RELEASE: releaseops.release_venv(
        name=f"Release {hp.release_id} (sglang {hp.sglang_version})", root=s.sglang_root,
        release_id=hp.release_id, python=s.sglang_system_python, lock_path=lock_path,
        wheelhouse=s.sglang_wheelhouse, index_url=s.sglang_index_url, uv_cache=lay.uv_cache,
        packages=progressmod.lock_packages(hp.lock_text),
        meta={"sglang_version": hp.sglang_version, "lock": s.sglang_lock,
              "python": hs.platform.python},
    )}
    known_good = hs.releases.known_good_release
    releaseops.releases_pruned(name=f"Old releases (keep {s.sglang_keep_releases})", root=s.sglang_root,
                        keep=s.sglang_keep_releases, installing=hp.release_id,
                        protected={r for r in (hp.release_id, hs.releases.current, known_good)
                                   if r},
                        python=s.sglang_system_python)
    hp, patched = autotune_patch(hp)
    if patched is not None:
        triggers[Trigger.PATCH] = patched
    if s.sglang_model_download:  # after the release venv (its huggingface_hub), before the service
        triggers[Trigger.MODEL] = model_downloaded(hp)
    return dataclasses.replace(hp, ops=dataclasses.replace(hp.ops, triggers=triggers))


def model_downloaded(hp: HostPlan):
    """The model download (``sglang_model_download``): its operation."""
    s, lay = hp.settings, hp.layout
    return releaseops.model_download(
        name=f"Model {s.sglang_model_repo} -> {s.sglang_model_path}",
        spec=modelfetch.FetchSpec(
            repo=s.sglang_model_repo, revision=s.sglang_model_revision, path=s.sglang_model_path,
            python=hp.venv_python, tool=lay.tool("model_fetch.py"),
            token_file=lay.hf_token_file, endpoint=s.sglang_hf_endpoint,
            timeout_s=s.sglang_model_download_timeout_s, token_env=s.sglang_hf_token_env),
        root=s.sglang_root, python=s.sglang_system_python,
        token=s.secrets.get("HF_TOKEN"), group=s.sglang_user)


def autotune_patch(hp: HostPlan) -> tuple[HostPlan, object]:
    """The FlashInfer autotune patch on the release (``sglang_autotune_patch``): HP with its
    status (``HostPlan.with_patch``, for the verifier and the restart decision: the status the
    operation itself compares, ``facts.patch_status``, read once in the run: the operation
    finds the same), and its operation (None: the patch is off)."""
    lay, s = hp.layout, hp.settings
    if not s.sglang_autotune_patch:
        return hp.with_patch(None), None
    tool = lay.tool("patch_tool.py")
    hp = hp.with_patch(patch_status(host, s.sglang_root, hp.release_id, hp.venv_python,
                                    hp.site, tool))
    return hp, releaseops.autotune_patch(
        name="FlashInfer autotune patch", root=s.sglang_root, release_id=hp.release_id,
        python=hp.venv_python, site=hp.site, tool=tool, record=lay.patch_record(hp.release_id))


def launch_flags_checked(hp: HostPlan):
    """The launch flags checked against the installed sglang's own (the final guard), its
    parsed ``server_args.py`` from the controller's cache when the host's sha256 is there."""
    rel = hp.hoststate.releases.get(hp.release_id)
    # the controller's cache of parsed ``server_args.py`` files (``flagcache``)
    cache_dir = str(Path(state.cwd or ".") / ".sglang-deploy" / "cache" / "flagspec")
    spec = None
    if rel is not None and rel.complete:  # by the host's sha256; fetched only on a cache miss
        spec = flagcache.load(cache_dir, rel.server_args_sha256) \
            or releaseops.server_args_flag_spec(hp.site, cache_dir)
    return releaseops.launch_flags_check(
        name="Launch flags known to the installed sglang", site=hp.site,
        flag_map=service.flag_map(hp.settings, with_api_key=True), version=hp.sglang_version,
        spec=spec, cache_dir=cache_dir)


@outcomes.stage("service")
@deploy("Service: launch flags, secrets, systemd unit, (re)start")
def service_stage(hp: HostPlan) -> HostPlan:
    """The service of this host; returns its plan with the restart decision and the
    operations the verification reads."""
    s, lay, hs = hp.settings, hp.layout, hp.hoststate
    launch_flags_checked(hp)
    secrets_text = render_secrets_env(s.secrets)
    unit_text = hp.unit_text()
    # the one restart decision (``core.restart``): this host's, or its group's, made once per
    # run from every node's facts (the same on every node)
    hp = restarts_mod.decided(hp, unit_text)
    decision, why, restarts = restarts_mod.own(hp)
    reasons = decision.triggers  # this host's own changes that restart its server
    outcomes.decided(host.name, restart.record(hp.restart, host.name), restarts)
    restarts_mod.say(why, restarts)
    gpugate.before_start(host.name, s, hs, reasons)  # (staging too: before the first drain)
    if staging.stage_only():  # the rollout's staging run: the checks, nothing serving touched
        staging.checks_before_start(hp, unit_text, reasons)
        warm.add_warm(hp, not hs.service.unit_active or bool(reasons))  # before any drain
        autotunecarry.add_carry(hp, not hs.service.unit_active or bool(reasons))  # a new revision
        return hp
    # a staged rollout's rolling run, started with its drain: what follows needs the host
    # out of the router (every operation); the reads above do not
    waited = rollgate.wait(host.name, this_run().spec.gate)
    if waited is not None:
        logger.info(f"{host.print_prefix}drained by the rollout (waited {waited:.1f}s for it)")
    run = groupops.run_of(state, hp.group) if hp.group is not None and restarts else None
    if run is not None:  # every node's GPUs (judged once, with the group's decision)
        gpugate.check_group(hp.group.name, hp.group_decision.fatal,
                            f"restart {s.sglang_service}")
    active = hs.service.unit_active
    if run is not None or (hp.group is None and (not active or reasons)):
        # the server will (re)start: its JIT compilers and the release checked first (a
        # group's node whatever its own reasons: ``Decided``, the group's decision)
        staging.checks_before_start(hp, unit_text, reasons, groupstage.condition(hp) or None)
        if not active and hp.group is None and not decision.retest:  # the GPUs are free
            allreduce.add_allreduce_check(hp)
    # the model into the page cache before the stop, while the server still serves
    warm.before_restart(hp, active, reasons, group_restarts=run is not None)
    autotunecarry.before_restart(hp, active, reasons, group_restarts=run is not None)
    if run is not None:  # the group's pre-flight, before any of its servers stops
        groupstage.add_preflight(run, hp.restart, hp.group_decision.cards,
                                 lay.tool("rendezvous.py"), s.sglang_system_python)
    unit, secrets, link = ops.server_files(lay, hp.release_id, unit_text, secrets_text)
    hp = dataclasses.replace(hp, ops=dataclasses.replace(hp.ops, unit=unit, secrets=secrets,
                                                         link=link))
    if hp.group is not None:  # a group's node starts with its group, never alone
        restarts_mod.group_node(hp, unit, run)
        return hp
    return restarts_mod.start_or_restart(hp, unit, secrets, decision)


def _action(started, restarted) -> str | None:
    if started.did_change():
        return "started"
    if restarted is not None and restarted.did_change():
        return "restarted"
    return None


@outcomes.stage("verify")
@deploy("Verify: block until the model really serves")
def verify_stage(hp: HostPlan):
    # One line per kind of check, whatever the host: pyinfra runs one operation on every host
    # before the next, so single hosts are verified beside a group's workers, not in turn.
    if hp.group is not None:
        workers, rank0, ready, running = groupstage.group_checks(hp)
    else:
        (workers, running), rank0, ready = single_checks(hp), None, None
    if workers is not None:
        python.call(name=workers[0], function=ops.reported(workers[1]), **workers[2])
    if rank0 is not None:
        python.call(name=rank0[0], function=ops.reported(rank0[1]), **rank0[2])
    if ready is not None:
        python.call(name=ready[0], function=ops.reported(ready[1]), **ready[2])
    if running is not None:
        python.call(name=running[0], function=ops.reported(running[1]), **running[2])
    if workers is None and running is None:
        host.noop("the service was not (re)started: nothing to verify")
    watchdogstage.install(hp)  # after the server is verified (stages/watchdogstage.py)


def single_checks(hp: HostPlan) -> tuple[tuple | None, tuple | None]:
    """A single server's checks: (name, function, ``_if``) of its verification after a
    (re)start, and of a running server's (either None). The verification's parameters are
    the plan's, or, once the P2P retest ran, those of the plan with its verdict
    (``p2pretest.latest``)."""
    s = hp.settings
    started, restarted = hp.ops.started, hp.ops.restarted
    may_restart = started.will_change or restarted is not None
    if plan.planning():
        plan.record(state, host, hp, serving_poll(host, s))

    decided = restart.record(hp.restart) if hp.restart is not None else None
    previous = hp.hoststate.previous_restart

    def verify(action: str | None = None) -> None:
        act = action or _action(started, restarted)
        verify_and_record(s, p2pretest.latest(hp).verify_params(), act,
                          last_restart=restart.last_restart(act, decided, previous))

    after_start = running = None
    if may_restart:
        after_start = ("Verify startup, API and a one-token generation", verify,
                       {"_if": lambda: _action(started, restarted) is not None})
    if hp.verify_running:
        running = ("Verify the running server (never verified, serving: not restarted)",
                   functools.partial(verify, "converged"), {})
    elif s.verify_converged:
        running = ("Verify the running server still serves (converged host)",
                   functools.partial(verify, "converged"),
                   {"_if": lambda: _action(started, restarted) is None})
    return after_start, running


@outcomes.stage("rollback")
@deploy("Rollback: back to the last known-good configuration")
def rollback_stage():
    """Restore the unit, secrets and release that last passed verification on this host,
    restart, and verify by that configuration's own standards. A host that already runs its
    known-good configuration and serves is only checked, never restarted."""
    s = run_of(state).fleet.settings(host.name)
    lay = Layout.of(s)
    hs = groupprep.rollback_hoststate(host, s)  # read once per run (a group's peers too)
    rb = service.rollback_plan(host.name, hs, s.sglang_root)
    g = run_of(state).fleet.group_of(host.name)
    if rb.restart and g is None:  # before anything is put back (a group's: with its group)
        gpugate.check(host.name, s, hs, f"restart {s.sglang_service} on its known-good "
                                        "configuration")
    ops.known_good_restored(
        name=f"Known-good configuration (release {rb.params['release']})", layout=lay,
        release=rb.params["release"], restore=rb.restore)
    if g is not None:
        return groupstage.rollback_group_node(s, g, rb)
    restarted = None
    if rb.restart:
        restarted = ops.service_restarted(name=f"Restart {s.sglang_service} on the known-good configuration",
                                        service=s.sglang_service)
    reason = restart.rollback_reason(rb.params["release"], rb.restore)
    decided = {"why": reason.text, "reasons": [reason.as_json()]} if rb.restart else {}
    outcomes.decided(host.name, {"why": decided.get("why", ""),
                                 "reasons": decided.get("reasons", [])}, rb.restart)
    restarts_mod.say(decided.get("why", ""), rb.restart)
    previous = hs.previous_restart

    def verify() -> None:
        action = "rolled-back" if restarted is not None and restarted.did_change() \
            else "unchanged"
        verify_and_record(s, rb.params, action,
                          last_restart=restart.last_restart(action, decided, previous))

    python.call(name="Verify the known-good configuration serves",
                function=ops.reported(verify))
