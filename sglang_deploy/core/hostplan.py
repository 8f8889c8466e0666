"""One host's plan for deploy.py's stages (pure): what its pre-flight found and what this run
gives it, made once from its facts and its Settings by ``plan``, frozen.

The pre-flight stage reads the host (``HostSnapshot``, then the CUDA probe ``probe_kind``
asks for) and hands the reads to ``plan``: the settings this run deploys (a new model
revision's folder: ``model_revision``), the layout, the release, the GPU checks and the NCCL
environment they give, a passed full P2P test's record, the group's interface, the GPU
health judged. A multi-node group's decision makes every node's plan with the very same
function from that node's facts (``stages.group.groupprep.node_view``), so a node's unit, its
restart reasons and its card are computed one way, whoever asks.

What a later stage learns is a new plan, never a change to this one (``frozen``): the runtime
stage's patch status (``with_patch``) and its operations, the service stage's restart
decision and its operations (``dataclasses.replace``), the P2P retest's verdict once it ran on
the host (``retested``). The operations a stage hands to a later one are pyinfra's, opaque
here (``service.StageOps``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from sglang_deploy.core import gpuhealth, jit, modelfetch, preflight, service
from sglang_deploy.core import restart as restartmod
from sglang_deploy.core.group import Group, group_environment
from sglang_deploy.core.hostrecords import ModelState
from sglang_deploy.core.hoststate import HostState
from sglang_deploy.core.restart import Decision, Facts, GroupDecision, Wanted
from sglang_deploy.core.service import Layout, StageOps
from sglang_deploy.core.unit import UnitSpec, device_allow, render_secrets_env, render_unit

if TYPE_CHECKING:
    from sglang_deploy.core.settingstype import Settings

#: (release id, sglang version, lock text): the release of the lock the run installs
Release = tuple[str, str, str]


def expectations(s: Settings) -> preflight.Expectations:
    """What the host's GPUs must offer (the ``gpu_*`` keys)."""
    return preflight.Expectations(count=s.gpu_expected_count, model=s.gpu_expected_model,
                                  min_driver=s.gpu_min_driver, p2p_policy=s.gpu_p2p_policy,
                                  min_gbps=s.gpu_p2p_min_gbps)


def probe_kind(s: Settings, hs: HostState, read_only: bool) -> str:
    """The CUDA probe the pre-flight reads ("p2p", "basic" or "none": ``preflight.probe_plan``),
    from the host state: asked before the probe is read, and again by ``plan``."""
    return preflight.probe_plan(hs.service, hs.last_verified, hs.p2p_verified, s.gpu_p2p_test,
                                read_only=read_only)


def model_revision(settings: Settings, model: ModelState | None
                   ) -> tuple[Settings, ModelState | None]:
    """(the settings this run deploys, the host-state read of its model folder): with
    ``sglang_model_download`` a revision that the configured folder does not hold lives in
    its sibling ``PATH@REV`` (``modelfetch.revision_dir``): downloaded there while staging,
    beside the files that serve, and the unit's ``--model-path`` names it (the served model
    name stays what it was)."""
    path = settings.sglang_model_path
    if not settings.sglang_model_download:
        return settings, model
    where = modelfetch.revision_dir(path, settings.sglang_model_repo,
                                    settings.sglang_model_revision, model)
    if where == path:
        return settings, model
    # (Settings is made at run time by make_dataclass: a dataclass a checker cannot see)
    revised: Settings = dataclasses.replace(
        cast(Any, settings), sglang_model_path=where,
        sglang_served_model_name=settings.served_model_name)
    return revised, modelfetch.state_of(model, where)


