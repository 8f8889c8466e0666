"""The service decisions (pure): where everything lives on a host, how the server is launched,
its environment, what the verifier expects, and what a rollback restores. Whether and why a
server restarts: ``core.restart``.

``stages/stages.py`` reads the host's state (facts), asks these functions, and adds operations.
Nothing here talks to a host or to pyinfra.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from sglang_deploy.core import flags as flagmod
from sglang_deploy.core import lockfile
from sglang_deploy.core.errors import RollbackError
from sglang_deploy.core.hoststate import HostState

if TYPE_CHECKING:
    from sglang_deploy.core.settingstype import Settings

SECRETS_DIR = "/etc/sglang"
SECRETS_FILE = f"{SECRETS_DIR}/secrets.env"
HF_TOKEN_FILE = f"{SECRETS_DIR}/.hf-token"
#: scripts shipped to ROOT/tools (patch.py from sglang_deploy/core, the others from remote/;
#: patch_tool.py imports the patch.py beside it)
TOOLS = ("patch.py", "patch_tool.py", "launch.py", "hoststate.py", "model_fetch.py",
         "jit_check.py", "progress_watch.py", "release_smoke.py", "rendezvous.py",
         "allreduce_check.py", "model_warm.py", "pagecache.py")


class Trigger(StrEnum):
    """An operation that, having changed in this run, restarts the server (besides the unit
    and the secrets); its value is the restart reason's name (``core.restart.TRIGGERS``). The
    stages keep these operations under these keys (``StageOps.triggers``), so a name cannot
    differ."""

    RELEASE = "release"
    PATCH = "patch"
    MODEL = "model"


@dataclass(frozen=True)
class StageOps:
    """The operations one stage adds and a later one reads (pyinfra's ``OperationMeta``, kept
    opaque here; None: not added on this host): ``hostplan.HostPlan.ops``, a new value per
    stage that adds some (``dataclasses.replace``). The restart triggers are keyed by
    ``Trigger``, the names the restart decision gives (``core.restart``), so the two cannot
    differ: the restart's condition is whether the operation of a reason changed."""

    triggers: Mapping[Trigger, Any] = field(default_factory=dict)  # release, patch, model
    unit: Any = None
    secrets: Any = None
    link: Any = None
    started: Any = None
    restarted: Any = None
    #: the P2P retest's verdict once its operation ran (``stages.p2pretest.Retested``)
    retest: Any = None


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


# ---------------------------------------------------------------------------------------
# the host layout: every path the deploy keeps, defined once


@dataclass(frozen=True)
class Layout:
    """Paths on one host, from its data (``sglang_root``, ``sglang_service``, ...)."""

    root: str
    service: str
    cache_dir: str
    home: str
    user: str

    @classmethod
    def of(cls, settings: Settings) -> Layout:
        return cls(root=settings.sglang_root, service=settings.sglang_service,
                   cache_dir=settings.sglang_cache_dir, home=settings.sglang_home,
                   user=settings.sglang_user)

    secrets_dir = SECRETS_DIR
    secrets_file = SECRETS_FILE
    hf_token_file = HF_TOKEN_FILE

    @property
    def unit_file(self) -> str:
        return f"/etc/systemd/system/{self.service}.service"

    @property
    def releases(self) -> str:
        return f"{self.root}/releases"

    @property
    def tools(self) -> str:
        return f"{self.root}/tools"

    @property
    def current(self) -> str:
        return f"{self.root}/current"

    @property
    def uv_cache(self) -> str:
        return f"{self.root}/uv-cache"

    @property
    def p2p_record(self) -> str:
        return f"{self.root}/p2p-verified.json"

    @property
    def hardening_record(self) -> str:
        """What the release smoke saw of the unit's sandbox (``core.hardening.record``)."""
        return f"{self.root}/hardening.json"

    @property
    def last_verified(self) -> str:
        return f"{self.root}/last-verified.json"

    def known_good(self, promote: bool = True) -> str:
        """Where a verified configuration is kept: ``known-good`` (the rollback target), or
        ``known-good.candidate`` when a gate must pass before it is promoted."""
        return f"{self.root}/known-good" if promote else f"{self.root}/known-good.candidate"

    def tool(self, name: str) -> str:
        return f"{self.tools}/{name}"

    def release_dir(self, release_id: str) -> str:
        return f"{self.releases}/{release_id}"

    def release_lock(self, release_id: str) -> str:
        return f"{self.release_dir(release_id)}/requirements.lock"

    def patch_record(self, release_id: str) -> str:
        return f"{self.release_dir(release_id)}/autotune-patch.json"

    def venv_bin(self, release_id: str) -> str:
        return f"{self.release_dir(release_id)}/venv/bin"

    def venv_python(self, release_id: str) -> str:
        return f"{self.venv_bin(release_id)}/python"

    def site(self, release_id: str, python_minor: str) -> str:
        return f"{self.release_dir(release_id)}/venv/lib/python{python_minor}/site-packages"

    def folders(self) -> list[tuple[str, str, str]]:
        """(path, owner, mode) of every folder the runtime stage keeps."""
        return [
            (self.root, "root", "755"), (self.releases, "root", "755"), (self.tools, "root", "755"),
            (self.cache_dir, self.user, "750"), (self.home, self.user, "750"),
            (self.secrets_dir, "root", "700"), (self.uv_cache, "root", "700"),
        ]

    def state_paths(self, release_id: str) -> tuple[str, ...]:
        """Folders and files whose state the host-state read reports in its one round trip. A
        managed path left out is still compared (the operations then ask pyinfra's per-path
        facts), at a round trip more per path: list every path the stages manage here."""
        return (*(p for p, _, _ in self.folders()), *(self.tool(t) for t in TOOLS),
                self.release_lock(release_id), self.unit_file, self.current, self.p2p_record)


