"""The four stages of deploy.py, as pyinfra deploys: pre-flight, runtime, service, verify.

Each stage reads the facts it needs once, decides with the pure modules and adds operations.
Nothing here knows whether a host is simulated.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import shlex
from dataclasses import dataclass, field
from io import StringIO
from pathlib import Path

from pyinfra import host, logger, state
from pyinfra.api import deploy
from pyinfra.operations import python, server

from sglang_deploy.core import data as datamod
from sglang_deploy.core import flagcache
from sglang_deploy.core import flags as flagmod
from sglang_deploy.core import modelfetch
from sglang_deploy.shell import operations as ops
from sglang_deploy.core import patch as patchmod
from sglang_deploy.shell import plan
from sglang_deploy.shell import routing
from sglang_deploy.core import preflight
from sglang_deploy.core.errors import DataError, RuntimeSetupError
from sglang_deploy.shell.facts import (
    REMOTE,
    CudaProbe,
    HostSnapshot,
    PatchStatus,
    SglangHostState,
)
from sglang_deploy.core.unit import UnitSpec, device_allow, render_secrets_env, render_unit

SECRETS_DIR = "/etc/sglang"
SECRETS_FILE = f"{SECRETS_DIR}/secrets.env"


@dataclass
class Context:
    """What one host's stages share (kept on host.data under a private key)."""

    settings: datamod.Settings
    hoststate: dict
    release_id: str = ""
    sglang_version: str = ""
    lock_text: str = ""
    nccl_env: dict = field(default_factory=dict)
    ops: dict = field(default_factory=dict)
    patch_state: str = "unknown"
    p2p_record: dict | None = None
    verify_running: bool = False
    p2p_skipped: bool = False
    gpu_snapshot: dict | None = None
    expect: object = None

    @property
    def root(self) -> str:
        return self.settings.sglang_root

    @property
    def release_dir(self) -> str:
        return f"{self.root}/releases/{self.release_id}"

    @property
    def venv_python(self) -> str:
        return f"{self.release_dir}/venv/bin/python"

    @property
    def site(self) -> str:
        return f"{self.release_dir}/venv/lib/python{self.hoststate['python']}/site-packages"

    @property
    def tools(self) -> str:
        return f"{self.root}/tools"


def lock_info(lock_file: str) -> tuple[str, str, str]:
    """(release id, sglang version, lock text) of a lock file on the controller: read and
    checked once per run and file version (every host of a fleet names the same lock)."""
    path = Path(state.cwd or ".") / lock_file
    if not path.is_file():
        raise DataError(key="sglang_lock", what="the lock file named by `sglang_lock` exists",
                        found=f"no file {path}",
                        fix="run `sglang-deploy lock locks/NAME.in` or fix `sglang_lock`")
    st = path.stat()
    return _read_lock(str(path), st.st_mtime_ns, st.st_size, st.st_ino)


@functools.lru_cache(maxsize=8)
def _read_lock(path_text: str, mtime_ns: int, size: int, inode: int) -> tuple[str, str, str]:
    """``lock_info`` of the file version (PATH, mtime, size, inode); a bad lock raises (and
    exceptions are not cached)."""
    path = Path(path_text)
    text = path.read_text()
    m = re.search(r"^sglang==([^\s\\;]+)", text, re.MULTILINE)
    if not m:
        raise DataError(key="sglang_lock", what="the lock pins sglang==VERSION",
                        found=f"no sglang pin in {path}", fix="add sglang to the .in file and re-lock")
    if "--hash=sha256:" not in text:
        raise DataError(key="sglang_lock", what="a lock with hashes", found=f"{path} has no hashes",
                        fix="regenerate it with `sglang-deploy lock` (uses --generate-hashes)")
    return hashlib.sha256(text.encode()).hexdigest()[:16], m.group(1), text


_CONTEXTS: dict[str, Context] = {}


TOOLS = ("patch.py", "launch.py", "hoststate.py", "model_fetch.py")