def group_interface(s: Settings, route_dev: str | None
                    ) -> tuple[preflight.Check, dict[str, str]]:
    """The interface a group's node uses for NCCL/gloo: ``sglang_nccl_socket_ifname``, else
    the one that carries rank 0's address on this host (none: the node cannot reach it)."""
    ifname = s.sglang_nccl_socket_ifname or route_dev
    addr = f"{s.sglang_dist_init_addr}:{s.sglang_dist_init_port}"
    if not ifname:
        return preflight.Check(
            name="group-interface", status="fail",
            message=f"no interface of this host carries a route to rank 0's {addr} "
                    f"(group {s.sglang_group})",
            fix="give the node a route to rank 0's address (same subnet or a gateway), or set "
                "`sglang_dist_init_addr` to an address of rank 0 it reaches"), {}
    how = "sglang_nccl_socket_ifname" if s.sglang_nccl_socket_ifname else "the route to rank 0"
    return preflight.Check(name="group-interface", status="pass",
                           message=f"group {s.sglang_group}: NCCL/gloo over {ifname} ({how}), "
                                   f"--dist-init-addr {addr}"), group_environment(ifname)


@dataclass(frozen=True)
class GpuVerdict:
    """The GPUs judged from the snapshot and a probe: the checks, the NCCL environment they
    give, the P2P matrix text, and the record a passed full P2P test leaves on the host."""

    checks: tuple[preflight.Check, ...]
    nccl_env: Mapping[str, str]
    matrix: str | None
    record: Mapping[str, Any] | None


def gpu_verdict(s: Settings, gpu: Mapping[str, Any], probe: Mapping[str, Any] | None,
                kind: str) -> GpuVerdict:
    """The GPUs of Settings S judged (``preflight.evaluate``) from the snapshot's GPU sections
    and the CUDA probe of KIND (None: not read). A probe that should have run and gave no
    result fails the checks: the deploy never installs on a host whose CUDA was not
    proven."""
    checks, env, matrix = preflight.evaluate(gpu, probe, expectations(s))
    if kind != "none" and probe is None:
        checks.append(preflight.Check(
            name="cuda-probe", status="fail", message="the CUDA probe gave no result",
            fix=f"run `{s.sglang_system_python} cuda_probe.py --p2p` on the host (or "
                "`sglang-deploy doctor` there) and read its error"))
    record = preflight.p2p_record(checks, env, s.gpu_p2p_policy) if kind == "p2p" else None
    return GpuVerdict(tuple(checks), env, matrix, record)


@dataclass(frozen=True)
class Prepared:
    """A group's decision for this run, made once while its nodes are prepared
    (``groupprep.decide``, ``groupprep.decide_rollback``) and the same on every node: the
    restart decision (``core.restart``), every node's card for the rendezvous, and the nodes
    whose GPU health is fatal (each node's health judged once; the gate refuses the group's
    restart on every node, ``gpugate.check_group``)."""

    decision: GroupDecision
    cards: Mapping[str, dict[str, Any]]
    fatal: tuple[tuple[str, gpuhealth.Report], ...] = ()


def patch_state_of(s: Settings, status: Mapping[str, Any] | None) -> str:
    """The autotune patch's state the unit and the verifier name, from its status on the
    release (None: no venv yet, the patch is applied by this run)."""
    if not s.sglang_autotune_patch:
        return "disabled"
    found = (status or {}).get("state")
    return "applied" if found in (None, "", "needed") else str(found)