# ---------------------------------------------------------------------------------------
# the release (from the controller's lock file)


def release_of_lock(text: str, path: str) -> tuple[str, str]:
    """(release id, sglang version) of a lock's TEXT: the id is the text's hash, so a new lock
    is a new release folder. Raises DataError for a lock that is not fully pinned with hashes
    or has no sglang pin (``lockfile.sglang_pin``)."""
    return lockfile.Lock.of(text, path).release_id, lockfile.sglang_pin(text, path).version


# ---------------------------------------------------------------------------------------
# the launch command and the environment


#: SGLang's /metrics (Prometheus) is on unless ``sglang_flags`` sets this flag itself
METRICS_FLAG = "--enable-metrics"


def metrics_on(settings: Settings) -> bool:
    """Whether the server serves ``/metrics`` (its rendered flags hold ``--enable-metrics``)."""
    return METRICS_FLAG in flagmod.render_flags(flag_map(settings))


def flag_map(settings: Settings, *, with_api_key: bool = False) -> dict[str, Any]:
    """The launch flags: ``sglang_flags`` plus the flags that come from their own keys, and
    ``--enable-metrics`` unless ``sglang_flags`` names that flag itself (``false`` turns the
    server's ``/metrics`` off); it is checked against the locked SGLang as every flag. The API
    key never goes into argv (the launcher reads it from the environment); WITH_API_KEY adds a
    placeholder so that the flag check knows the server will get ``--api-key``."""
    s = settings
    out = {**s.sglang_flags, "model-path": s.sglang_model_path, "host": s.sglang_host,
           "port": s.sglang_port}
    if not any(flagmod.normalise_name(k) == METRICS_FLAG for k in s.sglang_flags):
        out["enable-metrics"] = True  # on by default; `enable-metrics: false` turns it off
    if s.sglang_served_model_name:
        out["served-model-name"] = s.sglang_served_model_name
    if with_api_key and s.api_key:
        out["api-key"] = "<secret>"
    return out


def launch_argv(settings: Settings, layout: Layout, release_id: str) -> list[str]:
    """ExecStart's words: the release's python runs the launcher, which runs the server."""
    python = layout.venv_python(release_id)
    command = [c.replace("{python}", python) for c in settings.sglang_launch_command]
    return [python, layout.tool("launch.py"), *command, *flagmod.render_flags(flag_map(settings))]