def managed_folders(s: datamod.Settings) -> list[tuple[str, str, str]]:
    """(path, owner, mode) of every folder the runtime stage keeps."""
    return [
        (s.sglang_root, "root", "755"), (f"{s.sglang_root}/releases", "root", "755"),
        (f"{s.sglang_root}/tools", "root", "755"), (s.sglang_cache_dir, s.sglang_user, "750"),
        (s.sglang_home, s.sglang_user, "750"), (SECRETS_DIR, "root", "700"),
        (f"{s.sglang_root}/uv-cache", "root", "700"),
    ]


def tool_source(tool: str) -> Path:
    """The controller's copy of a tool shipped to ROOT/tools."""
    return Path(patchmod.__file__) if tool == "patch.py" else REMOTE / tool


def p2p_record_path(s: datamod.Settings) -> str:
    return f"{s.sglang_root}/p2p-verified.json"


def unit_path(s: datamod.Settings) -> str:
    return f"/etc/systemd/system/{s.sglang_service}.service"


def managed_paths(s: datamod.Settings, release_id: str) -> tuple[str, ...]:
    """Folders and files whose state the host-state fact reads in its one round trip."""
    return (*(p for p, _, _ in managed_folders(s)), *(f"{s.sglang_root}/tools/{t}" for t in TOOLS),
            f"{s.sglang_root}/releases/{release_id}/requirements.lock", unit_path(s),
            f"{s.sglang_root}/current", p2p_record_path(s))


def flag_cache_dir() -> str:
    """The controller's cache of parsed ``server_args.py`` files (``flagcache``)."""
    return str(Path(state.cwd or ".") / ".sglang-deploy" / "cache" / "flagspec")


def _tail(text: str | None, lines: int = 5) -> str:
    kept = (text or "").strip().splitlines()[-lines:]
    return "\n".join(kept) if kept else "no output at all"


def context() -> Context:
    ctx = _CONTEXTS.get(host.name)
    if ctx is None:
        raise RuntimeError("stages.preflight() must run first")
    return ctx


def no_probe_check(settings) -> preflight.Check:
    return preflight.Check(
        name="cuda-probe", status="fail", message="the CUDA probe gave no result",
        fix=f"run `{settings.sglang_system_python} cuda_probe.py --p2p` on the host (or "
            "`sglang-deploy doctor` there) and read its error")


def put_p2p_record(ctx: Context) -> None:
    """Keep a passed full P2P test's verdict on the host (a file op: unchanged = no change)."""
    if ctx.p2p_record is not None:
        dest = p2p_record_path(ctx.settings)
        ops.file_content(name="Record of the passed P2P test", mode="644",
                         src=StringIO(json.dumps(ctx.p2p_record, sort_keys=True) + "\n"),
                         dest=dest, present=ctx.hoststate["paths"].get(dest))