@dataclass(frozen=True)
class HostPlan:
    """One host's plan (``plan``), handed from stage to stage by deploy.py; a stage that
    learns something returns a new plan (``with_patch``, ``dataclasses.replace``)."""

    settings: Settings              # this run's (a new model revision's folder: ``model_revision``)
    layout: Layout
    hoststate: HostState            # the pre-flight's read (its model folder: the settings')
    release_id: str
    sglang_version: str
    lock_text: str
    gpu_snapshot: Mapping[str, Any]  # the snapshot's nvidia-smi and /dev sections
    expect: preflight.Expectations
    probe: str                      # the CUDA probe read: "p2p", "basic" or "none"
    checks: tuple[preflight.Check, ...]  # the pre-flight's (after a retest: the retest's)
    matrix: str | None              # the P2P matrix text (a probe with the copies)
    nccl_env: Mapping[str, str]     # from the GPUs' verdict, or the last recorded one
    p2p_record: Mapping[str, Any] | None  # a passed full P2P test's, kept on the host
    gpu_health: gpuhealth.Report    # the GPU health read, judged
    group: Group | None = None      # the multi-node group this host is a node of
    #: its NCCL/gloo interface (a group's node)
    group_env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    # the runtime stage's: the patch's status on the release (``with_patch``; None: unknown)
    patch_status: Mapping[str, Any] | None = None
    patch_state: str = "unknown"
    # the service stage's: the restart decision, this host's or its group's (``Prepared``)
    restart: Decision | GroupDecision | None = None
    group_decision: Prepared | None = None
    verify_running: bool = False    # a never-verified server that serves: verified as it runs
    ops: StageOps = dataclasses.field(default_factory=StageOps)

    @property
    def release(self) -> Release:
        return self.release_id, self.sglang_version, self.lock_text

    @property
    def p2p_skipped(self) -> bool:
        """The pre-flight skipped the peer copies (a server ran on the GPUs)."""
        return self.probe != "p2p"

    @property
    def gpu_report(self) -> dict[str, Any]:
        """The GPU health report as the records keep it (``Report.to_dict``)."""
        return self.gpu_health.to_dict()

    @property
    def venv_python(self) -> str:
        return self.layout.venv_python(self.release_id)

    @property
    def site(self) -> str:
        # (no python read: "None", as the path has always been formatted)
        return self.layout.site(self.release_id, str(self.hoststate.platform.python))

    def environment(self) -> list[tuple[str, str]]:
        """The service's environment, with the JIT toolchain of this release."""
        toolchain = jit.toolchain_environment(
            self.settings.sglang_cache_dir, self.layout.venv_bin(self.release_id),
            jit.cuda_home_for(self.lock_text, self.site))
        return service.service_environment(self.settings, {**self.nccl_env, **self.group_env},
                                           toolchain)

    def unit_text(self) -> str:
        """The systemd unit this host's server runs under."""
        s, lay = self.settings, self.layout
        return render_unit(UnitSpec(
            release_id=self.release_id, sglang_version=self.sglang_version,
            patch_state=service.unit_patch_state(self.patch_state),
            served_model_name=s.served_model_name,
            user=s.sglang_user, home=s.sglang_home, secrets_file=lay.secrets_file,
            environment=tuple(self.environment()),
            argv=tuple(service.launch_argv(s, lay, self.release_id)),
            stop_timeout_s=s.sglang_stop_timeout_s, restart_sec=s.sglang_restart_sec,
            writable_paths=(s.sglang_cache_dir, s.sglang_home),
            device_allow=device_allow(s.gpu_expected_count),
        ))

    def verify_params(self) -> dict[str, Any]:
        return service.verify_params(self.settings, release_id=self.release_id,
                                     sglang_version=self.sglang_version,
                                     patch_state=self.patch_state, nccl_env=self.nccl_env)

    def with_patch(self, status: Mapping[str, Any] | None) -> HostPlan:
        """This plan with the autotune patch's status on the release (the status its operation
        compares; None: not read, no venv yet, or the patch is off)."""
        return dataclasses.replace(self, patch_status=status,
                                   patch_state=patch_state_of(self.settings, status))

    def retested(self, probe: Mapping[str, Any] | None) -> HostPlan:
        """This plan with the verdict of the P2P retest (PROBE: the CUDA probe with the peer
        copies, read once the server stopped): its checks, NCCL environment and record."""
        found = gpu_verdict(self.settings, self.gpu_snapshot, probe, "p2p")
        return dataclasses.replace(self, probe="p2p", checks=found.checks, matrix=found.matrix,
                                   nccl_env=found.nccl_env, p2p_record=found.record)

    # ------------------------------------------------------- the restart decision's inputs
    def restart_facts(self) -> Facts:
        """What the restart decision reads of the host's state."""
        return Facts.of(self.hoststate, self.layout.unit_file)

    def changing(self) -> tuple[str, ...]:
        """Of ``restart.TRIGGERS``, what this run changes on the host (``restart.changing``:
        as its release, patch and model operations decide), from its facts."""
        s, hs = self.settings, self.hoststate
        return restartmod.changing(
            release_complete=hs.releases.complete(self.release_id),
            patch_enabled=s.sglang_autotune_patch,
            patch_state=(self.patch_status or {}).get("state"),
            model_download=s.sglang_model_download,
            model_complete=modelfetch.model_complete(hs.model, s.sglang_model_path))

    def wanted(self, unit_text: str | None = None) -> Wanted:
        """What this run gives the host (``restart.Wanted``): its unit (UNIT_TEXT, when it is
        already rendered), its secrets, the release and launch argv, the triggers it changes
        and whether its pre-flight skipped the peer copies."""
        s = self.settings
        return Wanted(
            unit_text=self.unit_text() if unit_text is None else unit_text,
            secrets_text=render_secrets_env(s.secrets), release=self.release_id,
            argv=tuple(service.launch_argv(s, self.layout, self.release_id)),
            changing=self.changing(), p2p_skipped=self.p2p_skipped)