def service_environment(settings: Settings, nccl_env: Mapping[str, str],
                        toolchain: Mapping[str, str] | None = None) -> list[tuple[str, str]]:
    """The unit's non-secret environment: the persistent caches, offline hub, the JIT
    toolchain (``jit.toolchain_environment``), NCCL's P2P settings from the pre-flight, then
    the operator's ``sglang_env`` (which wins)."""
    cache = settings.sglang_cache_dir
    env = {
        "HOME": settings.sglang_home,
        "SGLANG_CACHE_DIR": cache,
        "FLASHINFER_WORKSPACE_BASE": cache,
        "XDG_CACHE_HOME": cache,
        "TRITON_CACHE_DIR": f"{cache}/triton",
        "TORCHINDUCTOR_CACHE_DIR": f"{cache}/inductor",
        "HF_HUB_OFFLINE": "1",
        "PYTHONUNBUFFERED": "1",
        **(toolchain or {}),
        **nccl_env,
        **{k: str(v) for k, v in settings.sglang_env.items()},
    }
    return sorted(env.items())


def unit_patch_state(patch_state: str) -> str:
    """The patch state written into the unit: "applied" whether it happened in this run or an
    earlier one, so that the unit does not change between runs."""
    return "applied" if patch_state == "already-applied" else patch_state


def probe_address(bind: str) -> str:
    """Where the host itself reaches the server (a wildcard bind answers on loopback)."""
    return "127.0.0.1" if bind in ("0.0.0.0", "::") else bind


# ---------------------------------------------------------------------------------------
# what the verifier expects


def expect_autotune(sglang_flags: Mapping[str, Any], patch_state: str) -> bool:
    """Must the log show FlashInfer autotune? Only for the CUTLASS MoE backend, when autotune
    is not disabled and the allow-list has it (patched, or enabled upstream)."""
    flags = flagmod.normalise(sglang_flags)
    if flags.get("--disable-flashinfer-autotune"):
        return False
    return flags.get("--moe-runner-backend") == "flashinfer_cutlass" and patch_state in (
        "applied", "already-applied", "enabled-upstream")


def verify_params(settings: Settings, *, release_id: str, sglang_version: str, patch_state: str,
                  nccl_env: Mapping[str, str]) -> dict[str, Any]:
    """What the verifier expects of this configuration. Kept in the known-good record, so
    that a rollback verifies the old configuration by its own standards."""
    flags = flagmod.normalise(settings.sglang_flags)
    return {"release": release_id, "sglang_version": sglang_version, "patch_state": patch_state,
            "served_model_name": settings.served_model_name,
            "expect_autotune": expect_autotune(settings.sglang_flags, patch_state),
            "cuda_graph": not flags.get("--disable-cuda-graph"), "nccl_env": dict(nccl_env)}


# ---------------------------------------------------------------------------------------
# rollback


@dataclass(frozen=True)
class RollbackPlan:
    params: dict[str, Any]
    #: what differs from the known-good copy and is restored: "unit", "secrets" (or
    #: "no-secrets": the known-good configuration had no secrets file), "current"
    restore: tuple[str, ...]
    #: restart the service (something was restored, or it does not run)
    restart: bool


#: ``RollbackError.details["reason"]`` of a host that never passed verification
NO_KNOWN_GOOD = "no-known-good"


def rollback_plan(host_name: str, hoststate: HostState, root: str) -> RollbackPlan:
    """What a rollback does on a host, from its state (raises RollbackError when there is
    nothing to roll back to)."""
    kg = hoststate.releases.known_good
    if not kg or kg.release is None:
        raise RollbackError(
            what=f"a known-good configuration on {host_name} ({root}/known-good/)",
            found="its record.json names no release" if kg
            else "none: this host never passed verification",
            fix="nothing to roll back to: fix the cause and deploy it "
                "(`pyinfra INVENTORY deploy.py --limit HOST`)",
            details={"reason": NO_KNOWN_GOOD})
    params, release = dict(kg.record), kg.release
    if not hoststate.releases.complete(release):
        raise RollbackError(
            what=f"the known-good release {release} installed on {host_name}",
            found="its venv is missing or incomplete",
            fix="deploy with the lock of that release, or deploy the current one after fixing it")
    restore = []
    if hoststate.unit_sha256 != kg.unit_sha256:
        restore.append("unit")
    if hoststate.secrets_sha256 != kg.secrets_sha256:
        restore.append("secrets" if kg.secrets_sha256 else "no-secrets")
    if hoststate.releases.current != release:
        restore.append("current")
    return RollbackPlan(params=params, restore=tuple(restore),
                        restart=bool(restore) or not hoststate.service.serving)