@deploy("Pre-flight: GPUs, CUDA, P2P and model")
def preflight_stage():
    settings = routing.settings(host, state.inventory)
    release_id, sglang_version, lock_text = lock_info(settings.sglang_lock)
    # one round trip: host state and GPU snapshot, run at once
    snap = host.get_fact(HostSnapshot, root=settings.sglang_root, service=settings.sglang_service,
                         model=settings.sglang_model_path, secrets=SECRETS_FILE,
                         python=settings.sglang_system_python, cache=settings.sglang_cache_dir,
                         paths=managed_paths(settings, release_id))
    hs, snapshot = snap["state"], snap["gpu"]
    if hs is None:
        raise RuntimeSetupError(
            what=f"the host-state read ({settings.sglang_system_python} hoststate.py) to print JSON",
            found=_tail(snap["output"]), fix=f"check that `{settings.sglang_system_python}` "
            "(sglang_system_python) runs on the host: it is the Python 3 the deploy uses there")
    ctx = Context(settings=settings, hoststate=hs, release_id=release_id,
                  sglang_version=sglang_version, lock_text=lock_text)
    _CONTEXTS[host.name] = ctx

    record, last_verified = hs.get("p2p_verified"), hs.get("last_verified")
    # Peer copies need GPU memory the running server holds; while it serves, the verdict of
    # the last full test on this host stands (the GPUs and their links have not changed), and
    # while it serves a verified invocation, so does that server for the probe itself.
    kind = preflight.probe_plan(hs["service"], last_verified, record, settings.gpu_p2p_test)
    full_p2p = kind == "p2p"
    probe = None
    if kind != "none":
        probe = host.get_fact(CudaProbe, python=settings.sglang_system_python, p2p=full_p2p,
                              mib=settings.gpu_p2p_test_mib)
    expect = preflight.Expectations(
        count=settings.gpu_expected_count, model=settings.gpu_expected_model,
        min_driver=settings.gpu_min_driver, p2p_policy=settings.gpu_p2p_policy,
        min_gbps=settings.gpu_p2p_min_gbps,
    )
    checks, ctx.nccl_env, matrix = preflight.evaluate(snapshot, probe, expect)
    ctx.gpu_snapshot, ctx.expect, ctx.p2p_skipped = snapshot, expect, not full_p2p
    if full_p2p:
        ctx.p2p_record = preflight.p2p_record(checks, ctx.nccl_env, settings.gpu_p2p_policy)
    else:
        checks, ctx.nccl_env = preflight.use_p2p_record(checks, ctx.nccl_env, record,
                                                        settings.sglang_service)
    if kind == "none":
        checks = preflight.use_verified_server(checks, settings.sglang_service, last_verified)
    elif probe is None:  # the deploy never installs on a host whose CUDA was not proven
        checks.append(no_probe_check(settings))
    checks += preflight.check_model(hs.get("model") or {}, settings.sglang_model_path,
                                    download=settings.sglang_model_download)
    if matrix:
        logger.info(f"{host.print_prefix}P2P matrix:\n{matrix}")
    plan.preflight(host.name, checks)
    ops.preflight_gate(checks, title="pre-flight (GPU, CUDA, P2P, model)")


