"""The stages of deploy.py and rollback.py, as pyinfra deploys: pre-flight, runtime, service,
verify, rollback.

Glue only: each stage reads the host's state (facts), asks the pure modules
(``core.preflight``, ``core.service``, ``core.patch``, ...) what to do, and adds operations.
Nothing here knows whether a host is simulated.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from io import StringIO
from pathlib import Path

from pyinfra import host, logger, state
from pyinfra.api import deploy
from pyinfra.operations import python, server

from sglang_deploy.controller import flagcache, lockfiles
from sglang_deploy.core import data as datamod
from sglang_deploy.core import group, jit, modelfetch, preflight, restart, service
from sglang_deploy.core import patch as patchmod
from sglang_deploy.core import progress as progressmod
from sglang_deploy.core.errors import DataError, RuntimeSetupError
from sglang_deploy.core.hoststate import HostState
from sglang_deploy.core.service import Layout, StageOps, Trigger
from sglang_deploy.core.unit import UnitSpec, device_allow, render_secrets_env, render_unit
from sglang_deploy.hostops import operations as ops
from sglang_deploy.hostops import releaseops
from sglang_deploy.hostops.facts import REMOTE, patch_status
from sglang_deploy.integration import outcomes, plan
from sglang_deploy.integration.integration import run_of, this_run
from sglang_deploy.stages import (
    allreduce,
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


@dataclass
class Context:
    """What one host's stages share, from the pre-flight on."""

    settings: datamod.Settings
    layout: Layout
    hoststate: HostState
    release_id: str = ""
    sglang_version: str = ""
    lock_text: str = ""
    nccl_env: dict = field(default_factory=dict)
    ops: StageOps = field(default_factory=StageOps)
    patch_state: str = "unknown"
    patch_status: dict | None = None  # the patch's status on the release (None: unknown)
    p2p_record: dict | None = None
    verify_running: bool = False
    p2p_skipped: bool = False
    gpu_snapshot: dict | None = None
    expect: preflight.Expectations | None = None
    group_env: dict = field(default_factory=dict)  # NCCL/gloo interface of a group's node
    group: group.Group | None = None  # the multi-node group this host is a node of
    group_decision: groupprep.Prepared | None = None  # its group's: ``groupprep.decide``
    restart: object = None  # the restart decision: ``restart.Decision`` or ``GroupDecision``
    gpu_report: dict | None = None  # the GPU health read, judged (``gpugate.report``)

    @property
    def venv_python(self) -> str:
        return self.layout.venv_python(self.release_id)

    @property
    def site(self) -> str:
        return self.layout.site(self.release_id, self.hoststate.platform.python)

    def environment(self) -> list[tuple[str, str]]:
        """The service's environment, with the JIT toolchain of this release."""
        toolchain = jit.toolchain_environment(
            self.settings.sglang_cache_dir, self.layout.venv_bin(self.release_id),
            jit.cuda_home_for(self.lock_text, self.site))
        return service.service_environment(self.settings, {**self.nccl_env, **self.group_env},
                                           toolchain)

    def unit_text(self) -> str:
        """The systemd unit this host's server runs under (``unit_for``)."""
        return unit_for(self)

    def verify_params(self) -> dict:
        return service.verify_params(self.settings, release_id=self.release_id,
                                     sglang_version=self.sglang_version,
                                     patch_state=self.patch_state, nccl_env=self.nccl_env)


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


def put_p2p_record(ctx: Context) -> None:
    """Keep a passed full P2P test's verdict on the host (a file op: unchanged = no change)."""
    if ctx.p2p_record is not None:
        dest = ctx.layout.p2p_record
        ops.file_content(name="Record of the passed P2P test", mode="644",
                         src=StringIO(json.dumps(ctx.p2p_record, sort_keys=True) + "\n"),
                         dest=dest)