def plan(settings: Settings, release: Release, hs: HostState, gpu: Mapping[str, Any],
         probe: Mapping[str, Any] | None, *, group: Group | None = None,
         read_only: bool = False) -> HostPlan:
    """The plan of one host with SETTINGS (as its data gives them) for RELEASE, from its
    facts: its host state HS, its GPU sections GPU (``HostSnapshot``) and the CUDA probe that
    ``probe_kind`` asked for (PROBE; None: not read). GROUP: the group it is a node of, when
    its data names one. READ_ONLY: a run that changes nothing (``status``, ``--dry``)."""
    kind = probe_kind(settings, hs, read_only)
    settings, model = model_revision(settings, hs.model)
    hs = dataclasses.replace(hs, model=model) if model is not hs.model else hs
    found = gpu_verdict(settings, gpu, probe, kind)
    checks, env = list(found.checks), dict(found.nccl_env)
    record, service_name = hs.p2p_verified, settings.sglang_service
    # Peer copies need GPU memory the running server holds; while it serves, the verdict of
    # the last full test on this host stands, and while it serves a verified invocation, so
    # does that server for the probe itself.
    if kind != "p2p" and record:
        checks, env = preflight.use_p2p_record(checks, env, record, service_name,
                                               settings.gpu_p2p_policy)
    if kind == "none":
        checks = preflight.use_verified_server(checks, service_name, hs.last_verified, record,
                                               read_only=read_only)
    checks += preflight.check_model(hs.model, settings.sglang_model_path,
                                    download=settings.sglang_model_download)
    group_env: dict[str, str] = {}
    if settings.sglang_group:
        check, group_env = group_interface(settings, hs.route_dev)
        checks.append(check)
    target = preflight.lock_target(release[2], release[1])  # the python, glibc its wheels need
    checks[:0] = preflight.check_wheel_platform(hs.platform.python, hs.platform.glibc, target,
                                                system_python=settings.sglang_system_python)
    return HostPlan(
        settings=settings, layout=Layout.of(settings), hoststate=hs, release_id=release[0],
        sglang_version=release[1], lock_text=release[2], gpu_snapshot=gpu,
        expect=expectations(settings), probe=kind, checks=tuple(checks), matrix=found.matrix,
        nccl_env=env, p2p_record=found.record,
        gpu_health=gpuhealth.evaluate(hs.gpu_health, settings.gpu_expected_count,
                                      settings.gpu_health_policy),
        group=group if settings.sglang_group else None, group_env=group_env)