@deploy("Runtime: user, folders, uv, release venv, autotune patch")
def runtime_stage():
    ctx = context()
    s = ctx.settings
    hs = ctx.hoststate
    users = hs["users"]  # from the host-state fact: no separate Users round trip
    if s.sglang_user not in users:
        server.user(name=f"Service user {s.sglang_user}", user=s.sglang_user, system=True,
                    home=s.sglang_home, shell="/usr/sbin/nologin", create_home=False)
    else:
        host.noop(f"user {s.sglang_user} exists")
    paths = hs["paths"]  # one round trip for every folder and file below (host-state fact)
    ops.directories(name="Folders (root, releases, tools, cache, home, secrets, uv cache)",
                    dirs=managed_folders(s), present=paths)
    if s.sglang_cache_seed:
        ops.cache_seeded(name=f"Caches from {s.sglang_cache_seed}", seed=s.sglang_cache_seed,
                         cache_dir=s.sglang_cache_dir, user=s.sglang_user,
                         present_files=hs.get("cache_files") or 0)
    ops.files_content(name=f"Tools ({', '.join(TOOLS)})", mode="755", present=paths,
                      sources=[(str(tool_source(tool)), f"{ctx.tools}/{tool}") for tool in TOOLS])
    ops.tool_venv(name=f"uv {s.sglang_uv_version} in the tool venv", root=s.sglang_root,
                  python=s.sglang_system_python, uv_version=s.sglang_uv_version,
                  present_version=hs.get("uv_version"), wheelhouse=s.sglang_wheelhouse,
                  index_url=s.sglang_index_url)

    put_p2p_record(ctx)
    rel = hs["releases"].get(ctx.release_id) or {}
    lock_put = ops.file_content(name=f"Lock of release {ctx.release_id}", src=StringIO(ctx.lock_text),
                                dest=f"{ctx.release_dir}/requirements.lock", mode="644",
                                present=hs["paths"].get(f"{ctx.release_dir}/requirements.lock"))
    release = ops.release_venv(
        name=f"Release {ctx.release_id} (sglang {ctx.sglang_version})", root=s.sglang_root,
        release_id=ctx.release_id, python=s.sglang_system_python,
        lock_path=f"{ctx.release_dir}/requirements.lock", complete=bool(rel.get("complete")),
        wheelhouse=s.sglang_wheelhouse, index_url=s.sglang_index_url,
        uv_cache=f"{s.sglang_root}/uv-cache",
        meta={"sglang_version": ctx.sglang_version, "lock": s.sglang_lock, "python": hs["python"]},
    )
    ctx.ops["release"] = release
    ctx.ops["lock"] = lock_put
    known_good = ((hs.get("known_good") or {}).get("record") or {}).get("release")
    ops.releases_pruned(name=f"Old releases (keep {s.sglang_keep_releases})", root=s.sglang_root,
                        releases={**hs["releases"], ctx.release_id: {"installed_at": "now"}},
                        keep=s.sglang_keep_releases,
                        protected={r for r in (ctx.release_id, hs.get("current"), known_good) if r})
    if s.sglang_autotune_patch:
        status = None
        if rel.get("complete"):
            # the record of the last apply, when the file is still the bytes it describes;
            # else the venv's python reads the file (``patch.py status``)
            status = patchmod.status_from_record(rel.get("patch"), rel.get("patch_file_sha256")) \
                or host.get_fact(PatchStatus, python=ctx.venv_python, site=ctx.site,
                                 tool=f"{ctx.tools}/patch.py")
        ctx.patch_state = (status or {}).get("state") or "applied"
        if ctx.patch_state == "needed":
            ctx.patch_state = "applied"
        ctx.ops["patch"] = ops.autotune_patch(
            name="FlashInfer autotune patch", python=ctx.venv_python, site=ctx.site,
            tool=f"{ctx.tools}/patch.py", record=f"{ctx.release_dir}/autotune-patch.json",
            status=status)
    else:
        ctx.patch_state = "disabled"
    if s.sglang_model_download:  # after the release venv (its huggingface_hub), before the service
        ctx.ops["model"] = ops.model_download(
            name=f"Model {s.sglang_model_repo} -> {s.sglang_model_path}",
            spec=modelfetch.FetchSpec(
                repo=s.sglang_model_repo, revision=s.sglang_model_revision, path=s.sglang_model_path,
                python=ctx.venv_python, tool=f"{ctx.tools}/model_fetch.py",
                token_file=f"{SECRETS_DIR}/.hf-token", endpoint=s.sglang_hf_endpoint,
                timeout_s=s.sglang_model_download_timeout_s, token_env=s.sglang_hf_token_env),
            complete=modelfetch.model_complete(hs.get("model"), s.sglang_model_path),
            token=s.secrets.get("HF_TOKEN"), group=s.sglang_user)


def launch_argv(ctx: Context) -> list[str]:
    s = ctx.settings
    flag_map = dict(s.sglang_flags)
    flag_map["model-path"] = s.sglang_model_path
    if s.sglang_served_model_name:
        flag_map["served-model-name"] = s.sglang_served_model_name
    flag_map["host"] = s.sglang_host
    flag_map["port"] = s.sglang_port
    command = [c.replace("{python}", ctx.venv_python) for c in s.sglang_launch_command]
    return [ctx.venv_python, f"{ctx.tools}/launch.py", *command, *flagmod.render_flags(flag_map)]


def flag_map_for_check(ctx: Context) -> dict:
    s = ctx.settings
    return {**s.sglang_flags, "model-path": s.sglang_model_path, "host": s.sglang_host,
            "port": s.sglang_port,
            **({"served-model-name": s.sglang_served_model_name} if s.sglang_served_model_name else {}),
            **({"api-key": "<secret>"} if s.api_key else {})}