@outcomes.stage("preflight")
@deploy("Pre-flight: GPUs, CUDA, P2P and model")
def preflight_stage() -> Context:
    """The pre-flight of this host; returns its ``Context``, which deploy.py hands to the
    next stages."""
    settings = run_of(state).fleet.settings(host.name)
    layout = Layout.of(settings)
    release_id, sglang_version, lock_text = lock_info(settings.sglang_lock)
    # one round trip: host state and GPU snapshot, run at once (read once per run: a group's
    # peers read it while they are prepared, ``groupprep``)
    snap = groupprep.snapshot(host, settings, release_id)
    hs = snap.state
    if hs is not None:  # a new model revision: its own folder beside the one that serves
        settings, hs = groupprep.model_revision(settings, hs)
    if hs is None:
        raise RuntimeSetupError(
            what=f"the host-state read ({settings.sglang_system_python} hoststate.py) to print JSON",
            found="\n".join((snap.output or "").strip().splitlines()[-5:])
            or "no output at all",
            fix=f"check that `{settings.sglang_system_python}` "
            "(sglang_system_python) runs on the host: it is the Python 3 the deploy uses there")
    ctx = Context(settings=settings, layout=layout, hoststate=hs, release_id=release_id,
                  sglang_version=sglang_version, lock_text=lock_text, gpu_snapshot=snap.gpu,
                  expect=preflight.Expectations(
                      count=settings.gpu_expected_count, model=settings.gpu_expected_model,
                      min_driver=settings.gpu_min_driver, p2p_policy=settings.gpu_p2p_policy,
                      min_gbps=settings.gpu_p2p_min_gbps))

    record, last_verified = hs.p2p_verified, hs.last_verified
    # Peer copies need GPU memory the running server holds; while it serves, the verdict of
    # the last full test on this host stands, and while it serves a verified invocation, so
    # does that server for the probe itself.
    kind = preflight.probe_plan(hs.service, last_verified, record, settings.gpu_p2p_test,
                                read_only=plan.read_only())
    ctx.p2p_skipped = kind != "p2p"
    checks, matrix = p2pretest.run_probe(ctx, kind)
    if ctx.p2p_skipped and record:
        checks, ctx.nccl_env = preflight.use_p2p_record(checks, ctx.nccl_env, record,
                                                        settings.sglang_service,
                                                        settings.gpu_p2p_policy)
    if kind == "none":
        checks = preflight.use_verified_server(checks, settings.sglang_service, last_verified,
                                               record, read_only=plan.read_only())
    checks += preflight.check_model(hs.model, settings.sglang_model_path,
                                    download=settings.sglang_model_download)
    if settings.sglang_group:
        ctx.group = run_of(state).fleet.group_of(host.name)
        check, ctx.group_env = groupstage.group_interface(settings, hs.route_dev)
        checks.append(check)
    target = preflight.lock_target(lock_text, sglang_version)  # the python, glibc its wheels need
    checks[:0] = preflight.check_wheel_platform(hs.platform.python, hs.platform.glibc, target,
                                                system_python=settings.sglang_system_python)
    p2pview.show(checks, record=kind == "p2p", policy=settings.gpu_p2p_policy)
    ctx.gpu_report = gpugate.report(settings, hs).to_dict()
    plan.preflight(host.name, checks, ctx.nccl_env, matrix, gpu_health=ctx.gpu_report)
    ops.preflight_gate(checks, title="pre-flight (GPU, CUDA, P2P, model)")
    return ctx


@outcomes.stage("runtime")
@deploy("Runtime: user, folders, uv, release venv, autotune patch")
def runtime_stage(ctx: Context):
    s, hs, lay = ctx.settings, ctx.hoststate, ctx.layout
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

    put_p2p_record(ctx)
    lock_path = lay.release_lock(ctx.release_id)
    ops.file_content(
        name=f"Lock of release {ctx.release_id}", src=StringIO(ctx.lock_text), dest=lock_path,
        mode="644")
    ctx.ops.triggers[Trigger.RELEASE] = releaseops.release_venv(
        name=f"Release {ctx.release_id} (sglang {ctx.sglang_version})", root=s.sglang_root,
        release_id=ctx.release_id, python=s.sglang_system_python, lock_path=lock_path,
        wheelhouse=s.sglang_wheelhouse, index_url=s.sglang_index_url, uv_cache=lay.uv_cache,
        packages=progressmod.lock_packages(ctx.lock_text),
        meta={"sglang_version": ctx.sglang_version, "lock": s.sglang_lock,
              "python": hs.platform.python},
    )
    known_good = hs.releases.known_good_release
    releaseops.releases_pruned(name=f"Old releases (keep {s.sglang_keep_releases})", root=s.sglang_root,
                        keep=s.sglang_keep_releases, installing=ctx.release_id,
                        protected={r for r in (ctx.release_id, hs.releases.current, known_good) if r},
                        python=s.sglang_system_python)
    autotune_patch(ctx)
    if s.sglang_model_download:  # after the release venv (its huggingface_hub), before the service
        ctx.ops.triggers[Trigger.MODEL] = releaseops.model_download(
            name=f"Model {s.sglang_model_repo} -> {s.sglang_model_path}",
            spec=modelfetch.FetchSpec(
                repo=s.sglang_model_repo, revision=s.sglang_model_revision, path=s.sglang_model_path,
                python=ctx.venv_python, tool=lay.tool("model_fetch.py"),
                token_file=lay.hf_token_file, endpoint=s.sglang_hf_endpoint,
                timeout_s=s.sglang_model_download_timeout_s, token_env=s.sglang_hf_token_env),
            root=s.sglang_root, python=s.sglang_system_python,
            token=s.secrets.get("HF_TOKEN"), group=s.sglang_user)