def service_environment(ctx: Context) -> list[tuple[str, str]]:
    s = ctx.settings
    env = {
        "HOME": s.sglang_home,
        "SGLANG_CACHE_DIR": s.sglang_cache_dir,
        "FLASHINFER_WORKSPACE_BASE": s.sglang_cache_dir,
        "XDG_CACHE_HOME": s.sglang_cache_dir,
        "TRITON_CACHE_DIR": f"{s.sglang_cache_dir}/triton",
        "TORCHINDUCTOR_CACHE_DIR": f"{s.sglang_cache_dir}/inductor",
        "HF_HUB_OFFLINE": "1",
        "PYTHONUNBUFFERED": "1",
        **ctx.nccl_env,
        **{k: str(v) for k, v in s.sglang_env.items()},
    }
    return sorted(env.items())


def unit_for(ctx: Context) -> str:
    s = ctx.settings
    return render_unit(UnitSpec(
        release_id=ctx.release_id, sglang_version=ctx.sglang_version,
        # "applied" whether it happened now or earlier: the unit must not change between runs
        patch_state="applied" if ctx.patch_state == "already-applied" else ctx.patch_state,
        served_model_name=s.served_model_name,
        user=s.sglang_user, home=s.sglang_home, secrets_file=SECRETS_FILE,
        environment=tuple(service_environment(ctx)), argv=tuple(launch_argv(ctx)),
        stop_timeout_s=s.sglang_stop_timeout_s, restart_sec=s.sglang_restart_sec,
        writable_paths=(s.sglang_cache_dir, s.sglang_home),
        device_allow=device_allow(s.gpu_expected_count),
    ))


def restart_planned(ctx: Context, unit_text: str, unit_file: str) -> bool:
    """Will this run restart the server (unit, secrets, release, patch or model change)?"""
    hs = ctx.hoststate
    if hashlib.sha256(unit_text.encode()).hexdigest() != (hs["paths"].get(unit_file) or {}).get("sha256"):
        return True
    secrets = hashlib.sha256(render_secrets_env(ctx.settings.secrets).encode()).hexdigest()
    if secrets != hs.get("secrets_sha256"):
        return True
    return any(ctx.ops[k].will_change for k in ("release", "patch", "model") if k in ctx.ops)


def full_p2p_check(ctx: Context) -> None:
    """The data-verified peer copies, then the pre-flight verdict again (raises if it fails)."""
    s = ctx.settings
    probe = host.get_fact(CudaProbe, python=s.sglang_system_python, p2p=True,
                          mib=s.gpu_p2p_test_mib)
    checks, ctx.nccl_env, matrix = preflight.evaluate(ctx.gpu_snapshot, probe, ctx.expect)
    if probe is None:
        checks.append(no_probe_check(s))
    if matrix:
        logger.info(f"{host.print_prefix}P2P matrix:\n{matrix}")
    plan.preflight(host.name, checks)
    ops.preflight_gate(checks, title=f"P2P before restarting {s.sglang_service}")
    ctx.p2p_record = preflight.p2p_record(checks, ctx.nccl_env, s.gpu_p2p_policy)
    put_p2p_record(ctx)
    ctx.p2p_skipped = False


@deploy("Service: launch flags, secrets, systemd unit, (re)start")
def service_stage():
    ctx = context()
    s = ctx.settings
    rel = ctx.hoststate["releases"].get(ctx.release_id) or {}
    cache_dir = flag_cache_dir()
    spec = None
    if rel.get("complete"):  # by the sha256 the host reported; fetched only on a cache miss
        spec = flagcache.load(cache_dir, rel.get("server_args_sha256")) \
            or ops.server_args_flag_spec(ctx.site, cache_dir)
    ctx.ops["flags"] = ops.launch_flags_check(
        name="Launch flags known to the installed sglang", site=ctx.site,
        flag_map=flag_map_for_check(ctx), version=ctx.sglang_version, spec=spec,
        cache_dir=cache_dir)
    unit_text = unit_for(ctx)
    unit_file = unit_path(s)
    if ctx.p2p_skipped and restart_planned(ctx, unit_text, unit_file):
        # The server is about to be replaced: the copies skipped in pre-flight (it was
        # serving) run now, still before any operation executes; a failure stops here.
        full_p2p_check(ctx)
        unit_text = unit_for(ctx)
    secrets = ops.secret_file(name=f"Secrets {SECRETS_FILE} (0600, root)", path=SECRETS_FILE,
                              content=render_secrets_env(s.secrets),
                              present_sha256=ctx.hoststate.get("secrets_sha256"))
    unit = ops.file_content(name=f"Unit {unit_file}", src=StringIO(unit_text), dest=unit_file,
                            mode="644", present=ctx.hoststate["paths"].get(unit_file))
    link = ops.symlink(name=f"{s.sglang_root}/current -> release {ctx.release_id}",
                       path=f"{s.sglang_root}/current", target=ctx.release_dir,
                       present=ctx.hoststate["paths"].get(f"{s.sglang_root}/current"))
    svc = ctx.hoststate["service"]
    ops.service_enabled(name=f"Enable {s.sglang_service}", service=s.sglang_service,
                        unit_file_state=svc.get("UnitFileState") or None)
    triggers = [unit, secrets] + [ctx.ops[k] for k in ("release", "patch", "model") if k in ctx.ops]
    # Gated operations are added only when a trigger may fire, so that a converged host shows
    # no change at all, not even a conditional one, in --dry.
    restart_needed = any(t.will_change for t in triggers)
    if unit.will_change:
        ops.daemon_reload(name="systemd daemon-reload", _if=unit.did_change)
    started = ops.service_started(name=f"Start {s.sglang_service}", service=s.sglang_service,
                                  active_state=svc.get("ActiveState") or None,
                                  sub_state=svc.get("SubState") or None)
    restarted = None
    # A server that runs but was never verified: if it serves (e.g. started at boot) it is
    # verified as it is, without a restart (a reload costs a model load); if it does not (a
    # failed or interrupted deploy left it hung or half-started) it is restarted and
    # verified, so that a re-run converges.
    verified = (ctx.hoststate.get("last_verified") or {}).get("invocation")
    unverified = (bool(svc.get("InvocationID")) and svc.get("InvocationID") != verified
                  and not started.will_change)
    ctx.verify_running = False
    if unverified:
        from sglang_deploy.shell.facts import ServingProbe
        from sglang_deploy.core.verify import check_serving

        probe = host.get_fact(ServingProbe, service=s.sglang_service, port=s.sglang_port,
                              host_addr=_addr(s), secrets=SECRETS_FILE,
                              python=s.sglang_system_python)
        if probe and check_serving(probe, s.served_model_name, False).kind == "ready":
            unverified, ctx.verify_running = False, not restart_needed
    if restart_needed and not started.will_change:
        restarted = ops.service_restarted(
            name=f"Restart {s.sglang_service} (unit, secrets, release or patch changed)",
            service=s.sglang_service,
            _if=lambda: unverified or any(t.did_change() for t in triggers))
    elif unverified and not started.will_change:
        restarted = ops.service_restarted(
            name=f"Restart {s.sglang_service} (running, never verified)", service=s.sglang_service)
    ctx.ops.update(unit=unit, secrets=secrets, started=started, restarted=restarted, link=link)
    ctx.ops["unit_text"] = unit_text


def _expect_autotune(ctx: Context) -> bool:
    flags = flagmod.normalise(ctx.settings.sglang_flags)
    if flags.get("--disable-flashinfer-autotune"):
        return False
    backend = flags.get("--moe-runner-backend")
    return backend == "flashinfer_cutlass" and ctx.patch_state in (
        "applied", "already-applied", "enabled-upstream")