def autotune_patch(ctx: Context) -> None:
    """The FlashInfer autotune patch on the release (``sglang_autotune_patch``), its state
    kept in CTX for the verifier and the restart decision: the status the operation itself
    compares (``facts.patch_status``, read once in the run: the operation finds the same)."""
    lay, s = ctx.layout, ctx.settings
    if not s.sglang_autotune_patch:
        ctx.patch_state = "disabled"
        return
    tool = lay.tool("patch_tool.py")
    status = patch_status(host, s.sglang_root, ctx.release_id, ctx.venv_python, ctx.site,
                                tool)
    found = (status or {}).get("state")
    ctx.patch_status = status
    ctx.patch_state = "applied" if found in (None, "", "needed") else found
    ctx.ops.triggers[Trigger.PATCH] = releaseops.autotune_patch(
        name="FlashInfer autotune patch", root=s.sglang_root, release_id=ctx.release_id,
        python=ctx.venv_python, site=ctx.site, tool=tool, record=lay.patch_record(ctx.release_id))


def unit_for(ctx: Context) -> str:
    s, lay = ctx.settings, ctx.layout
    return render_unit(UnitSpec(
        release_id=ctx.release_id, sglang_version=ctx.sglang_version,
        patch_state=service.unit_patch_state(ctx.patch_state),
        served_model_name=s.served_model_name,
        user=s.sglang_user, home=s.sglang_home, secrets_file=lay.secrets_file,
        environment=tuple(ctx.environment()),
        argv=tuple(service.launch_argv(s, lay, ctx.release_id)),
        stop_timeout_s=s.sglang_stop_timeout_s, restart_sec=s.sglang_restart_sec,
        writable_paths=(s.sglang_cache_dir, s.sglang_home),
        device_allow=device_allow(s.gpu_expected_count),
    ))


def peer_unit(s: datamod.Settings, hs: dict, release: tuple, nccl_env: dict, group_env: dict,
              patch_state: str) -> str:
    """The unit a group's node gets, from its facts (``groupprep.UnitOf``)."""
    return unit_for(Context(settings=s, layout=Layout.of(s), hoststate=hs, release_id=release[0],
                            sglang_version=release[1], lock_text=release[2], nccl_env=nccl_env,
                            group_env=group_env, patch_state=patch_state))


def launch_flags_checked(ctx: Context):
    """The launch flags checked against the installed sglang's own (the final guard), its
    parsed ``server_args.py`` from the controller's cache when the host's sha256 is there."""
    rel = ctx.hoststate.releases.get(ctx.release_id)
    # the controller's cache of parsed ``server_args.py`` files (``flagcache``)
    cache_dir = str(Path(state.cwd or ".") / ".sglang-deploy" / "cache" / "flagspec")
    spec = None
    if rel is not None and rel.complete:  # by the host's sha256; fetched only on a cache miss
        spec = flagcache.load(cache_dir, rel.server_args_sha256) \
            or releaseops.server_args_flag_spec(ctx.site, cache_dir)
    return releaseops.launch_flags_check(
        name="Launch flags known to the installed sglang", site=ctx.site,
        flag_map=service.flag_map(ctx.settings, with_api_key=True), version=ctx.sglang_version,
        spec=spec, cache_dir=cache_dir)


@outcomes.stage("service")
@deploy("Service: launch flags, secrets, systemd unit, (re)start")
def service_stage(ctx: Context):
    s, lay, hs = ctx.settings, ctx.layout, ctx.hoststate
    launch_flags_checked(ctx)
    secrets_text = render_secrets_env(s.secrets)
    unit_text = unit_for(ctx)
    # the one restart decision (``core.restart``): this host's, or its group's, made once per
    # run from every node's facts (the same on every node)
    if ctx.group is None:
        decision = restarts_mod.decide(ctx, unit_text)
        ctx.restart = decision
        why, restarts = decision.why(), bool(decision.reasons)
    else:
        ctx.group_decision = groupprep.decide(
            state, ctx.group, (ctx.release_id, ctx.sglang_version, ctx.lock_text), peer_unit)
        gd = ctx.group_decision.decision
        decision = gd.decisions[host.name]
        ctx.restart = gd
        why, restarts = gd.why(), gd.restart
    reasons = decision.triggers  # this host's own changes that restart its server
    outcomes.decided(host.name, restart.record(ctx.restart, host.name), restarts)
    restarts_mod.say(why, restarts)
    gpugate.before_start(host.name, s, hs, reasons)  # (staging too: before the first drain)
    if staging.stage_only():  # the rollout's staging run: the checks, nothing serving touched
        staging.checks_before_start(ctx, unit_text, reasons)
        warm.add_warm(ctx, not hs.service.unit_active or bool(reasons))  # before any drain
        return
    # a staged rollout's rolling run, started with its drain: what follows needs the host
    # out of the router (every operation); the reads above do not
    waited = rollgate.wait(host.name, this_run().spec.gate)
    if waited is not None:
        logger.info(f"{host.print_prefix}drained by the rollout (waited {waited:.1f}s for it)")
    run = groupops.run_of(state, ctx.group) if ctx.group is not None and restarts else None
    if run is not None:  # every node's GPUs (judged once, with the group's decision)
        gpugate.check_group(ctx.group.name, ctx.group_decision.fatal,
                            f"restart {s.sglang_service}")
    active = hs.service.unit_active
    if run is not None or (ctx.group is None and (not active or reasons)):
        # the server will (re)start: its JIT compilers and the release checked first (a
        # group's node whatever its own reasons: ``Decided``, the group's decision)
        staging.checks_before_start(ctx, unit_text, reasons, groupstage.condition(ctx) or None)
        if not active and ctx.group is None and not decision.retest:  # the GPUs are free
            allreduce.add_allreduce_check(ctx)
    # the model into the page cache before the stop, while the server still serves
    warm.before_restart(ctx, active, reasons, group_restarts=run is not None)
    if run is not None:  # the group's pre-flight, before any of its servers stops
        groupstage.add_preflight(run, gd, ctx.group_decision.cards, lay.tool("rendezvous.py"),
                                 s.sglang_system_python)
    unit, secrets, link = ops.server_files(lay, ctx.release_id, unit_text, secrets_text)
    ctx.ops.unit, ctx.ops.secrets, ctx.ops.link = unit, secrets, link
    if ctx.group is not None:  # a group's node starts with its group, never alone
        restarts_mod.group_node(ctx, unit, run, gd)
        return
    ctx.ops.started, ctx.ops.restarted = restarts_mod.start_or_restart(ctx, unit, secrets,
                                                                       decision)


def _action(started, restarted) -> str | None:
    if started.did_change():
        return "started"
    if restarted is not None and restarted.did_change():
        return "restarted"
    return None


@outcomes.stage("verify")
@deploy("Verify: block until the model really serves")
def verify_stage(ctx: Context):
    # One line per kind of check, whatever the host: pyinfra runs one operation on every host
    # before the next, so single hosts are verified beside a group's workers, not in turn.
    if ctx.group is not None:
        workers, rank0, ready, running = groupstage.group_checks(
            ctx, lambda: restarts_mod.serving_poll(ctx.settings))
    else:
        (workers, running), rank0, ready = single_checks(ctx), None, None
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
    watchdogstage.install(ctx)  # after the server is verified (stages/watchdogstage.py)


def single_checks(ctx: Context) -> tuple[tuple | None, tuple | None]:
    """A single server's checks: (name, function, ``_if``) of its verification after a
    (re)start, and of a running server's (either None)."""
    s = ctx.settings
    started, restarted = ctx.ops.started, ctx.ops.restarted
    may_restart = started.will_change or restarted is not None
    if plan.planning():
        plan.record(state, host, ctx, restarts_mod.serving_poll(s))

    decided = restart.record(ctx.restart) if ctx.restart is not None else None
    previous = ctx.hoststate.previous_restart

    def verify(action: str | None = None) -> None:
        act = action or _action(started, restarted)
        verify_and_record(s, ctx.verify_params(), act,
                          last_restart=restart.last_restart(act, decided, previous))

    after_start = running = None
    if may_restart:
        after_start = ("Verify startup, API and a one-token generation", verify,
                       {"_if": lambda: _action(started, restarted) is not None})
    if ctx.verify_running:
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