def verify_params(ctx: Context) -> dict:
    """What the verifier expects of this configuration (kept in the known-good record, so a
    rollback verifies the old configuration by its own standards)."""
    flags = flagmod.normalise(ctx.settings.sglang_flags)
    return {"release": ctx.release_id, "sglang_version": ctx.sglang_version,
            "patch_state": ctx.patch_state, "served_model_name": ctx.settings.served_model_name,
            "expect_autotune": _expect_autotune(ctx),
            "cuda_graph": not flags.get("--disable-cuda-graph"), "nccl_env": ctx.nccl_env}


def _addr(s: datamod.Settings) -> str:
    return "127.0.0.1" if s.sglang_host in ("0.0.0.0", "::") else s.sglang_host


def verify_startup(s: datamod.Settings, params: dict, tools: str):
    """Block until the (re)started server is ready (raises VerifyError)."""
    from sglang_deploy.core.verify import Verifier, wait_until_ready

    verifier = Verifier(
        sglang_version=params["sglang_version"], expect_autotune=params["expect_autotune"],
        cuda_graph=params["cuda_graph"], served_model_name=params["served_model_name"],
        overall_timeout_s=s.verify_timeout_s, phase_timeouts=s.verify_phase_timeouts,
        require_generate=s.verify_generate,
    )
    return wait_until_ready(
        host, verifier, tool=f"{tools}/hoststate.py", service=s.sglang_service,
        port=s.sglang_port, host_addr=_addr(s), secrets=SECRETS_FILE, poll_s=s.verify_poll_s,
        log=lambda msg: logger.info(f"{host.print_prefix}verify: {msg}"),
    )


def verify_serving(s: datamod.Settings, params: dict, tools: str):
    """Check a server that was not restarted still serves (raises VerifyError)."""
    from sglang_deploy.core.verify import wait_serving

    return wait_serving(
        host, tool=f"{tools}/hoststate.py", service=s.sglang_service, port=s.sglang_port,
        host_addr=_addr(s), secrets=SECRETS_FILE, served_model_name=params["served_model_name"],
        require_generate=s.verify_generate, timeout_s=s.verify_phase_timeouts["http"],
        poll_s=s.verify_poll_s)


def record_verified(s: datamod.Settings, params: dict, summary: dict) -> None:
    """Keep what was just verified on the host: the summary, and the known-good copy of the
    unit and secrets that a rollback restores (ROOT/known-good/, root only)."""
    import datetime

    from sglang_deploy.core import report

    root = s.sglang_root
    # Not promoted (a gate must pass first): kept as a candidate the rollout promotes.
    kg = f"{root}/known-good" if s.verify_promote_known_good else f"{root}/known-good.candidate"
    summary["verified_at"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    record = json.dumps({**params, "verified_at": summary["verified_at"]}, sort_keys=True)
    q = shlex.quote
    unit = f"/etc/systemd/system/{s.sglang_service}.service"
    host.run_shell_command(
        f"set -e; install -d -m 700 {q(kg)}; install -m 644 {q(unit)} {q(kg + '/unit.tmp')}; "
        f"if test -f {q(SECRETS_FILE)}; then install -m 600 {q(SECRETS_FILE)} {q(kg + '/secrets.tmp')}; "
        f"mv -f {q(kg + '/secrets.tmp')} {q(kg + '/secrets.env')}; else rm -f {q(kg + '/secrets.env')}; fi; "
        f"mv -f {q(kg + '/unit.tmp')} {q(kg + '/unit.service')}; "
        f"printf '%s\\n' {q(record)} > {q(kg + '/record.tmp')}; mv -f {q(kg + '/record.tmp')} {q(kg + '/record.json')}; "
        f"printf '%s\\n' {q(json.dumps(summary, sort_keys=True))} > {q(root + '/last-verified.json')}",
        print_output=False)
    report.emit(summary)


def _verify(ctx: Context, action: str):
    from sglang_deploy.core import report

    params = verify_params(ctx)
    if action == "converged":
        decision = verify_serving(ctx.settings, params, ctx.tools)
    else:
        decision = verify_startup(ctx.settings, params, ctx.tools)
    summary = report.host_summary(host.name, ctx, decision)
    summary["action"] = action
    record_verified(ctx.settings, params, summary)


def _action(started, restarted) -> str | None:
    if started.did_change():
        return "started"
    if restarted is not None and restarted.did_change():
        return "restarted"
    return None


@deploy("Verify: block until the model really serves")
def verify_stage():
    ctx = context()
    started, restarted = ctx.ops["started"], ctx.ops["restarted"]
    may_restart = started.will_change or restarted is not None
    plan.record(state, host, ctx)
    if may_restart:
        python.call(name="Verify startup, API and a one-token generation",
                    function=ops.reported(lambda: _verify(ctx, _action(started, restarted))),
                    _if=lambda: _action(started, restarted) is not None)
    if ctx.verify_running:
        python.call(name="Verify the running server (never verified, serving: not restarted)",
                    function=ops.reported(lambda: _verify(ctx, "converged")))
    elif ctx.settings.verify_converged:
        python.call(name="Verify the running server still serves (converged host)",
                    function=ops.reported(lambda: _verify(ctx, "converged")),
                    _if=lambda: _action(started, restarted) is None)
    elif not may_restart:
        host.noop("the service was not (re)started: nothing to verify")


@deploy("Rollback: back to the last known-good configuration")
def rollback_stage():
    """Restore the unit, secrets and release that last passed verification on this host,
    restart, and verify by that configuration's own standards. A host that already runs its
    known-good configuration and serves is only checked, never restarted."""
    from types import SimpleNamespace

    from sglang_deploy.core.errors import RollbackError

    s = routing.settings(host, state.inventory)
    hs = host.get_fact(SglangHostState, root=s.sglang_root, service=s.sglang_service,
                       secrets=SECRETS_FILE, python=s.sglang_system_python)
    kg = hs.get("known_good")
    if not kg:
        raise RollbackError(
            what=f"a known-good configuration on {host.name} ({s.sglang_root}/known-good/)",
            found="none: this host never passed verification",
            fix="nothing to roll back to: fix the cause and deploy it "
                "(`pyinfra INVENTORY deploy.py --limit HOST`)")
    params = kg["record"]
    if not (hs["releases"].get(params["release"]) or {}).get("complete"):
        raise RollbackError(
            what=f"the known-good release {params['release']} installed on {host.name}",
            found="its venv is missing or incomplete",
            fix="deploy with the lock of that release, or deploy the current one after fixing it")
    tools = f"{s.sglang_root}/tools"
    restored = ops.known_good_restored(
        name=f"Known-good configuration (release {params['release']})", root=s.sglang_root,
        service=s.sglang_service, known_good=kg, unit_sha256=hs.get("unit_sha256"),
        secrets_sha256=hs.get("secrets_sha256"), current=hs.get("current"), secrets=SECRETS_FILE)
    svc = hs["service"]
    serving = svc.get("ActiveState") == "active" and svc.get("SubState") == "running"
    restart = None
    if restored.will_change or not serving:
        restart = ops.service_restarted(name=f"Restart {s.sglang_service} on the known-good configuration",
                                        service=s.sglang_service)
    summary_ctx = SimpleNamespace(release_id=params["release"], sglang_version=params["sglang_version"],
                                  patch_state=params.get("patch_state"), nccl_env=params.get("nccl_env") or {},
                                  settings=SimpleNamespace(served_model_name=params["served_model_name"]))

    def verify(action: str):
        from sglang_deploy.core import report

        check = verify_serving if action == "unchanged" else verify_startup
        decision = check(s, params, tools)
        summary = report.host_summary(host.name, summary_ctx, decision)
        summary["action"] = action
        record_verified(s, params, summary)

    python.call(name="Verify the known-good configuration serves",
                function=ops.reported(lambda: verify("rolled-back" if restart is not None
                                                     and restart.did_change() else "unchanged")))
